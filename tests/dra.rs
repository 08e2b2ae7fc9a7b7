//! `gpud dra` (and `gpud run --dra`) as the kubelet's DRA plugin, on the simulated node, with
//! a fake kubelet (plugin registration and DRA clients over unix sockets, sending a socket
//! path as `:authority`) and a fake API server holding ResourceClaims and ResourceSlices.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
#[path = "common/fake_api.rs"]
mod fake_api;
#[path = "common/fake_dra_kubelet.rs"]
mod fake_dra_kubelet;
#[path = "common/fake_kubelet.rs"]
mod fake_kubelet;
#[path = "common/fake_pod_resources.rs"]
mod fake_pod_resources;
#[path = "common/pynvml.rs"]
mod pynvml;
#[path = "common/raw_grpc.rs"]
mod raw_grpc;

#[path = "dra/dynamic_mig.rs"]
mod dynamic_mig;
#[path = "dra/extended.rs"]
mod extended;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Child;
use std::time::{Duration, Instant};

use common::{Node, assert_golden, stdout_ok};
use fake_api::{FakeApi, Fault, Rule};
use gpud::proto::dra_v1::{
    Device, NodePrepareResourcesRequest, NodePrepareResourcesResponse,
    NodeUnprepareResourcesRequest,
};
use gpud::proto::dra_v1beta1;
use serde_json::{Value, json};

const DRIVER: &str = "gpu.nvidia.com";

/// A node with gpud's DRA plugin, its kubelet folders and the fake API server.
struct Dra {
    node: Node,
    api: FakeApi,
    gpud: Option<Child>,
    /// Extra arguments (before the DRA ones); `applet` is `dra` or `run`.
    applet: Vec<String>,
    /// Environment added to the node's (e.g. NVIDIA's XID policy variables).
    env: Vec<(String, String)>,
}

impl Dra {
    fn new(fixture: &str) -> Dra {
        let node = Node::new(fixture);
        write_fake_nvidia_smi(node.dir.path());
        let bin = node.dir.path().join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        let control = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/mps/nvidia-cuda-mps-control");
        std::fs::copy(control, bin.join("nvidia-cuda-mps-control")).unwrap();
        Dra {
            node,
            api: FakeApi::start(json!({})),
            gpud: None,
            applet: vec!["dra".into()],
            env: Vec::new(),
        }
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.node.dir.path().join(rel)
    }

    fn registration_socket(&self) -> PathBuf {
        self.path("plugins_registry/gpu.nvidia.com-reg.sock")
    }

    fn plugin_socket(&self) -> PathBuf {
        self.path("plugins/gpu.nvidia.com/dra.sock")
    }

    fn checkpoint(&self) -> PathBuf {
        self.path("plugins/gpu.nvidia.com/checkpoint.json")
    }

    fn spec_file(&self, uid: &str) -> PathBuf {
        self.path(&format!("cdi/k8s.gpu.nvidia.com-claim_{uid}.yaml"))
    }

    /// Starts gpud with stderr in `<node>/gpud.log`.
    fn start(&mut self) {
        let kubeconfig = self.api.kubeconfig(self.node.dir.path());
        let mut args: Vec<String> = self.applet.clone();
        args.extend(self.node.dra_flags());
        let path = |rel: &str| self.path(rel).to_str().unwrap().to_owned();
        args.extend(
            [
                "--kubeconfig",
                kubeconfig.to_str().unwrap(),
                "--dra-nvidia-smi-path",
                &path("nvidia-smi"),
                "--mps-control-binary",
                &path("bin/nvidia-cuda-mps-control"),
                "--mps-skip-shm-mount",
                "--mps-probe-interval",
                "100ms",
                "--kmsg",
                "",
                "--health-poll-interval",
                "50ms",
            ]
            .map(String::from),
        );
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.path("gpud.log"))
            .unwrap();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let mut command = self.node.gpud(&args);
        command.envs(self.env.iter().map(|(k, v)| (k, v)));
        self.gpud = Some(command.stderr(log).spawn().unwrap());
    }

    fn stop(&mut self) {
        if let Some(mut child) = self.gpud.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.path("gpud.log")).unwrap_or_default()
    }

    /// gpud's log once it holds `line`.
    fn log_when(&self, line: &str) -> String {
        common::file_when(&self.path("gpud.log"), line, 15)
    }

    /// Waits for the registration socket, then registers as the kubelet does.
    async fn register(&self) -> gpud::proto::pluginregistration::PluginInfo {
        let socket = self.registration_socket();
        // A socket left by a killed run exists but refuses: wait until one answers.
        self.until("the registration socket", || {
            std::os::unix::net::UnixStream::connect(&socket).ok()
        });
        fake_dra_kubelet::register(&socket).await
    }

    /// Polls `check` every 20 ms for up to 15 s.
    fn until<T>(&self, what: &str, mut check: impl FnMut() -> Option<T>) -> T {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if let Some(value) = check() {
                return value;
            }
            assert!(
                Instant::now() < deadline,
                "no {what} in time; gpud's log:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The slices once `check` holds for them.
    fn slices_when(&self, what: &str, check: impl Fn(&[Value]) -> bool) -> Vec<Value> {
        self.until(what, || {
            let slices: Vec<Value> = self.api.slices().into_values().collect();
            (!slices.is_empty() && check(&slices)).then_some(slices)
        })
    }

    fn put_claim(&self, name: &str, uid: &str, devices: &[&str]) {
        self.put_configured_claim(name, uid, devices, json!([]));
    }

    async fn prepare(&self, name: &str, uid: &str) -> NodePrepareResourcesResponse {
        let request = NodePrepareResourcesRequest {
            claims: vec![fake_dra_kubelet::claim_v1("ns", name, uid)],
        };
        fake_dra_kubelet::prepare_v1(&self.plugin_socket(), request).await
    }

    async fn unprepare(&self, name: &str, uid: &str) -> String {
        let request = NodeUnprepareResourcesRequest {
            claims: vec![fake_dra_kubelet::claim_v1("ns", name, uid)],
        };
        let answer = fake_dra_kubelet::unprepare_v1(&self.plugin_socket(), request).await;
        answer.claims[uid].error.clone()
    }

    /// The command lines the fake nvidia-smi ran since the last call.
    fn nvidia_smi_runs(&self) -> Vec<String> {
        let log = self.path("nvidia-smi.log");
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let _ = std::fs::remove_file(&log);
        text.lines().map(str::to_owned).collect()
    }

    /// A claim allocated `devices` for request `gpu`, with allocation `config`.
    fn put_configured_claim(&self, name: &str, uid: &str, devices: &[&str], config: Value) {
        let results: Vec<Value> = devices
            .iter()
            .map(|d| json!({"request": "gpu", "driver": DRIVER, "pool": "test-node", "device": d}))
            .collect();
        self.api.put_claim(json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"namespace": "ns", "name": name, "uid": uid},
            "status": {"allocation": {"devices": {"results": results, "config": config}}}
        }));
    }

    fn uuid(&self, index: usize) -> String {
        let inventory: Value =
            serde_json::from_str(&stdout_ok(&self.node.run(&["inventory"]))).unwrap();
        inventory["gpus"][index]["uuid"]
            .as_str()
            .unwrap()
            .to_owned()
    }
}

/// A fake `nvidia-smi` in `dir`: it appends its arguments to `nvidia-smi.log` and fails, with
/// NVIDIA's message on stderr, for a GPU UUID listed in `nvidia-smi.fail`.
fn write_fake_nvidia_smi(dir: &std::path::Path) {
    use std::os::unix::fs::PermissionsExt;
    let script = dir.join("nvidia-smi");
    std::fs::write(
        &script,
        "#!/bin/sh\n\
         here=$(dirname \"$0\")\n\
         echo \"$*\" >> \"$here/nvidia-smi.log\"\n\
         if [ -e \"$here/nvidia-smi.fail\" ] && grep -qxF -- \"$3\" \"$here/nvidia-smi.fail\"; then\n\
         \x20 echo \"Failed to set the timeslice for GPU $3: Not Supported\" >&2\n\
         \x20 exit 3\n\
         fi\n",
    )
    .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
}

impl Drop for Dra {
    fn drop(&mut self) {
        self.stop();
        if std::thread::panicking() {
            eprintln!("--- gpud's log ---\n{}", self.log());
        }
    }
}

/// The slices as the golden files hold them: name and spec, by name.
fn render(slices: &[Value]) -> String {
    let shown: Vec<Value> = slices
        .iter()
        .map(|s| json!({"name": s["metadata"]["name"], "spec": s["spec"]}))
        .collect();
    let mut text = serde_json::to_string_pretty(&shown).unwrap();
    text.push('\n');
    text
}

fn generation(slices: &[Value]) -> i64 {
    slices[0]["spec"]["pool"]["generation"].as_i64().unwrap()
}

fn device<'a>(slices: &'a [Value], name: &str) -> &'a Value {
    slices
        .iter()
        .flat_map(|s| s["spec"]["devices"].as_array().unwrap())
        .find(|d| d["name"] == name)
        .unwrap_or_else(|| panic!("no device {name}"))
}

fn prepared(uid: &str, device: &str) -> Device {
    Device {
        request_names: vec!["gpu".into()],
        pool_name: "test-node".into(),
        device_name: device.into(),
        cdi_device_ids: vec![format!("k8s.gpu.nvidia.com/claim={uid}-{device}")],
        share_id: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registers_with_the_service_list_and_publishes_nvidias_slices() {
    for fixture in ["dgx-h100", "a100-mig", "mixed"] {
        let mut dra = Dra::new(fixture);
        dra.start();
        let info = dra.register().await;
        assert_eq!(info.r#type, "DRAPlugin");
        assert_eq!(info.name, DRIVER);
        assert_eq!(info.endpoint, dra.plugin_socket().to_str().unwrap());
        assert_eq!(
            info.supported_versions,
            [
                "v1.DRAPlugin",
                "v1beta1.DRAPlugin",
                "v1.DRAResourceHealth",
                "v1alpha1.DRAResourceHealth"
            ]
        );
        let slices = dra.slices_when("slices", |_| true);
        assert_golden(&format!("dra/{fixture}.json"), &render(&slices));
    }
}

/// The `resource.k8s.io` requests other than discovery, as `METHOD path`.
fn resource_calls(dra: &Dra) -> Vec<String> {
    dra.api
        .resource_requests()
        .into_iter()
        .filter(|r| r != "GET /apis/resource.k8s.io")
        .collect()
}

/// Every `resource.k8s.io` request went through `version`, and `call` was one of them.
fn assert_all_through(dra: &Dra, version: &str, call: &str) {
    let calls = resource_calls(dra);
    assert!(calls.iter().any(|c| c == call), "no {call} in {calls:?}");
    let prefix = format!(" /apis/resource.k8s.io/{version}/");
    assert!(calls.iter().all(|c| c.contains(&prefix)), "{calls:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_1_32_api_server_gets_v1beta1_slices_with_device_data_in_basic() {
    let mut dra = Dra::new("mixed");
    dra.api.set_resource_versions(&["v1beta1"]);
    dra.start();
    dra.register().await;
    let slices = dra.slices_when("slices", |_| true);
    assert_golden("dra/mixed-v1beta1.json", &render(&slices));
    assert!(
        slices
            .iter()
            .all(|s| s["apiVersion"] == "resource.k8s.io/v1beta1")
    );
    assert_all_through(
        &dra,
        "v1beta1",
        "POST /apis/resource.k8s.io/v1beta1/resourceslices",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_are_read_through_v1beta2_once_the_api_server_serves_it() {
    let mut dra = Dra::new("dgx-h100");
    dra.api.set_resource_versions(&["v1alpha3"]);
    dra.start();
    dra.register().await;
    dra.put_claim("c1", "uid-1", &["gpu-1"]);
    assert_eq!(
        dra.prepare("c1", "uid-1").await.claims["uid-1"].error,
        "the API server serves resource.k8s.io in none of the versions gpud speaks (v1, \
         v1beta2, v1beta1; it serves: v1alpha3): DRA needs Kubernetes 1.32 or newer, and on \
         1.32 and 1.33 the beta API enabled (--runtime-config=resource.k8s.io/v1beta1=true or \
         v1beta2=true, feature gate DynamicResourceAllocation)"
    );
    assert_eq!(resource_calls(&dra), Vec::<String>::new());

    // The API server is upgraded (1.33): discovery is tried again, v1beta2 is preferred.
    dra.api.set_resource_versions(&["v1beta2", "v1beta1"]);
    let answer = dra.prepare("c1", "uid-1").await;
    assert_eq!(answer.claims["uid-1"].error, "");
    assert_eq!(answer.claims["uid-1"].devices, [prepared("uid-1", "gpu-1")]);
    let slices = dra.slices_when("v1beta2 slices", |s| {
        s.iter()
            .all(|s| s["apiVersion"] == "resource.k8s.io/v1beta2")
    });
    assert!(device(&slices, "gpu-1")["attributes"]["uuid"].is_object());
    assert_all_through(
        &dra,
        "v1beta2",
        "GET /apis/resource.k8s.io/v1beta2/namespaces/ns/resourceclaims/c1",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prepare_is_idempotent_across_restarts_and_unprepare_needs_no_claim() {
    let mut dra = Dra::new("dgx-h100");
    dra.start();
    dra.register().await;
    dra.put_claim("c1", "uid-1", &["gpu-3"]);
    let answer = dra.prepare("c1", "uid-1").await;
    assert_eq!(answer.claims.len(), 1);
    assert_eq!(answer.claims["uid-1"].error, "");
    assert_eq!(answer.claims["uid-1"].devices, [prepared("uid-1", "gpu-3")]);

    let spec: Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(dra.spec_file("uid-1")).unwrap()).unwrap();
    assert_eq!(spec["kind"], "k8s.gpu.nvidia.com/claim");
    let devices = spec["devices"].as_array().unwrap();
    assert_eq!(devices.len(), 1);
    assert_eq!(devices[0]["name"], "uid-1-gpu-3");
    assert_eq!(
        devices[0]["containerEdits"]["deviceNodes"][0]["path"],
        "/dev/nvidia3"
    );

    // Again, through v1beta1: the same answer.
    let request = dra_v1beta1::NodePrepareResourcesRequest {
        claims: vec![fake_dra_kubelet::claim_v1beta1("ns", "c1", "uid-1")],
    };
    let again = fake_dra_kubelet::prepare_v1beta1(&dra.plugin_socket(), request).await;
    assert_eq!(
        again.claims["uid-1"].devices,
        [dra_v1beta1::Device {
            request_names: vec!["gpu".into()],
            pool_name: "test-node".into(),
            device_name: "gpu-3".into(),
            cdi_device_ids: vec!["k8s.gpu.nvidia.com/claim=uid-1-gpu-3".into()],
        }]
    );

    // Another claim for the same GPU is refused.
    dra.put_claim("c2", "uid-2", &["gpu-3"]);
    let refused = dra.prepare("c2", "uid-2").await;
    assert_eq!(
        refused.claims["uid-2"].error,
        "device gpu-3 is held by claim ns/c1 (UID uid-1); one device serves one claim"
    );
    assert!(refused.claims["uid-2"].devices.is_empty());
    assert!(!dra.spec_file("uid-2").exists());

    // An admin-access claim (monitoring beside the user) gets the same GPU.
    dra.api.put_claim(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"namespace": "ns", "name": "watch", "uid": "uid-a"},
        "status": {"allocation": {"devices": {"results": [{"request": "gpu", "driver": DRIVER,
            "pool": "test-node", "device": "gpu-3", "adminAccess": true}]}}}
    }));
    let admin = dra.prepare("watch", "uid-a").await;
    assert_eq!(admin.claims["uid-a"].devices, [prepared("uid-a", "gpu-3")]);
    assert_eq!(dra.unprepare("watch", "uid-a").await, "");

    // gpud restarts, the claim object is gone: the checkpoint answers.
    dra.stop();
    dra.api.delete_claim("ns", "c1");
    std::fs::remove_file(dra.spec_file("uid-1")).unwrap();
    dra.start();
    dra.register().await;
    let after = dra.prepare("c1", "uid-1").await;
    assert_eq!(after.claims["uid-1"].error, "");
    assert_eq!(after.claims["uid-1"].devices, [prepared("uid-1", "gpu-3")]);
    assert!(dra.spec_file("uid-1").exists(), "the spec is written again");

    // Unprepare without the claim object; twice is fine.
    assert_eq!(dra.unprepare("c1", "uid-1").await, "");
    assert!(!dra.spec_file("uid-1").exists());
    let checkpoint: Value =
        serde_json::from_str(&std::fs::read_to_string(dra.checkpoint()).unwrap()).unwrap();
    assert_eq!(checkpoint, json!({"version": 1, "claims": {}}));
    assert_eq!(dra.unprepare("c1", "uid-1").await, "");

    // A claim that is not there, or was replaced, is that claim's error.
    let missing = dra.prepare("nope", "uid-9").await;
    assert_eq!(
        missing.claims["uid-9"].error,
        "ResourceClaim ns/nope does not exist"
    );
    dra.put_claim("c3", "uid-new", &["gpu-0"]);
    let replaced = dra.prepare("c3", "uid-old").await;
    assert_eq!(
        replaced.claims["uid-old"].error,
        "ResourceClaim ns/c3 has UID uid-new, not uid-old: it was deleted and created again"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fatal_xid_taints_the_device_and_recovery_removes_the_taint() {
    let mut dra = Dra::new("dgx-h100");
    dra.start();
    dra.register().await;
    let before = dra.slices_when("slices", |_| true);
    assert!(device(&before, "gpu-3").get("taints").is_none());

    // The watcher is ready once its NVML event set is registered: an XID injected before that
    // is one the driver never reports.
    dra.log_when("health: Ready");
    dra.node.inject("xid 3 79");
    let tainted = dra.slices_when("the XID taint", |s| {
        device(s, "gpu-3").get("taints").is_some()
    });
    assert_eq!(
        device(&tainted, "gpu-3")["taints"],
        json!([{"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoSchedule"}])
    );
    assert!(device(&tainted, "gpu-2").get("taints").is_none());
    assert!(generation(&tainted) > generation(&before));

    // The GPU is reset: it drops off the bus and answers again, once the watcher's poll has
    // seen it gone (a reset's outage lasts that long).
    dra.node.inject("lost 3");
    dra.log_when("unhealthy -> unhealthy: GPU is lost");
    dra.node.inject("recover 3");
    let clear = dra.slices_when("the taint removed", |s| {
        device(s, "gpu-3").get("taints").is_none() && generation(s) > generation(&tainted)
    });
    assert_eq!(
        render(&clear).replace(&format!("\"generation\": {}", generation(&clear)), "G"),
        render(&before).replace(&format!("\"generation\": {}", generation(&before)), "G")
    );
}

/// `gpud run --dra` with the device plugin on the fake kubelet at `socket`.
fn run_applet(socket: &std::path::Path) -> Vec<String> {
    [
        "run",
        "--dra",
        "--disable",
        "labeller,exporter",
        "--doctor-interval",
        "0",
        "--kubelet-socket",
        socket.to_str().unwrap(),
        "--extended-resource-owner",
        "device-plugin",
    ]
    .map(String::from)
    .to_vec()
}

/// `gpud run --dra` with the device plugin on a fake kubelet: the open ListAndWatch stream
/// after its first list (every GPU healthy), with the DRA plugin registered and its slices
/// published untainted.
async fn run_with_device_plugin(
    dra: &mut Dra,
) -> (
    fake_kubelet::FakeKubelet,
    tonic::Streaming<gpud::proto::deviceplugin::ListAndWatchResponse>,
) {
    let mut kubelet = fake_kubelet::FakeKubelet::start(dra.node.dir.path()).await;
    let socket = kubelet.socket();
    dra.applet = run_applet(&socket);
    dra.start();
    let registration = kubelet.next_registration(15).await;
    let mut plugin = kubelet.plugin(&registration.endpoint).await;
    let mut stream = fake_kubelet::list_and_watch(&mut plugin).await;
    let first = fake_kubelet::next_list(&mut stream, 10).await;
    assert!(first.devices.iter().all(|d| d.health == "Healthy"));
    dra.register().await;
    let slices = dra.slices_when("slices", |_| true);
    assert!(
        (0..8).all(|i| device(&slices, &format!("gpu-{i}")).get("taints").is_none()),
        "{}",
        render(&slices)
    );
    (kubelet, stream)
}

/// The device plugin's next list in which `check` holds, failing after 15 s.
async fn list_when(
    stream: &mut tonic::Streaming<gpud::proto::deviceplugin::ListAndWatchResponse>,
    what: &str,
    check: impl Fn(&BTreeMap<String, String>) -> bool,
) -> BTreeMap<String, String> {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let list = tokio::time::timeout(left, stream.message())
            .await
            .unwrap_or_else(|_| panic!("no device list with {what} in time"))
            .unwrap()
            .expect("stream ended");
        let health: BTreeMap<String, String> =
            list.devices.into_iter().map(|d| (d.id, d.health)).collect();
        if check(&health) {
            return health;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_xid_the_policy_makes_fatal_withdraws_the_gpu_and_forbids_scheduling_through_dra() {
    let mut dra = Dra::new("dgx-h100");
    dra.env.push(("DP_ENABLE_HEALTHCHECKS".into(), "13".into()));
    let (_kubelet, mut stream) = run_with_device_plugin(&mut dra).await;
    let gpu2 = dra.uuid(2);

    dra.node.inject("xid 2 13");
    let health = list_when(&mut stream, "GPU 2 unhealthy", |h| {
        h.get(&gpu2).map(String::as_str) == Some("Unhealthy")
    })
    .await;
    assert_eq!(
        health.values().filter(|h| *h == "Unhealthy").count(),
        1,
        "{health:?}"
    );
    let tainted = dra.slices_when("the XID taint", |s| {
        device(s, "gpu-2").get("taints").is_some()
    });
    assert_eq!(
        device(&tainted, "gpu-2")["taints"],
        json!([{"key": "gpu.nvidia.com/xid", "value": "13", "effect": "NoSchedule"}])
    );
    assert!(device(&tainted, "gpu-1").get("taints").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn by_default_an_application_xid_leaves_the_gpu_healthy_and_untainted() {
    let mut dra = Dra::new("dgx-h100");
    let (_kubelet, mut stream) = run_with_device_plugin(&mut dra).await;
    let (gpu2, gpu3) = (dra.uuid(2), dra.uuid(3));

    // XID 13 is in NVIDIA's default ignore list. The XIDs after it are facts to wait for:
    // the watcher handles XIDs in order, so once theirs show, XID 13's verdict is in too.
    dra.node.inject("xid 2 13");
    // XID 8 is the application's too but not ignored: degraded, a taint that only informs.
    dra.node.inject("xid 1 8");
    let slices = dra.slices_when("the degraded GPU's taint", |s| {
        device(s, "gpu-1").get("taints").is_some()
    });
    assert_eq!(
        device(&slices, "gpu-1")["taints"],
        json!([{"key": "gpu.nvidia.com/xid", "value": "8", "effect": "None"}])
    );
    assert!(
        device(&slices, "gpu-2").get("taints").is_none(),
        "{}",
        render(&slices)
    );

    dra.node.inject("xid 3 79");
    let health = list_when(&mut stream, "GPU 3 unhealthy", |h| {
        h.get(&gpu3).map(String::as_str) == Some("Unhealthy")
    })
    .await;
    assert_eq!(health[&gpu2], "Healthy");
    assert_eq!(
        health.values().filter(|h| *h == "Unhealthy").count(),
        1,
        "the degraded GPU stays with the device plugin: {health:?}"
    );
}

/// A fixture file of `count` A100 PCIe GPUs, no NVLink, bus ids 0x01 up.
fn many_gpus_fixture(path: &std::path::Path, count: usize) {
    let gpus: Vec<Value> = (0..count)
        .map(|i| {
            json!({"model": "A100-PCIE-80GB",
                "uuid": format!("GPU-00000000-0000-4000-8000-{i:012x}"),
                "serial": format!("1321021{i:06}"),
                "board_part_number": "900-21001-0020-100",
                "pci_bus_id": format!("00000000:{:02X}:00.0", i + 1),
                "numa_node": 0, "cpu_affinity": "0-31",
                "pcie": {"host_bridge": "hb0", "switches": ["sw0"]}, "nvlinks": []})
        })
        .collect();
    let fixture = json!({"description": format!("{count}x A100 80GB PCIe"),
        "driver_version": "570.133.20", "nvml_version": "12.570.133.20",
        "cuda_driver_version": 12080, "seed": 7, "gpus": gpus});
    std::fs::write(path, serde_json::to_vec_pretty(&fixture).unwrap()).unwrap();
}

/// Per slice: (name, device count, pool).
fn layout(slices: &[Value]) -> Vec<(String, usize, Value)> {
    let mut out: Vec<_> = slices
        .iter()
        .map(|s| {
            (
                s["metadata"]["name"].as_str().unwrap().to_owned(),
                s["spec"]["devices"].as_array().unwrap().len(),
                s["spec"]["pool"].clone(),
            )
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tainted_pool_over_64_devices_is_split_and_every_slice_counts_them() {
    let mut dra = Dra::new("pcie-4gpu");
    let fixture = dra.path("65-gpus.json");
    many_gpus_fixture(&fixture, 65);
    dra.node.fixture = fixture.to_str().unwrap().to_owned();
    dra.start();
    dra.register().await;
    let pool = |generation: i64, count: i64| json!({"name": "test-node", "generation": generation, "resourceSliceCount": count});
    // 65 healthy devices fit in one slice (128 at most).
    let one = dra.slices_when("one slice of 65", |s| {
        s.len() == 1 && s[0]["spec"]["devices"].as_array().unwrap().len() == 65
    });
    let g1 = generation(&one);
    assert_eq!(
        layout(&one),
        [("test-node-gpu.nvidia.com-0".to_owned(), 65, pool(g1, 1))]
    );

    // A taint on the last GPU: a slice with a tainted device holds at most 64.
    dra.node.inject("xid 64 79");
    let split = dra.slices_when("two slices", |s| s.len() == 2);
    let g2 = generation(&split);
    assert!(g2 > g1);
    assert_eq!(
        layout(&split),
        [
            ("test-node-gpu.nvidia.com-0".to_owned(), 64, pool(g2, 2)),
            ("test-node-gpu.nvidia.com-1".to_owned(), 1, pool(g2, 2)),
        ]
    );
    assert_eq!(
        device(&split, "gpu-64")["taints"],
        json!([{"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoSchedule"}])
    );

    // The GPU is reset and recovers: one slice again, the second one deleted.
    dra.node.inject("lost 64");
    dra.slices_when("the GPU lost", |s| {
        s.len() == 2
            && device(s, "gpu-64")["taints"]
                .as_array()
                .is_some_and(|t| t.iter().any(|t| t["key"] == "gpu.nvidia.com/gpu-lost"))
    });
    dra.node.inject("recover 64");
    let joined = dra.slices_when("one slice again", |s| s.len() == 1);
    let g3 = generation(&joined);
    assert!(g3 > g2);
    assert_eq!(
        layout(&joined),
        [("test-node-gpu.nvidia.com-0".to_owned(), 65, pool(g3, 1))]
    );
    assert!(device(&joined, "gpu-64").get("taints").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slices_the_kubelet_wipes_are_published_again() {
    let mut dra = Dra::new("a100-mig");
    dra.start();
    dra.register().await;
    let first = dra.slices_when("slices", |_| true);

    // A restarting kubelet deletes the node's slices, then registers the plugin again.
    dra.api.wipe_slices("test-node");
    let back = dra.slices_when("slices again", |s| generation(s) > generation(&first));
    assert_eq!(back.len(), first.len());
    dra.api.wipe_slices("test-node");
    dra.register().await;
    let again = dra.slices_when("slices again", |s| generation(s) > generation(&back));
    assert_eq!(
        render(&again).replace(&format!("\"generation\": {}", generation(&again)), "G"),
        render(&first).replace(&format!("\"generation\": {}", generation(&first)), "G")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_checkpoint_is_moved_aside_and_the_plugin_serves_on() {
    let mut dra = Dra::new("dgx-h100");
    std::fs::create_dir_all(dra.path("plugins/gpu.nvidia.com")).unwrap();
    std::fs::write(dra.checkpoint(), "{\"version\": 1, \"claims\": {\"uid-").unwrap();
    dra.start();
    dra.register().await;
    let log = dra.log();
    assert!(
        log.contains("the DRA checkpoint is corrupt")
            && log.contains("moved it aside to")
            && log.contains("checkpoint.json.corrupt-"),
        "{log}"
    );
    let aside: Vec<String> = std::fs::read_dir(dra.path("plugins/gpu.nvidia.com"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.starts_with("checkpoint.json.corrupt-"))
        .collect();
    assert_eq!(aside.len(), 1);
    let event = dra.until("the event", || dra.api.events().first().cloned());
    assert_eq!(event["reason"], "DRACheckpointCorrupt");
    assert_eq!(event["type"], "Warning");
    assert_eq!(event["involvedObject"]["name"], "test-node");
    let message = event["message"].as_str().unwrap();
    assert!(
        message.contains("the DRA checkpoint is corrupt"),
        "{message}"
    );
    dra.put_claim("c1", "uid-1", &["gpu-0"]);
    let answer = dra.prepare("c1", "uid-1").await;
    assert_eq!(answer.claims["uid-1"].devices, [prepared("uid-1", "gpu-0")]);
}

/// The corrupt checkpoint's event, refused by a busy API server (a plain-text 429 with
/// `Retry-After: 1`), lands on the retry after it; the plugin serves meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_corrupt_checkpoint_event_is_retried_until_the_api_server_takes_it() {
    let mut dra = Dra::new("dgx-h100");
    let events = "/api/v1/namespaces/default/events";
    let rule = dra
        .api
        .refuse(Rule::exact("POST", events, Fault::TooManyRequestsPlain(1)).times(1));
    std::fs::create_dir_all(dra.path("plugins/gpu.nvidia.com")).unwrap();
    std::fs::write(dra.checkpoint(), "{\"version\": 1, \"claims\": {\"uid-").unwrap();
    dra.start();
    dra.register().await;
    let event = dra.until("the event", || dra.api.events().first().cloned());
    assert_eq!(event["reason"], "DRACheckpointCorrupt");
    assert_eq!(dra.api.refused_by(rule), 1);
    let posts = dra.api.requests_to("POST", events);
    assert_eq!(posts.len(), 2, "{posts:?}");
    assert!(
        posts[1].at - posts[0].at >= Duration::from_secs(1),
        "{posts:?}"
    );
    let log = dra.log_when("Node events are recorded again");
    assert_eq!(
        log.matches("Cannot record an event on the Node").count(),
        1,
        "{log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gpu_the_device_plugin_gave_to_a_pod_is_refused_to_a_claim() {
    use gpud::proto::podresources::{
        ContainerDevices, ContainerResources, ListPodResourcesResponse, PodResources,
    };
    let mut dra = Dra::new("dgx-h100");
    let uuid = dra.uuid(2);
    let answer = ListPodResourcesResponse {
        pod_resources: vec![PodResources {
            name: "training".into(),
            namespace: "default".into(),
            containers: vec![ContainerResources {
                name: "main".into(),
                devices: vec![ContainerDevices {
                    resource_name: "nvidia.com/gpu".into(),
                    device_ids: vec![uuid.clone()],
                    topology: None,
                }],
                ..Default::default()
            }],
            ..Default::default()
        }],
    };
    let _kubelet = fake_pod_resources::FakeKubelet::start(&dra.path("pod-resources.sock"), answer);
    dra.start();
    dra.register().await;
    dra.put_claim("c1", "uid-1", &["gpu-2"]);
    let refused = dra.prepare("c1", "uid-1").await;
    assert_eq!(
        refused.claims["uid-1"].error,
        format!(
            "device gpu-2 ({uuid}) was given by the device plugin to pod default/training: a \
             GPU is never handed out by both; it becomes available when that pod ends"
        )
    );
    dra.put_claim("c2", "uid-2", &["gpu-1"]);
    assert_eq!(dra.prepare("c2", "uid-2").await.claims["uid-2"].error, "");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gpu_prepared_for_a_claim_leaves_the_device_plugins_list_until_unprepared() {
    let mut dra = Dra::new("dgx-h100");
    let mut kubelet = fake_kubelet::FakeKubelet::start(dra.node.dir.path()).await;
    let socket = kubelet.socket();
    dra.applet = run_applet(&socket);
    dra.start();
    let registration = kubelet.next_registration(15).await;
    let mut plugin = kubelet.plugin(&registration.endpoint).await;
    let mut stream = fake_kubelet::list_and_watch(&mut plugin).await;
    let ids = |list: &gpud::proto::deviceplugin::ListAndWatchResponse| -> Vec<String> {
        list.devices.iter().map(|d| d.id.clone()).collect()
    };
    let all = ids(&fake_kubelet::next_list(&mut stream, 10).await);
    assert_eq!(all.len(), 8);
    let gpu1 = dra.uuid(1);

    dra.register().await;
    dra.put_claim("c1", "uid-1", &["gpu-1"]);
    assert_eq!(dra.prepare("c1", "uid-1").await.claims["uid-1"].error, "");
    let without = ids(&fake_kubelet::next_list(&mut stream, 10).await);
    let expected: Vec<String> = all.iter().filter(|id| **id != gpu1).cloned().collect();
    assert_eq!(without, expected);

    assert_eq!(dra.unprepare("c1", "uid-1").await, "");
    let back = ids(&fake_kubelet::next_list(&mut stream, 10).await);
    assert_eq!(back, all);
}

async fn next_health(
    stream: &mut tonic::Streaming<gpud::proto::drahealth_v1::NodeWatchResourcesResponse>,
) -> gpud::proto::drahealth_v1::NodeWatchResourcesResponse {
    tokio::time::timeout(Duration::from_secs(10), stream.message())
        .await
        .expect("no health list in time")
        .unwrap()
        .expect("stream ended")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_health_stream_sends_the_complete_list_and_every_change() {
    use gpud::proto::drahealth_v1::{HealthStatus, NodeWatchResourcesRequest};
    let mut dra = Dra::new("pcie-4gpu");
    dra.start();
    dra.register().await;
    let mut client = fake_dra_kubelet::health(&dra.plugin_socket()).await;
    let mut stream = client
        .node_watch_resources(NodeWatchResourcesRequest {})
        .await
        .unwrap()
        .into_inner();
    let first = next_health(&mut stream).await;
    let summary =
        |r: &gpud::proto::drahealth_v1::NodeWatchResourcesResponse| -> BTreeMap<String, i32> {
            r.devices
                .iter()
                .map(|d| {
                    let id = d.device.as_ref().unwrap();
                    assert_eq!(id.pool_name, "test-node");
                    (id.device_name.clone(), d.health)
                })
                .collect()
        };
    let healthy = HealthStatus::Healthy as i32;
    assert_eq!(
        summary(&first),
        BTreeMap::from([
            ("gpu-0".to_owned(), healthy),
            ("gpu-1".to_owned(), healthy),
            ("gpu-2".to_owned(), healthy),
            ("gpu-3".to_owned(), healthy),
        ])
    );
    dra.node.inject("xid 1 79");
    let sick = next_health(&mut stream).await;
    let mut expected = summary(&first);
    expected.insert("gpu-1".into(), HealthStatus::Unhealthy as i32);
    assert_eq!(summary(&sick), expected);
    let message = &sick.devices[1].message;
    assert!(message.contains("79"), "{message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_v1alpha1_health_stream_marks_mig_devices_of_a_failed_gpu_and_their_recovery() {
    use gpud::proto::drahealth_v1alpha1::{
        HealthStatus, NodeWatchResourcesRequest, NodeWatchResourcesResponse,
    };
    let mut dra = Dra::new("a100-mig");
    dra.start();
    dra.register().await;
    let mut client = fake_dra_kubelet::health_v1alpha1(&dra.plugin_socket()).await;
    let mut stream = client
        .node_watch_resources(NodeWatchResourcesRequest {})
        .await
        .unwrap()
        .into_inner();
    // Each list as (device, health, message), in the order sent.
    let mut next = async || -> Vec<(String, i32, String)> {
        let list: NodeWatchResourcesResponse =
            tokio::time::timeout(Duration::from_secs(10), stream.message())
                .await
                .expect("no health list in time")
                .unwrap()
                .expect("stream ended");
        list.devices
            .iter()
            .map(|d| {
                let id = d.device.as_ref().unwrap();
                assert_eq!(id.pool_name, "test-node");
                if d.health == HealthStatus::Unhealthy as i32 {
                    assert!(d.last_updated_time > 0, "{d:?}");
                }
                (id.device_name.clone(), d.health, d.message.clone())
            })
            .collect()
    };
    let names = [
        "gpu-0-mig-3g40gb-9-4",
        "gpu-0-mig-2g20gb-14-2",
        "gpu-0-mig-1g10gb-19-1",
    ];
    let all = |health: HealthStatus, message: &str| -> Vec<(String, i32, String)> {
        let mut list: Vec<_> = names
            .iter()
            .map(|n| ((*n).to_owned(), health as i32, message.to_owned()))
            .collect();
        list.sort();
        list
    };
    let sorted = |mut list: Vec<(String, i32, String)>| {
        list.sort();
        list
    };
    assert_eq!(sorted(next().await), all(HealthStatus::Healthy, ""));

    // A fatal XID on the GPU: every MIG device on it is unhealthy, with the GPU's reason.
    dra.node.inject("xid 0 79");
    assert_eq!(
        sorted(next().await),
        all(
            HealthStatus::Unhealthy,
            "XID 79: GPU has fallen off the bus"
        )
    );

    // The GPU is reset (off the bus, then back): the complete list turns healthy again.
    dra.node.inject("lost 0");
    let lost = sorted(next().await);
    assert!(
        lost.iter().all(|d| d.1 == HealthStatus::Unhealthy as i32),
        "{lost:?}"
    );
    dra.node.inject("recover 0");
    let mut list = sorted(next().await);
    while list.iter().any(|d| d.1 != HealthStatus::Healthy as i32) {
        list = sorted(next().await);
    }
    assert_eq!(list, all(HealthStatus::Healthy, ""));
}

/// The simulated driver's MIG state for the `a100-mig` GPU: `three` = a 3g.40gb instance at
/// slice 4, `one` = a 1g.10gb instance at slice 0.
fn write_mig_state(node: &Node, uuid: &str, three: bool, one: bool) {
    let mut instances = Vec::new();
    if three {
        instances.push(json!({"id": 1, "profile_id": 9, "placement": {"start": 4, "size": 4},
            "compute_instances": [{"id": 0, "profile_id": 2, "placement": {"start": 0, "size": 3}}]}));
    }
    if one {
        instances.push(json!({"id": 7, "profile_id": 19, "placement": {"start": 0, "size": 1},
            "compute_instances": [{"id": 0, "profile_id": 0, "placement": {"start": 0, "size": 1}}]}));
    }
    node.write_mig_state(uuid, Value::Array(instances));
}

fn names(slices: &[Value]) -> Vec<String> {
    slices
        .iter()
        .flat_map(|s| s["spec"]["devices"].as_array().unwrap())
        .map(|d| d["name"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mig_change_is_published_within_one_rescan() {
    let mut dra = Dra::new("a100-mig");
    let uuid = dra.uuid(0);
    write_mig_state(&dra.node, &uuid, true, false);
    dra.applet = ["dra", "--rescan-interval", "100ms"]
        .map(String::from)
        .to_vec();
    dra.start();
    dra.register().await;
    let first = dra.slices_when("slices", |s| names(s) == ["gpu-0-mig-3g40gb-9-4"]);

    write_mig_state(&dra.node, &uuid, true, true);
    let both = dra.slices_when("the new MIG device", |s| names(s).len() == 2);
    assert_eq!(
        names(&both),
        ["gpu-0-mig-3g40gb-9-4", "gpu-0-mig-1g10gb-19-0"]
    );
    assert_eq!(generation(&both), generation(&first) + 1);

    write_mig_state(&dra.node, &uuid, false, false);
    let none = dra.slices_when("no MIG device", |s| names(s).is_empty());
    assert_eq!(none.len(), 1, "an empty pool is one empty slice");
    assert_eq!(none[0]["spec"]["pool"]["resourceSliceCount"], 1);
}

/// The driver's capability files of MIG device `gi`/`ci` on GPU 0, under the DRA proc root.
fn mig_caps(dra: &Dra, gi: u32, ci: u32, gi_minor: u32, ci_minor: u32) {
    let dir = dra.path(&format!(
        "driver/driver/nvidia/capabilities/gpu0/mig/gi{gi}"
    ));
    std::fs::create_dir_all(dir.join(format!("ci{ci}"))).unwrap();
    let access = |minor: u32| {
        format!("DeviceFileMinor: {minor}\nDeviceFileMode: 292\nDeviceFileModify: 1\n")
    };
    std::fs::write(dir.join("access"), access(gi_minor)).unwrap();
    std::fs::write(dir.join(format!("ci{ci}/access")), access(ci_minor)).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mig_devices_are_prepared_with_their_config_and_siblings_do_not_clash() {
    let mut dra = Dra::new("a100-mig");
    mig_caps(&dra, 8, 0, 93, 94);
    mig_caps(&dra, 4, 0, 95, 96);
    dra.start();
    dra.register().await;
    let config = |kind: &str| {
        json!([{"source": "FromClaim", "requests": ["gpu"], "opaque": {"driver": DRIVER,
            "parameters": {"apiVersion": "resource.nvidia.com/v1beta1", "kind": kind,
                "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}}}}])
    };
    let claim = |name: &str, uid: &str, device: &str, config: Value| {
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"namespace": "ns", "name": name, "uid": uid},
            "status": {"allocation": {"devices": {"config": config, "results": [
                {"request": "gpu", "driver": DRIVER, "pool": "test-node", "device": device}]}}}})
    };
    let strategy_only = json!([{"source": "FromClaim", "requests": ["gpu"], "opaque": {
        "driver": DRIVER, "parameters": {"apiVersion": "resource.nvidia.com/v1beta1",
            "kind": "MigDeviceConfig", "sharing": {"strategy": "TimeSlicing"}}}}]);
    dra.api.put_claim(claim(
        "small",
        "uid-s",
        "gpu-0-mig-1g10gb-19-1",
        strategy_only,
    ));
    let answer = dra.prepare("small", "uid-s").await;
    assert_eq!(answer.claims["uid-s"].error, "");
    assert_eq!(
        answer.claims["uid-s"].devices,
        [prepared("uid-s", "gpu-0-mig-1g10gb-19-1")]
    );
    let spec: Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(dra.spec_file("uid-s")).unwrap()).unwrap();
    let nodes: Vec<&str> = spec["devices"][0]["containerEdits"]["deviceNodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["path"].as_str().unwrap())
        .collect();
    assert_eq!(
        nodes,
        [
            "/dev/nvidia0",
            "/dev/nvidia-caps/nvidia-cap93",
            "/dev/nvidia-caps/nvidia-cap94"
        ]
    );
    let checkpoint: Value =
        serde_json::from_str(&std::fs::read_to_string(dra.checkpoint()).unwrap()).unwrap();
    assert_eq!(
        checkpoint["claims"]["uid-s"]["devices"][0].get("timeSlice"),
        None,
        "a MIG device takes the strategy and sets no interval"
    );
    dra.api.put_claim(claim(
        "paced",
        "uid-p",
        "gpu-0-mig-3g40gb-9-4",
        config("MigDeviceConfig"),
    ));
    assert_eq!(
        dra.prepare("paced", "uid-p").await.claims["uid-p"].error,
        "opaque config for request \"gpu\": sharing.timeSlicingConfig cannot configure a MIG \
         device (a time-slice interval applies to a full GPU); leave it out of the \
         MigDeviceConfig"
    );
    assert_eq!(dra.nvidia_smi_runs(), Vec::<String>::new());

    // A sibling MIG device of the same GPU goes to another claim; the wrong config kind and
    // MPS are that claim's errors.
    dra.api
        .put_claim(claim("mid", "uid-m", "gpu-0-mig-2g20gb-14-2", json!([])));
    assert_eq!(dra.prepare("mid", "uid-m").await.claims["uid-m"].error, "");
    dra.api.put_claim(claim(
        "wrong",
        "uid-w",
        "gpu-0-mig-3g40gb-9-4",
        config("GpuConfig"),
    ));
    assert_eq!(
        dra.prepare("wrong", "uid-w").await.claims["uid-w"].error,
        "opaque config for request \"gpu\": kind \"GpuConfig\" cannot configure a MIG device \
         (use MigDeviceConfig)"
    );
}

fn time_slicing(interval: &str) -> Value {
    json!([{"source": "FromClass", "requests": [], "opaque": {"driver": DRIVER, "parameters": {
        "apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
        "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": interval}}}}}])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claims_time_slice_interval_is_set_with_nvidia_smi_and_put_back() {
    let mut dra = Dra::new("dgx-h100");
    dra.start();
    dra.register().await;
    let smi = dra.path("nvidia-smi");
    let smi = smi.to_str().unwrap();
    let (gpu0, gpu1, gpu2) = (dra.uuid(0), dra.uuid(1), dra.uuid(2));

    dra.put_configured_claim("long", "uid-l", &["gpu-2"], time_slicing("Long"));
    let answer = dra.prepare("long", "uid-l").await;
    assert_eq!(answer.claims["uid-l"].error, "");
    assert_eq!(
        dra.nvidia_smi_runs(),
        [format!("compute-policy -i {gpu2} --set-timeslice 3")]
    );
    // Prepared again (the kubelet's retry): nothing runs.
    assert_eq!(dra.prepare("long", "uid-l").await.claims["uid-l"].error, "");
    assert_eq!(dra.nvidia_smi_runs(), Vec::<String>::new());

    // A reboot empties the CDI folder and the compute policy: both come back.
    dra.stop();
    std::fs::remove_file(dra.spec_file("uid-l")).unwrap();
    dra.start();
    dra.register().await;
    // The first try fails: no spec, so the kubelet's retry sets the interval again.
    std::fs::write(dra.path("nvidia-smi.fail"), format!("{gpu2}\n")).unwrap();
    let failed = dra.prepare("long", "uid-l").await;
    assert!(
        failed.claims["uid-l"]
            .error
            .starts_with(&format!("GPU {gpu2}: ")),
        "{failed:?}"
    );
    assert!(!dra.spec_file("uid-l").exists());
    std::fs::remove_file(dra.path("nvidia-smi.fail")).unwrap();
    assert_eq!(dra.prepare("long", "uid-l").await.claims["uid-l"].error, "");
    assert!(dra.spec_file("uid-l").exists());
    assert_eq!(
        dra.nvidia_smi_runs(),
        [
            format!("compute-policy -i {gpu2} --set-timeslice 3"),
            format!("compute-policy -i {gpu2} --set-timeslice 3"),
        ]
    );

    // Unprepare, without the claim object: the GPU goes back to the default.
    dra.api.delete_claim("ns", "long");
    assert_eq!(dra.unprepare("long", "uid-l").await, "");
    assert_eq!(
        dra.nvidia_smi_runs(),
        [format!("compute-policy -i {gpu2} --set-timeslice 0")]
    );

    // The second GPU of a claim refuses: the claim gets nothing, its first GPU goes back.
    std::fs::write(dra.path("nvidia-smi.fail"), format!("{gpu1}\n")).unwrap();
    dra.put_configured_claim("pair", "uid-p", &["gpu-0", "gpu-1"], time_slicing("Medium"));
    let refused = dra.prepare("pair", "uid-p").await;
    assert_eq!(
        refused.claims["uid-p"].error,
        format!(
            "GPU {gpu1}: setting the time-slice interval Medium with `{smi} compute-policy -i \
             {gpu1} --set-timeslice 2` failed: exit status: 3: Failed to set the timeslice for \
             GPU {gpu1}: Not Supported"
        )
    );
    assert!(refused.claims["uid-p"].devices.is_empty());
    assert_eq!(
        dra.nvidia_smi_runs(),
        [
            format!("compute-policy -i {gpu0} --set-timeslice 2"),
            format!("compute-policy -i {gpu1} --set-timeslice 2"),
            format!("compute-policy -i {gpu0} --set-timeslice 0"),
        ]
    );
    assert!(!dra.spec_file("uid-p").exists());
    let checkpoint: Value =
        serde_json::from_str(&std::fs::read_to_string(dra.checkpoint()).unwrap()).unwrap();
    assert_eq!(checkpoint["claims"], json!({}));

    // A reset that fails on unprepare is the claim's error, and the claim stays prepared
    // until the kubelet's retry succeeds.
    std::fs::remove_file(dra.path("nvidia-smi.fail")).unwrap();
    dra.put_configured_claim("short", "uid-s", &["gpu-1"], time_slicing("Short"));
    assert_eq!(
        dra.prepare("short", "uid-s").await.claims["uid-s"].error,
        ""
    );
    std::fs::write(dra.path("nvidia-smi.fail"), format!("{gpu1}\n")).unwrap();
    assert_eq!(
        dra.unprepare("short", "uid-s").await,
        format!(
            "GPU {gpu1}: setting the time-slice interval Default with `{smi} compute-policy -i \
             {gpu1} --set-timeslice 0` failed: exit status: 3: Failed to set the timeslice for \
             GPU {gpu1}: Not Supported"
        )
    );
    assert!(dra.spec_file("uid-s").exists());
    std::fs::remove_file(dra.path("nvidia-smi.fail")).unwrap();
    assert_eq!(dra.unprepare("short", "uid-s").await, "");
    assert!(!dra.spec_file("uid-s").exists());
    assert_eq!(
        dra.nvidia_smi_runs(),
        [
            format!("compute-policy -i {gpu1} --set-timeslice 1"),
            format!("compute-policy -i {gpu1} --set-timeslice 0"),
            format!("compute-policy -i {gpu1} --set-timeslice 0"),
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_plugin_in_another_container_follows_the_dra_checkpoint() {
    let dra = Dra::new("pcie-4gpu");
    let mut kubelet = fake_kubelet::FakeKubelet::start(dra.node.dir.path()).await;
    let socket = kubelet.socket();
    let checkpoint = dra.checkpoint();
    std::fs::create_dir_all(checkpoint.parent().unwrap()).unwrap();
    let args = [
        "device-plugin",
        "--kubelet-socket",
        socket.to_str().unwrap(),
        "--dra-checkpoint",
        checkpoint.to_str().unwrap(),
        "--kmsg",
        "",
    ];
    let log = std::fs::File::create(dra.path("gpud.log")).unwrap();
    let mut plugin = dra.node.gpud(&args).stderr(log).spawn().unwrap();
    let registration = kubelet.next_registration(15).await;
    let mut client = kubelet.plugin(&registration.endpoint).await;
    let mut stream = fake_kubelet::list_and_watch(&mut client).await;
    let ids = |list: &gpud::proto::deviceplugin::ListAndWatchResponse| -> Vec<String> {
        list.devices.iter().map(|d| d.id.clone()).collect()
    };
    let all = ids(&fake_kubelet::next_list(&mut stream, 10).await);
    assert_eq!(all.len(), 4);

    // What `gpud dra` writes when it prepares GPU 2 for a claim.
    let held = dra.uuid(2);
    let written = json!({"version": 1, "claims": {"uid-1": {"namespace": "ns", "name": "c1",
        "devices": [{"requestNames": ["gpu"], "pool": "test-node", "device": "gpu-2",
            "uuid": held, "gpuUuid": held,
            "cdiDeviceIds": ["k8s.gpu.nvidia.com/claim=uid-1-gpu-2"]}]}}});
    std::fs::write(&checkpoint, written.to_string()).unwrap();
    let without = ids(&fake_kubelet::next_list(&mut stream, 10).await);
    let expected: Vec<String> = all.iter().filter(|id| **id != held).cloned().collect();
    assert_eq!(without, expected);

    // Unprepared: the claim leaves the checkpoint and the GPU comes back.
    std::fs::write(&checkpoint, json!({"version": 1, "claims": {}}).to_string()).unwrap();
    assert_eq!(ids(&fake_kubelet::next_list(&mut stream, 10).await), all);
    let _ = plugin.kill();
    let _ = plugin.wait();
}

#[test]
fn a_missing_node_name_or_a_bad_driver_name_is_a_usage_error() {
    let node = Node::new("dgx-h100");
    let out = node
        .gpud(&["dra", "--check-config"])
        .env_remove("NODE_NAME")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "gpud: the DRA plugin needs the node name (--node-name or NODE_NAME)\n"
    );
    let out = node.run(&["dra", "--dra-driver-name", "GPU_Driver", "--check-config"]);
    assert_eq!(out.status.code(), Some(64));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(
            "--dra-driver-name \"GPU_Driver\": a DRA driver name must be a DNS subdomain"
        ),
        "{stderr}"
    );
    assert_eq!(node.run(&["dra", "--check-config"]).status.code(), Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removed_sockets_are_served_again_and_the_plugin_registers_anew() {
    let mut dra = Dra::new("pcie-4gpu");
    dra.start();
    dra.register().await;
    std::fs::remove_file(dra.plugin_socket()).unwrap();
    std::fs::remove_file(dra.registration_socket()).unwrap();
    let info = dra.register().await;
    assert_eq!(info.endpoint, dra.plugin_socket().to_str().unwrap());
    dra.put_claim("c1", "uid-1", &["gpu-0"]);
    assert_eq!(
        dra.prepare("c1", "uid-1").await.claims["uid-1"].devices,
        [prepared("uid-1", "gpu-0")]
    );
}

/// The fake MPS control binary's record, without the health probes (their number depends on
/// timing).
fn mps_recorded(dra: &Dra) -> Vec<String> {
    std::fs::read_to_string(dra.path("bin/mps-record.log"))
        .unwrap_or_default()
        .lines()
        .filter(|l| !l.starts_with("get_default_active_thread_percentage "))
        .map(str::to_owned)
        .collect()
}

/// The compute modes the simulated driver holds, by GPU UUID (DEFAULT ones left out).
fn compute_modes(dra: &Dra) -> BTreeMap<String, u64> {
    let Ok(text) = std::fs::read_to_string(dra.node.state_path()) else {
        return BTreeMap::new();
    };
    let state: Value = serde_json::from_str(&text).unwrap();
    state["compute_modes"]
        .as_object()
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k.clone(), v.as_u64().unwrap()))
                .filter(|(_, v)| *v != 0)
                .collect()
        })
        .unwrap_or_default()
}

fn mps_sharing(mps_config: Value) -> Value {
    json!([{"source": "FromClaim", "requests": [], "opaque": {"driver": DRIVER, "parameters": {
        "apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
        "sharing": {"strategy": "MPS", "mpsConfig": mps_config}}}}])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mps_claims_get_one_control_daemon_each_restarted_and_stopped_with_the_claim() {
    let mut dra = Dra::new("dgx-h100");
    dra.start();
    dra.register().await;
    let (gpu0, gpu1, gpu2) = (dra.uuid(0), dra.uuid(1), dra.uuid(2));
    let plugins = dra.path("plugins/gpu.nvidia.com/mps");
    let mps_dir = |uid: &str| plugins.join(uid);
    let env = |uid: &str, gpus: &str| {
        let dir = mps_dir(uid);
        format!(
            "CUDA_MPS_LOG_DIRECTORY={0}/log CUDA_MPS_PIPE_DIRECTORY={0}/pipe \
             CUDA_VISIBLE_DEVICES={gpus}",
            dir.display()
        )
    };
    let (env_a, env_b) = (env("uid-a", &gpu0), env("uid-b", &format!("{gpu1},{gpu2}")));
    let lines = |env: &str, commands: &[&str]| -> Vec<String> {
        commands.iter().map(|c| format!("{c} | {env}")).collect()
    };
    let start_a = lines(
        &env_a,
        &[
            "-d",
            "set_default_device_pinned_mem_limit 0 10240M",
            "set_default_active_thread_percentage 50",
        ],
    );
    let start_b = lines(
        &env_b,
        &[
            "-d",
            "set_default_device_pinned_mem_limit 0 1024M",
            "set_default_device_pinned_mem_limit 1 2048M",
            "set_default_active_thread_percentage 25",
        ],
    );

    // Two claims on different GPUs: two daemons, each over its claim's GPUs only.
    dra.put_configured_claim(
        "a",
        "uid-a",
        &["gpu-0"],
        mps_sharing(json!({"defaultActiveThreadPercentage": 50,
            "defaultPinnedDeviceMemoryLimit": "10Gi"})),
    );
    dra.put_configured_claim(
        "b",
        "uid-b",
        &["gpu-1", "gpu-2"],
        mps_sharing(json!({"defaultActiveThreadPercentage": 25,
            "defaultPinnedDeviceMemoryLimit": "1Gi",
            "defaultPerDevicePinnedMemoryLimit": {gpu2.clone(): "2Gi"}})),
    );
    assert_eq!(dra.prepare("a", "uid-a").await.claims["uid-a"].error, "");
    assert_eq!(dra.prepare("b", "uid-b").await.claims["uid-b"].error, "");
    assert_eq!(
        mps_recorded(&dra),
        [start_a.clone(), start_b.clone()].concat()
    );
    let exclusive: BTreeMap<String, u64> = [&gpu0, &gpu1, &gpu2]
        .iter()
        .map(|u| ((*u).clone(), 3))
        .collect();
    assert_eq!(
        compute_modes(&dra),
        exclusive,
        "EXCLUSIVE_PROCESS on the claims' GPUs"
    );
    for uid in ["uid-a", "uid-b"] {
        for dir in ["pipe", "shm", "log"] {
            assert!(mps_dir(uid).join(dir).is_dir(), "{uid}/{dir}");
        }
    }

    // The workload's CDI edits point at its claim's daemon.
    let spec: Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(dra.spec_file("uid-b")).unwrap()).unwrap();
    let devices = spec["devices"].as_array().unwrap();
    assert_eq!(devices.len(), 2);
    let dir_b = mps_dir("uid-b");
    for device in devices {
        let edits = &device["containerEdits"];
        assert_eq!(
            edits["env"],
            json!(["CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps"])
        );
        assert_eq!(
            edits["mounts"],
            json!([
                {"hostPath": format!("{}/shm", dir_b.display()), "containerPath": "/dev/shm",
                 "options": ["rw", "nosuid", "nodev", "bind"]},
                {"hostPath": format!("{}/pipe", dir_b.display()), "containerPath": "/tmp/nvidia-mps",
                 "options": ["rw", "nosuid", "nodev", "bind"]},
            ])
        );
    }

    // Prepared again (the kubelet's retry): the daemon answers, no second one starts.
    assert_eq!(dra.prepare("a", "uid-a").await.claims["uid-a"].error, "");
    assert_eq!(
        mps_recorded(&dra),
        [start_a.clone(), start_b.clone()].concat()
    );

    // A daemon that dies mid-run is started again by the probe. (The pid file goes too: a
    // killed daemon whose parent gpud is gone stays a zombie here, which `kill -0` still sees.)
    let kill = |uid: &str| {
        let pidfile = mps_dir(uid).join("pipe/fake-daemon.pid");
        let pid = std::fs::read_to_string(&pidfile).unwrap();
        // First the file, so a restart in between keeps its own.
        std::fs::remove_file(pidfile).unwrap();
        std::process::Command::new("kill")
            .arg(pid.trim())
            .status()
            .unwrap();
    };
    kill("uid-b");
    let restarted_b = [start_a.clone(), start_b.clone(), start_b.clone()].concat();
    dra.until("the restarted daemon of claim b", || {
        (mps_recorded(&dra) == restarted_b).then_some(())
    });

    // Across a gpud restart a running daemon is found again and a dead one started again.
    dra.stop();
    kill("uid-a");
    dra.start();
    dra.register().await;
    assert_eq!(dra.prepare("a", "uid-a").await.claims["uid-a"].error, "");
    assert_eq!(dra.prepare("b", "uid-b").await.claims["uid-b"].error, "");
    let restarted_a = [restarted_b.clone(), start_a.clone()].concat();
    assert_eq!(mps_recorded(&dra), restarted_a);

    // Unprepare, without the claim object: `quit`, compute mode DEFAULT, folders gone; the
    // other claim's daemon and GPUs are untouched.
    dra.api.delete_claim("ns", "a");
    assert_eq!(dra.unprepare("a", "uid-a").await, "");
    assert_eq!(
        mps_recorded(&dra),
        [restarted_a, lines(&env_a, &["quit"])].concat()
    );
    assert!(!mps_dir("uid-a").exists());
    let only_b: BTreeMap<String, u64> = [&gpu1, &gpu2].iter().map(|u| ((*u).clone(), 3)).collect();
    assert_eq!(compute_modes(&dra), only_b);
    assert_eq!(dra.unprepare("b", "uid-b").await, "");
    assert_eq!(compute_modes(&dra), BTreeMap::new());
    assert!(!dra.path("plugins/gpu.nvidia.com/mps/uid-b").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_mps_config_is_the_claims_error_and_starts_nothing() {
    let mut dra = Dra::new("dgx-h100");
    dra.start();
    dra.register().await;
    dra.put_configured_claim(
        "hot",
        "uid-h",
        &["gpu-0"],
        mps_sharing(json!({"defaultActiveThreadPercentage": 150})),
    );
    assert_eq!(
        dra.prepare("hot", "uid-h").await.claims["uid-h"].error,
        "opaque config for request \"gpu\": sharing.mpsConfig.defaultActiveThreadPercentage 150 \
         is not a percentage from 1 to 100"
    );
    dra.put_configured_claim(
        "stray",
        "uid-s",
        &["gpu-0"],
        mps_sharing(json!({"defaultPerDevicePinnedMemoryLimit": {"GPU-nope": "1Gi"}})),
    );
    assert_eq!(
        dra.prepare("stray", "uid-s").await.claims["uid-s"].error,
        "sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit[\"GPU-nope\"] names no GPU of the \
         claim (use a GPU UUID, or an index from 0 to 0)"
    );
    assert_eq!(mps_recorded(&dra), Vec::<String>::new());
    assert_eq!(compute_modes(&dra), BTreeMap::new());
    assert!(!dra.spec_file("uid-h").exists());
    assert!(!dra.path("plugins/gpu.nvidia.com/mps").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mps_on_a_mig_device_is_refused_to_the_claim() {
    let mut dra = Dra::new("a100-mig");
    mig_caps(&dra, 8, 0, 93, 94);
    dra.start();
    dra.register().await;
    let config = json!([{"source": "FromClaim", "requests": ["gpu"], "opaque": {"driver": DRIVER,
        "parameters": {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "MigDeviceConfig",
            "sharing": {"strategy": "MPS"}}}}]);
    dra.put_configured_claim("mig", "uid-m", &["gpu-0-mig-1g10gb-19-1"], config);
    assert_eq!(
        dra.prepare("mig", "uid-m").await.claims["uid-m"].error,
        "opaque config for request \"gpu\": sharing.strategy MPS on a MIG device is not \
         supported by gpud (its control daemon would put the whole GPU in compute mode \
         EXCLUSIVE_PROCESS under the other MIG devices' users); allocate a full GPU for MPS or \
         leave sharing out"
    );
    assert_eq!(mps_recorded(&dra), Vec::<String>::new());
    assert!(!dra.spec_file("uid-m").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mps_is_refused_on_a_gpu_whose_compute_mode_someone_else_set() {
    let mut dra = Dra::new("dgx-h100");
    let gpu1 = dra.uuid(1);
    // The device plugin's MPS daemon (or an administrator) put GPU 1 in EXCLUSIVE_PROCESS.
    let state = json!({"version": 1, "gpus": {}, "compute_modes": {&gpu1: 3}});
    std::fs::write(dra.node.state_path(), state.to_string()).unwrap();
    dra.start();
    dra.register().await;
    dra.put_configured_claim("taken", "uid-t", &["gpu-1"], mps_sharing(json!({})));
    assert_eq!(
        dra.prepare("taken", "uid-t").await.claims["uid-t"].error,
        format!(
            "GPU {gpu1} is in compute mode EXCLUSIVE_PROCESS, not DEFAULT: another MPS control \
             daemon (the device plugin's sharing.mps) or an administrator set it, and this \
             claim's daemon would take the GPU from under it; give the claim other GPUs, or set \
             this one back to DEFAULT"
        )
    );
    assert_eq!(mps_recorded(&dra), Vec::<String>::new());
    assert_eq!(compute_modes(&dra), BTreeMap::from([(gpu1, 3)]));
    assert!(!dra.spec_file("uid-t").exists());
}

/// Every file under `dir`, recursively.
fn files_under(dir: &std::path::Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(files_under(&path));
        } else {
            out.push(path);
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claim_uids_that_are_not_uids_never_become_paths() {
    let mut dra = Dra::new("dgx-h100");
    dra.start();
    dra.register().await;
    for (n, uid) in ["../../../outside/pwned", "a/b", "nul\0uid", ""]
        .iter()
        .enumerate()
    {
        let name = format!("evil{n}");
        dra.put_claim(&name, uid, &["gpu-1"]);
        let answer = dra.prepare(&name, uid).await;
        let error = &answer.claims[*uid].error;
        assert!(
            error.starts_with("claim UID ")
                && error.ends_with(" is not a UID (letters, digits and '-', at most 64); refused"),
            "{uid:?}: {error}"
        );
        assert!(answer.claims[*uid].devices.is_empty());
        let unprepared = dra.unprepare(&name, uid).await;
        assert!(unprepared.contains("is not a UID"), "{uid:?}: {unprepared}");
    }
    // Nothing was written anywhere under the node's folder but what a well-formed claim writes:
    // no spec, no MPS folder, no file outside the CDI root.
    let written: Vec<PathBuf> = files_under(dra.node.dir.path())
        .into_iter()
        .filter(|p| p.to_string_lossy().contains("pwned") || p.to_string_lossy().contains("claim_"))
        .collect();
    assert_eq!(written, Vec::<PathBuf>::new());
    // A real UID still works after the refusals.
    dra.put_claim("good", "2f1c1d0e-0a4b-4c7e-9a57-6f3b1c2d3e4f", &["gpu-2"]);
    let answer = dra
        .prepare("good", "2f1c1d0e-0a4b-4c7e-9a57-6f3b1c2d3e4f")
        .await;
    assert_eq!(
        answer.claims["2f1c1d0e-0a4b-4c7e-9a57-6f3b1c2d3e4f"].error,
        ""
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_with_more_results_than_the_api_allows_is_refused_whole() {
    let mut dra = Dra::new("dgx-h100");
    dra.start();
    dra.register().await;
    let devices: Vec<String> = (0..33).map(|i| format!("gpu-{}", i % 8)).collect();
    let names: Vec<&str> = devices.iter().map(String::as_str).collect();
    dra.put_claim("huge", "uid-huge", &names);
    let answer = dra.prepare("huge", "uid-huge").await;
    assert_eq!(
        answer.claims["uid-huge"].error,
        "ResourceClaim ns/huge has 33 results for gpu.nvidia.com, over the API's limit of 32; \
         refused"
    );
    assert!(!dra.spec_file("uid-huge").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_claims_in_one_call_are_all_prepared() {
    let mut dra = Dra::new("dgx-h100");
    dra.start();
    dra.register().await;
    // 64 claims with admin access would not clash; plain claims on 8 GPUs do after the eighth,
    // so each of 8 GPUs gets one claim and 56 more claims ask for GPUs already held.
    let uids: Vec<String> = (0..64).map(|i| format!("uid-{i}")).collect();
    for (i, uid) in uids.iter().enumerate() {
        dra.put_claim(&format!("c{i}"), uid, &[&format!("gpu-{}", i % 8)]);
    }
    let request = NodePrepareResourcesRequest {
        claims: uids
            .iter()
            .enumerate()
            .map(|(i, uid)| fake_dra_kubelet::claim_v1("ns", &format!("c{i}"), uid))
            .collect(),
    };
    let answer = fake_dra_kubelet::prepare_v1(&dra.plugin_socket(), request).await;
    assert_eq!(answer.claims.len(), 64);
    let prepared: Vec<&String> = uids
        .iter()
        .filter(|uid| answer.claims[*uid].error.is_empty())
        .collect();
    // In the kubelet's order: the first claim on each GPU gets it, the rest are refused.
    assert_eq!(prepared, uids.iter().take(8).collect::<Vec<_>>());
    for uid in &uids[8..] {
        assert!(
            answer.claims[uid].error.contains("is held by claim ns/"),
            "{uid}: {}",
            answer.claims[uid].error
        );
    }
}

const SLICES: &str = "/apis/resource.k8s.io/v1/resourceslices";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conflict_on_a_slice_update_lists_again_and_converges() {
    let mut dra = Dra::new("dgx-h100");
    dra.start();
    dra.register().await;
    let before = dra.slices_when("slices", |_| true);
    let rule = dra
        .api
        .refuse(Rule::prefix("PUT", &format!("{SLICES}/"), Fault::Conflict).times(1));
    let since = Instant::now();
    dra.node.inject("xid 3 79");
    let tainted = dra.slices_when("the XID taint", |s| {
        device(s, "gpu-3").get("taints").is_some()
    });
    assert_eq!(dra.api.refused_by(rule), 1);
    assert_eq!(tainted.len(), before.len());
    assert!(generation(&tainted) > generation(&before));
    assert_eq!(
        device(&tainted, "gpu-3")["taints"],
        json!([{"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoSchedule"}])
    );
    // After the refusal: a fresh list, then the update from it, which lands. The fake records
    // an answer's status once the answer is written, which may be just after the slice we
    // saw changed: wait until the update after the refusal has one.
    let deadline = Instant::now() + Duration::from_secs(10);
    let (calls, at) = loop {
        let calls: Vec<fake_api::Recorded> = dra
            .api
            .log()
            .into_iter()
            .filter(|r| r.at >= since && r.path.starts_with(SLICES) && !r.path.contains("watch="))
            .collect();
        let at = calls
            .iter()
            .position(|r| r.method == "PUT" && r.status == 409)
            .unwrap();
        let answered = calls[at + 1..]
            .iter()
            .find(|r| r.method == "PUT")
            .is_some_and(|r| r.status != 0);
        if answered {
            break (calls, at);
        }
        assert!(
            Instant::now() < deadline,
            "the update after the refusal got no answer"
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    let after: Vec<(&str, u16)> = calls[at + 1..]
        .iter()
        .map(|r| (r.method.as_str(), r.status))
        .collect();
    // Exactly one list and one update after the refusal (the two that follow it).
    assert_eq!(after[..2], [("GET", 200), ("PUT", 200)], "{calls:?}");
    let converged = calls[at + 2].at - calls[at].at;
    eprintln!("409 on a slice update: a list and an update, {converged:?} after the refusal");
    // gpud says the slices are back after the update's answer: wait for the line.
    let log = dra.log_when("ResourceSlices published again");
    assert!(
        log.contains("Cannot publish the node's ResourceSlices"),
        "{log}"
    );
    assert!(log.contains("the object has been modified"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slice_watch_ended_by_410_gone_lists_again_without_a_storm() {
    let mut dra = Dra::new("dgx-h100");
    let rule = dra
        .api
        .refuse(Rule::exact("GET", SLICES, Fault::GoneEvent).query("watch=true"));
    dra.start();
    dra.register().await;
    let before = dra.slices_when("slices", |_| true);
    dra.until("a refused watch", || {
        (dra.api.refused_by(rule) >= 1).then_some(())
    });
    let watches_of = |api: &FakeApi| -> Vec<fake_api::Recorded> {
        api.requests_to("GET", SLICES)
            .into_iter()
            .filter(|r| r.path.contains("watch=true"))
            .collect()
    };
    // Four refused watches: the pauses between them are the backoff's (0.5, 1, 2 s, and up to
    // a quarter more), so they span at least 3.5 s, and each brings at most two lists (one
    // after the failure, one once the next watch is open) besides the publisher's own.
    let watches = dra.until("four refused watches", || {
        let watches = watches_of(&dra.api);
        (watches.len() >= 4).then_some(watches)
    });
    let (first, fourth) = (watches[0].at, watches[3].at);
    let lists = dra
        .api
        .requests_to("GET", SLICES)
        .iter()
        .filter(|r| r.at >= first && r.at <= fourth && !r.path.contains("watch=true"))
        .count();
    eprintln!(
        "410 on every slice watch: 4 watches in {:?}, {lists} lists",
        fourth - first
    );
    assert!(
        fourth - first >= Duration::from_millis(3500),
        "{:?}",
        fourth - first
    );
    assert!(lists <= 2 * 4 + 2, "{lists} lists for 4 watches");
    let log = dra.log();
    assert!(log.contains("ResourceSlice watch failed"), "{log}");
    assert!(log.contains("too old resource version"), "{log}");

    // Watches are answered again; the kubelet wipes the node's slices: gpud publishes them
    // again once its watch is back.
    dra.api.allow_all();
    let wiped = Instant::now();
    dra.api.wipe_slices("test-node");
    let deadline = Instant::now() + Duration::from_secs(40);
    let again = loop {
        let slices: Vec<Value> = dra.api.slices().into_values().collect();
        if !slices.is_empty() {
            break slices;
        }
        assert!(
            Instant::now() < deadline,
            "not published again:\n{}",
            dra.log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    eprintln!("410: published again {:?} after the wipe", wiped.elapsed());
    assert_eq!(
        render(&again).replace(&format!("\"generation\": {}", generation(&again)), "G"),
        render(&before).replace(&format!("\"generation\": {}", generation(&before)), "G")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registration_the_kubelet_refuses_is_logged_unready_and_a_later_one_takes() {
    let mut dra = Dra::new("pcie-4gpu");
    let port = common::http::free_port();
    let address = format!("127.0.0.1:{port}");
    dra.applet = vec!["dra".into(), "--health-address".into(), address];
    dra.start();
    let socket = dra.registration_socket();
    dra.until("the registration socket", || {
        std::os::unix::net::UnixStream::connect(&socket).ok()
    });
    common::http::wait_for(port, "/readyz", 15, |a| a.status == 200);
    // What a kubelet says of a plugin whose name another plugin already registered.
    let why = "RegisterPlugin error -- plugin name gpu.nvidia.com already registered";
    let answer = fake_dra_kubelet::refuse_registration(&socket, why).await;
    // grpc-message is percent-encoded on the wire.
    assert_eq!(
        answer.replace("%20", " "),
        format!("13 the kubelet refused the DRA plugin: {why}")
    );
    let log = dra.log_when("The kubelet refused the DRA plugin");
    assert!(
        log.contains(&format!(
            "The kubelet refused the DRA plugin; claims cannot reach gpud until it registers it \
             (the kubelet tries again on its own) driver=gpu.nvidia.com error={why}"
        )),
        "{log}"
    );
    let unready = common::http::wait_for(port, "/readyz", 15, |a| a.status == 503);
    assert!(
        unready.body.contains(&format!(
            "dra not ready: the kubelet refused to register the DRA plugin gpu.nvidia.com: \
             {why}; fix what the kubelet names (its log has more), it tries again on its own"
        )),
        "{}",
        unready.body
    );
    // The kubelet tries again, on the socket as it is, and takes the plugin: ready, and
    // claims are served.
    let info = fake_dra_kubelet::register(&socket).await;
    assert_eq!(info.endpoint, dra.plugin_socket().to_str().unwrap());
    common::http::wait_for(port, "/readyz", 15, |a| a.status == 200);
    dra.log_when("The kubelet registered the DRA plugin");
    dra.put_claim("c1", "uid-1", &["gpu-0"]);
    assert_eq!(
        dra.prepare("c1", "uid-1").await.claims["uid-1"].devices,
        [prepared("uid-1", "gpu-0")]
    );
}

const CLAIMS: &str = "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims";

/// Prepares claim `name` once, while the API server answers its read with `fault` (once); the
/// claim's error, and how long the answer took.
async fn prepare_refused(dra: &Dra, name: &str, uid: &str, fault: Fault) -> (String, Duration) {
    dra.put_claim(name, uid, &["gpu-1"]);
    let rule = dra
        .api
        .refuse(Rule::exact("GET", &format!("{CLAIMS}/{name}"), fault).times(1));
    let asked = Instant::now();
    let answer = dra.prepare(name, uid).await;
    let took = asked.elapsed();
    assert_eq!(dra.api.refused_by(rule), 1);
    let claim = &answer.claims[uid];
    assert!(claim.devices.is_empty(), "{claim:?}");
    (claim.error.clone(), took)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claim_reads_the_api_server_refuses_fail_the_claim_clearly_and_in_time_then_prepare() {
    let mut dra = Dra::new("pcie-4gpu");
    dra.start();
    dra.register().await;
    // The kubelet gives NodePrepareResources 45 s: every answer must come well within it.
    let kubelet_deadline = Duration::from_secs(45);

    let (error, took) = prepare_refused(&dra, "forbidden", "uid-403", Fault::Forbidden).await;
    assert_eq!(
        error,
        "reading ResourceClaim ns/forbidden: 403 Forbidden: resourceclaims.resource.k8s.io \
         \"forbidden\" is forbidden: User \"system:serviceaccount:gpu-operator:gpud\" cannot get \
         resource \"resourceclaims\" in API group \"resource.k8s.io\" in the namespace \"ns\" \
         (forbidden by RBAC: gpud's service account needs this verb on this resource; check the \
         Role or ClusterRole bound to it)"
    );
    assert!(took < Duration::from_secs(5), "{took:?}");

    let (error, took) =
        prepare_refused(&dra, "throttled", "uid-429", Fault::TooManyRequests(7)).await;
    assert_eq!(
        error,
        "reading ResourceClaim ns/throttled: 429 TooManyRequests: Too many requests, please try \
         again later. (the API server asks to wait 7s before the next call)"
    );
    // The claim's answer does not wait out the Retry-After: the kubelet retries the prepare.
    assert!(took < Duration::from_secs(5), "{took:?}");

    let stall = Fault::Stall(Duration::from_secs(60));
    let (error, took) = prepare_refused(&dra, "stalled", "uid-stall", stall).await;
    assert_eq!(
        error,
        "reading ResourceClaim ns/stalled: no answer from the API server within 10s"
    );
    eprintln!("a stalled claim read: the prepare answered after {took:?}");
    assert!(took >= Duration::from_secs(10), "{took:?}");
    assert!(took < kubelet_deadline, "{took:?}");

    // gpud's log names each claim and why.
    let log = dra.log();
    for (claim, refusal) in [
        ("ns/forbidden", "403 Forbidden"),
        ("ns/throttled", "429 TooManyRequests"),
        ("ns/stalled", "no answer from the API server within 10s"),
    ] {
        assert!(
            log.lines().any(|l| l.contains("Cannot prepare claim")
                && l.contains(&format!("claim={claim}"))
                && l.contains(refusal)),
            "{claim}: {log}"
        );
    }

    // The refusals are over (each rule fired once): the kubelet's next try prepares each.
    for (name, uid) in [
        ("forbidden", "uid-403"),
        ("throttled", "uid-429"),
        ("stalled", "uid-stall"),
    ] {
        let answer = dra.prepare(name, uid).await;
        assert_eq!(answer.claims[uid].error, "", "{name}");
        assert_eq!(
            answer.claims[uid].devices,
            [prepared(uid, "gpu-1")],
            "{name}"
        );
        assert_eq!(dra.unprepare(name, uid).await, "", "{name}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_gpud_serves_the_plugin_socket_it_took_over_and_registers_under_its_own() {
    let mut dra = Dra::new("dgx-h100");
    dra.start();
    dra.register().await;
    dra.put_claim("c1", "uid-1", &["gpu-3"]);
    assert_eq!(dra.prepare("c1", "uid-1").await.claims["uid-1"].error, "");
    dra.log_when("All subsystems ready");
    // The kubelet's health stream on the old process, with GPU 5 failed.
    use gpud::proto::drahealth_v1::{HealthStatus, NodeWatchResourcesRequest};
    let health_of = |list: &gpud::proto::drahealth_v1::NodeWatchResourcesResponse| {
        list.devices
            .iter()
            .filter(|d| d.health != HealthStatus::Healthy as i32)
            .map(|d| d.device.as_ref().unwrap().device_name.clone())
            .collect::<Vec<_>>()
    };
    let plugin_socket = dra.plugin_socket();
    let watch = || async {
        fake_dra_kubelet::health(&plugin_socket)
            .await
            .node_watch_resources(NodeWatchResourcesRequest {})
            .await
            .unwrap()
            .into_inner()
    };
    let mut health = watch().await;
    next_health(&mut health).await;
    dra.node.inject("xid 5 79");
    while health_of(&next_health(&mut health).await) != ["gpu-5"] {}
    /// The old process, killed if the test ends early (it waits for SIGTERM after handing over).
    struct Old(std::process::Child);
    impl Drop for Old {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let mut old = Old(dra.gpud.take().unwrap());

    dra.start();
    let registry = dra.path("plugins_registry");
    let own = dra.until("the new process's registration socket", || {
        std::fs::read_dir(&registry)
            .unwrap()
            .filter_map(Result::ok)
            .map(|entry| entry.path())
            .find(|path| {
                let name = path.file_name().unwrap().to_string_lossy().into_owned();
                name.starts_with("gpu.nvidia.com-reg-")
                    && std::os::unix::net::UnixStream::connect(path).is_ok()
            })
    });
    let info = fake_dra_kubelet::register(&own).await;
    assert_eq!(info.endpoint, dra.plugin_socket().to_str().unwrap());
    // A call while both run is answered, by one or the other, from the one checkpoint.
    let during = dra.prepare("c1", "uid-1").await;
    assert_eq!(during.claims["uid-1"].devices, [prepared("uid-1", "gpu-3")]);
    dra.log_when("Took over: the gpud taken over from has finished");

    // The old process's stream ended when it finished; the kubelet opens it again and the
    // new process's first list withdraws no healthy device.
    assert!(
        !matches!(
            tokio::time::timeout(Duration::from_secs(10), health.message())
                .await
                .unwrap(),
            Ok(Some(_))
        ),
        "the old process's health stream ends"
    );
    let mut health = watch().await;
    assert_eq!(health_of(&next_health(&mut health).await), ["gpu-5"]);

    common::send_signal(&old.0, "TERM");
    assert_eq!(old.0.wait().unwrap().code(), Some(0));
    assert!(
        dra.plugin_socket().exists(),
        "the plugin socket is the new process's now"
    );
    assert!(
        !dra.registration_socket().exists(),
        "the old process removed its own registration socket"
    );
    assert!(own.exists());
    dra.put_claim("c2", "uid-2", &["gpu-4"]);
    assert_eq!(dra.prepare("c2", "uid-2").await.claims["uid-2"].error, "");
    let checkpoint: Value =
        serde_json::from_str(&std::fs::read_to_string(dra.checkpoint()).unwrap()).unwrap();
    let claims: Vec<&String> = checkpoint["claims"].as_object().unwrap().keys().collect();
    assert_eq!(claims, ["uid-1", "uid-2"]);
}

/// Lays out `<node>/sys` as sysfs does: each bus id under its root complex.
fn pcie_tree(dra: &Dra, devices: &[(&str, &str)]) {
    let links = dra.path("sys/bus/pci/devices");
    std::fs::create_dir_all(&links).unwrap();
    for (bdf, root) in devices {
        let target = format!("../../../devices/{root}/0000:00:01.0/{bdf}");
        std::os::unix::fs::symlink(target, links.join(bdf)).unwrap();
    }
}

/// The topology attributes of device `name`: (pcieRoot, numaNode, nvlinkDomain).
fn placement(slices: &[Value], name: &str) -> (Value, Value, Value) {
    let attributes = &device(slices, name)["attributes"];
    (
        attributes["resource.kubernetes.io/pcieRoot"]["string"].clone(),
        attributes["resource.kubernetes.io/numaNode"]["int"].clone(),
        attributes["nvlinkDomain"]["string"].clone(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gpus_carry_their_pcie_root_numa_node_and_nvlink_domain() {
    // Two NVLink-bridged pairs, one per socket.
    let mut dra = Dra::new("pcie-4gpu");
    pcie_tree(
        &dra,
        &[
            ("0000:1b:00.0", "pci0000:17"),
            ("0000:1c:00.0", "pci0000:17"),
            ("0000:ae:00.0", "pci0000:ad"),
            ("0000:af:00.0", "pci0000:ad"),
        ],
    );
    dra.start();
    dra.register().await;
    let slices = dra.slices_when("slices", |_| true);
    let uuid = |name: &str| device(&slices, name)["attributes"]["uuid"]["string"].clone();
    let (first, third) = (uuid("gpu-0"), uuid("gpu-2"));
    assert_eq!(
        (0..4)
            .map(|i| placement(&slices, &format!("gpu-{i}")))
            .collect::<Vec<_>>(),
        [
            (json!("pci0000:17"), json!(0), first.clone()),
            (json!("pci0000:17"), json!(0), first),
            (json!("pci0000:ad"), json!(1), third.clone()),
            (json!("pci0000:ad"), json!(1), third),
        ]
    );
    dra.stop();

    // A multi-node NVLink rack: the fabric's clique is the domain, across nodes.
    let mut dra = Dra::new("gb200-nvl");
    pcie_tree(&dra, &[("0008:01:00.0", "pci0008:00")]);
    dra.start();
    dra.register().await;
    let slices = dra.slices_when("slices", |_| true);
    let clique = json!("3f5a0c2e-9b1d-4e7a-8c63-1d2e4f5a6b7c.32766");
    assert_eq!(
        placement(&slices, "gpu-0"),
        (json!("pci0008:00"), json!(0), clique.clone())
    );
    // No sysfs link for GPU 3: no root complex rather than a wrong one.
    assert_eq!(placement(&slices, "gpu-3"), (Value::Null, json!(1), clique));
}

/// What a thousand nodes' plugins cost the API server: after its first list the publisher
/// lists from the API server's cache (`resourceVersion=0`), and a watch that breaks resumes
/// from the last version it saw, replaying nothing, instead of starting again from 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_the_first_list_slices_are_listed_from_the_cache_and_watched_from_a_version() {
    let mut dra = Dra::new("pcie-4gpu");
    // The first watch breaks without an answer, as when the API server goes away.
    dra.api.refuse(
        Rule::exact(
            "GET",
            "/apis/resource.k8s.io/v1/resourceslices",
            Fault::Drop,
        )
        .query("watch=true")
        .nth(1),
    );
    // The first call, the list, is slow to answer: no watch may open meanwhile from "0".
    dra.api.refuse(
        Rule::exact(
            "GET",
            "/apis/resource.k8s.io/v1/resourceslices",
            Fault::Stall(Duration::from_secs(1)),
        )
        .nth(1),
    );
    // A real API server's versions are never 0 ("any"), the fake's first one is.
    dra.api.state.lock().unwrap().slice_version = 100;
    dra.start();
    let first = dra.slices_when("slices", |_| true);
    // The wipe lands once the watch is open again, so the watch is what sees it.
    dra.until("the second watch", || {
        let watches = dra
            .api
            .requests_to("GET", "/apis/resource.k8s.io/v1/resourceslices?");
        (watches
            .iter()
            .filter(|r| r.path.contains("watch=true"))
            .count()
            >= 2)
            .then_some(())
    });
    dra.api.wipe_slices("test-node");
    dra.slices_when("slices again", |s| generation(s) > generation(&first));
    let calls: Vec<String> = dra
        .api
        .log()
        .into_iter()
        .filter(|r| {
            r.method == "GET"
                && r.path
                    .starts_with("/apis/resource.k8s.io/v1/resourceslices?")
        })
        .map(|r| r.path)
        .collect();
    let (watches, lists): (Vec<&String>, Vec<&String>) =
        calls.iter().partition(|p| p.contains("watch=true"));
    let version = |path: &str| {
        path.split(['?', '&'])
            .find_map(|pair| pair.strip_prefix("resourceVersion="))
            .map(str::to_owned)
    };
    assert!(lists.len() >= 2, "{lists:?}");
    let bare = lists.iter().filter(|p| version(p).is_none()).count();
    assert!(bare <= 1, "more than the first list read etcd: {lists:?}");
    assert!(
        lists[1..]
            .iter()
            .all(|p| version(p).as_deref() == Some("0")),
        "{lists:?}"
    );
    // Every watch, the first too, opens from what a list saw: never from 0, which replays
    // every slice and cannot resume after the break.
    assert!(watches.len() >= 2, "{watches:?}");
    assert!(
        watches.iter().all(|p| version(p).is_some_and(|v| v != "0")),
        "a watch started from 0: {watches:?}"
    );
}

// --- GPUs shared by capacity, and the newer slice fields each API server keeps -------------

/// The consumable-capacity fields of a GPU of `memory` as `--dra-shared-capacity` publishes
/// them: several claims, each with whole GiB, one that asks nothing taking whole GiB of all.
fn shared(mut device: Value, default: &str) -> Value {
    device["allowMultipleAllocations"] = json!(true);
    device["capacity"]["memory"]["requestPolicy"] =
        json!({"default": default, "validRange": {"min": "1Gi", "step": "1Gi"}});
    device
}

/// The devices of the slices, in order.
fn all_devices(slices: &[Value]) -> Vec<Value> {
    slices
        .iter()
        .flat_map(|s| s["spec"]["devices"].as_array().unwrap().clone())
        .collect()
}

fn golden_devices(name: &str) -> Vec<Value> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/golden/dra")
        .join(name);
    let slices: Vec<Value> = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    all_devices(&slices)
}

/// How many lines of gpud's log hold `text`.
fn log_count(dra: &Dra, text: &str) -> usize {
    dra.log().lines().filter(|l| l.contains(text)).count()
}

const SHARES_LEFT_OUT_V1BETA1: &str = "Publishing the devices without allowMultipleAllocations \
    and capacity requestPolicy (consumable capacity, GPUs shared by capacity): the API server \
    serves resource.k8s.io v1beta1, which has no such fields; they need resource.k8s.io/v1 \
    (Kubernetes 1.34 or newer) with feature gate DRAConsumableCapacity";
const SHARES_DROPPED: &str = "The API server dropped allowMultipleAllocations and capacity \
    requestPolicy (consumable capacity, GPUs shared by capacity) from the ResourceSlices gpud \
    wrote: feature gate DRAConsumableCapacity is off there. Publishing the devices without \
    them; enable DRAConsumableCapacity on the API server, the scheduler and the kubelets to \
    use them";

/// `gpud dra --dra-shared-capacity` on `fixture`, started and registered once `api` has set
/// the API server up.
async fn shared_capacity(fixture: &str, api: impl FnOnce(&FakeApi)) -> Dra {
    let mut dra = Dra::new(fixture);
    api(&dra.api);
    dra.applet.push("--dra-shared-capacity".into());
    dra.start();
    dra.register().await;
    dra
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_capacity_publishes_every_gpu_shareable_by_memory_on_a_1_36_server() {
    let dra = shared_capacity("dgx-h100", |_| {}).await;
    let slices = dra.slices_when("slices", |_| true);
    // NVIDIA's devices, each with the two fields added; 81559Mi of memory takes 79Gi by default.
    let expected: Vec<Value> = golden_devices("dgx-h100.json")
        .into_iter()
        .map(|d| shared(d, "79Gi"))
        .collect();
    assert_eq!(all_devices(&slices), expected);
    assert_eq!(
        device(&slices, "gpu-0")["capacity"],
        json!({"memory": {"value": "81559Mi", "requestPolicy": {"default": "79Gi",
            "validRange": {"min": "1Gi", "step": "1Gi"}}}})
    );
    assert_eq!(log_count(&dra, "Publishing the devices without allow"), 0);
    assert_eq!(log_count(&dra, "The API server dropped"), 0);
    // The 1.36 release was read once.
    assert_eq!(dra.api.requests_to("GET", "/version").len(), 1);

    // MIG devices are never shared.
    let mig = shared_capacity("a100-mig", |_| {}).await;
    let slices = mig.slices_when("slices", |_| true);
    let devices = all_devices(&slices);
    assert!(
        devices
            .iter()
            .any(|d| d["attributes"]["type"]["string"] == "mig")
    );
    for d in devices {
        let is_gpu = d["attributes"]["type"]["string"] == "gpu";
        assert_eq!(d.get("allowMultipleAllocations").is_some(), is_gpu, "{d}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_whose_gate_is_off_drops_the_share_fields_and_gpud_says_so_once() {
    let dra = shared_capacity("dgx-h100", |api| {
        api.set_server_version(Some("v1.34.2"));
        api.disable_gate("DRAConsumableCapacity");
    })
    .await;
    dra.log_when(SHARES_DROPPED);
    // The slices hold NVIDIA's devices, exclusive, exactly as without the flag.
    let slices = dra.slices_when("slices", |_| true);
    assert_eq!(all_devices(&slices), golden_devices("dgx-h100.json"));
    // gpud wrote the fields once; what it writes next is without them: the kubelet's wipe
    // makes it publish again, and no second message.
    let sent = |write: &Value| {
        let devices = write["devices"].as_array().unwrap();
        devices
            .iter()
            .filter(|d| d.get("allowMultipleAllocations").is_some())
            .count()
    };
    assert_eq!(
        dra.api.slice_writes().iter().map(sent).collect::<Vec<_>>(),
        [8]
    );
    dra.api.wipe_slices("test-node");
    dra.until("the slices published again", || {
        (dra.api.slice_writes().len() == 2 && !dra.api.slices().is_empty()).then_some(())
    });
    let writes = dra.api.slice_writes();
    assert_eq!(writes.iter().map(sent).collect::<Vec<_>>(), [8, 0]);
    assert_eq!(writes[1]["devices"], json!(golden_devices("dgx-h100.json")));
    let slices = dra.slices_when("slices", |_| true);
    assert_eq!(all_devices(&slices), golden_devices("dgx-h100.json"));
    assert_eq!(log_count(&dra, SHARES_DROPPED), 1, "{}", dra.log());
    assert_eq!(log_count(&dra, "Publishing the devices without allow"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_v1beta1_server_gets_no_share_fields_and_gpud_says_so_once() {
    let dra = shared_capacity("mixed", |api| {
        api.set_resource_versions(&["v1beta1"]);
        api.set_server_version(Some("v1.32.4"));
    })
    .await;
    let slices = dra.slices_when("slices", |_| true);
    // Exactly the slices of a 1.32 server without the flag.
    assert_golden("dra/mixed-v1beta1.json", &render(&slices));
    dra.log_when(SHARES_LEFT_OUT_V1BETA1);
    let writes = dra
        .api
        .requests_to("POST", "/apis/resource.k8s.io/v1beta1/")
        .len();
    dra.api.wipe_slices("test-node");
    dra.until("the slices published again", || {
        let again = dra
            .api
            .requests_to("POST", "/apis/resource.k8s.io/v1beta1/")
            .len();
        (again > writes && !dra.api.slices().is_empty()).then_some(())
    });
    assert_eq!(log_count(&dra, SHARES_LEFT_OUT_V1BETA1), 1, "{}", dra.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_version_answer_the_newest_shape_is_assumed_and_said() {
    let dra = shared_capacity("dgx-h100", |api| {
        api.set_server_version(None);
    })
    .await;
    let slices = dra.slices_when("slices", |_| true);
    assert_eq!(device(&slices, "gpu-0")["allowMultipleAllocations"], true);
    dra.log_when(
        "Cannot read the API server's Kubernetes version; assuming 1.35 or newer (counter sets \
         published in slices of their own)",
    );
}

impl Dra {
    /// A claim allocated a share of `memory` of `device`, with allocation `config`.
    fn put_shared_claim(&self, name: &str, uid: &str, device: &str, memory: &str, config: Value) {
        self.api.put_claim(json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"namespace": "ns", "name": name, "uid": uid},
            "status": {"allocation": {"devices": {"results": [{"request": "gpu",
                "driver": DRIVER, "pool": "test-node", "device": device,
                "shareID": format!("share-{name}"), "consumedCapacity": {"memory": memory}}],
                "config": config}}}
        }));
    }

    /// The checkpoint now.
    fn checkpoint_json(&self) -> Value {
        serde_json::from_str(&std::fs::read_to_string(self.checkpoint()).unwrap()).unwrap()
    }

    /// The environment of claim `uid`'s CDI devices.
    fn spec_env(&self, uid: &str) -> Vec<Value> {
        let spec: Value =
            serde_yaml_ng::from_str(&std::fs::read_to_string(self.spec_file(uid)).unwrap())
                .unwrap();
        spec["devices"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d["containerEdits"]["env"].clone())
            .collect()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_sharing_a_gpu_by_capacity_get_mps_limits_that_add_up_and_never_more() {
    let mut dra = shared_capacity("dgx-h100", |_| {}).await;
    let (gpu0, gpu1) = (dra.uuid(0), dra.uuid(1));
    let mps = mps_sharing(json!({}));
    dra.put_shared_claim("a", "uid-a", "gpu-0", "20Gi", mps.clone());
    dra.put_shared_claim("b", "uid-b", "gpu-0", "40Gi", mps.clone());
    let answer = dra.prepare("a", "uid-a").await;
    assert_eq!(answer.claims["uid-a"].error, "");
    let mut expected = prepared("uid-a", "gpu-0");
    expected.share_id = Some("share-a".into());
    assert_eq!(answer.claims["uid-a"].devices, [expected]);
    assert_eq!(dra.prepare("b", "uid-b").await.claims["uid-b"].error, "");

    // One daemon over the GPU for both, with no daemon-wide limits; each workload's client
    // limits are its share: 20480M + 40960M of 81559M, 25 % + 50 % of the threads.
    let daemon = dra.path(&format!("plugins/gpu.nvidia.com/mps/shared-{gpu0}"));
    let daemon_env = format!(
        "CUDA_MPS_LOG_DIRECTORY={0}/log CUDA_MPS_PIPE_DIRECTORY={0}/pipe \
         CUDA_VISIBLE_DEVICES={gpu0}",
        daemon.display()
    );
    assert_eq!(mps_recorded(&dra), [format!("-d | {daemon_env}")]);
    assert_eq!(
        compute_modes(&dra),
        [(gpu0.clone(), 3)].into_iter().collect()
    );
    let client = |share: &str, mib: u64, percent: u64| {
        json!([
            format!("GPUD_GPU_MEMORY_SHARES={gpu0}={share}"),
            format!("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0={mib}M"),
            format!("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={percent}"),
            "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps"
        ])
    };
    assert_eq!(dra.spec_env("uid-a"), [client("20Gi", 20480, 25)]);
    assert_eq!(dra.spec_env("uid-b"), [client("40Gi", 40960, 50)]);

    // A third share that would take the GPU over its memory is refused; the first two keep
    // theirs.
    let refusal = "device gpu-0: this claim's share of 30Gi and the shares prepared on it \
        (20Gi for ns/a, 40Gi for ns/b) add up to 90Gi, over its memory of 81559Mi; refused (the \
        scheduler should not have allocated it)";
    dra.put_shared_claim("c", "uid-c", "gpu-0", "30Gi", mps.clone());
    let refused = dra.prepare("c", "uid-c").await;
    assert_eq!(refused.claims["uid-c"].error, refusal);
    assert!(!dra.spec_file("uid-c").exists());
    assert_eq!(dra.spec_env("uid-a"), [client("20Gi", 20480, 25)]);
    assert_eq!(dra.spec_env("uid-b"), [client("40Gi", 40960, 50)]);
    let checkpoint = dra.checkpoint_json();
    assert_eq!(
        checkpoint["claims"]["uid-a"]["devices"][0]["share"],
        json!({"id": "share-a", "memory": 20u64 << 30})
    );
    assert_eq!(
        checkpoint["claims"]["uid-b"]["mps"],
        json!({"gpus": [gpu0], "limits": [], "daemon": format!("shared-{gpu0}")})
    );
    // A share and a whole-GPU claim never meet on one GPU.
    dra.put_claim("whole", "uid-w", &["gpu-0"]);
    let held = dra.prepare("whole", "uid-w").await;
    assert!(
        held.claims["uid-w"]
            .error
            .starts_with("device gpu-0 is held by claim ns/"),
        "{held:?}"
    );

    // A restart keeps the accounting.
    dra.stop();
    dra.start();
    dra.register().await;
    assert_eq!(
        dra.prepare("c", "uid-c").await.claims["uid-c"].error,
        refusal
    );
    assert_eq!(dra.prepare("a", "uid-a").await.claims["uid-a"].error, "");

    // Unprepare frees the share: the third fits now, beside b, on the same daemon.
    assert_eq!(dra.unprepare("a", "uid-a").await, "");
    assert_eq!(dra.prepare("c", "uid-c").await.claims["uid-c"].error, "");
    assert_eq!(dra.spec_env("uid-c"), [client("30Gi", 30720, 37)]);
    assert_eq!(mps_recorded(&dra), [format!("-d | {daemon_env}")]);
    // The daemon stops with the last claim on it.
    assert_eq!(dra.unprepare("b", "uid-b").await, "");
    assert_eq!(mps_recorded(&dra), [format!("-d | {daemon_env}")]);
    assert_eq!(dra.unprepare("c", "uid-c").await, "");
    assert_eq!(
        mps_recorded(&dra),
        [format!("-d | {daemon_env}"), format!("quit | {daemon_env}")]
    );
    assert_eq!(compute_modes(&dra), BTreeMap::new());
    assert!(!daemon.exists());

    // Time-slicing records the share and tells the workload its budget.
    dra.put_shared_claim("t", "uid-t", "gpu-1", "8Gi", time_slicing("Short"));
    assert_eq!(dra.prepare("t", "uid-t").await.claims["uid-t"].error, "");
    // A share under MPS cannot join the GPU of shares without it.
    dra.put_shared_claim("m", "uid-m", "gpu-1", "8Gi", mps.clone());
    assert_eq!(
        dra.prepare("m", "uid-m").await.claims["uid-m"].error,
        "device gpu-1 is shared without MPS by claim ns/t: a share under MPS cannot run beside \
         it (an MPS daemon holds the GPU in EXCLUSIVE_PROCESS mode); give the claim the same \
         sharing strategy, or another GPU"
    );
    assert_eq!(
        dra.spec_env("uid-t"),
        [json!([format!("GPUD_GPU_MEMORY_SHARES={gpu1}=8Gi")])]
    );
    let checkpoint = dra.checkpoint_json();
    assert_eq!(
        checkpoint["claims"]["uid-t"]["devices"][0]["share"],
        json!({"id": "share-t", "memory": 8u64 << 30})
    );
}

/// The slice writes a fault refused, with when they came.
fn refused_writes(dra: &Dra, since: Instant) -> Vec<Instant> {
    dra.api
        .log()
        .into_iter()
        .filter(|r| r.at >= since && r.refused && r.method == "PUT" && r.path.starts_with(SLICES))
        .map(|r| r.at)
        .collect()
}

/// Slice writes the API server refuses — 429 with and without `Retry-After`, 403, 500 — are
/// retried paced (no tight loop), `/readyz` names the slices and the answer (ready at first,
/// not ready once publishing has failed for --api-unready-after), and the slices converge
/// once the API server takes them again: nothing the inventory said meanwhile is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_slice_writes_are_retried_paced_said_on_readyz_and_converge() {
    let mut dra = Dra::new("dgx-h100");
    let port = common::http::free_port();
    let address = format!("127.0.0.1:{port}");
    dra.applet = [
        "dra",
        "--health-address",
        &address,
        "--api-unready-after",
        "3s",
    ]
    .map(String::from)
    .to_vec();
    dra.start();
    dra.register().await;
    dra.slices_when("slices", |_| true);
    common::http::wait_for(port, "/readyz", 15, |a| a.status == 200);
    let what = "cannot publish the ResourceSlices of node test-node (driver gpu.nvidia.com)";
    // (fault, what /readyz says of the API server's answer, the most writes while it lasts)
    let cases = [
        (
            Fault::TooManyRequests(2),
            "429 TooManyRequests: Too many requests, please try again later. (the API server \
             asks to wait 2s before the next call)",
            4,
        ),
        (
            Fault::Failure(429),
            "429 TooManyRequests: Too many requests, please try again later.",
            7,
        ),
        (Fault::Forbidden, "403 Forbidden: ", 7),
        (
            Fault::Failure(500),
            "500 InternalError: an error on the server has prevented the request",
            7,
        ),
    ];
    for (gpu, (fault, answer, most)) in cases.into_iter().enumerate() {
        let label = format!("{fault:?}");
        let rule = dra
            .api
            .refuse(Rule::prefix("PUT", &format!("{SLICES}/"), fault));
        let since = Instant::now();
        // An XID changes what the slices must say: the update is refused.
        dra.node.inject(&format!("xid {gpu} 79"));
        let degraded = common::http::wait_for(port, "/readyz", 15, |a| {
            a.status == 200 && a.body.contains(what)
        });
        assert!(
            degraded.body.contains(&format!(
                "dra ready: {what} now: writing ResourceSlice test-node-"
            )),
            "{label}: {}",
            degraded.body
        );
        assert!(degraded.body.contains(answer), "{label}: {}", degraded.body);
        let unready = common::http::wait_for(port, "/readyz", 15, |a| a.status == 503);
        assert!(
            unready
                .body
                .contains(&format!("dra not ready: {what} for ")),
            "{label}: {}",
            unready.body
        );
        assert!(unready.body.contains(answer), "{label}: {}", unready.body);
        if label == "Forbidden" {
            assert!(
                unready.body.contains("forbidden by RBAC"),
                "{label}: {}",
                unready.body
            );
        }
        // Paced: a handful of writes in the 3 s and more it took to be not ready, not a loop.
        let writes = refused_writes(&dra, since);
        let failing = since.elapsed();
        eprintln!("{label}: {} refused writes in {failing:?}", writes.len());
        assert!(
            writes.len() >= 2 && writes.len() <= most,
            "{label}: {} refused writes in {failing:?}",
            writes.len()
        );
        if label.starts_with("TooManyRequests") {
            for pair in writes.windows(2) {
                assert!(
                    pair[1] - pair[0] >= Duration::from_millis(1900),
                    "{label}: written again {:?} after a 429 asking for 2 s",
                    pair[1] - pair[0]
                );
            }
        }
        assert_eq!(dra.api.refused_by(rule) as usize, writes.len());

        dra.api.allow_all();
        let device_name = format!("gpu-{gpu}");
        let deadline = Instant::now() + Duration::from_secs(40);
        loop {
            let slices: Vec<Value> = dra.api.slices().into_values().collect();
            if !slices.is_empty() && device(&slices, &device_name).get("taints").is_some() {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{label}: {device_name}'s taint never published:\n{}",
                dra.log()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let ready = common::http::wait_for(port, "/readyz", 15, |a| a.status == 200);
        assert!(!ready.body.contains(what), "{label}: {}", ready.body);
        assert!(
            ready.body.lines().any(|l| l == "dra ready"),
            "{label}: {}",
            ready.body
        );
    }
    let log = dra.log();
    assert!(
        log.contains("Cannot publish the node's ResourceSlices"),
        "{log}"
    );
    assert!(log.contains("ResourceSlices published again"), "{log}");
}
