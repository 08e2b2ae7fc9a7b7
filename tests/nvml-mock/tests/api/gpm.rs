//! GPU Performance Monitoring: support by architecture, the sample lifecycle, metrics from two
//! samples, GPU-instance samples and their refusals.

use std::ptr::null_mut;

use crate::common::*;

fn support(h: nvmlDevice_t) -> Result<bool, nvmlReturn_t> {
    let mut s = nvmlGpmSupport_t {
        version: NVML_GPM_SUPPORT_VERSION,
        isSupportedDevice: 7,
    };
    match call!(nvmlGpmQueryDeviceSupport(h, &mut s)) {
        0 => Ok(s.isSupportedDevice == 1),
        code => Err(code),
    }
}

fn alloc() -> nvmlGpmSample_t {
    let mut sample: nvmlGpmSample_t = null_mut();
    assert_eq!(call!(nvmlGpmSampleAlloc(&mut sample)), rc::SUCCESS);
    assert!(!sample.is_null());
    sample
}

/// Metrics between two samples; `Err` for a whole-call failure, per-metric codes otherwise.
fn metrics(
    a: nvmlGpmSample_t,
    b: nvmlGpmSample_t,
    ids: &[u32],
) -> Result<Vec<(u32, f64, String)>, nvmlReturn_t> {
    // SAFETY: nvmlGpmMetricsGet_t is plain data; all-zero is a valid bit pattern for it.
    let mut req: nvmlGpmMetricsGet_t = unsafe { std::mem::zeroed() };
    req.version = NVML_GPM_METRICS_GET_VERSION;
    req.numMetrics = ids.len() as u32;
    req.sample1 = a;
    req.sample2 = b;
    for (slot, id) in req.metrics.iter_mut().zip(ids) {
        slot.metricId = *id;
    }
    match call!(nvmlGpmMetricsGet(&mut req)) {
        0 => Ok(req.metrics[..ids.len()]
            .iter()
            .map(|m| {
                // SAFETY: the mock points `unit` at a static NUL-terminated string.
                let unit = unsafe { std::ffi::CStr::from_ptr(m.metricInfo.unit) };
                (m.nvmlReturn, m.value, unit.to_str().unwrap().to_owned())
            })
            .collect()),
        code => Err(code),
    }
}

#[test]
fn hopper_supports_gpm() {
    let _g = start(fixture("dgx-h100"));
    assert_eq!(support(gpu(0)), Ok(true));
    let mut s = nvmlGpmSupport_t {
        version: 2,
        isSupportedDevice: 0,
    };
    assert_eq!(
        call!(nvmlGpmQueryDeviceSupport(gpu(0), &mut s)),
        rc::ARGUMENT_VERSION_MISMATCH
    );
}

#[test]
fn ampere_does_not_support_gpm() {
    let _g = start(fixture("mixed"));
    assert_eq!(support(gpu(0)), Ok(false));
    assert_eq!(call!(nvmlGpmSampleGet(gpu(0), alloc())), rc::NOT_SUPPORTED);
}

#[test]
fn two_samples_give_utilisation_and_bandwidth() {
    let _g = start(fixture("dgx-h100"));
    let h = gpu(1);
    let (a, b) = (alloc(), alloc());
    assert_eq!(call!(nvmlGpmSampleGet(h, a)), rc::SUCCESS);
    assert_eq!(call!(nvmlGpmSampleGet(h, b)), rc::SUCCESS);
    let mut util = nvmlUtilization_t { gpu: 0, memory: 0 };
    assert_eq!(
        call!(nvmlDeviceGetUtilizationRates(h, &mut util)),
        rc::SUCCESS
    );
    let got = metrics(
        a,
        b,
        &[
            nvmlGpmMetricId_t_NVML_GPM_METRIC_GRAPHICS_UTIL,
            nvmlGpmMetricId_t_NVML_GPM_METRIC_PCIE_TX_PER_SEC,
            nvmlGpmMetricId_t_NVML_GPM_METRIC_NVDEC_0_UTIL,
        ],
    )
    .unwrap();
    assert_eq!(got[0], (rc::SUCCESS, f64::from(util.gpu), "%".to_owned()));
    let mut pcie_kb = 0;
    assert_eq!(
        call!(nvmlDeviceGetPcieThroughput(h, 0, &mut pcie_kb)),
        rc::SUCCESS
    );
    let mib = (f64::from(pcie_kb) / 1024.0 * 100.0).round() / 100.0;
    assert_eq!(got[1], (rc::SUCCESS, mib, "MiB/sec".to_owned()));
    assert_eq!(got[2].0, rc::NOT_SUPPORTED);
    assert_eq!(call!(nvmlGpmSampleFree(a)), rc::SUCCESS);
    assert_eq!(
        call!(nvmlGpmSampleFree(a)),
        rc::INVALID_ARGUMENT,
        "freed twice"
    );
    assert_eq!(call!(nvmlGpmSampleFree(b)), rc::SUCCESS);
}

#[test]
fn samples_must_match_and_be_filled() {
    let _g = start(fixture("dgx-h100"));
    let (a, b, empty) = (alloc(), alloc(), alloc());
    assert_eq!(call!(nvmlGpmSampleGet(gpu(0), a)), rc::SUCCESS);
    assert_eq!(call!(nvmlGpmSampleGet(gpu(1), b)), rc::SUCCESS);
    assert_eq!(metrics(a, b, &[1]), Err(rc::INVALID_ARGUMENT), "two GPUs");
    assert_eq!(
        metrics(a, empty, &[1]),
        Err(rc::INVALID_ARGUMENT),
        "unfilled"
    );
    assert_eq!(
        call!(nvmlGpmMigSampleGet(gpu(0), 1, a)),
        rc::NOT_SUPPORTED,
        "MIG disabled"
    );
}

#[test]
fn a_gpu_lost_between_samples_fails_the_metrics() {
    let dir = scratch("gpm-lost");
    let control = dir.join("control");
    inject(&control, "");
    let _g = start(Config {
        control: Some(control.clone()),
        ..fixture("dgx-h100")
    });
    let h = gpu(2);
    let (a, b) = (alloc(), alloc());
    assert_eq!(call!(nvmlGpmSampleGet(h, a)), rc::SUCCESS);
    assert_eq!(call!(nvmlGpmSampleGet(h, b)), rc::SUCCESS);
    inject(&control, "lost 2\n");
    assert!(eventually(
        || call!(nvmlGpmSampleGet(h, a)) == rc::GPU_IS_LOST
    ));
    assert_eq!(metrics(a, b, &[1]), Err(rc::GPU_IS_LOST));
}
