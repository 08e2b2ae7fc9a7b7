//! Health verdicts that only an event proves, kept in gpud's state directory so that a restart
//! (a crash, an OOM kill, an upgrade) does not put a GPU that still needs a reset back into
//! service: NVML keeps no trace of an XID, and the kernel log is read from its end.
//!
//! One file per applet (`<state-dir>/health/<applet>.json`: the containers of the per-applet
//! DaemonSet each run a watcher), keyed by GPU UUID (indices can change across a restart) and
//! stamped with the boot ID: after a reboot every GPU was reset, and the file is ignored. A GPU
//! is kept until the tracker sees it reset, then dropped from the file. The file is written
//! (atomically) only when what it holds changed, by a thread of its own while the watcher runs
//! so that an XID's verdict never waits on the disk; a state directory that cannot be written
//! is said once and the watcher goes on without it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use super::tracker::{Kept, Tracker};
use crate::files;
use crate::inventory::Snapshot;
use crate::logging;

/// The default state directory (a hostPath in the DaemonSet, `StateDirectory=` on bare metal).
pub const DEFAULT_STATE_DIR: &str = crate::cli::DEFAULT_STATE_DIR;
/// Where Linux says which boot this is.
const BOOT_ID: &str = "/proc/sys/kernel/random/boot_id";
/// The file's format version.
const VERSION: u32 = 1;
/// Largest file read back (a node's GPUs, each with a few conditions, take a few KiB).
const MAX_BYTES: u64 = 1024 * 1024;

/// The file's contents.
#[derive(Debug, Serialize, Deserialize, PartialEq)]
struct KeptFile {
    version: u32,
    boot_id: String,
    /// By GPU UUID.
    gpus: BTreeMap<String, Kept>,
}

/// The kept verdicts of one applet's watcher.
#[derive(Debug)]
pub struct KeptVerdicts {
    path: PathBuf,
    boot_id: String,
    /// What the file holds now (as written or read), to write only changes.
    written: Option<BTreeMap<String, Kept>>,
    /// A failed write was said; said again only after one succeeds.
    failing: bool,
    /// The thread that writes while the watcher runs, started on the first change.
    writer: Option<Writer>,
}

/// The file of `applet` in `state_dir`.
pub fn file_of(state_dir: &Path, applet: &str) -> PathBuf {
    state_dir.join("health").join(format!("{applet}.json"))
}

impl KeptVerdicts {
    /// The verdicts kept in `path` for this boot.
    pub fn new(path: PathBuf) -> Self {
        let boot_id = std::fs::read_to_string(BOOT_ID)
            .map(|id| id.trim().to_owned())
            .unwrap_or_default();
        Self::for_boot(path, boot_id)
    }

    /// [`new`](Self::new) for a given boot ID.
    pub fn for_boot(path: PathBuf, boot_id: String) -> Self {
        KeptVerdicts {
            path,
            boot_id,
            written: None,
            failing: false,
            writer: None,
        }
    }

    /// Gives the tracker what the last run kept, for the GPUs of `snapshot` (by UUID).
    /// Nothing from another boot, an unreadable file or another version: each said once.
    pub fn restore(&mut self, tracker: &mut Tracker, snapshot: &Snapshot) {
        let Some(file) = self.read() else {
            return;
        };
        let now = SystemTime::now();
        for (uuid, kept) in &file.gpus {
            match snapshot.gpus.iter().find(|gpu| gpu.uuid == *uuid) {
                Some(gpu) => {
                    let codes: Vec<u32> = kept.xids.iter().map(|x| x.code).collect();
                    info!(gpu = gpu.index, uuid = %uuid, xids = ?codes, "Keeping the health verdict from before the restart until the GPU is seen reset");
                    tracker.restore(gpu.index, kept, now);
                }
                None => {
                    info!(uuid = %uuid, "A GPU with a kept health verdict is not on the node any more; forgetting it");
                }
            }
        }
        self.written = Some(file.gpus);
    }

    fn read(&mut self) -> Option<KeptFile> {
        let bytes = match files::read_bytes(&self.path, MAX_BYTES) {
            Ok(bytes) => bytes,
            Err(err) if err.is_not_found() => return None,
            Err(err) => {
                warn!(error = %logging::error_chain(&err), "Cannot read the kept health verdicts; every GPU starts from what NVML says now");
                return None;
            }
        };
        let file: KeptFile = match serde_json::from_slice(&bytes) {
            Ok(file) => file,
            Err(err) => {
                warn!(path = %self.path.display(), error = %err, "The kept health verdicts are not readable; every GPU starts from what NVML says now");
                return None;
            }
        };
        if file.version != VERSION {
            warn!(path = %self.path.display(), version = file.version, "The kept health verdicts are in a format this gpud does not know; every GPU starts from what NVML says now");
            return None;
        }
        if file.boot_id != self.boot_id {
            info!(path = %self.path.display(), "The node rebooted since the health verdicts were kept (every GPU was reset); starting from what NVML says now");
            return None;
        }
        Some(file)
    }

    /// Writes what the tracker holds for the GPUs of `snapshot`, when it changed, now: at
    /// start, before the watcher is ready.
    pub fn save_now(&mut self, tracker: &Tracker, snapshot: &Snapshot) {
        if let Some(bytes) = self.changed(tracker, snapshot) {
            write_reporting(&self.path, &bytes, &mut self.failing);
        }
    }

    /// Hands what the tracker holds for the GPUs of `snapshot`, when it changed, to a writer
    /// thread: the watcher's loop never waits on the disk (a synchronous write tripled the
    /// XID → verdict latency under a stream of XIDs). Only the newest waiting file is written.
    pub fn save(&mut self, tracker: &Tracker, snapshot: &Snapshot) {
        let Some(bytes) = self.changed(tracker, snapshot) else {
            return;
        };
        if self.writer.is_none() {
            self.writer = Writer::start(self.path.clone());
        }
        match &self.writer {
            Some(writer) => writer.queue(bytes),
            // No thread to be had: write in place rather than keep nothing.
            None => write_reporting(&self.path, &bytes, &mut self.failing),
        }
    }

    /// The file's new contents when what the tracker holds differs from what was last
    /// written; remembers it as written.
    fn changed(&mut self, tracker: &Tracker, snapshot: &Snapshot) -> Option<Vec<u8>> {
        let gpus: BTreeMap<String, Kept> = snapshot
            .gpus
            .iter()
            .map(|gpu| (gpu.uuid.clone(), tracker.kept(gpu.index)))
            .filter(|(_, kept)| !kept.xids.is_empty())
            .collect();
        if self.written.as_ref() == Some(&gpus) {
            return None;
        }
        let file = KeptFile {
            version: VERSION,
            boot_id: self.boot_id.clone(),
            gpus,
        };
        let bytes = match serde_json::to_vec_pretty(&file) {
            Ok(bytes) => bytes,
            Err(err) => {
                warn!(error = %err, "Cannot encode the kept health verdicts");
                return None;
            }
        };
        self.written = Some(file.gpus);
        Some(bytes)
    }
}

/// The thread that writes the kept verdicts, newest first; it ends, after the write in hand,
/// once the watcher lets go of it.
#[derive(Debug)]
struct Writer {
    queue: Option<std::sync::mpsc::Sender<Vec<u8>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Writer {
    fn start(path: PathBuf) -> Option<Writer> {
        let (queue, files) = std::sync::mpsc::channel::<Vec<u8>>();
        let span = tracing::Span::current();
        let thread = std::thread::Builder::new()
            .name("gpud-kept".into())
            .spawn(move || {
                let _entered = span.enter();
                let mut failing = false;
                while let Ok(mut bytes) = files.recv() {
                    // Only the newest of what waits matters.
                    while let Ok(newer) = files.try_recv() {
                        bytes = newer;
                    }
                    write_reporting(&path, &bytes, &mut failing);
                }
            });
        match thread {
            Ok(thread) => Some(Writer {
                queue: Some(queue),
                thread: Some(thread),
            }),
            Err(err) => {
                warn!(error = %err, "Cannot start the thread that keeps health verdicts; writing them in place");
                None
            }
        }
    }

    fn queue(&self, bytes: Vec<u8>) {
        if let Some(queue) = &self.queue {
            // The thread ends only when this sender is dropped.
            let _ = queue.send(bytes);
        }
    }
}

impl Drop for Writer {
    /// Lets the last file be written before the watcher's end is reported.
    fn drop(&mut self) {
        drop(self.queue.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Writes `bytes` to `path` atomically (its folder made first), saying a failure once per
/// failing streak and the recovery after one.
fn write_reporting(path: &Path, bytes: &[u8], failing: &mut bool) {
    let written = path
        .parent()
        .map_or(Ok(()), |dir| {
            std::fs::create_dir_all(dir).map_err(|err| format!("creating {}: {err}", dir.display()))
        })
        .and_then(|()| {
            files::write_atomic(path, bytes, 0o600).map_err(|err| logging::error_chain(&err))
        });
    match written {
        Ok(()) => {
            if *failing {
                info!(path = %path.display(), "Health verdicts are kept again");
            }
            *failing = false;
        }
        Err(why) => {
            if !*failing {
                warn!(path = %path.display(), error = %why, "Cannot keep the health verdicts: a restart will forget XIDs that need a GPU reset; give gpud a writable --state-dir");
            }
            *failing = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::health::tracker::TrackerConfig;
    use crate::inventory::test_support;
    use crate::xid::catalog::XidPolicy;

    /// Three GPUs, indices 0–2.
    fn node() -> Snapshot {
        Snapshot {
            gpus: (0..3)
                .map(|i| test_support::gpu(i, &format!("GPU-{i}"), "NVIDIA H100", 81_559))
                .collect(),
            ..Snapshot::default()
        }
    }

    fn tracker() -> Tracker {
        Tracker::new(XidPolicy::default(), TrackerConfig::default())
    }

    #[test]
    fn a_fatal_xid_is_kept_for_this_boot_only_and_by_uuid() {
        let dir = tempfile::tempdir().unwrap();
        let path = file_of(dir.path(), "run");
        let snapshot = node();
        let mut before = tracker();
        before.observe_xid(2, 79, None, SystemTime::now());
        let mut kept = KeptVerdicts::for_boot(path.clone(), "boot-a".into());
        kept.save_now(&before, &snapshot);
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains(&snapshot.gpus[2].uuid), "{text}");

        // The same boot: GPU 2 is unhealthy again from the start.
        let mut after = tracker();
        KeptVerdicts::for_boot(path.clone(), "boot-a".into()).restore(&mut after, &snapshot);
        assert!(!after.verdict(2).is_healthy());
        assert!(after.verdict(1).is_healthy());
        assert!(
            after
                .verdict(2)
                .reason
                .is_some_and(|r| r.starts_with("XID 79"))
        );

        // Another boot: the reboot reset every GPU.
        let mut rebooted = tracker();
        KeptVerdicts::for_boot(path, "boot-b".into()).restore(&mut rebooted, &snapshot);
        assert!(rebooted.verdict(2).is_healthy());
    }

    #[test]
    fn a_bad_file_starts_fresh_and_an_unchanged_verdict_is_not_rewritten() {
        let dir = tempfile::tempdir().unwrap();
        let path = file_of(dir.path(), "run");
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, "{\"version\": 1, \"boot_id\": ").unwrap();
        let snapshot = node();
        let mut after = tracker();
        let mut kept = KeptVerdicts::for_boot(path.clone(), "boot-a".into());
        kept.restore(&mut after, &snapshot);
        assert!(after.verdict(0).is_healthy());

        after.observe_xid(0, 48, None, SystemTime::now());
        kept.save_now(&after, &snapshot);
        assert!(std::fs::read_to_string(&path).unwrap().contains("GPU-0"));
        std::fs::write(&path, "unchanged marker").unwrap();
        kept.save_now(&after, &snapshot);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "unchanged marker");
        // Written by the thread once the watcher lets go of it.
        after.observe_xid(1, 48, None, SystemTime::now());
        kept.save(&after, &snapshot);
        drop(kept);
        assert!(std::fs::read_to_string(&path).unwrap().contains("GPU-1"));
    }
}
