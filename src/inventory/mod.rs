//! The shared device inventory: the seam between NVML and every subsystem.
//!
//! An [`Inventory`] publishes immutable [`Snapshot`]s through a `tokio::sync::watch` channel.
//! Discovery produces them (at start and on every rescan); the health watcher and the MIG
//! applier overlay their findings. Consumers subscribe and always see a whole, consistent
//! picture; a publish that changes nothing wakes nobody.
//!
//! Long-running applets keep the picture current with [`Inventory::rescan_periodically`]: a
//! MIG reconfiguration, or a GPU that appears or falls off the bus, reaches every subscriber
//! within one rescan interval.

pub mod health;
pub mod mig_profile;
pub mod model;
pub mod pci_bus_id;
mod rescan;
pub mod table;
#[cfg(test)]
pub mod test_support;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

pub use health::{Health, HealthState};
pub use model::Snapshot;
pub use pci_bus_id::PciBusId;

use crate::nvml::{NodeFacts, Nvml, NvmlError};

/// The node's inventory: the current snapshot and a way to refresh it.
#[derive(Debug, Clone)]
pub struct Inventory {
    nvml: Nvml,
    facts: Arc<NodeFacts>,
    tx: Arc<watch::Sender<Arc<Snapshot>>>,
}

impl Inventory {
    /// Discovers the node once and starts publishing. Blocks on the driver: call it before the
    /// runtime starts or from a blocking thread.
    pub fn discover(nvml: Nvml, facts: NodeFacts) -> Result<Self, NvmlError> {
        let first = nvml.discover(&facts)?;
        let (tx, _) = watch::channel(Arc::new(first));
        Ok(Inventory {
            nvml,
            facts: Arc::new(facts),
            tx: Arc::new(tx),
        })
    }

    /// The snapshot now.
    pub fn current(&self) -> Arc<Snapshot> {
        self.tx.borrow().clone()
    }

    /// A receiver that is woken on every change.
    pub fn subscribe(&self) -> watch::Receiver<Arc<Snapshot>> {
        self.tx.subscribe()
    }

    /// Re-reads the node from NVML and publishes the result if anything changed. Returns
    /// whether it did. Runs discovery on a blocking thread.
    pub async fn rescan(&self) -> Result<bool, NvmlError> {
        let nvml = self.nvml.clone();
        let facts = Arc::clone(&self.facts);
        let fresh = tokio::task::spawn_blocking(move || nvml.discover(&facts))
            .await
            .map_err(|join| NvmlError::Unavailable {
                attempts: vec![(
                    self.nvml.library_path().to_path_buf(),
                    format!("discovery task failed: {join}"),
                )],
            })??;
        Ok(self.tx.send_if_modified(|current| {
            let merged = rescan::merge(current, fresh);
            if merged == **current {
                return false;
            }
            *current = Arc::new(merged);
            true
        }))
    }

    /// Rescans every `every` until `cancel` fires; failures are logged, never fatal.
    ///
    /// The first rescan comes one interval after the call (discovery has just run). A rescan
    /// that takes longer than the interval (a GPU stalling the driver) delays the next one
    /// instead of being followed by a burst. A zero interval cannot be ticked: it is logged and
    /// nothing is rescanned.
    pub async fn rescan_periodically(&self, cancel: CancellationToken, every: Duration) {
        if every.is_zero() {
            warn!("Rescan interval is zero; the inventory will not be rescanned");
            return;
        }
        let mut ticks = tokio::time::interval(every);
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
                rescanned = self.rescan() => rescanned,
            };
            match rescanned {
                Ok(changed) => {
                    if std::mem::replace(&mut failing, false) {
                        info!("Rescan works again");
                    }
                    if changed {
                        let snapshot = self.current();
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
                    warn!(error = %err, "Rescan failed; keeping the last inventory");
                }
            }
        }
    }

    /// Applies `change` to a copy of the current snapshot and publishes it if it differs.
    /// Used by the health watcher and the MIG applier.
    pub fn update(&self, change: impl FnOnce(&mut Snapshot)) -> bool {
        self.tx.send_if_modified(|current| {
            let mut next = (**current).clone();
            change(&mut next);
            if next == **current {
                return false;
            }
            *current = Arc::new(next);
            true
        })
    }
}
