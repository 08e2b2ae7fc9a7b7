//! PCIe and NVLink topology between GPU pairs: the common-ancestor level NVML reports and the
//! peer-to-peer status per capability.
//!
//! The PCIe level follows `nvidia-smi topo -m`: both GPUs directly under one switch is
//! `SINGLE` (PIX), a shared switch further up is `MULTIPLE` (PXB), a shared host bridge only is
//! `HOSTBRIDGE` (PHB), the same NUMA node only is `NODE`, anything else `SYSTEM`. NVLink does
//! not change the PCIe level (as in NVML); it only makes P2P available.

use crate::node::{Gpu, Node, Remote};
use nvml_wrapper_sys::bindings as b;

/// `nvmlGpuTopologyLevel_t` between two GPUs.
pub fn common_ancestor(a: &Gpu, b_: &Gpu) -> u32 {
    if a.index == b_.index {
        return b::nvmlGpuLevel_enum_NVML_TOPOLOGY_INTERNAL;
    }
    if let (Some(ha), Some(hb)) = (&a.host_bridge, &b_.host_bridge)
        && ha == hb
    {
        let shared = a
            .switches
            .iter()
            .zip(&b_.switches)
            .take_while(|(x, y)| x == y)
            .count();
        return if shared == 0 {
            b::nvmlGpuLevel_enum_NVML_TOPOLOGY_HOSTBRIDGE
        } else if shared == a.switches.len() && shared == b_.switches.len() {
            b::nvmlGpuLevel_enum_NVML_TOPOLOGY_SINGLE
        } else {
            b::nvmlGpuLevel_enum_NVML_TOPOLOGY_MULTIPLE
        };
    }
    if a.numa_node == b_.numa_node {
        b::nvmlGpuLevel_enum_NVML_TOPOLOGY_NODE
    } else {
        b::nvmlGpuLevel_enum_NVML_TOPOLOGY_SYSTEM
    }
}

/// Whether two GPUs can reach each other over NVLink with the given per-link up/down states:
/// a direct link that is up, or each having an up link into the switch fabric.
pub fn nvlink_connected(
    node: &Node,
    link_up: &dyn Fn(usize, usize) -> bool,
    a: usize,
    b_: usize,
) -> bool {
    let (ga, gb) = (&node.gpus[a], &node.gpus[b_]);
    let direct = ga
        .links
        .iter()
        .enumerate()
        .any(|(l, link)| link.remote == Remote::Gpu(b_) && link_up(a, l));
    let on_fabric = |g: &Gpu| {
        g.links
            .iter()
            .enumerate()
            .any(|(l, link)| matches!(link.remote, Remote::NvSwitch(_)) && link_up(g.index, l))
    };
    direct || (on_fabric(ga) && on_fabric(gb))
}

/// `nvmlGpuP2PStatus_t` for one capability index, or `None` for an index NVML does not know.
pub fn p2p_status(level: u32, nvlink: bool, caps_index: u32) -> Option<u32> {
    let ok = b::nvmlGpuP2PStatus_enum_NVML_P2P_STATUS_OK;
    let over_pcie = if level <= b::nvmlGpuLevel_enum_NVML_TOPOLOGY_NODE {
        ok
    } else {
        // Peer traffic across the inter-socket link is refused by the chipset.
        b::nvmlGpuP2PStatus_enum_NVML_P2P_STATUS_CHIPSET_NOT_SUPPORTED
    };
    match caps_index {
        b::nvmlGpuP2PCapsIndex_enum_NVML_P2P_CAPS_INDEX_READ
        | b::nvmlGpuP2PCapsIndex_enum_NVML_P2P_CAPS_INDEX_WRITE
        | b::nvmlGpuP2PCapsIndex_enum_NVML_P2P_CAPS_INDEX_ATOMICS => {
            Some(if nvlink { ok } else { over_pcie })
        }
        b::nvmlGpuP2PCapsIndex_enum_NVML_P2P_CAPS_INDEX_NVLINK => Some(if nvlink {
            ok
        } else {
            b::nvmlGpuP2PStatus_enum_NVML_P2P_STATUS_NOT_SUPPORTED
        }),
        b::nvmlGpuP2PCapsIndex_enum_NVML_P2P_CAPS_INDEX_PCI => Some(over_pcie),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixture;
    use b::{
        nvmlGpuLevel_enum_NVML_TOPOLOGY_HOSTBRIDGE as PHB,
        nvmlGpuLevel_enum_NVML_TOPOLOGY_MULTIPLE as PXB,
        nvmlGpuLevel_enum_NVML_TOPOLOGY_NODE as NODE,
        nvmlGpuLevel_enum_NVML_TOPOLOGY_SINGLE as PIX,
        nvmlGpuLevel_enum_NVML_TOPOLOGY_SYSTEM as SYS,
    };

    fn level(fixture: &str, a: usize, b_: usize) -> u32 {
        let node = fixture::load(Some(fixture)).unwrap();
        common_ancestor(&node.gpus[a], &node.gpus[b_])
    }

    #[test]
    fn builtin_fixtures_have_the_documented_topology() {
        assert_eq!(level("dgx-h100", 0, 3), NODE);
        assert_eq!(level("dgx-h100", 3, 4), SYS);
        assert_eq!(level("pcie-4gpu", 0, 1), PIX);
        assert_eq!(level("pcie-4gpu", 2, 3), PIX);
        assert_eq!(level("pcie-4gpu", 1, 2), SYS);
        assert_eq!(level("dgx-a100", 0, 1), PXB);
        assert_eq!(level("dgx-a100", 0, 2), NODE);
        assert_eq!(level("mixed", 2, 3), PHB);
        assert_eq!(level("mixed", 0, 2), SYS);
        assert_eq!(level("gb200-nvl", 0, 1), NODE);
        assert_eq!(level("gb200-nvl", 1, 2), SYS);
    }

    #[test]
    fn nvlink_reachability() {
        let up = |_: usize, _: usize| true;
        let h = fixture::load(Some("dgx-h100")).unwrap();
        assert!(nvlink_connected(&h, &up, 0, 7));
        let p = fixture::load(Some("pcie-4gpu")).unwrap();
        assert!(nvlink_connected(&p, &up, 0, 1));
        assert!(!nvlink_connected(&p, &up, 1, 2));
        let down = |_: usize, _: usize| false;
        assert!(!nvlink_connected(&p, &down, 0, 1));
        let g = fixture::load(Some("gb200-nvl")).unwrap();
        assert!(nvlink_connected(&g, &up, 0, 3));
        let m = fixture::load(Some("mixed")).unwrap();
        assert!(!nvlink_connected(&m, &up, 0, 2));
        assert!(!nvlink_connected(&m, &up, 2, 3));
    }
}
