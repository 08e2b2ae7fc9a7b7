//! The exporter's routes: the last rendered body and dcgm-exporter's health answer, served by
//! gpud's bounded HTTP server ([`crate::http`]).
//!
//! | path | answer |
//! |---|---|
//! | `/metrics` | the exposition body of the last sample, as rendered (never waits for NVML or the kubelet) |
//! | `/health` | `OK` (200), or `KO` (503) when the last sample could not talk to NVML — as dcgm-exporter |
//! | `/` | a short index page |
//!
//! Any other path goes to the admin router the exporter is given (the probes).
//!
//! A scrape costs one read-lock and a few reference-count increments: the body is shared
//! bytes, which go to the socket from their memory-file copy ([`crate::http::mirror`]) where
//! there is one, else as they are.

use std::sync::Arc;

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::{Extension, Router};
use tokio::sync::watch;

use crate::http::mirror::Mirrored;

/// The Prometheus text format's content type.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// What the server hands out, replaced whole after every render.
#[derive(Debug, Clone, Default)]
pub struct Published {
    /// The exposition body, sent from a memory-file copy from its second scrape on.
    pub body: Arc<Mirrored>,
    /// Whether a sample has been rendered yet.
    pub ready: bool,
    /// Whether the last sample reached NVML.
    pub nvml_up: bool,
}

/// Where the renderer publishes and the handlers read.
pub type Shared = Arc<watch::Sender<Published>>;

/// The exporter's routes; paths they do not have go to `admin`. Taking `admin` as the fallback
/// rather than merging it means a path both have is the exporter's, never a conflict.
pub fn router(shared: Shared, admin: Router) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/health", get(health))
        .route("/", get(index))
        .with_state(shared)
        .fallback_service(admin)
}

async fn metrics(State(shared): State<Shared>) -> impl IntoResponse {
    // Out of the channel's lock: the second scrape of a body makes its mirror.
    let body = Arc::clone(&shared.borrow().body);
    let (body, mirror) = body.serve();
    // The connection finds the body's bytes in the mirror and sends them from its file.
    (
        [(header::CONTENT_TYPE, CONTENT_TYPE)],
        mirror.map(Extension),
        body,
    )
}

async fn health(State(shared): State<Shared>) -> impl IntoResponse {
    let published = shared.borrow();
    if published.ready && !published.nvml_up {
        (StatusCode::SERVICE_UNAVAILABLE, "KO")
    } else {
        (StatusCode::OK, "OK")
    }
}

async fn index() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        "<html><head><title>gpud exporter</title></head><body><h1>gpud exporter</h1>\
         <p><a href=\"/metrics\">Metrics</a></p></body></html>\n",
    )
}
