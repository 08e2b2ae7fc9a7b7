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
use crate::inventory::model::{Gpu, MigDevice, Snapshot, family_for};
use crate::inventory::{HealthState, PciBusId};
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
    pub pci_classes: BTreeMap<PciBusId, u32>,
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
mod tests {
    //! Table tests of the label computation on every built-in simulated node.
    //!
    //! The snapshots are the inventory goldens (`tests/fixtures/golden/inventory/*.json`): what
    //! gpud discovers from the simulated NVML on each fixture, kept current by the inventory
    //! tests. Variants (sharing, MIG layouts, health) are derived from them.

    use std::collections::BTreeMap;
    use std::path::Path;

    use serde_json::Value;

    use super::*;
    use crate::inventory::Health;
    use crate::inventory::health::HealthSource;
    use crate::inventory::model::{Fabric, FabricState, Mig, MigEngines, Node, Pci, Placement};
    use crate::labeller::vgpu::HostDriver;
    use crate::nvidia_config::{self, Component, GivenFlags};

    const TS: u64 = 1_700_000_000;

    /// The snapshot gpud discovers on a built-in fixture (the fields labels read).
    fn fixture(name: &str) -> Snapshot {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/golden/inventory")
            .join(format!("{name}.json"));
        let json: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        snapshot_from_json(&json)
    }

    fn text(v: &Value) -> String {
        v.as_str().unwrap_or_default().to_owned()
    }

    fn opt_text(v: &Value) -> Option<String> {
        v.as_str().map(str::to_owned)
    }

    fn num(v: &Value) -> u64 {
        v.as_u64().unwrap()
    }

    fn health_from_json(v: &Value) -> Health {
        let state = match v["state"].as_str().unwrap() {
            "healthy" => HealthState::Healthy,
            "degraded" => HealthState::Degraded,
            _ => HealthState::Unhealthy,
        };
        Health {
            state,
            reason: opt_text(&v["reason"]),
            xid: v["xid"].as_u64().map(|x| x as u32),
            action: opt_text(&v["action"]),
            remedy: None,
            since: None,
            source: None,
        }
    }

    fn snapshot_from_json(json: &Value) -> Snapshot {
        let node = &json["node"];
        let gpus = json["gpus"]
            .as_array()
            .unwrap()
            .iter()
            .map(|g| Gpu {
                index: num(&g["index"]) as u32,
                minor_number: g["minor_number"].as_u64().map(|m| m as u32),
                device_node: opt_text(&g["device_node"]),
                uuid: text(&g["uuid"]),
                serial: opt_text(&g["serial"]),
                name: text(&g["name"]),
                brand: opt_text(&g["brand"]),
                architecture: opt_text(&g["architecture"]),
                family: opt_text(&g["family"]),
                compute_capability: opt_text(&g["compute_capability"]),
                memory_mib: num(&g["memory_mib"]),
                pci: Pci {
                    bus_id: text(&g["pci"]["bus_id"]).into(),
                    device_id: text(&g["pci"]["device_id"]),
                    subsystem_id: opt_text(&g["pci"]["subsystem_id"]),
                },
                numa_node: g["numa_node"].as_u64().map(|n| n as u32),
                power_limit_watts: g["power_limit_watts"].as_f64(),
                mig: Mig {
                    capable: g["mig"]["capable"].as_bool().unwrap(),
                    enabled: g["mig"]["enabled"].as_bool().unwrap(),
                    pending_enabled: g["mig"]["pending_enabled"].as_bool().unwrap(),
                    reconfiguring: false,
                    devices: g["mig"]["devices"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|m| MigDevice {
                            index: num(&m["index"]) as u32,
                            uuid: text(&m["uuid"]),
                            gpu_instance_id: num(&m["gpu_instance_id"]) as u32,
                            compute_instance_id: num(&m["compute_instance_id"]) as u32,
                            profile: text(&m["profile"]),
                            memory_mib: num(&m["memory_mib"]),
                            multiprocessors: num(&m["multiprocessors"]) as u32,
                            gpu_slices: num(&m["gpu_slices"]) as u32,
                            compute_slices: num(&m["compute_slices"]) as u32,
                            engines: MigEngines {
                                copy: num(&m["engines"]["copy"]) as u32,
                                decoder: num(&m["engines"]["decoder"]) as u32,
                                encoder: num(&m["engines"]["encoder"]) as u32,
                                jpeg: num(&m["engines"]["jpeg"]) as u32,
                                ofa: num(&m["engines"]["ofa"]) as u32,
                            },
                            placement: m["placement"].as_object().map(|p| Placement {
                                start: p["start"].as_u64().unwrap() as u32,
                                size: p["size"].as_u64().unwrap() as u32,
                            }),
                            gpu_instance_profile_id: None,
                            health: health_from_json(&m["health"]),
                        })
                        .collect(),
                },
                // Links and topology do not affect labels.
                nvlinks: Vec::new(),
                fabric: serde_json::from_value(g["fabric"].clone()).unwrap(),
                health: health_from_json(&g["health"]),
                remediation: None,
                device_taints: Vec::new(),
            })
            .collect();
        Snapshot {
            node: Node {
                hostname: text(&node["hostname"]),
                driver_version: text(&node["driver_version"]),
                cuda_driver_version: opt_text(&node["cuda_driver_version"]),
                nvml_version: opt_text(&node["nvml_version"]),
                machine_type: opt_text(&node["machine_type"]),
            },
            gpus,
            topology: Vec::new(),
        }
    }

    /// Settings as the labeller would resolve them from a config file's text.
    fn config_from(yaml: &str, snapshot: &Snapshot) -> LabelConfig {
        let parsed = nvidia_config::parse(Path::new("/config.yaml"), yaml).unwrap();
        let resolved = nvidia_config::resolve(
            Some((Path::new("/config.yaml"), &parsed)),
            GivenFlags::default(),
            &std::collections::HashMap::new(),
            Component::FeatureDiscovery,
        )
        .unwrap();
        LabelConfig {
            mig_strategy: resolved.flags.mig_strategy,
            sharing: resolved.sharing,
            timestamp: Some(TS),
            machine_type: snapshot.node.machine_type.clone(),
            pci_classes: all_compute(snapshot),
            vgpu: Vgpu::Absent,
            health_labels: false,
        }
    }

    fn all_compute(snapshot: &Snapshot) -> BTreeMap<PciBusId, u32> {
        snapshot
            .gpus
            .iter()
            .map(|gpu| (gpu.pci.bus_id.clone(), PCI_CLASS_COMPUTE))
            .collect()
    }

    /// Labels as `key=value` lines, sorted, for exact comparison.
    fn lines(labels: &Labels) -> String {
        labels.iter().map(|(k, v)| format!("{k}={v}\n")).collect()
    }

    fn expect(snapshot: &Snapshot, config: &LabelConfig, want: &str) {
        let got = lines(&labels(snapshot, config));
        let want: String = want
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(|l| format!("{l}\n"))
            .collect();
        assert_eq!(got, want, "\n--- got\n{got}--- want\n{want}");
    }

    /// Node-wide labels every fixture with GPUs shares (driver 570.133.20, CUDA 12.8).
    const COMMON: &str = "
nvidia.com/cuda.driver-version.full=570.133.20
nvidia.com/cuda.driver-version.major=570
nvidia.com/cuda.driver-version.minor=133
nvidia.com/cuda.driver-version.revision=20
nvidia.com/cuda.driver.major=570
nvidia.com/cuda.driver.minor=133
nvidia.com/cuda.driver.rev=20
nvidia.com/cuda.runtime-version.full=12.8
nvidia.com/cuda.runtime-version.major=12
nvidia.com/cuda.runtime-version.minor=8
nvidia.com/cuda.runtime.major=12
nvidia.com/cuda.runtime.minor=8
nvidia.com/gfd.timestamp=1700000000
nvidia.com/gpu.machine=DGX-Test
nvidia.com/vgpu.present=false
";

    fn with_common(rest: &str) -> String {
        let mut all: Vec<&str> = COMMON
            .lines()
            .chain(rest.lines())
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect();
        all.sort_unstable();
        all.join("\n")
    }

    #[test]
    fn dgx_h100_no_sharing() {
        let node = fixture("dgx-h100");
        let config = config_from("", &node);
        expect(
            &node,
            &config,
            &with_common(
                "
            nvidia.com/gpu.compute.major=9
            nvidia.com/gpu.compute.minor=0
            nvidia.com/gpu.count=8
            nvidia.com/gpu.family=hopper
            nvidia.com/gpu.memory=81559
            nvidia.com/gpu.mode=compute
            nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3
            nvidia.com/gpu.replicas=1
            nvidia.com/gpu.sharing-strategy=none
            nvidia.com/mig.capable=true
            nvidia.com/mps.capable=false
            ",
            ),
        );
    }

    #[test]
    fn dgx_h100_time_slicing_shared_and_renamed() {
        let node = fixture("dgx-h100");
        let shared = config_from(
            "sharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 4\n",
            &node,
        );
        let got = labels(&node, &shared);
        assert_eq!(
            got["nvidia.com/gpu.product"],
            "NVIDIA-H100-80GB-HBM3-SHARED"
        );
        assert_eq!(got["nvidia.com/gpu.replicas"], "4");
        assert_eq!(
            got["nvidia.com/gpu.count"], "8",
            "count is GPUs, not replicas"
        );
        assert_eq!(got["nvidia.com/gpu.sharing-strategy"], "time-slicing");
        assert_eq!(got["nvidia.com/mps.capable"], "false");

        let renamed = config_from(
            "sharing:\n  timeSlicing:\n    renameByDefault: true\n    resources:\n    - name: gpu\n      replicas: 4\n",
            &node,
        );
        let got = labels(&node, &renamed);
        assert_eq!(got["nvidia.com/gpu.product"], "NVIDIA-H100-80GB-HBM3");
        assert_eq!(got["nvidia.com/gpu.replicas"], "4");
        assert_eq!(got["nvidia.com/gpu.sharing-strategy"], "time-slicing");
        assert!(!got.keys().any(|k| k.starts_with("nvidia.com/gpu.shared")));
    }

    #[test]
    fn dgx_h100_mps() {
        let node = fixture("dgx-h100");
        let config = config_from(
            "sharing:\n  mps:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 2\n",
            &node,
        );
        let got = labels(&node, &config);
        assert_eq!(got["nvidia.com/mps.capable"], "true");
        assert_eq!(
            got["nvidia.com/gpu.product"],
            "NVIDIA-H100-80GB-HBM3-SHARED"
        );
        assert_eq!(got["nvidia.com/gpu.replicas"], "2");
        assert_eq!(got["nvidia.com/gpu.sharing-strategy"], "mps");
    }

    #[test]
    fn dgx_a100_and_pcie_4gpu() {
        for (fixture_name, product) in [
            ("dgx-a100", "NVIDIA-A100-SXM4-80GB"),
            ("pcie-4gpu", "NVIDIA-A100-80GB-PCIe"),
        ] {
            let node = fixture(fixture_name);
            let count = node.gpus.len();
            expect(
                &node,
                &config_from("", &node),
                &with_common(&format!(
                    "
                nvidia.com/gpu.compute.major=8
                nvidia.com/gpu.compute.minor=0
                nvidia.com/gpu.count={count}
                nvidia.com/gpu.family=ampere
                nvidia.com/gpu.memory=81920
                nvidia.com/gpu.mode=compute
                nvidia.com/gpu.product={product}
                nvidia.com/gpu.replicas=1
                nvidia.com/gpu.sharing-strategy=none
                nvidia.com/mig.capable=true
                nvidia.com/mps.capable=false
                "
                )),
            );
        }
    }

    #[test]
    fn mixed_models_lowest_index_model_wins() {
        let node = fixture("mixed");
        let mut config = config_from("", &node);
        // The L40S has a display engine: a VGA controller, unlike the A100s.
        for gpu in node.gpus.iter().filter(|g| g.name.contains("L40S")) {
            config
                .pci_classes
                .insert(gpu.pci.bus_id.clone(), PCI_CLASS_GRAPHICS);
        }
        expect(
            &node,
            &config,
            &with_common(
                "
            nvidia.com/gpu.compute.major=8
            nvidia.com/gpu.compute.minor=0
            nvidia.com/gpu.count=2
            nvidia.com/gpu.family=ampere
            nvidia.com/gpu.memory=40960
            nvidia.com/gpu.mode=unknown
            nvidia.com/gpu.product=NVIDIA-A100-SXM4-40GB
            nvidia.com/gpu.replicas=1
            nvidia.com/gpu.sharing-strategy=none
            nvidia.com/mig.capable=true
            nvidia.com/mps.capable=false
            ",
            ),
        );
        assert_eq!(
            warnings(&node, &config),
            vec!["Multiple device types detected: NVIDIA A100-SXM4-40GB, NVIDIA L40S".to_owned()]
        );
        // Only the L40S: ada-lovelace by compute capability 8.9, graphics by PCI class.
        let mut l40s = node.clone();
        l40s.gpus.retain(|g| g.name.contains("L40S"));
        let got = labels(&l40s, &config);
        assert_eq!(got["nvidia.com/gpu.family"], "ada-lovelace");
        assert_eq!(got["nvidia.com/gpu.mode"], "graphics");
        assert_eq!(got["nvidia.com/mig.capable"], "false");
    }

    const A100_FULL_NO_SHARING: &str = "
nvidia.com/gpu.compute.major=8
nvidia.com/gpu.compute.minor=0
nvidia.com/gpu.count=1
nvidia.com/gpu.family=ampere
nvidia.com/gpu.memory=81920
nvidia.com/gpu.mode=compute
nvidia.com/gpu.product=NVIDIA-A100-SXM4-80GB
nvidia.com/gpu.replicas=0
nvidia.com/gpu.sharing-strategy=none
nvidia.com/mig.capable=true
nvidia.com/mps.capable=false
";

    #[test]
    fn a100_mig_strategy_none_labels_the_whole_gpu_without_sharing() {
        let node = fixture("a100-mig");
        // Sharing does not apply to a MIG-enabled GPU labelled as a whole GPU.
        let config = config_from(
            "sharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 4\n",
            &node,
        );
        expect(&node, &config, &with_common(A100_FULL_NO_SHARING));
    }

    #[test]
    fn a100_mig_strategy_mixed() {
        let node = fixture("a100-mig");
        let config = config_from("flags:\n  migStrategy: mixed\n", &node);
        let mig = "
        nvidia.com/mig-1g.10gb.count=1
        nvidia.com/mig-1g.10gb.engines.copy=1
        nvidia.com/mig-1g.10gb.engines.decoder=0
        nvidia.com/mig-1g.10gb.engines.encoder=0
        nvidia.com/mig-1g.10gb.engines.jpeg=0
        nvidia.com/mig-1g.10gb.engines.ofa=0
        nvidia.com/mig-1g.10gb.memory=9728
        nvidia.com/mig-1g.10gb.multiprocessors=14
        nvidia.com/mig-1g.10gb.product=NVIDIA-A100-SXM4-80GB-MIG-1g.10gb
        nvidia.com/mig-1g.10gb.replicas=1
        nvidia.com/mig-1g.10gb.sharing-strategy=none
        nvidia.com/mig-1g.10gb.slices.ci=1
        nvidia.com/mig-1g.10gb.slices.gi=1
        nvidia.com/mig-2g.20gb.count=1
        nvidia.com/mig-2g.20gb.engines.copy=2
        nvidia.com/mig-2g.20gb.engines.decoder=1
        nvidia.com/mig-2g.20gb.engines.encoder=0
        nvidia.com/mig-2g.20gb.engines.jpeg=0
        nvidia.com/mig-2g.20gb.engines.ofa=0
        nvidia.com/mig-2g.20gb.memory=19968
        nvidia.com/mig-2g.20gb.multiprocessors=28
        nvidia.com/mig-2g.20gb.product=NVIDIA-A100-SXM4-80GB-MIG-2g.20gb
        nvidia.com/mig-2g.20gb.replicas=1
        nvidia.com/mig-2g.20gb.sharing-strategy=none
        nvidia.com/mig-2g.20gb.slices.ci=2
        nvidia.com/mig-2g.20gb.slices.gi=2
        nvidia.com/mig-3g.40gb.count=1
        nvidia.com/mig-3g.40gb.engines.copy=3
        nvidia.com/mig-3g.40gb.engines.decoder=2
        nvidia.com/mig-3g.40gb.engines.encoder=0
        nvidia.com/mig-3g.40gb.engines.jpeg=0
        nvidia.com/mig-3g.40gb.engines.ofa=0
        nvidia.com/mig-3g.40gb.memory=40192
        nvidia.com/mig-3g.40gb.multiprocessors=42
        nvidia.com/mig-3g.40gb.product=NVIDIA-A100-SXM4-80GB-MIG-3g.40gb
        nvidia.com/mig-3g.40gb.replicas=1
        nvidia.com/mig-3g.40gb.sharing-strategy=none
        nvidia.com/mig-3g.40gb.slices.ci=3
        nvidia.com/mig-3g.40gb.slices.gi=3
        nvidia.com/mig.strategy=mixed
    ";
        expect(
            &node,
            &config,
            &with_common(&format!("{A100_FULL_NO_SHARING}{mig}")),
        );

        // Time-slicing a MIG profile: the MIG resource is shared, the parent GPU is not.
        let shared = config_from(
            "flags:\n  migStrategy: mixed\nsharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/mig-1g.10gb\n      replicas: 3\n",
            &node,
        );
        let got = labels(&node, &shared);
        assert_eq!(
            got["nvidia.com/mig-1g.10gb.product"],
            "NVIDIA-A100-SXM4-80GB-MIG-1g.10gb-SHARED"
        );
        assert_eq!(got["nvidia.com/mig-1g.10gb.replicas"], "3");
        assert_eq!(
            got["nvidia.com/mig-1g.10gb.sharing-strategy"],
            "time-slicing"
        );
        assert_eq!(got["nvidia.com/mig-2g.20gb.replicas"], "1");
        assert_eq!(got["nvidia.com/gpu.replicas"], "0");
    }

    #[test]
    fn a100_mig_strategy_single_invalid_cases() {
        let invalid = "
        nvidia.com/gpu.count=0
        nvidia.com/gpu.memory=0
        nvidia.com/gpu.product=NVIDIA-A100-SXM4-80GB-MIG-INVALID
        nvidia.com/gpu.replicas=0
        nvidia.com/gpu.sharing-strategy=
        nvidia.com/mig.strategy=single
    ";
        let overlay = |base: &str| -> String {
            // Invalid labels overwrite the full-GPU ones with the same key.
            let mut map: BTreeMap<String, String> = BTreeMap::new();
            for line in base
                .lines()
                .chain(invalid.lines())
                .map(str::trim)
                .filter(|l| !l.is_empty())
            {
                let (k, v) = line.split_once('=').unwrap();
                map.insert(k.to_owned(), v.to_owned());
            }
            with_common(
                &map.iter()
                    .map(|(k, v)| format!("{k}={v}\n"))
                    .collect::<String>(),
            )
        };

        // Three MIG profiles on one GPU.
        let node = fixture("a100-mig");
        let config = config_from("flags:\n  migStrategy: single\n", &node);
        expect(&node, &config, &overlay(A100_FULL_NO_SHARING));
        assert_eq!(
        warnings(&node, &config),
        vec!["Invalid configuration detected for mig-strategy=single: more than one MIG device type present on node".to_owned()]
    );

        // MIG enabled but no MIG devices.
        let mut empty = node.clone();
        empty.gpus[0].mig.devices.clear();
        expect(&empty, &config, &overlay(A100_FULL_NO_SHARING));
        assert!(
            warnings(&empty, &config)[0].ends_with("at least one MIG device is enabled but empty")
        );

        // A MIG-enabled GPU next to MIG-disabled ones (GPU 0 of the DGX A100 with the layout of
        // a100-mig): the full GPUs' labels stay underneath.
        let mut half = fixture("dgx-a100");
        half.gpus[0].mig = node.gpus[0].mig.clone();
        let config = config_from("flags:\n  migStrategy: single\n", &half);
        let full = A100_FULL_NO_SHARING
            .replace("gpu.count=1", "gpu.count=8")
            .replace("gpu.replicas=0", "gpu.replicas=1");
        expect(&half, &config, &overlay(&full));
        assert!(
            warnings(&half, &config)[0].ends_with("devices with MIG enabled and disabled detected")
        );
    }

    #[test]
    fn a100_mig_strategy_single_valid() {
        // One MIG profile on every MIG-enabled GPU: the MIG devices are nvidia.com/gpu.
        let mut node = fixture("a100-mig");
        node.gpus[0].mig.devices.retain(|m| m.profile == "1g.10gb");
        let config = config_from("flags:\n  migStrategy: single\n", &node);
        expect(
            &node,
            &config,
            &with_common(
                "
            nvidia.com/gpu.compute.major=8
            nvidia.com/gpu.compute.minor=0
            nvidia.com/gpu.count=1
            nvidia.com/gpu.engines.copy=1
            nvidia.com/gpu.engines.decoder=0
            nvidia.com/gpu.engines.encoder=0
            nvidia.com/gpu.engines.jpeg=0
            nvidia.com/gpu.engines.ofa=0
            nvidia.com/gpu.family=ampere
            nvidia.com/gpu.memory=9728
            nvidia.com/gpu.mode=compute
            nvidia.com/gpu.multiprocessors=14
            nvidia.com/gpu.product=NVIDIA-A100-SXM4-80GB-MIG-1g.10gb
            nvidia.com/gpu.replicas=1
            nvidia.com/gpu.sharing-strategy=none
            nvidia.com/gpu.slices.ci=1
            nvidia.com/gpu.slices.gi=1
            nvidia.com/mig.capable=true
            nvidia.com/mig.strategy=single
            nvidia.com/mps.capable=false
            ",
            ),
        );
        assert!(warnings(&node, &config).is_empty());

        // Without MIG-enabled GPUs, single labels like none plus the strategy.
        let node = fixture("dgx-h100");
        let got = labels(
            &node,
            &config_from("flags:\n  migStrategy: single\n", &node),
        );
        assert_eq!(got["nvidia.com/mig.strategy"], "single");
        assert_eq!(got["nvidia.com/gpu.product"], "NVIDIA-H100-80GB-HBM3");
        assert_eq!(got["nvidia.com/gpu.count"], "8");
    }

    #[test]
    fn mig_attribute_suffixes_become_dots() {
        let mut node = fixture("a100-mig");
        node.gpus[0].mig.devices.retain(|m| m.profile == "1g.10gb");
        node.gpus[0].mig.devices[0].profile = "1g.10gb+me".into();
        let got = labels(&node, &config_from("flags:\n  migStrategy: mixed\n", &node));
        assert_eq!(
            got["nvidia.com/mig-1g.10gb.me.product"],
            "NVIDIA-A100-SXM4-80GB-MIG-1g.10gb.me"
        );
        assert_eq!(got["nvidia.com/mig-1g.10gb.me.count"], "1");
    }

    #[test]
    fn empty_node_has_only_the_timestamp() {
        let node = fixture("empty");
        let mut config = config_from("", &node);
        expect(&node, &config, "nvidia.com/gfd.timestamp=1700000000");
        config.timestamp = None;
        assert!(labels(&node, &config).is_empty());
        config.health_labels = true;
        assert!(labels(&node, &config).is_empty());
    }

    #[test]
    fn no_timestamp_and_unknown_machine() {
        let node = fixture("pcie-4gpu");
        let mut config = config_from("", &node);
        config.timestamp = None;
        config.machine_type = None;
        let got = labels(&node, &config);
        assert!(!got.contains_key(TIMESTAMP_LABEL));
        assert_eq!(got["nvidia.com/gpu.machine"], "unknown");
    }

    #[test]
    fn gpu_mode_needs_every_class() {
        let node = fixture("pcie-4gpu");
        let mut config = config_from("", &node);
        assert_eq!(labels(&node, &config)["nvidia.com/gpu.mode"], "compute");
        config.pci_classes.remove(&node.gpus[3].pci.bus_id);
        assert_eq!(labels(&node, &config)["nvidia.com/gpu.mode"], "unknown");
        config.pci_classes = node
            .gpus
            .iter()
            .map(|g| (g.pci.bus_id.clone(), 0x0b_40_00))
            .collect();
        assert_eq!(labels(&node, &config)["nvidia.com/gpu.mode"], "unknown");
        config.pci_classes = node
            .gpus
            .iter()
            .map(|g| (g.pci.bus_id.clone(), PCI_CLASS_GRAPHICS))
            .collect();
        assert_eq!(labels(&node, &config)["nvidia.com/gpu.mode"], "graphics");
    }

    #[test]
    fn health_summary_labels() {
        let mut node = fixture("a100-mig");
        let mut config = config_from("", &node);
        config.health_labels = true;
        let got = labels(&node, &config);
        let gpud: Vec<String> = got
            .iter()
            .filter(|(k, _)| k.starts_with(GPUD_PREFIX))
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        assert_eq!(
            gpud,
            [
                "gpud.io/gpu.degraded=0",
                "gpud.io/gpu.health=healthy",
                "gpud.io/gpu.healthy=1",
                "gpud.io/gpu.unhealthy=0",
                "gpud.io/mig.degraded=0",
                "gpud.io/mig.healthy=3",
                "gpud.io/mig.unhealthy=0",
            ]
        );
        // An XID attributed to one MIG instance.
        node.gpus[0].mig.devices[1].health = Health {
            state: HealthState::Unhealthy,
            reason: Some("XID 94".into()),
            xid: Some(94),
            action: None,
            remedy: None,
            since: None,
            source: Some(HealthSource::Watcher),
        };
        let got = labels(&node, &config);
        assert_eq!(got["gpud.io/gpu.health"], "unhealthy");
        assert_eq!(got["gpud.io/gpu.healthy"], "1");
        assert_eq!(got["gpud.io/mig.unhealthy"], "1");
        assert_eq!(got["gpud.io/mig.healthy"], "2");

        // A lost GPU on the H100 node; no MIG devices, so no mig.* counts.
        let mut h100 = fixture("dgx-h100");
        h100.gpus[5].health = Health::lost(std::time::UNIX_EPOCH);
        let got = labels(&h100, &config);
        assert_eq!(got["gpud.io/gpu.health"], "unhealthy");
        assert_eq!(got["gpud.io/gpu.unhealthy"], "1");
        assert_eq!(got["gpud.io/gpu.healthy"], "7");
        assert!(!got.contains_key("gpud.io/mig.healthy"));
        // GFD's labels do not change with health.
        assert_eq!(got["nvidia.com/gpu.count"], "8");
    }

    #[test]
    fn every_label_is_valid_kubernetes_syntax() {
        use super::super::syntax::{is_valid_label_key, is_valid_label_value};
        let configs = [
            "",
            "flags:\n  migStrategy: single\n",
            "flags:\n  migStrategy: mixed\n",
            "sharing:\n  timeSlicing:\n    resources:\n    - {name: gpu, replicas: 4}\n",
            "sharing:\n  mps:\n    resources:\n    - {name: gpu, replicas: 4}\n",
        ];
        for name in [
            "dgx-h100",
            "dgx-a100",
            "pcie-4gpu",
            "mixed",
            "a100-mig",
            "empty",
            "gb200-nvl",
        ] {
            let node = fixture(name);
            for yaml in configs {
                let mut config = config_from(yaml, &node);
                config.health_labels = true;
                for (key, value) in labels(&node, &config) {
                    assert!(is_valid_label_key(&key), "{name}: key {key}");
                    assert!(is_valid_label_value(&value), "{name}: {key}={value}");
                }
            }
        }
    }

    const GB200: &str = "
nvidia.com/gpu.compute.major=10
nvidia.com/gpu.compute.minor=0
nvidia.com/gpu.count=4
nvidia.com/gpu.family=blackwell
nvidia.com/gpu.memory=189471
nvidia.com/gpu.mode=compute
nvidia.com/gpu.product=NVIDIA-GB200
nvidia.com/gpu.replicas=1
nvidia.com/gpu.sharing-strategy=none
nvidia.com/mig.capable=false
nvidia.com/mps.capable=false
";

    const GB200_CLIQUE: &str = "3f5a0c2e-9b1d-4e7a-8c63-1d2e4f5a6b7c.32766";

    #[test]
    fn gb200_fabric_attached_gpus_label_their_clique() {
        let node = fixture("gb200-nvl");
        let config = config_from("", &node);
        expect(
            &node,
            &config,
            &with_common(&format!("{GB200}nvidia.com/gpu.clique={GB200_CLIQUE}")),
        );
        assert!(warnings(&node, &config).is_empty());
        // GPUs outside a multi-node fabric: no clique.
        let h100 = fixture("dgx-h100");
        assert!(h100.gpus.iter().all(|g| g.fabric.is_none()));
        assert!(!labels(&h100, &config_from("", &h100)).contains_key(CLIQUE_LABEL));
    }

    fn fabric(gpu: &mut Gpu) -> &mut Fabric {
        gpu.fabric.as_mut().unwrap()
    }

    #[test]
    fn gpus_not_attached_to_the_fabric_are_skipped() {
        let mut node = fixture("gb200-nvl");
        let config = config_from("", &node);
        // One GPU of each way of not being attached; GPU 0 alone still names the clique.
        node.gpus[1].fabric = None;
        fabric(&mut node.gpus[2]).state = FabricState::InProgress;
        fabric(&mut node.gpus[2]).clique_id = 1;
        fabric(&mut node.gpus[3]).status = 999;
        fabric(&mut node.gpus[3]).clique_id = 2;
        expect(
            &node,
            &config,
            &with_common(&format!("{GB200}nvidia.com/gpu.clique={GB200_CLIQUE}")),
        );
        assert!(warnings(&node, &config).is_empty());

        // Registration completed without a cluster UUID (an NVSwitch system that is not part of a
        // multi-node fabric): not attached, so no GPU is and there is no clique.
        fabric(&mut node.gpus[0]).cluster_uuid = crate::inventory::model::NO_CLUSTER_UUID.into();
        expect(&node, &config, &with_common(GB200));
        assert!(warnings(&node, &config).is_empty());
        node.gpus[0].fabric = Some(Fabric {
            state: FabricState::NotStarted,
            status: 0,
            cluster_uuid: "3f5a0c2e-9b1d-4e7a-8c63-1d2e4f5a6b7c".into(),
            clique_id: 32766,
        });
        expect(&node, &config, &with_common(GB200));
    }

    #[test]
    fn attached_gpus_that_disagree_get_no_clique() {
        let node = fixture("gb200-nvl");
        let config = config_from("", &node);

        let mut cliques = node.clone();
        fabric(&mut cliques.gpus[2]).clique_id = 32767;
        fabric(&mut cliques.gpus[3]).clique_id = 32767;
        expect(&cliques, &config, &with_common(GB200));
        assert_eq!(
            warnings(&cliques, &config),
            vec![
                "Clique IDs are non-unique: 32766 (GPUs 0, 1), 32767 (GPUs 2, 3); \
             nvidia.com/gpu.clique is not set"
                    .to_owned()
            ]
        );

        let mut clusters = node.clone();
        fabric(&mut clusters.gpus[1]).cluster_uuid = "0c2e3f5a-9b1d-4e7a-8c63-1d2e4f5a6b7c".into();
        expect(&clusters, &config, &with_common(GB200));
        assert_eq!(
            warnings(&clusters, &config),
            vec![
                "Cluster UUIDs are non-unique: 0c2e3f5a-9b1d-4e7a-8c63-1d2e4f5a6b7c (GPUs 1), \
             3f5a0c2e-9b1d-4e7a-8c63-1d2e4f5a6b7c (GPUs 0, 2, 3); nvidia.com/gpu.clique is not set"
                    .to_owned()
            ]
        );
    }

    #[test]
    fn vgpu_labels() {
        let node = fixture("pcie-4gpu");
        let mut config = config_from("", &node);
        let vgpu_keys = |config: &LabelConfig| -> Vec<String> {
            labels(&node, config)
                .iter()
                .filter(|(k, _)| k.starts_with("nvidia.com/vgpu."))
                .map(|(k, v)| format!("{k}={v}"))
                .collect()
        };
        assert_eq!(vgpu_keys(&config), ["nvidia.com/vgpu.present=false"]);
        assert!(warnings(&node, &config).is_empty());

        config.vgpu = Vgpu::Present(HostDriver {
            version: "550.90.05".into(),
            branch: "r550_00".into(),
        });
        assert_eq!(
            vgpu_keys(&config),
            [
                "nvidia.com/vgpu.host-driver-branch=r550_00",
                "nvidia.com/vgpu.host-driver-version=550.90.05",
                "nvidia.com/vgpu.present=true",
            ]
        );

        config.vgpu = Vgpu::Unknown("PCI device 0000:01:00.0: only 64 bytes …".into());
        assert_eq!(vgpu_keys(&config), ["nvidia.com/vgpu.present=false"]);
        assert_eq!(
            warnings(&node, &config),
            vec![
                "Cannot read the vGPU capability, so nvidia.com/vgpu.present is false: \
             PCI device 0000:01:00.0: only 64 bytes …"
                    .to_owned()
            ]
        );

        // A node without GPUs gets no vGPU labels (or warnings) either.
        let empty = fixture("empty");
        assert_eq!(
            lines(&labels(&empty, &config)),
            "nvidia.com/gfd.timestamp=1700000000\n"
        );
        assert!(warnings(&empty, &config).is_empty());
    }
}
