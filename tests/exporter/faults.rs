//! Faults while the exporter runs: a GPU that falls off the bus, XIDs.

use std::time::{Duration, Instant};

use crate::common::Node;
use crate::harness::{Exporter, family, value};

/// Injects `line` (an XID) until the exporter has counted one — the health watcher may still
/// be registering for events when the exporter first answers — and returns the body.
pub fn with_xid(node: &Node, exporter: &Exporter, line: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        node.inject(line);
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(2) {
            let body = exporter.get("/metrics").body;
            if body.contains("gpud_xid_errors_total{") && crate::harness::samples(&body) >= 2 {
                return body;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        assert!(
            Instant::now() < deadline,
            "no XID counted after injecting {line:?}"
        );
    }
}

/// A gpud config that polls health fast.
fn fast_health(node: &Node) -> String {
    let path = node.dir.path().join("gpud.yaml");
    std::fs::write(&path, "health:\n  pollInterval: 100ms\n").unwrap();
    path.to_str().unwrap().to_owned()
}

#[test]
fn a_lost_gpu_drops_its_series_and_health_says_why() {
    let node = Node::new("dgx-h100");
    let config = fast_health(&node);
    let exporter = Exporter::start(&node, &["--config", &config]);
    let before = exporter.metrics_after(1);
    assert_eq!(family(&before, "DCGM_FI_DEV_GPU_TEMP").len(), 8);
    let uuid3 = value(&before, "gpud_gpu_sampled", &[("gpu", "3")]).map(|_| ());
    assert!(uuid3.is_some());

    node.inject("lost 3");
    let body = exporter.metrics_until(20, |b| {
        value(
            b,
            "gpud_gpu_health",
            &[("gpu", "3"), ("state", "unhealthy")],
        )
        .as_deref()
            == Some("1")
            && value(b, "gpud_gpu_sampled", &[("gpu", "3")]).as_deref() == Some("0")
    });
    for metric in [
        "DCGM_FI_DEV_GPU_TEMP",
        "DCGM_FI_DEV_POWER_USAGE",
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
    ] {
        let lines = family(&body, metric);
        assert_eq!(lines.len(), 7, "{metric}: the other GPUs stay");
        assert!(lines.iter().all(|l| !l.contains("gpu=\"3\"")), "{metric}");
    }
    let health = family(&body, "gpud_gpu_health")
        .into_iter()
        .find(|l| l.contains("gpu=\"3\"") && l.ends_with(" 1"))
        .unwrap()
        .to_owned();
    assert!(
        health.ends_with(
            ",state=\"unhealthy\",reason=\"GPU is lost: NVML reports it has fallen off the bus or is inaccessible\"} 1"
        ),
        "{health}"
    );
    assert_eq!(
        exporter.get("/health").status,
        200,
        "NVML itself still answers"
    );

    node.inject("recover 3");
    let back = exporter.metrics_until(20, |b| family(b, "DCGM_FI_DEV_GPU_TEMP").len() == 8);
    assert_eq!(
        value(&back, "gpud_gpu_sampled", &[("gpu", "3")]).as_deref(),
        Some("1")
    );
}

#[test]
fn xids_set_the_dcgm_gauge_and_count_per_code() {
    let node = Node::new("dgx-h100");
    let exporter = Exporter::start(&node, &[]);
    let body = with_xid(&node, &exporter, "xid 2 48");
    let first: u64 = value(
        &body,
        "gpud_xid_errors_total",
        &[("gpu", "2"), ("xid", "48")],
    )
    .unwrap()
    .parse()
    .unwrap();
    node.inject("xid 2 48");
    node.inject("xid 2 94");
    let body = exporter.metrics_until(10, |b| {
        value(b, "gpud_xid_errors_total", &[("gpu", "2"), ("xid", "94")]).is_some()
            && value(b, "gpud_xid_errors_total", &[("gpu", "2"), ("xid", "48")])
                != Some(first.to_string())
    });
    assert_eq!(
        value(
            &body,
            "gpud_xid_errors_total",
            &[("gpu", "2"), ("xid", "48")]
        ),
        Some((first + 1).to_string()),
        "a real counter: repeats count"
    );
    // dcgm-exporter's gauge: the last XID, with its code and message.
    let gauge = family(&body, "DCGM_FI_DEV_XID_ERRORS")
        .into_iter()
        .find(|l| l.contains("gpu=\"2\""))
        .unwrap()
        .to_owned();
    assert!(
        gauge.ends_with(",err_code=\"94\",err_msg=\"Contained ECC/memory error\"} 94"),
        "{gauge}"
    );
    assert_eq!(
        value(&body, "DCGM_FI_DEV_XID_ERRORS", &[("gpu", "1")]).as_deref(),
        Some("0")
    );
}

#[test]
fn a_hung_sampler_makes_the_exporter_not_ready_and_says_how_old_its_sample_is() {
    let node = Node::new("dgx-h100");
    let exporter = Exporter::start(&node, &[]);
    let fresh = exporter.metrics_after(2);
    let age = |body: &str| -> f64 {
        body.lines()
            .find_map(|l| l.strip_prefix("gpud_exporter_last_sample_age_seconds "))
            .and_then(|v| v.parse().ok())
            .unwrap()
    };
    assert!(age(&fresh) < 0.3, "{}", age(&fresh));
    // The sampler's power reading never returns: no sample comes after it.
    node.inject("hang nvmlDeviceGetPowerUsage");
    let ready = crate::common::http::wait_for(exporter.port, "/readyz", 20, |a| a.status != 200);
    assert!(
        ready
            .body
            .contains("exporter not ready: the last NVML sample is ")
            && ready
                .body
                .contains("s old (collect interval 100ms): an NVML call hangs"),
        "{}",
        ready.body
    );
    // The body is rendered again while stale, so the age keeps growing past three intervals.
    let stale = exporter.metrics_until(20, |b| age(b) > 0.6);
    assert!(age(&stale) > 0.6);
    node.inject("unhang nvmlDeviceGetPowerUsage");
    crate::common::http::wait_for(exporter.port, "/readyz", 20, |a| a.status == 200);
    let recovered = exporter.metrics_until(20, |b| age(b) < 0.3);
    assert!(age(&recovered) < 0.3);
}
