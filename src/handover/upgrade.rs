//! `gpud upgrade`'s side: asking the running gpud to start the installed binary, and waiting
//! until that one has taken over.

use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use super::message::Message;
use super::peer::{self, Peer};
use super::wire;

/// How long the running gpud has to start the new binary.
const START_WAIT: Duration = Duration::from_secs(5);

/// A takeover `gpud upgrade` saw through.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Upgraded {
    pub old_pid: String,
    pub new_pid: u32,
    pub program: String,
    /// From asking until the old process was gone; `None` when its pid is not visible here.
    pub took: Option<Duration>,
}

/// Asks the gpud serving `socket` to start its installed binary, then waits up to `wait` for
/// the old process to be gone.
pub fn ask(socket: &Path, wait: Duration) -> Result<Upgraded, String> {
    let asked = Instant::now();
    let mut stream = UnixStream::connect(socket).map_err(|err| {
        format!(
            "no running gpud answers on {}: {err} (is it running, with this --state-dir?)",
            socket.display()
        )
    })?;
    let peer = Peer::of(&stream).map_err(|err| err.to_string())?;
    let _ = stream.set_read_timeout(Some(START_WAIT));
    wire::send(&mut stream, &Message::Upgrade, &[]).map_err(|err| err.to_string())?;
    let (pid, program) = match wire::receive(&mut stream) {
        Ok((Message::Started { pid, program }, _)) => (pid, program),
        Ok((Message::Refused { reason, .. }, _)) => {
            return Err(format!("the running gpud cannot upgrade: {reason}"));
        }
        Ok((other, _)) => return Err(format!("unexpected answer: {other:?}")),
        Err(err) => return Err(format!("no answer from the running gpud: {err}")),
    };
    let took = match peer.pid {
        Some(old) if peer::wait_gone(old, wait) => Some(asked.elapsed()),
        Some(old) => {
            return Err(format!(
                "gpud {pid} ({program}) was started, but the running gpud (pid {old}) is still \
                 there after {}s: see the logs of both",
                wait.as_secs()
            ));
        }
        None => None,
    };
    Ok(Upgraded {
        old_pid: peer.describe(),
        new_pid: pid,
        program,
        took,
    })
}
