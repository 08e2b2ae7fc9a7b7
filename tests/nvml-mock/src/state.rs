//! The state file (`NVML_MOCK_STATE`): MIG mode, pending mode and GPU/compute instances per
//! GPU, and compute modes that were changed, shared by every process using the mock so that a
//! `mig apply` in one process is what `inventory` sees in the next (and a test can read what a
//! daemon set).
//!
//! Writes go to a temporary file that is renamed over the real one, so a reader never sees a
//! half-written file. Readers re-load whenever the file's identity (inode, size, mtime)
//! changes, which keeps two live processes consistent.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::mig::MigState;

/// Format version written into the file.
const VERSION: u32 = 1;

/// The file's content: MIG state by GPU UUID, and the compute mode (`nvmlComputeMode_t`) of
/// every GPU whose mode `nvmlDeviceSetComputeMode` changed. Entries for GPUs the current
/// fixture does not have are preserved on rewrite.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StateFile {
    pub version: u32,
    pub gpus: BTreeMap<String, MigState>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub compute_modes: BTreeMap<String, u32>,
}

/// What identifies one version of the file on disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    inode: u64,
    len: u64,
    mtime_ns: i128,
}

fn stamp(path: &Path) -> Option<Stamp> {
    let m = std::fs::metadata(path).ok()?;
    Some(Stamp {
        inode: m.ino(),
        len: m.len(),
        mtime_ns: m.mtime() as i128 * 1_000_000_000 + m.mtime_nsec() as i128,
    })
}

/// Reads and writes one state file, remembering which version it last saw.
#[derive(Debug)]
pub struct StateStore {
    path: PathBuf,
    seen: Option<Stamp>,
}

impl StateStore {
    pub fn new(path: &Path) -> StateStore {
        StateStore {
            path: path.to_owned(),
            seen: None,
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether the file differs from the version last loaded or saved.
    pub fn changed(&self) -> bool {
        stamp(&self.path) != self.seen
    }

    /// Loads the file; `Ok(None)` when it does not exist yet.
    pub fn load(&mut self) -> Result<Option<StateFile>, String> {
        let before = stamp(&self.path);
        let text = match std::fs::read_to_string(&self.path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                self.seen = None;
                return Ok(None);
            }
            Err(e) => return Err(e.to_string()),
        };
        let file: StateFile = serde_json::from_str(&text).map_err(|e| e.to_string())?;
        if file.version != VERSION {
            return Err(format!(
                "unsupported version {} (expected {VERSION})",
                file.version
            ));
        }
        self.seen = before;
        Ok(Some(file))
    }

    /// Writes the file atomically (temporary file in the same directory, then rename).
    pub fn save(
        &mut self,
        gpus: BTreeMap<String, MigState>,
        compute_modes: BTreeMap<String, u32>,
    ) -> Result<(), String> {
        let file = StateFile {
            version: VERSION,
            gpus,
            compute_modes,
        };
        let text = serde_json::to_string_pretty(&file).map_err(|e| e.to_string())?;
        let name = self
            .path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let tmp = self
            .path
            .with_file_name(format!(".{name}.{}.tmp", std::process::id()));
        std::fs::write(&tmp, text + "\n").map_err(|e| format!("{}: {e}", tmp.display()))?;
        std::fs::rename(&tmp, &self.path).map_err(|e| format!("{}: {e}", self.path.display()))?;
        self.seen = stamp(&self.path);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_notices_foreign_writes() {
        let dir = std::env::temp_dir().join(format!("nvml-mock-state-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("state.json");
        let _ = std::fs::remove_file(&path);
        let mut a = StateStore::new(&path);
        let mut b = StateStore::new(&path);
        assert_eq!(a.load(), Ok(None));
        let mut gpus = BTreeMap::new();
        gpus.insert("GPU-x".to_owned(), MigState::default());
        a.save(gpus.clone(), BTreeMap::new()).unwrap();
        assert!(!a.changed());
        assert!(b.changed());
        assert_eq!(b.load().unwrap().unwrap().gpus, gpus);
        assert!(!b.changed());
        std::fs::write(&path, "{\"version\": 1, \"gpus\": {}, \"extra\": 1}").unwrap();
        assert!(a.changed());
        assert!(a.load().is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
