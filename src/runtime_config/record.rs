//! What gpud changed in a runtime's config, kept beside it, so `--revert` takes back exactly
//! that: a key gpud found already set (by NVIDIA's toolkit, by an admin) is not gpud's and is
//! never touched, and a key changed by hand since gpud set it is left as it is now.
//!
//! The record (`<file>.gpud.json`) lists each key gpud changed: the value it had before (none:
//! gpud added it), the value gpud set, and how many of its parent tables were there already
//! (the others gpud created, and a revert removes them again when they are left empty). A key
//! keeps its first `before` across runs. The record is written before the config, so a crash
//! between the two leaves a record of a value the file does not hold, which a revert skips.
//!
//! Beside it, `<file>.gpud.restart` says that the runtime has not yet been told of a change:
//! it is written before the config and removed once a restart succeeds, so a failed restart
//! is tried again by the next run even when the file needs no more change.
//!
//! CRI-O reads every file in its drop-in folder, so for CRI-O these files (and the backup) go
//! in the folder above it.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::{Error, Runtime, write};

/// The record's format version; a record of another version is not guessed at.
const RECORD_VERSION: u32 = 1;

/// One key gpud changed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Change {
    /// The key path.
    pub key: Vec<String>,
    /// Its value (in the file's own syntax) before gpud first set it; `None`: gpud added it.
    pub before: Option<String>,
    /// The value gpud set (in the file's syntax).
    pub set: String,
    /// How many of the key's parent tables existed before gpud set it.
    pub parents_before: usize,
}

/// The record of one config file.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// [`RECORD_VERSION`].
    pub version: u32,
    /// gpud created the file (it did not exist).
    pub created: bool,
    /// The keys gpud changed, in order.
    pub changes: Vec<Change>,
    /// A revert left the file different from the backup, so the backup stays; the record
    /// stays with it, empty, so that no later revert takes the backup for one of a gpud that
    /// kept no record.
    #[serde(default)]
    pub backup_kept: bool,
}

impl Record {
    /// Adds this run's changes: a key already recorded keeps its first `before`.
    pub fn merge(&mut self, changes: Vec<Change>) {
        for change in changes {
            match self.changes.iter_mut().find(|c| c.key == change.key) {
                Some(known) => known.set = change.set,
                None => self.changes.push(change),
            }
        }
    }
}

/// Where gpud keeps its own files for the config `real` of `runtime`.
#[derive(Debug, Clone)]
pub struct SideFiles {
    /// The file before gpud's first change.
    pub backup: PathBuf,
    /// The [`Record`].
    pub record: PathBuf,
    /// The pending-restart marker.
    pub pending: PathBuf,
}

impl SideFiles {
    /// The side files of `real`.
    pub fn of(runtime: Runtime, real: &Path) -> SideFiles {
        let base = match (
            runtime,
            real.parent().and_then(Path::parent),
            real.file_name(),
        ) {
            (Runtime::Crio, Some(above), Some(name)) if !above.as_os_str().is_empty() => {
                above.join(name)
            }
            _ => real.to_path_buf(),
        };
        SideFiles {
            backup: write::backup_path(&base),
            record: write::beside(&base, ".gpud.json"),
            pending: write::beside(&base, ".gpud.restart"),
        }
    }
}

/// The record at `path`, `None` when there is none; a damaged one is an error naming it (a
/// revert cannot know what is gpud's without it).
pub fn load(path: &Path) -> Result<Option<Record>, Error> {
    let Some(text) = write::read(path)? else {
        return Ok(None);
    };
    let damaged = |why: String| Error::Record {
        path: path.to_path_buf(),
        message: why,
    };
    let record: Record = serde_json::from_str(&text).map_err(|e| damaged(e.to_string()))?;
    if record.version != RECORD_VERSION {
        return Err(damaged(format!(
            "version {} is not {RECORD_VERSION}, the one this gpud writes",
            record.version
        )));
    }
    Ok(Some(record))
}

/// Writes `record` to `path`, or removes the file when it holds nothing.
pub fn store(path: &Path, record: &Record) -> Result<(), Error> {
    if record.changes.is_empty() && !record.created && !record.backup_kept {
        return write::remove(path, "remove gpud's record");
    }
    let record = Record {
        version: RECORD_VERSION,
        ..record.clone()
    };
    let text = serde_json::to_string_pretty(&record).map_err(|e| Error::Record {
        path: path.to_path_buf(),
        message: e.to_string(),
    })?;
    write::make_folder(path)?;
    write::put_own(path, &(text + "\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn change(key: &str, before: Option<&str>, set: &str) -> Change {
        Change {
            key: vec![key.to_owned()],
            before: before.map(str::to_owned),
            set: set.to_owned(),
            parents_before: 0,
        }
    }

    #[test]
    fn a_key_keeps_its_first_before_and_the_record_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.toml.gpud.json");
        let mut record = Record::default();
        record.merge(vec![change("a", Some("1"), "2")]);
        record.merge(vec![change("a", Some("2"), "3"), change("b", None, "x")]);
        assert_eq!(
            record.changes,
            [change("a", Some("1"), "3"), change("b", None, "x")]
        );
        store(&path, &record).unwrap();
        let loaded = load(&path).unwrap().unwrap();
        assert_eq!(loaded.changes, record.changes);
        store(&path, &Record::default()).unwrap();
        assert!(load(&path).unwrap().is_none());
    }

    #[test]
    fn a_damaged_record_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.json");
        std::fs::write(
            &path,
            "{\"version\": 99, \"created\": false, \"changes\": []}",
        )
        .unwrap();
        let err = load(&path).unwrap_err().to_string();
        assert!(
            err.contains("r.json") && err.contains("version 99"),
            "{err}"
        );
    }

    #[test]
    fn crio_keeps_its_side_files_out_of_the_drop_in_folder() {
        let side = SideFiles::of(
            Runtime::Crio,
            Path::new("/etc/crio/crio.conf.d/99-gpud.conf"),
        );
        assert_eq!(side.record, Path::new("/etc/crio/99-gpud.conf.gpud.json"));
        let side = SideFiles::of(Runtime::Docker, Path::new("/etc/docker/daemon.json"));
        assert_eq!(side.backup, Path::new("/etc/docker/daemon.json.gpud.bak"));
    }
}
