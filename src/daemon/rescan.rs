//! The NVML rescanner as a support subsystem of every daemon: it republishes the inventory
//! when GPUs or MIG devices appear or vanish. Discovery itself is NVML's
//! ([`crate::nvml::Rescanner`]); this is only its place in the supervisor.

use super::{Context, Subsystem};
use crate::inventory::Inventory;
use crate::nvml::Rescanner;

impl Subsystem for Rescanner {
    type Settings = ();
    crate::subsystem_name!("rescan");

    async fn run(self, ctx: Context<()>, inventory: Inventory) -> anyhow::Result<()> {
        ctx.set_ready();
        self.run_until(ctx.cancel_token(), &inventory).await;
        Ok(())
    }
}
