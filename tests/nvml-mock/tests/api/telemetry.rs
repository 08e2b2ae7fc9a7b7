//! Telemetry: determinism under a pinned clock, physical plausibility, field values.

use std::os::raw::{c_uint, c_ulonglong};
use std::ptr::null_mut;

use crate::common::*;

#[derive(Debug, PartialEq, Eq)]
struct Snapshot {
    util: (u32, u32),
    power: u32,
    energy: u64,
    temp: u32,
    clocks: [u32; 4],
    used: u64,
    replays: u32,
}

fn snapshot(h: nvmlDevice_t) -> Snapshot {
    let mut u = nvmlUtilization_t { gpu: 0, memory: 0 };
    assert_eq!(call!(nvmlDeviceGetUtilizationRates(h, &mut u)), rc::SUCCESS);
    let (mut power, mut energy, mut temp, mut replays) = (0, 0, 0, 0);
    assert_eq!(call!(nvmlDeviceGetPowerUsage(h, &mut power)), rc::SUCCESS);
    assert_eq!(
        call!(nvmlDeviceGetTotalEnergyConsumption(h, &mut energy)),
        rc::SUCCESS
    );
    assert_eq!(
        call!(nvmlDeviceGetTemperature(h, 0, &mut temp)),
        rc::SUCCESS
    );
    assert_eq!(
        call!(nvmlDeviceGetPcieReplayCounter(h, &mut replays)),
        rc::SUCCESS
    );
    let mut clocks = [0; 4];
    for (i, c) in clocks.iter_mut().enumerate() {
        assert_eq!(call!(nvmlDeviceGetClockInfo(h, i as u32, c)), rc::SUCCESS);
        let mut max = 0;
        assert_eq!(
            call!(nvmlDeviceGetMaxClockInfo(h, i as u32, &mut max)),
            rc::SUCCESS
        );
        assert!(*c <= max);
    }
    let mut mem = nvmlMemory_v2_t {
        version: 0x0200_0028,
        total: 0,
        reserved: 0,
        free: 0,
        used: 0,
    };
    assert_eq!(call!(nvmlDeviceGetMemoryInfo_v2(h, &mut mem)), rc::SUCCESS);
    Snapshot {
        util: (u.gpu, u.memory),
        power,
        energy,
        temp,
        clocks,
        used: mem.used,
        replays,
    }
}

fn at(clock: u64, index: u32) -> Snapshot {
    let _g = start(Config {
        clock: Some(clock),
        ..fixture("dgx-h100")
    });
    snapshot(gpu(index))
}

#[test]
fn pinned_clock_gives_exact_repeatable_values() {
    assert_eq!(at(5000, 1), at(5000, 1));
    assert_ne!(at(5000, 1), at(5000, 2));
    let (early, late) = (at(5000, 1), at(5060, 1));
    assert!(late.energy > early.energy);
    assert!(late.replays >= early.replays);
    let s = at(5000, 1);
    assert!(s.power < 700_000 && s.temp < 89 && s.util.0 <= 100);
    // Energy is the integral of power: one second later it grew by the power reading.
    let next = at(5001, 1);
    assert_eq!(next.energy - s.energy, s.power as u64);
}

#[test]
fn exporter_queries() {
    let _g = start(fixture("dgx-h100"));
    let h = gpu(0);
    let mut reasons: c_ulonglong = 0;
    assert_eq!(
        call!(nvmlDeviceGetCurrentClocksThrottleReasons(h, &mut reasons)),
        rc::SUCCESS
    );
    let (mut fans, mut speed) = (9, 0);
    assert_eq!(call!(nvmlDeviceGetNumFans(h, &mut fans)), rc::SUCCESS);
    assert_eq!(fans, 0);
    assert_eq!(
        call!(nvmlDeviceGetFanSpeed(h, &mut speed)),
        rc::NOT_SUPPORTED
    );
    assert_eq!(
        call!(nvmlDeviceGetFanSpeed_v2(h, 0, &mut speed)),
        rc::NOT_SUPPORTED
    );
    let mut tx = 0;
    assert_eq!(
        call!(nvmlDeviceGetPcieThroughput(
            h,
            nvmlPcieUtilCounter_enum_NVML_PCIE_UTIL_TX_BYTES,
            &mut tx
        )),
        rc::SUCCESS
    );
    assert!(tx > 0);
    let mut pstate: nvmlPstates_t = 99;
    assert_eq!(
        call!(nvmlDeviceGetPerformanceState(h, &mut pstate)),
        rc::SUCCESS
    );
    assert_eq!(pstate, 0);
    let mut bar1 = nvmlBAR1Memory_t {
        bar1Total: 0,
        bar1Free: 0,
        bar1Used: 0,
    };
    assert_eq!(
        call!(nvmlDeviceGetBAR1MemoryInfo(h, &mut bar1)),
        rc::SUCCESS
    );
    assert_eq!(bar1.bar1Total, 131072 << 20);
    assert_eq!(bar1.bar1Free + bar1.bar1Used, bar1.bar1Total);
    let (mut enc, mut period) = (9, 0);
    assert_eq!(
        call!(nvmlDeviceGetEncoderUtilization(h, &mut enc, &mut period)),
        rc::SUCCESS
    );
    assert_eq!(enc, 0);
    assert_eq!(
        call!(nvmlDeviceGetDecoderUtilization(h, &mut enc, &mut period)),
        rc::SUCCESS
    );
    let mut count: c_uint = 0;
    assert_eq!(
        call!(nvmlDeviceGetComputeRunningProcesses_v3(
            h,
            &mut count,
            null_mut()
        )),
        rc::SUCCESS
    );
    assert_eq!(count, 0);
    let mut app = 0;
    assert_eq!(
        call!(nvmlDeviceGetClock(
            h,
            1,
            nvmlClockId_enum_NVML_CLOCK_ID_APP_CLOCK_DEFAULT,
            &mut app
        )),
        rc::SUCCESS
    );
    assert_eq!(app, 1980);
}

#[test]
fn utilisation_is_not_available_per_gpu_in_mig_mode() {
    let _g = start(fixture("a100-mig"));
    let mut u = nvmlUtilization_t { gpu: 0, memory: 0 };
    assert_eq!(
        call!(nvmlDeviceGetUtilizationRates(gpu(0), &mut u)),
        rc::NOT_SUPPORTED
    );
    let mut power = 0;
    assert_eq!(
        call!(nvmlDeviceGetPowerUsage(gpu(0), &mut power)),
        rc::SUCCESS
    );
}

fn field(id: u32, scope: u32) -> nvmlFieldValue_t {
    nvmlFieldValue_t {
        fieldId: id,
        scopeId: scope,
        timestamp: 0,
        latencyUsec: 0,
        valueType: 0,
        nvmlReturn: 99,
        value: nvmlValue_t { ullVal: 0 },
    }
}

#[test]
fn field_values() {
    use nvml_wrapper_sys::bindings::field_id as f;
    let _g = start(fixture("dgx-h100"));
    let h = gpu(0);
    let mut values = [
        field(f::NVML_FI_DEV_NVLINK_LINK_COUNT, 0),
        field(f::NVML_FI_DEV_ECC_DBE_VOL_TOTAL, 0),
        field(f::NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION, 0),
        field(f::NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, 3),
        field(f::NVML_FI_DEV_POWER_DEFAULT_LIMIT, 0),
        field(f::NVML_FI_DEV_REMAPPED_PENDING, 0),
        field(f::NVML_FI_DEV_NVLINK_GET_STATE, 17),
        field(f::NVML_FI_DEV_PERF_POLICY_POWER, 0),
    ];
    assert_eq!(
        call!(nvmlDeviceGetFieldValues(
            h,
            values.len() as i32,
            values.as_mut_ptr()
        )),
        rc::SUCCESS
    );
    let rets: Vec<_> = values.iter().map(|v| v.nvmlReturn).collect();
    assert_eq!(rets, [0, 0, 0, 0, 0, 0, 0, rc::NOT_SUPPORTED]);
    // SAFETY: each union member read matches the valueType the mock reported for that field.
    let read = |v: &nvmlFieldValue_t| unsafe {
        match v.valueType {
            nvml_wrapper_sys::bindings::nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_INT => {
                v.value.uiVal as u64
            }
            _ => v.value.ullVal,
        }
    };
    assert_eq!(read(&values[0]), 18);
    assert_eq!(read(&values[1]), 0);
    let mut energy = 0;
    assert_eq!(
        call!(nvmlDeviceGetTotalEnergyConsumption(h, &mut energy)),
        rc::SUCCESS
    );
    assert_eq!(read(&values[2]), energy);
    assert!(read(&values[3]) > 0);
    assert_eq!(read(&values[4]), 700_000);
    assert_eq!(read(&values[6]), 1);
    assert_eq!(values[0].timestamp, (1_700_000_000 + 1000) * 1_000_000);
}
