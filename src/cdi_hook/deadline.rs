//! Runs a child of the hook with a deadline: its output is drained as it comes (a child that
//! writes more than a pipe holds never blocks on it) and only its last bytes are kept for the
//! error message; when the deadline passes its whole process group is killed, so a container's
//! start waits for the hook at most that long.

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

/// How much of the child's stderr is kept.
const TAIL_BYTES: usize = 4096;

/// How long the output is waited for once the child has ended (a descendant that left the
/// group could hold the pipe open).
const OUTPUT_GRACE: Duration = Duration::from_secs(1);

/// How a child ended.
#[derive(Debug)]
pub enum Ended {
    /// It exited (or was killed by someone else) before the deadline.
    Exited(ExitStatus),
    /// The deadline passed; its process group was killed.
    TimedOut,
}

/// What the child did, with the last line of its stderr.
#[derive(Debug)]
pub struct Outcome {
    /// How it ended.
    pub ended: Ended,
    /// Its last non-empty line on stderr, or `no output`.
    pub last_line: String,
}

/// Runs `command` in a process group of its own, stdin from /dev/null, stdout discarded as it
/// comes and the tail of stderr kept; kills the group when `deadline` passes.
pub fn run(mut command: Command, deadline: Duration) -> std::io::Result<Outcome> {
    let mut child = command
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let group = Pid::from_raw(i32::try_from(child.id()).unwrap_or(i32::MAX));
    let stdout = child.stdout.take().map(drain);
    let stderr = child.stderr.take().map(drain);
    let (sender, waited) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = sender.send(child.wait());
    });
    let ended = match waited.recv_timeout(deadline) {
        Ok(status) => Ended::Exited(status?),
        Err(_) => {
            // ESRCH: the group ended between the deadline and the kill.
            let _ = killpg(group, Signal::SIGKILL);
            let _ = waited.recv();
            Ended::TimedOut
        }
    };
    drop(stdout);
    let tail = stderr
        .and_then(|tail| tail.recv_timeout(OUTPUT_GRACE).ok())
        .unwrap_or_default();
    Ok(Outcome {
        ended,
        last_line: last_line(&tail),
    })
}

/// Reads `pipe` to its end on a thread of its own, keeping the last [`TAIL_BYTES`].
fn drain(mut pipe: impl Read + Send + 'static) -> mpsc::Receiver<Vec<u8>> {
    let (sender, tail) = mpsc::channel();
    std::thread::spawn(move || {
        let mut kept = Vec::with_capacity(TAIL_BYTES * 2);
        let mut chunk = [0u8; 8192];
        loop {
            match pipe.read(&mut chunk) {
                Ok(0) => break,
                Ok(n) => {
                    kept.extend_from_slice(&chunk[..n]);
                    if kept.len() > TAIL_BYTES {
                        kept.drain(..kept.len() - TAIL_BYTES);
                    }
                }
                Err(err) if err.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
        let _ = sender.send(kept);
    });
    tail
}

/// The last non-empty line of `bytes`.
fn last_line(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes)
        .lines()
        .rev()
        .find(|line| !line.trim().is_empty())
        .unwrap_or("no output")
        .trim()
        .to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(script: &str) -> Command {
        let mut command = Command::new("/bin/sh");
        command.args(["-c", script]);
        command
    }

    #[test]
    fn a_child_that_writes_a_lot_finishes_and_its_last_line_is_kept() {
        let outcome = run(
            sh("head -c 1048576 /dev/zero | tr '\\0' x >&2; echo >&2; echo 'last words' >&2; exit 3"),
            Duration::from_secs(30),
        )
        .unwrap();
        let Ended::Exited(status) = outcome.ended else {
            panic!("{outcome:?}");
        };
        assert_eq!(status.code(), Some(3));
        assert_eq!(outcome.last_line, "last words");
    }

    #[test]
    fn the_deadline_kills_the_whole_group() {
        let dir = tempfile::tempdir().unwrap();
        let pid_file = dir.path().join("grandchild");
        let script = format!("sleep 60 & echo $! > '{}'; wait", pid_file.display());
        let outcome = run(sh(&script), Duration::from_millis(500)).unwrap();
        assert!(matches!(outcome.ended, Ended::TimedOut), "{outcome:?}");
        assert_eq!(outcome.last_line, "no output");
        let pid: i32 = std::fs::read_to_string(&pid_file)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        // The grandchild was killed with the group: it is gone (or a zombie) once the signal
        // is delivered, well before its minute of sleep.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let state = stat
                .rsplit(')')
                .next()
                .unwrap_or("")
                .trim_start()
                .chars()
                .next();
            if matches!(state, None | Some('Z') | Some('X')) {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{pid} still runs: {stat}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}
