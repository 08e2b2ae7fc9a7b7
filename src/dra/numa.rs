//! The NUMA nodes near a GPU's own, read from sysfs, for the list form of the standard
//! `resource.kubernetes.io/numaNode` attribute: the GPU's node first, then the other nodes of
//! the same CPU socket at the smallest distance from it (a socket split into sub-NUMA
//! clusters has several nodes, and memory of its nearest sibling is almost as close).
//!
//! | what | where (under the sysfs root) |
//! |---|---|
//! | the nodes | the `node<N>` folders of `devices/system/node` (IDs below 1024) |
//! | distances from node N | `devices/system/node/node<N>/distance`: one number per node, in ID order |
//! | node N's socket | the first CPU of `devices/system/node/node<N>/cpulist`, then `devices/system/cpu/cpu<k>/topology/physical_package_id` |
//!
//! A node without CPUs (memory only) has no socket and is nobody's neighbour. Whatever
//! cannot be read leaves the list at the GPU's own node: less said, never something wrong.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Node IDs the standard attribute allows.
const MAX_NODE: u32 = 1024;

/// What sysfs says about each NUMA node.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct NumaNodes {
    /// By node ID: its socket (none for a node without CPUs) and its distance to each node.
    nodes: BTreeMap<u32, NodeFacts>,
}

#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct NodeFacts {
    socket: Option<u32>,
    distances: BTreeMap<u32, u32>,
}

impl NumaNodes {
    /// The nodes under `sysfs_root` (`/sys`); none when the folder cannot be read.
    pub fn read(sysfs_root: &Path) -> NumaNodes {
        let base = sysfs_root.join("devices/system/node");
        let mut ids: Vec<u32> = std::fs::read_dir(&base)
            .into_iter()
            .flatten()
            .filter_map(|entry| {
                let name = entry.ok()?.file_name();
                let id: u32 = name.to_str()?.strip_prefix("node")?.parse().ok()?;
                (id < MAX_NODE).then_some(id)
            })
            .collect();
        ids.sort_unstable();
        let nodes = ids
            .iter()
            .map(|&id| {
                let dir = base.join(format!("node{id}"));
                let socket = first_cpu(&dir.join("cpulist")).and_then(|cpu| {
                    read_number(&sysfs_root.join(format!(
                        "devices/system/cpu/cpu{cpu}/topology/physical_package_id"
                    )))
                });
                let distances = std::fs::read_to_string(dir.join("distance"))
                    .ok()
                    .and_then(|text| {
                        let row: Option<Vec<u32>> =
                            text.split_whitespace().map(|d| d.parse().ok()).collect();
                        // One number per node, in ID order; anything else is not this layout.
                        row.filter(|row| row.len() == ids.len())
                    })
                    .map(|row| ids.iter().copied().zip(row).collect())
                    .unwrap_or_default();
                (id, NodeFacts { socket, distances })
            })
            .collect();
        NumaNodes { nodes }
    }

    /// `node` first, then the other nodes of its socket at the smallest distance from it, in
    /// ID order.
    pub fn nearest(&self, node: u32) -> Vec<i64> {
        let mut out = vec![i64::from(node)];
        let Some(own) = self.nodes.get(&node) else {
            return out;
        };
        let Some(socket) = own.socket else {
            return out;
        };
        let siblings: Vec<(u32, u32)> = self
            .nodes
            .iter()
            .filter(|(id, facts)| **id != node && facts.socket == Some(socket))
            .filter_map(|(id, _)| Some((*id, *own.distances.get(id)?)))
            .collect();
        if let Some(closest) = siblings.iter().map(|(_, d)| *d).min() {
            out.extend(
                siblings
                    .iter()
                    .filter(|(_, d)| *d == closest)
                    .map(|(id, _)| i64::from(*id)),
            );
        }
        out
    }
}

/// The first CPU of a `cpulist` (`0-31,64-95` → 0); `None` for an empty list.
fn first_cpu(path: &PathBuf) -> Option<u32> {
    let text = std::fs::read_to_string(path).ok()?;
    let first = text.trim().split([',', '-']).next()?;
    first.parse().ok()
}

fn read_number(path: &Path) -> Option<u32> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Lays out `nodes` (id, cpulist, distance row) and each CPU's socket.
    fn sysfs(nodes: &[(u32, &str, &str)], sockets: &[(u32, u32)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for (id, cpus, distance) in nodes {
            let node = dir.path().join(format!("devices/system/node/node{id}"));
            std::fs::create_dir_all(&node).unwrap();
            std::fs::write(node.join("cpulist"), format!("{cpus}\n")).unwrap();
            std::fs::write(node.join("distance"), format!("{distance}\n")).unwrap();
        }
        for (cpu, socket) in sockets {
            let topology = dir
                .path()
                .join(format!("devices/system/cpu/cpu{cpu}/topology"));
            std::fs::create_dir_all(&topology).unwrap();
            std::fs::write(topology.join("physical_package_id"), format!("{socket}\n")).unwrap();
        }
        dir
    }

    #[test]
    fn a_sub_numa_socket_lists_its_nearest_sibling_and_not_the_other_socket() {
        // Two sockets, each split in two (SNC-2), plus a CPU-less memory node (CXL).
        let dir = sysfs(
            &[
                (0, "0-23,96-119", "10 12 21 21 30"),
                (1, "24-47,120-143", "12 10 21 21 30"),
                (2, "48-71", "21 21 10 12 30"),
                (3, "72-95", "21 21 12 10 30"),
                (4, "", "30 30 30 30 10"),
            ],
            &[(0, 0), (24, 0), (48, 1), (72, 1)],
        );
        let nodes = NumaNodes::read(dir.path());
        assert_eq!(nodes.nearest(0), [0, 1]);
        assert_eq!(nodes.nearest(3), [3, 2]);
        // No CPUs, no socket: alone.
        assert_eq!(nodes.nearest(4), [4]);
        // A node sysfs does not know: alone.
        assert_eq!(nodes.nearest(9), [9]);
    }

    #[test]
    fn only_the_smallest_distance_counts_and_a_broken_row_says_nothing() {
        // SNC-4 on one socket: node 0 is nearer to 1 than to 2 and 3.
        let dir = sysfs(
            &[
                (0, "0-7", "10 11 12 12"),
                (1, "8-15", "11 10 12 12"),
                (2, "16-23", "12 12 10 11"),
                (3, "24-31", "12 12 11 10 99"),
            ],
            &[(0, 0), (8, 0), (16, 0), (24, 0)],
        );
        let nodes = NumaNodes::read(dir.path());
        assert_eq!(nodes.nearest(0), [0, 1]);
        assert_eq!(nodes.nearest(2), [2, 3]);
        // Node 3's row has one number too many: no neighbours rather than wrong ones.
        assert_eq!(nodes.nearest(3), [3]);
        // No sysfs at all.
        assert_eq!(NumaNodes::read(Path::new("/nonexistent")).nearest(1), [1]);
    }
}
