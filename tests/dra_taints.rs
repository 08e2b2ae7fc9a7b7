//! An admin's DeviceTaintRules, on the stand-in API server as 1.37 (`resource.k8s.io/v1`)
//! and 1.36 (`v1alpha3`), reach `gpud run --dra`'s view of its GPUs — the exporter's
//! `gpud_dra_device_taint` and the `GPUHealthy` Node condition's message — and are never
//! fought (the slices are not written again); on a 1.34 server that serves none, gpud says
//! so once and nothing else changes.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
#[path = "common/dra_node.rs"]
mod dra_node;
#[path = "common/fake_api.rs"]
mod fake_api;
#[path = "common/fake_dra_kubelet.rs"]
mod fake_dra_kubelet;
#[path = "common/raw_grpc.rs"]
mod raw_grpc;

use common::{http, reset_command};
use dra_node::{DRIVER, DraNode};
use serde_json::{Value, json};

const TAINT_SERIES: &str = "gpud_dra_device_taint{";

/// `gpud run --dra` with the exporter on `port` and the node status, on a 1.`minor` server.
async fn start(minor: u32, rules_in: Option<&str>, port: u16) -> DraNode {
    let mut dra = on_server(minor, rules_in);
    launch(&mut dra, port, &[]).await;
    dra
}

/// A node on a stand-in API server that answers as 1.`minor` and serves DeviceTaintRules in
/// `rules_in` (none when `None`).
fn on_server(minor: u32, rules_in: Option<&str>) -> DraNode {
    let dra = DraNode::new("dgx-h100");
    dra.api.set_server_version(Some(&format!("v1.{minor}.0")));
    dra.api.serve_taint_rules(rules_in);
    dra
}

/// Starts `gpud run --dra … <extra>` with the exporter on `port` and the node status, and
/// waits until the plugin is registered and has published its slices.
async fn launch(dra: &mut DraNode, port: u16, extra: &[&str]) {
    let address = format!("127.0.0.1:{port}");
    let mut args = vec![
        "run",
        "--dra",
        "--node-status",
        "--node-status-hold",
        "300ms",
        "--disable",
        "device-plugin,labeller",
        "--doctor-interval",
        "0",
        "-a",
        &address,
        "-c",
        "100",
    ];
    args.extend_from_slice(extra);
    dra.start(&args);
    dra.register().await;
    dra.until("slices", || (!dra.api.slices().is_empty()).then_some(()));
}

fn rule(name: &str, selector: Value, effect: &str) -> Value {
    json!({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceTaintRule",
           "metadata": {"name": name},
           "spec": {"deviceSelector": selector,
                    "taint": {"key": "example.com/maintenance", "value": "bios",
                              "effect": effect}}})
}

/// The `gpud_dra_device_taint` lines of the metrics once `accept` holds for them.
fn taint_lines_when(port: u16, accept: impl Fn(&[String]) -> bool) -> Vec<String> {
    let body = tokio::task::block_in_place(|| {
        http::wait_for(port, "/metrics", 15, |a| {
            a.status == 200 && accept(&lines(&a.body))
        })
        .body
    });
    lines(&body)
}

fn lines(body: &str) -> Vec<String> {
    body.lines()
        .filter(|l| l.starts_with(TAINT_SERIES))
        .map(str::to_owned)
        .collect()
}

fn gpu_condition_message(dra: &DraNode) -> String {
    dra.api
        .condition("GPUHealthy")
        .map_or_else(String::new, |c| {
            c["message"].as_str().unwrap_or_default().to_owned()
        })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admins_rule_reaches_the_metrics_and_the_node_condition_and_is_not_fought() {
    for (minor, version) in [(37, "v1"), (36, "v1alpha3")] {
        let port = http::free_port();
        let dra = start(minor, Some(version), port).await;
        dra.log_when("Following DeviceTaintRules");
        let uuid = dra.uuid(3);
        let message = dra.until("the GPU condition", || {
            Some(gpu_condition_message(&dra)).filter(|m| !m.is_empty())
        });
        assert!(!message.contains("Tainted"), "{message}");
        let writes = dra.api.slice_writes().len();

        dra.api.put_taint_rule(rule(
            "maint",
            json!({"driver": DRIVER, "pool": "test-node", "device": "gpu-3"}),
            "NoExecute",
        ));
        // Another node's device and another driver's are not this node's.
        dra.api.put_taint_rule(rule(
            "elsewhere",
            json!({"driver": DRIVER, "pool": "other-node", "device": "gpu-3"}),
            "NoExecute",
        ));
        dra.api.put_taint_rule(rule(
            "nics",
            json!({"driver": "nic.example.com"}),
            "NoSchedule",
        ));
        let series = taint_lines_when(port, |l| !l.is_empty());
        assert_eq!(series.len(), 1, "{series:?}");
        assert!(
            series[0].contains(&format!("gpu=\"3\",UUID=\"{uuid}\"")),
            "{}",
            series[0]
        );
        assert!(
            series[0].ends_with(
                ",dra_device=\"gpu-3\",rule=\"maint\",key=\"example.com/maintenance\",\
                 effect=\"NoExecute\"} 1"
            ),
            "{}",
            series[0]
        );
        // `gpud inventory` shows it on the GPU, from what the daemon keeps in its state folder.
        let shown = dra.until("the taint in gpud inventory", || {
            let inventory: Value =
                serde_json::from_str(&common::stdout_ok(&dra.node.run(&["inventory"]))).ok()?;
            let taints = inventory["gpus"][3].get("device_taints")?.clone();
            Some((taints, inventory))
        });
        assert_eq!(
            shown.0,
            json!([{"rule": "maint", "device": "gpu-3", "key": "example.com/maintenance",
                    "value": "bios", "effect": "NoExecute"}])
        );
        let others = shown.1["gpus"].as_array().unwrap().iter();
        assert_eq!(
            others.filter(|g| g.get("device_taints").is_some()).count(),
            1
        );
        let message = dra.until("the taint in the GPU condition", || {
            Some(gpu_condition_message(&dra)).filter(|m| m.contains("Tainted"))
        });
        assert!(
            message.ends_with(&format!(
                ". Tainted by an admin: GPU 3 {uuid}: gpu-3 \
                 example.com/maintenance=bios:NoExecute by DeviceTaintRule maint"
            )),
            "{message}"
        );
        assert_eq!(
            dra.api.condition("GPUHealthy").unwrap()["status"],
            "True",
            "an admin's taint is no verdict on the GPU"
        );

        // Lifted: gone from both.
        dra.api.delete_taint_rule("maint");
        taint_lines_when(port, <[String]>::is_empty);
        dra.until("the taint gone from gpud inventory", || {
            let inventory: Value =
                serde_json::from_str(&common::stdout_ok(&dra.node.run(&["inventory"]))).ok()?;
            inventory["gpus"][3]
                .get("device_taints")
                .is_none()
                .then_some(())
        });
        dra.until("the taint gone from the GPU condition", || {
            Some(gpu_condition_message(&dra)).filter(|m| !m.contains("Tainted"))
        });
        // Never fought: gpud wrote no slice for any of it.
        assert_eq!(dra.api.slice_writes().len(), writes);
        assert_eq!(dra.api.taint_rule_watches(), 1);
        let calls = dra.api.taint_rule_requests();
        let prefix = format!("GET /apis/resource.k8s.io/{version}/devicetaintrules");
        assert!(calls.contains(&prefix), "{calls:?}");
        assert!(
            !dra.log().contains("serves no DeviceTaintRules"),
            "{}",
            dra.log()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_1_34_server_without_device_taint_rules_is_said_once_and_nothing_changes() {
    let port = http::free_port();
    let dra = start(34, None, port).await;
    dra.log_when("The API server serves no DeviceTaintRules");
    dra.api.put_taint_rule(rule(
        "maint",
        json!({"driver": DRIVER, "pool": "test-node", "device": "gpu-3"}),
        "NoExecute",
    ));
    // The exporter serves, without the family; the condition names no taint.
    let body = tokio::task::block_in_place(|| {
        http::wait_for(port, "/metrics", 15, |a| {
            a.status == 200 && a.body.contains("gpud_build_info")
        })
        .body
    });
    assert!(lines(&body).is_empty(), "{body}");
    let message = dra.until("the GPU condition", || {
        Some(gpu_condition_message(&dra)).filter(|m| !m.is_empty())
    });
    assert!(!message.contains("Tainted"), "{message}");
    let calls = dra.api.taint_rule_requests();
    assert_eq!(
        calls,
        [
            "GET /apis/resource.k8s.io/v1/devicetaintrules",
            "GET /apis/resource.k8s.io/v1alpha3/devicetaintrules"
        ]
    );
    assert_eq!(
        dra.log()
            .matches("The API server serves no DeviceTaintRules")
            .count(),
        1
    );
    assert_eq!(dra.api.taint_rule_watches(), 0);
}

/// GPU `uuid`'s remediation record once `accept` holds for it (within 45 s).
fn record_when(dra: &DraNode, uuid: &str, what: &str, accept: impl Fn(&Value) -> bool) -> Value {
    reset_command::record_when(&dra.node, uuid, what, 45, || dra.log(), accept)
}

/// Remediation does not reset a faulty GPU whose DRA device an admin's NoExecute
/// DeviceTaintRule selects: it drains and says why, and resets it only once the rule is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remediation_waits_for_an_admins_no_execute_rule_to_be_lifted_before_the_reset() {
    let port = http::free_port();
    let mut dra = on_server(37, Some("v1"));
    let reset = reset_command::write(&dra.node, "").display().to_string();
    launch(
        &mut dra,
        port,
        &[
            "--remediation",
            "reset",
            "--remediation-reset-command",
            &reset,
            "--remediation-max-concurrent",
            "0",
        ],
    )
    .await;
    dra.log_when("Following DeviceTaintRules");
    let inventory: Value =
        serde_json::from_str(&common::stdout_ok(&dra.node.run(&["inventory"]))).unwrap();
    let uuid = inventory["gpus"][3]["uuid"].as_str().unwrap().to_owned();
    let bus_id = inventory["gpus"][3]["pci"]["bus_id"]
        .as_str()
        .unwrap()
        .to_owned();

    dra.api.put_taint_rule(rule(
        "maint",
        json!({"driver": DRIVER, "pool": "test-node", "device": "gpu-3"}),
        "NoExecute",
    ));
    // The daemon's own view of its GPUs (the exporter's) has the taint before the fault.
    taint_lines_when(port, |l| !l.is_empty());
    dra.node.inject("xid 3 95");
    let record = record_when(&dra, &uuid, "GPU 3 held for the admin's rule", |g| {
        g["phase"] == "draining" && g["reason"].as_str().unwrap_or_default().contains("maint")
    });
    assert_eq!(
        record["reason"],
        "waiting: an admin tainted GPU 3 (gpu-3 example.com/maintenance=bios:NoExecute, \
         DeviceTaintRule maint) for maintenance; not reset until the rule is lifted"
    );
    assert_eq!(record["reset_count"], 0);
    assert!(
        reset_command::calls(&dra.node).is_empty(),
        "reset under the admin's rule"
    );
    // The exporter says so too, and still nothing was reset.
    let draining = "state=\"draining\"} 1";
    let body = tokio::task::block_in_place(|| {
        http::wait_for(port, "/metrics", 30, |a| {
            a.body.lines().any(|l| {
                l.starts_with("gpud_remediation_state{")
                    && l.contains(&uuid)
                    && l.ends_with(draining)
            })
        })
        .body
    });
    assert!(
        body.contains("gpud_dra_device_taint{"),
        "the rule is still shown: {body}"
    );
    assert!(
        reset_command::calls(&dra.node).is_empty(),
        "reset under the admin's rule"
    );

    // Lifted: the GPU is reset, once, and back in service.
    dra.api.delete_taint_rule("maint");
    let record = record_when(&dra, &uuid, "GPU 3 back in service", |g| {
        g["phase"] == "healthy"
    });
    assert_eq!(record["reset_count"], 1);
    assert_eq!(reset_command::calls(&dra.node), [format!("-i {bus_id}")]);
    // No other GPU was touched.
    let text = std::fs::read_to_string(dra.path("state/remediation.json")).unwrap();
    let all: Value = serde_json::from_str(&text).unwrap();
    for (other, gpu) in all["gpus"].as_object().unwrap() {
        if *other != uuid {
            assert_eq!(gpu["reset_count"], 0, "{other}: {gpu}");
        }
    }
}
