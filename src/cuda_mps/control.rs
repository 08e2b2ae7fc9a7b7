//! Talking to `nvidia-cuda-mps-control`: starting a control daemon (`-d`) and sending it one
//! command on stdin, as NVIDIA's daemon does (`echo <command> | nvidia-cuda-mps-control`).
//!
//! Each invocation gets exactly the daemon's environment (pipe and log directories, visible
//! GPUs) and nothing inherited from gpud's, as NVIDIA runs it, so two daemons never see each
//! other's variables. The calls block; the subsystem runs them on blocking threads. Every call
//! has a deadline: a control binary stuck on a sick GPU must not stall the subsystem. A call
//! made for a caller that is stopping ([`Control::until`]) is killed at once, so that gpud
//! stops within its grace period even while the binary hangs; `quit` has a shorter deadline of
//! its own ([`QUIT_TIMEOUT`]) for the same reason.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

/// How long one invocation may take before it is killed.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// How long `quit` may take: a stopping gpud quits its daemons within its shutdown grace
/// (`crate::daemon`'s five seconds), and a binary that hangs must not hold it past that.
pub const QUIT_TIMEOUT: Duration = Duration::from_secs(2);
/// How often a running invocation is looked at (exit, deadline, stop).
const POLL: Duration = Duration::from_millis(10);
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
    #[error(
        "`{what}` did not finish within {}s and was killed: the MPS control binary {} hangs \
         (a stuck driver or GPU? check `nvidia-smi` and the kernel log); gpud tries again \
         with backoff",
        .after.as_secs(), .binary.display()
    )]
    Timeout {
        what: String,
        binary: PathBuf,
        after: Duration,
    },
    #[error("`{what}` was killed: gpud is stopping")]
    Stopped { what: String },
    #[error("`{what}` failed ({status}): {output}")]
    Failed {
        what: String,
        status: std::process::ExitStatus,
        output: String,
    },
}

/// The control binary and the environment of one daemon.
#[derive(Debug, Clone)]
pub struct Control {
    pub binary: PathBuf,
    /// The whole environment of every invocation, in order.
    pub env: Vec<(String, String)>,
    /// Fires when the caller stops: a running invocation (but `quit`) is killed then.
    stop: Option<CancellationToken>,
}

/// Two controls are the same daemon's when binary and environment agree; who may stop a
/// call is not part of what the daemon is.
impl PartialEq for Control {
    fn eq(&self, other: &Self) -> bool {
        self.binary == other.binary && self.env == other.env
    }
}

impl Eq for Control {}

impl Control {
    /// Runs `binary` with exactly `env`.
    pub fn new(binary: PathBuf, env: Vec<(String, String)>) -> Control {
        Control {
            binary,
            env,
            stop: None,
        }
    }

    /// Every call but `quit` is killed once `stop` fires.
    pub fn until(mut self, stop: CancellationToken) -> Control {
        self.stop = Some(stop);
        self
    }

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
        let stop = self.stop.as_ref();
        self.run(
            &mut cmd,
            "nvidia-cuda-mps-control -d",
            None,
            CALL_TIMEOUT,
            stop,
        )
        .map(|_| ())
    }

    /// Sends `command` to the running daemon; its answer.
    pub fn send(&self, command: &str) -> Result<String, ControlError> {
        self.send_within(command, self.stop.as_ref(), CALL_TIMEOUT)
    }

    /// Sends `quit`, within [`QUIT_TIMEOUT`] and even while the caller stops (stopping is
    /// when it is sent).
    pub fn quit(&self) -> Result<String, ControlError> {
        self.send_within("quit", None, QUIT_TIMEOUT)
    }

    fn send_within(
        &self,
        command: &str,
        stop: Option<&CancellationToken>,
        limit: Duration,
    ) -> Result<String, ControlError> {
        let mut cmd = self.command();
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        self.run(&mut cmd, command, Some(command), limit, stop)
    }

    /// Spawns `cmd`, writes `input` (a command line) to its stdin, and waits for it (see
    /// [`Control::finish`]); nothing is spawned once `stop` fired.
    fn run(
        &self,
        cmd: &mut Command,
        what: &str,
        input: Option<&str>,
        limit: Duration,
        stop: Option<&CancellationToken>,
    ) -> Result<String, ControlError> {
        if stop.is_some_and(CancellationToken::is_cancelled) {
            return Err(ControlError::Stopped { what: what.into() });
        }
        let mut child = self.spawn(cmd)?;
        if let (Some(mut stdin), Some(input)) = (child.stdin.take(), input) {
            // A client that exits without reading (no daemon) closes the pipe: its exit
            // status says what happened, not this write.
            let _ = stdin.write_all(format!("{input}\n").as_bytes());
        }
        self.finish(child, what, limit, stop)
    }

    /// Whether the daemon answers the health probe.
    pub fn probe(&self) -> Result<(), ControlError> {
        self.send(PROBE).map(|_| ())
    }

    /// Waits for `child` until `limit` has passed or `stop` fires, killing it then; its
    /// stdout on success.
    fn finish(
        &self,
        mut child: Child,
        what: &str,
        limit: Duration,
        stop: Option<&CancellationToken>,
    ) -> Result<String, ControlError> {
        let deadline = Instant::now() + limit;
        let status = loop {
            let failure = match child.try_wait() {
                Ok(Some(status)) => break status,
                _ if stop.is_some_and(CancellationToken::is_cancelled) => {
                    ControlError::Stopped { what: what.into() }
                }
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(POLL);
                    continue;
                }
                _ => ControlError::Timeout {
                    what: what.into(),
                    binary: self.binary.clone(),
                    after: limit,
                },
            };
            let _ = child.kill();
            let _ = child.wait();
            return Err(failure);
        };
        output(child, status, what)
    }
}

/// What a finished invocation said: its stdout on success, else both outputs with the status.
fn output(
    mut child: Child,
    status: std::process::ExitStatus,
    what: &str,
) -> Result<String, ControlError> {
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
