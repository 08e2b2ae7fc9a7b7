//! NodePrepareResources and NodeUnprepareResources, independent of the gRPC version.
//!
//! Prepare, per claim (a failure is that claim's error; the others go on):
//! 1. A claim already in the checkpoint answers what it got then (its CDI spec is written
//!    again if it is gone, e.g. after a reboot emptied `/var/run/cdi`).
//! 2. Otherwise the ResourceClaim is read; its UID must be the one the kubelet named (else
//!    the claim was deleted and re-created under the same name) and it must be allocated.
//! 3. Each allocation result of this driver names a device of this node's pool. The device
//!    must exist, must not be held by another prepared claim, and must not be one the device
//!    plugin gave to a running pod. A result with a `shareID` takes part of a whole GPU's
//!    memory ([`super::shares`]): it may sit beside other shares of the GPU as long as they
//!    all fit its memory and agree on MPS.
//! 4. The opaque configs are read ([`super::opaque`]) and a time-slice interval is set on its
//!    GPU ([`super::timeslice`]; a claim whose setting fails gets nothing, and the GPUs it
//!    had set already go back), one CDI spec is written for the claim ([`super::claim_cdi`]),
//!    the checkpoint saved, and the held devices published.
//!
//! With dynamic MIG ([`super::dynamic_mig`]), step 3 first makes the MIG devices of the
//! placements the claim was given (and reads the inventory again); a claim that fails after
//! that has them destroyed again, and unprepare destroys them before the checkpoint entry goes.
//!
//! A claim whose config asks for MPS gets its own control daemon ([`super::claim_mps`]),
//! started after the intervals and before the spec, whose devices carry the daemon's edits; a
//! claim in the checkpoint has its daemon probed on every prepare and started again when it
//! does not answer (a gpud or node restart), and [`Preparer::supervise_mps`] does the same
//! every probe interval. A failed start is the claim's error and undoes the rest.
//!
//! Unprepare stops a claim's MPS daemon (`quit`, compute mode DEFAULT unless another claim's
//! daemon keeps the GPU, folders removed). It puts a GPU whose interval the claim set back to what the other prepared claims on
//! it ask for, or to `Default` when none asks (skipped when that is the interval already, or
//! the GPU is gone); then it removes the claim's spec and checkpoint entry. A failed reset
//! is the claim's error and leaves the claim prepared, so the kubelet's retry tries again.
//! It needs no API access, and a claim never prepared is fine. Both are serialised by one
//! lock on the checkpoint.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use futures_util::stream::{self, StreamExt};

use kube::api::{Api, DynamicObject};
use tokio::sync::{Mutex, watch};
use tracing::{info, warn};

use super::api_version::ResourceApi;
use super::args::DraConfig;
use super::checkpoint::{Checkpoint, PreparedClaim, PreparedDevice};
use super::claim_cdi::{self, ClaimDevice};
use super::claim_mps::{self, ClaimMps};
use super::dynamic_mig::DynamicMig;
use super::objects::{Allocation, AllocationResult, Claim};
use super::opaque;
use super::shares;
use super::timeslice::{self, TimeSlicer};
use crate::dra_names::{self, DraDevice};
use crate::holdings::Held;
use crate::holdings::pod_resources::{self, Holding};
use crate::inventory::{Inventory, Snapshot};
use crate::kube::{ApiError, bounded};
use crate::nvml::Nvml;

/// The most results one claim may have for one driver: the API's own limit on a claim's
/// requests (`resource.k8s.io`: 32). A claim with more was not written by a real API server.
pub const MAX_RESULTS: usize = 32;
const MIB: u64 = 1024 * 1024;
/// How many claim objects one prepare call reads from the API server at once.
const READ_CONCURRENCY: usize = 16;
/// The longest claim UID accepted (a Kubernetes UID is a 36-character UUID).
const MAX_UID_LEN: usize = 64;

/// Checks that a claim UID from the kubelet is a UID: it names files and folders (the claim's
/// CDI spec, its MPS daemon's folders), so `../`, `/` or a NUL must never get that far.
pub fn check_uid(uid: &str) -> Result<(), String> {
    let shaped = !uid.is_empty()
        && uid.len() <= MAX_UID_LEN
        && uid.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
    if shaped {
        Ok(())
    } else {
        Err(format!(
            "claim UID {:?} is not a UID (letters, digits and '-', at most {MAX_UID_LEN}); refused",
            crate::files::excerpt(uid)
        ))
    }
}

/// A claim as the kubelet names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimRef {
    pub namespace: String,
    pub uid: String,
    pub name: String,
}

/// The claims' state and what prepare needs to reach.
pub struct Preparer {
    config: Arc<DraConfig>,
    api: Option<Arc<ResourceApi>>,
    inventory: Inventory,
    checkpoint: Mutex<Checkpoint>,
    held: watch::Sender<Held>,
    time_slicer: TimeSlicer,
    nvml: Nvml,
    dynamic: Option<Arc<DynamicMig>>,
}

impl std::fmt::Debug for Preparer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Preparer")
            .field("driver", &self.config.driver)
            .finish_non_exhaustive()
    }
}

impl Preparer {
    /// A preparer starting from `checkpoint`, publishing held devices on `held`. Without API
    /// access, claims not in the checkpoint cannot be prepared.
    pub fn new(
        config: Arc<DraConfig>,
        api: Option<Arc<ResourceApi>>,
        inventory: Inventory,
        checkpoint: Checkpoint,
        held: watch::Sender<Held>,
        nvml: Nvml,
    ) -> Preparer {
        held.send_replace(Arc::new(checkpoint.held()));
        Preparer {
            time_slicer: TimeSlicer::new(config.nvidia_smi.clone(), config.host.nvml_dir.clone()),
            config,
            api,
            inventory,
            checkpoint: Mutex::new(checkpoint),
            held,
            nvml,
            dynamic: None,
        }
    }

    /// The preparer of a plugin that makes MIG devices at prepare time.
    pub fn with_dynamic_mig(mut self, dynamic: Arc<DynamicMig>) -> Preparer {
        self.dynamic = Some(dynamic);
        self
    }

    /// Reads the checkpoint file again: the gpud taken over from may have prepared or
    /// unprepared claims while both served. An unreadable file keeps what was read at start.
    pub async fn reload_checkpoint(&self) {
        let (checkpoint, problem) = Checkpoint::load(&self.config.checkpoint());
        if let Some(problem) = problem {
            tracing::warn!(error = %crate::logging::error_chain(&problem), "Cannot read the DRA checkpoint again after the takeover; keeping the one read at start");
            return;
        }
        let mut current = self.checkpoint.lock().await;
        self.held.send_replace(Arc::new(checkpoint.held()));
        *current = checkpoint;
    }

    /// The prepared claims now, by UID (what their device status says).
    pub async fn prepared_claims(&self) -> BTreeMap<String, PreparedClaim> {
        self.checkpoint.lock().await.claims.clone()
    }

    /// Prepares `claims`; each claim's devices or error, by UID.
    pub async fn prepare(
        &self,
        claims: Vec<ClaimRef>,
    ) -> BTreeMap<String, Result<Vec<PreparedDevice>, String>> {
        let mut out = BTreeMap::new();
        let claims: Vec<ClaimRef> = claims
            .into_iter()
            .filter_map(|claim| match check_uid(&claim.uid) {
                Ok(()) => Some(claim),
                Err(error) => {
                    warn!(claim = %format!("{}/{}", claim.namespace, claim.name), error = %error, "Cannot prepare claim");
                    out.insert(claim.uid, Err(error));
                    None
                }
            })
            .collect();
        // The claim objects are read before the lock, several at once: a kubelet that asks
        // for many claims in one call gets its answer within its deadline, not one API round
        // trip after another. Claims already prepared need no read.
        let known: BTreeSet<String> = self
            .checkpoint
            .lock()
            .await
            .claims
            .keys()
            .cloned()
            .collect();
        let reads: Vec<_> = claims
            .iter()
            .filter(|c| !known.contains(&c.uid))
            .map(|claim| self.read_keyed(claim))
            .collect();
        let mut objects: HashMap<String, Result<Claim, String>> = stream::iter(reads)
            .buffer_unordered(READ_CONCURRENCY)
            .collect()
            .await;
        let mut checkpoint = self.checkpoint.lock().await;
        let mut holders = None;
        for claim in claims {
            let object = objects.remove(&claim.uid);
            let result = self
                .prepare_one(&mut checkpoint, &claim, object, &mut holders)
                .await;
            match &result {
                Ok(devices) => {
                    info!(claim = %format!("{}/{}", claim.namespace, claim.name), uid = %claim.uid, devices = devices.len(), "Prepared claim");
                }
                Err(error) => {
                    warn!(claim = %format!("{}/{}", claim.namespace, claim.name), uid = %claim.uid, error = %error, "Cannot prepare claim");
                }
            }
            out.insert(claim.uid, result);
        }
        out
    }

    /// Unprepares `claims`; each claim's outcome, by UID.
    pub async fn unprepare(&self, claims: Vec<ClaimRef>) -> BTreeMap<String, Result<(), String>> {
        let mut checkpoint = self.checkpoint.lock().await;
        let mut out = BTreeMap::new();
        for claim in claims {
            if let Err(error) = check_uid(&claim.uid) {
                warn!(claim = %format!("{}/{}", claim.namespace, claim.name), error = %error, "Cannot unprepare claim");
                out.insert(claim.uid, Err(error));
                continue;
            }
            if let Err(error) = self.reset_intervals(&checkpoint, &claim.uid).await {
                warn!(claim = %format!("{}/{}", claim.namespace, claim.name), uid = %claim.uid, error = %error, "Cannot unprepare claim");
                out.insert(claim.uid, Err(error));
                continue;
            }
            if let Some(dynamic) = &self.dynamic
                && let Err(error) = dynamic.release(&checkpoint, &claim.uid).await
            {
                warn!(claim = %format!("{}/{}", claim.namespace, claim.name), uid = %claim.uid, error = %error, "Cannot unprepare claim");
                out.insert(claim.uid, Err(error));
                continue;
            }
            let removed = checkpoint.claims.remove(&claim.uid);
            if let Some(mps) = removed.as_ref().and_then(|c| c.mps.clone()) {
                self.stop_mps(&checkpoint, &claim.uid, mps).await;
            }
            let mut result = claim_cdi::remove(&self.config.cdi_root, &claim.uid);
            if removed.is_some() {
                if let Err(err) = checkpoint.save(&self.config.checkpoint()) {
                    result = Err(format!("cannot save the DRA checkpoint: {err}"));
                }
                info!(claim = %format!("{}/{}", claim.namespace, claim.name), uid = %claim.uid, "Unprepared claim");
            }
            out.insert(claim.uid, result);
        }
        self.held.send_replace(Arc::new(checkpoint.held()));
        out
    }

    /// Prepares one claim: `object` is the claim as read before the lock (`None` when it was
    /// not read: it was prepared then), `holders` what the device plugin gave pods, read once
    /// per call when a claim first needs it.
    async fn prepare_one(
        &self,
        checkpoint: &mut Checkpoint,
        claim: &ClaimRef,
        object: Option<Result<Claim, String>>,
        holders: &mut Option<Vec<Holding>>,
    ) -> Result<Vec<PreparedDevice>, String> {
        let snapshot = self.inventory.current();
        if let Some(prepared) = checkpoint.claims.get(&claim.uid) {
            // The daemon a gpud before this one started may have died with the node or alone.
            if let Some(mps) = &prepared.mps {
                self.ensure_mps(&claim.uid, mps).await?;
            }
            let spec = claim_cdi::spec_path(&self.config.cdi_root, &claim.uid);
            if !prepared.devices.is_empty() && !spec.exists() {
                let env = share_env(&snapshot, &prepared.devices, prepared.mps.as_ref());
                let devices: Vec<ClaimDevice> = prepared
                    .devices
                    .iter()
                    .map(|d| ClaimDevice {
                        name: d.device.clone(),
                        uuid: d.uuid.clone(),
                        mps: prepared
                            .mps
                            .as_ref()
                            .is_some_and(|m| m.gpus.contains(&d.uuid)),
                        env: if d.share.is_some() {
                            env.clone()
                        } else {
                            Vec::new()
                        },
                    })
                    .collect();
                // A missing spec means the node rebooted (or the runtime's folder was
                // emptied): the compute policy did not survive either. It is set first, so
                // a failure leaves the spec missing and the kubelet's retry sets it again.
                self.set_intervals(checkpoint, &claim.uid, &prepared.devices)
                    .await?;
                claim_cdi::write(
                    &snapshot,
                    &self.config.host,
                    &self.config.cdi_root,
                    &claim.uid,
                    &devices,
                    prepared
                        .mps
                        .as_ref()
                        .map(|m| self.mps_edits(m.key(&claim.uid)))
                        .as_ref(),
                )?;
            }
            return Ok(prepared.devices.clone());
        }
        let object = match object {
            Some(read) => read?,
            // Unprepared by a call that ran between the read and the lock.
            None => self.read_claim(claim).await?,
        };
        if object.metadata.uid != claim.uid {
            return Err(format!(
                "ResourceClaim {}/{} has UID {}, not {}: it was deleted and created again",
                claim.namespace, claim.name, object.metadata.uid, claim.uid
            ));
        }
        let allocation = object.status.allocation.ok_or_else(|| {
            format!(
                "ResourceClaim {}/{} is not allocated",
                claim.namespace, claim.name
            )
        })?;
        let results: Vec<_> = allocation
            .devices
            .results
            .iter()
            .filter(|r| r.driver == self.config.driver)
            .collect();
        if results.len() > MAX_RESULTS {
            return Err(format!(
                "ResourceClaim {}/{} has {} results for {}, over the API's limit of {MAX_RESULTS}; \
                 refused",
                claim.namespace,
                claim.name,
                results.len(),
                self.config.driver
            ));
        }
        // Dynamic MIG: the placements the claim was given are made now, and the snapshot
        // read again so that the rest sees the new MIG devices.
        let (made, snapshot) = match &self.dynamic {
            Some(dynamic) => {
                let names: Vec<String> = results
                    .iter()
                    .filter(|r| r.pool == self.config.node && r.admin_access != Some(true))
                    .map(|r| r.device.clone())
                    .collect();
                let made = dynamic.make(&snapshot, &names).await?;
                (made, self.inventory.current())
            }
            None => (Vec::new(), snapshot),
        };
        let prepared = self
            .prepare_allocated(checkpoint, claim, &allocation, results, &snapshot, holders)
            .await;
        if prepared.is_err()
            && let Some(dynamic) = &self.dynamic
        {
            dynamic.undo(&made).await;
        }
        prepared
    }

    /// Prepares the allocated `results` of `claim` (on `snapshot`, its MIG devices made).
    async fn prepare_allocated(
        &self,
        checkpoint: &mut Checkpoint,
        claim: &ClaimRef,
        allocation: &Allocation,
        results: Vec<&AllocationResult>,
        snapshot: &Snapshot,
        holders: &mut Option<Vec<Holding>>,
    ) -> Result<Vec<PreparedDevice>, String> {
        if holders.is_none() {
            *holders = Some(self.device_plugin_holders(snapshot).await?);
        }
        let holders = holders.as_deref().unwrap_or_default();
        let mut devices = Vec::new();
        let mut cdi_devices = Vec::new();
        let mut mps_asked: Vec<(String, opaque::MpsSettings)> = Vec::new();
        // Shares of this claim's earlier results, by GPU UUID.
        let mut own_shares: Vec<(String, u64)> = Vec::new();
        for result in results {
            if result.pool != self.config.node {
                return Err(format!(
                    "device {} of pool {} is not on this node (pool {})",
                    result.device, result.pool, self.config.node
                ));
            }
            let device = dra_names::find(snapshot, &result.device).ok_or_else(|| {
                format!(
                    "device {} is not on this node (any more): it was removed or reconfigured \
                     after the claim was allocated",
                    result.device
                )
            })?;
            let uuid = device.uuid().to_owned();
            let gpu_uuid = device.gpu().uuid.clone();
            let share = shares::of_result(result)?;
            if share.is_some() && !matches!(device, DraDevice::Gpu(_)) {
                return Err(format!(
                    "device {} is allocated as a share, but only whole GPUs are shared by \
                     capacity; refused",
                    result.device
                ));
            }
            // Admin access (a monitoring claim beside the device's user) holds nothing and is
            // refused nothing.
            let admin_access = result.admin_access == Some(true);
            let other = checkpoint.claims.iter().find(|(uid, other)| {
                uid.as_str() != claim.uid
                    && other.devices.iter().any(|d| {
                        // Shares of one GPU do not clash; their sum is checked below.
                        let both_shares = share.is_some() && d.share.is_some() && d.uuid == uuid;
                        !d.admin_access
                            && !both_shares
                            && Holding {
                                uuid: d.uuid.clone(),
                                gpu_uuid: d.gpu_uuid.clone(),
                                owner: String::new(),
                            }
                            .clashes(&uuid, &gpu_uuid)
                    })
            });
            if let Some((uid, other)) = other.filter(|_| !admin_access) {
                return Err(format!(
                    "device {} is held by claim {}/{} (UID {uid}); one device serves one claim",
                    result.device, other.namespace, other.name
                ));
            }
            if let Some(share) = &share {
                let held = shares_held(checkpoint, &claim.uid, &uuid, &own_shares);
                let total = device.gpu().memory_mib * MIB;
                shares::check_fits(&result.device, total, &held, share.memory)?;
                own_shares.push((uuid.clone(), share.memory));
            }
            let plugin_holder = holders.iter().find(|h| h.clashes(&uuid, &gpu_uuid));
            if let Some(holding) = plugin_holder.filter(|_| !admin_access) {
                return Err(format!(
                    "device {} ({uuid}) was given by the device plugin to pod {}: a GPU is \
                     never handed out by both; it becomes available when that pod ends",
                    result.device, holding.owner
                ));
            }
            let settings = opaque::settings(
                &allocation.devices.config,
                &self.config.driver,
                &result.request,
                matches!(device, DraDevice::Mig(..)),
            )?;
            // Admin access watches the GPU of another claim: it configures nothing.
            let mps = settings.mps.filter(|_| !admin_access);
            if let Some(mps) = mps.clone() {
                mps_asked.push((gpu_uuid.clone(), mps));
            }
            cdi_devices.push(ClaimDevice {
                name: result.device.clone(),
                uuid: uuid.clone(),
                mps: mps.is_some(),
                env: Vec::new(),
            });
            devices.push(PreparedDevice {
                request_names: vec![result.request.clone()],
                pool: result.pool.clone(),
                device: result.device.clone(),
                uuid,
                gpu_uuid,
                cdi_device_ids: vec![claim_cdi::cdi_id(&claim.uid, &result.device)],
                time_slice: settings.time_slice.filter(|_| !admin_access),
                admin_access,
                share,
            });
        }
        let mps = claim_mps_plan(snapshot, mps_asked, &devices)?;
        check_share_modes(checkpoint, &claim.uid, &devices, mps.as_ref())?;
        // A shared daemon another claim runs set the compute mode itself.
        if let Some(mps) = mps
            .as_ref()
            .filter(|m| !daemon_in_use(checkpoint, &claim.uid, m))
        {
            self.check_mps_modes(mps).await?;
        }
        let env = share_env(snapshot, &devices, mps.as_ref());
        for (cdi, device) in cdi_devices.iter_mut().zip(&devices) {
            if device.share.is_some() {
                cdi.env.clone_from(&env);
            }
        }
        self.set_intervals(checkpoint, &claim.uid, &devices).await?;
        if let Some(mps) = &mps
            && let Err(error) = self.ensure_mps(&claim.uid, mps).await
        {
            self.stop_mps(checkpoint, &claim.uid, mps.clone()).await;
            self.restore_intervals(checkpoint, &claim.uid, &devices)
                .await;
            return Err(error);
        }
        // A claim with nothing for this driver gets no spec: a spec without devices is
        // invalid, and a runtime that reads one may refuse every spec in the folder.
        if !cdi_devices.is_empty()
            && let Err(error) = claim_cdi::write(
                snapshot,
                &self.config.host,
                &self.config.cdi_root,
                &claim.uid,
                &cdi_devices,
                mps.as_ref()
                    .map(|m| self.mps_edits(m.key(&claim.uid)))
                    .as_ref(),
            )
        {
            if let Some(mps) = &mps {
                self.stop_mps(checkpoint, &claim.uid, mps.clone()).await;
            }
            self.restore_intervals(checkpoint, &claim.uid, &devices)
                .await;
            return Err(error);
        }
        checkpoint.claims.insert(
            claim.uid.clone(),
            PreparedClaim {
                namespace: claim.namespace.clone(),
                name: claim.name.clone(),
                devices: devices.clone(),
                mps: mps.clone(),
            },
        );
        if let Err(err) = checkpoint.save(&self.config.checkpoint()) {
            checkpoint.claims.remove(&claim.uid);
            let _ = claim_cdi::remove(&self.config.cdi_root, &claim.uid);
            if let Some(mps) = mps {
                self.stop_mps(checkpoint, &claim.uid, mps).await;
            }
            self.restore_intervals(checkpoint, &claim.uid, &devices)
                .await;
            return Err(format!("cannot save the DRA checkpoint: {err}"));
        }
        self.held.send_replace(Arc::new(checkpoint.held()));
        Ok(devices)
    }

    /// Sets the time-slice interval of each of `devices` that asks for one; on a failure the
    /// GPUs set before it go back to what the other claims want, and the error is returned.
    async fn set_intervals(
        &self,
        checkpoint: &Checkpoint,
        uid: &str,
        devices: &[PreparedDevice],
    ) -> Result<(), String> {
        for (done, device) in devices.iter().enumerate() {
            let Some(interval) = &device.time_slice else {
                continue;
            };
            if let Err(error) = self.time_slicer.set(&device.gpu_uuid, interval).await {
                self.restore_intervals(checkpoint, uid, &devices[..done])
                    .await;
                return Err(error);
            }
            info!(device = %device.device, gpu = %device.gpu_uuid, interval = %interval, "Set the GPU's time-slice interval");
        }
        Ok(())
    }

    /// Best effort for a claim that is not prepared after all: each GPU `devices` set goes
    /// back to what the other claims want.
    async fn restore_intervals(
        &self,
        checkpoint: &Checkpoint,
        uid: &str,
        devices: &[PreparedDevice],
    ) {
        for device in devices.iter().filter(|d| d.time_slice.is_some()) {
            let back = wanted_interval(checkpoint, uid, &device.gpu_uuid);
            if let Err(error) = self.time_slicer.set(&device.gpu_uuid, &back).await {
                warn!(error = %error, "Cannot put the GPU's time-slice interval back");
            }
        }
    }

    /// Before claim `uid` is unprepared: each GPU it set an interval on goes to what the
    /// other prepared claims want, unless that is the interval already or the GPU is gone.
    async fn reset_intervals(&self, checkpoint: &Checkpoint, uid: &str) -> Result<(), String> {
        let Some(claim) = checkpoint.claims.get(uid) else {
            return Ok(());
        };
        let snapshot = self.inventory.current();
        for device in &claim.devices {
            let Some(interval) = &device.time_slice else {
                continue;
            };
            let back = wanted_interval(checkpoint, uid, &device.gpu_uuid);
            let present = snapshot.gpus.iter().any(|g| g.uuid == device.gpu_uuid);
            if back == *interval || !present {
                continue;
            }
            self.time_slicer.set(&device.gpu_uuid, &back).await?;
            info!(device = %device.device, gpu = %device.gpu_uuid, interval = %back, "Put the GPU's time-slice interval back");
        }
        Ok(())
    }

    /// Refuses a new MPS claim on GPUs whose compute mode someone else set.
    async fn check_mps_modes(&self, mps: &ClaimMps) -> Result<(), String> {
        let (nvml, mps) = (self.nvml.clone(), mps.clone());
        tokio::task::spawn_blocking(move || claim_mps::check_modes(&nvml, &mps))
            .await
            .map_err(|e| e.to_string())?
    }

    /// Starts claim `uid`'s MPS daemon unless it answers; `Ok(true)` when it was started.
    async fn ensure_mps(&self, uid: &str, mps: &ClaimMps) -> Result<bool, String> {
        let (launch, nvml, dir) = (
            self.config.mps.clone(),
            self.nvml.clone(),
            self.config.plugin_dir(),
        );
        let (uid, mps) = (uid.to_owned(), mps.clone());
        let started = tokio::task::spawn_blocking(move || {
            claim_mps::ensure(&launch, &nvml, &dir, mps.key(&uid), &mps)
                .map(|started| (started, uid, mps))
        })
        .await
        .map_err(|e| e.to_string())??;
        let (started, uid, mps) = started;
        if started {
            info!(claim = %uid, gpus = %mps.gpus.join(","), "Started the claim's MPS control daemon");
        }
        Ok(started)
    }

    /// Stops claim `uid`'s MPS daemon; its GPUs go back to compute mode DEFAULT unless another
    /// prepared claim's daemon keeps them.
    async fn stop_mps(&self, checkpoint: &Checkpoint, uid: &str, mps: ClaimMps) {
        // A daemon shared by claims on one GPU stops with the last of them.
        if daemon_in_use(checkpoint, uid, &mps) {
            return;
        }
        let still_mps: Vec<String> = checkpoint
            .claims
            .iter()
            .filter(|(other, _)| other.as_str() != uid)
            .filter_map(|(_, claim)| claim.mps.as_ref())
            .flat_map(|m| m.gpus.iter().cloned())
            .collect();
        let (launch, nvml, dir) = (
            self.config.mps.clone(),
            self.nvml.clone(),
            self.config.plugin_dir(),
        );
        let uid = uid.to_owned();
        let stopped = tokio::task::spawn_blocking(move || {
            claim_mps::stop(&launch, &nvml, &dir, mps.key(&uid), &mps, &still_mps);
        })
        .await;
        if let Err(err) = stopped {
            warn!(error = %err, "Stopping the claim's MPS control daemon failed");
        }
    }

    /// The CDI edits that point a workload at MPS daemon `key` ([`ClaimMps::key`]).
    fn mps_edits(&self, key: &str) -> crate::cdi::spec::ContainerEdits {
        claim_mps::edits(&self.config.plugin_dir(), key)
    }

    /// Probes every prepared claim's MPS daemon and starts again one that does not answer.
    pub async fn supervise_mps(&self) {
        let daemons: Vec<(String, ClaimMps)> = {
            let checkpoint = self.checkpoint.lock().await;
            checkpoint
                .claims
                .iter()
                .filter_map(|(uid, c)| c.mps.clone().map(|m| (uid.clone(), m)))
                .collect()
        };
        for (uid, mps) in daemons {
            // Under the lock, so an unprepare cannot interleave with a restart.
            let checkpoint = self.checkpoint.lock().await;
            if checkpoint.claims.get(&uid).and_then(|c| c.mps.as_ref()) != Some(&mps) {
                continue;
            }
            match self.ensure_mps(&uid, &mps).await {
                Ok(true) => {
                    warn!(claim = %uid, "The claim's MPS control daemon stopped answering and was started again");
                }
                Ok(false) => {}
                Err(error) => {
                    warn!(claim = %uid, error = %error, "The claim's MPS control daemon stopped answering and cannot be started again; retrying on the next probe");
                }
            }
        }
    }

    /// [`Preparer::read_claim`], keyed by the claim's UID.
    async fn read_keyed(&self, claim: &ClaimRef) -> (String, Result<Claim, String>) {
        (claim.uid.clone(), self.read_claim(claim).await)
    }

    async fn read_claim(&self, claim: &ClaimRef) -> Result<Claim, String> {
        let resource = self.api.as_ref().ok_or_else(|| {
            "no API access to read the ResourceClaim (see --kubeconfig)".to_owned()
        })?;
        let version = resource
            .version()
            .await
            .map_err(|err| crate::logging::error_chain(&err))?;
        let api: Api<DynamicObject> =
            Api::namespaced_with(resource.client(), &claim.namespace, &version.claims());
        let object = bounded(
            || format!("reading ResourceClaim {}/{}", claim.namespace, claim.name),
            api.get(&claim.name),
        )
        .await
        .map_err(|err| match &err {
            ApiError::Api {
                source: kube::Error::Api(status),
                ..
            } if status.code == 404 => format!(
                "ResourceClaim {}/{} does not exist",
                claim.namespace, claim.name
            ),
            _ => crate::logging::error_chain(&err),
        })?;
        let value = serde_json::to_value(&object).map_err(|e| e.to_string())?;
        serde_json::from_value(value).map_err(|e| {
            format!(
                "ResourceClaim {}/{}: unexpected content: {e}",
                claim.namespace, claim.name
            )
        })
    }

    /// What the device plugin gave to running pods; nothing when the check is off or the
    /// kubelet has no pod-resources socket (no kubelet, so no device plugin allocations).
    async fn device_plugin_holders(
        &self,
        snapshot: &crate::inventory::Snapshot,
    ) -> Result<Vec<Holding>, String> {
        match &self.config.pod_resources {
            Some(socket) if socket.exists() => {
                pod_resources::device_plugin_holders(socket, snapshot).await
            }
            _ => Ok(Vec::new()),
        }
    }
}

/// The daemon a claim's MPS requests ask for, over their GPUs in NVML index order; `None`
/// when none asks. One daemon serves the claim, so its requests must agree on `mpsConfig`;
/// a claim sharing a GPU by capacity (`devices` with a share) uses that GPU's shared daemon,
/// so it may have no other MPS device.
fn claim_mps_plan(
    snapshot: &crate::inventory::Snapshot,
    asked: Vec<(String, opaque::MpsSettings)>,
    devices: &[PreparedDevice],
) -> Result<Option<ClaimMps>, String> {
    let Some((_, settings)) = asked.first().cloned() else {
        return Ok(None);
    };
    let shared: Vec<&PreparedDevice> = devices.iter().filter(|d| d.share.is_some()).collect();
    if let Some(first) = shared.first() {
        if asked.len() != 1 || shared.len() != 1 {
            return Err(format!(
                "the claim asks for MPS on {} devices, {} of them shared by capacity: a \
                 workload talks to one MPS control daemon, and each shared GPU has its own, so \
                 a claim sharing a GPU under MPS has that one MPS device",
                asked.len(),
                shared.len()
            ));
        }
        return shares::shared_mps(&first.gpu_uuid, &settings).map(Some);
    }
    if asked.iter().any(|(_, other)| *other != settings) {
        return Err(
            "the claim's requests ask for MPS with different sharing.mpsConfig: one \
                    MPS control daemon serves a claim, so give them one config"
                .to_owned(),
        );
    }
    let gpus: Vec<String> = snapshot
        .gpus
        .iter()
        .filter(|g| asked.iter().any(|(uuid, _)| *uuid == g.uuid))
        .map(|g| g.uuid.clone())
        .collect();
    claim_mps::plan(gpus, &settings).map(Some)
}

/// The interval GPU `gpu_uuid` should have without claim `uid`: the one another prepared claim
/// asks for on it (the first by UID), else the default.
fn wanted_interval(checkpoint: &Checkpoint, uid: &str, gpu_uuid: &str) -> String {
    checkpoint
        .claims
        .iter()
        .filter(|(other, _)| other.as_str() != uid)
        .flat_map(|(_, claim)| &claim.devices)
        .filter(|d| d.gpu_uuid == gpu_uuid)
        .find_map(|d| d.time_slice.clone())
        .unwrap_or_else(|| timeslice::DEFAULT_INTERVAL.to_owned())
}

/// What the other prepared claims (and `own`, this claim's earlier results) take of device
/// `uuid` by capacity, as (`namespace/name`, bytes).
fn shares_held(
    checkpoint: &Checkpoint,
    uid: &str,
    uuid: &str,
    own: &[(String, u64)],
) -> Vec<(String, u64)> {
    let mut held: Vec<(String, u64)> = checkpoint
        .claims
        .iter()
        .filter(|(other, _)| other.as_str() != uid)
        .flat_map(|(_, c)| {
            c.devices
                .iter()
                .filter(|d| d.uuid == uuid)
                .filter_map(|d| d.share.as_ref())
                .map(|s| (format!("{}/{}", c.namespace, c.name), s.memory))
        })
        .collect();
    held.extend(
        own.iter()
            .filter(|(u, _)| u == uuid)
            .map(|(_, bytes)| ("this claim".to_owned(), *bytes)),
    );
    held
}

/// Refuses a share whose MPS use differs from the other shares of its GPU: an MPS daemon
/// holds the GPU in EXCLUSIVE_PROCESS mode, where a workload without MPS cannot run, and a
/// daemon started under running workloads would stop them.
fn check_share_modes(
    checkpoint: &Checkpoint,
    uid: &str,
    devices: &[PreparedDevice],
    mps: Option<&ClaimMps>,
) -> Result<(), String> {
    let this_mps = mps.is_some_and(|m| m.daemon.is_some());
    for device in devices.iter().filter(|d| d.share.is_some()) {
        let other = checkpoint
            .claims
            .iter()
            .filter(|(other, _)| other.as_str() != uid)
            .find(|(_, c)| {
                let shares_it = c
                    .devices
                    .iter()
                    .any(|d| d.share.is_some() && d.uuid == device.uuid);
                let other_mps = c.mps.as_ref().is_some_and(|m| m.daemon.is_some());
                shares_it && other_mps != this_mps
            });
        if let Some((_, other)) = other {
            let (them, us) = if this_mps {
                ("without MPS", "under MPS")
            } else {
                ("under MPS", "without MPS")
            };
            return Err(format!(
                "device {} is shared {them} by claim {}/{}: a share {us} cannot run beside it \
                 (an MPS daemon holds the GPU in EXCLUSIVE_PROCESS mode); give the claim the \
                 same sharing strategy, or another GPU",
                device.device, other.namespace, other.name
            ));
        }
    }
    Ok(())
}

/// Whether a prepared claim other than `uid` uses `mps`'s shared daemon.
fn daemon_in_use(checkpoint: &Checkpoint, uid: &str, mps: &ClaimMps) -> bool {
    mps.daemon.is_some()
        && checkpoint.claims.iter().any(|(other, c)| {
            other.as_str() != uid && c.mps.as_ref().is_some_and(|m| m.daemon == mps.daemon)
        })
}

/// The environment of a claim's shared devices ([`shares::env`]): under a shared MPS daemon,
/// with the client limits of its GPU's memory.
fn share_env(
    snapshot: &crate::inventory::Snapshot,
    devices: &[PreparedDevice],
    mps: Option<&ClaimMps>,
) -> Vec<String> {
    let held: Vec<(String, u64)> = devices
        .iter()
        .filter_map(|d| d.share.as_ref().map(|s| (d.gpu_uuid.clone(), s.memory)))
        .collect();
    let mps_total = mps
        .filter(|m| m.daemon.is_some())
        .and_then(|m| m.gpus.first())
        .and_then(|uuid| snapshot.gpus.iter().find(|g| g.uuid == *uuid))
        .map(|g| g.memory_mib * MIB);
    shares::env(&held, mps_total)
}
