//! Multi-node NVLink fabric registration: `nvmlDeviceGetGpuFabricInfo` (the unversioned v1
//! layout, deprecated by NVIDIA but still exported by R570) and `nvmlDeviceGetGpuFabricInfoV`
//! (`nvmlGpuFabricInfo_v2` and `_v3`).
//!
//! A GPU outside such a fabric answers as a real single H200 did: `NVML_SUCCESS` with state
//! `NVML_GPU_FABRIC_STATE_NOT_SUPPORTED`, status `NVML_SUCCESS`, clique 0 and an all-zero
//! cluster UUID. The health mask and summary are 0 (not supported) on every GPU.

use super::addr;
use crate::driver;
use crate::ffi::{export, get_version, put, rc, struct_version};
use crate::node::Fabric;
use nvml_wrapper_sys::bindings::*;

/// The fabric registration of the GPU behind a physical-GPU handle.
fn fabric(device: nvmlDevice_t) -> crate::ffi::Res<Fabric> {
    driver::with(|s, rt| Ok(s.node.gpus[rt.gpu(&s.node, addr(device))?].fabric))
}

/// Where the fields of one fabric struct layout sit.
struct Layout {
    version: Option<usize>,
    uuid: usize,
    status: usize,
    clique: usize,
    state: usize,
}

/// One layout's bytes, padding included and zeroed. pynvml declares `state` as a 32-bit field
/// where the header has an 8-bit one, so it reads the three padding bytes after `state` as
/// part of the value: they must be zero, as the real library leaves them.
fn encode<const N: usize>(at: Layout, version: u32, f: Fabric) -> [u8; N] {
    let mut out = [0u8; N];
    if let Some(v) = at.version {
        out[v..v + 4].copy_from_slice(&version.to_ne_bytes());
    }
    out[at.uuid..at.uuid + 16].copy_from_slice(&f.cluster_uuid);
    out[at.status..at.status + 4].copy_from_slice(&f.status.to_ne_bytes());
    out[at.clique..at.clique + 4].copy_from_slice(&f.clique_id.to_ne_bytes());
    out[at.state] = f.state;
    // The health mask and summary stay 0: not supported.
    out
}

macro_rules! layout {
    ($t:ty, $version:expr) => {
        Layout {
            version: $version,
            uuid: std::mem::offset_of!($t, clusterUuid),
            status: std::mem::offset_of!($t, status),
            clique: std::mem::offset_of!($t, cliqueId),
            state: std::mem::offset_of!($t, state),
        }
    };
}

export! {
    /// Fabric registration, v1 layout (no version word).
    fn nvmlDeviceGetGpuFabricInfo(device: nvmlDevice_t, gpu_fabric_info: *mut nvmlGpuFabricInfo_t) {
        const N: usize = std::mem::size_of::<nvmlGpuFabricInfo_t>();
        let f = fabric(device)?;
        let bytes: [u8; N] = encode(layout!(nvmlGpuFabricInfo_t, None), 0, f);
        put!(gpu_fabric_info.cast::<[u8; N]>(), bytes);
        Ok(())
    }
}

export! {
    /// Fabric registration, versioned: `version` must be `nvmlGpuFabricInfo_v2` or `_v3`, and
    /// only that version's bytes are written.
    fn nvmlDeviceGetGpuFabricInfoV(device: nvmlDevice_t, gpu_fabric_info: *mut nvmlGpuFabricInfoV_t) {
        const V2: usize = std::mem::size_of::<nvmlGpuFabricInfo_v2_t>();
        const V3: usize = std::mem::size_of::<nvmlGpuFabricInfo_v3_t>();
        let version = get_version!(gpu_fabric_info);
        let f = fabric(device)?;
        if version == struct_version::<nvmlGpuFabricInfo_v2_t>(2) {
            let bytes: [u8; V2] = encode(layout!(nvmlGpuFabricInfo_v2_t, Some(0)), version, f);
            put!(gpu_fabric_info.cast::<[u8; V2]>(), bytes);
            return Ok(());
        }
        if version == struct_version::<nvmlGpuFabricInfo_v3_t>(3) {
            let bytes: [u8; V3] = encode(layout!(nvmlGpuFabricInfo_v3_t, Some(0)), version, f);
            put!(gpu_fabric_info.cast::<[u8; V3]>(), bytes);
            return Ok(());
        }
        Err(rc::ARGUMENT_VERSION_MISMATCH)
    }
}
