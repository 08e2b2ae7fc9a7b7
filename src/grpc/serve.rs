//! Running a gRPC server on a bound socket until told to stop, the one way every gpud service
//! the kubelet talks to runs: connections wrapped by [`super::incoming`] (any `:authority`),
//! and an end that says whether it was asked for. The caller spawns the future as a helper of
//! its subsystem (`daemon::Helpers`), which turns an unasked end into a failed `/readyz`.

use tokio::net::UnixListener;
use tokio_util::sync::CancellationToken;

/// Why a gRPC server stopped serving before it was told to.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The server failed (its cause chain spelled out, as tonic's own text is `transport error`).
    #[error("the gRPC server failed: {0}")]
    Failed(String),
    /// The accept loop ended without the stop signal.
    #[error("the gRPC server stopped accepting connections without being told to stop")]
    Ended,
}

/// Serves `router` on `listener` until `stop` is cancelled.
pub async fn serve(
    router: tonic::transport::server::Router,
    listener: UnixListener,
    stop: CancellationToken,
) -> Result<(), ServeError> {
    router
        .serve_with_incoming_shutdown(super::incoming(listener), stop.cancelled())
        .await
        .map_err(|err| ServeError::Failed(crate::logging::error_chain(&err)))?;
    if stop.is_cancelled() {
        Ok(())
    } else {
        Err(ServeError::Ended)
    }
}
