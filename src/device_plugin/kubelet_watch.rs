//! Noticing kubelet restarts: the kubelet recreates `kubelet.sock` (and wipes the plugin
//! sockets) when it starts, and every plugin must then serve and register again.
//!
//! A small thread blocks on inotify for the device-plugins directory and signals each
//! creation of the socket. When the directory cannot be watched (it does not exist yet, or
//! inotify is unavailable) the socket's identity is polled instead.

use std::ffi::OsString;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
use tokio::sync::mpsc;
use tracing::debug;

/// How often the socket is checked when inotify cannot be used.
const POLL: Duration = Duration::from_millis(250);

/// Resolves whenever the kubelet socket is (re)created.
#[derive(Debug)]
pub struct KubeletWatch {
    socket: PathBuf,
    created: Option<mpsc::Receiver<()>>,
    last_identity: Option<(u64, u64)>,
}

impl KubeletWatch {
    /// Watches the directory of `socket`.
    pub fn new(socket: &Path) -> KubeletWatch {
        let dir = socket.parent().unwrap_or(Path::new("/")).to_path_buf();
        let name: OsString = socket.file_name().map(OsString::from).unwrap_or_default();
        let watched = Inotify::init(InitFlags::IN_CLOEXEC).and_then(|ino| {
            ino.add_watch(&dir, AddWatchFlags::IN_CREATE | AddWatchFlags::IN_MOVED_TO)
                .map(|_| ino)
        });
        let created = match watched {
            Ok(inotify) => {
                let (tx, rx) = mpsc::channel(1);
                let spawned = crate::logging::spawn_thread("gpud-kubelet-watch", move || {
                    watch_thread(&inotify, &name, &tx)
                });
                spawned.ok().map(|_| rx)
            }
            Err(err) => {
                debug!(dir = %dir.display(), error = %crate::logging::error_chain(&err), "Cannot watch the kubelet directory; polling the socket");
                None
            }
        };
        KubeletWatch {
            socket: socket.to_path_buf(),
            created,
            last_identity: identity(socket),
        }
    }

    /// Waits until the kubelet socket is created again.
    pub async fn recreated(&mut self) {
        loop {
            if let Some(rx) = &mut self.created {
                if rx.recv().await.is_some() {
                    self.last_identity = identity(&self.socket);
                    return;
                }
                self.created = None; // the thread ended: fall back to polling
                continue;
            }
            tokio::time::sleep(POLL).await;
            let now = identity(&self.socket);
            let changed = now.is_some() && now != self.last_identity;
            self.last_identity = now;
            if changed {
                return;
            }
        }
    }
}

fn watch_thread(inotify: &Inotify, name: &OsString, tx: &mpsc::Sender<()>) {
    loop {
        let Ok(events) = inotify.read_events() else {
            return;
        };
        if events.iter().any(|e| e.name.as_ref() == Some(name)) {
            match tx.try_send(()) {
                Ok(()) | Err(mpsc::error::TrySendError::Full(())) => {}
                Err(mpsc::error::TrySendError::Closed(())) => return,
            }
        }
    }
}

/// (device, inode) of a path: a recreated socket has a new inode.
fn identity(path: &Path) -> Option<(u64, u64)> {
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}
