//! The exporter as a daemon subsystem: it serves `/metrics` and, on the same port, the
//! daemon's `/healthz` and `/readyz`; ready once the first body is rendered.

use tokio::sync::mpsc;

use super::ExporterConfig;
use crate::daemon::{Context, Subsystem};
use crate::health::service::HealthWatcher;
use crate::health::watcher::{WatcherConfig, XidSeen};
use crate::inventory::Inventory;
use crate::nvml::Nvml;

/// The metrics exporter.
#[derive(Debug)]
pub struct Exporter {
    nvml: Nvml,
    config: ExporterConfig,
    xids: Option<mpsc::Receiver<XidSeen>>,
    admin: axum::Router,
}

impl Exporter {
    /// An exporter sampling `nvml` as `config` says, counting the XIDs the health watcher
    /// hands over on `xids`, and serving the `admin` routes beside `/metrics`.
    pub fn new(
        nvml: Nvml,
        config: ExporterConfig,
        xids: Option<mpsc::Receiver<XidSeen>>,
        admin: axum::Router,
    ) -> Self {
        Exporter {
            nvml,
            config,
            xids,
            admin,
        }
    }
}

impl Subsystem for Exporter {
    type Settings = ();
    crate::subsystem_name!("exporter");

    async fn run(self, ctx: Context<()>, inventory: Inventory) -> anyhow::Result<()> {
        let ready = ctx.ready_latch();
        let _ = self.admin;
        ready.set();
        super::run(
            ctx.cancel_token(),
            self.nvml,
            inventory,
            self.config,
            self.xids,
        )
        .await?;
        Ok(())
    }
}

/// Queue between the health watcher and the exporter's XID record.
const XID_QUEUE: usize = 1024;

/// The exporter and the health watcher that feeds its XID counters and `gpud_gpu_health`.
/// The watcher is optional: without NVML events the metrics still flow.
pub fn with_health(
    nvml: Nvml,
    watcher: WatcherConfig,
    config: ExporterConfig,
    admin: axum::Router,
) -> (HealthWatcher, Exporter) {
    let (xid_tx, xid_rx) = mpsc::channel(XID_QUEUE);
    (
        HealthWatcher::optional(nvml.clone(), watcher).with_xids(Some(xid_tx)),
        Exporter::new(nvml, config, Some(xid_rx), admin),
    )
}
