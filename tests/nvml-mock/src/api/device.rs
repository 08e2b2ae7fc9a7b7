//! Device inventory: enumeration and lookup, identity (name, UUID, serial, PCI), memory,
//! NUMA/CPU affinity, power limits, persistence and compute mode.

use std::os::raw::{c_char, c_int, c_uint, c_ulong};

use super::{addr, handle, mig_device};
use crate::driver::{self, Dev};
use crate::ffi::{
    export, get_str, get_version, put, put_slice, put_str, rc, require, struct_version,
};
use crate::mig::mig_uuid;
use crate::node::PciAddress;
use crate::registry::Obj;
use nvml_wrapper_sys::bindings::*;

export! {
    /// Number of GPUs, lost ones included.
    fn nvmlDeviceGetCount_v2(device_count: *mut c_uint) {
        let s = driver::session()?;
        put!(device_count, s.node.gpus.len() as c_uint);
        Ok(())
    }
}

export! {
    /// The handle of GPU `index`.
    fn nvmlDeviceGetHandleByIndex_v2(index: c_uint, device: *mut nvmlDevice_t) {
        let h = driver::with(|s, rt| {
            let i = index as usize;
            if i >= s.node.gpus.len() {
                return Err(rc::INVALID_ARGUMENT);
            }
            if rt.faults[i].lost {
                return Err(rc::GPU_IS_LOST);
            }
            Ok(rt.registry.handle(Obj::Gpu(i)))
        })?;
        put!(device, handle(h));
        Ok(())
    }
}

export! {
    /// The handle of a GPU (`GPU-…`) or MIG device (`MIG-…`) by UUID.
    fn nvmlDeviceGetHandleByUUID(uuid: *const c_char, device: *mut nvmlDevice_t) {
        let wanted = get_str!(uuid);
        let h = driver::with(|s, rt| {
            if let Some(g) = s.node.gpu_by_uuid(&wanted) {
                if rt.faults[g.index].lost {
                    return Err(rc::GPU_IS_LOST);
                }
                return Ok(rt.registry.handle(Obj::Gpu(g.index)));
            }
            rt.sync_state(&s.node);
            for g in &s.node.gpus {
                for (gi, ci) in rt.mig[g.index].mig_devices() {
                    if mig_uuid(&g.uuid, gi, ci) == wanted {
                        if rt.faults[g.index].lost {
                            return Err(rc::GPU_IS_LOST);
                        }
                        return Ok(rt.registry.handle(Obj::Mig { gpu: g.index, gi, ci }));
                    }
                }
            }
            Err(rc::NOT_FOUND)
        })?;
        put!(device, handle(h));
        Ok(())
    }
}

export! {
    /// The handle of a GPU by PCI bus id (`00000000:18:00.0`, `0000:18:00.0` or `18:00.0`).
    fn nvmlDeviceGetHandleByPciBusId_v2(pci_bus_id: *const c_char, device: *mut nvmlDevice_t) {
        let text = get_str!(pci_bus_id);
        let wanted = PciAddress::parse(&text).ok_or(rc::INVALID_ARGUMENT)?;
        let h = driver::with(|s, rt| {
            let g = s.node.gpus.iter().find(|g| g.address == wanted).ok_or(rc::NOT_FOUND)?;
            if rt.faults[g.index].lost {
                return Err(rc::GPU_IS_LOST);
            }
            Ok(rt.registry.handle(Obj::Gpu(g.index)))
        })?;
        put!(device, handle(h));
        Ok(())
    }
}

export! {
    /// The handle of a GPU by board serial number.
    fn nvmlDeviceGetHandleBySerial(serial: *const c_char, device: *mut nvmlDevice_t) {
        let wanted = get_str!(serial);
        let h = driver::with(|s, rt| {
            let g = s.node.gpus.iter().find(|g| g.serial == wanted).ok_or(rc::NOT_FOUND)?;
            if rt.faults[g.index].lost {
                return Err(rc::GPU_IS_LOST);
            }
            Ok(rt.registry.handle(Obj::Gpu(g.index)))
        })?;
        put!(device, handle(h));
        Ok(())
    }
}

export! {
    /// The NVML index of a GPU.
    fn nvmlDeviceGetIndex(device: nvmlDevice_t, index: *mut c_uint) {
        let i = driver::with(|s, rt| rt.gpu(&s.node, addr(device)))?;
        put!(index, i as c_uint);
        Ok(())
    }
}

export! {
    /// Product name; a MIG device is `<parent name> MIG <profile>`.
    fn nvmlDeviceGetName(device: nvmlDevice_t, name: *mut c_char, length: c_uint) {
        let text = driver::with(|s, rt| match rt.device(&s.node, addr(device))? {
            Dev::Gpu(i) => Ok(s.node.gpus[i].model.name.clone()),
            Dev::Mig { gpu, gi, ci } => Ok(mig_device(s, rt, gpu, gi, ci)?.name),
        })?;
        put_str!(name, length, &text);
        Ok(())
    }
}

export! {
    /// `GPU-…` for a GPU, `MIG-…` for a MIG device.
    fn nvmlDeviceGetUUID(device: nvmlDevice_t, uuid: *mut c_char, length: c_uint) {
        let text = driver::with(|s, rt| match rt.device(&s.node, addr(device))? {
            Dev::Gpu(i) => Ok(s.node.gpus[i].uuid.clone()),
            Dev::Mig { gpu, gi, ci } => Ok(mig_device(s, rt, gpu, gi, ci)?.uuid),
        })?;
        put_str!(uuid, length, &text);
        Ok(())
    }
}

export! {
    /// Board serial number.
    fn nvmlDeviceGetSerial(device: nvmlDevice_t, serial: *mut c_char, length: c_uint) {
        let text = driver::with(|s, rt| Ok(s.node.gpus[rt.gpu(&s.node, addr(device))?].serial.clone()))?;
        put_str!(serial, length, &text);
        Ok(())
    }
}

export! {
    /// Board part number.
    fn nvmlDeviceGetBoardPartNumber(device: nvmlDevice_t, part_number: *mut c_char, length: c_uint) {
        let text = driver::with(|s, rt| {
            Ok(s.node.gpus[rt.gpu(&s.node, addr(device))?].board_part_number.clone())
        })?;
        put_str!(part_number, length, &text);
        Ok(())
    }
}

export! {
    /// `nvmlBrandType_t` of the product.
    fn nvmlDeviceGetBrand(device: nvmlDevice_t, type_: *mut nvmlBrandType_t) {
        let brand = driver::with(|s, rt| Ok(s.node.gpus[rt.gpu(&s.node, addr(device))?].model.brand))?;
        put!(type_, brand);
        Ok(())
    }
}

export! {
    /// `nvmlDeviceArchitecture_t` of the GPU.
    fn nvmlDeviceGetArchitecture(device: nvmlDevice_t, arch: *mut nvmlDeviceArchitecture_t) {
        let a = driver::with(|s, rt| Ok(s.node.gpus[rt.gpu(&s.node, addr(device))?].model.architecture))?;
        put!(arch, a);
        Ok(())
    }
}

export! {
    /// CUDA compute capability.
    fn nvmlDeviceGetCudaComputeCapability(device: nvmlDevice_t, major: *mut c_int, minor: *mut c_int) {
        require!(major, minor);
        let cc = driver::with(|s, rt| {
            Ok(s.node.gpus[rt.gpu(&s.node, addr(device))?].model.compute_capability)
        })?;
        put!(major, cc.0);
        put!(minor, cc.1);
        Ok(())
    }
}

export! {
    /// The `N` of `/dev/nvidiaN`; MIG devices report their parent's.
    fn nvmlDeviceGetMinorNumber(device: nvmlDevice_t, minor_number: *mut c_uint) {
        let n = driver::with(|s, rt| Ok(s.node.gpus[rt.device(&s.node, addr(device))?.gpu()].minor_number))?;
        put!(minor_number, n);
        Ok(())
    }
}

/// Fills an `nvmlPciInfo_t` for a PCI function.
pub(crate) fn pci_info(address: &PciAddress, device_id: u32, subsystem_id: u32) -> nvmlPciInfo_t {
    let mut info = nvmlPciInfo_t {
        busIdLegacy: [0; 16],
        domain: address.domain,
        bus: address.bus,
        device: address.device,
        pciDeviceId: device_id,
        pciSubSystemId: subsystem_id,
        busId: [0; 32],
    };
    crate::ffi::fill_char_array(&mut info.busIdLegacy, &address.bus_id_legacy());
    crate::ffi::fill_char_array(&mut info.busId, &address.bus_id());
    info
}

export! {
    /// PCI identity; MIG devices report their parent's.
    fn nvmlDeviceGetPciInfo_v3(device: nvmlDevice_t, pci: *mut nvmlPciInfo_t) {
        let info = driver::with(|s, rt| {
            let g = &s.node.gpus[rt.device(&s.node, addr(device))?.gpu()];
            Ok(pci_info(&g.address, g.model.pci_device_id, g.model.pci_subsystem_id))
        })?;
        put!(pci, info);
        Ok(())
    }
}

/// `(total, reserved, used)` in bytes for a GPU or MIG device.
fn memory(device: nvmlDevice_t) -> crate::ffi::Res<(u64, u64, u64)> {
    driver::with(|s, rt| match rt.device(&s.node, addr(device))? {
        Dev::Gpu(i) => {
            let m = &s.node.gpus[i].model;
            Ok((
                m.memory_mib << 20,
                m.reserved_memory_mib << 20,
                s.probe(i).mem_used_bytes(),
            ))
        }
        Dev::Mig { gpu, gi, ci } => {
            let total_mib = mig_device(s, rt, gpu, gi, ci)?.gi.memory_mib;
            Ok((
                total_mib << 20,
                0,
                s.probe(gpu).mig_mem_used_bytes(gi, ci, total_mib),
            ))
        }
    })
}

export! {
    /// Framebuffer usage, v1 layout: `used` includes the driver's reservation.
    fn nvmlDeviceGetMemoryInfo(device: nvmlDevice_t, memory_out: *mut nvmlMemory_t) {
        let (total, reserved, used) = memory(device)?;
        put!(memory_out, nvmlMemory_t { total, free: total - reserved - used, used: reserved + used });
        Ok(())
    }
}

export! {
    /// Framebuffer usage, v2 layout (`version` must be `nvmlMemory_v2`).
    fn nvmlDeviceGetMemoryInfo_v2(device: nvmlDevice_t, memory_out: *mut nvmlMemory_v2_t) {
        let version = get_version!(memory_out);
        let expected = struct_version::<nvmlMemory_v2_t>(2);
        let (total, reserved, used) = memory(device)?;
        if version != expected {
            return Err(rc::ARGUMENT_VERSION_MISMATCH);
        }
        put!(memory_out, nvmlMemory_v2_t { version, total, reserved, free: total - reserved - used, used });
        Ok(())
    }
}

export! {
    /// NUMA node closest to the GPU.
    fn nvmlDeviceGetNumaNodeId(device: nvmlDevice_t, node: *mut c_uint) {
        let n = driver::with(|s, rt| Ok(s.node.gpus[rt.gpu(&s.node, addr(device))?].numa_node))?;
        put!(node, n);
        Ok(())
    }
}

/// Packs bit numbers into an array of `c_ulong` words, the `cpu_set_t`-like layout NVML uses.
fn bitmask(bits: impl Iterator<Item = u32>, words: usize) -> Vec<c_ulong> {
    let width = c_ulong::BITS;
    let mut out = vec![0 as c_ulong; words];
    for bit in bits {
        if let Some(word) = out.get_mut((bit / width) as usize) {
            *word |= 1 << (bit % width);
        }
    }
    out
}

export! {
    /// CPUs close to the GPU, as a bitmask of `cpu_set_size` words.
    fn nvmlDeviceGetCpuAffinity(device: nvmlDevice_t, cpu_set_size: c_uint, cpu_set: *mut c_ulong) {
        let cpus = driver::with(|s, rt| Ok(s.node.gpus[rt.gpu(&s.node, addr(device))?].cpus.clone()))?;
        if cpu_set_size == 0 {
            return Err(rc::INVALID_ARGUMENT);
        }
        put_slice!(cpu_set, bitmask(cpus.into_iter(), cpu_set_size as usize));
        Ok(())
    }
}

export! {
    /// NUMA nodes close to the GPU, as a bitmask of `node_set_size` words (either scope).
    fn nvmlDeviceGetMemoryAffinity(
        device: nvmlDevice_t,
        node_set_size: c_uint,
        node_set: *mut c_ulong,
        scope: nvmlAffinityScope_t,
    ) {
        let n = driver::with(|s, rt| Ok(s.node.gpus[rt.gpu(&s.node, addr(device))?].numa_node))?;
        if node_set_size == 0 || scope > NVML_AFFINITY_SCOPE_SOCKET {
            return Err(rc::INVALID_ARGUMENT);
        }
        put_slice!(node_set, bitmask(std::iter::once(n), node_set_size as usize));
        Ok(())
    }
}

/// Runs `f` on the GPU behind a physical-GPU handle.
fn with_gpu<R>(device: nvmlDevice_t, f: impl FnOnce(&crate::node::Gpu) -> R) -> crate::ffi::Res<R> {
    driver::with(|s, rt| Ok(f(&s.node.gpus[rt.gpu(&s.node, addr(device))?])))
}

export! {
    /// Current power limit, mW.
    fn nvmlDeviceGetPowerManagementLimit(device: nvmlDevice_t, limit: *mut c_uint) {
        put!(limit, with_gpu(device, |g| g.power_limit_mw)?);
        Ok(())
    }
}

export! {
    /// Default power limit, mW.
    fn nvmlDeviceGetPowerManagementDefaultLimit(device: nvmlDevice_t, default_limit: *mut c_uint) {
        put!(default_limit, with_gpu(device, |g| g.model.power.default_mw)?);
        Ok(())
    }
}

export! {
    /// Power limit actually enforced, mW (the management limit: no other limiter is modelled).
    fn nvmlDeviceGetEnforcedPowerLimit(device: nvmlDevice_t, limit: *mut c_uint) {
        put!(limit, with_gpu(device, |g| g.power_limit_mw)?);
        Ok(())
    }
}

export! {
    /// Settable power limit range, mW.
    fn nvmlDeviceGetPowerManagementLimitConstraints(
        device: nvmlDevice_t,
        min_limit: *mut c_uint,
        max_limit: *mut c_uint,
    ) {
        require!(min_limit, max_limit);
        let (min, max) = with_gpu(device, |g| (g.model.power.min_mw, g.model.power.max_mw))?;
        put!(min_limit, min);
        put!(max_limit, max);
        Ok(())
    }
}

export! {
    /// Persistence mode.
    fn nvmlDeviceGetPersistenceMode(device: nvmlDevice_t, mode: *mut nvmlEnableState_t) {
        let on = with_gpu(device, |g| g.persistence_mode)?;
        put!(mode, if on { nvmlEnableState_enum_NVML_FEATURE_ENABLED } else { nvmlEnableState_enum_NVML_FEATURE_DISABLED });
        Ok(())
    }
}

export! {
    /// Compute mode: the fixture's until `nvmlDeviceSetComputeMode` (in this or another
    /// process sharing the state file) changes it.
    fn nvmlDeviceGetComputeMode(device: nvmlDevice_t, mode: *mut nvmlComputeMode_t) {
        let current = driver::with(|s, rt| {
            let gpu = rt.gpu(&s.node, addr(device))?;
            rt.sync_state(&s.node);
            Ok(rt.compute_mode[gpu])
        })?;
        put!(mode, current);
        Ok(())
    }
}

export! {
    /// Sets the compute mode (DEFAULT, PROHIBITED or EXCLUSIVE_PROCESS; EXCLUSIVE_THREAD was
    /// removed from the driver and is refused as NVML does) and writes it to the state file.
    fn nvmlDeviceSetComputeMode(device: nvmlDevice_t, mode: nvmlComputeMode_t) {
        driver::with(|s, rt| {
            let gpu = rt.gpu(&s.node, addr(device))?;
            let valid = [
                nvmlComputeMode_enum_NVML_COMPUTEMODE_DEFAULT,
                nvmlComputeMode_enum_NVML_COMPUTEMODE_PROHIBITED,
                nvmlComputeMode_enum_NVML_COMPUTEMODE_EXCLUSIVE_PROCESS,
            ];
            if !valid.contains(&mode) {
                return Err(crate::ffi::rc::INVALID_ARGUMENT);
            }
            rt.sync_state(&s.node);
            rt.compute_mode[gpu] = mode;
            rt.persist(&s.node);
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bitmask_spans_words() {
        let m = bitmask([0, 1, 64, 130].into_iter(), 2);
        assert_eq!(m, vec![0b11, 1]);
    }
}
