//! The exporter as a daemon subsystem: it serves `/metrics` and, on the same port, the
//! daemon's `/healthz` and `/readyz`; ready once the first body is rendered.

use super::ExporterConfig;
use crate::daemon::{Context, Subsystem};
use crate::health::ledger::XidLedger;
use crate::health::service::HealthWatcher;
use crate::health::watcher::WatcherConfig;
use crate::inventory::Inventory;
use crate::nvml::Nvml;

/// The metrics exporter.
#[derive(Debug)]
pub struct Exporter {
    nvml: Nvml,
    config: ExporterConfig,
    xids: XidLedger,
    admin: axum::Router,
}

impl Exporter {
    /// An exporter sampling `nvml` as `config` says, rendering the XIDs the health watcher
    /// records in `xids`, and serving the `admin` routes beside `/metrics`.
    pub fn new(nvml: Nvml, config: ExporterConfig, xids: XidLedger, admin: axum::Router) -> Self {
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
        super::run(
            ctx.cancel_token(),
            self.nvml,
            inventory,
            self.config,
            Some(self.xids),
            self.admin,
            Box::new(move || ready.set()),
        )
        .await?;
        Ok(())
    }
}

/// The exporter and the health watcher that feeds its XID counters and `gpud_gpu_health`.
/// The watcher is optional: without NVML events the metrics still flow.
pub fn with_health(
    nvml: Nvml,
    watcher: WatcherConfig,
    config: ExporterConfig,
    admin: axum::Router,
) -> (HealthWatcher, Exporter) {
    let xids = XidLedger::new(config.xid_window);
    (
        HealthWatcher::optional(nvml.clone(), watcher).with_xids(xids.clone()),
        Exporter::new(nvml, config, xids, admin),
    )
}
