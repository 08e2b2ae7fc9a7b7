//! Handing over: the running process's side of the handover socket.
//!
//! The socket (`<state-dir>/handover/<applet>.sock`, mode 0600 in a 0700 folder) takes one
//! takeover at a time, from a process of the same user (`SO_PEERCRED`); anything else is
//! refused and logged, and the running process goes on serving. After an `offer` the old
//! process keeps serving (both accept on the same sockets now) until the new one says `stop`.
//! A new process that goes away before that (killed at any step: the connection closes with
//! it) leaves the old one serving again in full: [`Board::mark_abandoned`] has every part that
//! publishes something register or write it again, since the newcomer may have replaced it.

use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::net::UnixListener;
use tokio::sync::mpsc;
use tracing::{info, warn};

use super::board::Board;
use super::message::{self, Message};
use super::peer::Peer;
use super::take::network_namespace;
use super::wire::{self, WireError};
use crate::listeners;

/// How long a connection has to say what it wants.
pub const HELLO_WAIT: Duration = Duration::from_secs(2);
/// How long the new process has, after the offer, to serve and say `stop`: it starts every
/// subsystem and waits for them to be ready (at most 30 s) first.
pub const STOP_WAIT: Duration = Duration::from_secs(60);

/// What the handover asks of the daemon.
#[derive(Debug)]
pub enum Request {
    /// A new process serves now: stop, leaving behind what it took. `connection` stays open
    /// until this process has finished (its end tells the new one so).
    Stop { to: String, connection: UnixStream },
}

/// Starts the binary the running one was started from, with the same arguments, to take
/// over (`gpud upgrade`, SIGUSR2); returns its pid and program, or why it could not.
pub type Upgrade = Arc<dyn Fn() -> Result<(u32, String), String> + Send + Sync>;

/// Binds the handover socket at `path`, mode 0600 in a 0700 folder made where missing,
/// replacing the socket a process handed over (or a killed one) left there.
pub fn bind(path: &Path) -> Result<UnixListener, String> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    let fail =
        |what: &str, err: std::io::Error| format!("{}: cannot {what}: {err}", path.display());
    if let Some(folder) = path.parent() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(folder)
            .map_err(|err| fail("create its folder", err))?;
        // A folder that is a link (made since the start's check) is not followed.
        match std::fs::symlink_metadata(folder) {
            Ok(meta) if meta.is_dir() => {}
            _ => {
                return Err(format!(
                    "{}: its folder {} is not a directory of its own (a symlink?); not \
                     following it",
                    path.display(),
                    folder.display()
                ));
            }
        }
    }
    match std::fs::remove_file(path) {
        Err(err) if err.kind() != std::io::ErrorKind::NotFound => {
            return Err(fail("remove the socket left there", err));
        }
        _ => {}
    }
    let listener = std::os::unix::net::UnixListener::bind(path).map_err(|err| fail("bind", err))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .map_err(|err| fail("set its mode", err))?;
    listeners::bound(path);
    listener
        .set_nonblocking(true)
        .and_then(|()| UnixListener::from_std(listener))
        .map_err(|err| fail("serve it", err))
}

/// Answers connections on `listener` until the process ends.
pub async fn serve(
    listener: UnixListener,
    path: PathBuf,
    board: Board,
    requests: mpsc::UnboundedSender<Request>,
    upgrade: Upgrade,
) {
    let busy = Arc::new(AtomicBool::new(false));
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(err) => {
                warn!(socket = %path.display(), error = %err, "Cannot accept on the handover socket");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(stream) = stream
            .into_std()
            .and_then(|s| s.set_nonblocking(false).map(|()| s))
        else {
            continue;
        };
        let (board, requests, upgrade, busy) = (
            board.clone(),
            requests.clone(),
            Arc::clone(&upgrade),
            Arc::clone(&busy),
        );
        tokio::task::spawn_blocking(move || answer(stream, &board, &requests, &upgrade, &busy));
    }
}

/// One connection, from its first message to its end.
fn answer(
    mut stream: UnixStream,
    board: &Board,
    requests: &mpsc::UnboundedSender<Request>,
    upgrade: &Upgrade,
    busy: &AtomicBool,
) {
    let peer = match Peer::of(&stream) {
        Ok(peer) => peer,
        Err(err) => {
            warn!(error = %err, "Refused a connection on the handover socket: cannot tell who it is");
            return;
        }
    };
    if !peer.is_same_user() {
        warn!(pid = %peer.describe(), uid = peer.uid, "Refused a connection on the handover socket: only this process's user may take over");
        return;
    }
    let _ = stream.set_read_timeout(Some(HELLO_WAIT));
    let _ = stream.set_write_timeout(Some(HELLO_WAIT));
    let first = match wire::receive(&mut stream) {
        Ok((message, _)) => message,
        Err(WireError::Closed) => {
            // A process of this user connected and went away without a word: a new gpud
            // killed as it began its takeover. It was given nothing, but publishing again
            // costs little and proves the kubelet is served by this process.
            warn!(pid = %peer.describe(), "A new gpud went away before its takeover began; serving again in full");
            board.mark_abandoned();
            return;
        }
        Err(err) => {
            warn!(pid = %peer.describe(), error = %err, "Refused a connection on the handover socket");
            return;
        }
    };
    match first {
        Message::Upgrade => {
            let answer = match upgrade() {
                Ok((pid, program)) => {
                    info!(
                        pid,
                        program, "Started the installed gpud to take over from this one"
                    );
                    Message::Started { pid, program }
                }
                Err(reason) => {
                    warn!(error = %reason, "Cannot start the installed gpud");
                    Message::Refused {
                        reason,
                        busy: false,
                    }
                }
            };
            let _ = wire::send(&mut stream, &answer, &[]);
        }
        Message::Hello {
            versions,
            pid,
            netns,
            host,
        } => {
            // A pod's container restarted after its process handed over to this one (the
            // kubelet restarts a container that ends) must not take over back.
            let own = super::take::host_name();
            if host.is_some() && host != own && host == board.taken_from() {
                let refused = Message::Refused {
                    reason: format!(
                        "this gpud took over from {} already; a restarted container of it does not take over back",
                        host.unwrap_or_default()
                    ),
                    busy: true,
                };
                let _ = wire::send(&mut stream, &refused, &[]);
                return;
            }
            if busy.swap(true, Ordering::SeqCst) {
                let refused = Message::Refused {
                    reason: "a takeover by another process is under way".into(),
                    busy: true,
                };
                let _ = wire::send(&mut stream, &refused, &[]);
                warn!(pid, "Refused a second takeover while one is under way");
                return;
            }
            offer(stream, board, requests, &versions, pid, netns);
            busy.store(false, Ordering::SeqCst);
        }
        other => {
            warn!(pid = %peer.describe(), message = ?other, "Refused a connection on the handover socket: it did not start with hello or upgrade");
        }
    }
}

/// Offers the sockets and state to the new process `pid` and waits for its `stop`.
fn offer(
    mut stream: UnixStream,
    board: &Board,
    requests: &mpsc::UnboundedSender<Request>,
    versions: &[u32],
    pid: u32,
    netns: Option<u64>,
) {
    let Some(version) = message::agree(versions) else {
        let reason = format!(
            "this gpud speaks handover versions {:?}, the new one {versions:?}",
            message::VERSIONS
        );
        warn!(pid, "Refused a takeover: {reason}");
        let _ = wire::send(
            &mut stream,
            &Message::Refused {
                reason,
                busy: false,
            },
            &[],
        );
        return;
    };
    // A TCP socket is this network namespace's: a process in another (a pod of its own) listens
    // on its own address instead.
    let same_network = netns.is_some() && netns == network_namespace();
    let sockets = listeners::served(|key| same_network || !key.starts_with("tcp:"));
    let (keys, fds): (Vec<String>, Vec<_>) = sockets.into_iter().unzip();
    let state = board.collect();
    info!(pid, version, sockets = %keys.join(","), state = %state.keys().cloned().collect::<Vec<_>>().join(","), "Offering a takeover");
    let offer = Message::Offer {
        version,
        pid: std::process::id(),
        sockets: keys.clone(),
        state,
        host: super::take::host_name(),
    };
    if let Err(err) = wire::send(&mut stream, &offer, &fds) {
        warn!(pid, error = %err, "Cannot offer the takeover; serving again in full");
        board.mark_abandoned();
        return;
    }
    drop(fds);
    let _ = stream.set_read_timeout(Some(STOP_WAIT));
    // Whatever ends the exchange here but `stop` leaves this process serving: the new one
    // held its sockets and may have registered with the kubelet (which then switched to a
    // socket nobody serves), rewritten the labels, or replaced a socket file. Its end closes
    // the connection at once, even when it is killed, so the wait ends with it.
    match wire::receive(&mut stream) {
        Ok((Message::Stop, _)) => {
            listeners::handed_on(&keys);
            board.mark_handed_over();
            let _ = requests.send(Request::Stop {
                to: pid.to_string(),
                connection: stream,
            });
            return;
        }
        Ok((other, _)) => {
            warn!(pid, message = ?other, "The new gpud did not say stop; serving again in full")
        }
        Err(WireError::TimedOut) => warn!(
            pid,
            wait = ?STOP_WAIT,
            "The new gpud did not take over in time; serving again in full"
        ),
        Err(err) => warn!(
            pid,
            error = %err,
            "The takeover was abandoned; serving again in full (registering anew with the \
             kubelet, publishing again)"
        ),
    }
    board.mark_abandoned();
}
