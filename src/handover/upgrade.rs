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

/// How long a new gpud that did not take over in time has to stop on SIGTERM before SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(5);

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
        Some(old) => {
            see_through(old, pid, &program, wait)?;
            Some(asked.elapsed())
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

/// Waits up to `wait` for the takeover of `old` by `new` (both pids visible here): done when
/// the old process is gone. A new process gone first failed (it exited before or during its
/// takeover, and the old one serves on). One still taking over at `wait` is stopped, so that
/// the old process serves alone again, as before the upgrade; a newcomer that connected
/// and is stopped mid-takeover leaves the old process serving in full, as a killed one does.
fn see_through(old: i32, new: u32, program: &str, wait: Duration) -> Result<(), String> {
    let deadline = Instant::now() + wait;
    let new_pid = i32::try_from(new).ok();
    loop {
        if !peer::alive(old) {
            return Ok(());
        }
        if let Some(new_pid) = new_pid
            && !peer::alive(new_pid)
        {
            // The old process may have handed over and be on its way out: gone since?
            if !peer::alive(old) {
                return Ok(());
            }
            return Err(format!(
                "the new gpud {new} ({program}) exited before it took over; the running gpud \
                 (pid {old}) keeps serving: its log says how the new one exited (fix the \
                 installed binary, then run gpud upgrade again)"
            ));
        }
        if Instant::now() >= deadline {
            if let Some(new_pid) = new_pid {
                peer::stop(new_pid, STOP_GRACE);
            }
            return Err(format!(
                "the new gpud {new} ({program}) did not take over from the running gpud (pid \
                 {old}) within {}s, so it was stopped; the running gpud keeps serving: see the \
                 logs of both, or give more time with --timeout",
                wait.as_secs()
            ));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}
