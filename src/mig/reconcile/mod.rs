//! The reconciler: keeps the GPUs at the config named by the Node's `nvidia.com/mig.config`
//! label and reports progress in `nvidia.com/mig.config.state`, as mig-manager does, without
//! its ways of getting stuck.
//!
//! - [`node`]: reading and watching the Node, writing the state label and the reason;
//! - [`attempt`]: one check-then-apply of a label's config, on a blocking thread;
//! - [`marker`]: the on-disk record that a reboot was requested for a config;
//! - [`service`]: the loop (a daemon subsystem); [`args`]: its flags.
//!
//! Its last outcome on disk and its counters are [`crate::mig_state`], which the doctor and
//! the exporter read.
//!
//! Unlike mig-manager, a failed config is retried with backoff (no label change needed), every
//! start re-checks the label's config (so a restart in `pending` or `rebooting` resumes), and
//! the reason for `failed` is written on the Node.

pub mod args;
pub mod attempt;
pub mod marker;
pub mod node;
pub mod service;
