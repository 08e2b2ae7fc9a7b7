//! Multi-node NVLink fabric registration: `nvmlDeviceGetGpuFabricInfo` (the unversioned v1
//! layout, deprecated by NVIDIA but still exported) and `nvmlDeviceGetGpuFabricInfoV`
//! (`nvmlGpuFabricInfo_v2` and `_v3`).
//!
//! A GPU outside such a fabric answers as a real H200 did (driver 580.159.04): `NVML_SUCCESS`
//! with state `NVML_GPU_FABRIC_STATE_NOT_SUPPORTED`, status `NVML_SUCCESS`, clique 0 and an
//! all-zero cluster UUID; through `_v3` that driver wrote only `state`. The health mask and
//! summary are 0 (not supported) on every GPU.
//!
//! Fields are written one by one and padding is left as the caller had it, as the real
//! library does: pynvml declares `state` as a 32-bit field where the header has 8 bits, and
//! reads 0 only because ctypes zero-fills its structs.

use super::addr;
use crate::driver;
use crate::ffi::{Res, export, get_version, rc, require, struct_version};
use crate::node::Fabric;
use nvml_wrapper_sys::bindings::*;

/// The fabric registration of the GPU behind a physical-GPU handle.
fn fabric(device: nvmlDevice_t) -> Res<Fabric> {
    driver::with(|s, rt| Ok(s.node.gpus[rt.gpu(&s.node, addr(device))?].fabric))
}

/// Where the fields of one fabric struct layout sit.
struct Layout {
    uuid: usize,
    status: usize,
    clique: usize,
    state: usize,
    /// The health mask, in v2 and v3.
    mask: Option<usize>,
    /// The health summary, in v3.
    summary: Option<usize>,
}

macro_rules! layout {
    ($t:ty, $mask:expr, $summary:expr) => {
        Layout {
            uuid: std::mem::offset_of!($t, clusterUuid),
            status: std::mem::offset_of!($t, status),
            clique: std::mem::offset_of!($t, cliqueId),
            state: std::mem::offset_of!($t, state),
            mask: $mask,
            summary: $summary,
        }
    };
}

/// Copies `bytes` to `offset` within the caller's `T`, leaving every other byte alone.
fn write_at<T>(dst: *mut T, offset: usize, bytes: &[u8]) -> Res {
    require!(dst);
    if offset + bytes.len() > std::mem::size_of::<T>() {
        return Err(rc::UNKNOWN);
    }
    // SAFETY: `dst` is non-NULL and, by the NVML contract, valid for writes of a whole `T`
    // (the layout its version word names); the range written was just checked to lie inside
    // it, and Rust-owned `bytes` cannot overlap caller memory.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), dst.cast::<u8>().add(offset), bytes.len());
    }
    Ok(())
}

/// Writes the fields of one layout; with `state_only`, just `state` (what R580 does through
/// `_v3` for a GPU outside any fabric).
fn write_fields<T>(dst: *mut T, at: &Layout, f: &Fabric, state_only: bool) -> Res {
    if !state_only {
        write_at(dst, at.uuid, &f.cluster_uuid)?;
        write_at(dst, at.status, &f.status.to_ne_bytes())?;
        write_at(dst, at.clique, &f.clique_id.to_ne_bytes())?;
        if let Some(mask) = at.mask {
            write_at(dst, mask, &0u32.to_ne_bytes())?;
        }
        if let Some(summary) = at.summary {
            write_at(dst, summary, &[0])?;
        }
    }
    write_at(dst, at.state, &[f.state])
}

export! {
    /// Fabric registration, v1 layout (no version word).
    fn nvmlDeviceGetGpuFabricInfo(device: nvmlDevice_t, gpu_fabric_info: *mut nvmlGpuFabricInfo_t) {
        require!(gpu_fabric_info);
        let f = fabric(device)?;
        write_fields(gpu_fabric_info, &layout!(nvmlGpuFabricInfo_t, None, None), &f, false)
    }
}

export! {
    /// Fabric registration, versioned: `version` must be `nvmlGpuFabricInfo_v2` or `_v3`, and
    /// only that version's bytes are written (the version word is left as it is).
    fn nvmlDeviceGetGpuFabricInfoV(device: nvmlDevice_t, gpu_fabric_info: *mut nvmlGpuFabricInfoV_t) {
        let version = get_version!(gpu_fabric_info);
        let f = fabric(device)?;
        if version == struct_version::<nvmlGpuFabricInfo_v2_t>(2) {
            let at = layout!(
                nvmlGpuFabricInfo_v2_t,
                Some(std::mem::offset_of!(nvmlGpuFabricInfo_v2_t, healthMask)),
                None
            );
            return write_fields(gpu_fabric_info.cast::<nvmlGpuFabricInfo_v2_t>(), &at, &f, false);
        }
        if version == struct_version::<nvmlGpuFabricInfo_v3_t>(3) {
            let at = layout!(
                nvmlGpuFabricInfo_v3_t,
                Some(std::mem::offset_of!(nvmlGpuFabricInfo_v3_t, healthMask)),
                Some(std::mem::offset_of!(nvmlGpuFabricInfo_v3_t, healthSummary))
            );
            return write_fields(gpu_fabric_info, &at, &f, f == Fabric::NONE);
        }
        Err(rc::ARGUMENT_VERSION_MISMATCH)
    }
}
