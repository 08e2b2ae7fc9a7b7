//! Dynamic MIG at prepare time: the MIG device a claim was given is made when the claim is
//! prepared and destroyed when it is unprepared, through the same NVML calls the MIG manager
//! applies layouts with ([`crate::nvml::mig_admin`]).
//!
//! - **Which GPUs.** Decided once when the plugin starts: every MIG-capable GPU, except one
//!   with MIG on and GPU instances gpud did not make (a layout the MIG manager or an operator
//!   applied: its MIG devices stay static devices) and one with MIG off and processes on it
//!   (enabling MIG under them would fail). Those are published as before.
//! - **Prepare** of a placement ([`super::partitions`]) turns MIG on first where it is off and
//!   the GPU runs nothing, then creates exactly that GPU instance at that placement and a compute
//!   instance spanning it, and rescans the inventory so the claim's CDI spec and checkpoint
//!   entry name the new MIG device. A placement taken by an instance gpud did not make fails
//!   that claim only, naming the device and the instance in the way. Prepare of the whole GPU
//!   turns MIG off where it is on and no instance is left.
//! - **The record** (`dynamic-mig.json` beside the checkpoint) lists every instance gpud made,
//!   written before the instance is created, so a crash in between leaves at worst a record of
//!   an instance that does not exist. After a restart, recorded instances whose claim is still
//!   in the checkpoint are kept; the others gpud made are destroyed. Instances not in the
//!   record are never touched.
//! - **One change at a time.** Every create/destroy sequence (a prepare, an unprepare, the
//!   clean-up at start) holds the node's MIG layout lock ([`crate::holdings::layout_lock`]),
//!   so it never runs beside the MIG manager's apply or remediation's restore. The GPUs are
//!   this plugin's by the layout owners' record ([`crate::holdings::layout`]), taken at start.
//! - **Refusals.** When NVML says no (a GPU or compute instance it will not create, a MIG
//!   mode that waits for a reset, processes on a GPU whose mode would change) the claim fails
//!   with the device, its placement and the cause; what the claim made is destroyed, the
//!   checkpoint keeps nothing of it, and the kubelet's retry starts afresh.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use super::checkpoint::Checkpoint;
use super::partitions::DynamicGpus;
use crate::dra_names;
use crate::holdings::layout_lock::{self, LayoutLock};
use crate::inventory::{Inventory, Snapshot};
use crate::nvml::mig_admin::{MigAdmin, MigGpu, ModeActivation};
use crate::nvml::{Nvml, Rescanner};

/// The record's file name in the plugin folder.
pub const FILE_NAME: &str = "dynamic-mig.json";
/// The record's format version.
const VERSION: u32 = 1;
/// The record names claims' devices: only root reads it.
const MODE: u32 = 0o600;
/// The largest record read.
const MAX_BYTES: u64 = 1 << 20;

/// One MIG device gpud made for a claim.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Made {
    /// The GPU's UUID.
    pub gpu: String,
    /// The device's DRA name.
    pub device: String,
    /// Its GPU-instance profile id and placement.
    pub profile_id: u32,
    pub start: u32,
    pub size: u32,
}

/// The record on disk.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
struct Record {
    version: u32,
    #[serde(default)]
    instances: Vec<Made>,
}

impl Record {
    /// The record at `path`: empty when there is none; an unreadable one is reported and an
    /// empty one used (the instances it named are then left alone, as any gpud did not make).
    fn load(path: &Path) -> Record {
        let empty = Record {
            version: VERSION,
            instances: Vec::new(),
        };
        let text = match crate::files::read_bytes(path, MAX_BYTES) {
            Ok(bytes) => String::from_utf8(bytes).map_err(|e| e.to_string()),
            Err(err) if err.is_not_found() => return empty,
            Err(err) => Err(err.to_string()),
        };
        let parsed = text.and_then(|t| {
            serde_json::from_str::<Record>(&t)
                .map_err(|e| e.to_string())
                .and_then(|r| {
                    if r.version == VERSION {
                        Ok(r)
                    } else {
                        Err(format!("version {} (this gpud reads {VERSION})", r.version))
                    }
                })
        });
        parsed.unwrap_or_else(|why| {
            warn!(path = %path.display(), error = %why, "Cannot read the record of MIG devices gpud made; leaving every existing MIG device alone");
            empty
        })
    }

    fn save(&self, path: &Path) -> Result<(), String> {
        let mut text = serde_json::to_string_pretty(self).unwrap_or_default();
        text.push('\n');
        crate::files::write_atomic(path, text.as_bytes(), MODE)
            .map_err(|e| format!("cannot save the record of MIG devices gpud made: {e}"))
    }

    fn has(&self, gpu: &str, device: &str) -> bool {
        self.instances
            .iter()
            .any(|m| m.gpu == gpu && m.device == device)
    }
}

/// Dynamic MIG of one plugin: the GPUs it partitions and the instances it made.
pub struct DynamicMig {
    admin: MigAdmin,
    rescanner: Rescanner,
    inventory: Inventory,
    /// The record, read again before each use: after a takeover the gpud before this one
    /// may have made instances until it stopped.
    path: PathBuf,
    gpus: DynamicGpus,
    /// The state directory holding the node's MIG layout lock (`None`: this process only).
    layout_dir: Option<PathBuf>,
}

impl std::fmt::Debug for DynamicMig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DynamicMig")
            .field("gpus", &self.gpus.profiles.keys())
            .finish_non_exhaustive()
    }
}

impl DynamicMig {
    /// Reads the record at `path`, destroys the instances gpud made whose claim `checkpoint`
    /// no longer holds (unless `takeover`: the gpud before this one may still prepare
    /// claims; its orphans go at the next start), and chooses the GPUs to partition on demand.
    pub async fn start(
        path: PathBuf,
        nvml: &Nvml,
        rescanner: Rescanner,
        inventory: Inventory,
        checkpoint: &Checkpoint,
        takeover: bool,
        layout_dir: Option<PathBuf>,
    ) -> DynamicMig {
        let admin = nvml.mig_admin();
        let held: Vec<(String, String)> = checkpoint
            .claims
            .values()
            .flat_map(|c| &c.devices)
            .map(|d| (d.gpu_uuid.clone(), d.device.clone()))
            .collect();
        let started = {
            let path = path.clone();
            match layout_lock::lock(layout_dir.as_deref(), "DRA dynamic MIG's clean-up at start")
                .await
            {
                Ok(_lock) => blocking(move || Ok(choose(&admin, &path, &held, takeover))).await,
                Err(error) => Err(error),
            }
        };
        let (gpus, destroyed) = started.unwrap_or_else(|error| {
            warn!(error = %error, "Cannot read the GPUs' MIG state; no GPU is partitioned on demand");
            (DynamicGpus::default(), false)
        });
        let dynamic = DynamicMig {
            admin,
            rescanner,
            inventory,
            path,
            gpus,
            layout_dir,
        };
        if destroyed {
            dynamic.rescan().await;
        }
        dynamic
    }

    /// The GPUs partitioned on demand.
    pub fn gpus(&self) -> &DynamicGpus {
        &self.gpus
    }

    /// Makes what the claim's devices `names` need: each placement's MIG device (MIG on first
    /// where needed), a whole GPU with MIG off. Returns the instances made, which the caller
    /// destroys ([`DynamicMig::undo`]) when the claim fails later; an error undoes what this
    /// call made already.
    pub async fn make(&self, snapshot: &Snapshot, names: &[String]) -> Result<Vec<Made>, String> {
        let _lock = self.lock("a DRA claim's prepare").await?;
        let mut made = Vec::new();
        let mut changed = false;
        for name in names {
            let outcome = self.make_one(snapshot, name).await;
            match outcome {
                Ok(Some(step)) => {
                    changed = true;
                    made.extend(step);
                }
                Ok(None) => {}
                Err(error) => {
                    // MIG may have been turned on before the failure: rescan either way.
                    self.destroy_all(&made).await;
                    self.rescan().await;
                    return Err(error);
                }
            }
        }
        if changed {
            self.rescan().await;
        }
        Ok(made)
    }

    /// One device: `Some` when the GPU changed (with the instance made, if one was).
    async fn make_one(&self, snapshot: &Snapshot, name: &str) -> Result<Option<Vec<Made>>, String> {
        let Some(gpu) = dra_names::gpu_named(snapshot, name) else {
            return Ok(None);
        };
        if !self.gpus.contains(&gpu.uuid) {
            return Ok(None);
        }
        let (admin, index, gpu_name) = (self.admin, gpu.index, dra_names::gpu_name(gpu));
        if name == gpu_name {
            if !gpu.mig.enabled {
                return Ok(None);
            }
            blocking(move || whole(&admin, index, &gpu_name)).await?;
            return Ok(Some(Vec::new()));
        }
        let Some((profile, start)) = self.gpus.placement(gpu, name) else {
            return Ok(None);
        };
        let exists = gpu.mig.enabled
            && gpu
                .mig
                .devices
                .iter()
                .any(|m| dra_names::mig_name(gpu, m).as_deref() == Some(name));
        let record = Record::load(&self.path);
        let ours = record.has(&gpu.uuid, name);
        if exists && ours {
            return Ok(None);
        }
        let made = Made {
            gpu: gpu.uuid.clone(),
            device: name.to_owned(),
            profile_id: profile.id,
            start,
            size: profile.memory_slices,
        };
        let (check, name_of_gpu) = (made.clone(), gpu_name.clone());
        blocking(move || ready_for(&admin, index, &name_of_gpu, &check, &record)).await?;
        self.remember(&made)?;
        let (create, slices) = (made.clone(), profile.slices);
        let created =
            blocking(move || create_instance(&admin, index, &gpu_name, &create, slices)).await;
        if let Err(error) = created {
            self.forget(&made);
            return Err(error);
        }
        info!(device = %name, gpu = %made.gpu, "Made the claim's MIG device");
        Ok(Some(vec![made]))
    }

    /// The node's MIG layout lock, for `what`.
    async fn lock(&self, what: &str) -> Result<LayoutLock, String> {
        layout_lock::lock(self.layout_dir.as_deref(), what).await
    }

    /// Destroys instances `made` for a claim that failed after all.
    pub async fn undo(&self, made: &[Made]) {
        if !made.is_empty() {
            let _lock = match self.lock("undoing a failed DRA claim's MIG devices").await {
                Ok(lock) => lock,
                Err(error) => {
                    warn!(error = %error, "Cannot take the MIG layout lock; the MIG devices made for a claim that failed are destroyed at the next start");
                    return;
                }
            };
            self.destroy_all(made).await;
            self.rescan().await;
        }
    }

    async fn destroy_all(&self, made: &[Made]) {
        for one in made {
            if let Err(error) = self.destroy(one).await {
                warn!(device = %one.device, error = %error, "Cannot destroy the MIG device made for a claim that failed");
            }
        }
    }

    /// Before claim `uid` is unprepared: destroys the instances gpud made for its devices that
    /// no other prepared claim names. An error leaves the claim prepared (the kubelet retries).
    pub async fn release(&self, checkpoint: &Checkpoint, uid: &str) -> Result<(), String> {
        let Some(claim) = checkpoint.claims.get(uid) else {
            return Ok(());
        };
        let _lock = self.lock("a DRA claim's unprepare").await?;
        let others = |gpu: &str, device: &str| {
            checkpoint
                .claims
                .iter()
                .filter(|(other, _)| other.as_str() != uid)
                .flat_map(|(_, c)| &c.devices)
                .any(|d| d.gpu_uuid == gpu && d.device == device)
        };
        let ours: Vec<Made> = {
            Record::load(&self.path)
                .instances
                .iter()
                .filter(|m| {
                    claim
                        .devices
                        .iter()
                        .any(|d| d.gpu_uuid == m.gpu && d.device == m.device)
                        && !others(&m.gpu, &m.device)
                })
                .cloned()
                .collect()
        };
        let mut result = Ok(());
        for made in &ours {
            match self.destroy(made).await {
                Ok(()) => {
                    info!(device = %made.device, gpu = %made.gpu, "Destroyed the claim's MIG device")
                }
                Err(error) => {
                    result = Err(error);
                    break;
                }
            }
        }
        if !ours.is_empty() {
            self.rescan().await;
        }
        result
    }

    /// Destroys `made` (its compute instances, then the GPU instance) and drops it from the
    /// record; an instance already gone is fine.
    async fn destroy(&self, made: &Made) -> Result<(), String> {
        let index = self
            .inventory
            .current()
            .gpus
            .iter()
            .find(|g| g.uuid == made.gpu)
            .map(|g| g.index);
        if let Some(index) = index {
            let (admin, target) = (self.admin, made.clone());
            blocking(move || destroy_instance(&admin, index, &target)).await?;
        }
        self.forget(made);
        Ok(())
    }

    /// Adds `made` to the record (before it is created). Callers hold the preparer's lock.
    fn remember(&self, made: &Made) -> Result<(), String> {
        let mut record = Record::load(&self.path);
        record.instances.push(made.clone());
        record.save(&self.path)
    }

    /// Drops `made` from the record (once destroyed).
    fn forget(&self, made: &Made) {
        let mut record = Record::load(&self.path);
        record.instances.retain(|m| m != made);
        if let Err(error) = record.save(&self.path) {
            warn!(error = %error, "The record still names a destroyed MIG device; it is dropped on the next start");
        }
    }

    /// Re-reads the node so the inventory (and the CDI spec built from it) has the change.
    async fn rescan(&self) {
        if let Err(error) = self.rescanner.rescan(&self.inventory).await {
            warn!(error = %crate::logging::error_chain(&error), "Rescan after a MIG change failed; the next one catches up");
        }
    }
}

/// Runs NVML calls on a blocking thread.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, String> + Send + 'static,
) -> Result<T, String> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| format!("MIG administration thread failed: {e}"))?
}

/// At start: the record cleaned of instances no claim holds (destroyed, unless `takeover`),
/// and the GPUs to partition on demand; `true` when something was destroyed.
fn choose(
    admin: &MigAdmin,
    path: &Path,
    held: &[(String, String)],
    takeover: bool,
) -> (DynamicGpus, bool) {
    let mut record = Record::load(path);
    let mut gpus = match admin.gpus() {
        Ok(gpus) => gpus,
        Err(error) => {
            warn!(error = %crate::logging::error_chain(&error), "Cannot read the GPUs' MIG state; no GPU is partitioned on demand");
            return (DynamicGpus::default(), false);
        }
    };
    let before = record.clone();
    let mut destroyed = false;
    record.instances.retain(|made| {
        let Some(gpu) = gpus.iter().find(|g| g.uuid == made.gpu) else {
            return false;
        };
        if !placed(gpu, made) {
            return false;
        }
        if takeover || held.iter().any(|(g, d)| *g == made.gpu && *d == made.device) {
            return true;
        }
        match destroy_instance(admin, gpu.index, made) {
            Ok(()) => {
                info!(device = %made.device, gpu = %made.gpu, "Destroyed a MIG device gpud made for a claim that is no longer prepared");
                destroyed = true;
                false
            }
            Err(error) => {
                warn!(device = %made.device, error = %error, "Cannot destroy a MIG device gpud made for a claim that is no longer prepared; trying again on the next start");
                true
            }
        }
    });
    if destroyed {
        gpus = admin.gpus().unwrap_or(gpus);
    }
    if record != before
        && let Err(error) = record.save(path)
    {
        warn!(error = %error, "Cannot save the record of MIG devices gpud made");
    }
    let mut dynamic = DynamicGpus::default();
    for gpu in gpus {
        let Some(mode) = gpu.mode else { continue };
        if gpu.profiles.is_empty() {
            continue;
        }
        let foreign = gpu.instances.iter().any(|gi| {
            !record
                .instances
                .iter()
                .any(|m| m.gpu == gpu.uuid && m.profile_id == gi.profile_id && m.start == gi.start)
        });
        if mode.current && foreign {
            info!(gpu = %gpu.uuid, "MIG devices gpud did not make are on the GPU; publishing them as they are, not partitioning it on demand");
            continue;
        }
        if !mode.current && !gpu.processes.is_empty() {
            info!(gpu = %gpu.uuid, processes = gpu.processes.len(), "MIG is off and processes run on the GPU; publishing it whole, not partitioning it on demand");
            continue;
        }
        dynamic.profiles.insert(gpu.uuid, gpu.profiles);
    }
    info!(
        gpus = dynamic.profiles.len(),
        "GPUs partitioned on demand (dynamic MIG)"
    );
    (dynamic, destroyed)
}

/// Whether the instance `made` names exists on `gpu`.
fn placed(gpu: &MigGpu, made: &Made) -> bool {
    gpu.instances
        .iter()
        .any(|gi| gi.profile_id == made.profile_id && gi.start == made.start)
}

/// Checks that `made`'s placement can be made on GPU `index`, turning MIG on where it is off
/// and nothing runs on the GPU.
fn ready_for(
    admin: &MigAdmin,
    index: u32,
    gpu_name: &str,
    made: &Made,
    record: &Record,
) -> Result<(), String> {
    let at = placed_at(made, gpu_name);
    let gpu = admin
        .gpu(index)
        .map_err(|e| format!("{at}: cannot read the GPU's MIG state: {e}"))?;
    let mode = gpu
        .mode
        .ok_or_else(|| format!("{at}: {gpu_name} is not MIG-capable"))?;
    if !mode.current {
        if !gpu.processes.is_empty() {
            return Err(format!(
                "{at}: MIG is off on {gpu_name} and processes run on it (PIDs {:?}); MIG \
                 cannot be turned on under them, so the claim waits until they end",
                gpu.processes
            ));
        }
        if mode.pending {
            return Err(format!(
                "{at}: MIG on {gpu_name} is pending a GPU reset; the claim can be prepared \
                 once it is in effect"
            ));
        }
        let activation = admin
            .set_mode(index, true)
            .map_err(|e| format!("{at}: cannot turn MIG on: {e}"))?;
        match activation {
            ModeActivation::Active => {
                info!(gpu = %gpu.uuid, "Turned MIG on for a claim's MIG device")
            }
            ModeActivation::ResetPending | ModeActivation::RebootRequired => {
                return Err(format!(
                    "{at}: MIG on {gpu_name} is pending a GPU reset; the claim can be prepared \
                     once it is in effect"
                ));
            }
        }
        return Ok(());
    }
    let end = made.start + made.size;
    let blocking = gpu
        .instances
        .iter()
        .find(|gi| gi.start < end && made.start < gi.start + gi.size);
    if let Some(gi) = blocking {
        let whose = if record
            .instances
            .iter()
            .any(|m| m.gpu == gpu.uuid && m.profile_id == gi.profile_id && m.start == gi.start)
        {
            "gpud made for another claim"
        } else {
            "gpud did not make"
        };
        return Err(format!(
            "device {}: placement {}..{end} of {gpu_name} is taken by GPU instance {} (profile \
             id {}, memory slices {}..{}), which {whose}; this claim cannot be prepared until \
             that instance is gone",
            made.device,
            made.start,
            gi.id,
            gi.profile_id,
            gi.start,
            gi.start + gi.size
        ));
    }
    Ok(())
}

/// `device <name>: placement <start>..<end> of <gpu>`, how a refusal names what it is about.
fn placed_at(made: &Made, gpu_name: &str) -> String {
    format!(
        "device {}: placement {}..{} of {gpu_name}",
        made.device,
        made.start,
        made.start + made.size
    )
}

/// Creates the GPU instance of `made` and a compute instance of `slices` compute slices in
/// it; a failed compute instance takes its GPU instance with it.
fn create_instance(
    admin: &MigAdmin,
    index: u32,
    gpu_name: &str,
    made: &Made,
    slices: u32,
) -> Result<(), String> {
    let at = placed_at(made, gpu_name);
    let gi = admin
        .create_gpu_instance(index, made.profile_id, made.start, made.size)
        .map_err(|e| format!("{at}: NVML cannot create the GPU instance: {e}"))?;
    if let Err(error) = admin.create_compute_instance(index, gi, slices) {
        // Never a GPU instance without its compute instance: it goes too.
        let undone = match admin.destroy_gpu_instance(index, gi) {
            Ok(()) => "; the GPU instance made for it was destroyed".to_owned(),
            Err(e) => format!(
                "; the GPU instance made for it (id {gi}) could not be destroyed either: {e}"
            ),
        };
        return Err(format!(
            "{at}: NVML cannot create the compute instance: {error}{undone}"
        ));
    }
    Ok(())
}

/// Destroys the instance `made` names on GPU `index` (its compute instances first).
fn destroy_instance(admin: &MigAdmin, index: u32, made: &Made) -> Result<(), String> {
    let gpu = admin.gpu(index).map_err(|e| e.to_string())?;
    let Some(gi) = gpu
        .instances
        .iter()
        .find(|gi| gi.profile_id == made.profile_id && gi.start == made.start)
    else {
        return Ok(());
    };
    for ci in &gi.compute {
        admin
            .destroy_compute_instance(index, gi.id, ci.id)
            .map_err(|e| {
                format!(
                    "device {}: cannot destroy its compute instance: {e}",
                    made.device
                )
            })?;
    }
    admin.destroy_gpu_instance(index, gi.id).map_err(|e| {
        format!(
            "device {}: cannot destroy its GPU instance: {e}",
            made.device
        )
    })
}

/// A whole GPU for a claim: MIG off, which needs every instance gone.
fn whole(admin: &MigAdmin, index: u32, gpu_name: &str) -> Result<(), String> {
    let gpu = admin.gpu(index).map_err(|e| e.to_string())?;
    if let Some(gi) = gpu.instances.first() {
        return Err(format!(
            "device {gpu_name}: GPU instance {} (memory slices {}..{}) is on the GPU; the whole \
             GPU can be prepared once it is gone",
            gi.id,
            gi.start,
            gi.start + gi.size
        ));
    }
    match admin.set_mode(index, false).map_err(|e| e.to_string())? {
        ModeActivation::Active => {
            info!(gpu = %gpu.uuid, "Turned MIG off for a claim of the whole GPU");
            Ok(())
        }
        ModeActivation::ResetPending | ModeActivation::RebootRequired => Err(format!(
            "device {gpu_name}: turning MIG off is pending a GPU reset; the claim can be \
             prepared once it is in effect"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_record_round_trips_and_a_bad_one_is_empty() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FILE_NAME);
        assert_eq!(Record::load(&path).instances, []);
        let record = Record {
            version: VERSION,
            instances: vec![Made {
                gpu: "GPU-1".into(),
                device: "gpu-1-mig-3g40gb-9-4".into(),
                profile_id: 9,
                start: 4,
                size: 4,
            }],
        };
        record.save(&path).unwrap();
        assert_eq!(Record::load(&path), record);
        assert!(record.has("GPU-1", "gpu-1-mig-3g40gb-9-4"));
        assert!(!record.has("GPU-0", "gpu-1-mig-3g40gb-9-4"));
        std::fs::write(&path, r#"{"version": 7, "instances": []}"#).unwrap();
        assert_eq!(Record::load(&path).instances, []);
        std::fs::write(&path, "{not json").unwrap();
        assert_eq!(Record::load(&path).instances, []);
    }
}
