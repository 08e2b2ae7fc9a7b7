//! The exporter as a daemon subsystem: it serves `/metrics` and, on the same port, the
//! daemon's `/healthz` and `/readyz`; ready once the first body is rendered.

use super::ExporterConfig;
use crate::daemon::{Context, Subsystem};
use crate::inventory::Inventory;
use crate::nvml::Nvml;
use crate::xid::ledger::XidLedger;

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
            ctx.helpers(),
            self.nvml,
            inventory,
            self.config,
            Some(self.xids),
            self.admin,
            ready,
        )
        .await?;
        Ok(())
    }
}
