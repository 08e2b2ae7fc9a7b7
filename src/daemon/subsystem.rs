//! The one shape every long-running part of gpud has.

use std::future::Future;

use super::context::Context;
use crate::inventory::Inventory;

/// One long-running part of gpud.
pub trait Subsystem: Send + Sized + 'static {
    /// The part of the reloadable configuration it reads (`()` for none).
    type Settings: Send + Sync + 'static;

    /// Its name in logs, `/readyz` and error messages (see [`crate::subsystem_name`]).
    fn name(&self) -> &'static str;

    /// The span its log lines are written in (see [`crate::subsystem_name`]).
    fn span(&self) -> tracing::Span;

    /// Whether the other subsystems start only once this one is ready (or has stopped, or
    /// [`super::supervisor::FIRST_WAIT`] has passed). The health watcher is: its first verdicts
    /// (kept ones and a first poll) are in the inventory before a consumer offers a device.
    const STARTS_FIRST: bool = false;

    /// Runs until `ctx` is cancelled (or its work is done). An error stops the daemon with
    /// exit 1, naming the subsystem.
    fn run(
        self,
        ctx: Context<Self::Settings>,
        inventory: Inventory,
    ) -> impl Future<Output = anyhow::Result<()>> + Send;
}
