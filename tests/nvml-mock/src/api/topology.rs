//! Topology between GPUs (PCIe common ancestor, P2P status) and the NVLink inventory of each
//! GPU (link state, version, capabilities, what is at the far end).

use std::os::raw::c_uint;

use super::addr;
use super::device::pci_info;
use crate::driver::{self, Runtime, Session};
use crate::ffi::{Res, export, put, rc};
use crate::node::Remote;
use crate::topology;
use nvml_wrapper_sys::bindings as b;
use nvml_wrapper_sys::bindings::*;

export! {
    /// PCIe distance between two GPUs (`nvidia-smi topo -m`).
    fn nvmlDeviceGetTopologyCommonAncestor(
        device1: nvmlDevice_t,
        device2: nvmlDevice_t,
        path_info: *mut nvmlGpuTopologyLevel_t,
    ) {
        let level = driver::with(|s, rt| {
            let a = rt.gpu(&s.node, addr(device1))?;
            let b = rt.gpu(&s.node, addr(device2))?;
            Ok(topology::common_ancestor(&s.node.gpus[a], &s.node.gpus[b]))
        })?;
        put!(path_info, level);
        Ok(())
    }
}

export! {
    /// Peer-to-peer status between two GPUs for one capability.
    fn nvmlDeviceGetP2PStatus(
        device1: nvmlDevice_t,
        device2: nvmlDevice_t,
        p2p_index: nvmlGpuP2PCapsIndex_t,
        p2p_status: *mut nvmlGpuP2PStatus_t,
    ) {
        let status = driver::with(|s, rt| {
            let a = rt.gpu(&s.node, addr(device1))?;
            let b = rt.gpu(&s.node, addr(device2))?;
            if a == b {
                return Err(rc::INVALID_ARGUMENT);
            }
            let level = topology::common_ancestor(&s.node.gpus[a], &s.node.gpus[b]);
            let up = |g: usize, l: usize| rt.faults[g].link_up.get(l).copied().unwrap_or(false);
            let nvlink = topology::nvlink_connected(&s.node, &up, a, b);
            topology::p2p_status(level, nvlink, p2p_index).ok_or(rc::INVALID_ARGUMENT)
        })?;
        put!(p2p_status, status);
        Ok(())
    }
}

/// Resolves a GPU handle and link number: no NVLink at all is "not supported", a link number
/// past `NVML_NVLINK_MAX_LINKS` is invalid, one past this model's links is "not supported".
pub(crate) fn link_of(
    s: &Session,
    rt: &mut Runtime,
    device: nvmlDevice_t,
    link: c_uint,
) -> Res<(usize, usize)> {
    let gpu = rt.gpu(&s.node, addr(device))?;
    let links = s.node.gpus[gpu].links.len();
    if links == 0 {
        return Err(rc::NOT_SUPPORTED);
    }
    if link >= NVML_NVLINK_MAX_LINKS {
        return Err(rc::INVALID_ARGUMENT);
    }
    if link as usize >= links {
        return Err(rc::NOT_SUPPORTED);
    }
    Ok((gpu, link as usize))
}

export! {
    /// Whether a link is active: trained to something and not taken down by `nvlink-down`.
    fn nvmlDeviceGetNvLinkState(device: nvmlDevice_t, link: c_uint, is_active: *mut nvmlEnableState_t) {
        let active = driver::with(|s, rt| {
            let (gpu, l) = link_of(s, rt, device, link)?;
            Ok(s.node.gpus[gpu].links[l].remote != Remote::None && rt.faults[gpu].link_up[l])
        })?;
        put!(is_active, if active { nvmlEnableState_enum_NVML_FEATURE_ENABLED } else { nvmlEnableState_enum_NVML_FEATURE_DISABLED });
        Ok(())
    }
}

export! {
    /// NVLink version of a link (an `nvmlNvlinkVersion_t`).
    fn nvmlDeviceGetNvLinkVersion(device: nvmlDevice_t, link: c_uint, version: *mut c_uint) {
        let v = driver::with(|s, rt| {
            let (gpu, _) = link_of(s, rt, device, link)?;
            s.node.gpus[gpu].model.nvlink.map(|n| n.version).ok_or(rc::NOT_SUPPORTED)
        })?;
        put!(version, v);
        Ok(())
    }
}

export! {
    /// Capabilities of a link: P2P and P2P atomics on every trained link, no system memory
    /// access (that is the Grace C2C path, not modelled).
    fn nvmlDeviceGetNvLinkCapability(
        device: nvmlDevice_t,
        link: c_uint,
        capability: nvmlNvLinkCapability_t,
        cap_result: *mut c_uint,
    ) {
        let result = driver::with(|s, rt| {
            let (gpu, l) = link_of(s, rt, device, link)?;
            let trained = s.node.gpus[gpu].links[l].remote != Remote::None;
            match capability {
                b::nvmlNvLinkCapability_enum_NVML_NVLINK_CAP_P2P_SUPPORTED
                | b::nvmlNvLinkCapability_enum_NVML_NVLINK_CAP_P2P_ATOMICS
                | b::nvmlNvLinkCapability_enum_NVML_NVLINK_CAP_VALID => Ok(trained as c_uint),
                b::nvmlNvLinkCapability_enum_NVML_NVLINK_CAP_SYSMEM_ACCESS
                | b::nvmlNvLinkCapability_enum_NVML_NVLINK_CAP_SYSMEM_ATOMICS
                | b::nvmlNvLinkCapability_enum_NVML_NVLINK_CAP_SLI_BRIDGE => Ok(0),
                _ => Err(rc::INVALID_ARGUMENT),
            }
        })?;
        put!(cap_result, result);
        Ok(())
    }
}

export! {
    /// PCI identity of the far end of a link: the peer GPU or the NVSwitch.
    fn nvmlDeviceGetNvLinkRemotePciInfo_v2(device: nvmlDevice_t, link: c_uint, pci: *mut nvmlPciInfo_t) {
        let info = driver::with(|s, rt| {
            let (gpu, l) = link_of(s, rt, device, link)?;
            match s.node.gpus[gpu].links[l].remote {
                Remote::Gpu(peer) => {
                    let p = &s.node.gpus[peer];
                    Ok(pci_info(&p.address, p.model.pci_device_id, p.model.pci_subsystem_id))
                }
                Remote::NvSwitch(sw) => {
                    let sw = &s.node.nvswitches[sw];
                    Ok(pci_info(&sw.address, sw.pci_device_id, 0))
                }
                Remote::None => Err(rc::NOT_SUPPORTED),
            }
        })?;
        put!(pci, info);
        Ok(())
    }
}

export! {
    /// What kind of device is at the far end of a link.
    fn nvmlDeviceGetNvLinkRemoteDeviceType(
        device: nvmlDevice_t,
        link: c_uint,
        p_nv_link_device_type: *mut nvmlIntNvLinkDeviceType_t,
    ) {
        let kind = driver::with(|s, rt| {
            let (gpu, l) = link_of(s, rt, device, link)?;
            Ok(match s.node.gpus[gpu].links[l].remote {
                Remote::Gpu(_) => b::nvmlIntNvLinkDeviceType_enum_NVML_NVLINK_DEVICE_TYPE_GPU,
                Remote::NvSwitch(_) => b::nvmlIntNvLinkDeviceType_enum_NVML_NVLINK_DEVICE_TYPE_SWITCH,
                Remote::None => b::nvmlIntNvLinkDeviceType_enum_NVML_NVLINK_DEVICE_TYPE_UNKNOWN,
            })
        })?;
        put!(p_nv_link_device_type, kind);
        Ok(())
    }
}
