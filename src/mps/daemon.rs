//! One MPS-shared resource's control daemon: the shared start and stop sequence
//! ([`crate::cuda_mps::server`]) over the resource's GPUs, folders and limits, plus the
//! device plugin's `.started` marker; and back: `quit`, compute mode DEFAULT, the marker and
//! log folder removed.
//!
//! Every step blocks (NVML, child processes); the subsystem runs them on blocking threads.

use std::path::{Path, PathBuf};

use tokio_util::sync::CancellationToken;

use super::layout::{self, LayoutError};
use super::plan::DaemonPlan;
use crate::cuda_mps::control::ControlError;
use crate::cuda_mps::layout as paths;
use crate::cuda_mps::server::{Server, ServerError};
use crate::nvml::Nvml;
use crate::nvml::compute_mode::ComputeMode;

/// Why a daemon could not be started.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error(transparent)]
    Server(#[from] ServerError),
    #[error(transparent)]
    Layout(#[from] LayoutError),
}

/// One resource's control daemon.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Daemon {
    pub plan: DaemonPlan,
    pub root: PathBuf,
    server: Server,
}

impl Daemon {
    /// The daemon of `plan` under `root`, run with `binary`; a call to the binary in flight
    /// when `stop` fires is killed (`quit` excepted).
    pub fn new(plan: DaemonPlan, root: &Path, binary: &Path, stop: CancellationToken) -> Daemon {
        let server = Server::new(
            binary,
            plan.gpus.iter().map(|g| g.uuid.clone()).collect(),
            paths::pipe_dir(root, &plan.resource),
            paths::log_dir(root, &plan.resource),
            plan.limit_commands(),
        )
        .until(stop);
        Daemon {
            plan,
            root: root.to_path_buf(),
            server,
        }
    }

    /// The resource it serves.
    pub fn resource(&self) -> &str {
        &self.plan.resource
    }

    /// The start sequence; `.started` is written only once every step succeeded.
    pub fn start(&self, nvml: &Nvml) -> Result<(), DaemonError> {
        layout::unmark(&paths::started_marker(&self.root, self.resource()));
        self.server.start(nvml)?;
        layout::mark(&paths::started_marker(&self.root, self.resource()))?;
        Ok(())
    }

    /// The health probe (NVIDIA's `get_default_active_thread_percentage`).
    pub fn probe(&self) -> Result<(), ControlError> {
        self.server.probe()
    }

    /// Marks the daemon down: the device plugin stops offering its resource's devices.
    pub fn mark_down(&self) {
        layout::unmark(&paths::started_marker(&self.root, self.resource()));
    }

    /// Stops the daemon and gives the GPUs back: `quit`, compute mode DEFAULT, traces removed.
    /// Failures are logged: stopping goes on with the next step.
    pub fn stop(&self, nvml: &Nvml) {
        self.mark_down();
        self.server.quit();
        if let Err(err) = self.server.set_mode(nvml, ComputeMode::Default) {
            tracing::error!(resource = %self.resource(), error = %crate::logging::error_chain(&err),
                "Cannot set the GPUs back to compute mode DEFAULT; `gpud doctor` reports it");
        }
        layout::clear_resource(&self.root, self.resource());
    }
}
