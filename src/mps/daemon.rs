//! One MPS control daemon's life, step by step as NVIDIA's daemon takes it: compute mode, the
//! folders, `nvidia-cuda-mps-control -d`, the default limits, the `.started` marker; and back:
//! `quit`, compute mode DEFAULT, the marker and log folder removed.
//!
//! Every step blocks (NVML, child processes); the subsystem runs them on blocking threads.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::control::{Control, ControlError};
use super::layout::{self, LayoutError};
use super::plan::DaemonPlan;
use crate::device_plugin::mps as paths;
use crate::nvml::compute_mode::ComputeMode;
use crate::nvml::{Nvml, NvmlError};

/// How long a freshly started daemon gets to answer before its start counts as failed.
pub const ANSWER_WAIT: Duration = Duration::from_secs(10);
/// The pause between probes while waiting for it.
const ANSWER_STEP: Duration = Duration::from_millis(50);

/// Why a daemon could not be started.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error("cannot set GPU {uuid} to compute mode {mode}: {source}")]
    ComputeMode {
        uuid: String,
        mode: ComputeMode,
        #[source]
        source: NvmlError,
    },
    #[error(transparent)]
    Layout(#[from] LayoutError),
    #[error(transparent)]
    Control(#[from] ControlError),
}

/// One resource's control daemon.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Daemon {
    pub plan: DaemonPlan,
    pub root: PathBuf,
    control: Control,
}

impl Daemon {
    /// The daemon of `plan` under `root`, run with `binary`.
    pub fn new(plan: DaemonPlan, root: &Path, binary: &Path) -> Daemon {
        let control = Control {
            binary: binary.to_path_buf(),
            env: plan.env(root),
        };
        Daemon {
            plan,
            root: root.to_path_buf(),
            control,
        }
    }

    /// The resource it serves.
    pub fn resource(&self) -> &str {
        &self.plan.resource
    }

    fn set_mode(&self, nvml: &Nvml, mode: ComputeMode) -> Result<(), DaemonError> {
        for gpu in &self.plan.gpus {
            nvml.set_compute_mode(&gpu.uuid, mode)
                .map_err(|source| DaemonError::ComputeMode {
                    uuid: gpu.uuid.clone(),
                    mode,
                    source,
                })?;
        }
        Ok(())
    }

    /// The start sequence; `.started` is written only once every step succeeded.
    pub fn start(&self, nvml: &Nvml) -> Result<(), DaemonError> {
        layout::unmark(&paths::started_marker(&self.root, self.resource()));
        self.set_mode(nvml, ComputeMode::ExclusiveProcess)?;
        layout::prepare_resource(&self.root, self.resource())?;
        self.control.start_daemon()?;
        self.wait_answering()?;
        for command in self.plan.limit_commands() {
            self.control.send(&command)?;
        }
        layout::mark(&paths::started_marker(&self.root, self.resource()))?;
        Ok(())
    }

    /// Waits until the new daemon answers the probe.
    fn wait_answering(&self) -> Result<(), ControlError> {
        let deadline = std::time::Instant::now() + ANSWER_WAIT;
        loop {
            match self.control.probe() {
                Ok(()) => return Ok(()),
                Err(err) if std::time::Instant::now() >= deadline => return Err(err),
                Err(_) => std::thread::sleep(ANSWER_STEP),
            }
        }
    }

    /// The health probe (NVIDIA's `get_default_active_thread_percentage`).
    pub fn probe(&self) -> Result<(), ControlError> {
        self.control.probe()
    }

    /// Marks the daemon down: the device plugin stops offering its resource's devices.
    pub fn mark_down(&self) {
        layout::unmark(&paths::started_marker(&self.root, self.resource()));
    }

    /// Stops the daemon and gives the GPUs back: `quit`, compute mode DEFAULT, traces removed.
    /// Failures are logged: stopping goes on with the next step.
    pub fn stop(&self, nvml: &Nvml) {
        self.mark_down();
        if let Err(err) = self.control.send("quit") {
            tracing::warn!(resource = %self.resource(), error = %crate::telemetry::error_chain(&err),
                "The MPS control daemon did not take `quit`; it may have died already");
        }
        if let Err(err) = self.set_mode(nvml, ComputeMode::Default) {
            tracing::error!(resource = %self.resource(), error = %crate::telemetry::error_chain(&err),
                "Cannot set the GPUs back to compute mode DEFAULT; `gpud doctor` reports it");
        }
        layout::clear_resource(&self.root, self.resource());
    }
}
