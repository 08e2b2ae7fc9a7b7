//! NVML calls that nvml-wrapper does not wrap, made through its symbol table.
//!
//! This file and nvml-wrapper are the only places gpud crosses into C. Each call resolves the
//! symbol with `nvml_sym` (a missing symbol is an error, never a panic) and passes only
//! handles that nvml-wrapper itself produced.

use std::os::raw::c_uint;

use nvml_wrapper::Device;
use nvml_wrapper::Nvml;
use nvml_wrapper::error::{NvmlError, nvml_sym, nvml_try};
use nvml_wrapper_sys::bindings::{
    nvmlGpuFabricInfo_t, nvmlGpuFabricInfo_v2_t, nvmlGpuInstance_t, nvmlGpuInstanceInfo_t,
    nvmlGpuInstancePlacement_t,
    nvmlIntNvLinkDeviceType_enum_NVML_NVLINK_DEVICE_TYPE_GPU as NVLINK_GPU,
    nvmlIntNvLinkDeviceType_enum_NVML_NVLINK_DEVICE_TYPE_SWITCH as NVLINK_SWITCH,
    nvmlIntNvLinkDeviceType_t,
};

// MIG administration (instance create/destroy), kept apart from the read-side calls.
pub mod mig;

/// What sits at the far end of an NVLink.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RemoteKind {
    Gpu,
    Switch,
    Other,
}

/// The GPU-instance id of a MIG device handle.
pub fn gpu_instance_id(nvml: &Nvml, mig: &Device<'_>) -> Result<u32, NvmlError> {
    let sym = nvml_sym(nvml.lib().nvmlDeviceGetGpuInstanceId.as_ref())?;
    let mut id: c_uint = 0;
    // SAFETY: `mig.handle()` is a device handle NVML gave us and that lives as long as `nvml`;
    // `id` is a valid, writable c_uint for the duration of the call.
    nvml_try(unsafe { sym(mig.handle(), &mut id) })?;
    Ok(id)
}

/// The compute-instance id of a MIG device handle.
pub fn compute_instance_id(nvml: &Nvml, mig: &Device<'_>) -> Result<u32, NvmlError> {
    let sym = nvml_sym(nvml.lib().nvmlDeviceGetComputeInstanceId.as_ref())?;
    let mut id: c_uint = 0;
    // SAFETY: as in `gpu_instance_id`: a live NVML handle and a writable out-parameter.
    nvml_try(unsafe { sym(mig.handle(), &mut id) })?;
    Ok(id)
}

/// Profile id and placement of GPU instance `gi_id` on `parent`.
pub fn gpu_instance_info(
    nvml: &Nvml,
    parent: &Device<'_>,
    gi_id: u32,
) -> Result<(u32, nvmlGpuInstancePlacement_t), NvmlError> {
    let by_id = nvml_sym(nvml.lib().nvmlDeviceGetGpuInstanceById.as_ref())?;
    let get_info = nvml_sym(nvml.lib().nvmlGpuInstanceGetInfo.as_ref())?;
    let mut gi: nvmlGpuInstance_t = std::ptr::null_mut();
    // SAFETY: `parent.handle()` is a live NVML device handle; `gi` is a writable pointer slot
    // that NVML fills with an opaque handle it owns.
    nvml_try(unsafe { by_id(parent.handle(), gi_id, &mut gi) })?;
    let mut info = nvmlGpuInstanceInfo_t {
        device: std::ptr::null_mut(),
        id: 0,
        profileId: 0,
        placement: nvmlGpuInstancePlacement_t { start: 0, size: 0 },
    };
    // SAFETY: `gi` was just returned by NVML for this device; `info` is a fully initialised,
    // writable struct of the type the C signature names.
    nvml_try(unsafe { get_info(gi, &mut info) })?;
    Ok((info.profileId, info.placement))
}

/// What is at the far end of `link` of `device`.
pub fn nvlink_remote_kind(
    nvml: &Nvml,
    device: &Device<'_>,
    link: u32,
) -> Result<RemoteKind, NvmlError> {
    let sym = nvml_sym(nvml.lib().nvmlDeviceGetNvLinkRemoteDeviceType.as_ref())?;
    let mut kind: nvmlIntNvLinkDeviceType_t = 0;
    // SAFETY: a live NVML device handle and a writable enum-sized out-parameter.
    nvml_try(unsafe { sym(device.handle(), link, &mut kind) })?;
    Ok(match kind {
        NVLINK_GPU => RemoteKind::Gpu,
        NVLINK_SWITCH => RemoteKind::Switch,
        _ => RemoteKind::Other,
    })
}

/// A GPU's registration with a multi-node NVLink fabric, as NVML reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FabricInfo {
    /// The fabric's cluster UUID, raw bytes (all zero outside a fabric).
    pub cluster_uuid: [u8; 16],
    /// The registration's outcome, an `nvmlReturn_t`.
    pub status: u32,
    /// The clique (NVLink partition) within the cluster.
    pub clique_id: u32,
    /// An `nvmlGpuFabricState_t`: 0 not supported, 1 not started, 2 in progress, 3 completed.
    pub state: u8,
}

/// `nvmlGpuFabricInfo_v2`: the struct size in the low 24 bits, the version above.
const FABRIC_INFO_V2: u32 = std::mem::size_of::<nvmlGpuFabricInfo_v2_t>() as u32 | (2 << 24);

/// The GPU's fabric registration: `nvmlDeviceGetGpuFabricInfoV` with the v2 struct, or, on
/// drivers that predate it, the unversioned `nvmlDeviceGetGpuFabricInfo`. Both carry the same
/// four facts.
pub fn gpu_fabric_info(nvml: &Nvml, device: &Device<'_>) -> Result<FabricInfo, NvmlError> {
    if let Ok(sym) = nvml_sym(nvml.lib().nvmlDeviceGetGpuFabricInfoV.as_ref()) {
        let mut info = nvmlGpuFabricInfo_v2_t {
            version: FABRIC_INFO_V2,
            clusterUuid: [0; 16],
            status: 0,
            cliqueId: 0,
            state: 0,
            healthMask: 0,
        };
        // SAFETY: a live NVML device handle and a fully initialised, writable v2 struct whose
        // version word says v2, so NVML writes no more than the v2 size; the pointer cast only
        // changes the declared pointee (the symbol is declared with the newest layout).
        nvml_try(unsafe { sym(device.handle(), (&raw mut info).cast()) })?;
        return Ok(FabricInfo {
            cluster_uuid: info.clusterUuid,
            status: info.status,
            clique_id: info.cliqueId,
            state: info.state,
        });
    }
    let sym = nvml_sym(nvml.lib().nvmlDeviceGetGpuFabricInfo.as_ref())?;
    let mut info = nvmlGpuFabricInfo_t {
        clusterUuid: [0; 16],
        status: 0,
        cliqueId: 0,
        state: 0,
    };
    // SAFETY: a live NVML device handle and a fully initialised, writable struct of the type
    // the C signature names.
    nvml_try(unsafe { sym(device.handle(), &mut info) })?;
    Ok(FabricInfo {
        cluster_uuid: info.clusterUuid,
        status: info.status,
        clique_id: info.cliqueId,
        state: info.state,
    })
}

/// One event as NVML delivers it, with the MIG attribution nvml-wrapper's `EventData` drops.
#[derive(Debug, Clone, Copy)]
pub struct RawEventData {
    /// The device handle's address, to map back to a GPU index.
    pub device: usize,
    /// `nvmlEventType*` bit.
    pub event_type: u64,
    /// The XID for critical-XID events.
    pub event_data: u64,
    /// GPU-instance id, `u32::MAX` when the event is not attributed to a MIG instance.
    pub gpu_instance_id: u32,
    /// Compute-instance id, `u32::MAX` when not attributed.
    pub compute_instance_id: u32,
}

/// Waits up to `timeout_ms` for the next event of `set`.
pub fn event_wait(
    nvml: &Nvml,
    set: &nvml_wrapper::EventSet<'_>,
    timeout_ms: u32,
) -> Result<RawEventData, NvmlError> {
    let sym = nvml_sym(nvml.lib().nvmlEventSetWait_v2.as_ref())?;
    let mut data = nvml_wrapper_sys::bindings::nvmlEventData_t {
        device: std::ptr::null_mut(),
        eventType: 0,
        eventData: 0,
        gpuInstanceId: u32::MAX,
        computeInstanceId: u32::MAX,
    };
    // SAFETY: `set.handle()` is the live event set owned by `set`, which outlives the call and is
    // not freed here; `data` is a fully initialised, writable nvmlEventData_t.
    nvml_try(unsafe { sym(set.handle(), &mut data, timeout_ms) })?;
    Ok(RawEventData {
        device: data.device as usize,
        event_type: data.eventType,
        event_data: data.eventData,
        gpu_instance_id: data.gpuInstanceId,
        compute_instance_id: data.computeInstanceId,
    })
}

/// The address of a device handle, used as a key to map event devices back to indices.
pub fn handle_key(device: &Device<'_>) -> usize {
    // SAFETY: reading the handle value does not dereference it; the pointer is only compared.
    unsafe { device.handle() as usize }
}

/// Remapped rows: `(corrected, uncorrected, pending, failure)`.
pub fn remapped_rows(
    nvml: &Nvml,
    device: &Device<'_>,
) -> Result<(u32, u32, bool, bool), NvmlError> {
    let sym = nvml_sym(nvml.lib().nvmlDeviceGetRemappedRows.as_ref())?;
    let (mut corrected, mut uncorrected, mut pending, mut failure): (
        c_uint,
        c_uint,
        c_uint,
        c_uint,
    ) = (0, 0, 0, 0);
    // SAFETY: a live NVML device handle and four writable c_uint out-parameters.
    nvml_try(unsafe {
        sym(
            device.handle(),
            &mut corrected,
            &mut uncorrected,
            &mut pending,
            &mut failure,
        )
    })?;
    Ok((corrected, uncorrected, pending != 0, failure != 0))
}

/// Reads field values with explicit scopes (NVLink fields take the link number as scope, which
/// nvml-wrapper's `field_values_for` cannot pass). The outer error is the call's; each field
/// carries its own. Field ids must be ones whose numbering did not change in NVML 13.0 U1
/// (outside 251–273), as they are passed through untranslated. Values come back as integers:
/// signed values below zero read as 0, doubles are truncated.
pub fn field_values(
    nvml: &Nvml,
    device: &Device<'_>,
    requests: &[(u32, u32)],
) -> Result<Vec<Result<u64, NvmlError>>, NvmlError> {
    use nvml_wrapper_sys::bindings::{
        nvmlFieldValue_t, nvmlValue_t, nvmlValueType_enum_NVML_VALUE_TYPE_DOUBLE as DOUBLE,
        nvmlValueType_enum_NVML_VALUE_TYPE_SIGNED_INT as SINT,
        nvmlValueType_enum_NVML_VALUE_TYPE_SIGNED_LONG_LONG as SLL,
        nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_INT as UINT,
        nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_LONG as ULONG,
        nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_LONG_LONG as ULL,
        nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_SHORT as USHORT,
    };
    let sym = nvml_sym(nvml.lib().nvmlDeviceGetFieldValues.as_ref())?;
    let count = i32::try_from(requests.len()).map_err(|_| NvmlError::InvalidArg)?;
    let mut values: Vec<nvmlFieldValue_t> = requests
        .iter()
        .map(|&(field, scope)| nvmlFieldValue_t {
            fieldId: field,
            scopeId: scope,
            timestamp: 0,
            latencyUsec: 0,
            valueType: 0,
            nvmlReturn: 0,
            value: nvmlValue_t { ullVal: 0 },
        })
        .collect();
    // SAFETY: a live NVML device handle; `values` holds exactly `count` initialised entries
    // that NVML reads (field and scope ids) and writes back in place.
    nvml_try(unsafe { sym(device.handle(), count, values.as_mut_ptr()) })?;
    Ok(values
        .iter()
        .map(|v| {
            nvml_try(v.nvmlReturn)?;
            // SAFETY: NVML wrote the union member that `valueType` names; every member is plain
            // data, so reading the one named is a read of initialised memory of that type.
            let value = unsafe {
                match v.valueType {
                    UINT => u64::from(v.value.uiVal),
                    // `c_ulong` is 64-bit here but not on every platform NVML exists for.
                    #[allow(clippy::useless_conversion)]
                    ULONG => u64::from(v.value.ulVal),
                    ULL => v.value.ullVal,
                    SLL => u64::try_from(v.value.sllVal).unwrap_or(0),
                    SINT => u64::try_from(v.value.siVal).unwrap_or(0),
                    USHORT => u64::from(v.value.usVal),
                    DOUBLE => v.value.dVal.max(0.0) as u64,
                    _ => return Err(NvmlError::UnexpectedVariant(v.valueType)),
                }
            };
            Ok(value)
        })
        .collect())
}

/// Fills an already allocated GPM sample from the whole GPU (`gpu_instance: None`) or from one
/// of its GPU instances, so a sampler can alternate two samples instead of allocating one per
/// reading.
pub fn gpm_fill(
    nvml: &Nvml,
    device: &Device<'_>,
    gpu_instance: Option<u32>,
    sample: &nvml_wrapper::GpmSample<'_>,
) -> Result<(), NvmlError> {
    match gpu_instance {
        None => {
            let sym = nvml_sym(nvml.lib().nvmlGpmSampleGet.as_ref())?;
            // SAFETY: a live device handle and a live sample owned by `sample`, which outlives
            // the call and is not freed here; NVML writes only into the sample.
            nvml_try(unsafe { sym(device.handle(), sample.handle()) })
        }
        Some(id) => {
            let sym = nvml_sym(nvml.lib().nvmlGpmMigSampleGet.as_ref())?;
            // SAFETY: as above, for the GPU-instance variant of the call.
            nvml_try(unsafe { sym(device.handle(), id, sample.handle()) })
        }
    }
}
