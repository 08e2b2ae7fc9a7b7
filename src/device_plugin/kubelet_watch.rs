//! Noticing what happens to the device-plugin folder under a running plugin: the kubelet
//! recreates `kubelet.sock` (and wipes the plugin sockets) when it starts, and every plugin must
//! then serve and register again; a plugin socket removed by anyone else leaves the kubelet
//! nothing to dial until it is served again; and the folder itself may go and come back.
//!
//! The daemon's folder watch ([`crate::daemon::file_watch::follow`]) reports every change
//! there; this picks what matters. When the folder cannot be watched (it does not exist, or inotify
//! is unavailable) it is polled instead: the kubelet socket's identity, and a look at the
//! plugin sockets on every tick.

use std::ffi::OsString;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::sync::mpsc;
use tracing::debug;

use crate::daemon::file_watch::{self, Change};

/// How often the folder is looked at when inotify cannot be used.
const POLL: Duration = Duration::from_millis(250);

/// What happened to the device-plugin folder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DirEvent {
    /// The kubelet socket was (re)created: the kubelet started.
    KubeletStarted,
    /// A socket in the folder was removed (or, when polling, may have been): look whether a
    /// plugin's is gone.
    SocketRemoved,
    /// The folder itself was removed.
    FolderGone,
    /// The folder is back after [`DirEvent::FolderGone`].
    FolderBack,
}

/// Follows the device-plugin folder.
#[derive(Debug)]
pub struct KubeletWatch {
    dir: PathBuf,
    kubelet: Option<PathBuf>,
    events: Option<mpsc::Receiver<Change>>,
    /// The kubelet socket's name in the folder.
    kubelet_name: Option<OsString>,
    last_identity: Option<(u64, u64)>,
    gone: bool,
}

impl KubeletWatch {
    /// Watches `dir`, where the plugin sockets are, and `kubelet` (the kubelet's socket in
    /// it; `None` when serving without registering).
    pub fn new(dir: &Path, kubelet: Option<&Path>) -> KubeletWatch {
        let mut watch = KubeletWatch {
            dir: dir.to_path_buf(),
            kubelet: kubelet.map(Path::to_path_buf),
            events: None,
            kubelet_name: kubelet.and_then(Path::file_name).map(OsString::from),
            last_identity: kubelet.and_then(identity),
            gone: false,
        };
        watch.events = watch.start();
        watch
    }

    fn start(&self) -> Option<mpsc::Receiver<Change>> {
        file_watch::follow(std::slice::from_ref(&self.dir), "gpud-plugin-dir-watch")
            .inspect_err(|err| debug!(error = %crate::logging::error_chain(err), "Cannot watch the device-plugin folder; polling it"))
            .ok()
    }

    /// What `change` means here, if anything.
    fn meaning(&self, change: Change) -> Option<DirEvent> {
        match change {
            Change::Created(name) if Some(&name) == self.kubelet_name.as_ref() => {
                Some(DirEvent::KubeletStarted)
            }
            Change::Removed(name) if Path::new(&name).extension() == Some("sock".as_ref()) => {
                Some(DirEvent::SocketRemoved)
            }
            Change::FolderGone => Some(DirEvent::FolderGone),
            _ => None,
        }
    }

    /// Waits for the next thing that happens to the folder.
    pub async fn next(&mut self) -> DirEvent {
        loop {
            if let Some(rx) = &mut self.events {
                let received = rx.recv().await;
                match received.map(|change| self.meaning(change)) {
                    Some(None) => continue,
                    Some(Some(DirEvent::FolderGone)) => {
                        // The watch went with the folder: poll until it is back.
                        self.events = None;
                        self.gone = true;
                        return DirEvent::FolderGone;
                    }
                    Some(Some(event)) => {
                        if event == DirEvent::KubeletStarted {
                            self.last_identity = self.kubelet.as_deref().and_then(identity);
                        }
                        return event;
                    }
                    None => {
                        self.events = None; // the thread ended: fall back to polling
                        continue;
                    }
                }
            }
            tokio::time::sleep(POLL).await;
            let present = self.dir.is_dir();
            if self.gone {
                if present {
                    self.gone = false;
                    self.events = self.start();
                    self.last_identity = self.kubelet.as_deref().and_then(identity);
                    return DirEvent::FolderBack;
                }
                continue;
            }
            if !present {
                self.gone = true;
                return DirEvent::FolderGone;
            }
            let now = self.kubelet.as_deref().and_then(identity);
            let restarted = now.is_some() && now != self.last_identity;
            self.last_identity = now;
            return if restarted {
                DirEvent::KubeletStarted
            } else {
                DirEvent::SocketRemoved
            };
        }
    }
}

/// (device, inode) of a path: a recreated socket has a new inode.
fn identity(path: &Path) -> Option<(u64, u64)> {
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}
