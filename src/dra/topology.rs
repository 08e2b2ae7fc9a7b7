//! Where each GPU sits: the attributes a claim's `matchAttribute` constraint uses to keep its
//! devices together.
//!
//! | attribute | value | from |
//! |---|---|---|
//! | `resource.kubernetes.io/pcieRoot` | the PCIe root complex, `pci<domain>:<bus>` | the GPU's sysfs path |
//! | `resource.kubernetes.io/numaNode` | the NUMA node (left out when there is none); where the API server keeps list-type attributes, a list: that node first, then the nodes of its socket at the smallest distance from it | NVML; the list's neighbours from sysfs ([`numa`]) |
//! | `nvlinkDomain` | the GPUs one NVLink fabric joins: `<cluster UUID>.<clique>` on a multi-node NVLink system, else the UUID of the lowest-numbered GPU of the set joined by NVLink (left out for a GPU with no NVLink peer) | the fabric registration, the NVLink topology |
//!
//! The two standard attributes are Kubernetes' own, so a constraint can pair a GPU with another
//! driver's device (a NIC under the same root complex). A MIG device has its GPU's. Reading
//! sysfs is the one thing here that touches the host ([`read`]); the rest is the snapshot's.

use std::collections::BTreeMap;
use std::path::Path;

use super::numa::NumaNodes;
use super::objects::Attribute;
use crate::inventory::Snapshot;
use crate::inventory::model::Gpu;

/// The standard attribute naming a device's PCIe root complex.
pub const PCIE_ROOT: &str = "resource.kubernetes.io/pcieRoot";
/// The standard attribute naming a device's NUMA node.
pub const NUMA_NODE: &str = "resource.kubernetes.io/numaNode";
/// The driver's attribute naming the set of GPUs one NVLink fabric joins.
pub const NVLINK_DOMAIN: &str = "nvlinkDomain";

/// Each GPU's topology attributes, by NVML index.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Topology {
    by_gpu: BTreeMap<u32, BTreeMap<String, Attribute>>,
    /// Each GPU's NUMA node and its socket's nearest nodes, for the list form of
    /// [`NUMA_NODE`].
    numa_lists: BTreeMap<u32, Vec<i64>>,
}

impl Topology {
    /// The attributes of GPU `index` (and of its MIG devices).
    pub fn of(&self, index: u32) -> impl Iterator<Item = (&String, &Attribute)> {
        self.by_gpu.get(&index).into_iter().flatten()
    }

    /// The same attributes with [`NUMA_NODE`] as a list, for an API server that keeps
    /// list-type attributes.
    pub fn with_numa_lists(&self) -> Topology {
        let mut out = self.clone();
        for (index, list) in &self.numa_lists {
            if let Some(attributes) = out.by_gpu.get_mut(index) {
                attributes.insert(NUMA_NODE.to_owned(), Attribute::Ints(list.clone()));
            }
        }
        out
    }
}

#[cfg(test)]
impl Topology {
    /// Adds one attribute to GPU `index` (for tests of what carries it).
    pub fn insert_for_test(&mut self, index: u32, key: &str, value: &str) {
        self.by_gpu
            .entry(index)
            .or_default()
            .insert(key.to_owned(), Attribute::String(value.to_owned()));
    }
}

/// The node's topology: PCIe roots and NUMA distances read under `sysfs_root` (`/sys`), the
/// rest from `snapshot`.
pub fn read(sysfs_root: &Path, snapshot: &Snapshot) -> Topology {
    let roots = snapshot
        .gpus
        .iter()
        .filter_map(|gpu| Some((gpu.index, pcie_root(sysfs_root, gpu)?)))
        .collect();
    let mut out = topology(snapshot, &roots);
    let nodes = NumaNodes::read(sysfs_root);
    for list in out.numa_lists.values_mut() {
        if let Some(node) = list.first().and_then(|n| u32::try_from(*n).ok()) {
            *list = nodes.nearest(node);
        }
    }
    out
}

/// The topology from the PCIe roots found (by GPU index) and the snapshot.
pub fn topology(snapshot: &Snapshot, roots: &BTreeMap<u32, String>) -> Topology {
    let domains = nvlink_domains(snapshot);
    // Without sysfs, each list is the GPU's own node alone.
    let numa_lists = snapshot
        .gpus
        .iter()
        .filter_map(|gpu| Some((gpu.index, vec![i64::from(gpu.numa_node?)])))
        .collect();
    let by_gpu = snapshot
        .gpus
        .iter()
        .map(|gpu| {
            let mut attributes = BTreeMap::new();
            if let Some(root) = roots.get(&gpu.index) {
                attributes.insert(PCIE_ROOT.to_owned(), Attribute::String(root.clone()));
            }
            if let Some(node) = gpu.numa_node {
                attributes.insert(NUMA_NODE.to_owned(), Attribute::Int(i64::from(node)));
            }
            if let Some(domain) = domains.get(&gpu.index) {
                attributes.insert(NVLINK_DOMAIN.to_owned(), Attribute::String(domain.clone()));
            }
            (gpu.index, attributes)
        })
        .collect();
    Topology { by_gpu, numa_lists }
}

/// The root complex in the GPU's sysfs path: `/sys/bus/pci/devices/<bdf>` links to
/// `/sys/devices/pci<domain>:<bus>/<bridges…>/<bdf>`. `None` when the link is missing.
fn pcie_root(sysfs_root: &Path, gpu: &Gpu) -> Option<String> {
    let bdf = gpu.pci.bus_id.sysfs()?;
    let link = sysfs_root.join("bus/pci/devices").join(bdf);
    let target = std::fs::read_link(&link).ok()?;
    target
        .components()
        .filter_map(|c| c.as_os_str().to_str())
        .find(|name| is_root_complex(name))
        .map(str::to_owned)
}

/// `pci<4 hex digits>:<2 hex digits>`.
fn is_root_complex(name: &str) -> bool {
    name.strip_prefix("pci").is_some_and(|rest| {
        rest.len() == 7
            && rest.as_bytes()[4] == b':'
            && rest
                .bytes()
                .enumerate()
                .all(|(i, b)| i == 4 || b.is_ascii_hexdigit())
    })
}

/// Each GPU's NVLink domain: its fabric clique where the GPU is attached to a multi-node
/// fabric, else the set of GPUs NVLink joins on this node (through NVSwitches or directly),
/// named after its lowest-numbered GPU. GPUs with no NVLink peer have none.
fn nvlink_domains(snapshot: &Snapshot) -> BTreeMap<u32, String> {
    let mut out = BTreeMap::new();
    // Union-find over the pairs joined by NVLink.
    let mut parent: BTreeMap<u32, u32> = snapshot.gpus.iter().map(|g| (g.index, g.index)).collect();
    fn find(parent: &mut BTreeMap<u32, u32>, x: u32) -> u32 {
        let mut root = x;
        while let Some(&p) = parent.get(&root) {
            if p == root {
                break;
            }
            root = p;
        }
        parent.insert(x, root);
        root
    }
    let mut linked: Vec<u32> = Vec::new();
    for pair in snapshot.topology.iter().filter(|p| p.nvlinks > 0) {
        let (a, b) = (find(&mut parent, pair.a), find(&mut parent, pair.b));
        // The lower index is the set's name.
        let (low, high) = if a < b { (a, b) } else { (b, a) };
        parent.insert(high, low);
        linked.extend([pair.a, pair.b]);
    }
    for gpu in &snapshot.gpus {
        if let Some(fabric) = gpu.fabric.as_ref().filter(|f| f.is_attached()) {
            out.insert(
                gpu.index,
                format!("{}.{}", fabric.cluster_uuid, fabric.clique_id),
            );
        } else if linked.contains(&gpu.index) {
            let root = find(&mut parent, gpu.index);
            if let Some(first) = snapshot.gpu(root) {
                out.insert(gpu.index, first.uuid.clone());
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inventory::model::{PairLink, PcieLevel};
    use crate::inventory::test_support::gpu;

    fn snapshot(gpus: Vec<Gpu>, links: &[(u32, u32, u32)]) -> Snapshot {
        let node = crate::inventory::model::Node {
            hostname: "node-a".into(),
            driver_version: "570.133.20".into(),
            cuda_driver_version: None,
            nvml_version: None,
            machine_type: None,
        };
        let topology = links
            .iter()
            .map(|&(a, b, nvlinks)| PairLink {
                a,
                b,
                nvlinks,
                pcie: PcieLevel::System,
            })
            .collect();
        Snapshot {
            node,
            gpus,
            topology,
        }
    }

    fn string(topology: &Topology, index: u32, key: &str) -> Option<String> {
        topology
            .of(index)
            .find(|(k, _)| *k == key)
            .map(|(_, v)| match v {
                Attribute::String(s) => s.clone(),
                other => format!("{other:?}"),
            })
    }

    #[test]
    fn gpus_joined_by_nvlink_share_a_domain_named_after_the_first() {
        let gpus = (0..4)
            .map(|i| gpu(i, &format!("GPU-{i}"), "H100", 81559))
            .collect();
        // 0-1 and 1-2 are joined, 3 is alone (PCIe only).
        let s = snapshot(gpus, &[(0, 1, 18), (1, 2, 18), (0, 3, 0), (2, 3, 0)]);
        let t = topology(&s, &BTreeMap::new());
        let domains: Vec<Option<String>> = (0..4).map(|i| string(&t, i, NVLINK_DOMAIN)).collect();
        assert_eq!(
            domains,
            [
                Some("GPU-0".into()),
                Some("GPU-0".into()),
                Some("GPU-0".into()),
                None
            ]
        );
    }

    #[test]
    fn the_pcie_root_comes_from_the_sysfs_path() {
        let dir = tempfile::tempdir().unwrap();
        let devices = dir.path().join("bus/pci/devices");
        std::fs::create_dir_all(&devices).unwrap();
        std::os::unix::fs::symlink(
            "../../../devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:00.0/0000:18:00.0",
            devices.join("0000:18:00.0"),
        )
        .unwrap();
        let mut g = gpu(0, "GPU-0", "H100", 81559);
        g.pci.bus_id = String::from("00000000:18:00.0").into();
        g.numa_node = Some(1);
        let missing = gpu(1, "GPU-1", "H100", 81559);
        let t = read(dir.path(), &snapshot(vec![g, missing], &[]));
        assert_eq!(string(&t, 0, PCIE_ROOT).as_deref(), Some("pci0000:15"));
        assert_eq!(
            t.of(0)
                .find(|(k, _)| *k == NUMA_NODE)
                .map(|(_, v)| v.clone()),
            Some(Attribute::Int(1))
        );
        assert_eq!(t.of(1).count(), 0, "no sysfs link, no NUMA node: nothing");
        // As a list (no NUMA folders under this sysfs): the GPU's own node alone.
        let lists = t.with_numa_lists();
        assert_eq!(
            lists
                .of(0)
                .find(|(k, _)| *k == NUMA_NODE)
                .map(|(_, v)| v.clone()),
            Some(Attribute::Ints(vec![1]))
        );
        assert_eq!(lists.of(1).count(), 0);
        assert!(is_root_complex("pci0000:00") && is_root_complex("pcie0a1:ff"));
        assert!(!is_root_complex("pci_express") && !is_root_complex("pci0000:0"));
    }
}
