//! The operations assets: Prometheus alert rules (checked and unit-tested with promtool) and
//! the Grafana dashboard, both tied to the metric names gpud really serves.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

fn packaging(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("packaging")
        .join(file)
}

/// Runs promtool; `None` (with a notice) when it is not installed.
fn promtool(args: &[&str], dir: &Path) -> Option<(bool, String)> {
    match Command::new("promtool")
        .args(args)
        .current_dir(dir)
        .output()
    {
        Ok(out) => Some((
            out.status.success(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )),
        Err(_) => {
            crate::common::tool_missing(
                true,
                "promtool is required in CI (.ci/run installs Debian's prometheus)",
                &format!("NOTICE: promtool is not installed; skipping {args:?} (CI installs it)"),
            );
            None
        }
    }
}

#[test]
fn alert_rules_pass_promtool_check_and_their_unit_tests() {
    let dir = packaging("prometheus");
    let Some((ok, out)) = promtool(&["check", "rules", "gpud-alerts.yaml"], &dir) else {
        return;
    };
    assert!(ok, "{out}");
    assert!(out.contains("SUCCESS: 13 rules found"), "{out}");
    let (ok, out) = promtool(&["test", "rules", "gpud-alerts.test.yaml"], &dir).unwrap();
    assert!(ok, "{out}");
}

/// Metric families the exporter serves on dgx-h100 (from the golden body), plus the XID
/// counter, which appears with the first XID.
fn served_families() -> BTreeSet<String> {
    let golden = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/golden/exporter/dgx-h100.metrics"),
    )
    .unwrap();
    let mut names: BTreeSet<String> = golden
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split(' ').next())
        .map(str::to_owned)
        .collect();
    names.insert("gpud_xid_errors_total".into());
    // Served with --pod-usage (the usage tests assert them).
    for usage in [
        "gpud_container_gpu_processes",
        "gpud_container_gpu_memory_used_bytes",
        "gpud_container_gpu_sm_utilization_ratio",
    ] {
        names.insert(usage.into());
    }
    names.insert("gpud_samples_total".into());
    // Served by `gpud run --remediation` (tests/remediation.rs scrapes them); the histogram
    // by its bucket series, as queries name it.
    for remediation in [
        "gpud_remediation_total",
        "gpud_remediation_state",
        "gpud_remediation_duration_seconds_bucket",
    ] {
        names.insert(remediation.into());
    }
    names
}

/// Metric names (`DCGM_…`, `gpud_…`) in a PromQL expression.
fn metric_names(expr: &str) -> Vec<String> {
    let mut names = Vec::new();
    let bytes: Vec<char> = expr.chars().collect();
    let mut i = 0;
    while i < bytes.len() {
        let rest: String = bytes[i..].iter().collect();
        if (rest.starts_with("DCGM_") || rest.starts_with("gpud_"))
            && (i == 0 || !(bytes[i - 1].is_alphanumeric() || bytes[i - 1] == '_'))
        {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            i += name.len();
            names.push(name);
        } else {
            i += 1;
        }
    }
    names
}

#[test]
fn dashboard_and_rules_only_use_served_metrics() {
    let served = served_families();
    let dashboard: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(packaging("grafana/gpud-dashboard.json")).unwrap(),
    )
    .unwrap();
    let mut exprs: Vec<String> = dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        // A row groups panels and queries nothing.
        .filter(|p| p["type"] != "row")
        .flat_map(|p| p["targets"].as_array().unwrap().iter())
        .map(|t| t["expr"].as_str().unwrap().to_owned())
        .collect();
    assert!(exprs.len() >= 10);
    for var in dashboard["templating"]["list"].as_array().unwrap() {
        if let Some(query) = var["query"].as_str() {
            exprs.push(query.to_owned());
        }
    }
    let rules: serde_json::Value = serde_yaml_ng::from_str(
        &std::fs::read_to_string(packaging("prometheus/gpud-alerts.yaml")).unwrap(),
    )
    .unwrap();
    for group in rules["groups"].as_array().unwrap() {
        for rule in group["rules"].as_array().unwrap() {
            exprs.push(rule["expr"].as_str().unwrap().to_owned());
        }
    }
    let mut used = BTreeSet::new();
    for expr in &exprs {
        for name in metric_names(expr) {
            assert!(served.contains(&name), "{name} is not served (in {expr:?})");
            used.insert(name);
        }
    }
    // The names dashboards built for dcgm-exporter depend on.
    for name in [
        "DCGM_FI_DEV_GPU_TEMP",
        "DCGM_FI_DEV_POWER_USAGE",
        "DCGM_FI_DEV_SM_CLOCK",
        "DCGM_FI_DEV_GPU_UTIL",
        "DCGM_FI_DEV_FB_USED",
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
    ] {
        assert!(used.contains(name), "the dashboard shows {name}");
    }
}
