//! Health verdicts that only an event proves, kept in gpud's state directory so that a restart
//! (a crash, an OOM kill, an upgrade) does not put a GPU that still needs a reset back into
//! service: NVML keeps no trace of an XID, and the kernel log is read from its end.
//!
//! One file per applet (`<state-dir>/health/<applet>.json`: the containers of the per-applet
//! DaemonSet each run a watcher), keyed by GPU UUID (indices can change across a restart) and
//! stamped with the boot ID: after a reboot every GPU was reset, and the file is ignored. A GPU
//! is kept until the tracker sees it reset, then dropped from the file. The file is written
//! (atomically) only when what it holds changed; a state directory that cannot be written is
//! said once and the watcher goes on without it.

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
pub const DEFAULT_STATE_DIR: &str = "/var/lib/gpud";
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

    /// Writes what the tracker holds for the GPUs of `snapshot` when it changed.
    pub fn save(&mut self, tracker: &Tracker, snapshot: &Snapshot) {
        let gpus: BTreeMap<String, Kept> = snapshot
            .gpus
            .iter()
            .map(|gpu| (gpu.uuid.clone(), tracker.kept(gpu.index)))
            .filter(|(_, kept)| !kept.xids.is_empty())
            .collect();
        if self.written.as_ref() == Some(&gpus) {
            return;
        }
        let file = KeptFile {
            version: VERSION,
            boot_id: self.boot_id.clone(),
            gpus,
        };
        let written = serde_json::to_vec_pretty(&file)
            .map_err(|err| err.to_string())
            .and_then(|bytes| self.write(&bytes));
        match written {
            Ok(()) => {
                if self.failing {
                    info!(path = %self.path.display(), "Health verdicts are kept again");
                }
                self.failing = false;
                self.written = Some(file.gpus);
            }
            Err(why) => {
                if !self.failing {
                    warn!(path = %self.path.display(), error = %why, "Cannot keep the health verdicts: a restart will forget XIDs that need a GPU reset; give gpud a writable --state-dir");
                }
                self.failing = true;
            }
        }
    }

    fn write(&self, bytes: &[u8]) -> Result<(), String> {
        if let Some(dir) = self.path.parent() {
            std::fs::create_dir_all(dir)
                .map_err(|err| format!("creating {}: {err}", dir.display()))?;
        }
        files::write_atomic(&self.path, bytes, 0o600).map_err(|err| logging::error_chain(&err))
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
        kept.save(&before, &snapshot);
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
        kept.save(&after, &snapshot);
        assert!(std::fs::read_to_string(&path).unwrap().contains("GPU-0"));
        std::fs::write(&path, "unchanged marker").unwrap();
        kept.save(&after, &snapshot);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "unchanged marker");
    }
}
