//! Placeholder for the bounded HTTP server (replaced by the shared implementation).

use std::time::Duration;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// Connection bounds.
#[derive(Debug, Clone, Default)]
pub struct Limits {
    /// Header read timeout.
    pub header_read_timeout: Duration,
}

/// Binds `[host]:port`.
pub async fn bind(address: &str) -> std::io::Result<TcpListener> {
    let address = if address.starts_with(':') {
        format!("0.0.0.0{address}")
    } else {
        address.to_owned()
    };
    TcpListener::bind(address).await
}

/// Serves until cancelled.
pub async fn serve(
    listener: TcpListener,
    router: axum::Router,
    _limits: Limits,
    cancel: CancellationToken,
) -> std::io::Result<()> {
    axum::serve(listener, router)
        .with_graceful_shutdown(async move { cancel.cancelled().await })
        .await
}
