//! Running the reset, verify and reboot commands: with the default signal mask (gpud's
//! threads block SIGTERM, which a child would inherit), no stdin, and a time limit past which
//! the command and every process it started are killed.
//!
//! Every descendant is ended, however it detached: the command starts as the first process
//! (init) of a PID namespace of its own, so whatever it starts — a child that called `setsid`,
//! a double fork — stays in that namespace, and the kernel kills every process in it when the
//! command ends or is killed. A process group (kept too) is left by `setsid`; a child subreaper
//! would have to be gpud itself, which would then reap every orphan of every child it has; a
//! cgroup needs a writable cgroup tree, which a container without systemd seldom has. gpud
//! runs the commands as root (a GPU reset needs it); without the privilege to make a namespace
//! the command runs in its process group only, and that is said once. The reboot command is
//! the exception ([`run_reboot`]): `reboot(2)` called in a PID namespace other than the first
//! ends that namespace instead of rebooting the node.
//!
//! Its output is read while it runs, to the end, whatever its size (a command blocked on a
//! full pipe would hang and be killed for it): the last 4 KiB of stderr are kept (its last
//! line goes in the escalation's message), and the first 256 KiB of stdout when asked for.

use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use nix::sched::CloneFlags;
use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::process::{Child, Command};
use tracing::warn;

/// How much of stderr is kept: its end, where a command says why it failed.
const STDERR_TAIL: usize = 4 * 1024;
/// How much of stdout is kept, when it is: its start (gpud's own report of a check).
const STDOUT_HEAD: usize = 256 * 1024;

/// How a command ended, in words fit for a log line and a Node condition's message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Succeeded,
    /// It ran and failed: its exit status and last line on stderr.
    Failed(String),
    /// It ran past its limit and was killed.
    TimedOut(Duration),
    /// It could not be started.
    NotStarted(String),
}

impl Outcome {
    /// Whether it exited 0.
    pub fn succeeded(&self) -> bool {
        *self == Outcome::Succeeded
    }
}

impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Outcome::Succeeded => f.write_str("succeeded"),
            Outcome::Failed(why) => write!(f, "failed ({why})"),
            Outcome::TimedOut(after) => {
                write!(
                    f,
                    "did not finish within {} and was killed",
                    humantime::format_duration(*after)
                )
            }
            Outcome::NotStarted(why) => write!(f, "could not be started ({why})"),
        }
    }
}

/// Runs `program args…` with `env` added, for at most `limit`.
pub async fn run(
    line: &[String],
    extra_args: &[&str],
    env: &[(&str, &str)],
    limit: Duration,
) -> Outcome {
    run_keeping_output(line, extra_args, env, limit, false, true)
        .await
        .0
}

/// [`run`] for the reboot command: in a process group of its own only, since `reboot -f` in
/// a PID namespace of its own would end that namespace, not reboot the node.
pub async fn run_reboot(line: &[String], limit: Duration) -> Outcome {
    run_keeping_output(line, &[], &[], limit, false, false)
        .await
        .0
}

/// [`run`], keeping what the command printed on stdout too (its first 256 KiB): for gpud's
/// own report of a check.
pub async fn output(
    line: &[String],
    extra_args: &[&str],
    env: &[(&str, &str)],
    limit: Duration,
) -> (Outcome, Vec<u8>) {
    run_keeping_output(line, extra_args, env, limit, true, true).await
}

async fn run_keeping_output(
    line: &[String],
    extra_args: &[&str],
    env: &[(&str, &str)],
    limit: Duration,
    keep_stdout: bool,
    contain: bool,
) -> (Outcome, Vec<u8>) {
    let Some((program, args)) = line.split_first() else {
        return (Outcome::NotStarted("no command".to_owned()), Vec::new());
    };
    let mut command = Command::new(program);
    command
        .args(args)
        .args(extra_args)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(if keep_stdout {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    let spawned = match contain {
        true => spawn_contained(command),
        false => crate::daemon::signals::with_default_mask(|| command.spawn()),
    };
    let mut child = match spawned {
        Ok(child) => child,
        Err(err) => return (Outcome::NotStarted(format!("{program}: {err}")), Vec::new()),
    };
    let pid = child
        .id()
        .and_then(|id| i32::try_from(id).ok())
        .map(Pid::from_raw);
    let stderr = child.stderr.take();
    let stdout = child.stdout.take();
    let finished = tokio::time::timeout(limit, async {
        let (errors, out) = tokio::join!(tail(stderr, STDERR_TAIL), head(stdout, STDOUT_HEAD));
        (child.wait().await, errors, out)
    })
    .await;
    match finished {
        Ok((Ok(status), _, out)) if status.success() => (Outcome::Succeeded, out),
        Ok((Ok(status), text, out)) => {
            let text = String::from_utf8_lossy(&text);
            let last = text
                .lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("");
            let why = if last.is_empty() {
                status.to_string()
            } else {
                format!("{status}: {}", last.trim())
            };
            (Outcome::Failed(why), out)
        }
        Ok((Err(err), _, out)) => (Outcome::Failed(format!("waiting for it: {err}")), out),
        Err(_) => {
            if let Some(pid) = pid {
                // The namespace's init: the kernel kills the rest of the namespace with it.
                let _ = kill(pid, Signal::SIGKILL);
                let _ = killpg(pid, Signal::SIGKILL);
            }
            (Outcome::TimedOut(limit), Vec::new())
        }
    }
}

/// Whether a PID namespace could not be made once already (said once, then not tried again).
static NO_NAMESPACE: AtomicBool = AtomicBool::new(false);

/// Starts `command` as the init of a PID namespace of its own (see the module's header), or,
/// without the privilege for one, in its process group only. The namespace is made by a
/// thread of its own that ends right after: a thread's namespace for its children is set once
/// and for good.
fn spawn_contained(mut command: Command) -> std::io::Result<Child> {
    let runtime = tokio::runtime::Handle::current();
    let starter = std::thread::Builder::new()
        .name("gpud-command".to_owned())
        .spawn(move || {
            let _runtime = runtime.enter();
            if !NO_NAMESPACE.load(Ordering::Relaxed)
                && let Err(err) = nix::sched::unshare(CloneFlags::CLONE_NEWPID)
                && !NO_NAMESPACE.swap(true, Ordering::Relaxed)
            {
                warn!(error = %err, "Cannot give the remediation's commands a PID namespace of their own (gpud needs CAP_SYS_ADMIN for it): a process such a command starts that leaves its process group (setsid) is not killed with it");
            }
            crate::daemon::signals::with_default_mask(|| command.spawn())
        })?;
    starter
        .join()
        .unwrap_or_else(|_| Err(std::io::Error::other("the thread starting it panicked")))
}

/// Reads `from` to its end, keeping its last `keep` bytes.
async fn tail(from: Option<impl AsyncRead + Unpin>, keep: usize) -> Vec<u8> {
    let mut kept = Vec::new();
    let Some(mut from) = from else {
        return kept;
    };
    let mut buffer = vec![0u8; 8 * 1024];
    while let Ok(n) = from.read(&mut buffer).await {
        if n == 0 {
            break;
        }
        kept.extend_from_slice(&buffer[..n]);
        if kept.len() > 2 * keep {
            kept.drain(..kept.len() - keep);
        }
    }
    if kept.len() > keep {
        kept.drain(..kept.len() - keep);
    }
    kept
}

/// Reads `from` to its end, keeping its first `keep` bytes.
async fn head(from: Option<impl AsyncRead + Unpin>, keep: usize) -> Vec<u8> {
    let mut kept = Vec::new();
    let Some(mut from) = from else {
        return kept;
    };
    let mut buffer = vec![0u8; 8 * 1024];
    while let Ok(n) = from.read(&mut buffer).await {
        if n == 0 {
            break;
        }
        let room = keep.saturating_sub(kept.len());
        kept.extend_from_slice(&buffer[..n.min(room)]);
    }
    kept
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(script: &str) -> Vec<String> {
        vec!["sh".into(), "-c".into(), script.into(), "sh".into()]
    }

    #[tokio::test]
    async fn success_failure_with_stderr_and_the_appended_arguments() {
        let ok = run(
            &sh("test \"$1 $2\" = '-i 0000:19:00.0'"),
            &["-i", "0000:19:00.0"],
            &[],
            Duration::from_secs(5),
        )
        .await;
        assert_eq!(ok, Outcome::Succeeded);
        let failed = run(
            &sh("echo noise >&2; echo 'GPU in use' >&2; exit 3"),
            &[],
            &[],
            Duration::from_secs(5),
        )
        .await;
        assert_eq!(failed, Outcome::Failed("exit status: 3: GPU in use".into()));
        let env = run(
            &sh("test \"$GPUD_GPU_UUID\" = GPU-1"),
            &[],
            &[("GPUD_GPU_UUID", "GPU-1")],
            Duration::from_secs(5),
        )
        .await;
        assert_eq!(env, Outcome::Succeeded);
    }

    /// Whether a process whose command line has `token` is alive (zombies are dead).
    fn alive_with(token: &str) -> bool {
        std::fs::read_dir("/proc").unwrap().flatten().any(|entry| {
            let dir = entry.path();
            let cmdline = std::fs::read(dir.join("cmdline")).unwrap_or_default();
            let zombie = std::fs::read_to_string(dir.join("stat"))
                .ok()
                .and_then(|s| {
                    s.rsplit(')')
                        .next()
                        .map(|rest| rest.trim_start().starts_with('Z'))
                })
                .unwrap_or(true);
            String::from_utf8_lossy(&cmdline).contains(token) && !zombie
        })
    }

    /// Waits up to 5 s for every process with `token` to be gone.
    fn gone(token: &str) -> bool {
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while alive_with(token) && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        !alive_with(token)
    }

    #[tokio::test]
    async fn a_hung_command_and_its_children_are_killed_at_the_limit() {
        // A duration no other process has on its command line.
        let token = format!("600.{}", std::process::id());
        let outcome = run(
            &sh(&format!("sleep {token} & wait")),
            &[],
            &[],
            Duration::from_millis(500),
        )
        .await;
        assert_eq!(outcome, Outcome::TimedOut(Duration::from_millis(500)));
        assert!(gone(&token), "the command's child survived");
    }

    #[tokio::test]
    async fn megabytes_on_stderr_neither_block_nor_grow_and_the_last_line_is_kept() {
        let outcome = run(
            &sh("head -c 3000000 /dev/zero | tr '\\0' x >&2; echo >&2; echo 'the end' >&2; exit 2"),
            &[],
            &[],
            Duration::from_secs(20),
        )
        .await;
        assert_eq!(outcome, Outcome::Failed("exit status: 2: the end".into()));
        let (outcome, out) = output(
            &sh("head -c 3000000 /dev/zero"),
            &[],
            &[],
            Duration::from_secs(20),
        )
        .await;
        assert_eq!(outcome, Outcome::Succeeded);
        assert_eq!(out.len(), STDOUT_HEAD);
    }

    #[tokio::test]
    async fn the_tail_kept_is_the_end_of_what_was_written() {
        let text: Vec<u8> = (0..100_000u32).flat_map(|n| n.to_le_bytes()).collect();
        let kept = tail(Some(text.as_slice()), 1000).await;
        assert_eq!(kept, text[text.len() - 1000..]);
        assert_eq!(head(Some(text.as_slice()), 1000).await, text[..1000]);
        assert_eq!(tail(Some(&b"short"[..]), 1000).await, b"short");
    }

    #[tokio::test]
    async fn a_missing_program_is_not_started() {
        let outcome = run(
            &["/nonexistent/reset".to_owned()],
            &[],
            &[],
            Duration::from_secs(1),
        )
        .await;
        assert!(
            matches!(outcome, Outcome::NotStarted(ref why) if why.starts_with("/nonexistent/reset: ")),
            "{outcome:?}"
        );
    }
}
