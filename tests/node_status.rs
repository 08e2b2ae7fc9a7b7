//! `gpud node-status` and `gpud run --node-status` end to end: the real binary on the
//! simulated NVML, writing to a fake API server. Faults go in through the simulated driver's
//! control file; every assertion is on what the API server holds or received.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
#[path = "common/fake_api.rs"]
mod fake_api;

use std::time::{Duration, Instant};

use common::host::Host;
use common::{Node, Running};
use fake_api::{FakeApi, Fault, Rule};
use serde_json::{Value, json};

/// The hold time the tests run with.
const HOLD: Duration = Duration::from_millis(300);
const HOLD_FLAG: &str = "300ms";

/// `gpud <applet> …` against `api`: fast polling, a short hold and retry ceiling, no kernel log.
fn start(node: &Node, api: &FakeApi, applet: &[&str], extra: &[&str]) -> Running {
    Running::spawn(command(node, api, applet, extra))
}

/// The command [`start`] runs.
fn command(node: &Node, api: &FakeApi, applet: &[&str], extra: &[&str]) -> std::process::Command {
    let kubeconfig = api.kubeconfig(node.dir.path());
    let mut args = applet.to_vec();
    args.extend_from_slice(&[
        "--kubeconfig",
        kubeconfig.to_str().unwrap(),
        "--health-poll-interval",
        "20ms",
        "--kmsg",
        "",
        "--node-status-retry-max",
        "1s",
    ]);
    if !extra.contains(&"--node-status-hold") {
        args.extend_from_slice(&["--node-status-hold", HOLD_FLAG]);
    }
    args.extend_from_slice(extra);
    node.gpud(&args)
}

fn node_status(node: &Node, api: &FakeApi, extra: &[&str]) -> Running {
    start(node, api, &["node-status"], extra)
}

/// Polls `check` until it returns `Some`, failing after `secs` seconds with `what`.
fn wait_for<T>(secs: u64, what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(value) = check() {
            return value;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits until the condition `kind` satisfies `accept`, and returns it.
fn condition_when(api: &FakeApi, kind: &str, accept: impl Fn(&Value) -> bool) -> Value {
    wait_for(20, &format!("condition {kind}"), || {
        api.condition(kind).filter(|c| accept(c))
    })
}

fn status_is(status: &'static str) -> impl Fn(&Value) -> bool {
    move |c: &Value| c["status"] == status
}

/// Injects `line` again and again until `done`: a fault injected before the watcher has
/// registered for NVML events is one the driver never reports, so the first may be missed.
fn inject_until<T>(node: &Node, line: &str, mut done: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        node.inject(line);
        let until = Instant::now() + Duration::from_millis(500);
        while Instant::now() < until {
            if let Some(value) = done() {
                return value;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(Instant::now() < deadline, "{line:?} never took effect");
    }
}

/// The UUID of the GPU in `text`'s `GPU <index> <uuid>`.
fn uuid_in(text: &str, index: u32) -> String {
    let prefix = format!("GPU {index} ");
    let at = text.find(&prefix).unwrap() + prefix.len();
    let uuid: String = text[at..]
        .chars()
        .take_while(|c| !c.is_whitespace() && *c != ':')
        .collect();
    assert!(uuid.starts_with("GPU-"), "{text}");
    uuid
}

/// The (reason, message) of every event, in order.
fn events(api: &FakeApi) -> Vec<(String, String)> {
    api.events()
        .iter()
        .map(|e| {
            (
                e["reason"].as_str().unwrap().to_owned(),
                e["message"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

/// The status of the condition `kind` in every apply that carries it, with consecutive
/// repeats folded.
fn status_changes(api: &FakeApi, kind: &str) -> Vec<(Instant, String)> {
    let state = api.state.lock().unwrap();
    let mut out: Vec<(Instant, String)> = Vec::new();
    for (at, manager, body) in &state.status_applies {
        assert_eq!(manager, "gpud");
        let Some(condition) = body["status"]["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["type"] == kind)
        else {
            continue;
        };
        let status = condition["status"].as_str().unwrap().to_owned();
        if out.last().map(|(_, s)| s) != Some(&status) {
            out.push((*at, status));
        }
    }
    out
}

fn gpu_status_changes(api: &FakeApi) -> Vec<(Instant, String)> {
    status_changes(api, "GPUHealthy")
}

const HEALTHY: &str = "8 GPUs: 8 healthy, 0 degraded, 0 unhealthy";

#[test]
fn a_fatal_xid_sets_the_condition_false_once_and_recovery_waits_for_the_hold() {
    let node = Node::new("dgx-h100");
    let api = FakeApi::start_with_node(json!({}));
    let _gpud = node_status(&node, &api, &[]);
    let first = condition_when(&api, "GPUHealthy", status_is("True"));
    assert_eq!(
        (&first["reason"], &first["message"]),
        (&json!("AllGPUsHealthy"), &json!(HEALTHY))
    );
    assert!(api.events().is_empty(), "{:?}", api.events());

    let failed = inject_until(&node, "xid 3 79", || {
        api.condition("GPUHealthy").filter(status_is("False"))
    });
    let message = failed["message"].as_str().unwrap();
    let uuid = uuid_in(message, 3);
    assert_eq!(failed["reason"], "GPUXIDError");
    assert_eq!(
        message,
        format!(
            "8 GPUs: 7 healthy, 0 degraded, 1 unhealthy. GPU 3 {uuid}: unhealthy: XID 79: GPU has \
             fallen off the bus — drain and reboot the node"
        )
    );
    let event = wait_for(10, "the event", || api.events().first().cloned());
    assert_eq!(event["type"], "Warning");
    assert_eq!(event["reason"], "GPUUnhealthy");
    assert_eq!(
        event["message"],
        format!(
            "GPU 3 {uuid} healthy -> unhealthy: XID 79: GPU has fallen off the bus — drain and \
             reboot the node"
        )
    );
    assert_eq!(
        event["involvedObject"],
        json!({"apiVersion": "v1", "kind": "Node", "name": "test-node", "uid": "node-uid-1"})
    );
    assert_eq!(event["source"]["component"], "gpud");
    // The repeated injections are one transition: one event.
    assert_eq!(api.events().len(), 1, "{:?}", events(&api));

    // A reset (the GPU drops off the bus and comes back) clears the XID.
    node.inject("lost 3");
    condition_when(&api, "GPUHealthy", |c| {
        c["status"] == "False" && c["message"].as_str().unwrap().contains("GPU is lost")
    });
    let recovered_at = Instant::now();
    node.inject("recover 3");
    let back = condition_when(&api, "GPUHealthy", status_is("True"));
    assert_eq!(back["message"], HEALTHY);
    let changes = gpu_status_changes(&api);
    let statuses: Vec<&str> = changes.iter().map(|(_, s)| s.as_str()).collect();
    assert_eq!(statuses, ["True", "False", "True"]);
    let waited = changes[2].0 - recovered_at;
    println!("recovery shown {waited:?} after the GPU came back (hold {HOLD:?})");
    assert!(
        waited >= HOLD,
        "recovery shown after {waited:?}, before the hold"
    );
    let reasons: Vec<String> = wait_for(10, "the recovery event", || {
        let all = events(&api);
        (all.len() == 3).then_some(all)
    })
    .into_iter()
    .map(|(reason, _)| reason)
    .collect();
    assert_eq!(reasons, ["GPUUnhealthy", "GPUUnhealthy", "GPURecovered"]);
}

#[test]
fn a_flapping_gpu_changes_the_condition_once_per_hold() {
    let node = Node::new("dgx-h100");
    let api = FakeApi::start_with_node(json!({}));
    let _gpud = node_status(&node, &api, &["--node-status-hold", "1s"]);
    condition_when(&api, "GPUHealthy", status_is("True"));
    // Ten failures and recoveries 150 ms apart: never healthy for a whole hold.
    for _ in 0..10 {
        node.inject("lost 5");
        std::thread::sleep(Duration::from_millis(150));
        node.inject("recover 5");
        std::thread::sleep(Duration::from_millis(150));
    }
    let flapping_ended = Instant::now();
    condition_when(&api, "GPUHealthy", |c| {
        c["status"] == "True" && c["message"] == HEALTHY
    });
    let changes = gpu_status_changes(&api);
    let statuses: Vec<&str> = changes.iter().map(|(_, s)| s.as_str()).collect();
    assert_eq!(statuses, ["True", "False", "True"]);
    // The recovery waited at least a whole hold after the failure showed, and came after the
    // flapping (measured from the writes, not from the injections, which a loaded machine's
    // watcher may see late or, for the last short outage, not at all).
    assert!(changes[2].0 - changes[1].0 >= Duration::from_secs(1));
    assert!(changes[2].0 >= flapping_ended);
    // One failure and one recovery event: the repeats are de-duplicated.
    let reasons: Vec<String> = events(&api).into_iter().map(|(r, _)| r).collect();
    assert_eq!(reasons, ["GPUUnhealthy", "GPURecovered"]);
}

/// A Node as a cluster leaves it: cordoned by someone else, with another controller's taint
/// and condition.
fn busy_node() -> FakeApi {
    let api = FakeApi::start_with_node(json!({
        "spec": {
            "unschedulable": true,
            "taints": [{"key": "example.com/maintenance", "value": "planned", "effect": "NoExecute"}],
        },
        "status": {"conditions": [
            {"type": "KernelDeadlock", "status": "False", "reason": "KernelHasNoDeadlock",
             "message": "kernel has no deadlock", "lastTransitionTime": "2025-01-01T00:00:00Z"},
        ]},
    }));
    api.state
        .lock()
        .unwrap()
        .condition_managers
        .insert("KernelDeadlock".into(), "node-problem-detector".into());
    api
}

/// Asserts that every version of the Node kept the other controller's taint, condition and
/// cordon.
fn others_survived(api: &FakeApi) {
    let state = api.state.lock().unwrap();
    assert!(!state.history.is_empty());
    for node in &state.history {
        assert_eq!(node["spec"]["unschedulable"], true, "{node}");
        let taints = node["spec"]["taints"].as_array().unwrap();
        assert_eq!(
            taints[0],
            json!({"key": "example.com/maintenance", "value": "planned", "effect": "NoExecute"}),
            "{node}"
        );
        let conditions = node["status"]["conditions"].as_array().unwrap();
        assert!(
            conditions
                .iter()
                .any(|c| c["type"] == "KernelDeadlock" && c["message"] == "kernel has no deadlock"),
            "{node}"
        );
    }
    assert_eq!(
        state
            .condition_managers
            .get("KernelDeadlock")
            .map(String::as_str),
        Some("node-problem-detector")
    );
}

fn taint_keys(api: &FakeApi) -> Vec<(String, String)> {
    api.node()["spec"]["taints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            (
                t["key"].as_str().unwrap().to_owned(),
                t["effect"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

#[test]
fn without_taint_flags_no_taint_is_written() {
    let node = Node::new("pcie-4gpu");
    let api = busy_node();
    let _gpud = node_status(&node, &api, &[]);
    condition_when(&api, "GPUHealthy", status_is("True"));
    node.inject("lost 2");
    condition_when(&api, "GPUHealthy", status_is("False"));
    node.inject("recover 2");
    condition_when(&api, "GPUHealthy", status_is("True"));
    // Only nodes/status applies: no patch of the Node itself.
    assert!(api.state.lock().unwrap().patches.is_empty());
    assert_eq!(
        taint_keys(&api),
        [("example.com/maintenance".to_owned(), "NoExecute".to_owned())]
    );
    others_survived(&api);
}

#[test]
fn configured_taints_come_and_go_and_others_are_left_alone() {
    let node = Node::new("pcie-4gpu");
    let api = busy_node();
    let _gpud = node_status(
        &node,
        &api,
        &[
            "--taint-unhealthy",
            "NoSchedule",
            "--taint-min-healthy",
            "4:PreferNoSchedule",
        ],
    );
    condition_when(&api, "GPUHealthy", status_is("True"));
    assert_eq!(taint_keys(&api).len(), 1);
    node.inject("lost 2");
    let tainted = wait_for(20, "gpud's taints", || {
        let keys = taint_keys(&api);
        (keys.len() == 3).then_some(keys)
    });
    let owned = |k: &str, e: &str| (k.to_owned(), e.to_owned());
    assert_eq!(
        tainted,
        [
            owned("example.com/maintenance", "NoExecute"),
            owned("gpud.io/gpu-too-few-healthy", "PreferNoSchedule"),
            owned("gpud.io/gpu-unhealthy", "NoSchedule"),
        ]
    );
    let ours = &api.node()["spec"]["taints"][2];
    assert_eq!(ours["value"], "true");
    assert!(ours["timeAdded"].is_string(), "{ours}");
    node.inject("recover 2");
    wait_for(20, "gpud's taints removed", || {
        (taint_keys(&api).len() == 1).then_some(())
    });
    assert_eq!(
        taint_keys(&api),
        [owned("example.com/maintenance", "NoExecute")]
    );
    others_survived(&api);
    // Every taint write named the resourceVersion it was computed from.
    for (kind, patch) in &api.state.lock().unwrap().patches {
        assert_eq!(kind, "application/merge-patch+json");
        assert!(patch["metadata"]["resourceVersion"].is_string(), "{patch}");
    }
}

#[test]
fn after_30s_without_the_api_server_the_node_gets_the_current_state_and_no_duplicate_events() {
    let node = Node::new("dgx-h100");
    let mut api = FakeApi::start_with_node(json!({}));
    // The node status says at debug level when it queues an event: the sign it has seen a
    // transition while the API server is away.
    let mut command = command(&node, &api, &["node-status"], &[]);
    command.env("GPUD_LOG", "info,gpud::kube::events=debug");
    let gpud = Running::spawn(command);
    condition_when(&api, "GPUHealthy", status_is("True"));
    let applies_before = api.state.lock().unwrap().status_applies.len();
    api.stop();
    // While the API server is away: GPU 3 fails and recovers (once the node status has seen
    // it fail), GPU 5 fails.
    let down_at = Instant::now();
    node.inject("lost 3");
    node.inject("lost 5");
    wait_for(20, "GPU 3's failure queued as an event", || {
        gpud.stderr()
            .contains("Node event queued: GPU 3 ")
            .then_some(())
    });
    node.inject("recover 3");
    // The outage lasts 30 s, many retries long (they back off to 1 s at most).
    std::thread::sleep(Duration::from_secs(30).saturating_sub(down_at.elapsed()));
    api.restart();
    // gpud comes back within the window its probes are drawn from (GATE_MAX, 64 s), which
    // after half a minute away is about as long again: spread, not at once.
    let current = wait_for(90, "GPUHealthy False after the outage", || {
        api.condition("GPUHealthy").filter(status_is("False"))
    });
    let message = current["message"].as_str().unwrap();
    let uuid5 = uuid_in(message, 5);
    assert!(
        message.starts_with(&format!(
            "8 GPUs: 7 healthy, 0 degraded, 1 unhealthy. GPU 5 {uuid5}: unhealthy: GPU is lost"
        )),
        "{message}"
    );
    // The first write after the outage was already the current state: no replay.
    let state = api.state.lock().unwrap();
    let after: Vec<&Value> = state.status_applies[applies_before..]
        .iter()
        .map(|(_, _, body)| &body["status"]["conditions"][0])
        .collect();
    assert!(!after.is_empty());
    for condition in after {
        assert_eq!(condition["message"], current["message"]);
    }
    drop(state);
    // Each transition once, whatever the retries.
    let all = wait_for(20, "the outage's events", || {
        let all = events(&api);
        (all.len() >= 3).then_some(all)
    });
    let mut reasons: Vec<(String, u32)> = all
        .iter()
        .map(|(reason, message)| {
            let gpu = message.split(' ').nth(1).unwrap().parse().unwrap();
            (reason.clone(), gpu)
        })
        .collect();
    reasons.sort();
    assert_eq!(
        reasons,
        [
            ("GPURecovered".to_owned(), 3),
            ("GPUUnhealthy".to_owned(), 3),
            ("GPUUnhealthy".to_owned(), 5)
        ]
    );
    let mut names: Vec<Value> = api
        .events()
        .iter()
        .map(|e| e["metadata"]["name"].clone())
        .collect();
    names.dedup();
    assert_eq!(names.len(), 3);
}

#[test]
fn the_doctor_verdict_follows_an_injected_failure() {
    let node = Node::new("dgx-h100");
    let api = FakeApi::start_with_node(json!({}));
    let host = Host::healthy(&node);
    let _gpud = start(
        &node,
        &api,
        &["run", "--node-status"],
        &[
            "--disable",
            "device-plugin,labeller,exporter",
            "--doctor-interval",
            "200ms",
            "--host-root",
            host.dir.path().to_str().unwrap(),
        ],
    );
    let lost_check = "gpu.present: GPU 3 fell off the bus (NVML_ERROR_GPU_IS_LOST)";
    // A healthy host root: every check passes.
    let passed = condition_when(&api, "GPUStackValidated", |c| c["status"] != "Unknown");
    assert_eq!(passed["status"], "True", "{passed}");
    assert_eq!(passed["reason"], "DoctorPassed", "{passed}");
    assert!(
        passed["message"]
            .as_str()
            .unwrap()
            .contains(" 0 warn, 0 fail"),
        "{passed}"
    );
    node.inject("lost 3");
    let failed = condition_when(&api, "GPUStackValidated", status_is("False"));
    assert_eq!(failed["reason"], "DoctorChecksFailed");
    let message = failed["message"].as_str().unwrap();
    assert!(message.contains(lost_check), "{message}");
    assert!(
        message.contains(" 1 fail"),
        "the lost GPU is the only failure: {message}"
    );
    assert_eq!(
        api.condition("GPUHealthy").unwrap()["status"],
        "False",
        "both conditions on the Node"
    );
    node.inject("recover 3");
    let recovered = condition_when(&api, "GPUStackValidated", status_is("True"));
    assert_eq!(recovered["reason"], "DoctorPassed", "{recovered}");
    condition_when(&api, "GPUHealthy", status_is("True"));
    let changes: Vec<String> = status_changes(&api, "GPUStackValidated")
        .into_iter()
        .map(|(_, status)| status)
        .collect();
    // The first write waits for the doctor's first run: no "not run yet" just before it.
    assert_eq!(changes, ["True", "False", "True"]);
}

#[test]
fn the_doctor_verdict_follows_the_gpu_back_after_an_xid_in_the_kernel_log() {
    let node = Node::new("dgx-h100");
    let api = FakeApi::start_with_node(json!({}));
    let host = Host::healthy(&node);
    let kmsg = host.path("kmsg");
    let kubeconfig = api.kubeconfig(node.dir.path());
    // The watcher and the doctor read the same kernel log (a file the watcher follows).
    let _gpud = Running::spawn(node.gpud(&[
        "run",
        "--node-status",
        "--kubeconfig",
        kubeconfig.to_str().unwrap(),
        "--health-poll-interval",
        "20ms",
        "--kmsg",
        kmsg.to_str().unwrap(),
        "--node-status-retry-max",
        "1s",
        "--node-status-hold",
        HOLD_FLAG,
        "--disable",
        "device-plugin,labeller,exporter",
        "--doctor-interval",
        "200ms",
        "--host-root",
        host.dir.path().to_str().unwrap(),
    ]));
    let passed = condition_when(&api, "GPUStackValidated", |c| c["status"] != "Unknown");
    assert_eq!(passed["status"], "True", "{passed}");
    {
        use std::io::Write;
        let mut log = std::fs::OpenOptions::new()
            .append(true)
            .open(&kmsg)
            .unwrap();
        log.write_all(
            b"[  12.5] NVRM: Xid (PCI:0000:18:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.\n",
        )
        .unwrap();
    }
    let failed = condition_when(&api, "GPUStackValidated", status_is("False"));
    let message = failed["message"].as_str().unwrap();
    assert!(
        message.contains("gpu.xid: GPU 0: unhealthy (XID 79: GPU has fallen off the bus)"),
        "{message}"
    );
    assert!(message.contains(" 1 fail"), "{message}");
    // A reset (the GPU drops off the bus and comes back) clears the XID in the watcher.
    node.inject("lost 0");
    condition_when(&api, "GPUHealthy", |c| {
        c["message"].as_str().unwrap().contains("GPU is lost")
    });
    node.inject("recover 0");
    condition_when(&api, "GPUHealthy", status_is("True"));
    // The XID is still in the kernel log of this boot; the GPU is back all the same.
    let recovered = condition_when(&api, "GPUStackValidated", status_is("True"));
    assert_eq!(recovered["reason"], "DoctorPassed", "{recovered}");
    let changes: Vec<String> = status_changes(&api, "GPUStackValidated")
        .into_iter()
        .map(|(_, status)| status)
        .collect();
    assert_eq!(changes, ["True", "False", "True"]);
}

#[test]
fn node_status_needs_the_node_name() {
    let node = Node::new("dgx-h100");
    let out = node
        .gpud(&["node-status", "--check-config"])
        .env_remove("NODE_NAME")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "gpud: the node status needs the node name (--node-name or NODE_NAME)\n"
    );
    let ok = node
        .gpud(&[
            "node-status",
            "--check-config",
            "--taint-min-healthy",
            "7:NoExecute",
        ])
        .output()
        .unwrap();
    assert_eq!(
        ok.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    let bad = node
        .gpud(&[
            "node-status",
            "--check-config",
            "--taint-unhealthy",
            "Never",
        ])
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(64));
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains(
            "\"Never\" is not a taint effect (NoSchedule, PreferNoSchedule or NoExecute)"
        ),
        "{}",
        String::from_utf8_lossy(&bad.stderr)
    );
}

#[test]
fn not_ready_until_the_api_server_answers_and_it_says_why() {
    let node = Node::new("dgx-h100");
    let mut api = FakeApi::start_with_node(json!({}));
    api.stop();
    let port = common::http::free_port();
    let address = format!("127.0.0.1:{port}");
    let _gpud = node_status(&node, &api, &["--health-address", &address]);
    let refused = common::http::wait_for(port, "/readyz", 20, |a| {
        a.status == 503
            && a.body
                .contains("node-status not ready: no successful call to the API server yet: ")
    });
    assert!(refused.body.contains("node test-node"), "{}", refused.body);
    api.restart();
    common::http::wait_for(port, "/readyz", 90, |a| a.status == 200);
    condition_when(&api, "GPUHealthy", status_is("True"));
}

/// The requests to the Node itself (reads and patches, not its status), from `since` on.
fn node_requests(api: &FakeApi, since: Instant) -> Vec<fake_api::Recorded> {
    api.log()
        .into_iter()
        .filter(|r| r.at >= since && r.path.starts_with("/api/v1/nodes/test-node"))
        .filter(|r| !r.path.starts_with("/api/v1/nodes/test-node/status"))
        .collect()
}

#[test]
fn a_conflict_on_the_taint_patch_reads_the_node_again_and_retries_at_once() {
    let node = Node::new("pcie-4gpu");
    let api = busy_node();
    let gpud = node_status(&node, &api, &["--taint-unhealthy", "NoSchedule"]);
    condition_when(&api, "GPUHealthy", status_is("True"));
    let rule =
        api.refuse(Rule::exact("PATCH", "/api/v1/nodes/test-node", Fault::Conflict).times(1));
    let since = Instant::now();
    node.inject("lost 2");
    wait_for(20, "gpud's taint", || {
        (taint_keys(&api).len() == 2).then_some(())
    });
    assert_eq!(api.refused_by(rule), 1);
    // The refused patch, then at once a fresh read and the patch again, from that read. The
    // fake records a status once its answer is written, which may be just after the taint is
    // seen: wait for the three answers.
    let (seen, at) = wait_for(10, "the answers after the refusal", || {
        let seen: Vec<(String, u16)> = node_requests(&api, since)
            .iter()
            .map(|r| (r.method.clone(), r.status))
            .collect();
        let at = seen.iter().position(|r| *r == ("PATCH".to_owned(), 409))?;
        let answered = seen.len() >= at + 3 && seen[at..at + 3].iter().all(|r| r.1 != 0);
        answered.then_some((seen, at))
    });
    assert_eq!(
        seen[at..at + 3],
        [
            ("PATCH".to_owned(), 409),
            ("GET".to_owned(), 200),
            ("PATCH".to_owned(), 200)
        ],
        "{seen:?}"
    );
    let requests = node_requests(&api, since);
    let converged = requests[at + 2].at.duration_since(requests[at].at);
    eprintln!("409 on the taint patch: converged {converged:?} after the refusal");
    // No backoff pause: the retry was immediate (the backoff starts at 0.5 s).
    assert!(converged < Duration::from_millis(450), "{converged:?}");
    assert_eq!(
        taint_keys(&api),
        [
            ("example.com/maintenance".to_owned(), "NoExecute".to_owned()),
            ("gpud.io/gpu-unhealthy".to_owned(), "NoSchedule".to_owned()),
        ]
    );
    others_survived(&api);
    let log = gpud.stderr();
    assert!(
        log.contains("The Node changed while gpud wrote its taints; reading it again"),
        "{log}"
    );
    assert!(log.contains("the object has been modified"), "{log}");
}

#[test]
fn too_many_requests_waits_as_long_as_retry_after_says() {
    retry_after_is_honoured(Fault::TooManyRequests(2));
}

#[test]
fn a_plain_text_429_as_priority_and_fairness_sends_is_honoured_too() {
    retry_after_is_honoured(Fault::TooManyRequestsPlain(2));
}

#[test]
fn a_429_whose_status_body_has_no_retry_after_seconds_waits_for_the_header() {
    retry_after_is_honoured(Fault::RetryAfterHeaderOnly(429, 2));
}

#[test]
fn a_503_whose_status_body_has_no_retry_after_seconds_waits_for_the_header() {
    retry_after_is_honoured(Fault::RetryAfterHeaderOnly(503, 2));
}

/// Two refusals answered with `fault` (Retry-After: 2) on the taint patch: nothing reaches the
/// Node before each Retry-After elapses, nor long after (the wait is the server's, lengthened
/// by gpud's spread of up to as long again), and the taint lands.
fn retry_after_is_honoured(fault: Fault) {
    let (code, said) = match fault {
        Fault::RetryAfterHeaderOnly(code, _) => (code, "please try again later"),
        _ => (429, "Too many requests, please try again later"),
    };
    let node = Node::new("pcie-4gpu");
    let api = busy_node();
    let gpud = node_status(&node, &api, &["--taint-unhealthy", "NoSchedule"]);
    condition_when(&api, "GPUHealthy", status_is("True"));
    // Twice, so the second refusal shows the pause is the server's, not the backoff's (capped
    // at 1 s here).
    let rule = api.refuse(Rule::exact("PATCH", "/api/v1/nodes/test-node", fault.clone()).times(2));
    let since = Instant::now();
    node.inject("lost 2");
    wait_for(30, "gpud's taint", || {
        (taint_keys(&api).len() == 2).then_some(())
    });
    assert_eq!(api.refused_by(rule), 2);
    let requests = node_requests(&api, since);
    let refused: Vec<usize> = requests
        .iter()
        .enumerate()
        .filter(|(_, r)| r.status == code)
        .map(|(i, _)| i)
        .collect();
    assert_eq!(refused.len(), 2);
    // Nothing reached the Node before Retry-After elapsed.
    for &i in &refused {
        let next = &requests[i + 1];
        let gap = next.at.duration_since(requests[i].at);
        eprintln!("{fault:?}: next request {gap:?} later");
        assert!(gap >= Duration::from_millis(1950), "{gap:?}: {requests:?}");
        assert!(gap < Duration::from_secs(8), "{gap:?}: {requests:?}");
    }
    let during = requests.len();
    let converged = requests
        .last()
        .unwrap()
        .at
        .duration_since(requests[refused[0]].at);
    eprintln!("{fault:?} twice: {during} Node requests, converged {converged:?} after the first");
    assert!(during <= 6, "{requests:?}");
    assert_eq!(
        taint_keys(&api),
        [
            ("example.com/maintenance".to_owned(), "NoExecute".to_owned()),
            ("gpud.io/gpu-unhealthy".to_owned(), "NoSchedule".to_owned()),
        ]
    );
    others_survived(&api);
    let log = gpud.stderr();
    assert!(log.contains(said), "{log}");
}

#[test]
fn a_429_whose_retry_after_is_an_http_date_is_honoured_too() {
    // As a proxy may send it: `Retry-After: <date 3 s from now>`. The date has whole seconds,
    // so at least 2 s are left when gpud reads it.
    retry_after_is_honoured(Fault::TooManyRequestsDate(3));
}

const STATUS_PATH: &str = "/api/v1/nodes/test-node/status";

/// The applies to the Node's status whose answer is recorded, with their status.
fn answered_applies(api: &FakeApi) -> Vec<fake_api::Recorded> {
    api.requests_to("PATCH", STATUS_PATH)
        .into_iter()
        .filter(|r| r.status != 0)
        .collect()
}

#[test]
fn conditions_refused_as_invalid_are_logged_backed_off_and_written_once_allowed() {
    let node = Node::new("pcie-4gpu");
    let api = FakeApi::start_with_node(json!({}));
    api.refuse(Rule::exact("PATCH", STATUS_PATH, Fault::Invalid));
    let gpud = node_status(&node, &api, &[]);
    // Four refused applies, their answers recorded: the pauses between them are the backoff's
    // (0.5 s, then the 1 s ceiling of these tests, each up to a quarter longer).
    let refused = wait_for(20, "four refused applies", || {
        let applies = answered_applies(&api);
        (applies.len() >= 4).then_some(applies)
    });
    assert!(refused.iter().all(|r| r.status == 422), "{refused:?}");
    let gaps: Vec<Duration> = refused.windows(2).map(|w| w[1].at - w[0].at).collect();
    eprintln!("422 on every apply: gaps {gaps:?}");
    assert!(gaps[0] >= Duration::from_millis(450), "{gaps:?}");
    assert!(
        gaps[1..].iter().all(|g| *g >= Duration::from_millis(950)),
        "{gaps:?}"
    );
    // No storm: from the first refusal to the fourth, the four applies and the three reads of
    // the Node that come before an attempt, nothing else.
    let log = api.log();
    let window: Vec<(&str, u16)> = log
        .iter()
        .filter(|r| r.at >= refused[0].at && r.at <= refused[3].at)
        .map(|r| (r.method.as_str(), r.status))
        .collect();
    let attempt = [("GET", 200), ("PATCH", 422)];
    assert_eq!(window[0], attempt[1], "{window:?}");
    assert_eq!(window[1..], attempt.repeat(3), "{window:?}");
    let log = gpud.stderr();
    assert!(
        log.contains("Node status not written; retrying with the state of that moment"),
        "{log}"
    );
    assert!(
        log.contains(
            "applying conditions to node test-node: 422 Invalid: nodes \"test-node\" is \
             invalid: metadata: Invalid value: \"test-node\": refused by a fault rule (refused \
             as invalid: an admission policy or webhook, or an API server older than gpud \
             expects, rejects what gpud writes; gpud retries with backoff, check the policies \
             that apply to this object)"
        ),
        "{log}"
    );
    api.allow_all();
    condition_when(&api, "GPUHealthy", status_is("True"));
    // The apply after the last refusal is the one that landed.
    let applies = wait_for(10, "the answered apply", || {
        let applies = answered_applies(&api);
        applies
            .last()
            .is_some_and(|r| r.status == 200)
            .then_some(applies)
    });
    let statuses: Vec<u16> = applies.iter().map(|r| r.status).collect();
    let refusals = api
        .requests_to("PATCH", STATUS_PATH)
        .iter()
        .filter(|r| r.refused)
        .count();
    assert_eq!(statuses[..refusals], vec![422; refusals], "{statuses:?}");
    assert_eq!(statuses[refusals..], [200], "{statuses:?}");
}

#[test]
fn an_endless_answer_is_cut_off_at_the_limit_memory_stays_bounded_and_status_lands_after() {
    let node = Node::new("pcie-4gpu");
    let api = FakeApi::start_with_node(json!({}));
    let rule = api.refuse(Rule::exact("PATCH", STATUS_PATH, Fault::Endless));
    let gpud = node_status(&node, &api, &[]);
    // Two endless answers, each read up to gpud's limit and given up, the second after a
    // pause: the log says why.
    wait_for(30, "two endless answers", || {
        (answered_applies(&api).len() >= 2).then_some(())
    });
    let line = "applying conditions to node test-node: the answer passed gpud's limit of 32 MiB \
                and was cut off (an API server or a proxy in front of it sending an endless \
                body?)";
    wait_for(20, "the log line", || {
        gpud.stderr().contains(line).then_some(())
    });
    let log = gpud.stderr();
    assert!(
        log.contains("Node status not written; retrying with the state of that moment"),
        "{log}"
    );
    // 32 MiB of body at most is held per answer: the peak stays far below what reading an
    // endless body would reach.
    let peak = gpud.peak_rss_kib();
    eprintln!(
        "endless body: {} answers, peak RSS {peak} KiB",
        api.refused_by(rule)
    );
    assert!(peak < 200 * 1024, "peak RSS {peak} KiB");
    api.allow_all();
    let condition = condition_when(&api, "GPUHealthy", status_is("True"));
    assert_eq!(
        condition["message"],
        "4 GPUs: 4 healthy, 0 degraded, 0 unhealthy"
    );
}

#[test]
fn an_event_the_api_server_already_has_counts_as_created() {
    let node = Node::new("pcie-4gpu");
    let api = FakeApi::start_with_node(json!({}));
    let events_path = "/api/v1/namespaces/default/events";
    let rule = api.refuse(Rule::exact("POST", events_path, Fault::AlreadyExists).times(1));
    let gpud = node_status(&node, &api, &[]);
    condition_when(&api, "GPUHealthy", status_is("True"));
    inject_until(&node, "lost 2", || {
        (api.refused_by(rule) == 1).then_some(())
    });
    condition_when(&api, "GPUHealthy", status_is("False"));
    node.inject("recover 2");
    condition_when(&api, "GPUHealthy", status_is("True"));
    wait_for(20, "the recovery event", || {
        events(&api)
            .iter()
            .any(|(reason, _)| reason == "GPURecovered")
            .then_some(())
    });
    // The refused event was not sent again: one POST per event, the refused one included.
    let posts = api.requests_to("POST", events_path);
    assert_eq!(posts.len(), api.events().len() + 1, "{posts:?}");
    assert_eq!(posts.iter().filter(|r| r.status == 409).count(), 1);
    assert!(
        !events(&api)
            .iter()
            .any(|(reason, _)| reason == "GPUUnhealthy"),
        "{:?}",
        events(&api)
    );
    let log = gpud.stderr();
    assert!(!log.contains("Node status not written"), "{log}");
}

/// One raw HTTP/1.1 request to the fake API server: (status, body).
fn raw(api: &FakeApi, method: &str, path: &str, content_type: &str, body: &str) -> (u16, Value) {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", api.port)).unwrap();
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: fake\r\nConnection: close\r\n\
         Content-Type: {content_type}\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut text = String::new();
    stream.read_to_string(&mut text).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    let code = head.split(' ').nth(1).unwrap().parse().unwrap();
    (code, serde_json::from_str(body).unwrap())
}

#[test]
fn apply_without_a_field_manager_or_to_another_node_is_refused_as_the_api_server_does() {
    // The fake's own strictness, which the tests above rely on.
    let api = FakeApi::start_with_node(json!({}));
    let (code, status) = raw(
        &api,
        "PATCH",
        "/api/v1/nodes/test-node/status",
        "application/apply-patch+yaml",
        r#"{"apiVersion":"v1","kind":"Node","metadata":{"name":"test-node"}}"#,
    );
    assert_eq!(code, 422, "{status}");
    assert_eq!(
        (
            &status["kind"],
            &status["status"],
            &status["reason"],
            &status["code"]
        ),
        (
            &json!("Status"),
            &json!("Failure"),
            &json!("Invalid"),
            &json!(422)
        )
    );
    let (code, status) = raw(
        &api,
        "PATCH",
        "/api/v1/nodes/other-node",
        "application/merge-patch+json",
        r#"{"metadata":{"labels":{"a":"b"}}}"#,
    );
    assert_eq!((code, &status["reason"]), (404, &json!("NotFound")));
    let (code, status) = raw(
        &api,
        "PATCH",
        "/api/v1/nodes/test-node?fieldManager=x",
        "application/merge-patch+json",
        r#"{"metadata":{"resourceVersion":"0","labels":{"a":"b"}}}"#,
    );
    assert_eq!((code, &status["reason"]), (409, &json!("Conflict")));
    let log = api.log();
    assert_eq!(
        log.iter().map(|r| r.status).collect::<Vec<_>>(),
        [422, 404, 409]
    );
    assert_eq!(log[2].field_manager.as_deref(), Some("x"));
    assert_eq!(log[2].path, "/api/v1/nodes/test-node?fieldManager=x");
}

#[test]
fn a_connection_dropped_without_an_answer_is_retried_with_backoff() {
    let node = Node::new("pcie-4gpu");
    let api = FakeApi::start_with_node(json!({}));
    let status_path = "/api/v1/nodes/test-node/status";
    let rule = api.refuse(Rule::exact("PATCH", status_path, Fault::Drop).times(2));
    let gpud = node_status(&node, &api, &[]);
    let condition = condition_when(&api, "GPUHealthy", status_is("True"));
    assert_eq!(
        condition["message"],
        "4 GPUs: 4 healthy, 0 degraded, 0 unhealthy"
    );
    assert_eq!(api.refused_by(rule), 2);
    // The third apply's answer is recorded once written, maybe just after the condition shows.
    let applies = wait_for(10, "the third apply's answer", || {
        let applies = api.requests_to("PATCH", status_path);
        (applies.len() >= 3 && applies[2].status != 0).then_some(applies)
    });
    assert_eq!(
        applies.iter().map(|r| r.status).collect::<Vec<_>>(),
        [0, 0, 200],
        "{applies:?}"
    );
    // Each attempt after a pause: the backoff's (0.5 s, then 1 s, plus jitter), or shorter
    // where the process's reachability gate probes sooner (a random point of a 1 s, then 2 s
    // window) — but never sooner than a quarter second after the failure, the time a probe
    // is given for its answer.
    let gaps: Vec<Duration> = applies.windows(2).map(|w| w[1].at - w[0].at).collect();
    eprintln!("dropped connections: applies {gaps:?} apart");
    assert!(gaps[0] >= Duration::from_millis(240), "{gaps:?}");
    assert!(gaps[1] >= Duration::from_millis(240), "{gaps:?}");
    assert!(gaps[0] <= Duration::from_millis(1500), "{gaps:?}");
    assert!(gaps[1] <= Duration::from_millis(2500), "{gaps:?}");
    let log = gpud.stderr();
    assert!(log.contains("Node status not written"), "{log}");
    assert!(
        log.contains("applying conditions to node test-node"),
        "{log}"
    );
}

#[test]
fn a_gpu_held_failed_stays_failed_on_the_node_when_a_new_gpud_takes_over() {
    let node = Node::new("dgx-h100");
    let api = FakeApi::start_with_node(json!({}));
    let hold = ["--node-status-hold", "60s"];
    let old = node_status(&node, &api, &hold);
    condition_when(&api, "GPUHealthy", status_is("True"));
    inject_until(&node, "xid 3 79", || {
        api.condition("GPUHealthy").filter(status_is("False"))
    });
    // The GPU is reset and healthy again: the quiet hold keeps the condition failed.
    node.inject("lost 3");
    condition_when(&api, "GPUHealthy", |c| {
        c["message"].as_str().unwrap().contains("GPU is lost")
    });
    node.inject("recover 3");
    wait_for(10, "the old process to see the GPU back", || {
        events(&api)
            .iter()
            .any(|(reason, _)| reason == "GPURecovered")
            .then_some(())
    });
    let before = api.state.lock().unwrap().status_applies.len();

    let new = node_status(&node, &api, &hold);
    wait_for(20, "the takeover", || {
        new.stderr()
            .contains("Took over: the gpud taken over from has finished")
            .then_some(())
    });
    // The new process goes on from what the old one wrote: the Node already shows it, so the
    // takeover costs the API server a read, not a write.
    assert_eq!(
        api.state.lock().unwrap().status_applies.len(),
        before,
        "the Node was written again to say the same:\n{}",
        new.stderr()
    );
    // It still shows what the old one showed, not the truth of the moment, until the hold that
    // began in the old process is over; a new failure is written at once, by the new process.
    inject_until(&node, "xid 1 48", || {
        let state = api.state.lock().unwrap();
        (state.status_applies.len() > before).then_some(())
    });
    let applies = api.state.lock().unwrap().status_applies[before..].to_vec();
    let condition = applies[0].2["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "GPUHealthy")
        .unwrap()
        .clone();
    assert_eq!(condition["status"], "False", "{condition}");
    let message = condition["message"].as_str().unwrap();
    assert!(
        message.contains("GPU is lost") && message.contains("XID 48"),
        "{message}"
    );
    assert_eq!(api.condition("GPUHealthy").unwrap()["status"], "False");
    drop(old);
}

/// A node whose GPUs do not change costs the API server no write: every resync reads the
/// Node and, finding gpud's conditions as it wrote them, writes nothing. A condition someone
/// deleted is written again at the next resync.
#[test]
fn a_steady_node_is_read_at_each_resync_and_written_only_when_the_node_lost_something() {
    let node = Node::new("pcie-4gpu");
    let api = FakeApi::start(json!({}));
    let _gpud = node_status(&node, &api, &["--node-status-resync", "200ms"]);
    condition_when(&api, "GPUHealthy", status_is("True"));
    let applies = || api.state.lock().unwrap().status_applies.len();
    let written = applies();
    let since = Instant::now();
    // Five resyncs later: five reads of the Node, not one write.
    wait_for(20, "five resync reads", || {
        (node_requests(&api, since)
            .iter()
            .filter(|r| r.method == "GET")
            .count()
            >= 5)
            .then_some(())
    });
    assert_eq!(
        applies(),
        written,
        "a resync re-applied unchanged conditions"
    );
    assert!(
        node_requests(&api, since).iter().all(|r| r.method == "GET"),
        "{:?}",
        node_requests(&api, since)
    );

    // Someone deletes gpud's condition: the next resync puts it back.
    {
        let mut state = api.state.lock().unwrap();
        state.node["status"]["conditions"] = json!([]);
        state.node_touched();
    }
    condition_when(&api, "GPUHealthy", status_is("True"));
    assert_eq!(applies(), written + 1);
}

#[test]
fn a_resync_that_cannot_reach_the_api_server_waits_for_its_next_turn() {
    let node = Node::new("pcie-4gpu");
    let api = FakeApi::start(json!({}));
    let gpud = node_status(&node, &api, &["--node-status-resync", "6s"]);
    condition_when(&api, "GPUHealthy", status_is("True"));
    let applies = || api.state.lock().unwrap().status_applies.len();
    let written = applies();
    // From now on every read of the Node loses its connection: the resyncs (a read, nothing
    // to write) find the API server unreachable.
    let node_path = "/api/v1/nodes/test-node";
    let rule = api.refuse(Rule::exact("GET", node_path, Fault::Drop));
    let dropped = || -> Vec<fake_api::Recorded> {
        api.requests_to("GET", node_path)
            .into_iter()
            .filter(|r| r.status == 0)
            .collect()
    };
    let failed = wait_for(30, "two resyncs that lost their connection", || {
        let failed = dropped();
        (failed.len() >= 2).then_some(failed)
    });
    // The second is the next turn, a resync later (less at most a half in the process's first
    // period, so a fleet's resyncs spread): not a retry on the backoff (0.5 s and up) or right
    // after the process's next probe (within about a second), which after an outage would
    // bring every node whose resync fell in it back at once.
    let gap = failed[1].at - failed[0].at;
    eprintln!("unreachable resyncs {gap:?} apart");
    assert!(gap >= Duration::from_millis(2900), "{gap:?}");
    assert_eq!(api.refused_by(rule), failed.len() as u32);
    let log = gpud.stderr();
    assert!(
        log.contains("Cannot check the node status on the Node; checking again on the next turn"),
        "{log}"
    );
    assert!(!log.contains("Node status not written"), "{log}");

    // Back: the next turn reads the Node and, nothing being lost, writes nothing.
    api.allow_all();
    wait_for(20, "a resync answered", || {
        api.requests_to("GET", node_path)
            .iter()
            .any(|r| r.status == 200 && r.at > failed[1].at)
            .then_some(())
    });
    assert_eq!(applies(), written);
}

#[test]
fn a_change_after_the_first_write_is_one_apply_without_a_read_and_keeps_the_transition_time() {
    let node = Node::new("dgx-h100");
    let api = FakeApi::start_with_node(json!({}));
    let _gpud = node_status(&node, &api, &[]);
    condition_when(&api, "GPUHealthy", status_is("True"));
    let applies_since = |since: Instant| {
        api.state
            .lock()
            .unwrap()
            .status_applies
            .iter()
            .filter(|(at, _, _)| *at >= since)
            .count()
    };
    let since = Instant::now();
    let failed = inject_until(&node, "xid 3 79", || {
        api.condition("GPUHealthy").filter(status_is("False"))
    });
    node.inject("lost 3");
    let lost = condition_when(&api, "GPUHealthy", |c| {
        c["status"] == "False" && c["message"].as_str().unwrap().contains("GPU is lost")
    });
    // The same status with a new message keeps the time the status last changed.
    assert_eq!(lost["lastTransitionTime"], failed["lastTransitionTime"]);
    // Two changes, two applies, and no read of the Node: gpud knew what it had written, and
    // a fleet whose nodes all see one fault sends one request per node and change, not two.
    assert_eq!(applies_since(since), 2);
    let reads = || -> Vec<fake_api::Recorded> {
        node_requests(&api, since)
            .into_iter()
            .filter(|r| r.method == "GET")
            .collect()
    };
    assert!(reads().is_empty(), "{:?}", reads());

    // An apply that loses its connection is retried as an apply alone: gpud still knows
    // what it wrote before.
    let status_path = "/api/v1/nodes/test-node/status";
    let rule = api.refuse(Rule::exact("PATCH", status_path, Fault::Drop).times(1));
    node.inject("recover 3");
    let back = condition_when(&api, "GPUHealthy", status_is("True"));
    assert_eq!(api.refused_by(rule), 1);
    assert_eq!(back["message"], HEALTHY);
    assert!(reads().is_empty(), "{:?}", reads());
    // Answered: the two before and the retry (the dropped one is not recorded).
    assert_eq!(applies_since(since), 3);
}
