//! Applying a claim's time-slice interval to its GPU, as NVIDIA's driver does:
//! `nvidia-smi compute-policy -i <GPU uuid> --set-timeslice <0|1|2|3>` (`Default`, `Short`,
//! `Medium`, `Long`). NVML has no call for the compute policy, so the utility is run.
//!
//! Only full GPUs take an interval: the scheduler of a MIG device is its GPU instance's, and
//! NVIDIA's `MigDeviceConfig` has no `timeSlicingConfig` ([`super::opaque`] refuses one).
//!
//! Each run is bounded by [`TIMEOUT`], well inside the kubelet's 45 s call timeout, so a hung
//! utility fails the claim instead of the whole call; a failure names the GPU, the command
//! line and what the utility wrote to stderr.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How long one `nvidia-smi` run may take.
pub const TIMEOUT: Duration = Duration::from_secs(20);

/// The interval a GPU goes back to when no prepared claim asks for one.
pub const DEFAULT_INTERVAL: &str = "Default";

/// The `--set-timeslice` value of an interval name.
pub fn level(interval: &str) -> Option<u8> {
    match interval {
        "Default" => Some(0),
        "Short" => Some(1),
        "Medium" => Some(2),
        "Long" => Some(3),
        _ => None,
    }
}

/// The command that sets GPUs' time-slice intervals.
#[derive(Debug, Clone)]
pub struct TimeSlicer {
    nvidia_smi: PathBuf,
    /// The folder of the NVML library gpud loaded: nvidia-smi loads the same one, which a
    /// driver container's nvidia-smi would not find on the host's library path.
    nvml_dir: Option<PathBuf>,
    timeout: Duration,
}

impl TimeSlicer {
    /// Runs `nvidia_smi` (a path, or a name looked up on `PATH`) with `LD_LIBRARY_PATH` set
    /// to `nvml_dir` when known.
    pub fn new(nvidia_smi: PathBuf, nvml_dir: Option<PathBuf>) -> TimeSlicer {
        TimeSlicer {
            nvidia_smi,
            nvml_dir,
            timeout: TIMEOUT,
        }
    }

    /// The command line that sets `gpu_uuid` to `interval`, as it is run and reported.
    pub fn command_line(&self, gpu_uuid: &str, interval: &str) -> Vec<String> {
        vec![
            self.nvidia_smi.display().to_string(),
            "compute-policy".into(),
            "-i".into(),
            gpu_uuid.into(),
            "--set-timeslice".into(),
            level(interval).unwrap_or(0).to_string(),
        ]
    }

    /// Sets the time-slice interval of GPU `gpu_uuid`; the error is the claim's.
    pub async fn set(&self, gpu_uuid: &str, interval: &str) -> Result<(), String> {
        let argv = self.command_line(gpu_uuid, interval);
        let timeout = self.timeout;
        let shown = argv.join(" ");
        let nvml_dir = self.nvml_dir.clone();
        let run = tokio::task::spawn_blocking(move || run_bounded(&argv, nvml_dir, timeout))
            .await
            .map_err(|e| e.to_string())
            .and_then(|r| r);
        run.map_err(|why| {
            format!("GPU {gpu_uuid}: setting the time-slice interval {interval} with `{shown}` failed: {why}")
        })
    }
}

/// Runs `argv` and waits at most `timeout`; the error says how it failed, with its stderr.
fn run_bounded(
    argv: &[String],
    nvml_dir: Option<PathBuf>,
    timeout: Duration,
) -> Result<(), String> {
    let (program, args) = argv.split_first().ok_or("no command")?;
    let mut command = Command::new(Path::new(program));
    if let Some(dir) = nvml_dir {
        command.env("LD_LIBRARY_PATH", dir);
    }
    command
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut child = crate::daemon::signals::with_default_mask(|| command.spawn())
        .map_err(|e| format!("cannot run it: {e} (see --dra-nvidia-smi-path)"))?;
    // Read stderr beside the wait, so a chatty utility cannot fill the pipe and stall.
    let stderr = child.stderr.take().and_then(|mut pipe| {
        crate::logging::spawn_thread("nvidia-smi-stderr", move || {
            let mut text = String::new();
            let _ = pipe.read_to_string(&mut text);
            text
        })
        .ok()
    });
    let deadline = Instant::now() + timeout;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() >= deadline => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("no answer within {timeout:?}; it was killed"));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(10)),
            Err(e) => return Err(format!("waiting for it: {e}")),
        }
    };
    let stderr = stderr
        .and_then(|reader| reader.join().ok())
        .unwrap_or_default();
    if status.success() {
        Ok(())
    } else {
        Err(format!("{status}: {}", stderr.trim()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intervals_map_to_nvidia_smi_levels() {
        assert_eq!(
            ["Default", "Short", "Medium", "Long", "Huge"].map(level),
            [Some(0), Some(1), Some(2), Some(3), None]
        );
    }

    #[test]
    fn a_failure_carries_stderr_and_a_hang_is_cut_short() {
        let sh = |script: &str| vec!["/bin/sh".to_owned(), "-c".into(), script.into()];
        assert_eq!(run_bounded(&sh("exit 0"), None, TIMEOUT), Ok(()));
        let lib = Some(PathBuf::from("/opt/driver/lib"));
        let check = sh("test \"$LD_LIBRARY_PATH\" = /opt/driver/lib");
        assert_eq!(run_bounded(&check, lib, TIMEOUT), Ok(()));
        let err = run_bounded(&sh("echo 'Not supported' >&2; exit 3"), None, TIMEOUT).unwrap_err();
        assert_eq!(err, "exit status: 3: Not supported");
        let started = Instant::now();
        let err = run_bounded(&sh("sleep 5"), None, Duration::from_millis(100)).unwrap_err();
        assert_eq!(err, "no answer within 100ms; it was killed");
        assert!(started.elapsed() < Duration::from_secs(4));
    }
}
