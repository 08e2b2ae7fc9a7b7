//! The label computation: a pure function from a snapshot and settings to GFD's labels plus
//! gpud's health summary.
//!
//! The rules are GFD's (`internal/lm` of NVIDIA's k8s-device-plugin):
//! - no GPUs: only the timestamp;
//! - full-GPU labels per GPU model: MIG-enabled models first, without sharing (`replicas`
//!   `0`), then models with MIG disabled, with sharing; later labels overwrite earlier ones,
//!   so a node's `nvidia.com/gpu.*` describe one model and `count` counts that model;
//! - with the `single` or `mixed` MIG strategy, MIG labels are computed next and overwrite
//!   the full-GPU ones; `single` falls back to `<model>-MIG-INVALID` labels when the layout
//!   cannot be served as one resource;
//! - `nvidia.com/gpu.clique` when the fabric-attached GPUs agree on one cluster UUID and one
//!   clique (`imex.go`); `nvidia.com/vgpu.*` from the PCI configuration space (`vgpu.go`).
//!
//! Where GFD iterates Go maps (a node with several models), the winner is random; gpud makes
//! it deterministic: the model of the lowest-index GPU wins.

use std::collections::BTreeMap;

use super::syntax::sanitise;
use super::vgpu::Vgpu;
use crate::inventory::HealthState;
use crate::inventory::model::{Gpu, MigDevice, Snapshot, family_for};
use crate::nvidia_config::{MigStrategy, Sharing, SharingStrategy};

/// Resource name of full GPUs (and of MIG devices under the `single` strategy).
pub const GPU_RESOURCE: &str = "nvidia.com/gpu";
/// Prefix of gpud's own labels.
pub const GPUD_PREFIX: &str = "gpud.io/";
/// The timestamp label (left out of change detection).
pub const TIMESTAMP_LABEL: &str = "nvidia.com/gfd.timestamp";
/// Machine type when the DMI file cannot be read.
pub const UNKNOWN: &str = "unknown";

/// PCI class of a 3D controller (a compute-only GPU).
pub const PCI_CLASS_COMPUTE: u32 = 0x03_02_00;
/// PCI class of a VGA-compatible controller (a GPU with display).
pub const PCI_CLASS_GRAPHICS: u32 = 0x03_00_00;

/// Everything besides the snapshot that the labels depend on.
#[derive(Debug, Clone, PartialEq)]
pub struct LabelConfig {
    /// `flags.migStrategy`.
    pub mig_strategy: MigStrategy,
    /// `sharing`: replicas, renames and the strategy in force.
    pub sharing: Sharing,
    /// Value of `nvidia.com/gfd.timestamp` (Unix seconds), `None` with `noTimestamp`.
    pub timestamp: Option<u64>,
    /// Content of the machine-type file (trimmed), `None` when it cannot be read.
    pub machine_type: Option<String>,
    /// PCI class of each GPU by NVML bus id (read from sysfs; NVML does not report it). A GPU
    /// missing here makes `nvidia.com/gpu.mode` `unknown`.
    pub pci_classes: BTreeMap<String, u32>,
    /// What the NVIDIA PCI functions' configuration spaces say about vGPUs.
    pub vgpu: Vgpu,
    /// Whether to add gpud's health-summary labels.
    pub health_labels: bool,
}

/// Label keys to values, sorted.
pub type Labels = BTreeMap<String, String>;

/// Computes every label for the node.
pub fn labels(snapshot: &Snapshot, config: &LabelConfig) -> Labels {
    let mut out = Labels::new();
    if let Some(timestamp) = config.timestamp {
        out.insert(TIMESTAMP_LABEL.into(), timestamp.to_string());
    }
    if snapshot.gpus.is_empty() {
        return out;
    }
    let machine = config
        .machine_type
        .as_deref()
        .filter(|m| !m.is_empty())
        .map_or_else(|| UNKNOWN.to_owned(), sanitise);
    out.insert("nvidia.com/gpu.machine".into(), machine);
    version_labels(&mut out, snapshot);
    let mig_capable = snapshot.gpus.iter().any(|gpu| gpu.mig.capable);
    out.insert("nvidia.com/mig.capable".into(), mig_capable.to_string());
    let any_mig_enabled = snapshot.gpus.iter().any(|gpu| gpu.mig.enabled);
    let mps = config.sharing.strategy() == SharingStrategy::Mps && !any_mig_enabled;
    out.insert("nvidia.com/mps.capable".into(), mps.to_string());
    out.insert(
        "nvidia.com/gpu.mode".into(),
        gpu_mode(snapshot, config).into(),
    );
    if let FabricIds::One(clique) = fabric_ids(snapshot) {
        out.insert(CLIQUE_LABEL.into(), clique);
    }
    vgpu_labels(&mut out, &config.vgpu);
    resource_labels(&mut out, snapshot, config);
    if config.health_labels {
        health_labels(&mut out, snapshot);
    }
    out
}

/// Conditions worth a warning in the log (GFD logs or fails on them); empty when all is well.
pub fn warnings(snapshot: &Snapshot, config: &LabelConfig) -> Vec<String> {
    let mut out = Vec::new();
    let named: Vec<&Gpu> = named_gpus(snapshot);
    let mut models: Vec<&str> = named.iter().map(|gpu| gpu.name.as_str()).collect();
    models.dedup();
    models.sort_unstable();
    models.dedup();
    if models.len() > 1 {
        out.push(format!(
            "Multiple device types detected: {}",
            models.join(", ")
        ));
    }
    if config.sharing.strategy() == SharingStrategy::Mps && named.iter().any(|g| g.mig.enabled) {
        out.push(
            "MPS sharing is configured but MIG is enabled on a GPU: MPS does not support MIG \
             devices, so nvidia.com/mps.capable is false"
                .into(),
        );
    }
    if config.mig_strategy == MigStrategy::Single
        && let Some(reason) = single_strategy_problem(&named)
    {
        out.push(format!(
            "Invalid configuration detected for mig-strategy=single: {reason}"
        ));
    }
    if let FabricIds::NonUnique(problem) = fabric_ids(snapshot) {
        out.push(format!("{problem}; {CLIQUE_LABEL} is not set"));
    }
    if let Vgpu::Unknown(reason) = &config.vgpu
        && !snapshot.gpus.is_empty()
    {
        out.push(format!(
            "Cannot read the vGPU capability, so nvidia.com/vgpu.present is false: {reason}"
        ));
    }
    out
}

/// The labels without the timestamp, for deciding whether anything changed.
pub fn without_timestamp(labels: &Labels) -> Labels {
    labels
        .iter()
        .filter(|(key, _)| *key != TIMESTAMP_LABEL)
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// GPUs whose identity is known (a GPU lost before it was ever read has no name and cannot be
/// labelled by model).
fn named_gpus(snapshot: &Snapshot) -> Vec<&Gpu> {
    snapshot
        .gpus
        .iter()
        .filter(|gpu| !gpu.name.is_empty())
        .collect()
}

/// `cuda.driver*` from the kernel driver version, `cuda.runtime*` from the CUDA driver API
/// version. A driver version that is not `X.Y[.Z]` gets no driver labels (GFD fails outright).
fn version_labels(out: &mut Labels, snapshot: &Snapshot) {
    let driver = &snapshot.node.driver_version;
    let parts: Vec<&str> = driver.split('.').collect();
    if (2..=3).contains(&parts.len()) {
        let rev = parts.get(2).copied().unwrap_or("");
        for (key, value) in [
            ("nvidia.com/cuda.driver.major", parts[0]),
            ("nvidia.com/cuda.driver.minor", parts[1]),
            ("nvidia.com/cuda.driver.rev", rev),
            ("nvidia.com/cuda.driver-version.major", parts[0]),
            ("nvidia.com/cuda.driver-version.minor", parts[1]),
            ("nvidia.com/cuda.driver-version.revision", rev),
            ("nvidia.com/cuda.driver-version.full", driver.as_str()),
        ] {
            out.insert(key.into(), value.into());
        }
    }
    if let Some((major, minor)) = snapshot
        .node
        .cuda_driver_version
        .as_deref()
        .and_then(|v| v.split_once('.'))
    {
        let full = format!("{major}.{minor}");
        for (key, value) in [
            ("nvidia.com/cuda.runtime.major", major),
            ("nvidia.com/cuda.runtime.minor", minor),
            ("nvidia.com/cuda.runtime-version.major", major),
            ("nvidia.com/cuda.runtime-version.minor", minor),
            ("nvidia.com/cuda.runtime-version.full", full.as_str()),
        ] {
            out.insert(key.into(), value.into());
        }
    }
}

/// `compute` or `graphics` when every GPU has that PCI class, else `unknown`.
fn gpu_mode(snapshot: &Snapshot, config: &LabelConfig) -> &'static str {
    let classes: Option<Vec<u32>> = snapshot
        .gpus
        .iter()
        .map(|gpu| config.pci_classes.get(&gpu.pci.bus_id).copied())
        .collect();
    let Some(classes) = classes else {
        return UNKNOWN;
    };
    match classes.split_first() {
        Some((first, rest)) if rest.iter().all(|c| c == first) => match *first {
            PCI_CLASS_COMPUTE => "compute",
            PCI_CLASS_GRAPHICS => "graphics",
            _ => UNKNOWN,
        },
        _ => UNKNOWN,
    }
}

// === fabric and vGPU ===

/// The clique label.
pub const CLIQUE_LABEL: &str = "nvidia.com/gpu.clique";

/// What the fabric-attached GPUs of a node have in common.
#[derive(Debug, Clone, PartialEq, Eq)]
enum FabricIds {
    /// No GPU is attached to a multi-node NVLink fabric.
    None,
    /// Every attached GPU has this `<cluster UUID>.<clique id>`.
    One(String),
    /// Attached GPUs disagree; the message names the values and the GPUs holding them.
    NonUnique(String),
}

/// GFD's rule (`getFabricIDs`): only fabric-attached GPUs count (the others are skipped, not
/// disqualifying), and they must agree on the cluster UUID and on the clique id.
fn fabric_ids(snapshot: &Snapshot) -> FabricIds {
    let mut uuids: BTreeMap<&str, Vec<u32>> = BTreeMap::new();
    let mut cliques: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    for gpu in &snapshot.gpus {
        if let Some(fabric) = gpu.fabric.as_ref().filter(|f| f.is_attached()) {
            uuids
                .entry(&fabric.cluster_uuid)
                .or_default()
                .push(gpu.index);
            cliques.entry(fabric.clique_id).or_default().push(gpu.index);
        }
    }
    let holders = |gpus: &[u32]| {
        let list: Vec<String> = gpus.iter().map(u32::to_string).collect();
        list.join(", ")
    };
    if uuids.len() > 1 {
        let found: Vec<String> = uuids
            .iter()
            .map(|(uuid, gpus)| format!("{uuid} (GPUs {})", holders(gpus)))
            .collect();
        return FabricIds::NonUnique(format!(
            "Cluster UUIDs are non-unique: {}",
            found.join(", ")
        ));
    }
    if cliques.len() > 1 {
        let found: Vec<String> = cliques
            .iter()
            .map(|(clique, gpus)| format!("{clique} (GPUs {})", holders(gpus)))
            .collect();
        return FabricIds::NonUnique(format!("Clique IDs are non-unique: {}", found.join(", ")));
    }
    match (uuids.keys().next(), cliques.keys().next()) {
        (Some(uuid), Some(clique)) => FabricIds::One(format!("{uuid}.{clique}")),
        _ => FabricIds::None,
    }
}

/// `nvidia.com/vgpu.present`, plus the host driver labels when a vGPU is found. A scan that
/// failed says `false`, as GFD has since v0.15 (the failure is a warning).
fn vgpu_labels(out: &mut Labels, vgpu: &Vgpu) {
    let present = matches!(vgpu, Vgpu::Present(_));
    out.insert("nvidia.com/vgpu.present".into(), present.to_string());
    if let Vgpu::Present(driver) = vgpu {
        out.insert(
            "nvidia.com/vgpu.host-driver-version".into(),
            driver.version.clone(),
        );
        out.insert(
            "nvidia.com/vgpu.host-driver-branch".into(),
            driver.branch.clone(),
        );
    }
}

// === resource labels ===

/// Writes `<resource>.<suffix>` labels for one resource.
struct Resource<'a> {
    name: String,
    /// `None` = sharing disabled (a MIG-enabled GPU labelled as a full GPU).
    sharing: Option<&'a Sharing>,
}

impl Resource<'_> {
    fn set(&self, out: &mut Labels, suffix: &str, value: impl ToString) {
        out.insert(format!("{}.{suffix}", self.name), value.to_string());
    }

    fn replicas(&self) -> u32 {
        match self.sharing {
            None => 0,
            Some(sharing) => sharing
                .resource(&self.name)
                .map_or(1, |r| r.replicas.max(1)),
        }
    }

    fn shared(&self) -> bool {
        self.replicas() > 1
    }

    fn renamed(&self) -> bool {
        self.sharing
            .and_then(|s| s.resource(&self.name))
            .is_some_and(|r| r.rename.is_some())
    }

    /// `product`, `count`, `replicas` and `sharing-strategy`.
    fn base(&self, out: &mut Labels, count: usize, parts: &[&str]) {
        let mut product: Vec<String> = parts
            .iter()
            .filter(|p| !p.is_empty())
            .map(|p| sanitise(p))
            .collect();
        if self.shared() && !self.renamed() {
            product.push("SHARED".into());
        }
        let replicas = self.replicas();
        let strategy = match self.sharing {
            Some(sharing) if replicas > 1 => sharing.strategy(),
            _ => SharingStrategy::None,
        };
        self.set(out, "product", product.join("-"));
        self.set(out, "count", count);
        self.set(out, "replicas", replicas);
        self.set(out, "sharing-strategy", strategy);
    }
}

fn resource_labels(out: &mut Labels, snapshot: &Snapshot, config: &LabelConfig) {
    let gpus = named_gpus(snapshot);
    full_gpu_labels(out, &gpus, config);
    match config.mig_strategy {
        MigStrategy::None => {}
        MigStrategy::Single => {
            out.insert("nvidia.com/mig.strategy".into(), "single".into());
            single_strategy_labels(out, &gpus, config);
        }
        MigStrategy::Mixed => {
            out.insert("nvidia.com/mig.strategy".into(), "mixed".into());
            let groups = mig_groups(&gpus);
            for (profile, (parent, mig, count)) in &groups {
                let resource = Resource {
                    name: format!("nvidia.com/mig-{profile}"),
                    sharing: Some(&config.sharing),
                };
                mig_device_labels(out, &resource, parent, mig, *count);
            }
        }
    }
}

/// Full-GPU labels per model: MIG-enabled models without sharing, then the others with
/// sharing; within each pass the lowest-index model is applied last so that it wins.
fn full_gpu_labels(out: &mut Labels, gpus: &[&Gpu], config: &LabelConfig) {
    let mut names: Vec<&str> = Vec::new();
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for gpu in gpus {
        if !names.contains(&gpu.name.as_str()) {
            names.push(&gpu.name);
        }
        *counts.entry(&gpu.name).or_default() += 1;
    }
    for mig_pass in [true, false] {
        for name in names.iter().rev() {
            // GFD keeps the last device of each name as the one it reads attributes from.
            let Some(gpu) = gpus
                .iter()
                .rev()
                .find(|g| g.name == *name && g.mig.enabled == mig_pass)
            else {
                continue;
            };
            let resource = Resource {
                name: GPU_RESOURCE.into(),
                sharing: (!mig_pass).then_some(&config.sharing),
            };
            resource.base(out, counts[name], &[name]);
            if gpu.memory_mib != 0 {
                resource.set(out, "memory", gpu.memory_mib);
            }
            if let Some((major, minor)) = compute_capability(gpu).filter(|(major, _)| *major != 0) {
                resource.set(out, "family", family_for(major, minor));
                resource.set(out, "compute.major", major);
                resource.set(out, "compute.minor", minor);
            }
        }
    }
}

fn compute_capability(gpu: &Gpu) -> Option<(i32, i32)> {
    let (major, minor) = gpu.compute_capability.as_deref()?.split_once('.')?;
    Some((major.parse().ok()?, minor.parse().ok()?))
}

/// The profile as GFD names the resource: NVIDIA's profile with `+` turned into `.`
/// (`1g.10gb+me` → `1g.10gb.me`).
fn resource_profile(mig: &MigDevice) -> String {
    mig.profile.replace('+', ".")
}

/// MIG devices grouped by profile: the first device of each (and its parent) with the count.
fn mig_groups<'a>(gpus: &[&'a Gpu]) -> BTreeMap<String, (&'a Gpu, &'a MigDevice, usize)> {
    let mut groups: BTreeMap<String, (&Gpu, &MigDevice, usize)> = BTreeMap::new();
    for gpu in gpus.iter().filter(|g| g.mig.enabled) {
        for mig in &gpu.mig.devices {
            groups
                .entry(resource_profile(mig))
                .and_modify(|(_, _, count)| *count += 1)
                .or_insert((gpu, mig, 1));
        }
    }
    groups
}

fn mig_device_labels(
    out: &mut Labels,
    resource: &Resource<'_>,
    parent: &Gpu,
    mig: &MigDevice,
    count: usize,
) {
    let profile = resource_profile(mig);
    resource.base(out, count, &[&parent.name, "MIG", &profile]);
    resource.set(out, "memory", mig.memory_mib);
    resource.set(out, "multiprocessors", mig.multiprocessors);
    resource.set(out, "slices.gi", mig.gpu_slices);
    resource.set(out, "slices.ci", mig.compute_slices);
    resource.set(out, "engines.copy", mig.engines.copy);
    resource.set(out, "engines.decoder", mig.engines.decoder);
    resource.set(out, "engines.encoder", mig.engines.encoder);
    resource.set(out, "engines.jpeg", mig.engines.jpeg);
    resource.set(out, "engines.ofa", mig.engines.ofa);
}

/// Why the node cannot be served with the `single` strategy, if it cannot.
fn single_strategy_problem(gpus: &[&Gpu]) -> Option<&'static str> {
    let enabled: Vec<&&Gpu> = gpus.iter().filter(|g| g.mig.enabled).collect();
    if enabled.is_empty() {
        return None;
    }
    if enabled.iter().any(|g| g.mig.devices.is_empty()) {
        return Some("at least one MIG device is enabled but empty");
    }
    if gpus.iter().any(|g| !g.mig.enabled) {
        return Some("devices with MIG enabled and disabled detected");
    }
    if mig_groups(gpus).len() != 1 {
        return Some("more than one MIG device type present on node");
    }
    None
}

fn single_strategy_labels(out: &mut Labels, gpus: &[&Gpu], config: &LabelConfig) {
    let Some(first_enabled) = gpus.iter().find(|g| g.mig.enabled) else {
        // No MIG-enabled GPU: the same labels as the `none` strategy.
        return;
    };
    if single_strategy_problem(gpus).is_some() {
        let gpu = GPU_RESOURCE;
        out.insert(
            format!("{gpu}.product"),
            format!("{}-MIG-INVALID", sanitise(&first_enabled.name)),
        );
        out.insert(format!("{gpu}.count"), "0".into());
        out.insert(format!("{gpu}.replicas"), "0".into());
        out.insert(format!("{gpu}.sharing-strategy"), String::new());
        out.insert(format!("{gpu}.memory"), "0".into());
        return;
    }
    let resource = Resource {
        name: GPU_RESOURCE.into(),
        sharing: Some(&config.sharing),
    };
    for (parent, mig, count) in mig_groups(gpus).values() {
        mig_device_labels(out, &resource, parent, mig, *count);
    }
}

// === gpud's labels ===

/// `gpud.io/gpu.health` (the worst state of any GPU or MIG device) and per-state counts of
/// GPUs and MIG devices.
fn health_labels(out: &mut Labels, snapshot: &Snapshot) {
    let mut gpu_counts = [0usize; 3];
    let mut mig_counts = [0usize; 3];
    let mut worst = HealthState::Healthy;
    let slot = |state: HealthState| match state {
        HealthState::Healthy => 0,
        HealthState::Degraded => 1,
        HealthState::Unhealthy => 2,
    };
    for gpu in &snapshot.gpus {
        gpu_counts[slot(gpu.health.state)] += 1;
        worst = worst.max(gpu.health.state);
        for mig in &gpu.mig.devices {
            mig_counts[slot(mig.health.state)] += 1;
            worst = worst.max(mig.health.state);
        }
    }
    let word = |state: HealthState| match state {
        HealthState::Healthy => "healthy",
        HealthState::Degraded => "degraded",
        HealthState::Unhealthy => "unhealthy",
    };
    out.insert(format!("{GPUD_PREFIX}gpu.health"), word(worst).into());
    for (i, state) in ["healthy", "degraded", "unhealthy"].iter().enumerate() {
        out.insert(
            format!("{GPUD_PREFIX}gpu.{state}"),
            gpu_counts[i].to_string(),
        );
    }
    if mig_counts.iter().sum::<usize>() > 0 {
        for (i, state) in ["healthy", "degraded", "unhealthy"].iter().enumerate() {
            out.insert(
                format!("{GPUD_PREFIX}mig.{state}"),
                mig_counts[i].to_string(),
            );
        }
    }
}

#[cfg(test)]
#[path = "labels_tests.rs"]
mod tests;
