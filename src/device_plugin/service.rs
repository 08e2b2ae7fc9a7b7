//! The device plugin as a daemon subsystem: its settings are the reloadable part of NVIDIA's
//! config file, so SIGHUP re-registers resources that changed.

use super::manager::{self, ManagerConfig};
use crate::daemon::{Context, Subsystem};
use crate::inventory::Inventory;
use crate::resources::settings::Settings;

/// Serves the node's resources to the kubelet; ready once every one is served.
#[derive(Debug)]
pub struct DevicePlugin {
    config: ManagerConfig,
}

impl DevicePlugin {
    /// A device plugin serving and registering where `config` says.
    pub fn new(config: ManagerConfig) -> Self {
        DevicePlugin { config }
    }
}

impl Subsystem for DevicePlugin {
    type Settings = Settings;
    crate::subsystem_name!("device-plugin");

    async fn run(self, ctx: Context<Settings>, inventory: Inventory) -> anyhow::Result<()> {
        manager::run(
            ctx.cancel_token(),
            inventory,
            ctx.settings(),
            self.config,
            ctx.ready_latch(),
            ctx.helpers(),
            ctx.takeover_abandoned(),
        )
        .await?;
        Ok(())
    }
}
