//! Who is on the other end of the handover socket (`SO_PEERCRED`), and stopping a process that
//! could not hand over.

use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::sys::socket::{getsockopt, sockopt::PeerCredentials};
use nix::unistd::Pid;

/// The other end's process as the kernel vouches for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Peer {
    /// Its pid in this process's PID namespace; `None` where it is not visible here (a pod of
    /// its own without the host's PID namespace).
    pub pid: Option<i32>,
    pub uid: u32,
}

impl Peer {
    /// The peer of `stream`.
    pub fn of(stream: &UnixStream) -> std::io::Result<Peer> {
        let credentials = getsockopt(stream, PeerCredentials).map_err(std::io::Error::from)?;
        Ok(Peer {
            pid: Some(credentials.pid()).filter(|pid| *pid > 0),
            uid: credentials.uid(),
        })
    }

    /// Whether it runs as this process's effective user: only the same user may take over.
    pub fn is_same_user(&self) -> bool {
        self.uid == nix::unistd::geteuid().as_raw()
    }

    /// Its pid for messages ("?" when not visible).
    pub fn describe(&self) -> String {
        self.pid
            .map_or_else(|| "?".to_owned(), |pid| pid.to_string())
    }
}

/// Whether process `pid` still runs (a zombie waiting for its parent does not). Every thread
/// counts: the main thread of a killed process can be a zombie while others are still
/// exiting, and the process's sockets close only when the last one has.
pub fn alive(pid: i32) -> bool {
    if kill(Pid::from_raw(pid), None).is_err() {
        return false;
    }
    let running = |stat: &str| {
        // The state follows the command name, which is in parentheses and may hold spaces.
        let state = stat
            .rsplit_once(") ")
            .and_then(|(_, rest)| rest.chars().next());
        state.is_some_and(|s| s != 'Z' && s != 'X')
    };
    match std::fs::read_dir(format!("/proc/{pid}/task")) {
        Ok(tasks) => tasks.flatten().any(|task| {
            std::fs::read_to_string(task.path().join("stat")).is_ok_and(|stat| running(&stat))
        }),
        // No /proc to read (hidepid): the signal reached it, so it is there.
        Err(_) => {
            std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |stat| running(&stat))
        }
    }
}

/// How long a SIGKILLed process may take to be gone: its exit closes its sockets, which the
/// caller binds next, and on a loaded machine that exit can take more than a moment.
const KILL_WAIT: Duration = Duration::from_secs(5);

/// Stops process `pid`: SIGTERM, then SIGKILL if it is still there after `grace`. Returns
/// once it is gone (or [`KILL_WAIT`] after the SIGKILL: one stuck in the driver never goes).
pub fn stop(pid: i32, grace: Duration) {
    let pid_t = Pid::from_raw(pid);
    if kill(pid_t, Signal::SIGTERM).is_err() {
        return;
    }
    if wait_gone(pid, grace) {
        return;
    }
    let _ = kill(pid_t, Signal::SIGKILL);
    wait_gone(pid, KILL_WAIT);
}

/// Waits up to `limit` for `pid` to be gone; whether it is.
pub fn wait_gone(pid: i32, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    while alive(pid) {
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_peer_of_a_socket_pair_is_this_process() {
        let (a, _b) = UnixStream::pair().unwrap();
        let peer = Peer::of(&a).unwrap();
        assert_eq!(peer.pid, Some(std::process::id() as i32));
        assert!(peer.is_same_user());
    }
}
