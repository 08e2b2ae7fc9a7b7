//! The exported NVML C functions, grouped by area, plus helpers they share.
//!
//! Each export validates the library state (`NVML_ERROR_UNINITIALIZED`), its handles
//! (`NVML_ERROR_INVALID_ARGUMENT`, or `NVML_ERROR_GPU_IS_LOST`) and its pointers
//! (`NVML_ERROR_INVALID_ARGUMENT`) before answering. Answers are computed under the runtime
//! lock and written to caller memory after it is released.

pub mod device;
pub mod events;
pub mod fabric;
pub mod fields;
pub mod gpm;
pub mod health;
pub mod mig;
pub mod mig_admin;
pub mod pcie;
pub mod system;
pub mod telemetry;
pub mod topology;

pub use device::*;
pub use events::*;
pub use fabric::*;
pub use fields::*;
pub use gpm::*;
pub use health::*;
pub use mig::*;
pub use mig_admin::*;
pub use pcie::*;
pub use system::*;
pub use telemetry::*;
pub use topology::*;

use crate::driver::{Runtime, Session};
use crate::ffi::{Res, rc};
use crate::mig::mig_uuid;
use crate::profiles::{CiProfile, GiProfile};

/// The address a handle stands for. Handles are never dereferenced, only looked up.
pub(crate) fn addr<T>(handle: *mut T) -> usize {
    handle.addr()
}

/// A handle for an address from the registry.
pub(crate) fn handle<T>(addr: usize) -> *mut T {
    std::ptr::without_provenance_mut(addr)
}

/// What NVML reports about one MIG device.
#[derive(Debug, Clone)]
pub(crate) struct MigDevice {
    pub gi: GiProfile,
    pub ci: CiProfile,
    pub name: String,
    pub uuid: String,
}

/// Describes the MIG device `(gi, ci)` of GPU `gpu`, which must exist.
pub(crate) fn mig_device(
    s: &Session,
    rt: &Runtime,
    gpu: usize,
    gi: u32,
    ci: u32,
) -> Res<MigDevice> {
    let g = &s.node.gpus[gpu];
    let table = g.model.mig.ok_or(rc::NOT_SUPPORTED)?;
    let state = &rt.mig[gpu];
    let gi_state = state.gi(gi).ok_or(rc::INVALID_ARGUMENT)?;
    let ci_state = state.ci(gi, ci).ok_or(rc::INVALID_ARGUMENT)?;
    let gi_profile = *table.by_id(gi_state.profile_id).ok_or(rc::UNKNOWN)?;
    let ci_profile = crate::mig::ci_profile_in(table, &gi_profile, ci_state.profile_id)?;
    Ok(MigDevice {
        name: format!("{} MIG {}", g.model.name, ci_profile.name),
        uuid: mig_uuid(&g.uuid, gi, ci),
        gi: gi_profile,
        ci: ci_profile,
    })
}
