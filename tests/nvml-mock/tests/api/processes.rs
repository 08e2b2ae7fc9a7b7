//! Compute processes from the control file's `process` lines: the running-process lists (GPU
//! and MIG device handles) and per-process utilisation samples.

use std::os::raw::c_uint;
use std::ptr::null_mut;

use crate::common::*;

/// `(pid, usedGpuMemory, gpuInstanceId, computeInstanceId)`.
type Row = (u32, u64, u32, u32);

const NONE: u32 = u32::MAX;

/// Reads the compute processes of a device with NVML's count protocol, as clients do.
fn compute_processes(h: nvmlDevice_t) -> Vec<Row> {
    let mut count: c_uint = 0;
    let first = call!(nvmlDeviceGetComputeRunningProcesses_v3(
        h,
        &mut count,
        null_mut()
    ));
    if count == 0 {
        assert_eq!(first, rc::SUCCESS);
        return Vec::new();
    }
    assert_eq!(first, rc::INSUFFICIENT_SIZE);
    let empty = nvmlProcessInfo_t {
        pid: 0,
        usedGpuMemory: 0,
        gpuInstanceId: 0,
        computeInstanceId: 0,
    };
    let mut infos = vec![empty; count as usize];
    assert_eq!(
        call!(nvmlDeviceGetComputeRunningProcesses_v3(
            h,
            &mut count,
            infos.as_mut_ptr()
        )),
        rc::SUCCESS
    );
    infos.truncate(count as usize);
    infos
        .iter()
        .map(|p| (p.pid, p.usedGpuMemory, p.gpuInstanceId, p.computeInstanceId))
        .collect()
}

fn gpu_instance_id(mig: nvmlDevice_t) -> u32 {
    let mut id = 99;
    assert_eq!(call!(nvmlDeviceGetGpuInstanceId(mig, &mut id)), rc::SUCCESS);
    id
}

fn mig_handle(parent: nvmlDevice_t, index: c_uint) -> nvmlDevice_t {
    let mut h: nvmlDevice_t = null_mut();
    assert_eq!(
        call!(nvmlDeviceGetMigDeviceHandleByIndex(parent, index, &mut h)),
        rc::SUCCESS
    );
    h
}

const EMPTY_SAMPLE: nvmlProcessUtilizationSample_t = nvmlProcessUtilizationSample_t {
    pid: 0,
    timeStamp: 0,
    smUtil: 0,
    memUtil: 0,
    encUtil: 0,
    decUtil: 0,
};

/// `nvmlDeviceGetProcessUtilization` into a buffer of `capacity` samples: the return code,
/// the count it reported, and the samples written.
fn utilisation(
    h: nvmlDevice_t,
    capacity: usize,
    last_seen: u64,
) -> (nvmlReturn_t, c_uint, Vec<nvmlProcessUtilizationSample_t>) {
    let mut samples = vec![EMPTY_SAMPLE; capacity];
    let mut count = capacity as c_uint;
    let code = call!(nvmlDeviceGetProcessUtilization(
        h,
        samples.as_mut_ptr(),
        &mut count,
        last_seen
    ));
    if code == rc::SUCCESS {
        samples.truncate(count as usize);
    }
    (code, count, samples)
}

/// `(pid, timeStamp, sm, mem, enc, dec)`.
fn sample_row(s: &nvmlProcessUtilizationSample_t) -> (u32, u64, u32, u32, u32, u32) {
    (
        s.pid,
        s.timeStamp,
        s.smUtil,
        s.memUtil,
        s.encUtil,
        s.decUtil,
    )
}

/// The mock clock pinned at `t = 1000`, in microseconds since the epoch.
const NOW_US: u64 = (1_700_000_000 + 1000) * 1_000_000;

#[test]
fn process_lists_report_memory_and_gpu_instances() {
    let (config, control) = with_control("a100-mig", "processes-mig", "");
    let _g = start(config);
    let parent = gpu(0);
    let (mig0, mig1, mig2) = (
        mig_handle(parent, 0),
        mig_handle(parent, 1),
        mig_handle(parent, 2),
    );
    let (gi0, gi1) = (gpu_instance_id(mig0), gpu_instance_id(mig1));
    inject(
        &control,
        &format!(
            "process 0 100 512\n\
             process 0/gi{gi0} 200 1024 35\n\
             process {} 300 2048\n\
             process 0/gi99 400 1\n\
             process {}/gi{gi0} 500 1\n\
             process 0 100 256 10\n\
             process 0 600\n",
            uuid(mig1),
            uuid(mig1),
        ),
    );
    assert!(eventually(|| compute_processes(parent).len() == 4));
    // Bare GPU: all of them, with the instance of those inside MIG; GI 99 does not exist and
    // a MIG UUID names its instance already, so those two lines were skipped. A second line
    // for PID 100 replaced its numbers.
    assert_eq!(
        compute_processes(parent),
        [
            (100, 256 << 20, NONE, NONE),
            (200, 1024 << 20, gi0, 0),
            (300, 2048 << 20, gi1, 0),
            (600, 0, NONE, NONE),
        ]
    );
    // Too small a buffer: the count needed and INSUFFICIENT_SIZE.
    let mut count: c_uint = 2;
    let mut infos = [nvmlProcessInfo_t {
        pid: 0,
        usedGpuMemory: 0,
        gpuInstanceId: 0,
        computeInstanceId: 0,
    }; 2];
    assert_eq!(
        call!(nvmlDeviceGetComputeRunningProcesses_v3(
            parent,
            &mut count,
            infos.as_mut_ptr()
        )),
        rc::INSUFFICIENT_SIZE
    );
    assert_eq!(count, 4);
    // A MIG device: only the processes of its GPU instance.
    assert_eq!(compute_processes(mig0), [(200, 1024 << 20, gi0, 0)]);
    assert_eq!(compute_processes(mig1), [(300, 2048 << 20, gi1, 0)]);
    assert_eq!(compute_processes(mig2), []);
    // Per-process utilisation is not sampled in MIG mode, nor on MIG devices.
    assert_eq!(utilisation(parent, 4, 0).0, rc::NOT_SUPPORTED);
    assert_eq!(utilisation(mig0, 4, 0).0, rc::NOT_SUPPORTED);
    inject(
        &control,
        &format!("process-end 0 200\nprocess-end 0/gi{gi1} 300\n"),
    );
    assert!(eventually(|| compute_processes(parent).len() == 2));
    assert_eq!(compute_processes(mig0), []);
    assert_eq!(compute_processes(mig1), []);
}

#[test]
fn process_utilisation_samples() {
    let (config, control) = with_control(
        "dgx-h100",
        "processes-util",
        "process 1 4242 2048 35 20 5 1\nprocess 1 77\nprocess 2 9 0 0 0 0 101\n",
    );
    let _g = start(config);
    let h = gpu(1);
    assert_eq!(
        compute_processes(h),
        [(77, 0, NONE, NONE), (4242, 2048 << 20, NONE, NONE)]
    );
    // Size query as the NVML docs describe it (and pynvml and nvml-wrapper make it): a NULL
    // buffer reports the count needed with INSUFFICIENT_SIZE.
    for capacity in [0, 8] {
        let mut count: c_uint = capacity;
        assert_eq!(
            call!(nvmlDeviceGetProcessUtilization(
                h,
                null_mut(),
                &mut count,
                0
            )),
            rc::INSUFFICIENT_SIZE
        );
        assert_eq!(count, 2, "capacity {capacity}");
    }
    let (code, count, _) = utilisation(h, 1, 0);
    assert_eq!((code, count), (rc::INSUFFICIENT_SIZE, 2));
    let (code, count, samples) = utilisation(h, 4, 0);
    assert_eq!((code, count), (rc::SUCCESS, 2));
    let rows: Vec<_> = samples.iter().map(sample_row).collect();
    assert_eq!(
        rows,
        [(77, NOW_US, 0, 0, 0, 0), (4242, NOW_US, 35, 20, 5, 1)]
    );
    // Only samples newer than the last one seen.
    assert_eq!(utilisation(h, 4, NOW_US - 1).0, rc::SUCCESS);
    assert_eq!(utilisation(h, 4, NOW_US).0, rc::NOT_FOUND);
    let mut count: c_uint = 0;
    assert_eq!(
        call!(nvmlDeviceGetProcessUtilization(
            h,
            null_mut(),
            &mut count,
            NOW_US
        )),
        rc::NOT_FOUND
    );
    // No processes (the `process 2` line had a bad percentage and was skipped): no samples.
    assert_eq!(utilisation(gpu(2), 4, 0).0, rc::NOT_FOUND);
    assert_eq!(utilisation(gpu(0), 4, 0).0, rc::NOT_FOUND);
    assert_eq!(
        call!(nvmlDeviceGetProcessUtilization(
            h,
            null_mut(),
            null_mut(),
            0
        )),
        rc::INVALID_ARGUMENT
    );

    // The versioned call: the same samples, JPEG and OFA at 0.
    let mut array = [nvmlProcessUtilizationInfo_v1_t {
        timeStamp: 0,
        pid: 0,
        smUtil: 0,
        memUtil: 0,
        encUtil: 0,
        decUtil: 0,
        jpgUtil: 9,
        ofaUtil: 9,
    }; 3];
    let mut info = nvmlProcessesUtilizationInfo_t {
        version: 0x0100_0018,
        processSamplesCount: 0,
        lastSeenTimeStamp: 0,
        procUtilArray: null_mut(),
    };
    assert_eq!(
        call!(nvmlDeviceGetProcessesUtilizationInfo(h, &mut info)),
        rc::INSUFFICIENT_SIZE
    );
    assert_eq!(info.processSamplesCount, 2);
    info.procUtilArray = array.as_mut_ptr();
    info.processSamplesCount = array.len() as c_uint;
    assert_eq!(
        call!(nvmlDeviceGetProcessesUtilizationInfo(h, &mut info)),
        rc::SUCCESS
    );
    assert_eq!(info.processSamplesCount, 2);
    let a = array[1];
    assert_eq!(
        (
            a.pid,
            a.timeStamp,
            a.smUtil,
            a.memUtil,
            a.encUtil,
            a.decUtil
        ),
        (4242, NOW_US, 35, 20, 5, 1)
    );
    assert_eq!((a.jpgUtil, a.ofaUtil), (0, 0));
    info.lastSeenTimeStamp = NOW_US;
    assert_eq!(
        call!(nvmlDeviceGetProcessesUtilizationInfo(h, &mut info)),
        rc::NOT_FOUND
    );
    info.version = 0x0200_0018;
    assert_eq!(
        call!(nvmlDeviceGetProcessesUtilizationInfo(h, &mut info)),
        rc::ARGUMENT_VERSION_MISMATCH
    );

    // Ending a process drops its sample; a lost GPU answers GPU_IS_LOST.
    inject(&control, "process-end 1 77\n");
    assert!(eventually(|| utilisation(h, 4, 0).1 == 1));
    inject(&control, "lost 1\n");
    assert!(eventually(|| utilisation(h, 4, 0).0 == rc::GPU_IS_LOST));
    let mut count: c_uint = 0;
    assert_eq!(
        call!(nvmlDeviceGetComputeRunningProcesses_v3(
            h,
            &mut count,
            null_mut()
        )),
        rc::GPU_IS_LOST
    );
}

/// nvml-wrapper's `Device::process_utilization_stats`: a count query with a NULL buffer
/// (SUCCESS and INSUFFICIENT_SIZE both accepted), then a buffer of that many samples.
#[test]
fn nvml_wrapper_call_sequence_gets_the_samples() {
    let (config, _) = with_control("dgx-h100", "processes-wrapper", "process 3 4242 2048 35\n");
    let _g = start(config);
    let h = gpu(3);
    let mut count: c_uint = 0;
    let code = call!(nvmlDeviceGetProcessUtilization(
        h,
        null_mut(),
        &mut count,
        0
    ));
    assert!(code == rc::SUCCESS || code == rc::INSUFFICIENT_SIZE);
    assert_eq!(count, 1);
    let mut samples = vec![EMPTY_SAMPLE; count as usize];
    assert_eq!(
        call!(nvmlDeviceGetProcessUtilization(
            h,
            samples.as_mut_ptr(),
            &mut count,
            0
        )),
        rc::SUCCESS
    );
    samples.truncate(count as usize);
    let rows: Vec<_> = samples.iter().map(sample_row).collect();
    assert_eq!(rows, [(4242, NOW_US, 35, 0, 0, 0)]);
}
