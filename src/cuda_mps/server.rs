//! One MPS control daemon, independent of what it serves: its GPUs, its pipe and log folders
//! and the limit commands sent once it answers.
//!
//! Start, as NVIDIA's daemons take it: the GPUs to compute mode EXCLUSIVE_PROCESS, the pipe and
//! log folders, `nvidia-cuda-mps-control -d` with `CUDA_VISIBLE_DEVICES` = the GPUs' UUIDs
//! (never overlapping another daemon's), a bounded wait until the daemon answers the probe,
//! then the limits. Stop is `quit`; which GPUs go back to compute mode DEFAULT is the
//! caller's choice (another user may keep a GPU in MPS).
//!
//! Every step blocks (NVML, child processes); callers run them on blocking threads.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::control::{Control, ControlError};
use crate::nvml::compute_mode::ComputeMode;
use crate::nvml::{Nvml, NvmlError};

/// How long a freshly started daemon gets to answer before its start counts as failed.
pub const ANSWER_WAIT: Duration = Duration::from_secs(10);
/// The pause between probes while waiting for it.
const ANSWER_STEP: Duration = Duration::from_millis(50);

/// Why a daemon could not be started.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("cannot set GPU {uuid} to compute mode {mode}: {source}")]
    ComputeMode {
        uuid: String,
        mode: ComputeMode,
        #[source]
        source: NvmlError,
    },
    #[error("cannot create {}: {source}", .path.display())]
    Folder {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Control(#[from] ControlError),
}

/// One control daemon: where it lives, what it sees, what it is told once up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Server {
    /// The GPU UUIDs in `CUDA_VISIBLE_DEVICES` order: the daemon's device ordinals.
    pub gpus: Vec<String>,
    pub pipe_dir: PathBuf,
    pub log_dir: PathBuf,
    /// Sent in order once the daemon answers (`set_default_…`).
    pub limits: Vec<String>,
    control: Control,
}

/// The whole environment of a daemon over `gpus` with these folders (and of every command
/// sent to it): nothing of gpud's own leaks in.
pub fn environment(pipe_dir: &Path, log_dir: &Path, gpus: &[String]) -> Vec<(String, String)> {
    vec![
        (
            "CUDA_MPS_PIPE_DIRECTORY".into(),
            pipe_dir.to_string_lossy().into_owned(),
        ),
        (
            "CUDA_MPS_LOG_DIRECTORY".into(),
            log_dir.to_string_lossy().into_owned(),
        ),
        ("CUDA_VISIBLE_DEVICES".into(), gpus.join(",")),
    ]
}

impl Server {
    /// The daemon over `gpus` with these folders, run with `binary`.
    pub fn new(
        binary: &Path,
        gpus: Vec<String>,
        pipe_dir: PathBuf,
        log_dir: PathBuf,
        limits: Vec<String>,
    ) -> Server {
        let control = Control::new(
            binary.to_path_buf(),
            environment(&pipe_dir, &log_dir, &gpus),
        );
        Server {
            gpus,
            pipe_dir,
            log_dir,
            limits,
            control,
        }
    }

    /// Every control call but `quit` is killed once `stop` fires (the caller is stopping).
    pub fn until(mut self, stop: tokio_util::sync::CancellationToken) -> Server {
        self.control = self.control.until(stop);
        self
    }

    /// Sets every GPU of the daemon to `mode`.
    pub fn set_mode(&self, nvml: &Nvml, mode: ComputeMode) -> Result<(), ServerError> {
        set_mode(nvml, &self.gpus, mode)
    }

    /// The start sequence; `Ok` once the daemon answers and took its limits.
    pub fn start(&self, nvml: &Nvml) -> Result<(), ServerError> {
        self.set_mode(nvml, ComputeMode::ExclusiveProcess)?;
        for path in [&self.pipe_dir, &self.log_dir] {
            std::fs::create_dir_all(path).map_err(|source| ServerError::Folder {
                path: path.clone(),
                source,
            })?;
        }
        self.control.start_daemon()?;
        self.wait_answering()?;
        for command in &self.limits {
            self.control.send(command)?;
        }
        Ok(())
    }

    /// Waits until the new daemon answers the probe, at most [`ANSWER_WAIT`].
    fn wait_answering(&self) -> Result<(), ControlError> {
        let deadline = Instant::now() + ANSWER_WAIT;
        loop {
            match self.control.probe() {
                Ok(()) => return Ok(()),
                Err(err @ ControlError::Stopped { .. }) => return Err(err),
                Err(err) if Instant::now() >= deadline => return Err(err),
                Err(_) => std::thread::sleep(ANSWER_STEP),
            }
        }
    }

    /// The health probe (NVIDIA's `get_default_active_thread_percentage`).
    pub fn probe(&self) -> Result<(), ControlError> {
        self.control.probe()
    }

    /// Sends `quit`; a daemon already gone is logged, not an error.
    pub fn quit(&self) {
        if let Err(err) = self.control.quit() {
            tracing::warn!(pipe = %self.pipe_dir.display(), error = %crate::logging::error_chain(&err),
                "The MPS control daemon did not take `quit`; it may have died already");
        }
    }
}

/// Sets each of `gpus` to `mode`; the first failure is the error.
pub fn set_mode(nvml: &Nvml, gpus: &[String], mode: ComputeMode) -> Result<(), ServerError> {
    for uuid in gpus {
        nvml.set_compute_mode(uuid, mode)
            .map_err(|source| ServerError::ComputeMode {
                uuid: uuid.clone(),
                mode,
                source,
            })?;
    }
    Ok(())
}

/// How gpud runs control daemons: the binary, whether it mounts the shm tmpfs, and how often
/// a running daemon is probed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Launch {
    /// `nvidia-cuda-mps-control`, resolved on gpud's PATH.
    pub binary: PathBuf,
    /// Leave the shm folder a plain folder (`--mps-skip-shm-mount`).
    pub skip_shm_mount: bool,
    /// How often each daemon is probed (`--mps-probe-interval`).
    pub probe_interval: Duration,
}
