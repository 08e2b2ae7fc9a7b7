//! MIG administration through NVML: reading each GPU's MIG geometry (profiles, possible
//! placements, existing GPU and compute instances, mode) and changing it (mode, create and
//! destroy instances).
//!
//! Everything here is plain data in, plain data out, so the MIG manager plans on values it can
//! build in tests and calls back here only to change the GPU.

use nvml_wrapper::Device;
use nvml_wrapper::Nvml as Lib;
use nvml_wrapper::error::NvmlError as E;
use nvml_wrapper_sys::bindings::{
    NVML_GPU_INSTANCE_PROFILE_COUNT, nvmlReturn_enum_NVML_ERROR_RESET_REQUIRED as RESET_REQUIRED,
};
use serde::Serialize;

use super::raw::mig as raw;
use super::{Nvml, NvmlError};
use crate::inventory::mig_profile;

/// Compute slices of each compute-instance profile, indexed by its NVML enum value
/// (`1_SLICE`, `2_SLICE`, `3_SLICE`, `4_SLICE`, `7_SLICE`, `8_SLICE`, `6_SLICE`). The `REV1`
/// variants name the same shapes and are not used.
pub const CI_SLICES: [u32; 7] = [1, 2, 3, 4, 7, 8, 6];

/// Whether a `compute`-slice compute instance fits a `gpu`-slice GPU instance: the full size,
/// or a smaller one no more than about half of it (NVIDIA's rule: not `2C > G + 1`).
pub fn ci_fits(compute: u32, gpu: u32) -> bool {
    compute == gpu || (compute < gpu && 2 * compute <= gpu + 1)
}

/// The NVML enum value of the compute-instance profile with `slices` compute slices.
pub fn ci_enum(slices: u32) -> Option<u32> {
    CI_SLICES
        .iter()
        .position(|&s| s == slices)
        .and_then(|i| u32::try_from(i).ok())
}

/// One GPU-instance profile a GPU offers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GiProfile {
    /// NVML enum value (`NVML_GPU_INSTANCE_PROFILE_*`).
    pub enum_value: u32,
    /// Device-specific profile id, what create calls take.
    pub id: u32,
    /// NVIDIA's name, e.g. `3g.40gb`, `1g.10gb+me`.
    pub name: String,
    /// Compute slices (the G of the name).
    pub slices: u32,
    /// Memory slices one instance occupies.
    pub memory_slices: u32,
    /// Most instances of this profile on the GPU at once.
    pub max: u32,
    /// Memory of one instance, MiB.
    pub memory_mib: u64,
    /// First memory slice of every placement the profile can take.
    pub placements: Vec<u32>,
}

/// One compute instance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ComputeInstance {
    pub id: u32,
    /// Compute slices.
    pub slices: u32,
}

/// One GPU instance and its compute instances.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GpuInstance {
    pub id: u32,
    /// Device-specific GPU-instance profile id.
    pub profile_id: u32,
    /// First memory slice.
    pub start: u32,
    /// Memory slices.
    pub size: u32,
    pub compute: Vec<ComputeInstance>,
}

/// A GPU's MIG mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct MigMode {
    pub current: bool,
    pub pending: bool,
}

/// Everything MIG administration needs to know about one GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MigGpu {
    pub index: u32,
    pub uuid: String,
    pub name: String,
    pub pci_bus_id: String,
    /// `0xDDDDVVVV` as a number: device id above, vendor id below.
    pub pci_device_id: u32,
    /// The subsystem's id in the same layout.
    pub pci_subsystem_id: u32,
    /// `None`: not MIG capable.
    pub mode: Option<MigMode>,
    /// Profiles the GPU offers (empty when not MIG capable).
    pub profiles: Vec<GiProfile>,
    /// Existing GPU instances, by id.
    pub instances: Vec<GpuInstance>,
    /// PIDs of compute processes on the GPU or any of its MIG devices.
    pub processes: Vec<u32>,
}

impl MigGpu {
    /// The profile with device-specific id `id`.
    pub fn profile(&self, id: u32) -> Option<&GiProfile> {
        self.profiles.iter().find(|p| p.id == id)
    }
}

/// What `nvmlDeviceSetMigMode` reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModeActivation {
    /// The mode is in effect.
    Active,
    /// The mode is pending a GPU reset (the driver answered "in use" or nothing yet).
    ResetPending,
    /// NVML answered `RESET_REQUIRED`: the GPU cannot be reset here, a reboot applies it.
    RebootRequired,
}

/// Maps a wrapper error to the call that failed (shared by the NVML write paths).
pub(super) fn call(name: &'static str) -> impl FnOnce(E) -> NvmlError {
    move |source| NvmlError::Call { call: name, source }
}

/// MIG administration of the node's GPUs.
#[derive(Debug, Clone, Copy)]
pub struct MigAdmin {
    lib: &'static Lib,
}

impl Nvml {
    /// The MIG administration interface of this library.
    pub fn mig_admin(&self) -> MigAdmin {
        MigAdmin { lib: self.lib }
    }
}

impl MigAdmin {
    fn device(&self, index: u32) -> Result<Device<'static>, NvmlError> {
        self.lib
            .device_by_index(index)
            .map_err(call("nvmlDeviceGetHandleByIndex_v2"))
    }

    /// Reads every GPU of the node.
    pub fn gpus(&self) -> Result<Vec<MigGpu>, NvmlError> {
        let count = self
            .lib
            .device_count()
            .map_err(call("nvmlDeviceGetCount_v2"))?;
        (0..count).map(|index| self.gpu(index)).collect()
    }

    /// Reads GPU `index`.
    pub fn gpu(&self, index: u32) -> Result<MigGpu, NvmlError> {
        let device = self.device(index)?;
        let pci = device.pci_info().map_err(call("nvmlDeviceGetPciInfo_v3"))?;
        let memory = device
            .memory_info()
            .map_err(call("nvmlDeviceGetMemoryInfo"))?;
        let mode = match device.mig_mode() {
            Ok(mode) => Some(MigMode {
                current: mode.current == 1,
                pending: mode.pending == 1,
            }),
            Err(E::NotSupported) => None,
            Err(err) => return Err(call("nvmlDeviceGetMigMode")(err)),
        };
        let profiles = match mode {
            Some(_) => self.profiles(&device, memory.total)?,
            None => Vec::new(),
        };
        let instances = match mode {
            Some(m) if m.current => self.instances(&device, &profiles)?,
            _ => Vec::new(),
        };
        Ok(MigGpu {
            index,
            uuid: device.uuid().map_err(call("nvmlDeviceGetUUID"))?,
            name: device.name().map_err(call("nvmlDeviceGetName"))?,
            pci_bus_id: pci.bus_id.to_ascii_lowercase(),
            pci_device_id: pci.pci_device_id,
            pci_subsystem_id: pci.pci_sub_system_id.unwrap_or(0),
            processes: processes(&device, mode.is_some_and(|m| m.current))?,
            mode,
            profiles,
            instances,
        })
    }

    fn profiles(&self, device: &Device<'_>, total_bytes: u64) -> Result<Vec<GiProfile>, NvmlError> {
        let mut out = Vec::new();
        for enum_value in 0..NVML_GPU_INSTANCE_PROFILE_COUNT {
            let info = match device.profile_info(enum_value) {
                Ok(info) => info,
                Err(E::NotSupported | E::InvalidArg) => continue,
                Err(err) => return Err(call("nvmlDeviceGetGpuInstanceProfileInfo")(err)),
            };
            let placements = raw::gi_possible_placements(self.lib, device, info.id)
                .map_err(call("nvmlDeviceGetGpuInstancePossiblePlacements_v2"))?;
            out.push(GiProfile {
                enum_value,
                id: info.id,
                name: mig_profile::profile_name(
                    info.slice_count,
                    info.slice_count,
                    info.memory_size_mb,
                    total_bytes,
                    enum_value,
                ),
                slices: info.slice_count,
                memory_slices: placements.first().map_or(0, |&(_, size)| size),
                max: info.instance_count,
                memory_mib: info.memory_size_mb,
                placements: placements.iter().map(|&(start, _)| start).collect(),
            });
        }
        Ok(out)
    }

    fn instances(
        &self,
        device: &Device<'_>,
        profiles: &[GiProfile],
    ) -> Result<Vec<GpuInstance>, NvmlError> {
        let mut out = Vec::new();
        for profile in profiles {
            let found = raw::gpu_instances(self.lib, device, profile.id)
                .map_err(call("nvmlDeviceGetGpuInstances"))?;
            for gi in found {
                let mut compute = Vec::new();
                for (ci_enum, &slices) in (0u32..).zip(CI_SLICES.iter()) {
                    if !ci_fits(slices, profile.slices) {
                        continue;
                    }
                    let ci_id = match raw::ci_profile_id(self.lib, device, gi.id, ci_enum) {
                        Ok(id) => id,
                        Err(E::NotSupported | E::InvalidArg) => continue,
                        Err(err) => {
                            return Err(call("nvmlGpuInstanceGetComputeInstanceProfileInfo")(err));
                        }
                    };
                    let cis = raw::compute_instances(self.lib, device, gi.id, ci_id)
                        .map_err(call("nvmlGpuInstanceGetComputeInstances"))?;
                    compute.extend(cis.iter().map(|ci| ComputeInstance { id: ci.id, slices }));
                }
                compute.sort_by_key(|ci| ci.id);
                out.push(GpuInstance {
                    id: gi.id,
                    profile_id: gi.profile_id,
                    start: gi.start,
                    size: gi.size,
                    compute,
                });
            }
        }
        out.sort_by_key(|gi| gi.id);
        Ok(out)
    }

    /// Requests MIG mode `enabled` on GPU `index`, and says whether it is in effect.
    pub fn set_mode(&self, index: u32, enabled: bool) -> Result<ModeActivation, NvmlError> {
        let device = self.device(index)?;
        let status = device
            .set_mig_mode(enabled)
            .map_err(call("nvmlDeviceSetMigMode"))?;
        let mode = device.mig_mode().map_err(call("nvmlDeviceGetMigMode"))?;
        Ok(if (mode.current == 1) == enabled {
            ModeActivation::Active
        } else if status == RESET_REQUIRED {
            ModeActivation::RebootRequired
        } else {
            // Success with the mode still pending, or IN_USE: a reset applies it.
            ModeActivation::ResetPending
        })
    }

    /// Creates a GPU instance of profile `profile_id` at memory slice `start`; its id.
    pub fn create_gpu_instance(
        &self,
        index: u32,
        profile_id: u32,
        start: u32,
        size: u32,
    ) -> Result<u32, NvmlError> {
        let device = self.device(index)?;
        raw::create_gpu_instance(self.lib, &device, profile_id, start, size)
            .map_err(call("nvmlDeviceCreateGpuInstanceWithPlacement"))
    }

    /// Creates a `slices`-slice compute instance in GPU instance `gi`; its id.
    pub fn create_compute_instance(
        &self,
        index: u32,
        gi: u32,
        slices: u32,
    ) -> Result<u32, NvmlError> {
        let device = self.device(index)?;
        let ci_enum = ci_enum(slices).ok_or(NvmlError::Call {
            call: "nvmlGpuInstanceGetComputeInstanceProfileInfo",
            source: E::InvalidArg,
        })?;
        let profile_id = raw::ci_profile_id(self.lib, &device, gi, ci_enum)
            .map_err(call("nvmlGpuInstanceGetComputeInstanceProfileInfo"))?;
        raw::create_compute_instance(self.lib, &device, gi, profile_id)
            .map_err(call("nvmlGpuInstanceCreateComputeInstance"))
    }

    /// Destroys GPU instance `gi` (its compute instances must be gone).
    pub fn destroy_gpu_instance(&self, index: u32, gi: u32) -> Result<(), NvmlError> {
        let device = self.device(index)?;
        raw::destroy_gpu_instance(self.lib, &device, gi).map_err(call("nvmlGpuInstanceDestroy"))
    }

    /// Destroys compute instance `ci` of GPU instance `gi`.
    pub fn destroy_compute_instance(&self, index: u32, gi: u32, ci: u32) -> Result<(), NvmlError> {
        let device = self.device(index)?;
        raw::destroy_compute_instance(self.lib, &device, gi, ci)
            .map_err(call("nvmlComputeInstanceDestroy"))
    }
}

/// PIDs of compute processes on the GPU, or with MIG on, on any of its MIG devices.
fn processes(device: &Device<'_>, mig: bool) -> Result<Vec<u32>, NvmlError> {
    let mut pids = Vec::new();
    let mut collect = |d: &Device<'_>| -> Result<(), NvmlError> {
        match d.running_compute_processes() {
            Ok(list) => pids.extend(list.iter().map(|p| p.pid)),
            Err(E::NotSupported) => {}
            Err(err) => return Err(call("nvmlDeviceGetComputeRunningProcesses_v3")(err)),
        }
        Ok(())
    };
    collect(device)?;
    if mig {
        let max = device.mig_device_count().unwrap_or(0);
        for i in 0..max {
            if let Ok(mig_device) = device.mig_device_by_index(i) {
                collect(&mig_device)?;
            }
        }
    }
    pids.sort_unstable();
    pids.dedup();
    Ok(pids)
}
