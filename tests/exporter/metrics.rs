//! What `/metrics` serves: golden bodies, the counters file, flags and environment, promtool.

use std::process::{Command, Stdio};

use crate::common::{Node, assert_golden};
use crate::harness::{Exporter, family, stable, value};

/// The body after two samples (so GPM and NVLink rates are in it), volatile lines removed.
fn golden_body(fixture: &str, args: &[&str]) -> String {
    let node = Node::new(fixture);
    let exporter = Exporter::start(&node, args);
    stable(&exporter.metrics_after(2))
}

#[test]
fn dgx_h100_default_counters() {
    assert_golden("exporter/dgx-h100.metrics", &golden_body("dgx-h100", &[]));
}

#[test]
fn pcie_4gpu_default_counters() {
    assert_golden("exporter/pcie-4gpu.metrics", &golden_body("pcie-4gpu", &[]));
}

#[test]
fn a100_mig_reports_each_gpu_instance() {
    let body = golden_body("a100-mig", &[]);
    assert_golden("exporter/a100-mig.metrics", &body);
    // One sample per GPU instance and none for the parent, as dcgm-exporter's default.
    let power = family(&body, "DCGM_FI_DEV_POWER_USAGE");
    assert_eq!(power.len(), 3);
    for (line, (profile, id)) in
        power
            .iter()
            .zip([("3g.40gb", "1"), ("2g.20gb", "4"), ("1g.10gb", "8")])
    {
        assert!(
            line.contains(&format!(",GPU_I_PROFILE=\"{profile}\",GPU_I_ID=\"{id}\",")),
            "{line}"
        );
    }
    assert!(
        family(&body, "DCGM_FI_DEV_GPU_UTIL").is_empty(),
        "NVML has no utilisation per MIG instance"
    );
}

#[test]
fn custom_counters_file_with_labels_and_skipped_fields() {
    let node = Node::new("mixed");
    let csv = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/exporter/custom-counters.csv"
    );
    let mut exporter =
        Exporter::start_with(&node, &["-f", csv, "--hostname-label", "hostname"], &[]);
    let body = stable(&exporter.metrics_after(2));
    assert_golden("exporter/mixed-custom.metrics", &body);
    exporter.drain_log();
    let skipped: Vec<&str> = exporter
        .log
        .iter()
        .filter_map(|l| l.split_once("Skipping ").map(|(_, rest)| rest))
        .collect();
    assert_eq!(
        skipped,
        [
            "DCGM_FI_PROF_SM_ACTIVE: not available from NVML on this node (GPM needs Hopper or newer GPUs) line=12",
            "DCGM_FI_DEV_POWER_VIOLATION: gpud does not collect it line=15",
            "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS: gpud does not collect it line=16",
        ]
    );
}

#[test]
fn a_bad_counters_file_stops_the_start_with_exit_65() {
    let node = Node::new("dgx-h100");
    let csv = node.dir.path().join("bad.csv");
    std::fs::write(
        &csv,
        "DCGM_FI_DEV_GPU_UTIL, gauge, ok\nDCGM_FI_DEV_FB_USED, gaug, oops\n",
    )
    .unwrap();
    let out = node.run(&["exporter", "-f", csv.to_str().unwrap(), "-a", "127.0.0.1:0"]);
    assert_eq!(out.status.code(), Some(65));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        format!(
            "gpud: {}: line 2: field type: invalid value \"gaug\": must be one of gauge, counter, histogram, summary, label\n",
            csv.display()
        )
    );
    let missing = node.run(&["exporter", "-f", "/nonexistent/counters.csv"]);
    assert_eq!(missing.status.code(), Some(65));
    assert!(
        String::from_utf8_lossy(&missing.stderr)
            .starts_with("gpud: /nonexistent/counters.csv: cannot read the counters file: "),
    );
}

#[test]
fn dcgm_exporter_environment_is_honoured() {
    let node = Node::new("pcie-4gpu");
    let port = crate::common::http::free_port();
    let listen = format!("127.0.0.1:{port}");
    let mut cmd = node.gpud(&["exporter", "--kmsg", "", "-n"]);
    cmd.env("DCGM_EXPORTER_LISTEN", &listen)
        .env("DCGM_EXPORTER_INTERVAL", "150")
        .env("NODE_NAME", "gpu-node-7")
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let mut child = cmd.spawn().unwrap();
    let body = crate::common::http::wait_for(port, "/metrics", 20, |a| {
        a.status == 200 && crate::harness::samples(&a.body) >= 2
    })
    .body;
    let _ = child.kill();
    let _ = child.wait();
    let temp = family(&body, "DCGM_FI_DEV_GPU_TEMP");
    assert_eq!(temp.len(), 4);
    assert!(
        temp.iter().all(|l| !l.contains("Hostname=")),
        "-n drops the host label"
    );

    let exporter = Exporter::start(&node, &[]);
    let body = exporter.metrics_after(1);
    assert!(
        value(
            &body,
            "DCGM_FI_DEV_GPU_TEMP",
            &[("gpu", "0"), ("Hostname", "test-node")]
        )
        .is_some(),
        "Hostname comes from NODE_NAME"
    );
}

#[test]
fn probe_endpoints_answer() {
    let node = Node::new("pcie-4gpu");
    let exporter = Exporter::start(&node, &[]);
    let metrics = exporter.get("/metrics");
    assert_eq!(metrics.status, 200);
    assert_eq!(
        metrics.content_type.as_deref(),
        Some("text/plain; version=0.0.4; charset=utf-8")
    );
    assert_eq!(
        (exporter.get("/health").status, exporter.get("/health").body),
        (200, "OK".to_owned())
    );
    assert_eq!(exporter.get("/healthz").body, "ok");
    assert_eq!(exporter.get("/readyz").status, 200);
    assert_eq!(exporter.get("/nope").status, 404);
}

/// promtool's lint findings for a body.
pub fn promtool_findings(body: &str) -> Option<Vec<String>> {
    let mut child = match Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    {
        Ok(child) => child,
        Err(_) => {
            crate::common::tool_missing(
                true,
                "promtool is required in CI (.ci/run installs Debian's prometheus)",
                "NOTICE: promtool is not installed; skipping the promtool check (CI installs it)",
            );
            return None;
        }
    };
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(body.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let mut findings: Vec<String> = text.lines().map(str::to_owned).collect();
    findings.sort();
    findings.dedup();
    Some(findings)
}

#[test]
fn promtool_finds_only_dcgm_legacy_naming() {
    for fixture in ["dgx-h100", "a100-mig"] {
        let node = Node::new(fixture);
        let socket = node.dir.path().join("no-kubelet.sock");
        let exporter = Exporter::start(
            &node,
            &[
                "-k",
                "--pod-resources-kubelet-socket",
                socket.to_str().unwrap(),
            ],
        );
        let body = crate::faults::with_xid(&node, &exporter, "xid 0 48");
        let Some(findings) = promtool_findings(&body) else {
            return;
        };
        // dcgm-exporter's names and its `modelName` label are the compatibility contract:
        // counters without `_total`, one name with its type in it, and one camelCase label.
        for finding in &findings {
            let (name, problem) = finding.split_once(' ').unwrap();
            assert!(name.starts_with("DCGM_"), "{fixture}: {finding}");
            assert!(
                [
                    "counter metrics should have \"_total\" suffix",
                    "label names should be written in 'snake_case' not 'camelCase'",
                    "metric name should not include type 'counter'",
                ]
                .contains(&problem),
                "{fixture}: {finding}"
            );
        }
        // The camelCase finding is `modelName` and nothing else.
        let renamed = promtool_findings(&body.replace("modelName=", "model_name=")).unwrap();
        for finding in &renamed {
            assert!(
                finding.ends_with("counter metrics should have \"_total\" suffix")
                    || finding
                        == "DCGM_FI_DEV_PCIE_REPLAY_COUNTER metric name should not include type 'counter'",
                "{fixture}: {finding}"
            );
        }
        assert!(
            renamed
                .iter()
                .any(|f| f.starts_with("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION ")),
            "{fixture}: the legacy counter lint is there: {renamed:?}"
        );
    }
}
