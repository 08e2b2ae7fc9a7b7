//! MPS: gpud's own MPS control daemons, one per MPS-shared resource, for NVIDIA's
//! `sharing.mps` — in `gpud run` when the config asks for MPS, or standalone as
//! `gpud mps-control-daemon`.
//!
//! One job per file: [`plan`] (which daemons, over which GPUs, with which limits, and what MPS
//! refuses), [`control`] (running `nvidia-cuda-mps-control`), [`layout`] (folders, the shm
//! tmpfs, the markers), [`daemon`] (one daemon's start and stop sequence), [`service`] (the
//! subsystem: supervision, restarts, reconfiguration) and [`args`] (the command line).
//!
//! The host layout and what Allocate adds are the device plugin's (`device_plugin::mps`): the
//! two sides meet only through the `.started` markers, so they work in one process or two.

pub mod args;
pub mod control;
pub mod daemon;
pub mod layout;
pub mod plan;
pub mod service;

pub use args::MpsArgs;
pub use service::MpsControl;

use crate::daemon::Error;
use crate::device_plugin::settings::Settings;
use crate::inventory::Snapshot;

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
