//! The prepared claims on disk (`<plugins>/<driver>/checkpoint.json`): what each claim got,
//! so that a repeated prepare answers the same, unprepare works without the claim object, and
//! both survive gpud and kubelet restarts. The device plugin reads the same file to withdraw
//! the GPUs held by claims when it runs in another container.
//!
//! Written atomically after every change ([`crate::files::write_atomic`]): a reader sees the
//! old or the new file, never half of one. A file that does not parse (a disk fault, a hand
//! edit) is not a reason to stop serving — NVIDIA's driver crash-loops on it with no event.
//! It is moved aside to `checkpoint.json.corrupt-<unix seconds>`, the error names both paths,
//! and the plugin starts from an empty checkpoint: claims prepared before are prepared again
//! on the kubelet's next call (prepare is idempotent) and unprepare of an unknown claim is
//! fine.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The checkpoint's file name in the plugin folder.
pub use crate::holdings::checkpoint::FILE_NAME;
/// The format version written.
pub use crate::holdings::checkpoint::VERSION;
/// The checkpoint's mode: it names pods' claims, so only root reads it.
const MODE: u32 = 0o600;

/// Every prepared claim, by claim UID.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Checkpoint {
    pub version: u32,
    #[serde(default)]
    pub claims: BTreeMap<String, PreparedClaim>,
}

/// What one claim got.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PreparedClaim {
    pub namespace: String,
    pub name: String,
    pub devices: Vec<PreparedDevice>,
    /// The claim's MPS control daemon, when its config asked for MPS.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mps: Option<super::claim_mps::ClaimMps>,
}

/// One prepared device of a claim.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PreparedDevice {
    pub request_names: Vec<String>,
    pub pool: String,
    pub device: String,
    /// The device's UUID (`GPU-…` or `MIG-…`).
    pub uuid: String,
    /// The UUID of the GPU it is or lives on.
    pub gpu_uuid: String,
    pub cdi_device_ids: Vec<String>,
    /// The time-slice interval the claim's config asked for, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_slice: Option<String>,
    /// Allocated with admin access (monitoring beside the device's user): it holds nothing.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub admin_access: bool,
    /// The part of a GPU shared by capacity the claim holds ([`super::shares`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub share: Option<super::shares::Share>,
}

/// A checkpoint that could not be read, and what was done about it.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error(
        "{path}: the DRA checkpoint is corrupt ({why}); moved it aside to {moved} and started \
         from an empty one: claims prepared before are prepared again when the kubelet asks"
    )]
    MovedAside {
        path: PathBuf,
        moved: PathBuf,
        why: String,
    },
    #[error(
        "{path}: the DRA checkpoint is corrupt ({why}) and could not be moved aside ({source}); \
         started from an empty one, and the next write replaces it"
    )]
    NotMoved {
        path: PathBuf,
        why: String,
        #[source]
        source: std::io::Error,
    },
}

impl Checkpoint {
    /// Parses a checkpoint's text.
    pub fn parse(text: &str) -> Result<Checkpoint, String> {
        let checkpoint: Checkpoint = serde_json::from_str(text).map_err(|e| e.to_string())?;
        if checkpoint.version != VERSION {
            return Err(format!(
                "version {} (this gpud reads version {VERSION})",
                checkpoint.version
            ));
        }
        Ok(checkpoint)
    }

    /// Reads the checkpoint at `path`: empty when there is none; a corrupt one is moved aside
    /// and reported, and an empty one returned with the report.
    pub fn load(path: &Path) -> (Checkpoint, Option<LoadError>) {
        let empty = Checkpoint {
            version: VERSION,
            claims: BTreeMap::new(),
        };
        let text = match crate::files::read_bytes(path, crate::holdings::checkpoint::MAX_BYTES) {
            Ok(bytes) => String::from_utf8(bytes).map_err(|e| e.to_string()),
            Err(err) if err.is_not_found() => return (empty, None),
            Err(err) => Err(err.to_string()),
        };
        let why = match text.and_then(|t| Checkpoint::parse(&t)) {
            Ok(checkpoint) => return (checkpoint, None),
            Err(why) => why,
        };
        let stamp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let mut moved = path.as_os_str().to_owned();
        moved.push(format!(".corrupt-{stamp}"));
        let moved = PathBuf::from(moved);
        let error = match std::fs::rename(path, &moved) {
            Ok(()) => LoadError::MovedAside {
                path: path.to_path_buf(),
                moved,
                why,
            },
            Err(source) => LoadError::NotMoved {
                path: path.to_path_buf(),
                why,
                source,
            },
        };
        (empty, Some(error))
    }

    /// Writes the checkpoint to `path` atomically.
    pub fn save(&self, path: &Path) -> Result<(), crate::files::WriteError> {
        let mut text = serde_json::to_string_pretty(self).unwrap_or_default();
        text.push('\n');
        crate::files::write_atomic(path, text.as_bytes(), MODE)
    }

    /// The UUIDs held by claims: each device's own and its GPU's (a GPU one of whose MIG
    /// devices is in a claim cannot be handed out whole).
    pub fn held(&self) -> BTreeSet<String> {
        crate::holdings::held_by(
            self.claims
                .values()
                .flat_map(|claim| &claim.devices)
                .map(|d| (d.uuid.as_str(), d.gpu_uuid.as_str(), d.admin_access)),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one() -> Checkpoint {
        let mut checkpoint = Checkpoint {
            version: VERSION,
            claims: BTreeMap::new(),
        };
        checkpoint.claims.insert(
            "uid-1".into(),
            PreparedClaim {
                namespace: "ns".into(),
                name: "c".into(),
                devices: vec![PreparedDevice {
                    request_names: vec!["gpu".into()],
                    pool: "node".into(),
                    device: "gpu-1-mig-1g10gb-19-6".into(),
                    uuid: "MIG-1".into(),
                    gpu_uuid: "GPU-1".into(),
                    cdi_device_ids: vec![
                        "k8s.gpu.nvidia.com/claim=uid-1-gpu-1-mig-1g10gb-19-6".into(),
                    ],
                    time_slice: None,
                    admin_access: false,
                    share: None,
                }],
                mps: None,
            },
        );
        checkpoint
    }

    #[test]
    fn round_trips_and_names_what_it_holds() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FILE_NAME);
        one().save(&path).unwrap();
        let (read, error) = Checkpoint::load(&path);
        assert!(error.is_none());
        assert_eq!(read, one());
        assert_eq!(
            read.held().into_iter().collect::<Vec<_>>(),
            ["GPU-1", "MIG-1"]
        );
        let mut admin = one();
        for claim in admin.claims.values_mut() {
            claim.devices[0].admin_access = true;
        }
        assert!(admin.held().is_empty(), "admin access holds nothing");
    }

    #[test]
    fn a_corrupt_checkpoint_is_moved_aside_and_an_empty_one_used() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FILE_NAME);
        std::fs::write(&path, "{not json").unwrap();
        let (read, error) = Checkpoint::load(&path);
        assert!(read.claims.is_empty());
        let message = error.unwrap().to_string();
        assert!(
            message.contains("the DRA checkpoint is corrupt"),
            "{message}"
        );
        assert!(!path.exists());
        let names: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(names.len(), 1);
        assert!(
            names[0].starts_with("checkpoint.json.corrupt-"),
            "{names:?}"
        );
    }
}
