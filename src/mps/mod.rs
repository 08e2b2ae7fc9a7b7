//! MPS: gpud's own MPS control daemons, one per MPS-shared resource, for NVIDIA's
//! `sharing.mps` — in `gpud run` when the config asks for MPS, or standalone as
//! `gpud mps-control-daemon`.
//!
//! One job per file: [`plan`] (which daemons, over which GPUs, with which limits, and what MPS
//! refuses), [`layout`] (the shm tmpfs, the markers), [`daemon`] (one resource's daemon over
//! the shared start and stop sequence of [`crate::cuda_mps`], which the DRA plugin's per-claim
//! daemons use too), [`service`] (the subsystem: supervision, restarts, reconfiguration) and
//! [`args`] (the command line). `control` is [`crate::cuda_mps::control`], re-exported.
//!
//! The host layout and what Allocate adds are the device plugin's (`device_plugin::mps`): the
//! two sides meet only through the `.started` markers, so they work in one process or two.

pub mod args;
pub mod daemon;
pub mod layout;
pub mod plan;
pub mod service;

pub use crate::cuda_mps::control;
pub use args::MpsArgs;
pub use service::MpsControl;

use crate::daemon::Error;
use crate::inventory::Snapshot;
use crate::resources::settings::Settings;

/// Checks at start that MPS can run as configured on this node (no MIG devices, replicas
/// within MPS's client limit): exit 65 with NVIDIA's wording otherwise.
pub fn check_at_start(settings: &Settings, snapshot: &Snapshot) -> Result<(), Error> {
    match plan::plan(settings, snapshot) {
        Ok(_) => Ok(()),
        // A node the settings cannot express is the device plugin's to report (it advertises
        // nothing until it changes), not a configuration error.
        Err(plan::PlanError::Resources(_)) => Ok(()),
        Err(err) => Err(Error::config(format!("sharing.mps: {err}"))),
    }
}
