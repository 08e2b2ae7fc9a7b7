//! Fault injection through the control file, and events through event sets.

use std::os::raw::{c_char, c_uint, c_ulonglong};
use std::ptr::null_mut;
use std::time::{Duration, Instant};

use crate::common::*;

fn event_set(gpu_handle: nvmlDevice_t, types: u32) -> nvmlEventSet_t {
    let mut set: nvmlEventSet_t = null_mut();
    assert_eq!(call!(nvmlEventSetCreate(&mut set)), rc::SUCCESS);
    assert_eq!(
        call!(nvmlDeviceRegisterEvents(
            gpu_handle,
            types as c_ulonglong,
            set
        )),
        rc::SUCCESS
    );
    set
}

fn wait(set: nvmlEventSet_t, timeout_ms: c_uint) -> Result<nvmlEventData_t, nvmlReturn_t> {
    let mut data = nvmlEventData_t {
        device: null_mut(),
        eventType: 0,
        eventData: 0,
        gpuInstanceId: 0,
        computeInstanceId: 0,
    };
    match call!(nvmlEventSetWait_v2(set, &mut data, timeout_ms)) {
        0 => Ok(data),
        code => Err(code),
    }
}

fn ecc(h: nvmlDevice_t, error: nvmlMemoryErrorType_t, counter: nvmlEccCounterType_t) -> u64 {
    let mut n: c_ulonglong = 99;
    assert_eq!(
        call!(nvmlDeviceGetTotalEccErrors(h, error, counter, &mut n)),
        rc::SUCCESS
    );
    n
}

const CORRECTED: u32 = nvmlMemoryErrorType_enum_NVML_MEMORY_ERROR_TYPE_CORRECTED;
const UNCORRECTED: u32 = nvmlMemoryErrorType_enum_NVML_MEMORY_ERROR_TYPE_UNCORRECTED;
const VOLATILE: u32 = nvmlEccCounterType_enum_NVML_VOLATILE_ECC;
const AGGREGATE: u32 = nvmlEccCounterType_enum_NVML_AGGREGATE_ECC;

#[test]
fn lines_present_at_init_change_state_but_raise_no_events() {
    let (config, _) = with_control(
        "dgx-h100",
        "preexisting",
        "# injected before start\nlost 1\nsbe 0\n\nxid 0 79\nbogus line\n",
    );
    let _g = start(config);
    let mut count = 0;
    assert_eq!(call!(nvmlDeviceGetCount_v2(&mut count)), rc::SUCCESS);
    assert_eq!(count, 8);
    let mut h: nvmlDevice_t = null_mut();
    assert_eq!(
        call!(nvmlDeviceGetHandleByIndex_v2(1, &mut h)),
        rc::GPU_IS_LOST
    );
    let g0 = gpu(0);
    assert_eq!(ecc(g0, CORRECTED, VOLATILE), 1);
    assert_eq!(testing::last_xid(0), Some(79));
    let set = event_set(
        g0,
        nvmlEventTypeXidCriticalError | nvmlEventTypeSingleBitEccError,
    );
    assert_eq!(wait(set, 30).err(), Some(rc::TIMEOUT));
}

#[test]
fn appended_xid_is_delivered_quickly() {
    let (config, control) = with_control("dgx-h100", "xid", "");
    let _g = start(config);
    let g2 = gpu(2);
    let set = event_set(g2, nvmlEventTypeXidCriticalError);
    let other = event_set(gpu(3), nvmlEventTypeXidCriticalError);
    let set_addr = set as usize;
    let waiter = std::thread::spawn(move || {
        let got = wait(set_addr as nvmlEventSet_t, 5_000).map(|d| {
            (
                d.device as usize,
                d.eventType,
                d.eventData,
                d.gpuInstanceId,
                d.computeInstanceId,
            )
        });
        (got, Instant::now())
    });
    std::thread::sleep(Duration::from_millis(50));
    let injected = Instant::now();
    inject(&control, "xid 2 79\n");
    let (got, at) = waiter.join().unwrap();
    let (device, kind, xid, gi, ci) = got.unwrap();
    assert!(
        at.duration_since(injected) < Duration::from_millis(500),
        "{:?}",
        at.duration_since(injected)
    );
    assert_eq!(device, g2 as usize);
    assert_eq!(kind, nvmlEventTypeXidCriticalError as u64);
    assert_eq!(xid, 79);
    assert_eq!((gi, ci), (u32::MAX, u32::MAX));
    assert_eq!(wait(other, 20).err(), Some(rc::TIMEOUT));
    assert_eq!(call!(nvmlEventSetFree(set)), rc::SUCCESS);
    assert_eq!(wait(set, 0).err(), Some(rc::INVALID_ARGUMENT));
}

#[test]
fn wait_blocks_for_the_timeout() {
    let _g = start(fixture("dgx-h100"));
    let set = event_set(gpu(0), nvmlEventTypeXidCriticalError);
    let t0 = Instant::now();
    assert_eq!(wait(set, 120).err(), Some(rc::TIMEOUT));
    assert!(t0.elapsed() >= Duration::from_millis(120));
    let mut mig: nvmlDevice_t = null_mut();
    assert_eq!(
        call!(nvmlDeviceRegisterEvents(gpu(0), 1 << 20, set)),
        rc::NOT_SUPPORTED
    );
    assert_eq!(
        call!(nvmlDeviceGetMigDeviceHandleByIndex(gpu(0), 0, &mut mig)),
        rc::NOT_FOUND
    );
    let mut supported: c_ulonglong = 0;
    assert_eq!(
        call!(nvmlDeviceGetSupportedEventTypes(gpu(0), &mut supported)),
        rc::SUCCESS
    );
    assert_eq!(supported & 0xB, 0xB);
}

#[test]
fn mig_attribution() {
    let (config, control) = with_control("a100-mig", "mig-xid", "");
    let _g = start(config);
    let parent = gpu(0);
    let mut mig: nvmlDevice_t = null_mut();
    assert_eq!(
        call!(nvmlDeviceGetMigDeviceHandleByIndex(parent, 1, &mut mig)),
        rc::SUCCESS
    );
    assert_eq!(
        call!(nvmlDeviceRegisterEvents(
            mig,
            nvmlEventTypeXidCriticalError as c_ulonglong,
            null_mut()
        )),
        rc::NOT_SUPPORTED
    );
    let set = event_set(
        parent,
        nvmlEventTypeXidCriticalError | nvmlEventTypeDoubleBitEccError,
    );
    inject(
        &control,
        &format!("xid {} 31\ndbe {}\nxid 0 43 8 0\n", uuid(mig), uuid(mig)),
    );
    let a = wait(set, 2_000).unwrap();
    assert_eq!(
        (a.device, a.eventData, a.gpuInstanceId, a.computeInstanceId),
        (parent, 31, 4, 0)
    );
    let b = wait(set, 2_000).unwrap();
    assert_eq!(
        (b.eventType, b.gpuInstanceId),
        (nvmlEventTypeDoubleBitEccError as u64, 4)
    );
    let c = wait(set, 2_000).unwrap();
    assert_eq!(
        (c.eventData, c.gpuInstanceId, c.computeInstanceId),
        (43, 8, 0)
    );
}

#[test]
fn lost_gpu_and_recovery() {
    let (config, control) = with_control("a100-mig", "lost", "");
    let _g = start(config);
    let h = gpu(0);
    let mut mig: nvmlDevice_t = null_mut();
    assert_eq!(
        call!(nvmlDeviceGetMigDeviceHandleByIndex(h, 0, &mut mig)),
        rc::SUCCESS
    );
    let gpu_uuid = std::ffi::CString::new(uuid(h)).unwrap();
    inject(&control, "lost 0\n");
    let name_rc = |d: nvmlDevice_t| {
        let mut buf = [0 as c_char; 96];
        call!(nvmlDeviceGetName(d, buf.as_mut_ptr(), 96))
    };
    assert!(eventually(|| name_rc(h) == rc::GPU_IS_LOST));
    assert_eq!(name_rc(mig), rc::GPU_IS_LOST);
    let mut again: nvmlDevice_t = null_mut();
    assert_eq!(
        call!(nvmlDeviceGetHandleByIndex_v2(0, &mut again)),
        rc::GPU_IS_LOST
    );
    assert_eq!(
        call!(nvmlDeviceGetHandleByUUID(gpu_uuid.as_ptr(), &mut again)),
        rc::GPU_IS_LOST
    );
    let mut count = 0;
    assert_eq!(call!(nvmlDeviceGetCount_v2(&mut count)), rc::SUCCESS);
    assert_eq!(count, 1);
    inject(&control, "recover 0\n");
    assert!(eventually(|| name_rc(h) == rc::SUCCESS));
    assert_eq!(name_rc(mig), rc::SUCCESS);
}

#[test]
fn ecc_remap_and_retirement() {
    let (config, control) = with_control("dgx-a100", "ecc", "");
    let _g = start(config);
    let h = gpu(4);
    let set = event_set(
        h,
        nvmlEventTypeSingleBitEccError | nvmlEventTypeDoubleBitEccError,
    );
    inject(
        &control,
        "sbe 4\nsbe 4\ndbe 4\nremap-pending 4\nremap-failure 4\n",
    );
    assert_eq!(
        wait(set, 2_000).unwrap().eventType,
        nvmlEventTypeSingleBitEccError as u64
    );
    assert_eq!(
        wait(set, 2_000).unwrap().eventType,
        nvmlEventTypeSingleBitEccError as u64
    );
    assert_eq!(
        wait(set, 2_000).unwrap().eventType,
        nvmlEventTypeDoubleBitEccError as u64
    );
    let rows = || {
        let (mut c, mut u, mut p, mut f) = (9, 9, 9, 9);
        assert_eq!(
            call!(nvmlDeviceGetRemappedRows(h, &mut c, &mut u, &mut p, &mut f)),
            rc::SUCCESS
        );
        (c, u, p, f)
    };
    assert!(eventually(|| rows() == (0, 1, 1, 1)));
    assert_eq!(
        (ecc(h, CORRECTED, VOLATILE), ecc(h, CORRECTED, AGGREGATE)),
        (2, 2)
    );
    assert_eq!(
        (
            ecc(h, UNCORRECTED, VOLATILE),
            ecc(h, UNCORRECTED, AGGREGATE)
        ),
        (1, 1)
    );
    let mut dram: c_ulonglong = 0;
    assert_eq!(
        call!(nvmlDeviceGetMemoryErrorCounter(
            h,
            CORRECTED,
            AGGREGATE,
            nvmlMemoryLocation_enum_NVML_MEMORY_LOCATION_DRAM,
            &mut dram
        )),
        rc::SUCCESS
    );
    assert_eq!(dram, 2);
    let mut pending: nvmlEnableState_t = 0;
    assert_eq!(
        call!(nvmlDeviceGetRetiredPagesPendingStatus(h, &mut pending)),
        rc::SUCCESS
    );
    assert_eq!(pending, 1);
    let dbe = nvmlPageRetirementCause_enum_NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR;
    let mut count: c_uint = 0;
    let mut scratch_addr: c_ulonglong = 0;
    assert_eq!(
        call!(nvmlDeviceGetRetiredPages(
            h,
            dbe,
            &mut count,
            &mut scratch_addr
        )),
        rc::INSUFFICIENT_SIZE
    );
    assert_eq!(count, 1);
    let (mut addrs, mut times) = ([0 as c_ulonglong; 1], [0 as c_ulonglong; 1]);
    assert_eq!(
        call!(nvmlDeviceGetRetiredPages_v2(
            h,
            dbe,
            &mut count,
            addrs.as_mut_ptr(),
            times.as_mut_ptr()
        )),
        rc::SUCCESS
    );
    assert!(addrs[0] != 0 && times[0] == (1_700_000_000 + 1000) * 1_000_000);
    inject(&control, "recover 4\n");
    assert!(eventually(|| rows() == (0, 1, 0, 1)));
    assert_eq!(
        (ecc(h, CORRECTED, VOLATILE), ecc(h, CORRECTED, AGGREGATE)),
        (0, 2)
    );
    assert_eq!(
        call!(nvmlDeviceGetRetiredPagesPendingStatus(h, &mut pending)),
        rc::SUCCESS
    );
    assert_eq!(pending, 0);
}

#[test]
fn links_and_temperature_overrides() {
    let (config, control) = with_control("pcie-4gpu", "links", "");
    let _g = start(config);
    let (g0, g1) = (gpu(0), gpu(1));
    let state = |l| {
        let mut s: nvmlEnableState_t = 9;
        assert_eq!(call!(nvmlDeviceGetNvLinkState(g0, l, &mut s)), rc::SUCCESS);
        s
    };
    let temp = || {
        let mut t = 0;
        assert_eq!(
            call!(nvmlDeviceGetTemperature(
                g0,
                nvmlTemperatureSensors_enum_NVML_TEMPERATURE_GPU,
                &mut t
            )),
            rc::SUCCESS
        );
        t
    };
    let simulated = temp();
    let mut slowdown = 0;
    assert_eq!(
        call!(nvmlDeviceGetTemperatureThreshold(
            g0,
            nvmlTemperatureThresholds_enum_NVML_TEMPERATURE_THRESHOLD_SLOWDOWN,
            &mut slowdown
        )),
        rc::SUCCESS
    );
    assert!(simulated < slowdown);
    inject(&control, "nvlink-down 0 3\ntemp 0 95\nnvlink-down 0 99\n");
    assert!(eventually(|| state(3) == 0 && temp() == 95));
    assert_eq!(state(2), 1);
    let mut reasons: c_ulonglong = 0;
    assert_eq!(
        call!(nvmlDeviceGetCurrentClocksEventReasons(g0, &mut reasons)),
        rc::SUCCESS
    );
    assert_ne!(reasons & nvmlClocksEventReasonSwThermalSlowdown as u64, 0);
    // Bring every link between 0 and 1 down: NVLink P2P goes away.
    let downs: String = (0..12).map(|l| format!("nvlink-down 0 {l}\n")).collect();
    inject(&control, &downs);
    let p2p = || {
        let mut s = 99;
        assert_eq!(
            call!(nvmlDeviceGetP2PStatus(
                g0,
                g1,
                nvmlGpuP2PCapsIndex_enum_NVML_P2P_CAPS_INDEX_NVLINK,
                &mut s
            )),
            rc::SUCCESS
        );
        s
    };
    assert!(eventually(
        || p2p() == nvmlGpuP2PStatus_enum_NVML_P2P_STATUS_NOT_SUPPORTED
    ));
    inject(&control, "nvlink-up 0 3\ntemp 0 auto\n");
    assert!(eventually(|| state(3) == 1 && temp() == simulated));
    assert_eq!(p2p(), nvmlGpuP2PStatus_enum_NVML_P2P_STATUS_OK);
}

#[test]
fn truncating_the_control_file_replays_it() {
    let (config, control) = with_control("dgx-h100", "truncate", "lost 0\n");
    let _g = start(config);
    let mut h: nvmlDevice_t = null_mut();
    assert_eq!(
        call!(nvmlDeviceGetHandleByIndex_v2(0, &mut h)),
        rc::GPU_IS_LOST
    );
    std::fs::write(&control, "").unwrap();
    assert!(eventually(|| call!(nvmlDeviceGetHandleByIndex_v2(
        0, &mut h
    )) == rc::SUCCESS));
}
