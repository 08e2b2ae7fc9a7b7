//! The shared device inventory: the seam between NVML and every subsystem.
//!
//! An [`Inventory`] publishes immutable [`Snapshot`]s through a `tokio::sync::watch` channel.
//! It only holds snapshots, applies updates and hands out subscriptions: discovery and the
//! rescan loop live on the NVML side (`crate::nvml::Rescanner`), and the health watcher and the
//! MIG applier overlay their findings with [`Inventory::update`]. Consumers subscribe and
//! always see a whole, consistent picture; a publish that changes nothing wakes nobody.

pub mod device_taints;
pub mod health;
pub mod mig_profile;
pub mod model;
pub mod pci_bus_id;
pub mod remediation;
pub mod remedy;
mod rescan;
pub mod table;
#[cfg(test)]
pub mod test_support;
pub mod transitions;

use std::sync::Arc;

use tokio::sync::watch;

pub use health::{Health, HealthState};
pub use model::Snapshot;
pub use pci_bus_id::PciBusId;
pub use remedy::{RecoveryAction, Remedy};

/// The node's inventory: the current snapshot, shared by every subsystem of the process.
#[derive(Debug, Clone)]
pub struct Inventory {
    tx: Arc<watch::Sender<Arc<Snapshot>>>,
}

impl Inventory {
    /// Starts publishing from `first` (discovery's first picture of the node).
    pub fn new(first: Snapshot) -> Self {
        let (tx, _) = watch::channel(Arc::new(first));
        Inventory { tx: Arc::new(tx) }
    }

    /// The snapshot now.
    pub fn current(&self) -> Arc<Snapshot> {
        self.tx.borrow().clone()
    }

    /// A receiver that is woken on every change.
    pub fn subscribe(&self) -> watch::Receiver<Arc<Snapshot>> {
        self.tx.subscribe()
    }

    /// Publishes what a rescan found, merged with what discovery cannot see (health verdicts
    /// of the watcher, the identity of a GPU that fell off the bus). Returns whether anything
    /// changed.
    pub fn publish_rescan(&self, fresh: Snapshot) -> bool {
        self.publish_rescan_with(fresh, |_| {})
    }

    /// As [`Inventory::publish_rescan`], then applies `change` to the merged snapshot, all in
    /// one publish: the MIG applier clears its marks together with the new layout, so no
    /// subscriber sees the new MIG devices still withdrawn.
    pub fn publish_rescan_with(&self, fresh: Snapshot, change: impl FnOnce(&mut Snapshot)) -> bool {
        self.tx.send_if_modified(|current| {
            let mut merged = rescan::merge(current, fresh);
            change(&mut merged);
            if merged == **current {
                return false;
            }
            *current = Arc::new(merged);
            true
        })
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
