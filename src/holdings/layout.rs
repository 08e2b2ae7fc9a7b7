//! Who owns each GPU's MIG layout: the MIG manager (its config), DRA dynamic MIG (its claims)
//! or nobody. Three writers create and destroy MIG instances — the MIG manager, DRA dynamic
//! MIG and remediation's restore after a reset — and only the owner decides what a GPU's
//! layout is; remediation remakes what the owner recorded and nothing else.
//!
//! The record is `mig-layout-owners.json` in the state directory, so applets in one process
//! and in separate containers of the DaemonSet see the same owners. An owner takes its GPUs
//! at start ([`take`]) and holds a shared `flock` on its own `mig-layout-<owner>.alive` file
//! while it runs: a GPU recorded for another owner whose file is locked is a conflict (the
//! start is refused, naming the GPU and both owners); one whose owner is gone is taken over.
//! A damaged record fails closed: nothing is taken and no layout is remade, and the error
//! names the file.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

use rustix::fs::{FlockOperation, flock};
use serde::{Deserialize, Serialize};

use crate::nvml::mig_admin::MigGpu;

/// The record's file name in the state directory.
pub const FILE_NAME: &str = "mig-layout-owners.json";
/// The record's format version.
const VERSION: u32 = 1;
/// The largest record read: a few GPUs' layouts fit many times over.
const MAX_BYTES: u64 = 1 << 20;
/// Names devices and paths, nothing secret; root writes it.
const MODE: u32 = 0o644;

/// Who decides a GPU's MIG layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Owner {
    /// The MIG manager: `gpud mig reconcile`, or `gpud run --mig-config-file`.
    MigManager,
    /// DRA dynamic MIG: `gpud dra --dra-dynamic-mig`, or `gpud run --dra --dra-dynamic-mig`.
    DraDynamicMig,
}

impl Owner {
    /// The word used in file names.
    fn word(self) -> &'static str {
        match self {
            Owner::MigManager => "mig-manager",
            Owner::DraDynamicMig => "dra-dynamic-mig",
        }
    }
}

impl std::fmt::Display for Owner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Owner::MigManager => "the MIG manager (gpud mig reconcile, --mig-config-file)",
            Owner::DraDynamicMig => "DRA dynamic MIG (--dra-dynamic-mig)",
        })
    }
}

/// One GPU instance of a recorded layout.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Instance {
    /// GPU-instance profile id.
    pub profile_id: u32,
    /// First memory slice and how many.
    pub start: u32,
    pub size: u32,
    /// The compute slices of each of its compute instances.
    pub compute_slices: Vec<u32>,
}

/// What the record says of one GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Entry {
    pub owner: Owner,
    /// The MIG manager's layout, as it last brought the GPU to its config (`None` before its
    /// first success).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layout: Option<Vec<Instance>>,
    /// DRA dynamic MIG's checkpoint, whose prepared claims' MIG devices are the layout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<PathBuf>,
}

/// The record: owners by GPU UUID.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    pub version: u32,
    #[serde(default)]
    pub gpus: BTreeMap<String, Entry>,
}

/// Where the record of `dir` lives.
pub fn path(dir: &Path) -> PathBuf {
    dir.join(FILE_NAME)
}

/// The record of state directory `dir`: empty when there is none; `Err` naming the file when
/// it cannot be read or is not one gpud wrote.
pub fn read(dir: &Path) -> Result<Record, String> {
    let path = path(dir);
    let damaged = |why: String| {
        format!(
            "{}: {why}; the MIG layout owners cannot be told, so no layout is changed: remove \
             the file and restart gpud (each owner records its GPUs again at start)",
            path.display()
        )
    };
    let bytes = match crate::files::read_bytes(&path, MAX_BYTES) {
        Ok(bytes) => bytes,
        Err(err) if err.is_not_found() => {
            return Ok(Record {
                version: VERSION,
                gpus: BTreeMap::new(),
            });
        }
        Err(err) => return Err(damaged(err.to_string())),
    };
    let record: Record = serde_json::from_slice(&bytes).map_err(|e| damaged(e.to_string()))?;
    if record.version != VERSION {
        return Err(damaged(format!(
            "version {} (this gpud reads version {VERSION})",
            record.version
        )));
    }
    Ok(record)
}

/// Writes `record` atomically.
fn write(dir: &Path, record: &Record) -> Result<(), String> {
    let mut text = serde_json::to_string_pretty(record).map_err(|e| e.to_string())?;
    text.push('\n');
    crate::files::write_atomic(&path(dir), text.as_bytes(), MODE).map_err(|e| e.to_string())
}

/// The owner of GPU `uuid` and what it recorded; `Ok(None)`: nobody owns its layout.
pub fn owner_of(dir: &Path, uuid: &str) -> Result<Option<Entry>, String> {
    Ok(read(dir)?.gpus.remove(uuid))
}

/// Two owners for one GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conflict {
    pub index: u32,
    pub uuid: String,
    pub ours: Owner,
    pub theirs: Owner,
    /// Where the other owner was found: this process's flags, or the record.
    pub source: String,
}

impl std::fmt::Display for Conflict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "GPU {} ({}): its MIG layout would have two owners, {} and {} ({}); a GPU's layout \
             has one owner: leave the GPU out of the MIG config, or run without \
             --dra-dynamic-mig",
            self.index, self.uuid, self.ours, self.theirs, self.source
        )
    }
}

/// Makes the state directory if it is not there, 0700 as gpud makes it everywhere (it is
/// root's: gpud refuses one others can write to).
pub(super) fn make_dir(dir: &Path) -> Result<(), String> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| format!("{}: cannot make the state directory: {e}", dir.display()))
}

/// The alive files this process holds locked, one per owner it is: kept until it exits.
static HELD: Mutex<Vec<File>> = Mutex::new(Vec::new());

fn alive_path(dir: &Path, owner: Owner) -> PathBuf {
    dir.join(format!("mig-layout-{}.alive", owner.word()))
}

/// Whether a process (this one included) runs as `owner` on this node: its shared lock on
/// the alive file refuses an exclusive one, which is let go at once. `flock` locks belong to
/// the open file, so this process's own lock counts too.
fn running(dir: &Path, owner: Owner) -> bool {
    let Ok(file) = File::open(alive_path(dir, owner)) else {
        return false;
    };
    flock(&file, FlockOperation::NonBlockingLockExclusive).is_err()
}

/// Takes GPUs `gpus` (index, UUID) for `owner` in the record of `dir`: refused with the first
/// GPU another running owner has; GPUs recorded for an owner that no longer runs are taken
/// over, and `owner`'s GPUs not in `gpus` are let go. `checkpoint` is DRA dynamic MIG's.
/// This process then counts as `owner` until it exits.
pub fn take(
    dir: &Path,
    owner: Owner,
    gpus: &[(u32, String)],
    checkpoint: Option<&Path>,
) -> Result<(), TakeError> {
    make_dir(dir).map_err(TakeError::Io)?;
    let alive = alive_path(dir, owner);
    let file =
        open_lock_file(&alive).map_err(|e| TakeError::Io(format!("{}: {e}", alive.display())))?;
    let mut record = check(dir, owner, gpus)?;
    flock(&file, FlockOperation::NonBlockingLockShared)
        .map_err(|e| TakeError::Io(format!("{}: {e}", alive.display())))?;
    HELD.lock()
        .unwrap_or_else(PoisonError::into_inner)
        .push(file);
    let before = record.clone();
    record
        .gpus
        .retain(|uuid, e| e.owner != owner || gpus.iter().any(|(_, u)| u == uuid));
    for (_, uuid) in gpus {
        let kept = record
            .gpus
            .get(uuid)
            .filter(|e| e.owner == owner)
            .and_then(|e| e.layout.clone());
        record.gpus.insert(
            uuid.clone(),
            Entry {
                owner,
                layout: kept,
                checkpoint: checkpoint.map(Path::to_path_buf),
            },
        );
    }
    if record != before {
        write(dir, &record).map_err(TakeError::Io)?;
    }
    Ok(())
}

/// Whether `owner` may change the layouts of `gpus` (index, UUID) without taking them: refused
/// with the first GPU another running owner has (a one-shot `gpud mig apply` beside a running
/// DRA plugin). Returns the record as read.
pub fn check(dir: &Path, owner: Owner, gpus: &[(u32, String)]) -> Result<Record, TakeError> {
    let record = read(dir).map_err(TakeError::Damaged)?;
    for (index, uuid) in gpus {
        let Some(entry) = record.gpus.get(uuid) else {
            continue;
        };
        if entry.owner != owner && running(dir, entry.owner) {
            return Err(TakeError::Conflict(Conflict {
                index: *index,
                uuid: uuid.clone(),
                ours: owner,
                theirs: entry.owner,
                source: format!("recorded in {}", path(dir).display()),
            }));
        }
    }
    Ok(record)
}

/// Opens (or makes) a file that is only ever locked, never read: a symlink in its place is
/// refused rather than followed, so a planted link cannot make gpud create or lock another file.
pub(super) fn open_lock_file(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .custom_flags(nix::fcntl::OFlag::O_NOFOLLOW.bits())
        .open(path)
}

/// Why [`take`] failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TakeError {
    /// Another running owner has one of the GPUs.
    Conflict(Conflict),
    /// The record is damaged (the message names it).
    Damaged(String),
    /// The state directory cannot be written.
    Io(String),
}

impl TakeError {
    /// The error a start exits with: a conflict is a usage error (64), a damaged record a
    /// config error (65), an unwritable state directory 73.
    pub fn into_error(self) -> crate::daemon::Error {
        use crate::daemon::Error;
        match self {
            TakeError::Conflict(c) => Error::Usage(c.to_string()),
            TakeError::Damaged(why) => Error::Config(why),
            TakeError::Io(why) => Error::CantCreate(why),
        }
    }
}

impl std::fmt::Display for TakeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TakeError::Conflict(c) => c.fmt(f),
            TakeError::Damaged(why) | TakeError::Io(why) => f.write_str(why),
        }
    }
}

/// Records the MIG manager's layout of `gpus` as they are now (after it brought them to its
/// config), for the GPUs it owns.
pub fn record_layouts(dir: &Path, gpus: &[MigGpu]) -> Result<(), String> {
    let mut record = read(dir)?;
    let before = record.clone();
    for gpu in gpus {
        let Some(entry) = record.gpus.get_mut(&gpu.uuid) else {
            continue;
        };
        if entry.owner != Owner::MigManager {
            continue;
        }
        let on = gpu.mode.is_some_and(|m| m.current);
        entry.layout = Some(if on { layout_of(gpu) } else { Vec::new() });
    }
    if record != before {
        write(dir, &record)?;
    }
    Ok(())
}

/// The GPU instances of `gpu` as a layout, by placement.
pub fn layout_of(gpu: &MigGpu) -> Vec<Instance> {
    let mut layout: Vec<Instance> = gpu
        .instances
        .iter()
        .map(|gi| Instance {
            profile_id: gi.profile_id,
            start: gi.start,
            size: gi.size,
            compute_slices: gi.compute.iter().map(|ci| ci.slices).collect(),
        })
        .collect();
    layout.sort_by_key(|i| i.start);
    layout
}

/// Refuses owners that one process's flags give the same GPU: `manager` are the GPUs a MIG
/// config covers, `dynamic` those DRA dynamic MIG would partition (index, UUID).
pub fn check_flags(manager: &[(u32, String)], dynamic: &[(u32, String)]) -> Result<(), Conflict> {
    match manager.iter().find(|m| dynamic.contains(m)) {
        Some((index, uuid)) => Err(Conflict {
            index: *index,
            uuid: uuid.clone(),
            ours: Owner::MigManager,
            theirs: Owner::DraDynamicMig,
            source: "both asked for in this gpud's flags".to_owned(),
        }),
        None => Ok(()),
    }
}

/// The GPUs DRA dynamic MIG may partition: the MIG-capable ones (index, UUID).
pub fn mig_capable(gpus: &[MigGpu]) -> Vec<(u32, String)> {
    gpus.iter()
        .filter(|g| g.mode.is_some() && !g.profiles.is_empty())
        .map(|g| (g.index, g.uuid.clone()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpus(list: &[(u32, &str)]) -> Vec<(u32, String)> {
        list.iter().map(|(i, u)| (*i, (*u).to_owned())).collect()
    }

    #[test]
    fn a_missing_record_owns_nothing_and_a_damaged_one_names_its_file() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(owner_of(dir.path(), "GPU-a"), Ok(None));
        std::fs::write(path(dir.path()), "{").unwrap();
        let err = owner_of(dir.path(), "GPU-a").unwrap_err();
        assert!(err.contains(FILE_NAME), "{err}");
        assert!(err.contains("no layout is changed"), "{err}");
        let err = take(dir.path(), Owner::MigManager, &gpus(&[(0, "GPU-a")]), None).unwrap_err();
        assert!(matches!(err, TakeError::Damaged(_)), "{err}");
        std::fs::write(path(dir.path()), r#"{"version": 9, "gpus": {}}"#).unwrap();
        assert!(read(dir.path()).unwrap_err().contains("version 9"));
    }

    #[test]
    fn an_owner_takes_its_gpus_and_records_its_layout() {
        let dir = tempfile::tempdir().unwrap();
        take(
            dir.path(),
            Owner::MigManager,
            &gpus(&[(0, "GPU-a"), (1, "GPU-b")]),
            None,
        )
        .unwrap();
        let entry = owner_of(dir.path(), "GPU-b").unwrap().unwrap();
        assert_eq!(entry.owner, Owner::MigManager);
        assert_eq!(entry.layout, None);
        // This process now runs the MIG manager: DRA dynamic MIG cannot take GPU-b.
        let err = take(
            dir.path(),
            Owner::DraDynamicMig,
            &gpus(&[(1, "GPU-b")]),
            Some(Path::new("/cp.json")),
        )
        .unwrap_err();
        let conflict = match err {
            TakeError::Conflict(conflict) => conflict,
            other => panic!("{other}"),
        };
        assert_eq!((conflict.index, conflict.uuid.as_str()), (1, "GPU-b"));
        let text = conflict.to_string();
        assert!(text.starts_with("GPU 1 (GPU-b): "), "{text}");
        assert!(text.contains("the MIG manager"), "{text}");
        assert!(text.contains("DRA dynamic MIG"), "{text}");
        assert_eq!(
            owner_of(dir.path(), "GPU-b").unwrap().unwrap().owner,
            Owner::MigManager
        );
    }

    #[test]
    fn flags_giving_one_gpu_two_owners_are_refused() {
        let manager = gpus(&[(0, "GPU-a"), (1, "GPU-b")]);
        assert_eq!(check_flags(&manager, &gpus(&[(2, "GPU-c")])), Ok(()));
        let conflict = check_flags(&manager, &gpus(&[(1, "GPU-b")])).unwrap_err();
        assert_eq!(conflict.index, 1);
        assert!(conflict.to_string().contains("flags"));
    }
}
