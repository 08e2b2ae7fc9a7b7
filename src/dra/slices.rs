//! The node's ResourceSlices, built from the inventory: every device with NVIDIA's name,
//! attributes and capacities, split over as many slices as the API's per-slice limits need.
//!
//! Attributes (unqualified names are in the driver's domain, `gpu.nvidia.com`):
//!
//! | device | attributes | capacity |
//! |---|---|---|
//! | GPU | `type`=`gpu`, `uuid`, `productName`, `brand`, `architecture`, `cudaComputeCapability`, `driverVersion`, `cudaDriverVersion`, `resource.kubernetes.io/pciBusID`, and the topology's ([`super::topology`]): `resource.kubernetes.io/pcieRoot`, `resource.kubernetes.io/numaNode`, `nvlinkDomain` | `memory` |
//! | MIG | `type`=`mig`, `uuid`, `parentUUID`, `profile`, the parent's product, brand, architecture, versions, PCI bus id and topology | `multiprocessors`, `copyEngines`, `decoders`, `encoders`, `jpegEngines`, `ofaEngines`, `memory`, `memorySlice<N>` per slice of the placement |
//!
//! Versions are semantic versions (`9.0` → `9.0.0`, `535.54.03` → `535.54.3`), so CEL's
//! `semver()` comparisons work. Attributes the inventory does not know are left out rather
//! than written empty.

use std::collections::BTreeMap;

use super::objects::{Attribute, Capacity, Device, Pool, SliceSpec};
use super::taints;
use super::topology::Topology;
use crate::dra_names::{self, DraDevice};
use crate::inventory::Snapshot;

/// Most devices in one slice.
pub const MAX_DEVICES: usize = 128;
/// Most devices in one slice when any of them has taints (or list-type attributes).
pub const MAX_DEVICES_WITH_TAINTS: usize = 64;
/// The standard attribute for a device's PCI address.
pub const PCI_BUS_ID: &str = "resource.kubernetes.io/pciBusID";

const MIB: u64 = 1024 * 1024;

/// The devices of the node, in inventory order, with the topology attributes of their GPUs.
pub fn devices(snapshot: &Snapshot, driver: &str, topology: &Topology) -> Vec<Device> {
    dra_names::devices(snapshot)
        .map(|(name, found)| device(snapshot, driver, topology, name, &found))
        .collect()
}

/// One device as [`devices`] builds it, whether or not the node lists it now: a
/// dynamic-MIG GPU is published whole even while MIG is on ([`super::partitions`]).
pub fn device(
    snapshot: &Snapshot,
    driver: &str,
    topology: &Topology,
    name: String,
    device: &DraDevice<'_>,
) -> Device {
    Device {
        attributes: attributes(snapshot, device, topology),
        capacity: capacity(device),
        taints: taints::taints(driver, device),
        name,
        ..Device::default()
    }
}

/// The slice specs of pool `node` at `generation`: the devices split in order, each slice at
/// most [`MAX_DEVICES`] long ([`MAX_DEVICES_WITH_TAINTS`] when one of its devices has taints
/// or a list-type attribute, as the API's validation counts them).
/// A node without devices still gets one (empty) slice, so consumers see the pool is complete.
pub fn specs(driver: &str, node: &str, devices: Vec<Device>, generation: i64) -> Vec<SliceSpec> {
    let mut chunks: Vec<Vec<Device>> = Vec::new();
    let mut current: Vec<Device> = Vec::new();
    for device in devices {
        let tainted = needs_small_slice(&device) || current.iter().any(needs_small_slice);
        let limit = if tainted {
            MAX_DEVICES_WITH_TAINTS
        } else {
            MAX_DEVICES
        };
        if current.len() >= limit {
            chunks.push(std::mem::take(&mut current));
        }
        current.push(device);
    }
    if !current.is_empty() || chunks.is_empty() {
        chunks.push(current);
    }
    let count = i64::try_from(chunks.len()).unwrap_or(i64::MAX);
    chunks
        .into_iter()
        .map(|devices| SliceSpec {
            driver: driver.to_owned(),
            pool: Pool {
                name: node.to_owned(),
                generation,
                resource_slice_count: count,
            },
            node_name: node.to_owned(),
            devices,
            shared_counters: Vec::new(),
        })
        .collect()
}

/// A device with taints or list-type attributes holds its slice to
/// [`MAX_DEVICES_WITH_TAINTS`].
fn needs_small_slice(device: &Device) -> bool {
    !device.taints.is_empty() || device.attributes.values().any(Attribute::is_list)
}

fn attributes(
    snapshot: &Snapshot,
    device: &DraDevice<'_>,
    topology: &Topology,
) -> BTreeMap<String, Attribute> {
    let gpu = device.gpu();
    let mut out = BTreeMap::new();
    let mut string = |key: &str, value: Option<&str>| {
        if let Some(value) = value.filter(|v| !v.is_empty()) {
            out.insert(key.to_owned(), Attribute::String(clip(value)));
        }
    };
    match device {
        DraDevice::Gpu(_) => string("type", Some("gpu")),
        DraDevice::Mig(parent, mig) => {
            string("type", Some("mig"));
            string("parentUUID", Some(&parent.uuid));
            string("profile", Some(&mig.profile));
        }
    }
    string("uuid", Some(device.uuid()));
    string("productName", Some(&gpu.name));
    string("brand", gpu.brand.as_deref().map(nvidia_brand).as_deref());
    string(
        "architecture",
        gpu.architecture
            .as_deref()
            .map(nvidia_architecture)
            .as_deref(),
    );
    string(PCI_BUS_ID, gpu.pci.bus_id.sysfs().as_deref());
    let versions = [
        ("cudaComputeCapability", gpu.compute_capability.as_deref()),
        ("driverVersion", Some(snapshot.node.driver_version.as_str())),
        (
            "cudaDriverVersion",
            snapshot.node.cuda_driver_version.as_deref(),
        ),
    ];
    for (key, value) in versions {
        if let Some(version) = value.and_then(semver) {
            out.insert(key.to_owned(), Attribute::Version(version));
        }
    }
    for (key, value) in topology.of(gpu.index) {
        out.insert(key.clone(), value.clone());
    }
    out
}

fn capacity(device: &DraDevice<'_>) -> BTreeMap<String, Capacity> {
    let mut out = BTreeMap::new();
    let mut put = |key: String, value: String| {
        out.insert(key, Capacity::of(value));
    };
    match device {
        DraDevice::Gpu(gpu) => put("memory".into(), binary_quantity(gpu.memory_mib * MIB)),
        DraDevice::Mig(_, mig) => {
            put("memory".into(), binary_quantity(mig.memory_mib * MIB));
            put("multiprocessors".into(), mig.multiprocessors.to_string());
            put("copyEngines".into(), mig.engines.copy.to_string());
            put("decoders".into(), mig.engines.decoder.to_string());
            put("encoders".into(), mig.engines.encoder.to_string());
            put("jpegEngines".into(), mig.engines.jpeg.to_string());
            put("ofaEngines".into(), mig.engines.ofa.to_string());
            if let Some(placement) = mig.placement {
                for slice in placement.start..placement.start + placement.size {
                    put(format!("memorySlice{slice}"), "1".into());
                }
            }
        }
    }
    out
}

/// A byte count as Kubernetes writes a binary-SI quantity: the largest binary suffix that
/// divides it exactly (`85520809984` → `81559Mi`), else plain bytes.
pub fn binary_quantity(bytes: u64) -> String {
    const SUFFIXES: [&str; 6] = ["Ki", "Mi", "Gi", "Ti", "Pi", "Ei"];
    if bytes == 0 {
        return "0".to_owned();
    }
    let mut value = bytes;
    let mut suffix = "";
    for next in SUFFIXES {
        if !value.is_multiple_of(1024) {
            break;
        }
        value /= 1024;
        suffix = next;
    }
    format!("{value}{suffix}")
}

/// A dotted version as a semantic version: numeric parts without leading zeros, padded to
/// three (`9.0` → `9.0.0`); `None` when it has no numeric part.
pub fn semver(text: &str) -> Option<String> {
    let mut parts: Vec<u64> = Vec::new();
    for part in text.trim().trim_start_matches('v').split('.').take(3) {
        parts.push(part.parse().ok()?);
    }
    if parts.is_empty() {
        return None;
    }
    parts.resize(3, 0);
    Some(format!("{}.{}.{}", parts[0], parts[1], parts[2]))
}

/// NVML's brand as NVIDIA's driver writes it (`Nvidia`, `Tesla`, `GeForce`, `NvidiaRTX`);
/// the inventory keeps it in lower case.
fn nvidia_brand(brand: &str) -> String {
    match brand {
        "geforce" => "GeForce".to_owned(),
        "nvidiartx" => "NvidiaRTX".to_owned(),
        "nvidiavapps" => "NvidiaVApps".to_owned(),
        "nvidiavpc" => "NvidiaVPC".to_owned(),
        "nvidiavcs" => "NvidiaVCS".to_owned(),
        "nvidiavws" => "NvidiaVWS".to_owned(),
        "nvidiacloudgaming" => "NvidiaCloudGaming".to_owned(),
        "quadrortx" => "QuadroRTX".to_owned(),
        "geforcertx" => "GeForceRTX".to_owned(),
        other => capitalised(other),
    }
}

/// NVML's architecture as NVIDIA's driver writes it (`Ampere`, `Hopper`, `Ada Lovelace`).
fn nvidia_architecture(architecture: &str) -> String {
    match architecture {
        "ada" | "ada-lovelace" | "adalovelace" => "Ada Lovelace".to_owned(),
        other => capitalised(other),
    }
}

fn capitalised(word: &str) -> String {
    let mut chars = word.chars();
    chars
        .next()
        .map(|first| first.to_ascii_uppercase().to_string() + chars.as_str())
        .unwrap_or_default()
}

/// Attribute strings are at most 64 characters.
fn clip(value: &str) -> String {
    value.chars().take(64).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inventory::model::{Node, Snapshot};
    use crate::inventory::test_support::gpu;

    #[test]
    fn quantities_and_versions_are_written_as_kubernetes_reads_them() {
        assert_eq!(binary_quantity(81559 * MIB), "81559Mi");
        assert_eq!(binary_quantity(80 * 1024 * MIB), "80Gi");
        assert_eq!(binary_quantity(1000), "1000");
        assert_eq!(semver("9.0").as_deref(), Some("9.0.0"));
        assert_eq!(semver("535.54.03").as_deref(), Some("535.54.3"));
        assert_eq!(semver("570.133.20").as_deref(), Some("570.133.20"));
        assert_eq!(semver("n/a"), None);
        assert_eq!(nvidia_brand("nvidia"), "Nvidia");
        assert_eq!(nvidia_brand("geforce"), "GeForce");
        assert_eq!(nvidia_architecture("hopper"), "Hopper");
        assert_eq!(nvidia_architecture("ada"), "Ada Lovelace");
    }

    fn node_of(n: usize) -> Snapshot {
        Snapshot {
            node: Node {
                hostname: "n".into(),
                driver_version: "570.133.20".into(),
                cuda_driver_version: Some("12.8".into()),
                nvml_version: None,
                machine_type: None,
            },
            gpus: (0..n)
                .map(|i| gpu(i as u32, &format!("GPU-{i}"), "NVIDIA H100", 81559))
                .collect(),
            topology: Vec::new(),
        }
    }

    /// The API allows 32 attributes and capacities per device: the largest MIG device (all 8
    /// memory slices) with every attribute, topology included, must fit.
    #[test]
    fn the_largest_mig_device_with_its_topology_fits_the_per_device_limit() {
        use crate::inventory::model::Placement;
        use crate::inventory::test_support::{mig, with_migs};
        let mut whole = mig(0, "MIG-0", 0, 0);
        whole.profile = "7g.80gb".into();
        whole.placement = Some(Placement { start: 0, size: 8 });
        whole.gpu_instance_profile_id = Some(0);
        let mut snapshot = node_of(1);
        let mut g = snapshot.gpus.remove(0);
        g.numa_node = Some(0);
        g.brand = Some("Tesla".into());
        g.architecture = Some("Hopper".into());
        g.compute_capability = Some("9.0".into());
        snapshot.gpus.push(with_migs(g, vec![whole]));
        snapshot.node.cuda_driver_version = Some("12.8".into());
        let roots = [(0, "pci0000:15".to_owned())].into_iter().collect();
        let mut topology = crate::dra::topology::topology(&snapshot, &roots);
        // An NVLink domain too, as on an HGX board.
        topology.insert_for_test(0, "nvlinkDomain", "GPU-0");
        let built = devices(&snapshot, "d", &topology);
        let entries = built[0].attributes.len() + built[0].capacity.len();
        assert_eq!(
            built[0].attributes.len(),
            14,
            "{:?}",
            built[0].attributes.keys()
        );
        assert!(entries <= 32, "{entries} attributes and capacities");
    }

    #[test]
    fn slices_split_at_the_limits_and_say_how_many_there_are() {
        let built = specs(
            "d",
            "n",
            devices(&node_of(130), "d", &Topology::default()),
            4,
        );
        let sizes: Vec<usize> = built.iter().map(|s| s.devices.len()).collect();
        assert_eq!(sizes, [128, 2]);
        assert!(built.iter().all(|s| s.pool.resource_slice_count == 2));
        assert!(built.iter().all(|s| s.pool.generation == 4));

        let mut snapshot = node_of(70);
        snapshot.gpus[3].health = crate::inventory::health::Health::lost(std::time::UNIX_EPOCH);
        let sizes: Vec<usize> = specs_sizes(&snapshot);
        assert_eq!(sizes, [64, 6]);

        // numaNode as a list: 64 a slice, as with taints.
        let mut snapshot = node_of(70);
        for gpu in &mut snapshot.gpus {
            gpu.numa_node = Some(0);
        }
        let lists = crate::dra::topology::topology(&snapshot, &BTreeMap::new()).with_numa_lists();
        let built = specs("d", "n", devices(&snapshot, "d", &lists), 1);
        let sizes: Vec<usize> = built.iter().map(|s| s.devices.len()).collect();
        assert_eq!(sizes, [64, 6]);

        let empty = specs("d", "n", Vec::new(), 1);
        assert_eq!(empty.len(), 1);
        assert_eq!(empty[0].pool.resource_slice_count, 1);
    }

    fn specs_sizes(snapshot: &Snapshot) -> Vec<usize> {
        specs("d", "n", devices(snapshot, "d", &Topology::default()), 1)
            .iter()
            .map(|s| s.devices.len())
            .collect()
    }
}
