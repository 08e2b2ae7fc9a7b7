//! Per-pod usage (`--pod-usage`): each container's own GPU memory and engine shares, from the
//! simulated driver's per-process data, a fake `/proc` tree (cgroup files in the shapes of
//! both cgroup versions and drivers) and this node's pods from the stand-in API server.

use std::path::Path;

use serde_json::json;

use crate::common::Node;
use crate::fake_api::FakeApi;
use crate::harness::{Exporter, family, value};

pub const MEMORY: &str = "gpud_container_gpu_memory_used_bytes";
pub const SM: &str = "gpud_container_gpu_sm_utilization_ratio";
pub const PROCESSES: &str = "gpud_container_gpu_processes";

pub const UID_A: &str = "aaaaaaaa-1111-4111-8111-000000000001";
pub const UID_B: &str = "bbbbbbbb-2222-4222-8222-000000000002";
pub const ID_A: &str = "a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1";
pub const ID_B: &str = "b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2";

/// A process in the fake `/proc`: its start time (clock ticks after boot) and cgroup file.
pub fn process(proc: &Path, pid: u32, started: u64, cgroup: &str) {
    let dir = proc.join(pid.to_string());
    std::fs::create_dir_all(&dir).unwrap();
    // Fields 3 (state) to 21, then the start time (22).
    let middle = vec!["0"; 18].join(" ");
    std::fs::write(
        dir.join("stat"),
        format!("{pid} (python3) S {middle} {started} 0 0\n"),
    )
    .unwrap();
    std::fs::write(dir.join("cgroup"), cgroup).unwrap();
}

fn pod(
    namespace: &str,
    name: &str,
    uid: &str,
    node: &str,
    containers: &[(&str, &str)],
) -> serde_json::Value {
    let statuses: Vec<serde_json::Value> = containers
        .iter()
        .map(|(name, id)| {
            json!({"name": name, "containerID": format!("containerd://{id}"), "image": "i",
                   "imageID": "", "ready": true, "restartCount": 0})
        })
        .collect();
    json!({"apiVersion": "v1", "kind": "Pod",
           "metadata": {"namespace": namespace, "name": name, "uid": uid},
           "spec": {"nodeName": node, "containers": []},
           "status": {"containerStatuses": statuses}})
}

/// A fake `/proc` with two pods' processes (PIDs 101 and 102, in cgroups of both versions and
/// drivers) and a host process (103).
pub fn fake_proc() -> tempfile::TempDir {
    let proc = tempfile::tempdir().unwrap();
    std::fs::write(proc.path().join("uptime"), "5000.00 9000.00\n").unwrap();
    // cgroup v2, cgroupfs driver.
    process(
        proc.path(),
        101,
        1000,
        &format!("0::/kubepods/burstable/pod{UID_A}/{ID_A}\n"),
    );
    // cgroup v1, systemd driver, containerd.
    let b = UID_B.replace('-', "_");
    process(
        proc.path(),
        102,
        2000,
        &format!(
            "12:pids:/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{b}.slice/cri-containerd-{ID_B}.scope\n\
             4:memory:/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{b}.slice/cri-containerd-{ID_B}.scope\n"
        ),
    );
    // A host process.
    process(proc.path(), 103, 3000, "0::/system.slice/render.service\n");
    proc
}

/// A node whose `/proc` has two pods' processes and a host process, and the API server that
/// knows the pods.
struct Setup {
    node: Node,
    api: FakeApi,
    proc: tempfile::TempDir,
}

fn setup(fixture: &str) -> Setup {
    let node = Node::new(fixture);
    let api = FakeApi::start(json!({}));
    api.put_pod(pod(
        "ml",
        "train-a",
        UID_A,
        "test-node",
        &[("trainer", ID_A)],
    ));
    api.put_pod(pod(
        "ml",
        "infer-b",
        UID_B,
        "test-node",
        &[("server", ID_B)],
    ));
    // Another node's pod: not this node's business (the list is by spec.nodeName).
    api.put_pod(pod(
        "ml",
        "elsewhere",
        "cccccccc-3333-4333-8333-000000000003",
        "other-node",
        &[],
    ));
    let proc = fake_proc();
    Setup { node, api, proc }
}

fn start(setup: &Setup) -> Exporter {
    let kubeconfig = setup.api.kubeconfig(setup.node.dir.path());
    // The real clock: on a pinned one NVML would have no per-process sample newer than the
    // last one read, as on a GPU whose processes are idle.
    Exporter::start_with(
        &setup.node,
        &[
            "--pod-usage",
            "--pod-usage-proc-root",
            setup.proc.path().to_str().unwrap(),
            "--node-name",
            "test-node",
            "--kubeconfig",
            kubeconfig.to_str().unwrap(),
        ],
        &[("NVML_MOCK_CLOCK", "")],
    )
}

/// The memory and SM series of GPU 0 shared by PIDs 101 (2048 MiB, 35 %), 102 (1024 MiB,
/// 20 %) and the host's 103 (512 MiB, 5 %), sorted by labels: the host's series (no pod) first.
pub fn assert_two_pods_and_the_host(body: &str) {
    assert_eq!(
        container_tails(body, MEMORY),
        [
            "\"\",namespace=\"\",pod=\"\"} 536870912",
            "\"server\",namespace=\"ml\",pod=\"infer-b\"} 1073741824",
            "\"trainer\",namespace=\"ml\",pod=\"train-a\"} 2147483648",
        ]
    );
    assert_eq!(
        by_pod(body, SM),
        [
            ("".into(), "0.050000".into()),
            ("infer-b".into(), "0.200000".into()),
            ("train-a".into(), "0.350000".into())
        ]
    );
}

/// Every sample of `metric` from its `container` label on (value included), in body order.
pub fn container_tails<'a>(body: &'a str, metric: &str) -> Vec<&'a str> {
    family(body, metric)
        .into_iter()
        .map(|l| l.split_once(",container=").unwrap().1)
        .collect()
}

/// `(pod, value)` of every sample of `metric`, in body order.
pub fn by_pod(body: &str, metric: &str) -> Vec<(String, String)> {
    family(body, metric)
        .into_iter()
        .map(|line| {
            let pod = line
                .split("pod=\"")
                .nth(1)
                .and_then(|rest| rest.split('"').next())
                .unwrap_or("?")
                .to_owned();
            (pod, line.rsplit_once(' ').unwrap().1.to_owned())
        })
        .collect()
}

#[test]
fn each_container_on_a_shared_gpu_gets_its_own_memory_and_sm_share() {
    let setup = setup("dgx-h100");
    // Three processes share GPU 0 (time-slicing): MiB, SM %, memory-copy %.
    setup.node.inject("process 0 101 2048 35 10");
    setup.node.inject("process 0 102 1024 20 5");
    setup.node.inject("process 0 103 512 5");
    let exporter = start(&setup);
    let body = exporter.metrics_until(20, |b| {
        value(b, MEMORY, &[("pod", "infer-b")]).is_some()
            && value(b, SM, &[("pod", "train-a")]).is_some()
    });

    let memory = family(&body, MEMORY);
    let gpu0 = memory[0].split(",container=").next().unwrap();
    assert!(
        gpu0.starts_with("gpud_container_gpu_memory_used_bytes{gpu=\"0\",UUID=\"GPU-"),
        "{gpu0}"
    );
    assert!(
        gpu0.contains(",device=\"nvidia0\",") && !gpu0.contains("modelName"),
        "{gpu0}"
    );
    assert_two_pods_and_the_host(&body);
    assert_eq!(
        value(
            &body,
            "gpud_container_gpu_mem_copy_utilization_ratio",
            &[("pod", "train-a")]
        )
        .as_deref(),
        Some("0.100000")
    );
    assert_eq!(
        value(&body, PROCESSES, &[("pod", "infer-b")]).as_deref(),
        Some("1")
    );
    // Only GPU 0 has processes.
    assert!(
        family(&body, PROCESSES)
            .iter()
            .all(|l| l.contains("{gpu=\"0\",")),
        "{body}"
    );
    // Prometheus' own lint finds nothing in the new families.
    let usage: String = body
        .lines()
        .filter(|l| l.contains("gpud_container_gpu_"))
        .map(|l| format!("{l}\n"))
        .collect();
    if let Some(findings) = crate::metrics::promtool_findings(&usage) {
        assert!(findings.is_empty(), "{findings:?}\n{usage}");
    }

    // The pod ends: its process goes, the API server deletes it, its series goes with them.
    setup.node.inject("process-end 0 101");
    setup.api.delete_pod("ml", "train-a");
    let body = exporter.metrics_until(20, |b| value(b, MEMORY, &[("pod", "train-a")]).is_none());
    assert_eq!(
        by_pod(&body, MEMORY)
            .into_iter()
            .map(|(p, _)| p)
            .collect::<Vec<_>>(),
        ["", "infer-b"]
    );

    // PID 102 is reused by a process started after NVML's read: it is not the process NVML
    // reported, so its use is no pod's rather than the new process's pod's.
    process(
        setup.proc.path(),
        102,
        900_000,
        &format!("0::/kubepods/besteffort/pod{UID_A}/{ID_A}\n"),
    );
    let body = exporter.metrics_until(20, |b| value(b, MEMORY, &[("pod", "infer-b")]).is_none());
    assert_eq!(by_pod(&body, MEMORY), [("".into(), "1610612736".into())]);
    assert_eq!(
        value(&body, PROCESSES, &[("pod", "")]).as_deref(),
        Some("2")
    );
    let reads = setup.api.state.lock().unwrap().pod_reads.clone();
    assert!(
        reads
            .iter()
            .all(|(_, q)| q.contains("fieldSelector=spec.nodeName%3Dtest-node")),
        "{reads:?}"
    );
    assert_eq!(
        reads.iter().filter(|(watch, _)| !watch).count(),
        1,
        "one list, then watches: {reads:?}"
    );
}

#[test]
fn mig_instances_get_their_processes_memory_and_no_utilisation_nvml_does_not_sample() {
    let setup = setup("a100-mig");
    setup.node.inject("process 0/gi1 101 1024 30");
    let exporter = start(&setup);
    let body = exporter.metrics_until(20, |b| value(b, MEMORY, &[("pod", "train-a")]).is_some());
    let line = family(&body, MEMORY)[0];
    assert!(line.contains(",GPU_I_ID=\"1\","), "{line}");
    assert!(line.contains(",GPU_I_PROFILE=\""), "{line}");
    assert!(
        line.ends_with(",container=\"trainer\",namespace=\"ml\",pod=\"train-a\"} 1073741824"),
        "{line}"
    );
    // NVML has no per-process utilisation in MIG mode: the family is left out, not zero.
    assert!(family(&body, SM).is_empty(), "{body}");
}

#[test]
fn pod_usage_without_the_node_name_is_refused_at_start() {
    let node = Node::new("dgx-h100");
    let out = node.run(&["exporter", "--pod-usage", "--node-name", ""]);
    assert_eq!(out.status.code(), Some(64));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--pod-usage") && err.contains("NODE_NAME"),
        "{err}"
    );
}

/// The pods' watch ended by 410 Gone (its resourceVersion compacted away) lists again, with
/// backoff, and watches on from the new list: a pod started later is named.
#[test]
fn a_pod_watch_ended_by_410_gone_lists_again_and_names_the_new_pod() {
    use crate::fake_api::{Fault, Rule};
    let setup = setup("dgx-h100");
    let gone = setup.api.refuse(
        Rule::exact("GET", "/api/v1/pods", Fault::GoneEvent)
            .query("watch=true")
            .times(1),
    );
    setup.node.inject("process 0 101 2048 35");
    let exporter = start(&setup);
    exporter.metrics_until(20, |b| value(b, MEMORY, &[("pod", "train-a")]).is_some());
    // A pod the node starts later is named through the watch opened after the new list.
    let uid = "dddddddd-4444-4444-8444-000000000004";
    let id = "d4".repeat(32);
    setup
        .api
        .put_pod(pod("web", "late", uid, "test-node", &[("enc", &id)]));
    process(
        setup.proc.path(),
        104,
        4000,
        &format!("0::/kubepods/besteffort/pod{uid}/{id}\n"),
    );
    setup.node.inject("process 1 104 512 5");
    let body = exporter.metrics_until(30, |b| value(b, MEMORY, &[("pod", "late")]).is_some());
    assert_eq!(
        value(&body, MEMORY, &[("pod", "late"), ("gpu", "1")]).as_deref(),
        Some("536870912")
    );
    assert_eq!(setup.api.refused_by(gone), 1);
    let reads = setup.api.state.lock().unwrap().pod_reads.clone();
    assert_eq!(
        reads.iter().filter(|(watch, _)| !watch).count(),
        2,
        "one list at start, one after the 410: {reads:?}"
    );
}

/// The pod list refused with 403 (gpud's ClusterRole without `list pods`): `/readyz` and the
/// log say so with the RBAC hint, the exporter stays ready and keeps serving its metrics
/// (usage without pod names meanwhile), and the pods are named once the list is allowed.
#[test]
fn a_pod_list_refused_with_403_is_said_with_the_rbac_hint_and_metrics_are_served() {
    use crate::fake_api::{Fault, Rule};
    let setup = setup("dgx-h100");
    let forbidden = setup
        .api
        .refuse(Rule::exact("GET", "/api/v1/pods", Fault::Forbidden));
    setup.node.inject("process 0 101 2048 35");
    let mut exporter = start(&setup);
    let said = crate::common::http::wait_for(exporter.port, "/readyz", 20, |a| {
        a.status == 200 && a.body.contains("per-pod usage")
    });
    assert!(
        said.body.contains(
            "exporter ready: per-pod usage cannot name this node's pods: listing this node's \
             pods: 403 Forbidden: "
        ) && said.body.contains("forbidden by RBAC")
            && said.body.contains("retrying with backoff"),
        "{}",
        said.body
    );
    // The metrics flow meanwhile: the GPUs' own, and the process's usage with no pod name.
    let body = exporter.metrics_after(2);
    assert_eq!(family(&body, "DCGM_FI_DEV_GPU_UTIL").len(), 8, "{body}");
    assert_eq!(value(&body, MEMORY, &[("pod", "train-a")]), None);
    exporter.drain_log();
    let log = exporter.log.join("\n");
    assert!(
        log.contains("Cannot follow this node's pods; retrying")
            && log.contains("forbidden by RBAC"),
        "{log}"
    );
    assert!(setup.api.refused_by(forbidden) >= 1);

    setup.api.allow_all();
    exporter.metrics_until(30, |b| value(b, MEMORY, &[("pod", "train-a")]).is_some());
    let ready = exporter.get("/readyz");
    assert_eq!(ready.status, 200);
    assert!(!ready.body.contains("per-pod usage"), "{}", ready.body);
}

/// A pod watch whose connection drops resumes from the last version it saw (no new list): a
/// pod added while it was down is named.
#[test]
fn a_dropped_pod_watch_resumes_and_names_a_pod_added_meanwhile() {
    use crate::fake_api::{Fault, Rule};
    let setup = setup("dgx-h100");
    // The first two watches after the start's list lose their connections.
    let dropped = setup.api.refuse(
        Rule::exact("GET", "/api/v1/pods", Fault::Drop)
            .query("watch=true")
            .times(2),
    );
    setup.node.inject("process 0 101 2048 35");
    let exporter = start(&setup);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while setup.api.refused_by(dropped) < 1 {
        assert!(std::time::Instant::now() < deadline, "no watch dropped");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    // Meanwhile a pod starts on the node.
    let uid = "eeeeeeee-5555-4555-8555-000000000005";
    let id = "e5".repeat(32);
    setup
        .api
        .put_pod(pod("web", "meanwhile", uid, "test-node", &[("enc", &id)]));
    process(
        setup.proc.path(),
        105,
        5000,
        &format!("0::/kubepods/besteffort/pod{uid}/{id}\n"),
    );
    setup.node.inject("process 2 105 256 5");
    let body = exporter.metrics_until(30, |b| value(b, MEMORY, &[("pod", "meanwhile")]).is_some());
    assert_eq!(
        value(&body, MEMORY, &[("pod", "meanwhile"), ("gpu", "2")]).as_deref(),
        Some("268435456")
    );
    assert!(
        value(&body, MEMORY, &[("pod", "train-a")]).is_some(),
        "{body}"
    );
    assert_eq!(setup.api.refused_by(dropped), 2);
    let reads = setup.api.state.lock().unwrap().pod_reads.clone();
    assert_eq!(
        reads.iter().filter(|(watch, _)| !watch).count(),
        1,
        "resumed from the version, not listed again: {reads:?}"
    );
    // Once a watch is open again, /readyz no longer names the dropped connection.
    let ready = crate::common::http::wait_for(exporter.port, "/readyz", 10, |a| {
        a.status == 200 && !a.body.contains("per-pod usage")
    });
    assert!(
        ready.body.lines().any(|l| l == "exporter ready"),
        "{}",
        ready.body
    );
}
