//! The listening sockets of this process, as one gpud hands them to the next.
//!
//! A gpud that takes over from a running one ([`crate::handover`]) receives the old process's
//! listening sockets and serves on them instead of binding anew: a connection that arrives
//! during the takeover waits in the kernel's queue of the one socket both processes accept
//! on, and is never refused. So the places that listen ask here first ([`take`]) and tell
//! what they serve ([`serve`]), under a key that names the socket the same way in both
//! processes (`tcp:<address as configured>`, `unix:<path>`).
//!
//! Sockets are the process's, not a subsystem's, so the record is process-wide, as systemd's
//! `LISTEN_FDS` is. It also says whether this process took over ([`instance`]): sockets the
//! kubelet must tell apart from the old process's (a device plugin's, a DRA registration
//! socket) then get a name of their own. And a file this process bound is removed on the way
//! out only while it still is the one bound here and was not handed on ([`remove_if_owned`]).
//!
//! This module is a leaf: it imports nothing from gpud, so the code that binds (`http`,
//! `grpc`) can use it without deepening the module graph.

use std::collections::BTreeMap;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::{Mutex, MutexGuard, OnceLock, PoisonError};

#[derive(Debug, Default)]
struct Record {
    /// Received from the process taken over from, not yet taken by the code that serves them.
    inherited: BTreeMap<String, OwnedFd>,
    /// A duplicate of every socket served, to hand on.
    served: BTreeMap<String, OwnedFd>,
    /// The socket files bound here: path → (device, inode) at bind time.
    bound: BTreeMap<String, (u64, u64)>,
    /// Keys handed on to the next process: their files are its files now.
    handed_on: Vec<String>,
}

static RECORD: Mutex<Option<Record>> = Mutex::new(None);
static INSTANCE: OnceLock<String> = OnceLock::new();

fn record() -> MutexGuard<'static, Option<Record>> {
    // A panic elsewhere while holding the lock leaves a map of sockets that is still valid.
    RECORD.lock().unwrap_or_else(PoisonError::into_inner)
}

fn with<T>(work: impl FnOnce(&mut Record) -> T) -> T {
    let mut guard = record();
    work(guard.get_or_insert_with(Record::default))
}

/// The key of a TCP socket listening on `address` as configured (`:9400`).
pub fn tcp_key(address: &str) -> String {
    format!("tcp:{address}")
}

/// The key of a unix socket at `path`.
pub fn unix_key(path: &Path) -> String {
    format!("unix:{}", path.display())
}

/// Keeps the sockets received from the process taken over from, and names this process's
/// instance (`suffix`, e.g. its pid), which sockets that must not share a name with the old
/// process's carry from now on.
pub fn inherit(sockets: Vec<(String, OwnedFd)>, suffix: String) {
    with(|record| record.inherited.extend(sockets));
    let _ = INSTANCE.set(suffix);
}

/// The inherited socket under `key`, if any (taken once).
pub fn take(key: &str) -> Option<OwnedFd> {
    with(|record| record.inherited.remove(key))
}

/// Closes the inherited sockets nothing here took (a listener the new configuration no longer
/// has): kept open, they would queue connections nobody answers instead of refusing them.
/// Returns their keys.
pub fn close_untaken() -> Vec<String> {
    with(|record| std::mem::take(&mut record.inherited).into_keys().collect())
}

/// Forgets every socket: a process that handed over holds none of them open while it waits
/// to be stopped.
pub fn forget_all() {
    *record() = None;
}

/// This process's instance name when it took over from another gpud; `None` after a cold
/// start, when sockets keep their usual names.
pub fn instance() -> Option<&'static str> {
    INSTANCE.get().map(String::as_str)
}

/// `file` (`nvidia-gpu.sock`) as this instance names it: `nvidia-gpu-<instance>.sock` after
/// a takeover, unchanged after a cold start.
pub fn instance_file_name(file: &str) -> String {
    match (instance(), file.rsplit_once('.')) {
        (Some(instance), Some((stem, extension))) => format!("{stem}-{instance}.{extension}"),
        (Some(instance), None) => format!("{file}-{instance}"),
        (None, _) => file.to_owned(),
    }
}

/// Records that `socket` serves under `key` (replacing what served under it before), so that
/// it is handed on to the next process.
pub fn serve(key: &str, socket: BorrowedFd<'_>) {
    let duplicate = socket.try_clone_to_owned().ok();
    with(|record| match duplicate {
        Some(fd) => record.served.insert(key.to_owned(), fd),
        None => record.served.remove(key),
    });
}

/// Records the socket file at `path` as bound by this process, for [`remove_if_owned`].
pub fn bound(path: &Path) {
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        with(|record| {
            record
                .bound
                .insert(path.display().to_string(), (meta.dev(), meta.ino()))
        });
    }
}

/// Duplicates of the sockets served now, by key, for the next process; `keep` chooses which.
pub fn served(keep: impl Fn(&str) -> bool) -> Vec<(String, OwnedFd)> {
    with(|record| {
        record
            .served
            .iter()
            .filter(|(key, _)| keep(key))
            .filter_map(|(key, fd)| Some((key.clone(), fd.as_fd().try_clone_to_owned().ok()?)))
            .collect()
    })
}

/// Marks `keys` as handed on: the next process serves them now.
pub fn handed_on(keys: &[String]) {
    with(|record| record.handed_on.extend(keys.iter().cloned()));
}

/// Removes the socket file at `path` if this process bound it, it is still that file (not
/// one another process bound there since), and it was not handed on. Returns whether it
/// removed it.
pub fn remove_if_owned(path: &Path) -> bool {
    let key = path.display().to_string();
    let (bound, handed_on) = with(|record| {
        (
            record.bound.get(&key).copied(),
            record.handed_on.contains(&unix_key(path)),
        )
    });
    let now = std::fs::symlink_metadata(path)
        .ok()
        .map(|m| (m.dev(), m.ino()));
    if handed_on || bound.is_none() || now != bound {
        return false;
    }
    std::fs::remove_file(path).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_bound_again_by_someone_else_or_handed_on_is_left_in_place() {
        let dir = tempfile::tempdir().unwrap();
        let mine = dir.path().join("mine.sock");
        let _listener = std::os::unix::net::UnixListener::bind(&mine).unwrap();
        bound(&mine);
        // Another process replaced it: a new inode at the same path.
        std::fs::remove_file(&mine).unwrap();
        let theirs = std::os::unix::net::UnixListener::bind(&mine).unwrap();
        assert!(!remove_if_owned(&mine));
        assert!(mine.exists());
        drop(theirs);

        let kept = dir.path().join("kept.sock");
        let listener = std::os::unix::net::UnixListener::bind(&kept).unwrap();
        serve(&unix_key(&kept), listener.as_fd());
        bound(&kept);
        handed_on(&[unix_key(&kept)]);
        assert!(!remove_if_owned(&kept));
        assert!(kept.exists());

        let own = dir.path().join("own.sock");
        let _listener = std::os::unix::net::UnixListener::bind(&own).unwrap();
        bound(&own);
        assert!(remove_if_owned(&own));
        assert!(!own.exists());
        // Never bound here: not ours to remove.
        assert!(!remove_if_owned(&dir.path().join("other.sock")));
    }

    #[test]
    fn served_sockets_are_handed_on_as_duplicates_and_replaced_by_key() {
        let first = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let second = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        serve("tcp:test-replace", first.as_fd());
        serve("tcp:test-replace", second.as_fd());
        let handed = served(|key| key == "tcp:test-replace");
        assert_eq!(handed.len(), 1);
        let duplicate = std::net::TcpListener::from(handed.into_iter().next().unwrap().1);
        assert_eq!(
            duplicate.local_addr().unwrap(),
            second.local_addr().unwrap()
        );
    }
}
