//! Live telemetry for exporters: utilisation, power and energy, clocks and clock-event
//! reasons, fans, PCIe counters and throughput, P-state, BAR1, codec utilisation, processes.
//! Values come from [`crate::telemetry`], a pure function of seed, GPU, field and mock time.

use std::os::raw::{c_uint, c_ulonglong};

use super::addr;
use super::health::temperature_of;
use crate::driver::{self, Runtime, Session};
use crate::ffi::{
    Res, export, get, get_version, put, put_counted, put_slice, rc, require, struct_version,
};
use nvml_wrapper_sys::bindings as b;
use nvml_wrapper_sys::bindings::*;

/// Resolves a physical GPU for a reading that NVML does not provide per GPU while MIG is on
/// (utilisation and codec counters move to the MIG devices, which NVML cannot sample either).
fn sampled_gpu(s: &Session, rt: &mut Runtime, device: nvmlDevice_t) -> Res<usize> {
    let gpu = rt.gpu(&s.node, addr(device))?;
    rt.sync_state(&s.node);
    if rt.mig[gpu].enabled() {
        return Err(rc::NOT_SUPPORTED);
    }
    Ok(gpu)
}

export! {
    /// GPU and memory utilisation, percent.
    fn nvmlDeviceGetUtilizationRates(device: nvmlDevice_t, utilization: *mut nvmlUtilization_t) {
        let u = driver::with(|s, rt| {
            let p = s.probe(sampled_gpu(s, rt, device)?);
            Ok(nvmlUtilization_t { gpu: p.gpu_util(), memory: p.mem_util() })
        })?;
        put!(utilization, u);
        Ok(())
    }
}

export! {
    /// Board power draw, mW.
    fn nvmlDeviceGetPowerUsage(device: nvmlDevice_t, power: *mut c_uint) {
        let mw = driver::with(|s, rt| Ok(s.probe(rt.gpu(&s.node, addr(device))?).power_mw()))?;
        put!(power, mw);
        Ok(())
    }
}

export! {
    /// Energy since driver load, mJ (monotonic, the integral of the power readings).
    fn nvmlDeviceGetTotalEnergyConsumption(device: nvmlDevice_t, energy: *mut c_ulonglong) {
        let mj = driver::with(|s, rt| Ok(s.probe(rt.gpu(&s.node, addr(device))?).energy_mj()))?;
        put!(energy, mj);
        Ok(())
    }
}

/// `(current, max)` MHz of one clock domain.
fn clocks(device: nvmlDevice_t, clock_type: nvmlClockType_t) -> Res<(u32, u32)> {
    driver::with(|s, rt| {
        let gpu = rt.gpu(&s.node, addr(device))?;
        let p = s.probe(gpu);
        let m = &s.node.gpus[gpu].model;
        let (idle, max) = match clock_type {
            b::nvmlClockType_enum_NVML_CLOCK_GRAPHICS => {
                (m.idle_clocks.graphics, m.max_clocks.graphics)
            }
            b::nvmlClockType_enum_NVML_CLOCK_SM => (m.idle_clocks.sm, m.max_clocks.sm),
            b::nvmlClockType_enum_NVML_CLOCK_MEM => {
                return Ok((p.memory_clock(), m.max_clocks.memory));
            }
            b::nvmlClockType_enum_NVML_CLOCK_VIDEO => (m.idle_clocks.video, m.max_clocks.video),
            _ => return Err(rc::INVALID_ARGUMENT),
        };
        Ok((p.clock(idle, max), max))
    })
}

export! {
    /// Current clock of a domain, MHz.
    fn nvmlDeviceGetClockInfo(device: nvmlDevice_t, type_: nvmlClockType_t, clock: *mut c_uint) {
        put!(clock, clocks(device, type_)?.0);
        Ok(())
    }
}

export! {
    /// Maximum clock of a domain, MHz.
    fn nvmlDeviceGetMaxClockInfo(device: nvmlDevice_t, type_: nvmlClockType_t, clock: *mut c_uint) {
        put!(clock, clocks(device, type_)?.1);
        Ok(())
    }
}

export! {
    /// A clock by id: current, or the application/boost targets (which default to max).
    fn nvmlDeviceGetClock(
        device: nvmlDevice_t,
        clock_type: nvmlClockType_t,
        clock_id: nvmlClockId_t,
        clock_m_hz: *mut c_uint,
    ) {
        let (current, max) = clocks(device, clock_type)?;
        let v = match clock_id {
            b::nvmlClockId_enum_NVML_CLOCK_ID_CURRENT => current,
            b::nvmlClockId_enum_NVML_CLOCK_ID_APP_CLOCK_TARGET
            | b::nvmlClockId_enum_NVML_CLOCK_ID_APP_CLOCK_DEFAULT
            | b::nvmlClockId_enum_NVML_CLOCK_ID_CUSTOMER_BOOST_MAX => max,
            _ => return Err(rc::INVALID_ARGUMENT),
        };
        put!(clock_m_hz, v);
        Ok(())
    }
}

fn reasons(device: nvmlDevice_t) -> Res<u64> {
    driver::with(|s, rt| {
        let gpu = rt.gpu(&s.node, addr(device))?;
        Ok(s.probe(gpu).clock_event_reasons(temperature_of(s, rt, gpu)))
    })
}

export! {
    /// Why clocks are below max (idle, power cap, thermal slowdown).
    fn nvmlDeviceGetCurrentClocksThrottleReasons(device: nvmlDevice_t, clocks_throttle_reasons: *mut c_ulonglong) {
        put!(clocks_throttle_reasons, reasons(device)?);
        Ok(())
    }
}

export! {
    /// Same as the throttle reasons, under the newer name.
    fn nvmlDeviceGetCurrentClocksEventReasons(device: nvmlDevice_t, clocks_event_reasons: *mut c_ulonglong) {
        put!(clocks_event_reasons, reasons(device)?);
        Ok(())
    }
}

/// Resolves a GPU with at least one fan.
fn fan_gpu(s: &Session, rt: &mut Runtime, device: nvmlDevice_t) -> Res<(usize, u32)> {
    let gpu = rt.gpu(&s.node, addr(device))?;
    match s.node.gpus[gpu].model.fans {
        0 => Err(rc::NOT_SUPPORTED),
        n => Ok((gpu, n)),
    }
}

export! {
    /// Fan speed, percent; passively cooled boards answer `NVML_ERROR_NOT_SUPPORTED`.
    fn nvmlDeviceGetFanSpeed(device: nvmlDevice_t, speed: *mut c_uint) {
        let v = driver::with(|s, rt| Ok(s.probe(fan_gpu(s, rt, device)?.0).fan_percent()))?;
        put!(speed, v);
        Ok(())
    }
}

export! {
    /// Speed of one fan, percent.
    fn nvmlDeviceGetFanSpeed_v2(device: nvmlDevice_t, fan: c_uint, speed: *mut c_uint) {
        let v = driver::with(|s, rt| {
            let (gpu, fans) = fan_gpu(s, rt, device)?;
            if fan >= fans {
                return Err(rc::INVALID_ARGUMENT);
            }
            Ok(s.probe(gpu).fan_percent())
        })?;
        put!(speed, v);
        Ok(())
    }
}

export! {
    /// Number of fans (0 on passively cooled boards).
    fn nvmlDeviceGetNumFans(device: nvmlDevice_t, num_fans: *mut c_uint) {
        let n = driver::with(|s, rt| Ok(s.node.gpus[rt.gpu(&s.node, addr(device))?].model.fans))?;
        put!(num_fans, n);
        Ok(())
    }
}

export! {
    /// PCIe replays since boot.
    fn nvmlDeviceGetPcieReplayCounter(device: nvmlDevice_t, value: *mut c_uint) {
        let v = driver::with(|s, rt| Ok(s.probe(rt.gpu(&s.node, addr(device))?).pcie_replays()))?;
        put!(value, v);
        Ok(())
    }
}

export! {
    /// PCIe throughput over the last sample, KB/s.
    fn nvmlDeviceGetPcieThroughput(device: nvmlDevice_t, counter: nvmlPcieUtilCounter_t, value: *mut c_uint) {
        let tx = match counter {
            b::nvmlPcieUtilCounter_enum_NVML_PCIE_UTIL_TX_BYTES => true,
            b::nvmlPcieUtilCounter_enum_NVML_PCIE_UTIL_RX_BYTES => false,
            _ => return Err(rc::INVALID_ARGUMENT),
        };
        let v = driver::with(|s, rt| Ok(s.probe(rt.gpu(&s.node, addr(device))?).pcie_kbps(tx)))?;
        put!(value, v);
        Ok(())
    }
}

export! {
    /// Performance state: P0, as a persistence-mode data-centre GPU reports at idle too.
    fn nvmlDeviceGetPerformanceState(device: nvmlDevice_t, p_state: *mut nvmlPstates_t) {
        driver::with(|s, rt| rt.gpu(&s.node, addr(device)))?;
        put!(p_state, b::nvmlPStates_enum_NVML_PSTATE_0);
        Ok(())
    }
}

export! {
    /// BAR1 aperture usage, bytes; a MIG device answers with its GPU's aperture, which its
    /// instances share (nvitop shows it per MIG device).
    fn nvmlDeviceGetBAR1MemoryInfo(device: nvmlDevice_t, bar1_memory: *mut nvmlBAR1Memory_t) {
        let info = driver::with(|s, rt| {
            let gpu = rt.device(&s.node, addr(device))?.gpu();
            let total = s.node.gpus[gpu].model.bar1_mib << 20;
            let used = s.probe(gpu).bar1_used_mib() << 20;
            let used = used.min(total);
            Ok(nvmlBAR1Memory_t { bar1Total: total, bar1Free: total - used, bar1Used: used })
        })?;
        put!(bar1_memory, info);
        Ok(())
    }
}

/// Codec utilisation: nothing encodes or decodes in the simulation.
fn codec(device: nvmlDevice_t, utilization: *mut c_uint, sampling_period_us: *mut c_uint) -> Res {
    require!(utilization, sampling_period_us);
    driver::with(|s, rt| sampled_gpu(s, rt, device))?;
    put!(utilization, 0);
    put!(sampling_period_us, 167_000);
    Ok(())
}

export! {
    /// Encoder utilisation, percent, and the sampling period.
    fn nvmlDeviceGetEncoderUtilization(device: nvmlDevice_t, utilization: *mut c_uint, sampling_period_us: *mut c_uint) {
        codec(device, utilization, sampling_period_us)
    }
}

export! {
    /// Decoder utilisation, percent, and the sampling period.
    fn nvmlDeviceGetDecoderUtilization(device: nvmlDevice_t, utilization: *mut c_uint, sampling_period_us: *mut c_uint) {
        codec(device, utilization, sampling_period_us)
    }
}

/// Processes of one kind on a GPU or MIG device: the simulated node runs none (count protocol
/// as NVML: `*info_count` becomes 0 and NVML_SUCCESS).
fn no_processes(
    device: nvmlDevice_t,
    info_count: *mut c_uint,
    infos: *mut nvmlProcessInfo_t,
) -> Res {
    driver::with(|s, rt| rt.device(&s.node, addr(device)))?;
    let none: [nvmlProcessInfo_t; 0] = [];
    put_counted!(info_count, infos, none.as_slice());
    Ok(())
}

/// NVML's "no instance" id in a process record.
const NO_INSTANCE_ID: u32 = u32::MAX;

export! {
    /// Compute processes (the control file's `process` lines; count protocol as NVML): on a
    /// GPU every process, those inside a MIG GPU instance with its ids (compute instance 0);
    /// on a MIG device only the processes of its GPU instance. `usedGpuMemory` in bytes.
    fn nvmlDeviceGetComputeRunningProcesses_v3(
        device: nvmlDevice_t,
        info_count: *mut c_uint,
        infos: *mut nvmlProcessInfo_t,
    ) {
        let list = driver::with(|s, rt| {
            let (gpu, only) = match rt.device(&s.node, addr(device))? {
                driver::Dev::Gpu(i) => (i, None),
                driver::Dev::Mig { gpu, gi, .. } => (gpu, Some(gi)),
            };
            Ok(rt.faults[gpu]
                .processes
                .iter()
                .filter(|(_, p)| only.is_none_or(|gi| p.gpu_instance == Some(gi)))
                .map(|(&pid, p)| nvmlProcessInfo_t {
                    pid,
                    usedGpuMemory: p.usage.memory_bytes,
                    gpuInstanceId: p.gpu_instance.unwrap_or(NO_INSTANCE_ID),
                    computeInstanceId: p.gpu_instance.map_or(NO_INSTANCE_ID, |_| 0),
                })
                .collect::<Vec<_>>())
        })?;
        put_counted!(info_count, infos, list.as_slice());
        Ok(())
    }
}

/// The per-process samples of a GPU newer than `last_seen_us`: one per process, stamped with
/// the mock clock's time. `NOT_FOUND` when there is none (no process, or nothing newer); not
/// sampled on a MIG device or a GPU in MIG mode, as real drivers.
fn process_samples(
    device: nvmlDevice_t,
    last_seen_us: u64,
) -> Res<Vec<(u32, u64, crate::control::ProcessUsage)>> {
    let samples = driver::with(|s, rt| {
        let gpu = sampled_gpu(s, rt, device)?;
        let now = s.timestamp_us();
        Ok(rt.faults[gpu]
            .processes
            .iter()
            .filter(|_| now > last_seen_us)
            .map(|(&pid, p)| (pid, now, p.usage))
            .collect::<Vec<_>>())
    })?;
    if samples.is_empty() {
        return Err(rc::NOT_FOUND);
    }
    Ok(samples)
}

export! {
    /// Per-process utilisation samples (see [`process_samples`]). `utilization` NULL asks for
    /// the count: `*process_samples_count` is set and the answer is
    /// `NVML_ERROR_INSUFFICIENT_SIZE`, as it is for too small a buffer.
    fn nvmlDeviceGetProcessUtilization(
        device: nvmlDevice_t,
        utilization: *mut nvmlProcessUtilizationSample_t,
        process_samples_count: *mut c_uint,
        last_seen_time_stamp: c_ulonglong,
    ) {
        require!(process_samples_count);
        let samples = process_samples(device, last_seen_time_stamp)?;
        let list: Vec<nvmlProcessUtilizationSample_t> = samples
            .into_iter()
            .map(|(pid, t, u)| nvmlProcessUtilizationSample_t {
                pid,
                timeStamp: t,
                smUtil: u.sm,
                memUtil: u.mem,
                encUtil: u.enc,
                decUtil: u.dec,
            })
            .collect();
        if utilization.is_null() {
            put!(process_samples_count, list.len() as c_uint);
            return Err(rc::INSUFFICIENT_SIZE);
        }
        put_counted!(process_samples_count, utilization, list.as_slice());
        Ok(())
    }
}

export! {
    /// Per-process utilisation, versioned (`nvmlProcessesUtilizationInfo_v1`): the samples of
    /// `nvmlDeviceGetProcessUtilization` with JPEG and OFA at 0. `procUtilArray` NULL or too
    /// small: `processSamplesCount` is set and the answer is `NVML_ERROR_INSUFFICIENT_SIZE`.
    fn nvmlDeviceGetProcessesUtilizationInfo(
        device: nvmlDevice_t,
        processes_util_info: *mut nvmlProcessesUtilizationInfo_t,
    ) {
        let version = get_version!(processes_util_info);
        if version != struct_version::<nvmlProcessesUtilizationInfo_v1_t>(1) {
            return Err(rc::ARGUMENT_VERSION_MISMATCH);
        }
        let mut info = get!(processes_util_info);
        let samples = process_samples(device, info.lastSeenTimeStamp)?;
        let list: Vec<nvmlProcessUtilizationInfo_v1_t> = samples
            .into_iter()
            .map(|(pid, t, u)| nvmlProcessUtilizationInfo_v1_t {
                timeStamp: t,
                pid,
                smUtil: u.sm,
                memUtil: u.mem,
                encUtil: u.enc,
                decUtil: u.dec,
                jpgUtil: 0,
                ofaUtil: 0,
            })
            .collect();
        let capacity = info.processSamplesCount as usize;
        info.processSamplesCount = list.len() as c_uint;
        if info.procUtilArray.is_null() || capacity < list.len() {
            put!(processes_util_info, info);
            return Err(rc::INSUFFICIENT_SIZE);
        }
        put_slice!(info.procUtilArray, list.as_slice());
        put!(processes_util_info, info);
        Ok(())
    }
}

export! {
    /// Graphics processes (nvitop and nvidia-ml-py list them beside compute ones): none.
    fn nvmlDeviceGetGraphicsRunningProcesses_v3(
        device: nvmlDevice_t,
        info_count: *mut c_uint,
        infos: *mut nvmlProcessInfo_t,
    ) {
        no_processes(device, info_count, infos)
    }
}

export! {
    /// MPS compute processes: none (the simulated node runs no MPS server).
    fn nvmlDeviceGetMPSComputeRunningProcesses_v3(
        device: nvmlDevice_t,
        info_count: *mut c_uint,
        infos: *mut nvmlProcessInfo_t,
    ) {
        no_processes(device, info_count, infos)
    }
}

/// A display state: data-centre GPUs drive no display.
fn no_display(device: nvmlDevice_t, state: *mut nvmlEnableState_t) -> Res {
    require!(state);
    driver::with(|s, rt| rt.gpu(&s.node, addr(device)))?;
    put!(state, b::nvmlEnableState_enum_NVML_FEATURE_DISABLED);
    Ok(())
}

export! {
    /// Whether a display is connected: never (nvitop shows it).
    fn nvmlDeviceGetDisplayMode(device: nvmlDevice_t, display: *mut nvmlEnableState_t) {
        no_display(device, display)
    }
}

export! {
    /// Whether a display is initialised on the GPU: never.
    fn nvmlDeviceGetDisplayActive(device: nvmlDevice_t, is_active: *mut nvmlEnableState_t) {
        no_display(device, is_active)
    }
}

/// The Windows driver model (WDDM/TCC): not supported on Linux, as NVML answers there.
fn no_driver_model(device: nvmlDevice_t) -> Res {
    driver::with(|s, rt| rt.gpu(&s.node, addr(device)))?;
    Err(rc::NOT_SUPPORTED)
}

export! {
    /// The driver model in use and after a reboot: not supported on Linux.
    fn nvmlDeviceGetDriverModel_v2(
        device: nvmlDevice_t,
        current: *mut nvmlDriverModel_t,
        pending: *mut nvmlDriverModel_t,
    ) {
        let _ = (current, pending);
        no_driver_model(device)
    }
}

export! {
    /// The driver model, older entry point: not supported on Linux.
    fn nvmlDeviceGetDriverModel(
        device: nvmlDevice_t,
        current: *mut nvmlDriverModel_t,
        pending: *mut nvmlDriverModel_t,
    ) {
        let _ = (current, pending);
        no_driver_model(device)
    }
}
