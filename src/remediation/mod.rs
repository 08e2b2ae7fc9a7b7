//! Self-healing GPUs (`--remediation`): a GPU the health watcher finds unhealthy is drained,
//! reset, verified and given back, within a cluster-wide budget, or escalated on the Node in
//! a condition node-repair engines act on. Off unless asked for.
//!
//! - [`args`]: the flags and the settings they resolve to;
//! - [`need`]: what a GPU needs (reset, reboot, hardware), from the driver and the verdict;
//! - [`engine`]: the per-GPU state machine and its safety rules;
//! - [`drain`], [`budget`], [`verify`], [`mig_layout`]: its steps, with the commands and the
//!   doctor's checks run as children ([`crate::child`]);
//! - [`peers`]: the NVLink peers a reset takes together;
//! - [`escalation`]: the Node condition `GPURemediationRequired`;
//! - [`service`]: the subsystem.

pub mod args;
pub mod budget;
pub mod drain;
pub mod engine;
pub mod escalation;
pub mod mig_layout;
pub mod need;
pub mod peers;
pub mod service;
pub mod verify;

pub use args::{RemediationArgs, Settings};
pub use service::Remediation;
