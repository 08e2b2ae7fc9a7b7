//! The last outcome on disk: `last-state.json` in the state directory holds the config the
//! reconciler last followed, the state it wrote on the Node and the reason for `failed` or
//! `rebooting`, so that `gpud doctor` on the node can tell why a config did not apply without
//! access to the API server.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The record's file name in the state directory.
pub const FILE: &str = "last-state.json";

/// What the file holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// The `nvidia.com/mig.config` label the state is for.
    pub config: String,
    /// The `nvidia.com/mig.config.state` value written.
    pub state: String,
    /// Why, for `failed` and `rebooting`.
    #[serde(default)]
    pub reason: Option<String>,
}

/// Where the record of `state_dir` lives.
pub fn path(state_dir: &Path) -> PathBuf {
    state_dir.join(FILE)
}

/// Writes `record` (through a temporary file, so a reader never sees half of it).
pub fn write(state_dir: &Path, record: &Record) -> Result<(), String> {
    let path = path(state_dir);
    let fail = |e: std::io::Error| format!("{}: {e}", path.display());
    std::fs::create_dir_all(state_dir).map_err(fail)?;
    let text = serde_json::to_string(record).map_err(|e| e.to_string())?;
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text + "\n").map_err(fail)?;
    std::fs::rename(&tmp, &path).map_err(fail)
}

/// The record of `state_dir`: `Ok(None)` when there is none yet, `Err` naming the file when it
/// cannot be read or parsed.
pub fn read(state_dir: &Path) -> Result<Option<Record>, String> {
    let path = path(state_dir);
    match crate::files::read_text(&path) {
        Ok(text) => serde_json::from_str(&text)
            .map(Some)
            .map_err(|e| format!("{}: {e}", path.display())),
        Err(e) if e.is_not_found() => Ok(None),
        Err(e) => Err(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_a_missing_file_is_none() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(read(dir.path()), Ok(None));
        let record = Record {
            config: "all-1g.10gb".into(),
            state: "failed".into(),
            reason: Some("GPU 0: boom".into()),
        };
        write(&dir.path().join("sub"), &record).unwrap();
        assert_eq!(read(&dir.path().join("sub")), Ok(Some(record)));
        std::fs::write(path(dir.path()), "{").unwrap();
        assert!(read(dir.path()).unwrap_err().contains("last-state.json"));
    }
}
