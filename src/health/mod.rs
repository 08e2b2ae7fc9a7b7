//! Health watching: NVML events, polled counters and the kernel log, folded by the
//! [`tracker`] into per-device health verdicts on the shared inventory, and every XID counted
//! in the [`crate::xid::ledger::XidLedger`]. The verdict is made here once, with the configured
//! XID policy; the device plugin, the DRA plugin, the labeller, the exporter and the node
//! status all read it from the inventory.

pub mod args;
pub mod dedup;
pub mod evidence;
pub mod kept;
pub mod kept_file;
pub mod kept_store;
pub mod report;
pub mod service;
pub mod sources;
pub mod tracker;
pub mod watcher;
