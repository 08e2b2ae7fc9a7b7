//! Running the reset, verify and reboot commands: with the default signal mask (gpud's
//! threads block SIGTERM, which a child would inherit), no stdin, in a process group of its
//! own, and a time limit past which the whole group is killed. What it printed on stderr is
//! kept (the last line) for the escalation's message.

use std::process::Stdio;
use std::time::Duration;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::io::AsyncReadExt;
use tokio::process::Command;

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
    run_keeping_output(line, extra_args, env, limit, false)
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
    run_keeping_output(line, extra_args, env, limit, true).await
}

async fn run_keeping_output(
    line: &[String],
    extra_args: &[&str],
    env: &[(&str, &str)],
    limit: Duration,
    keep_stdout: bool,
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
    let spawned = crate::daemon::signals::with_default_mask(|| command.spawn());
    let mut child = match spawned {
        Ok(child) => child,
        Err(err) => return (Outcome::NotStarted(format!("{program}: {err}")), Vec::new()),
    };
    let group = child
        .id()
        .and_then(|id| i32::try_from(id).ok())
        .map(Pid::from_raw);
    let mut stderr = child.stderr.take();
    let mut stdout = child.stdout.take();
    let finished = tokio::time::timeout(limit, async {
        // Bounded: a chatty command cannot grow gpud.
        let (mut errors, mut out) = (Vec::new(), Vec::new());
        let read_errors = async {
            if let Some(stderr) = stderr.as_mut() {
                let _ = stderr.take(64 * 1024).read_to_end(&mut errors).await;
            }
        };
        let read_out = async {
            if let Some(stdout) = stdout.as_mut() {
                let _ = stdout.take(256 * 1024).read_to_end(&mut out).await;
            }
        };
        tokio::join!(read_errors, read_out);
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
            if let Some(group) = group {
                let _ = killpg(group, Signal::SIGKILL);
            }
            (Outcome::TimedOut(limit), Vec::new())
        }
    }
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

    #[tokio::test]
    async fn a_hung_command_and_its_children_are_killed_at_the_limit() {
        let dir = tempfile::tempdir().unwrap();
        let pid_file = dir.path().join("pid");
        let script = format!("sleep 600 & echo $! > {}; wait", pid_file.display());
        let outcome = run(&sh(&script), &[], &[], Duration::from_millis(500)).await;
        assert_eq!(outcome, Outcome::TimedOut(Duration::from_millis(500)));
        let pid: i32 = std::fs::read_to_string(&pid_file)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        // The grandchild went with the group (a zombie until reaped by init at most).
        let alive = || {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .is_ok_and(|s| s.split_whitespace().nth(2).is_none_or(|state| state != "Z"))
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while alive() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(!alive(), "the reset command's child survived");
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
