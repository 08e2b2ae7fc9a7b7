//! Watching folders with inotify, gpud's one file-watching module: [`Folders`] is the watch
//! itself (which names were created, removed or written, and whether the folder itself went),
//! and [`follow`] reads it from a thread for async code. It is used here to reload when a
//! config file changes, by the device plugin to notice kubelet restarts and plugin sockets
//! removed from under it, and by the DRA plugin to serve its removed sockets again.
//!
//! Reloading when a config file changes is for the places where nothing can send SIGHUP: a
//! Kubernetes ConfigMap mounted into a container whose image has no shell.
//!
//! The kubelet updates a mounted ConfigMap by writing a new timestamped folder and renaming a
//! `..data` symlink over the old one; the file itself (`config.yaml -> ..data/config.yaml`) is
//! never written. An editor on a bare-metal node writes a temporary file and renames it, or
//! truncates and writes in place. So a thread watches each file's *folder* with inotify,
//! treats any event there as "something may have changed", lets a burst of events settle for
//! [`SETTLE`], and then compares each file's bytes with what it held before: only a real
//! change of contents asks for a reload, and the reload is the same one SIGHUP triggers (a bad
//! file keeps the running configuration and says so).
//!
//! Where inotify cannot watch a folder (it does not exist yet, or the limit of watches is
//! reached) the files are read every [`POLL`] instead. A file mounted with `subPath` is a copy
//! the kubelet never updates; no watch can see a change there.

use std::collections::hash_map::DefaultHasher;
use std::ffi::OsString;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
use tokio::sync::mpsc;
use tracing::{debug, warn};

/// How long a burst of folder events is given to finish before the files are compared.
pub const SETTLE: Duration = Duration::from_millis(100);
/// How often the files are compared when their folders cannot be watched.
pub const POLL: Duration = Duration::from_secs(5);

/// What a file held when last looked at: a digest of its bytes, `None` when it could not be read.
type Seen = Option<u64>;

fn digest(path: &Path) -> Seen {
    let bytes = crate::files::read_bytes(path, crate::files::MAX_CONFIG_BYTES).ok()?;
    let mut hasher = DefaultHasher::new();
    bytes.hash(&mut hasher);
    Some(hasher.finish())
}

/// The files to compare and what each held last.
#[derive(Debug)]
struct Files {
    seen: Vec<(PathBuf, Seen)>,
}

impl Files {
    fn new(paths: &[PathBuf]) -> Files {
        Files {
            seen: paths.iter().map(|p| (p.clone(), digest(p))).collect(),
        }
    }

    /// The first file whose contents differ from last time (all are brought up to date).
    fn changed(&mut self) -> Option<PathBuf> {
        let mut first = None;
        for (path, seen) in &mut self.seen {
            let now = digest(path);
            if now != *seen {
                *seen = now;
                first.get_or_insert_with(|| path.clone());
            }
        }
        first
    }

    fn folders(&self) -> Vec<PathBuf> {
        let mut folders: Vec<PathBuf> = self
            .seen
            .iter()
            .map(|(p, _)| match p.parent() {
                Some(dir) if !dir.as_os_str().is_empty() => dir.to_path_buf(),
                _ => PathBuf::from("."),
            })
            .collect();
        folders.sort();
        folders.dedup();
        folders
    }
}

/// Starts watching `paths`; the receiver yields the path of a file whose contents changed.
/// With no paths it never yields.
pub fn watch(paths: &[PathBuf]) -> mpsc::Receiver<PathBuf> {
    // One slot: a change noticed while a reload is pending is covered by that reload.
    let (tx, rx) = mpsc::channel(1);
    if paths.is_empty() {
        return rx;
    }
    let files = Files::new(paths);
    // Watches are in place before this returns: no change after it can go unseen.
    let watch = Folders::open(&files.folders())
        .inspect_err(
            |err| debug!(error = %err, "Cannot watch the config folders; polling the config files"),
        )
        .ok();
    let spawned = crate::logging::spawn_thread("gpud-config-watch", move || run(files, watch, &tx));
    if let Err(err) = spawned {
        debug!(error = %crate::logging::error_chain(&err), "Cannot watch the config files; SIGHUP still reloads");
    }
    rx
}

fn run(mut files: Files, mut watch: Option<Folders>, tx: &mpsc::Sender<PathBuf>) {
    loop {
        match &watch {
            Some(folders) => {
                let lost = match folders.next() {
                    None => Some("the watch cannot be read"),
                    Some(changes) if changes.iter().any(|c| matches!(c, Change::FolderGone)) => {
                        Some("a config folder was removed or moved")
                    }
                    Some(_) => None,
                };
                if let Some(why) = lost {
                    // A reload on change must not stop unseen: the files are polled from now on.
                    warn!(
                        "Cannot watch the config folders any more ({why}); polling the config files every {}",
                        humantime::format_duration(POLL)
                    );
                    watch = None;
                    continue;
                }
                // Let the rest of a ConfigMap update (several renames) or an editor's save land
                // before comparing. Events that come meanwhile are read on the next turn and
                // find nothing new.
                std::thread::sleep(SETTLE);
            }
            None => std::thread::sleep(POLL),
        }
        if let Some(path) = files.changed() {
            match tx.try_send(path) {
                Ok(()) | Err(mpsc::error::TrySendError::Full(_)) => {}
                Err(mpsc::error::TrySendError::Closed(_)) => return,
            }
        }
    }
}

/// Follows `folders` from a thread named `thread`: the receiver yields every change, in order.
/// An error when one cannot be watched (the caller polls instead); the receiver closes when
/// the watch cannot be read any more, or after [`Change::FolderGone`] of a single folder.
pub fn follow(folders: &[PathBuf], thread: &str) -> Result<mpsc::Receiver<Change>, WatchError> {
    let watch = Folders::open(folders)?;
    let single = folders.len() == 1;
    let (tx, rx) = mpsc::channel(16);
    crate::logging::spawn_thread(thread, move || {
        while let Some(changes) = watch.next() {
            for change in changes {
                let over = single && change == Change::FolderGone;
                // The reader is async and prompt; blocking here keeps every change, in order.
                if tx.blocking_send(change).is_err() || over {
                    return;
                }
            }
        }
    })
    .map_err(WatchError::Thread)?;
    Ok(rx)
}

/// One change in a watched folder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// A name appeared (created, or renamed into the folder).
    Created(OsString),
    /// A name went (deleted, or renamed out of the folder).
    Removed(OsString),
    /// A file was written or its metadata changed.
    Written(OsString),
    /// The folder itself was removed or renamed: its watch is over, and nothing more comes
    /// from it.
    FolderGone,
}

/// Why a folder cannot be watched.
#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    #[error("inotify is unavailable: {0}")]
    Init(#[source] nix::Error),
    #[error("cannot watch {}: {source}", folder.display())]
    Folder {
        folder: PathBuf,
        #[source]
        source: nix::Error,
    },
    #[error("cannot start the watching thread: {0}")]
    Thread(#[source] std::io::Error),
}

/// An inotify watch on some folders, read by a thread of the user's (reads block).
#[derive(Debug)]
pub struct Folders {
    inotify: Inotify,
}

impl Folders {
    /// Watches every one of `folders`; the watches are in place when this returns, so no
    /// change after it goes unseen. An error when one cannot be watched (it does not exist, or
    /// the limit of watches is reached): the caller polls instead.
    pub fn open(folders: &[PathBuf]) -> Result<Folders, WatchError> {
        let inotify = Inotify::init(InitFlags::IN_CLOEXEC).map_err(WatchError::Init)?;
        let events = AddWatchFlags::IN_CLOSE_WRITE
            | AddWatchFlags::IN_CREATE
            | AddWatchFlags::IN_MOVED_TO
            | AddWatchFlags::IN_MOVED_FROM
            | AddWatchFlags::IN_DELETE
            | AddWatchFlags::IN_ATTRIB
            | AddWatchFlags::IN_DELETE_SELF
            | AddWatchFlags::IN_MOVE_SELF;
        for folder in folders {
            inotify
                .add_watch(folder, events)
                .map_err(|source| WatchError::Folder {
                    folder: folder.clone(),
                    source,
                })?;
        }
        Ok(Folders { inotify })
    }

    /// Blocks until something changes in a watched folder; `None` when the watch cannot be
    /// read any more.
    pub fn next(&self) -> Option<Vec<Change>> {
        let events = self.inotify.read_events().ok()?;
        Some(
            events
                .into_iter()
                .filter_map(|event| {
                    let mask = event.mask;
                    if mask.intersects(
                        AddWatchFlags::IN_DELETE_SELF
                            | AddWatchFlags::IN_MOVE_SELF
                            | AddWatchFlags::IN_IGNORED,
                    ) {
                        return Some(Change::FolderGone);
                    }
                    let name = event.name?;
                    Some(
                        if mask.intersects(AddWatchFlags::IN_CREATE | AddWatchFlags::IN_MOVED_TO) {
                            Change::Created(name)
                        } else if mask
                            .intersects(AddWatchFlags::IN_DELETE | AddWatchFlags::IN_MOVED_FROM)
                        {
                            Change::Removed(name)
                        } else {
                            Change::Written(name)
                        },
                    )
                })
                .collect(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A ConfigMap update as the kubelet makes it: a new folder, a new `..data` symlink renamed
    /// over the old one; the file the daemon names is a symlink through `..data`.
    #[tokio::test]
    async fn a_configmap_update_is_one_change_and_a_touch_is_none() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir(root.join("..v1")).unwrap();
        std::fs::write(root.join("..v1/config.yaml"), "version: v1\n").unwrap();
        std::os::unix::fs::symlink("..v1", root.join("..data")).unwrap();
        std::os::unix::fs::symlink("..data/config.yaml", root.join("config.yaml")).unwrap();
        let config = root.join("config.yaml");
        let mut changes = watch(std::slice::from_ref(&config));

        // The same bytes written again: no reload.
        std::fs::write(root.join("..v1/config.yaml"), "version: v1\n").unwrap();
        // The update.
        std::fs::create_dir(root.join("..v2")).unwrap();
        std::fs::write(
            root.join("..v2/config.yaml"),
            "version: v1\nflags:\n  migStrategy: single\n",
        )
        .unwrap();
        std::os::unix::fs::symlink("..v2", root.join("..data_tmp")).unwrap();
        std::fs::rename(root.join("..data_tmp"), root.join("..data")).unwrap();

        let changed = tokio::time::timeout(Duration::from_secs(10), changes.recv())
            .await
            .expect("a change within 10 s")
            .unwrap();
        assert_eq!(changed, config);
        // Nothing else changed: no second notice.
        std::fs::write(root.join("unrelated"), "x").unwrap();
        assert!(
            tokio::time::timeout(SETTLE * 5, changes.recv())
                .await
                .is_err()
        );
    }

    #[test]
    fn a_folder_watch_names_what_came_and_went_and_sees_the_folder_go() {
        let dir = tempfile::tempdir().unwrap();
        let folder = dir.path().join("device-plugins");
        std::fs::create_dir(&folder).unwrap();
        let watch = Folders::open(std::slice::from_ref(&folder)).unwrap();
        std::fs::write(folder.join("a.sock"), "").unwrap();
        std::fs::remove_file(folder.join("a.sock")).unwrap();
        std::fs::remove_dir(&folder).unwrap();
        let mut seen = Vec::new();
        while !seen.contains(&Change::FolderGone) {
            seen.extend(watch.next().unwrap());
        }
        let name = OsString::from("a.sock");
        assert_eq!(seen.first(), Some(&Change::Created(name.clone())));
        assert!(seen.contains(&Change::Removed(name)), "{seen:?}");
        assert!(Folders::open(&[folder]).is_err());
    }
}
