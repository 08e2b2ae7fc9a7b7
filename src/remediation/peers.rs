//! Which GPUs a reset takes together. GPUs joined by NVLink directly (a bridge between two
//! PCIe cards, or the links of a board without NVSwitches) are reset as one: the driver
//! refuses to reset one of them alone, so all of them are drained, reset by one command and
//! checked together. GPUs that reach each other only through NVSwitches are reset one by
//! one (the fabric manager keeps the others' links up).

use std::collections::BTreeSet;

use crate::inventory::Snapshot;
use crate::inventory::model::{Gpu, NvLinkRemote};

/// The other GPUs that a reset of `gpu` takes with it: every GPU reachable from it over
/// active direct GPU-to-GPU NVLinks, in NVML index order.
pub fn reset_with<'a>(snapshot: &'a Snapshot, gpu: &Gpu) -> Vec<&'a Gpu> {
    // Both ends of a link report it, but one end that does is enough.
    let edges: Vec<(u32, u32)> = snapshot
        .gpus
        .iter()
        .flat_map(|g| {
            g.nvlinks
                .iter()
                .filter(|l| l.active)
                .filter_map(|l| match l.remote {
                    Some(NvLinkRemote::Gpu { gpu_index, .. }) => Some((g.index, gpu_index)),
                    _ => None,
                })
        })
        .collect();
    let mut joined = BTreeSet::from([gpu.index]);
    let mut frontier = vec![gpu.index];
    while let Some(index) = frontier.pop() {
        for &(a, b) in &edges {
            let other = match (a == index, b == index) {
                (true, _) => b,
                (_, true) => a,
                _ => continue,
            };
            if joined.insert(other) {
                frontier.push(other);
            }
        }
    }
    snapshot
        .gpus
        .iter()
        .filter(|g| g.index != gpu.index && joined.contains(&g.index) && !g.uuid.is_empty())
        .collect()
}

/// The words a held peer's verdict quotes: which GPU's reset takes it.
pub fn held_for(leader: &Gpu) -> String {
    format!(
        "the reset of GPU {} ({}), its NVLink peer, takes it too",
        leader.index, leader.uuid
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inventory::PciBusId;
    use crate::inventory::model::NvLink;
    use crate::inventory::test_support::{gpu, snapshot};

    /// Four GPUs: `links` are (GPU, link, far end) with the far end `Some(gpu)` for a direct
    /// NVLink and `None` for an NVSwitch.
    fn node(links: &[(u32, u32, Option<u32>, bool)]) -> Snapshot {
        let mut gpus: Vec<Gpu> = (0..4)
            .map(|i| gpu(i, &format!("GPU-{i}"), "A100", 81920))
            .collect();
        let bus = |n: u32| PciBusId::from(format!("00000000:{:02X}:00.0", 0x10 + n));
        for &(at, link, far, active) in links {
            gpus[at as usize].nvlinks.push(NvLink {
                link,
                active,
                remote: Some(match far {
                    Some(g) => NvLinkRemote::Gpu {
                        bus_id: bus(g),
                        gpu_index: g,
                    },
                    None => NvLinkRemote::Switch { bus_id: bus(9) },
                }),
            });
        }
        snapshot(gpus)
    }

    fn indices(gpus: Vec<&Gpu>) -> Vec<u32> {
        gpus.into_iter().map(|g| g.index).collect()
    }

    #[test]
    fn bridged_pairs_are_reset_together() {
        // 0-1 and 2-3 bridged, as two PCIe cards each.
        let n = node(&[
            (0, 0, Some(1), true),
            (1, 0, Some(0), true),
            (2, 0, Some(3), true),
            (3, 0, Some(2), true),
        ]);
        assert_eq!(indices(reset_with(&n, &n.gpus[0])), [1]);
        assert_eq!(indices(reset_with(&n, &n.gpus[3])), [2]);
    }

    #[test]
    fn a_chain_of_direct_links_is_one_group() {
        let n = node(&[(0, 0, Some(1), true), (1, 1, Some(2), true)]);
        assert_eq!(indices(reset_with(&n, &n.gpus[2])), [0, 1]);
        assert!(reset_with(&n, &n.gpus[3]).is_empty());
    }

    #[test]
    fn gpus_behind_nvswitches_are_reset_alone() {
        let n = node(&[(0, 0, None, true), (1, 0, None, true), (2, 0, None, true)]);
        assert!(reset_with(&n, &n.gpus[0]).is_empty());
    }

    #[test]
    fn a_link_that_is_down_joins_nothing() {
        let n = node(&[(0, 0, Some(1), false), (1, 0, Some(0), false)]);
        assert!(reset_with(&n, &n.gpus[0]).is_empty());
    }
}
