//! The XID seam: what an XID means and which ones take a GPU out of service, and the node's
//! record of every one seen. The health watcher writes it; the exporter, the doctor and the
//! node status read it. No subsystem owns it.
//!
//! - [`catalog`]: NVIDIA's XID catalog (severity, action) and the XID policy, configured the
//!   way NVIDIA's device plugin configures it;
//! - [`configured`]: that policy as this node configures it (config file and environment),
//!   read alike by the health watcher and the doctor;
//! - [`kmsg`]: `NVRM` kernel-log lines parsed into XIDs and other GPU events;
//! - [`counts`]: the exact, bounded XID counts per GPU, instance and code;
//! - [`ledger`]: those counts shared between their writer and their readers.

pub mod catalog;
pub mod configured;
pub mod counts;
pub mod kmsg;
pub mod ledger;
