//! `gpud dra` writes each prepared device's status into its ResourceClaim (KEP-4817) on an
//! API server that keeps it (the stand-in as 1.37), follows the health verdict, removes it
//! at unprepare, and on one that drops it (the stand-in as 1.34 with the gate off) says so
//! once and changes nothing else.

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

use dra_node::{DRIVER, DraNode};
use fake_api::claim_status::DEVICE_STATUS_GATE;
use serde_json::{Value, json};

const STATUS_PATH: &str = "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/c1/status";

/// The entries of claim `ns/name`, their times replaced by `T`.
fn entries(dra: &DraNode, name: &str) -> Vec<Value> {
    let claim = dra.api.claim("ns", name).unwrap();
    let mut devices = claim["status"]["devices"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    for device in &mut devices {
        for condition in device["conditions"].as_array_mut().into_iter().flatten() {
            condition["lastTransitionTime"] = "T".into();
        }
    }
    devices
}

fn condition(entry: &Value, kind: &str) -> Value {
    entry["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == kind)
        .cloned()
        .unwrap_or(Value::Null)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_1_37_server_gets_each_devices_status_following_health_until_unprepare() {
    let mut dra = DraNode::new("dgx-h100");
    dra.api.set_server_version(Some("v1.37.0"));
    dra.start(&["dra"]);
    dra.register().await;
    dra.put_claim("c1", "uid-1", &["gpu-3"]);
    // Another driver's entry in the same claim is not gpud's to touch.
    let other = json!({"driver": "nic.example.com", "pool": "test-node", "device": "eth1",
                       "conditions": []});
    dra.api
        .own_claim_device("ns", "c1", "nic.example.com", other.clone());
    assert_eq!(dra.prepare("c1", "uid-1").await.claims["uid-1"].error, "");

    let uuid = dra.uuid(3);
    let written = dra.until("the device status", || {
        let all = entries(&dra, "c1");
        (all.len() == 2).then_some(all)
    });
    assert_eq!(written[0], other);
    let mine = &written[1];
    assert_eq!(
        (&mine["driver"], &mine["pool"], &mine["device"]),
        (&json!(DRIVER), &json!("test-node"), &json!("gpu-3"))
    );
    assert_eq!(mine.get("shareID"), None);
    assert_eq!(
        mine["conditions"],
        json!([
            {"type": "Ready", "status": "True", "reason": "Prepared",
             "message": "the device is configured and its CDI spec written",
             "lastTransitionTime": "T"},
            {"type": "Healthy", "status": "True", "reason": "Healthy", "message": "",
             "lastTransitionTime": "T"}
        ])
    );
    // The eight GPUs share one NVLink domain, named after the first.
    assert_eq!(
        mine["data"],
        json!({"uuid": uuid, "gpuUUID": uuid, "nvlinkDomain": dra.uuid(0)})
    );
    // Server-side apply on the status subresource, as the driver's own field manager.
    let applies = dra.api.requests_to("PATCH", STATUS_PATH);
    assert!(!applies.is_empty());
    for apply in &applies {
        assert_eq!(apply.field_manager.as_deref(), Some(DRIVER));
        assert!(apply.path.contains("force=true"), "{}", apply.path);
        assert_eq!(apply.status, 200);
    }

    // The verdict turns: so does the condition, and back on recovery.
    dra.log_when("health: Ready");
    dra.node.inject("xid 3 79");
    let sick = dra.until("the Healthy condition turned False", || {
        let all = entries(&dra, "c1");
        let healthy = condition(all.get(1)?, "Healthy");
        (healthy["status"] == "False").then_some(healthy)
    });
    assert_eq!(sick["reason"], "Unhealthy");
    assert!(sick["message"].as_str().unwrap().contains("79"), "{sick}");
    dra.node.inject("lost 3");
    dra.log_when("unhealthy -> unhealthy: GPU is lost");
    dra.node.inject("recover 3");
    dra.until("the Healthy condition back to True", || {
        let all = entries(&dra, "c1");
        (condition(all.get(1)?, "Healthy")["status"] == "True").then_some(())
    });

    // Unprepare: gpud's entry goes, the other driver's stays.
    assert_eq!(dra.unprepare("c1", "uid-1").await, "");
    dra.until("the device status removed", || {
        (entries(&dra, "c1") == [other.clone()]).then_some(())
    });
    assert!(!dra.log().contains("keeps no device status"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_entry_of_another_manager_is_taken_over_and_a_deleted_claim_is_let_go() {
    let mut dra = DraNode::new("dgx-h100");
    dra.api.set_server_version(Some("v1.37.0"));
    dra.start(&["dra"]);
    dra.register().await;
    dra.put_claim("c1", "uid-1", &["gpu-2"]);
    // An entry for gpud's device written by someone else (an earlier tool): the apply
    // forces, as the entry is keyed by gpud's driver.
    let stale = json!({"driver": DRIVER, "pool": "test-node", "device": "gpu-2",
                       "conditions": [], "data": {"stale": true}});
    dra.api.own_claim_device("ns", "c1", "kubectl", stale);
    assert_eq!(dra.prepare("c1", "uid-1").await.claims["uid-1"].error, "");
    let taken = dra.until("the entry taken over", || {
        let all = entries(&dra, "c1");
        (all.len() == 1 && all[0]["data"].get("stale").is_none()).then_some(all)
    });
    assert_eq!(taken[0]["device"], "gpu-2");

    // The claim is deleted before the kubelet unprepares it: one apply finds it gone (404),
    // and gpud does not try again.
    dra.api.delete_claim("ns", "c1");
    assert_eq!(dra.unprepare("c1", "uid-1").await, "");
    let gone = dra.until("the apply to the deleted claim", || {
        let answered: Vec<u16> = dra
            .api
            .requests_to("PATCH", STATUS_PATH)
            .iter()
            .map(|r| r.status)
            .collect();
        answered.contains(&404).then_some(answered)
    });
    dra.put_claim("c2", "uid-2", &["gpu-1"]);
    assert_eq!(dra.prepare("c2", "uid-2").await.claims["uid-2"].error, "");
    dra.until("the next claim's status", || {
        (entries(&dra, "c2").len() == 1).then_some(())
    });
    let after: Vec<u16> = dra
        .api
        .requests_to("PATCH", STATUS_PATH)
        .iter()
        .map(|r| r.status)
        .collect();
    assert_eq!(after, gone);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_1_34_server_that_drops_the_field_is_detected_once_and_nothing_else_changes() {
    let mut dra = DraNode::new("dgx-h100");
    dra.api.set_server_version(Some("v1.34.0"));
    dra.api.disable_gate(DEVICE_STATUS_GATE);
    dra.start(&["dra"]);
    dra.register().await;
    dra.put_claim("c1", "uid-1", &["gpu-3"]);
    dra.put_claim("c2", "uid-2", &["gpu-1"]);
    assert_eq!(dra.prepare("c1", "uid-1").await.claims["uid-1"].error, "");
    dra.log_when("The API server keeps no device status in ResourceClaims");
    assert_eq!(dra.prepare("c2", "uid-2").await.claims["uid-2"].error, "");
    dra.log_when("Prepared claim");
    dra.log_when("health: Ready");
    dra.node.inject("xid 1 79");
    assert_eq!(dra.unprepare("c1", "uid-1").await, "");
    assert_eq!(dra.unprepare("c2", "uid-2").await, "");
    // The XID's taint reaching the slices shows the inventory change went round.
    dra.until("the XID's slice taint", || {
        dra.api
            .slices()
            .values()
            .flat_map(|s| s["spec"]["devices"].as_array().cloned().unwrap_or_default())
            .any(|d| d["name"] == "gpu-1" && d.get("taints").is_some())
            .then_some(())
    });

    let applies = dra.api.claim_status_applies();
    assert_eq!(applies.len(), 1, "{applies:?}");
    assert_eq!(applies[0].1, "ns/c1");
    assert_eq!(
        dra.log()
            .matches("The API server keeps no device status in ResourceClaims")
            .count(),
        1
    );
    assert_eq!(
        dra.api.claim("ns", "c1").unwrap()["status"].get("devices"),
        None
    );
}
