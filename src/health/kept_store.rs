//! The kept-verdicts file on disk, in two generations: `<applet>.json` holds the newest,
//! `<applet>.json.prev` the one before it.
//!
//! A write renames the newest to `.prev`, then writes the new one atomically (a temporary file
//! synced, renamed over, the folder synced): a crash in between leaves `.prev`, a bad sector in
//! one leaves the other. A copy that cannot be read is moved aside as
//! `<name>.damaged-<unix seconds>` (kept for whoever investigates, never read again), so it is
//! reported once, not on every start.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use super::kept_file::{self, Decoded};
use crate::files;
use crate::logging;

/// Largest file read back (a node's GPUs, each with a few conditions, take a few KiB).
const MAX_BYTES: u64 = 1024 * 1024;

/// The two copies of one applet's file.
#[derive(Debug, Clone)]
pub struct Store {
    newest: PathBuf,
    previous: PathBuf,
}

/// A copy that could not be read, and where it was moved.
#[derive(Debug, Clone, PartialEq)]
pub struct Damaged {
    pub path: PathBuf,
    /// Where it is now (`None`: it could not be moved and is left in place).
    pub moved_to: Option<PathBuf>,
    pub why: String,
}

/// What was found on disk.
#[derive(Debug, Default)]
pub struct Loaded {
    /// The newest copy that reads, if any.
    pub found: Option<(PathBuf, Decoded)>,
    /// Whether the newest copy is among the damaged: what it held is unknown.
    pub newest_damaged: bool,
    /// Each copy that could not be read.
    pub damaged: Vec<Damaged>,
}

impl Store {
    /// The copies of `path` (`<state-dir>/health/<applet>.json`).
    pub fn new(path: PathBuf) -> Self {
        let mut previous = path.clone().into_os_string();
        previous.push(".prev");
        Store {
            newest: path,
            previous: PathBuf::from(previous),
        }
    }

    /// The newest copy's path (the one named in messages).
    pub fn path(&self) -> &Path {
        &self.newest
    }

    /// Reads both copies; moves aside each that cannot be read.
    pub fn load(&self) -> Loaded {
        let mut loaded = Loaded::default();
        for path in [&self.newest, &self.previous] {
            let read = match files::read_bytes(path, MAX_BYTES) {
                Ok(bytes) => kept_file::decode(&bytes),
                Err(err) if err.is_not_found() => continue,
                Err(err) => Err(logging::error_chain(&err)),
            };
            match read {
                Ok(decoded) if loaded.found.is_none() => {
                    loaded.found = Some((path.clone(), decoded))
                }
                Ok(_) => {}
                Err(why) => {
                    loaded.newest_damaged |= *path == self.newest;
                    loaded.damaged.push(Damaged {
                        path: path.clone(),
                        moved_to: move_aside(path),
                        why,
                    });
                }
            }
        }
        loaded
    }

    /// Writes `bytes` as the newest copy, the current newest becoming the previous one. `Err`
    /// names the file and the step that failed.
    pub fn write(&self, bytes: &[u8]) -> Result<(), String> {
        if let Some(dir) = self.newest.parent() {
            std::fs::create_dir_all(dir)
                .map_err(|err| format!("{}: cannot create the folder: {err}", dir.display()))?;
        }
        // When the newest is missing (a write failed after this rename), `.prev` is already
        // the last that landed and stays.
        match std::fs::rename(&self.newest, &self.previous) {
            Ok(()) => {}
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
            Err(err) => {
                return Err(format!(
                    "{}: cannot keep it as {}: {err}",
                    self.newest.display(),
                    self.previous.display()
                ));
            }
        }
        files::write_atomic(&self.newest, bytes, 0o600).map_err(|err| logging::error_chain(&err))
    }
}

/// Moves a damaged copy to `<name>.damaged-<unix seconds>`; `None` when it cannot be moved.
fn move_aside(path: &Path) -> Option<PathBuf> {
    let seconds = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let mut aside = path.to_path_buf().into_os_string();
    aside.push(format!(".damaged-{seconds}"));
    let aside = PathBuf::from(aside);
    std::fs::rename(path, &aside).ok().map(|()| aside)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::health::kept_file::Verdicts;

    fn bytes(boot: &str, generation: u64) -> Vec<u8> {
        let verdicts = Verdicts {
            boot_id: boot.into(),
            ..Verdicts::default()
        };
        kept_file::encode(&verdicts, generation).unwrap()
    }

    #[test]
    fn the_newest_is_read_and_the_previous_stands_in_for_a_damaged_one() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::new(dir.path().join("health/run.json"));
        store.write(&bytes("a", 1)).unwrap();
        store.write(&bytes("b", 2)).unwrap();
        let loaded = store.load();
        assert_eq!(loaded.found.unwrap().1.generation, 2);
        assert!(loaded.damaged.is_empty());

        std::fs::write(store.path(), b"{\"version\": 2, \"gen").unwrap();
        let loaded = store.load();
        assert_eq!(loaded.found.unwrap().1.generation, 1);
        assert!(loaded.newest_damaged);
        let moved = loaded.damaged[0].moved_to.clone().unwrap();
        assert!(moved.to_string_lossy().contains("run.json.damaged-"));
        assert!(!store.path().exists());
        // Said once: the next start finds no damage, only the previous copy.
        let again = store.load();
        assert!(again.damaged.is_empty() && !again.newest_damaged);
        // A write with the newest missing keeps the previous copy.
        store.write(&bytes("c", 3)).unwrap();
        assert_eq!(store.load().found.unwrap().1.generation, 3);
        let previous = kept_file::decode(&std::fs::read(&store.previous).unwrap()).unwrap();
        assert_eq!(previous.generation, 1);
    }

    #[test]
    fn a_write_into_a_folder_that_cannot_be_made_names_it() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("health"), "").unwrap();
        let store = Store::new(dir.path().join("health/run.json"));
        let err = store.write(&bytes("a", 1)).unwrap_err();
        assert!(err.contains("health: cannot create the folder"), "{err}");
    }
}
