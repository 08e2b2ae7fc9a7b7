//! The rescanner: the only loop that re-reads the node. Every interval it runs discovery on a
//! blocking thread and publishes the result into the inventory, which merges it with what
//! discovery cannot see and wakes subscribers only on a change. A MIG reconfiguration, or a GPU
//! that appears or falls off the bus, reaches every subsystem within one interval.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::{NodeFacts, Nvml, NvmlError};
use crate::inventory::Inventory;

/// Rescans the node every `every`.
#[derive(Debug, Clone)]
pub struct Rescanner {
    nvml: Nvml,
    facts: Arc<NodeFacts>,
    every: Duration,
}

impl Rescanner {
    /// A rescanner of the node `facts` describes.
    pub fn new(nvml: Nvml, facts: NodeFacts, every: Duration) -> Self {
        Rescanner {
            nvml,
            facts: Arc::new(facts),
            every,
        }
    }

    /// Discovers the node once, blocking on the driver, and starts an inventory with it: call
    /// it before the runtime starts.
    pub fn discover(&self) -> Result<Inventory, NvmlError> {
        self.nvml.inventory(&self.facts)
    }

    /// Re-reads the node on a blocking thread and publishes it; returns whether anything
    /// changed.
    pub async fn rescan(&self, inventory: &Inventory) -> Result<bool, NvmlError> {
        self.rescan_with(inventory, |_| {}).await
    }

    /// As [`Rescanner::rescan`], applying `change` to the merged snapshot in the same publish.
    pub async fn rescan_with(
        &self,
        inventory: &Inventory,
        change: impl FnOnce(&mut crate::inventory::Snapshot),
    ) -> Result<bool, NvmlError> {
        let (nvml, facts) = (self.nvml.clone(), Arc::clone(&self.facts));
        let fresh = tokio::task::spawn_blocking(move || nvml.discover(&facts))
            .await
            .map_err(|join| NvmlError::Thread {
                what: "discovery",
                source: std::io::Error::other(join.to_string()),
            })??;
        Ok(inventory.publish_rescan_with(fresh, change))
    }

    /// Rescans in the background into `inventory` until the returned handle is stopped: the
    /// loop behind the commands that follow the node (`inventory --watch`, `cdi generate
    /// --watch`).
    pub fn spawn(self, inventory: &Inventory) -> Rescans {
        let stop = CancellationToken::new();
        let task = crate::logging::spawn({
            let (stop, inventory) = (stop.clone(), inventory.clone());
            async move { self.run_until(stop, &inventory).await }
        });
        Rescans { stop, task }
    }

    /// Rescans every interval until `cancel` fires; failures are logged, never fatal.
    ///
    /// The first rescan comes one interval after the call (discovery has just run). A rescan
    /// that takes longer than the interval (a GPU stalling the driver) delays the next one
    /// instead of being followed by a burst.
    pub async fn run_until(&self, cancel: CancellationToken, inventory: &Inventory) {
        let mut ticks = tokio::time::interval(self.every);
        ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
        ticks.tick().await; // the first tick is immediate
        let mut failing = false;
        loop {
            tokio::select! {
                () = cancel.cancelled() => return,
                _ = ticks.tick() => {}
            }
            let rescanned = tokio::select! {
                () = cancel.cancelled() => return,
                rescanned = self.rescan(inventory) => rescanned,
            };
            match rescanned {
                Ok(changed) => {
                    if std::mem::replace(&mut failing, false) {
                        info!("Rescan works again");
                    }
                    if changed {
                        let snapshot = inventory.current();
                        info!(
                            gpus = snapshot.gpus.len(),
                            mig_devices = snapshot
                                .gpus
                                .iter()
                                .map(|g| g.mig.devices.len())
                                .sum::<usize>(),
                            "Rescan found a change; inventory republished"
                        );
                    } else {
                        debug!("Rescan found no change");
                    }
                }
                Err(err) => {
                    failing = true;
                    warn!(error = %crate::logging::error_chain(&err), "Rescan failed; keeping the last inventory");
                }
            }
        }
    }
}

/// A background rescan loop ([`Rescanner::spawn`]).
#[derive(Debug)]
pub struct Rescans {
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Rescans {
    /// Ends the loop and waits for it.
    pub async fn stop(self) {
        self.stop.cancel();
        let _ = self.task.await;
    }
}
