//! The HTTP side: serves the last rendered body and the probe endpoints.
//!
//! | path | answer |
//! |---|---|
//! | `/metrics` | the exposition body of the last sample, as rendered (never waits for NVML or the kubelet) |
//! | `/health` | `OK` (200), or `KO` (503) when the last sample could not talk to NVML — as dcgm-exporter |
//! | `/healthz` | `ok` (200) while the process serves |
//! | `/readyz` | `ok` (200) once the first sample is rendered, 503 before |
//! | `/` | a short index page |
//!
//! A scrape costs one read-lock and one reference-count increment: the body is shared bytes,
//! and the connection sends it from its sealed memory file ([`super::sendfile`]) without
//! copying it into the socket. Connections run on the server's own threads
//! ([`super::event_loops`]).

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::body::Body;
use super::event_loops;

/// The Prometheus text format's content type.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// What the server hands out, replaced whole after every render.
#[derive(Debug, Clone, Default)]
pub struct Published {
    /// The exposition body.
    pub body: Body,
    /// Whether a sample has been rendered yet.
    pub ready: bool,
    /// Whether the last sample reached NVML.
    pub nvml_up: bool,
}

/// Where the renderer publishes and the handlers read.
pub type Shared = Arc<watch::Sender<Published>>;

/// Where a listen address failed.
#[derive(Debug, thiserror::Error)]
pub enum ListenError {
    /// Not `[host]:port`.
    #[error("invalid listen address {0:?}: expected [HOST]:PORT, e.g. :9400 or 127.0.0.1:9400")]
    Invalid(String),
    /// The socket could not be bound.
    #[error("cannot listen on {address}: {source}")]
    Bind {
        address: String,
        #[source]
        source: std::io::Error,
    },
}

/// Splits `[host]:port` (Go's form, which dcgm-exporter takes: `:9400` means every address).
pub fn parse_address(text: &str) -> Result<(Option<String>, u16), ListenError> {
    let invalid = || ListenError::Invalid(text.to_owned());
    let (host, port) = text.rsplit_once(':').ok_or_else(invalid)?;
    let port: u16 = port.parse().map_err(|_| invalid())?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    Ok(((!host.is_empty()).then(|| host.to_owned()), port))
}

/// Send buffer of every connection: a large body (a MIG node's is a few hundred KiB) leaves in
/// one write instead of trickling out as the kernel's small default buffer drains.
const SEND_BUFFER: u32 = 4 << 20;

/// Binds the listen address. Without a host it listens on every address, IPv6 and IPv4, or
/// IPv4 only where IPv6 is disabled.
pub async fn bind(text: &str) -> Result<TcpListener, ListenError> {
    let (host, port) = parse_address(text)?;
    let bind_error = |source| ListenError::Bind {
        address: text.to_owned(),
        source,
    };
    let addresses: Vec<SocketAddr> = match host {
        Some(host) => tokio::net::lookup_host((host.as_str(), port))
            .await
            .map_err(bind_error)?
            .collect(),
        None => vec![
            SocketAddr::from(([0u16; 8], port)),
            SocketAddr::from(([0u8; 4], port)),
        ],
    };
    let mut last = std::io::Error::new(std::io::ErrorKind::NotFound, "no address to bind");
    for address in addresses {
        match listen(address) {
            Ok(listener) => return Ok(listener),
            Err(err) => last = err,
        }
    }
    Err(bind_error(last))
}

fn listen(address: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = match address {
        SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
        SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
    };
    socket.set_reuseaddr(true)?;
    // Accepted connections inherit it; the kernel caps it at net.core.wmem_max.
    let _ = socket.set_send_buffer_size(SEND_BUFFER);
    socket.bind(address)?;
    socket.listen(1024)
}

/// The routes.
pub fn router(shared: Shared) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/health", get(health))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/", get(index))
        .with_state(shared)
}

/// Serves until `cancel` fires, on [`event_loops::LOOPS`] threads of its own.
pub async fn serve(
    listener: TcpListener,
    shared: Shared,
    cancel: CancellationToken,
) -> std::io::Result<()> {
    event_loops::serve(listener, shared, cancel).await
}

async fn metrics(State(shared): State<Shared>) -> impl IntoResponse {
    let body = shared.borrow().body.bytes().clone();
    ([(header::CONTENT_TYPE, CONTENT_TYPE)], body)
}

async fn health(State(shared): State<Shared>) -> impl IntoResponse {
    let published = shared.borrow();
    if published.ready && !published.nvml_up {
        (StatusCode::SERVICE_UNAVAILABLE, "KO")
    } else {
        (StatusCode::OK, "OK")
    }
}

async fn healthz() -> &'static str {
    "ok"
}

async fn readyz(State(shared): State<Shared>) -> impl IntoResponse {
    if shared.borrow().ready {
        (StatusCode::OK, "ok")
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "waiting for the first sample",
        )
    }
}

async fn index() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        "<html><head><title>gpud exporter</title></head><body><h1>gpud exporter</h1>\
         <p><a href=\"/metrics\">Metrics</a></p></body></html>\n",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_addresses_in_go_form() {
        assert_eq!(parse_address(":9400").unwrap(), (None, 9400));
        assert_eq!(
            parse_address("127.0.0.1:9401").unwrap(),
            (Some("127.0.0.1".into()), 9401)
        );
        assert_eq!(
            parse_address("[::1]:9400").unwrap(),
            (Some("::1".into()), 9400)
        );
        assert_eq!(
            parse_address("localhost:0").unwrap(),
            (Some("localhost".into()), 0)
        );
        for bad in ["9400", ":http", "host:", ":70000"] {
            assert_eq!(
                parse_address(bad).unwrap_err().to_string(),
                format!(
                    "invalid listen address {bad:?}: expected [HOST]:PORT, e.g. :9400 or 127.0.0.1:9400"
                )
            );
        }
    }
}
