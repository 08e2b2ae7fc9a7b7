//! The XID seam: what an XID means and which ones take a GPU out of service, and the node's
//! record of every one seen. The health watcher writes it; the exporter, the doctor and the
//! node status read it. No subsystem owns it.
//!
//! - [`catalog`]: NVIDIA's XID catalog (severity, action) and the XID policy, configured the
//!   way NVIDIA's device plugin configures it;
//! - [`kmsg`]: `NVRM` kernel-log lines parsed into XIDs and other GPU events;
//! - [`counts`]: the exact, bounded XID counts per GPU, instance and code;
//! - [`ledger`]: those counts shared between their writer and their readers.

pub mod catalog;
pub mod counts;
pub mod kmsg;
pub mod ledger;
