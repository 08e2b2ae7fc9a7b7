//! Health watching: NVML events, polled counters and the kernel log, folded into per-device
//! health states on the shared inventory, and every XID counted in the [`ledger::XidLedger`].

pub mod dedup;
pub mod kmsg;
pub mod kmsg_source;
pub mod ledger;
pub mod report;
pub mod service;
pub mod tracker;
pub mod transitions;
pub mod watcher;
pub mod xid;
pub mod xid_counts;
