//! Taking over: the new process's side.
//!
//! 1. Connect to the handover socket; nobody there is a cold start (the first gpud on a node).
//! 2. `hello` with the versions this gpud speaks; the old process answers with an `offer`
//!    (its listening sockets, by `SCM_RIGHTS`, and its state) or `refused`.
//! 3. The caller starts every subsystem on what it received, and once they serve,
//!    [`Predecessor::stop`] sends `stop` and waits for the old process to finish.
//!
//! Nothing here waits long: an old process that does not answer within [`ANSWER_WAIT`]
//! (hung: SIGKILL after [`HUNG_STOP_GRACE`]), answers garbage, or speaks no common version
//! (SIGTERM, SIGKILL after [`COLD_STOP_GRACE`]) is stopped and the new one starts cold, saying
//! why and, once it serves, how long the node went without a gpud.

use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use super::board::Board;
use super::message::{self, Message};
use super::peer::{self, Peer};
use super::wire::{self, WireError};
use crate::listeners;

/// How long the old process has to answer `hello`.
pub const ANSWER_WAIT: Duration = Duration::from_secs(3);
/// How long an old process that answered but could not hand over gets to stop before it is
/// killed: its own grace period and a margin.
pub const COLD_STOP_GRACE: Duration = Duration::from_secs(6);
/// How long one that did not answer at all (hung) gets: it will not handle a SIGTERM either.
pub const HUNG_STOP_GRACE: Duration = Duration::from_secs(1);
/// How long the old process gets to finish after `stop`: its own grace period and a margin.
pub const FINISH_WAIT: Duration = Duration::from_secs(10);

/// What the start found.
#[derive(Debug)]
pub enum Takeover {
    /// Start cold, because `why`. `stopped`: when an old process was stopped to make way (the
    /// node has had no gpud since).
    Cold {
        why: String,
        stopped: Option<Instant>,
    },
    /// An old process offered its sockets and state; they are in [`crate::listeners`] and
    /// the board.
    Took(Predecessor),
    /// Another gpud is taking over from the running one right now.
    Busy(String),
}

/// The process taken over from, until it is told to stop.
#[derive(Debug)]
pub struct Predecessor {
    /// Its pid as it reported it.
    pub pid: u32,
    peer: Peer,
    stream: UnixStream,
    /// The keys of the sockets received.
    pub sockets: Vec<String>,
    /// The pieces of state received.
    pub pieces: Vec<String>,
}

/// Looks for a running gpud on `socket` and takes its sockets and state onto `board`.
/// Blocks for at most [`ANSWER_WAIT`] plus, after a failed handover, [`COLD_STOP_GRACE`].
pub fn take_over(socket: &Path, board: &Board) -> Takeover {
    let mut stream = match UnixStream::connect(socket) {
        Ok(stream) => stream,
        Err(err)
            if matches!(
                err.kind(),
                std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused
            ) =>
        {
            return Takeover::Cold {
                why: format!("no gpud is running ({} answers nothing)", socket.display()),
                stopped: None,
            };
        }
        Err(err) => {
            return Takeover::Cold {
                why: format!("cannot reach {}: {err}", socket.display()),
                stopped: None,
            };
        }
    };
    let peer = match Peer::of(&stream) {
        Ok(peer) if peer.is_same_user() => peer,
        Ok(peer) => {
            return Takeover::Cold {
                why: format!(
                    "{} is served by uid {}, not this process's user; not taking over from it",
                    socket.display(),
                    peer.uid
                ),
                stopped: None,
            };
        }
        Err(err) => {
            return Takeover::Cold {
                why: format!("cannot tell who serves {}: {err}", socket.display()),
                stopped: None,
            };
        }
    };
    super::pause::here("connected");
    match exchange(&mut stream) {
        Ok((
            Message::Offer {
                version: _,
                pid,
                sockets,
                state,
                host,
            },
            fds,
        )) if fds.len() == sockets.len() => {
            let pieces = state.keys().cloned().collect();
            board.set_taken_from(host);
            listeners::inherit(sockets.iter().cloned().zip(fds).collect(), instance_name());
            board.inherit(state);
            super::pause::here("offer-received");
            Takeover::Took(Predecessor {
                pid,
                peer,
                stream,
                sockets,
                pieces,
            })
        }
        Ok((Message::Refused { reason, busy: true }, _)) => Takeover::Busy(format!(
            "the running gpud (pid {}) is handing over to another new gpud already: {reason}",
            peer.describe()
        )),
        Ok((
            Message::Refused {
                reason,
                busy: false,
            },
            _,
        )) => cold_after(&peer, format!("it refused: {reason}"), COLD_STOP_GRACE),
        Ok((other, fds)) => cold_after(
            &peer,
            format!(
                "it answered {} with {} descriptors, not an offer this gpud can use",
                serde_json::to_string(&other).unwrap_or_default(),
                fds.len()
            ),
            COLD_STOP_GRACE,
        ),
        Err(WireError::Closed) => Takeover::Cold {
            why: format!(
                "the running gpud (pid {}) went away during the handover",
                peer.describe()
            ),
            stopped: Some(Instant::now()),
        },
        Err(err @ WireError::TimedOut) => cold_after(&peer, err.to_string(), HUNG_STOP_GRACE),
        Err(err) => cold_after(&peer, err.to_string(), COLD_STOP_GRACE),
    }
}

fn exchange(stream: &mut UnixStream) -> Result<(Message, Vec<std::os::fd::OwnedFd>), WireError> {
    stream.set_read_timeout(Some(ANSWER_WAIT))?;
    stream.set_write_timeout(Some(ANSWER_WAIT))?;
    let hello = Message::Hello {
        versions: message::VERSIONS.to_vec(),
        pid: std::process::id(),
        netns: network_namespace(),
        host: host_name(),
    };
    wire::send(stream, &hello, &[])?;
    super::pause::here("hello-sent");
    wire::receive(stream)
}

/// A handover that failed with the old process still there: it is stopped, so that the
/// new one can bind what it held, and the new one starts cold.
fn cold_after(peer: &Peer, what: String, grace: Duration) -> Takeover {
    let why = format!(
        "the running gpud (pid {}) could not hand over ({what}); it is stopped and this one \
         starts cold",
        peer.describe()
    );
    let stopped = Instant::now();
    if let Some(pid) = peer.pid {
        peer::stop(pid, grace);
    }
    Takeover::Cold {
        why,
        stopped: Some(stopped),
    }
}

/// This host's name (a pod's name in Kubernetes).
pub fn host_name() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|name| name.trim().to_owned())
        .filter(|name| !name.is_empty())
}

/// A name for this instance that no other gpud on the node has had: in a container every
/// gpud is pid 1, so the pid alone would repeat from one upgrade to the next.
pub fn instance_name() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    format!(
        "{:08x}",
        (nanos ^ u64::from(std::process::id()).rotate_left(32)) as u32
    )
}

/// The inode of this process's network namespace.
pub fn network_namespace() -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self/ns/net").ok().map(|m| m.ino())
}

impl Predecessor {
    /// Tells the old process to stop (this one serves now) and waits, up to [`FINISH_WAIT`],
    /// until it has finished; returns how long that took, or why it is not known.
    pub fn stop(mut self) -> Result<Duration, String> {
        let asked = Instant::now();
        wire::send(&mut self.stream, &Message::Stop, &[])
            .map_err(|err| format!("cannot tell it to stop: {err}"))?;
        // It keeps the connection open until it has finished; its end is the answer.
        let _ = self.stream.set_read_timeout(Some(FINISH_WAIT));
        match wire::receive(&mut self.stream) {
            Err(WireError::Closed) | Err(WireError::Io(_)) => Ok(asked.elapsed()),
            Err(WireError::TimedOut) => Err(format!(
                "it has not finished {}s after being told to stop",
                FINISH_WAIT.as_secs()
            )),
            Err(err) => Err(err.to_string()),
            Ok(_) => Ok(asked.elapsed()),
        }
    }

    /// Its pid in this process's PID namespace, where visible.
    pub fn visible_pid(&self) -> Option<i32> {
        self.peer.pid
    }
}
