//! Talking to `nvidia-cuda-mps-control`: starting a control daemon (`-d`) and sending it one
//! command on stdin, as NVIDIA's daemon does (`echo <command> | nvidia-cuda-mps-control`).
//!
//! Each invocation gets exactly the daemon's environment (pipe and log directories, visible
//! GPUs) and nothing inherited from gpud's, as NVIDIA runs it, so two daemons never see each
//! other's variables. The calls block; the subsystem runs them on blocking threads. Every call
//! has a deadline: a control binary stuck on a sick GPU must not stall the subsystem.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long one invocation may take before it is killed.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// The health probe NVIDIA's device plugin uses.
pub const PROBE: &str = "get_default_active_thread_percentage";

/// Why a control invocation failed.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error(
        "cannot run the MPS control binary {} (install the driver's \
         nvidia-cuda-mps-control on PATH or point --mps-control-binary at it)",
        .binary.display()
    )]
    Spawn {
        binary: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("`{what}` did not finish within {}s", CALL_TIMEOUT.as_secs())]
    Timeout { what: String },
    #[error("`{what}` failed ({status}): {output}")]
    Failed {
        what: String,
        status: std::process::ExitStatus,
        output: String,
    },
}

/// The control binary and the environment of one daemon.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Control {
    pub binary: PathBuf,
    /// The whole environment of every invocation, in order.
    pub env: Vec<(String, String)>,
}

impl Control {
    fn command(&self) -> Command {
        let mut cmd = Command::new(&self.binary);
        cmd.env_clear();
        cmd.envs(self.env.iter().map(|(k, v)| (k, v)));
        cmd
    }

    fn spawn(&self, cmd: &mut Command) -> Result<Child, ControlError> {
        // The daemon and its servers must be stoppable by SIGTERM (`quit` sends it).
        crate::daemon::signals::with_default_mask(|| cmd.spawn()).map_err(|source| {
            ControlError::Spawn {
                binary: self.binary.clone(),
                source,
            }
        })
    }

    /// Starts the control daemon: `nvidia-cuda-mps-control -d`, which forks the daemon and
    /// returns.
    pub fn start_daemon(&self) -> Result<(), ControlError> {
        let mut cmd = self.command();
        cmd.arg("-d")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let child = self.spawn(&mut cmd)?;
        finish(child, "nvidia-cuda-mps-control -d").map(|_| ())
    }

    /// Sends `command` to the running daemon; its answer.
    pub fn send(&self, command: &str) -> Result<String, ControlError> {
        let mut cmd = self.command();
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = self.spawn(&mut cmd)?;
        if let Some(mut stdin) = child.stdin.take() {
            // A client that exits without reading (no daemon) closes the pipe: its exit
            // status says what happened, not this write.
            let _ = stdin.write_all(format!("{command}\n").as_bytes());
        }
        finish(child, command)
    }

    /// Whether the daemon answers the health probe.
    pub fn probe(&self) -> Result<(), ControlError> {
        self.send(PROBE).map(|_| ())
    }
}

/// Waits for `child` until [`CALL_TIMEOUT`]; its stdout on success.
fn finish(mut child: Child, what: &str) -> Result<String, ControlError> {
    let deadline = Instant::now() + CALL_TIMEOUT;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(ControlError::Timeout { what: what.into() });
            }
        }
    };
    let read = |pipe: Option<&mut dyn Read>| {
        let mut text = String::new();
        if let Some(pipe) = pipe {
            let _ = pipe.read_to_string(&mut text);
        }
        text.trim().to_owned()
    };
    let stdout = read(child.stdout.as_mut().map(|p| p as &mut dyn Read));
    if status.success() {
        return Ok(stdout);
    }
    let stderr = read(child.stderr.as_mut().map(|p| p as &mut dyn Read));
    let output = [stdout, stderr]
        .into_iter()
        .filter(|t| !t.is_empty())
        .collect::<Vec<_>>()
        .join("; ");
    Err(ControlError::Failed {
        what: what.into(),
        status,
        output,
    })
}
