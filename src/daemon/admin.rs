//! The admin endpoint every long-running applet answers: `/healthz` (the process is alive and
//! its supervisor loop answers) and `/readyz` (every subsystem is ready; the body lists each
//! subsystem and its state). The exporter serves these routes on its metrics port; without the
//! exporter the supervisor runs [`Admin`] on `--health-address`, which listens on loopback by
//! default so nothing off the node can reach it unless asked to.

use axum::Router;
use axum::http::StatusCode;
use axum::routing::get;
use tokio::net::TcpListener;

use super::context::Context;
use super::readiness::Readiness;
use super::subsystem::Subsystem;
use crate::inventory::Inventory;

/// The port of the admin endpoint of `gpud run` without the exporter; standalone applets use
/// the next ones (see each applet's `--health-address`), since the containers of one pod share
/// a network namespace.
pub const DEFAULT_HEALTH_PORT: u16 = 9410;

/// The `/healthz` and `/readyz` routes over `readiness`.
pub fn routes(readiness: Readiness) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route(
            "/readyz",
            get(move || {
                let (ready, body) = readiness.report();
                let status = if ready {
                    StatusCode::OK
                } else {
                    StatusCode::SERVICE_UNAVAILABLE
                };
                async move { (status, body) }
            }),
        )
}

/// The admin endpoint as a subsystem of its own: ready once it listens.
#[derive(Debug)]
pub struct Admin {
    address: String,
    routes: Router,
}

impl Admin {
    /// Serves `routes` on `address` (`[host]:port`).
    pub fn new(address: String, routes: Router) -> Self {
        Admin { address, routes }
    }
}

impl Subsystem for Admin {
    type Settings = ();
    crate::subsystem_name!("admin");

    async fn run(self, ctx: Context<()>, _inventory: Inventory) -> anyhow::Result<()> {
        let listener = crate::http::bind(&self.address).await?;
        if let Ok(local) = listener.local_addr() {
            tracing::info!(address = %local, "Serving /healthz and /readyz");
        }
        ctx.set_ready();
        serve(listener, self.routes, ctx).await
    }
}

async fn serve(listener: TcpListener, routes: Router, ctx: Context<()>) -> anyhow::Result<()> {
    crate::http::serve(
        listener,
        routes,
        crate::http::Limits::default(),
        std::sync::Arc::default(),
        ctx.cancel_token(),
    )
    .await?;
    Ok(())
}
