//! `gpud mig reconcile` against a fake API server on the simulated driver: the Node's
//! `nvidia.com/mig.config` label is applied and `nvidia.com/mig.config.state` goes
//! pending → success; an NVML failure ends in `failed` with the reason on the Node and is
//! retried without a label change; a reconciler killed in `pending` resumes on restart.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
#[path = "common/fake_api.rs"]
mod fake_api;
#[path = "common/fake_kubelet.rs"]
mod fake_kubelet;

use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use common::Node;
use fake_api::{FakeApi, Fault, Rule};
use serde_json::json;

const CONFIG_LABEL: &str = "nvidia.com/mig.config";
const STATE_LABEL: &str = "nvidia.com/mig.config.state";
const REASON: &str = "gpud.io/mig.config.reason";

fn default_config() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("packaging/mig/config-default.yaml")
}

/// A running reconciler, killed on drop.
struct Reconciler(Child);

impl Drop for Reconciler {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start(node: &Node, api: &FakeApi) -> Reconciler {
    start_with(node, api, &[])
}

/// [`start`] with more environment (the simulated driver's switches, the reboot command).
fn start_with(node: &Node, api: &FakeApi, env: &[(&str, &str)]) -> Reconciler {
    let kubeconfig = api.kubeconfig(node.dir.path());
    let state_dir = node.dir.path().join("mig-state");
    let mut cmd = node.gpud(&[
        "mig",
        "reconcile",
        "--mig-config-file",
        default_config().to_str().unwrap(),
        "--node-name",
        "test-node",
        "--kubeconfig",
        kubeconfig.to_str().unwrap(),
        "--mig-state-dir",
        state_dir.to_str().unwrap(),
        "--mig-retry-interval",
        "200ms",
        "--health-address",
        "",
    ]);
    cmd.envs(env.iter().copied());
    let child = cmd
        .stdout(Stdio::null())
        .stderr(log_file(node))
        .spawn()
        .unwrap();
    Reconciler(child)
}

/// The reconciler's stderr, kept in the node's folder.
fn log_file(node: &Node) -> std::fs::File {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(node.dir.path().join("gpud.log"))
        .unwrap()
}

fn log(node: &Node) -> String {
    std::fs::read_to_string(node.dir.path().join("gpud.log")).unwrap_or_default()
}

fn wait_until(secs: u64, what: &str, done: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Whether the reconciler opened a watch from `version` (or later) after `since`: it had
/// taken in the Node at that version, from a watch event or a read, and acted on it.
fn watched_from(api: &FakeApi, since: Instant, version: u64) -> bool {
    api.log().iter().any(|r| {
        r.at >= since
            && r.method == "GET"
            && r.path.starts_with("/api/v1/nodes?")
            && r.path.contains("watch=true")
            && r.path
                .split('&')
                .find_map(|p| p.strip_prefix("resourceVersion="))
                .and_then(|v| v.parse::<u64>().ok())
                .is_some_and(|v| v >= version)
    })
}

/// The state values written to the Node, in order.
fn states(api: &FakeApi) -> Vec<String> {
    api.state
        .lock()
        .unwrap()
        .patches
        .iter()
        .filter_map(|(_, p)| {
            p["metadata"]["labels"][STATE_LABEL]
                .as_str()
                .map(str::to_owned)
        })
        .collect()
}

fn state(api: &FakeApi) -> Option<String> {
    api.node_labels().get(STATE_LABEL).cloned()
}

fn asserts(node: &Node, label: &str) -> bool {
    let cfg = default_config();
    node.run(&["mig", "assert", "-f", cfg.to_str().unwrap(), "-c", label])
        .status
        .success()
}

#[test]
fn label_goes_pending_then_success_and_follows_changes() {
    let node = Node::new("a100-mig");
    let api = FakeApi::start(json!({CONFIG_LABEL: "all-1g.10gb"}));
    let started = Instant::now();
    let mut reconciler = start(&node, &api);
    wait_until(60, "success", || state(&api).as_deref() == Some("success"));
    assert_eq!(states(&api), ["pending", "success"]);
    assert!(asserts(&node, "all-1g.10gb"));
    assert_eq!(api.node_annotations().get(REASON), None);

    api.set_label(CONFIG_LABEL, Some("all-3g.40gb"));
    wait_until(60, "the second success", || states(&api).len() == 4);
    assert_eq!(states(&api), ["pending", "success", "pending", "success"]);
    assert!(asserts(&node, "all-3g.40gb"));

    // A change to the Node that leaves its MIG config label as it was (another label, as the
    // labeller or the node status write) keeps the watch open: no new watch from that
    // change's version, no read, nothing written. The next change of the label comes on the
    // same watch.
    let version = api.state.lock().unwrap().node_version;
    wait_until(20, "a watch from the applied Node's version", || {
        watched_from(&api, started, version)
    });
    let reads = api.requests_to("GET", "/api/v1/nodes/test-node").len();
    let sent = api.state.lock().unwrap().node_events_sent;
    api.set_label("example.com/other", Some("x"));
    let unrelated = api.state.lock().unwrap().node_version;
    wait_until(20, "the change on the open watch", || {
        api.state.lock().unwrap().node_events_sent > sent
    });
    api.set_label(CONFIG_LABEL, Some("all-1g.10gb"));
    wait_until(60, "the third success", || states(&api).len() == 6);
    assert_eq!(
        states(&api),
        [
            "pending", "success", "pending", "success", "pending", "success"
        ]
    );
    let from_unrelated = api
        .requests_to("GET", "/api/v1/nodes?")
        .iter()
        .filter(|r| {
            r.path.contains(&format!("resourceVersion={unrelated}&"))
                || r.path.ends_with(&format!("resourceVersion={unrelated}"))
        })
        .count();
    assert_eq!(
        from_unrelated, 0,
        "a new watch after a change that did not matter"
    );
    // The read after the third apply (it starts from the Node as it is) is the only one.
    assert!(api.requests_to("GET", "/api/v1/nodes/test-node").len() <= reads + 1);

    common::send_signal(&reconciler.0, "TERM");
    assert_eq!(reconciler.0.wait().unwrap().code(), Some(0));
}

#[test]
fn an_nvml_failure_is_reported_and_retried_until_it_succeeds() {
    let node = Node::new("a100-mig");
    node.inject("mig-fail 0 create-gi");
    let api = FakeApi::start(json!({CONFIG_LABEL: "all-1g.10gb"}));
    let _reconciler = start(&node, &api);
    wait_until(60, "failed", || state(&api).as_deref() == Some("failed"));
    let reason = api.node_annotations()[REASON].clone();
    // The same reason is recorded on disk for gpud doctor.
    let path = node.dir.path().join("mig-state/last-state.json");
    let record = || -> serde_json::Value {
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        serde_json::from_str(&text).unwrap_or_default()
    };
    wait_until(10, "the recorded failure", || record()["state"] == "failed");
    assert_eq!(
        record(),
        json!({"config": "all-1g.10gb", "state": "failed", "reason": reason})
    );
    assert!(
        reason.starts_with("GPU 0: creating GPU instance 1g.10gb at slice ")
            && reason.ends_with(" failed: an internal driver error occurred"),
        "{reason}"
    );
    // Retried with backoff, with no label change: failed again while the fault stays.
    wait_until(60, "a retry", || {
        states(&api).iter().filter(|s| *s == "failed").count() >= 2
    });
    node.inject("mig-ok 0 create-gi");
    wait_until(60, "success", || state(&api).as_deref() == Some("success"));
    assert_eq!(api.node_annotations().get(REASON), None);
    assert!(asserts(&node, "all-1g.10gb"));
    let written = states(&api);
    assert_eq!(written[..2], ["pending", "failed"]);
    assert_eq!(written.last().unwrap(), "success");
}

#[test]
fn a_reconciler_killed_in_pending_resumes_on_restart() {
    let node = Node::new("a100-mig");
    // The simulated driver SIGKILLs the caller at its first GPU instance creation.
    node.inject("mig-fail 0 create-gi kill");
    let api = FakeApi::start(json!({CONFIG_LABEL: "all-1g.10gb"}));
    let mut first = start(&node, &api);
    let status = first.0.wait().unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(status.signal(), Some(9));
    assert_eq!(state(&api).as_deref(), Some("pending"));
    assert!(!asserts(&node, "all-1g.10gb"));

    node.inject("mig-ok 0 create-gi");
    let _second = start(&node, &api);
    wait_until(60, "success", || state(&api).as_deref() == Some("success"));
    assert!(asserts(&node, "all-1g.10gb"));
    assert_eq!(states(&api), ["pending", "pending", "success"]);
}

/// NVML calls that change the MIG layout; hung in the simulated driver, they hold the apply
/// just before its first change.
const MIG_CHANGES: [&str; 4] = [
    "nvmlComputeInstanceDestroy",
    "nvmlGpuInstanceDestroy",
    "nvmlDeviceCreateGpuInstanceWithPlacement",
    "nvmlGpuInstanceCreateComputeInstance",
];

/// In `gpud run` the reconciler's apply reaches the kubelet with no restart and no periodic
/// rescan (it is an hour here): the GPU is withdrawn (its MIG devices reported unhealthy)
/// before the first NVML change, then the new MIG devices are advertised and the old ones
/// withdrawn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_gpud_run_the_kubelet_sees_the_new_mig_devices_at_once() {
    let node = Node::new("a100-mig");
    let api = FakeApi::start(json!({}));
    let mut kubelet = fake_kubelet::FakeKubelet::start(node.dir.path()).await;
    let kubeconfig = api.kubeconfig(node.dir.path());
    let features = node.dir.path().join("features.d-gfd");
    let state_dir = node.dir.path().join("mig-state");
    let socket = kubelet.socket();
    let port = common::http::free_port();
    let address = format!("127.0.0.1:{port}");
    let child = node
        .gpud(&[
            "run",
            "--mig-strategy",
            "mixed",
            "--output-file",
            features.to_str().unwrap(),
            "--kubelet-socket",
            socket.to_str().unwrap(),
            "--kmsg",
            "",
            "-a",
            &address,
            "-c",
            "100",
            "--rescan-interval",
            "1h",
            "--node-name",
            "test-node",
            "--kubeconfig",
            kubeconfig.to_str().unwrap(),
            "--mig-config-file",
            default_config().to_str().unwrap(),
            "--mig-state-dir",
            state_dir.to_str().unwrap(),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let _daemon = Reconciler(child);
    let mut endpoints = std::collections::BTreeMap::new();
    while endpoints.len() < 3 {
        let reg = kubelet.next_registration(10).await;
        endpoints.insert(reg.resource_name, reg.endpoint);
    }
    let mut one = kubelet.plugin(&endpoints["nvidia.com/mig-1g.10gb"]).await;
    let mut one = fake_kubelet::list_and_watch(&mut one).await;
    assert_eq!(fake_kubelet::next_list(&mut one, 5).await.devices.len(), 1);
    let mut three = kubelet.plugin(&endpoints["nvidia.com/mig-3g.40gb"]).await;
    let mut three = fake_kubelet::list_and_watch(&mut three).await;
    assert_eq!(
        fake_kubelet::next_list(&mut three, 5).await.devices.len(),
        1
    );

    for function in MIG_CHANGES {
        node.inject(&format!("hang {function}"));
    }
    api.set_label(CONFIG_LABEL, Some("all-1g.10gb"));
    // The apply is held before its first change, and the kubelet already sees the GPU gone.
    let withdrawn = fake_kubelet::next_list(&mut one, 20).await;
    let health: Vec<&str> = withdrawn
        .devices
        .iter()
        .map(|d| d.health.as_str())
        .collect();
    assert_eq!(health, ["Unhealthy"]);
    let withdrawn = fake_kubelet::next_list(&mut three, 5).await;
    let health: Vec<&str> = withdrawn
        .devices
        .iter()
        .map(|d| d.health.as_str())
        .collect();
    assert_eq!(health, ["Unhealthy"]);
    assert_eq!(state(&api).as_deref(), Some("pending"));
    assert!(!asserts(&node, "all-1g.10gb"));
    for function in MIG_CHANGES {
        node.inject(&format!("unhang {function}"));
    }
    let list = fake_kubelet::next_list(&mut one, 20).await;
    assert_eq!(list.devices.len(), 7);
    assert!(list.devices.iter().all(|d| d.health == "Healthy"));
    // A resource no longer offered is withdrawn: its plugin stops and the stream ends.
    let withdrawn = tokio::time::timeout(Duration::from_secs(5), three.message())
        .await
        .expect("the 3g.40gb stream stays open");
    assert!(matches!(withdrawn, Ok(None)), "{withdrawn:?}");
    wait_until(10, "success", || state(&api).as_deref() == Some("success"));

    // The exporter of the same process counts the apply and shows the state.
    let body = tokio::task::block_in_place(|| {
        common::http::wait_for(port, "/metrics", 10, |a| {
            a.body
                .contains("gpud_mig_config_state{state=\"success\"} 1")
        })
        .body
    });
    let mig: Vec<&str> = body
        .lines()
        .filter(|l| l.starts_with("gpud_mig_") && !l.contains("_bucket{") && !l.contains("_sum "))
        .collect();
    assert_eq!(
        mig,
        [
            "gpud_mig_apply_total{result=\"success\"} 1",
            "gpud_mig_apply_total{result=\"failed\"} 0",
            "gpud_mig_apply_duration_seconds_count 1",
            "gpud_mig_config_state{state=\"pending\"} 0",
            "gpud_mig_config_state{state=\"success\"} 1",
            "gpud_mig_config_state{state=\"failed\"} 0",
            "gpud_mig_config_state{state=\"rebooting\"} 0",
        ]
    );
    assert!(body.contains("gpud_mig_apply_duration_seconds_bucket{le=\"+Inf\"} 1\n"));
}

/// `--check-config` loads the reconciler's config file (the manifests test relies on it), in
/// `gpud mig reconcile` and in `gpud run`.
#[test]
fn check_config_loads_the_mig_config_file() {
    let node = Node::new("a100-mig");
    let bad = node.dir.path().join("bad-mig.yaml");
    std::fs::write(&bad, "version: v2\n").unwrap();
    for applet in [&["mig", "reconcile"][..], &["run", "--kmsg", ""][..]] {
        let mut args = applet.to_vec();
        args.push("--check-config");
        let good = node
            .gpud(&args)
            .env("NODE_NAME", "test-node")
            .env("GPUD_MIG_CONFIG_FILE", default_config())
            .output()
            .unwrap();
        assert_eq!(good.status.code(), Some(0), "{applet:?}");
        let out = node
            .gpud(&args)
            .env("NODE_NAME", "test-node")
            .env("GPUD_MIG_CONFIG_FILE", &bad)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(65), "{applet:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(bad.to_str().unwrap()), "{stderr}");
    }
}

#[test]
fn the_reconciler_and_the_node_status_have_default_admin_ports_of_their_own() {
    // Side by side in one pod each takes its default port: no two applets share one. The
    // ports are compared, not bound, so the test never collides with a port in use.
    let ports = gpud::applets::ADMIN_PORTS;
    let port = |applet: &str| ports.iter().find(|(name, _)| *name == applet).unwrap().1;
    assert_ne!(port("mig reconcile"), port("node-status"));
    let mut seen: Vec<u16> = ports.iter().map(|(_, port)| *port).collect();
    seen.sort_unstable();
    seen.dedup();
    assert_eq!(seen.len(), ports.len(), "{ports:?}");
}

#[test]
fn the_reconciler_and_the_node_status_run_side_by_side_on_free_ports() {
    let node = Node::new("a100-mig");
    let api = FakeApi::start(json!({}));
    let kubeconfig = api.kubeconfig(node.dir.path());
    let kubeconfig = kubeconfig.to_str().unwrap();
    let state_dir = node.dir.path().join("mig-state");
    let spawn = |args: &[&str]| {
        Reconciler(
            node.gpud(args)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap(),
        )
    };
    let (reconciler_port, status_port) = (common::http::free_port(), common::http::free_port());
    let (reconciler_address, status_address) = (
        format!("127.0.0.1:{reconciler_port}"),
        format!("127.0.0.1:{status_port}"),
    );
    let mut reconciler = spawn(&[
        "mig",
        "reconcile",
        "--mig-config-file",
        default_config().to_str().unwrap(),
        "--kubeconfig",
        kubeconfig,
        "--mig-state-dir",
        state_dir.to_str().unwrap(),
        "--health-address",
        &reconciler_address,
    ]);
    let mut status = spawn(&[
        "node-status",
        "--kubeconfig",
        kubeconfig,
        "--kmsg",
        "",
        "--health-address",
        &status_address,
    ]);
    for (applet, child, port) in [
        ("mig reconcile", &mut reconciler, reconciler_port),
        ("node-status", &mut status, status_port),
    ] {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !common::http::get(port, "/healthz").is_ok_and(|a| a.status == 200) {
            assert!(
                child.0.try_wait().unwrap().is_none(),
                "{applet} exited: its admin port {port} was taken"
            );
            assert!(Instant::now() < deadline, "{applet}: no /healthz on {port}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    assert!(reconciler.0.try_wait().unwrap().is_none());
    assert!(status.0.try_wait().unwrap().is_none());
}

/// The conflict message's owners, as a start refused for them says.
const BOTH_OWNERS: &str = "the MIG manager (gpud mig reconcile, --mig-config-file) and DRA dynamic MIG (--dra-dynamic-mig)";

fn gpu0_uuid(node: &Node) -> String {
    let out = common::stdout_ok(&node.run(&["inventory"]));
    let inventory: serde_json::Value = serde_json::from_str(&out).unwrap();
    inventory["gpus"][0]["uuid"].as_str().unwrap().to_owned()
}

#[test]
fn gpud_run_with_a_mig_config_and_dynamic_mig_for_the_same_gpu_is_a_usage_error() {
    let node = Node::new("a100-mig");
    let out = node.run(&[
        "run",
        "--node-name",
        "test-node",
        "--dra",
        "--dra-dynamic-mig",
        "--mig-config-file",
        default_config().to_str().unwrap(),
        "--disable",
        "device-plugin,labeller,exporter",
        "--kmsg",
        "",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{stderr}");
    let gpu = format!(
        "GPU 0 ({}): its MIG layout would have two owners, ",
        gpu0_uuid(&node)
    );
    assert!(stderr.contains(&gpu), "{stderr}");
    assert!(stderr.contains(BOTH_OWNERS), "{stderr}");
    assert!(
        stderr.contains("both asked for in this gpud's flags"),
        "{stderr}"
    );
    // Nothing was taken.
    assert!(
        !node
            .dir
            .path()
            .join("state/mig-layout-owners.json")
            .exists()
    );
}

#[test]
fn dynamic_mig_started_beside_a_running_mig_manager_is_a_usage_error_naming_the_gpu() {
    let node = Node::new("a100-mig");
    let api = FakeApi::start(json!({CONFIG_LABEL: "all-1g.10gb"}));
    let _reconciler = start(&node, &api);
    wait_until(60, "success", || state(&api).as_deref() == Some("success"));
    let out = node.run(&[
        "dra",
        "--dra-dynamic-mig",
        "--node-name",
        "test-node",
        "--kmsg",
        "",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{stderr}");
    let gpu = format!(
        "GPU 0 ({}): its MIG layout would have two owners, ",
        gpu0_uuid(&node)
    );
    assert!(stderr.contains(&gpu), "{stderr}");
    assert!(
        stderr.contains("DRA dynamic MIG (--dra-dynamic-mig) and the MIG manager"),
        "{stderr}"
    );
    assert!(stderr.contains("mig-layout-owners.json"), "{stderr}");
    // The record keeps the MIG manager's GPUs, with the layout it brought them to.
    let owners: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(node.dir.path().join("state/mig-layout-owners.json")).unwrap(),
    )
    .unwrap();
    let gpu0 = &owners["gpus"][gpu0_uuid(&node)];
    assert_eq!(gpu0["owner"], "mig-manager");
    assert_eq!(gpu0["layout"].as_array().unwrap().len(), 7);
}

#[test]
fn a_node_watch_ended_by_410_gone_reads_again_with_backoff_and_converges() {
    let node = Node::new("a100-mig");
    let api = FakeApi::start(json!({CONFIG_LABEL: "all-1g.10gb"}));
    // The first watch is refused with an HTTP 410, every later one ends at once with the
    // ERROR event of an expired resourceVersion.
    let gone = api.refuse(
        Rule::exact("GET", "/api/v1/nodes", Fault::Gone)
            .query("watch=true")
            .nth(1),
    );
    let rule =
        api.refuse(Rule::exact("GET", "/api/v1/nodes", Fault::GoneEvent).query("watch=true"));
    let _reconciler = start(&node, &api);
    wait_until(60, "success", || state(&api).as_deref() == Some("success"));
    wait_until(20, "a watch refused", || api.refused_by(rule) >= 1);
    // Four watches after the first refusal: the pauses between them are the backoff's (0.5,
    // 1, 2 s, and up to a quarter more), so they span at least 3.5 s, with at most one read
    // of the Node after each.
    wait_until(30, "four watches", || {
        api.requests_to("GET", "/api/v1/nodes?").len() >= 4
    });
    let watches = api.requests_to("GET", "/api/v1/nodes?");
    let (first, fourth) = (watches[0].at, watches[3].at);
    let reads = api
        .requests_to("GET", "/api/v1/nodes/test-node")
        .iter()
        .filter(|r| r.at >= first && r.at <= fourth)
        .count();
    eprintln!(
        "410 on every watch: 4 watches in {:?}, {reads} reads",
        fourth - first
    );
    assert!(
        fourth - first >= Duration::from_millis(3500),
        "{:?}",
        fourth - first
    );
    assert!(reads <= 4 + 1, "{reads} reads for 4 watches");
    assert_eq!(api.refused_by(gone), 1);
    let text = log(&node);
    assert!(text.contains("Watching the Node failed"), "{text}");
    assert!(text.contains("too old resource version"), "{text}");

    // The API server answers watches again: a new config is seen and applied.
    api.allow_all();
    let changed = Instant::now();
    api.set_label(CONFIG_LABEL, Some("all-3g.40gb"));
    wait_until(60, "the second success", || states(&api).len() == 4);
    eprintln!(
        "410: converged {:?} after watches were allowed",
        changed.elapsed()
    );
    assert_eq!(states(&api), ["pending", "success", "pending", "success"]);
    assert!(asserts(&node, "all-3g.40gb"));
}

#[test]
fn a_node_watch_dropped_for_another_reason_resumes_from_its_version_without_a_read() {
    let node = Node::new("a100-mig");
    let api = FakeApi::start(json!({CONFIG_LABEL: "all-1g.10gb"}));
    let _reconciler = start(&node, &api);
    wait_until(60, "success", || state(&api).as_deref() == Some("success"));
    wait_until(20, "a watch", || {
        !api.requests_to("GET", "/api/v1/nodes?").is_empty()
    });
    let reads = api.requests_to("GET", "/api/v1/nodes/test-node").len();
    let watches = api.requests_to("GET", "/api/v1/nodes?").len();
    // The next two watches lose their connection, as when the API server goes away.
    let rule = api.refuse(
        Rule::exact("GET", "/api/v1/nodes", Fault::Drop)
            .query("watch=true")
            .times(2),
    );
    api.end_node_watches();
    wait_until(30, "a watch after the two dropped", || {
        api.refused_by(rule) == 2 && api.requests_to("GET", "/api/v1/nodes?").len() >= watches + 3
    });
    // Each watch after a dropped one starts from the version the dropped one had: no read of
    // the Node in between, which after an outage every node of a fleet would send at once.
    let after: Vec<String> = api.requests_to("GET", "/api/v1/nodes?")[watches..]
        .iter()
        .map(|r| r.path.clone())
        .collect();
    let version = |path: &str| {
        path.split('&')
            .find_map(|p| p.strip_prefix("resourceVersion="))
            .map(str::to_owned)
    };
    assert_eq!(version(&after[1]), version(&after[0]), "{after:?}");
    assert_eq!(version(&after[2]), version(&after[0]), "{after:?}");
    assert_eq!(
        api.requests_to("GET", "/api/v1/nodes/test-node").len(),
        reads,
        "{after:?}"
    );
    assert!(log(&node).contains("Watching the Node failed; watching again from where it was"));

    // The change made while the watches failed is seen, and a new config applied.
    api.set_label(CONFIG_LABEL, Some("all-3g.40gb"));
    wait_until(60, "the second success", || states(&api).len() == 4);
    assert_eq!(states(&api), ["pending", "success", "pending", "success"]);
}

#[test]
fn a_stalled_read_is_reported_after_the_call_limit_and_the_reconciler_converges() {
    let node = Node::new("a100-mig");
    let api = FakeApi::start(json!({CONFIG_LABEL: "all-1g.10gb"}));
    // The first read of the Node gets no answer for longer than a call may take.
    api.refuse(
        Rule::exact(
            "GET",
            "/api/v1/nodes/test-node",
            Fault::Stall(Duration::from_secs(15)),
        )
        .times(1),
    );
    let _reconciler = start(&node, &api);
    wait_until(60, "success", || state(&api).as_deref() == Some("success"));
    assert_eq!(states(&api), ["pending", "success"]);
    assert!(asserts(&node, "all-1g.10gb"));
    let text = log(&node);
    assert!(
        text.contains("reading node test-node: no answer from the API server within 10s"),
        "{text}"
    );
    let reads = api.requests_to("GET", "/api/v1/nodes/test-node");
    let gap = reads[1].at - reads[0].at;
    eprintln!("stall: the second read {gap:?} after the first");
    // One request during the stall; the next after the 10 s limit and one backoff pause.
    assert!(
        gap >= Duration::from_secs(10) && gap < Duration::from_secs(12),
        "{gap:?}"
    );
    let converged = api.log().last().unwrap().at - reads[0].at;
    eprintln!("stall: converged {converged:?} after the first read");
}

#[test]
fn a_mode_change_the_driver_says_needs_a_reboot_reboots_once_and_succeeds_after_it() {
    use std::os::unix::fs::PermissionsExt;
    let node = Node::new("a100-mig");
    let called = node.dir.path().join("reboots");
    let script = node.dir.path().join("reboot.sh");
    std::fs::write(
        &script,
        format!("#!/bin/sh\necho rebooting >> {}\n", called.display()),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let env = [
        ("NVML_MOCK_MIG_RESET_REQUIRED", "1"),
        ("GPUD_MIG_REBOOT_COMMAND", script.to_str().unwrap()),
    ];
    let api = FakeApi::start(json!({CONFIG_LABEL: "all-disabled"}));
    let first = start_with(&node, &api, &env);
    wait_until(60, "rebooting", || {
        state(&api).as_deref() == Some("rebooting")
    });
    assert_eq!(states(&api), ["pending", "rebooting"]);
    let reason = api.node_annotations()[REASON].clone();
    assert!(reason.contains("needs a reboot"), "{reason}");
    // The state is on the Node before the reboot command runs: wait for the command's line.
    wait_until(10, "the reboot command", || {
        std::fs::read_to_string(&called).is_ok_and(|text| !text.is_empty())
    });
    assert_eq!(std::fs::read_to_string(&called).unwrap(), "rebooting\n");
    drop(first);

    // Started again before the mode changed (a reboot that did not apply it): the reboot
    // marker holds it back from rebooting twice, and the config is failed with the reason.
    let _second = start_with(&node, &api, &env);
    wait_until(60, "failed", || state(&api).as_deref() == Some("failed"));
    let reason = api.node_annotations()[REASON].clone();
    assert!(reason.contains("after rebooting"), "{reason}");
    // The driver applies the pending mode (as a reboot does): the retry succeeds.
    node.inject("reset 0");
    wait_until(60, "success", || state(&api).as_deref() == Some("success"));
    assert!(asserts(&node, "all-disabled"));
    assert_eq!(
        std::fs::read_to_string(&called).unwrap(),
        "rebooting\n",
        "one reboot per config"
    );
}

/// A new reconciler that takes over (the DaemonSet's surge puts it beside the old one) leaves
/// the GPUs to the old one while it is still applying: it writes nothing and changes nothing
/// until the old one has gone, then resumes the apply the old one left pending.
#[test]
fn a_reconciler_taking_over_waits_for_the_old_ones_apply_to_end() {
    let node = Node::new("a100-mig");
    for function in MIG_CHANGES {
        node.inject(&format!("hang {function}"));
    }
    let api = FakeApi::start(json!({CONFIG_LABEL: "all-1g.10gb"}));
    let mut old = start(&node, &api);
    wait_until(30, "the old reconciler's apply", || {
        states(&api) == ["pending"]
    });
    // The old one is held inside its apply, before its first change.
    let new = start(&node, &api);
    wait_until(30, "the takeover to begin", || {
        log(&node).contains("Taking over")
    });
    let gone = Instant::now() + Duration::from_secs(30);
    while old.0.try_wait().unwrap().is_none() {
        assert_eq!(
            states(&api),
            ["pending"],
            "the new reconciler acted while the old one was applying:\n{}",
            log(&node)
        );
        assert!(Instant::now() < gone, "the old reconciler never stopped");
        std::thread::sleep(Duration::from_millis(20));
    }
    for function in MIG_CHANGES {
        node.inject(&format!("unhang {function}"));
    }
    wait_until(60, "success", || state(&api).as_deref() == Some("success"));
    assert_eq!(states(&api), ["pending", "pending", "success"]);
    assert!(asserts(&node, "all-1g.10gb"));
    drop(new);
}
