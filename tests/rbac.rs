//! RBAC from the manifests: each kustomize combination that gives gpud API access is rendered
//! (`kubectl kustomize`), the Roles and ClusterRoles bound to gpud's service account become the
//! stand-in API server's authorizer, and every container that talks to the API server runs as
//! the DaemonSet configures it (its command, its environment from ConfigMaps and the downward
//! API, its mounted ConfigMaps) against the simulated node, through everything it writes: its
//! first publication, a fatal XID, a DRA claim prepared, a MIG config asked for, a GPU
//! remediated (the pod holding it evicted, a Lease slot taken, the GPU reset and given back). A
//! request the rules do not allow is answered 403, as the API server does, and fails the test
//! with the combination, the container and the request.
//!
//! The only changes to a container's configuration are the ones a host needs: host paths lie
//! under a temporary root (the kubelet's pod-resources socket is a stand-in kubelet's there),
//! the API server is the stand-in (a kubeconfig), ports are free ones, the health poll is fast,
//! and a GPU reset is the simulated driver's (a script in place of `nvidia-smi -r`).
//!
//! Needs kubectl (for kustomize); skipped without it, except in CI.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
#[path = "common/fake_api.rs"]
mod fake_api;
#[path = "common/fake_dra_kubelet.rs"]
mod fake_dra_kubelet;
#[path = "common/fake_pod_resources.rs"]
mod fake_pod_resources;
#[path = "common/raw_grpc.rs"]
mod raw_grpc;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::Node;
use fake_api::FakeApi;
use fake_api::rbac::{Attributes, Rbac};
use serde::Deserialize;
use serde_json::{Value, json};

/// The service account the DaemonSet's pods run as: (namespace, name).
const ACCOUNT: (&str, &str) = ("gpud", "gpud");
/// What the downward API gives the pod.
const POD_NAME: &str = "gpud-x7k2p";
const NODE: &str = "test-node";
const SLICES: &str = "/apis/resource.k8s.io/v1/resourceslices";
/// The kubelet's pod-resources folder, where the remediation finds the pods holding a GPU.
const POD_RESOURCES: &str = "/var/lib/kubelet/pod-resources";
/// The GPU the remediation drains, resets and gives back (GPU 3's XID 79 asks for a reboot,
/// which it escalates), and the process a pod runs on it.
const RESET_GPU: usize = 5;
const TRAINING_PID: u32 = 4242;
/// The pod holding that GPU, as the kubelet's pod-resources API and the API server know it.
const TRAINING_POD: (&str, &str) = ("ml", "train");

/// Whether kubectl can render; fails in CI without it.
fn kubectl_present() -> bool {
    let present = Command::new("kubectl")
        .args(["version", "--client"])
        .output()
        .is_ok_and(|o| o.status.success());
    !common::tool_missing(
        !present,
        "kubectl is required in CI (the RBAC check renders the manifests with kustomize)",
        "RBAC check skipped: kubectl is not installed",
    )
}

/// The objects of `overlay` with `components`, as `kubectl kustomize` renders them.
fn render(overlay: &str, components: &[&str]) -> Vec<Value> {
    let dir = tempfile::tempdir().unwrap();
    // kustomize takes local bases by relative path only: up from the folder to `/`, then down.
    let up = "../".repeat(dir.path().components().count() - 1);
    let k8s = Path::new(&up).join(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("packaging/k8s")
            .strip_prefix("/")
            .unwrap(),
    );
    let kustomization = json!({
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [k8s.join(overlay)],
        "components": components.iter().map(|c| k8s.join("components").join(c)).collect::<Vec<_>>(),
    });
    std::fs::write(
        dir.path().join("kustomization.yaml"),
        kustomization.to_string(),
    )
    .unwrap();
    let out = Command::new("kubectl")
        .arg("kustomize")
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{overlay} + {components:?}: kustomize failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_yaml_ng::Deserializer::from_str(std::str::from_utf8(&out.stdout).unwrap())
        .map(|doc| Value::deserialize(doc).unwrap())
        .filter(|doc| !doc.is_null())
        .collect()
}

/// One container of the DaemonSet, resolved as the kubelet would start it.
struct Container {
    name: String,
    /// `gpud` arguments: the applet (from the command's link name), then its arguments.
    argv: Vec<String>,
    env: BTreeMap<String, String>,
    /// Mount path → the files of the ConfigMap mounted there (empty for host paths).
    mounts: Vec<(String, BTreeMap<String, String>)>,
}

impl Container {
    fn from_manifest(container: &Value, pod: &Value, objects: &[Value]) -> Container {
        let strings = |v: &Value| -> Vec<String> {
            v.as_array()
                .into_iter()
                .flatten()
                .map(|s| s.as_str().unwrap().to_owned())
                .collect()
        };
        let command = strings(&container["command"]);
        let link = Path::new(&command[0])
            .file_name()
            .unwrap()
            .to_str()
            .unwrap();
        let mut argv: Vec<String> = match link.strip_prefix("gpud-") {
            Some(applet) => vec![applet.to_owned()],
            None => Vec::new(),
        };
        argv.extend(command[1..].iter().cloned());
        argv.extend(strings(&container["args"]));
        let config_map = |name: &str| -> BTreeMap<String, String> {
            objects
                .iter()
                .find(|o| o["kind"] == "ConfigMap" && o["metadata"]["name"] == name)
                .map(|o| serde_json::from_value(o["data"].clone()).unwrap())
                .unwrap_or_default()
        };
        let mut env = BTreeMap::new();
        for source in container["envFrom"].as_array().into_iter().flatten() {
            env.extend(config_map(source["configMapRef"]["name"].as_str().unwrap()));
        }
        for var in container["env"].as_array().into_iter().flatten() {
            let name = var["name"].as_str().unwrap().to_owned();
            let value = if let Some(value) = var["value"].as_str() {
                value.to_owned()
            } else if let Some(key) = var["valueFrom"].get("configMapKeyRef") {
                config_map(key["name"].as_str().unwrap())[key["key"].as_str().unwrap()].clone()
            } else {
                match var["valueFrom"]["fieldRef"]["fieldPath"].as_str().unwrap() {
                    "spec.nodeName" => NODE.to_owned(),
                    "metadata.namespace" => ACCOUNT.0.to_owned(),
                    "metadata.name" => POD_NAME.to_owned(),
                    other => panic!("fieldRef {other} has no value here"),
                }
            };
            env.insert(name, value);
        }
        let volumes = pod["volumes"].as_array().unwrap();
        let mounts = container["volumeMounts"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|mount| {
                let volume = volumes.iter().find(|v| v["name"] == mount["name"]).unwrap();
                let files = volume["configMap"]["name"]
                    .as_str()
                    .map(config_map)
                    .unwrap_or_default();
                (mount["mountPath"].as_str().unwrap().to_owned(), files)
            })
            .collect();
        Container {
            name: container["name"].as_str().unwrap().to_owned(),
            argv,
            env,
            mounts,
        }
    }

    fn applet(&self) -> &str {
        self.argv.first().map_or("", String::as_str)
    }

    fn on(&self, var: &str) -> bool {
        self.env.get(var).is_some_and(|v| v == "true")
    }

    /// What this container asks of the API server, by its applet and configuration.
    fn uses(&self) -> Uses {
        let run = self.applet() == "run";
        let sink = self.env.get("GPUD_LABELLER_SINK").map(String::as_str);
        let labeller = self.applet() == "labeller" || run;
        Uses {
            node_labels: labeller && sink == Some("node"),
            node_features: labeller && sink == Some("node-feature"),
            node_status: self.applet() == "node-status" || (run && self.on("GPUD_NODE_STATUS")),
            taints: self.env.contains_key("GPUD_TAINT_UNHEALTHY"),
            dra: self.applet() == "dra" || (run && self.on("GPUD_DRA")),
            mig: self.argv.starts_with(&["mig".into(), "reconcile".into()])
                || (run && self.env.contains_key("GPUD_MIG_CONFIG_FILE")),
            pods: (self.applet() == "exporter" || run) && self.on("GPUD_POD_USAGE"),
            remediation: (self.applet() == "node-status" || run)
                && self
                    .env
                    .get("GPUD_REMEDIATION")
                    .is_some_and(|mode| mode != "off"),
            evict: self.on("GPUD_REMEDIATION_EVICT"),
        }
    }
}

/// The API clients a container runs.
#[derive(Debug, Default, PartialEq)]
struct Uses {
    node_labels: bool,
    node_features: bool,
    node_status: bool,
    taints: bool,
    dra: bool,
    mig: bool,
    /// This node's pods, for per-pod usage.
    pods: bool,
    /// Leases, the Node's escalation condition and events.
    remediation: bool,
    /// Evictions of the pods holding a GPU to be reset.
    evict: bool,
}

impl Uses {
    fn any(&self) -> bool {
        *self != Uses::default()
    }
}

/// The flags (with the value they get here) that put a host path under the test's root, make
/// a run fast or reset a simulated GPU (`reset`, in place of the driver's `nvidia-smi -r`);
/// each is given to the applets that take it.
fn host_flags(root: &Path, kubeconfig: &Path, reset: &Path) -> Vec<(&'static str, String)> {
    let under = |p: &str| root.join(p.trim_start_matches('/')).display().to_string();
    vec![
        ("--kubeconfig", kubeconfig.display().to_string()),
        ("--kmsg", String::new()),
        ("--health-poll-interval", "50ms".into()),
        (
            "--kubelet-socket",
            under("/var/lib/kubelet/device-plugins/kubelet.sock"),
        ),
        ("--plugin-dir", under("/var/lib/kubelet/device-plugins")),
        (
            "--pod-resources-kubelet-socket",
            under("/var/lib/kubelet/pod-resources/kubelet.sock"),
        ),
        (
            "--address",
            format!("127.0.0.1:{}", common::http::free_port()),
        ),
        ("--sysfs-root", under("/sys")),
        ("--host-root", root.display().to_string()),
        (
            "--dra-registry-dir",
            under("/var/lib/kubelet/plugins_registry"),
        ),
        ("--dra-plugins-dir", under("/var/lib/kubelet/plugins")),
        ("--dra-cdi-root", under("/var/run/cdi")),
        ("--dra-driver-root", under("/run/nvidia/driver")),
        ("--dra-proc-root", under("/run/nvidia/driver")),
        ("--dra-sysfs-root", under("/sys")),
        (
            "--dra-pod-resources-socket",
            under("/var/lib/kubelet/pod-resources/kubelet.sock"),
        ),
        (
            "--dra-nvidia-smi-path",
            under("/run/nvidia/driver/usr/bin/nvidia-smi"),
        ),
        ("--mig-retry-interval", "200ms".into()),
        (
            "--remediation-pod-resources-socket",
            under("/var/lib/kubelet/pod-resources/kubelet.sock"),
        ),
        ("--remediation-reset-command", reset.display().to_string()),
    ]
}

/// A reset command for `node`'s simulated GPUs: called as `nvidia-smi -r` is (`-i <bus id>`
/// appended), it resets that GPU through the control file.
fn reset_script(node: &Node) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = node.dir.path().join("reset.sh");
    let script = format!(
        "#!/bin/sh\necho \"reset $2\" >> {}\n",
        node.control_path().display()
    );
    std::fs::write(&path, script).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

/// The UUID and PCI bus id of GPU `index` of `node`, from `gpud inventory`.
fn gpu_ids(node: &Node, index: usize) -> (String, String) {
    let out = common::stdout_ok(&node.run(&["inventory"]));
    let inventory: Value = serde_json::from_str(&out).unwrap();
    let gpu = &inventory["gpus"][index];
    (
        gpu["uuid"].as_str().unwrap().to_owned(),
        gpu["pci"]["bus_id"].as_str().unwrap().to_owned(),
    )
}

/// Whether `gpud <applet…>` takes `flag`, from its help.
fn takes(applet: &[String], flag: &str) -> bool {
    let out = Command::new(common::gpud_bin())
        .args(applet)
        .arg("--help")
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .split(|c: char| c.is_whitespace() || c == ',')
        .any(|word| word == flag)
}

/// The applet part of an argv (`mig reconcile`, `node-status`, `run`).
fn applet_words(argv: &[String]) -> Vec<String> {
    argv.iter()
        .take_while(|a| !a.starts_with('-'))
        .cloned()
        .collect()
}

/// One container running against the stand-in API server, killed on drop.
struct Running {
    node: Node,
    root: PathBuf,
    child: Child,
    api: FakeApi,
    what: String,
    /// The GPU the remediation is to reset (UUID, PCI bus id), and the stand-in kubelet's
    /// pod-resources server that names the pod holding it, when the container remediates.
    remediated: Option<(String, String)>,
    _pod_resources: Option<fake_pod_resources::FakeKubelet>,
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Running {
    fn start(what: String, container: &Container, rbac: Rbac) -> Running {
        let node = Node::new("dgx-h100");
        let root = node.dir.path().join("host");
        let api = FakeApi::start(json!({}));
        api.authorize(rbac);
        // The labeller's NodeFeature owner: this pod, owned by the DaemonSet.
        api.state.lock().unwrap().pods.insert(
            format!("{}/{POD_NAME}", ACCOUNT.0),
            json!({"apiVersion": "v1", "kind": "Pod",
                   "metadata": {"name": POD_NAME, "namespace": ACCOUNT.0, "uid": "pod-uid-1",
                                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet",
                                    "name": "gpud", "uid": "ds-uid-1", "controller": true}]}}),
        );
        let under = |p: &str| root.join(p.trim_start_matches('/'));
        // Host paths the container mounts exist under the root; ConfigMaps are written there.
        for (path, files) in &container.mounts {
            let dir = under(path);
            std::fs::create_dir_all(&dir).unwrap();
            for (key, text) in files {
                std::fs::write(dir.join(key), text).unwrap();
            }
        }
        for dir in [
            "/var/lib/kubelet/plugins/gpu.nvidia.com",
            "/run/nvidia/driver/usr/bin",
        ] {
            std::fs::create_dir_all(under(dir)).unwrap();
        }
        let uses = container.uses();
        if uses.dra {
            // A corrupt checkpoint: the DRA plugin moves it aside and says so on the Node.
            std::fs::write(
                under("/var/lib/kubelet/plugins/gpu.nvidia.com/checkpoint.json"),
                "{\"version\": 1, \"claims\": {\"uid-",
            )
            .unwrap();
        }
        let (remediated, pod_resources) = if uses.remediation {
            let (uuid, bus_id) = gpu_ids(&node, RESET_GPU);
            let pod_resources = uses
                .evict
                .then(|| serve_pod_resources(&api, &under(POD_RESOURCES), container, &uuid));
            (Some((uuid, bus_id)), pod_resources)
        } else {
            (None, None)
        };
        let kubeconfig = api.kubeconfig(node.dir.path());
        let reset = reset_script(&node);
        let words = applet_words(&container.argv);
        let mut argv = container.argv.clone();
        for (flag, value) in host_flags(&root, &kubeconfig, &reset) {
            if takes(&words, flag) {
                argv.extend([flag.to_owned(), value]);
            }
        }
        // Paths the configuration names lie under the root too.
        let mounted = |value: &str| {
            container
                .mounts
                .iter()
                .any(|(path, _)| value.starts_with(path.as_str()))
        };
        let env: Vec<(String, String)> = container
            .env
            .iter()
            .map(|(k, v)| {
                let v = if mounted(v) {
                    under(v).display().to_string()
                } else {
                    v.clone()
                };
                (k.clone(), v)
            })
            .collect();
        let log = std::fs::File::create(node.dir.path().join("gpud.log")).unwrap();
        let args: Vec<&str> = argv.iter().map(String::as_str).collect();
        let child = node
            .gpud(&args)
            .envs(env)
            // The admin endpoint's port would collide between tests run at once.
            .env("GPUD_HEALTH_ADDRESS", "")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        Running {
            node,
            root,
            child,
            api,
            what,
            remediated,
            _pod_resources: pod_resources,
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.node.dir.path().join("gpud.log")).unwrap_or_default()
    }

    /// Waits until `fact` holds, failing at once on a refused request; after 30 s fails with
    /// `what`, the requests and gpud's log.
    fn until(&self, what: &str, fact: impl Fn() -> bool) {
        common::until(&format!("{}: {what}", self.what), 30, || {
            self.no_refusals();
            if fact() {
                Ok(())
            } else {
                Err(format!(
                    "requests: {:#?}\ngpud's log:\n{}",
                    self.requests(),
                    self.log()
                ))
            }
        });
    }

    /// Fails at once with the requests RBAC refused, if any.
    fn no_refusals(&self) {
        let forbidden = self.api.forbidden();
        assert!(
            forbidden.is_empty(),
            "{}: the manifests' RBAC refuses what gpud asks for:\n{}\ngpud's log:\n{}",
            self.what,
            forbidden
                .iter()
                .map(|(what, request)| format!("  {what}   ({request})"))
                .collect::<Vec<_>>()
                .join("\n"),
            self.log()
        );
    }

    /// Waits until `count` `method` requests to `path` got a 2xx answer, while `nudge` runs
    /// between looks (re-injecting what the daemon may not have seen yet). A `path` ending in
    /// `/` or `?` is a prefix; any other is the whole path, with or without a query.
    fn answered(&self, count: usize, method: &str, path: &str, mut nudge: impl FnMut()) {
        let matches = |seen: &str| {
            if path.ends_with('/') || path.ends_with('?') {
                seen.starts_with(path)
            } else {
                seen == path || seen.starts_with(&format!("{path}?"))
            }
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            self.no_refusals();
            let ok = self
                .api
                .log()
                .iter()
                .filter(|r| r.method == method && matches(&r.path))
                .filter(|r| (200..300).contains(&r.status))
                .count();
            if ok >= count {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{}: {ok} of {count} {method} {path} answered within 30 s; requests: {:#?}\n\
                 gpud's log:\n{}",
                self.what,
                self.api.log(),
                self.log()
            );
            nudge();
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The distinct requests made, as the authorizer saw them (`patch nodes/status`).
    fn requests(&self) -> std::collections::BTreeSet<String> {
        self.api
            .log()
            .iter()
            .filter_map(|r| {
                let uri: axum::http::Uri = r.path.parse().ok()?;
                let request = Attributes::of(&r.method, &uri)?;
                Some(format!("{} {}", request.verb, request.resource_path()))
            })
            .collect()
    }
}

/// Runs every API-using container of the combination through what it writes, then checks
/// that RBAC refused nothing. Returns the containers run.
async fn check(overlay: &str, components: &[&str]) -> Vec<String> {
    let objects = render(overlay, components);
    let rbac = Rbac::bound_to(&objects, ACCOUNT.0, ACCOUNT.1);
    let daemonset = objects.iter().find(|o| o["kind"] == "DaemonSet").unwrap();
    let pod = &daemonset["spec"]["template"]["spec"];
    assert_eq!(
        pod["serviceAccountName"], ACCOUNT.1,
        "{overlay} + {components:?}"
    );
    let mut ran = Vec::new();
    for manifest in pod["containers"].as_array().unwrap() {
        let container = Container::from_manifest(manifest, pod, &objects);
        let uses = container.uses();
        if !uses.any() {
            continue;
        }
        let what = format!("{overlay} + {components:?}, container {}", container.name);
        // A client of the API server needs the account's token in the pod.
        assert_eq!(
            pod["automountServiceAccountToken"], true,
            "{what}: no token"
        );
        let running = Running::start(what, &container, rbac.clone());
        exercise(&running, &uses).await;
        running.no_refusals();
        let requests: Vec<String> = running.requests().into_iter().collect();
        ran.push(format!("{}: {}", container.name, requests.join(", ")));
    }
    ran
}

/// Drives a running container through each of its writes and waits for each to be answered.
async fn exercise(running: &Running, uses: &Uses) {
    let api = &running.api;
    let node = format!("/api/v1/nodes/{NODE}");
    let events = "/api/v1/namespaces/default/events";
    let features = format!(
        "/apis/nfd.k8s-sigs.io/v1alpha1/namespaces/{}/nodefeatures",
        ACCOUNT.0
    );
    // First publications.
    if uses.node_labels {
        running.answered(1, "PATCH", &node, || {});
    }
    if uses.node_features {
        running.answered(1, "POST", &features, || {});
    }
    if uses.node_status {
        running.answered(1, "PATCH", &format!("{node}/status"), || {});
    }
    if uses.dra {
        // The corrupt checkpoint, said on the Node.
        running.answered(1, "POST", events, || {});
        let registration = running
            .root
            .join("var/lib/kubelet/plugins_registry/gpu.nvidia.com-reg.sock");
        wait_for_socket(running, &registration);
        fake_dra_kubelet::register(&registration).await;
        running.answered(1, "POST", SLICES, || {});
        running.answered(1, "GET", &format!("{SLICES}?"), || {});
    }
    if uses.pods {
        // One list of this node's pods, then a watch.
        running.answered(2, "GET", "/api/v1/pods?", || {});
    }
    // A fatal XID: the health label, a condition and an event, a taint, the slices' device
    // taint.
    let xid = || running.node.inject("xid 3 79");
    if uses.node_labels {
        running.answered(2, "PATCH", &node, xid);
    }
    if uses.node_features {
        running.answered(1, "PUT", &format!("{features}/"), xid);
    }
    if uses.node_status {
        let before = usize::from(uses.dra);
        running.answered(before + 1, "POST", events, xid);
    }
    if uses.taints {
        let deadline = Instant::now() + Duration::from_secs(30);
        while api.node()["spec"]["taints"]
            .as_array()
            .is_none_or(|t| t.is_empty())
        {
            running.no_refusals();
            assert!(Instant::now() < deadline, "{}: no taint", running.what);
            xid();
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    if uses.dra {
        running.answered(1, "PUT", &format!("{SLICES}/"), xid);
        api.put_claim(json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"namespace": "ns", "name": "claim-a", "uid": "uid-a"},
            "status": {"allocation": {"devices": {"results": [
                {"request": "gpu", "driver": "gpu.nvidia.com", "pool": NODE, "device": "gpu-0"}
            ], "config": []}}}
        }));
        let socket = running
            .root
            .join("var/lib/kubelet/plugins/gpu.nvidia.com/dra.sock");
        let request = gpud::proto::dra_v1::NodePrepareResourcesRequest {
            claims: vec![fake_dra_kubelet::claim_v1("ns", "claim-a", "uid-a")],
        };
        let answer = fake_dra_kubelet::prepare_v1(&socket, request).await;
        running.no_refusals();
        assert_eq!(answer.claims["uid-a"].error, "", "{}", running.what);
        // The prepared device's status in the claim (as the 1.36 server checks it: the status
        // subresource and the driver's synthetic one).
        running.answered(
            1,
            "PATCH",
            "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/claim-a/status",
            || {},
        );
    }
    if uses.mig {
        api.set_label("nvidia.com/mig.config", Some("all-disabled"));
        let deadline = Instant::now() + Duration::from_secs(30);
        while api
            .node_labels()
            .get("nvidia.com/mig.config.state")
            .map(String::as_str)
            != Some("success")
        {
            running.no_refusals();
            assert!(
                Instant::now() < deadline,
                "{}: the MIG config was not applied:\n{}",
                running.what,
                running.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    if uses.remediation {
        remediate(running, uses.evict);
    }
}

/// The stand-in kubelet's pod-resources server in `dir` (which the container must mount), its
/// one GPU pod holding GPU `uuid`; the pod exists in the API server too, to be evicted.
fn serve_pod_resources(
    api: &FakeApi,
    dir: &Path,
    container: &Container,
    uuid: &str,
) -> fake_pod_resources::FakeKubelet {
    assert!(
        container
            .mounts
            .iter()
            .any(|(path, _)| path == POD_RESOURCES),
        "container {} evicts pods but does not mount {POD_RESOURCES}",
        container.name
    );
    let (namespace, pod) = TRAINING_POD;
    api.put_pod(json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": pod, "namespace": namespace, "uid": "uid-train"}}));
    fake_pod_resources::FakeKubelet::start(
        &dir.join("kubelet.sock"),
        fake_pod_resources::answer(&[fake_pod_resources::Holder {
            namespace,
            pod,
            container: "main",
            resource: "nvidia.com/gpu",
            ids: &[uuid],
        }]),
    )
}

/// A fatal XID that a reset fixes on a GPU a pod's process holds: the pod is evicted (with
/// `evict`), its process ends, a Lease slot is taken, the GPU is reset and given back.
fn remediate(running: &Running, evict: bool) {
    let api = &running.api;
    let (uuid, bus_id) = running.remediated.clone().unwrap();
    let (namespace, pod) = TRAINING_POD;
    if evict {
        running
            .node
            .inject(&format!("process {RESET_GPU} {TRAINING_PID} 1024"));
    }
    running.node.inject(&format!("xid {RESET_GPU} 95"));
    if evict {
        running.until("the pod holding the GPU evicted", || {
            api.evictions() == [format!("{namespace}/{pod}")]
        });
        assert!(
            !api.pods().contains_key(&format!("{namespace}/{pod}")),
            "{}: the evicted pod is still there",
            running.what
        );
        // Its container stops: the process leaves the GPU.
        running
            .node
            .inject(&format!("process-end {RESET_GPU} {TRAINING_PID}"));
    }
    let reset = format!("reset {bus_id}");
    running.until("the GPU reset", || {
        std::fs::read_to_string(running.node.control_path())
            .unwrap_or_default()
            .lines()
            .any(|line| line == reset)
    });
    let record = running.node.dir.path().join("state/remediation.json");
    running.until("the GPU back in service", || {
        let text = std::fs::read_to_string(&record).unwrap_or_default();
        let record: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        record["gpus"][&uuid]["phase"] == "healthy" && record["gpus"][&uuid]["reset_count"] == 1
    });
    running.until("the GPURemediated event", || {
        api.events().iter().any(|e| e["reason"] == "GPURemediated")
    });
    // The slot was a Lease of gpud's namespace, held by this node while the GPU was reset.
    let slot = format!("{}/gpud-remediation-0", ACCOUNT.0);
    assert!(
        api.leases().contains_key(&slot),
        "{}: no Lease {slot}: {:?}",
        running.what,
        api.leases()
    );
    assert!(
        api.lease_writes()
            .iter()
            .any(|w| w.key == slot && w.holder() == Some(NODE)),
        "{}: {slot} never held by {NODE}",
        running.what
    );
    // GPU 3's XID 79 asks for a reboot: escalated on the Node.
    running.until("the escalation on the Node", || {
        api.condition("GPURemediationRequired")
            .is_some_and(|c| c["status"] == "True")
    });
}

fn wait_for_socket(running: &Running, socket: &Path) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::os::unix::net::UnixStream::connect(socket).is_err() {
        running.no_refusals();
        assert!(
            Instant::now() < deadline,
            "{}: no socket {}:\n{}",
            running.what,
            socket.display(),
            running.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Checks `components` (a component, with what it needs) in each layout: its own container in
/// base, `gpud run` in all-in-one (`run_components` where the layout has its own).
async fn check_component(components: &[&str], run_components: &[&str], expect: &[&str]) {
    if !kubectl_present() {
        return;
    }
    for (overlay, component) in [("base", components), ("all-in-one", run_components)] {
        let ran = check(overlay, component).await;
        let names: Vec<&str> = ran.iter().map(|r| r.split(':').next().unwrap()).collect();
        let expected = if overlay == "base" { expect } else { &["gpud"] };
        assert_eq!(
            names, expected,
            "{overlay} + {component:?}: containers run: {ran:?}"
        );
        eprintln!("RBAC {overlay} + {component:?}: allowed {ran:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_node_label_sink_needs_nothing_its_role_does_not_grant() {
    check_component(&["labeller-node"], &["labeller-node"], &["labeller"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_node_feature_sink_needs_nothing_its_role_does_not_grant() {
    check_component(
        &["labeller-node-feature"],
        &["labeller-node-feature"],
        &["labeller"],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_node_status_needs_nothing_its_role_does_not_grant() {
    check_component(&["node-status"], &["node-status"], &["node-status"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_status_taints_need_nothing_their_roles_do_not_grant() {
    check_component(
        &["node-status-taints"],
        &["node-status-taints"],
        &["node-status"],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_remediation_needs_nothing_its_roles_do_not_grant() {
    check_component(
        &["node-status-taints", "remediation"],
        &["node-status", "remediation"],
        &["node-status"],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dra_plugin_needs_nothing_its_role_does_not_grant() {
    check_component(&["dra"], &["dra"], &["dra"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_pod_usage_needs_nothing_its_role_does_not_grant() {
    check_component(&["pod-usage"], &["pod-usage"], &["exporter"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_mig_reconciler_needs_nothing_its_role_does_not_grant() {
    check_component(&["mig-manager"], &["mig-manager-run"], &["mig-manager"]).await;
}

/// Every API client in one `gpud run`, with every role: what one client does must not rely on
/// a rule another's role brings only by chance (the single ones above), and together they
/// still ask for nothing refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gpud_run_with_every_api_client_needs_nothing_the_roles_do_not_grant() {
    if !kubectl_present() {
        return;
    }
    let components = [
        "labeller-node",
        "node-status-taints",
        "remediation",
        "dra",
        "mig-manager-run",
        "pod-usage",
    ];
    let ran = check("all-in-one", &components).await;
    assert_eq!(ran.len(), 1, "{ran:?}");
    eprintln!("RBAC all-in-one + {components:?}: allowed {ran:?}");
}

/// The authorizer itself: rules by group, resource, verb, name and namespace, as RBAC applies
/// them, and the API server's wording of a refusal.
mod authorizer {
    use super::*;

    fn objects() -> Vec<Value> {
        vec![
            json!({"kind": "ClusterRole", "metadata": {"name": "status"},
                   "rules": [{"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["patch"]},
                             {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"],
                              "resourceNames": ["n1"]}]}),
            json!({"kind": "ClusterRoleBinding", "metadata": {"name": "status"},
                   "roleRef": {"kind": "ClusterRole", "name": "status"},
                   "subjects": [{"kind": "ServiceAccount", "name": "gpud", "namespace": "gpud"}]}),
            json!({"kind": "Role", "metadata": {"name": "nf", "namespace": "gpud"},
                   "rules": [{"apiGroups": ["nfd.k8s-sigs.io"], "resources": ["nodefeatures"],
                              "verbs": ["create"]}]}),
            json!({"kind": "RoleBinding", "metadata": {"name": "nf", "namespace": "gpud"},
                   "roleRef": {"kind": "Role", "name": "nf"},
                   "subjects": [{"kind": "ServiceAccount", "name": "gpud", "namespace": "gpud"}]}),
            // Bound to another account: grants gpud nothing.
            json!({"kind": "ClusterRoleBinding", "metadata": {"name": "other"},
                   "roleRef": {"kind": "ClusterRole", "name": "everything"},
                   "subjects": [{"kind": "ServiceAccount", "name": "x", "namespace": "gpud"}]}),
            json!({"kind": "ClusterRole", "metadata": {"name": "everything"},
                   "rules": [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]}),
        ]
    }

    fn refuses(rbac: &Rbac, method: &str, uri: &str) -> Option<String> {
        rbac.refuses(method, &uri.parse().unwrap())
            .map(|a| a.to_string())
    }

    #[test]
    fn rules_allow_by_group_resource_verb_name_and_namespace() {
        let rbac = Rbac::bound_to(&objects(), "gpud", "gpud");
        assert_eq!(refuses(&rbac, "PATCH", "/api/v1/nodes/n1/status"), None);
        assert_eq!(
            refuses(&rbac, "PATCH", "/api/v1/nodes/n1").as_deref(),
            Some("patch nodes n1")
        );
        assert_eq!(refuses(&rbac, "GET", "/api/v1/nodes/n1"), None);
        assert_eq!(
            refuses(&rbac, "GET", "/api/v1/nodes/n2").as_deref(),
            Some("get nodes n2")
        );
        assert_eq!(
            refuses(&rbac, "GET", "/api/v1/nodes?fieldSelector=x&watch=true").as_deref(),
            Some("watch nodes")
        );
        assert_eq!(
            refuses(&rbac, "GET", "/api/v1/nodes").as_deref(),
            Some("list nodes")
        );
        let features = "/apis/nfd.k8s-sigs.io/v1alpha1/namespaces";
        assert_eq!(
            refuses(&rbac, "POST", &format!("{features}/gpud/nodefeatures")),
            None
        );
        assert_eq!(
            refuses(
                &rbac,
                "POST",
                &format!("{features}/kube-system/nodefeatures")
            )
            .as_deref(),
            Some("create nodefeatures.nfd.k8s-sigs.io in namespace kube-system")
        );
        assert_eq!(
            refuses(&rbac, "PUT", &format!("{features}/gpud/nodefeatures/n1")).as_deref(),
            Some("update nodefeatures.nfd.k8s-sigs.io n1 in namespace gpud")
        );
        // Discovery is everyone's.
        assert_eq!(refuses(&rbac, "GET", "/apis/resource.k8s.io"), None);
        assert_eq!(refuses(&rbac, "GET", "/api"), None);
        // Another account's wildcard grants this one nothing.
        let other = Rbac::bound_to(&objects(), "gpud", "x");
        assert_eq!(refuses(&other, "DELETE", "/api/v1/nodes/n1"), None);
        assert_eq!(
            refuses(&rbac, "DELETE", "/api/v1/nodes/n1").as_deref(),
            Some("delete nodes n1")
        );
    }

    /// Remediation's requests: Leases in gpud's namespace (a create names no object, so a
    /// rule limited to names cannot allow it) and the eviction subresource of pods.
    #[test]
    fn leases_and_evictions_are_authorized_by_group_and_subresource() {
        let objects = vec![
            json!({"kind": "Role", "metadata": {"name": "slots", "namespace": "gpud"},
                   "rules": [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                              "verbs": ["get", "update"],
                              "resourceNames": ["gpud-remediation-0"]},
                             {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                              "verbs": ["create"], "resourceNames": ["gpud-remediation-0"]}]}),
            json!({"kind": "RoleBinding", "metadata": {"name": "slots", "namespace": "gpud"},
                   "roleRef": {"kind": "Role", "name": "slots"},
                   "subjects": [{"kind": "ServiceAccount", "name": "gpud", "namespace": "gpud"}]}),
            json!({"kind": "ClusterRole", "metadata": {"name": "evict"},
                   "rules": [{"apiGroups": [""], "resources": ["pods/eviction"],
                              "verbs": ["create"]}]}),
            json!({"kind": "ClusterRoleBinding", "metadata": {"name": "evict"},
                   "roleRef": {"kind": "ClusterRole", "name": "evict"},
                   "subjects": [{"kind": "ServiceAccount", "name": "gpud", "namespace": "gpud"}]}),
        ];
        let rbac = Rbac::bound_to(&objects, "gpud", "gpud");
        let leases = "/apis/coordination.k8s.io/v1/namespaces/gpud/leases";
        let slot = format!("{leases}/gpud-remediation-0");
        assert_eq!(refuses(&rbac, "GET", &slot), None);
        assert_eq!(refuses(&rbac, "PUT", &slot), None);
        assert_eq!(
            refuses(&rbac, "DELETE", &slot).as_deref(),
            Some("delete leases.coordination.k8s.io gpud-remediation-0 in namespace gpud")
        );
        assert_eq!(
            refuses(&rbac, "GET", &format!("{leases}/gpud-remediation-1")).as_deref(),
            Some("get leases.coordination.k8s.io gpud-remediation-1 in namespace gpud")
        );
        assert_eq!(
            refuses(&rbac, "POST", leases).as_deref(),
            Some("create leases.coordination.k8s.io in namespace gpud")
        );
        assert_eq!(
            refuses(&rbac, "POST", "/api/v1/namespaces/ml/pods/train/eviction"),
            None
        );
        // The subresource grants nothing on the pod itself.
        assert_eq!(
            refuses(&rbac, "DELETE", "/api/v1/namespaces/ml/pods/train").as_deref(),
            Some("delete pods train in namespace ml")
        );
        let eviction = Attributes::of(
            "POST",
            &"/api/v1/namespaces/ml/pods/train/eviction".parse().unwrap(),
        )
        .unwrap();
        assert_eq!(
            eviction.forbidden_message("system:serviceaccount:gpud:other"),
            "pods \"train\" is forbidden: User \"system:serviceaccount:gpud:other\" cannot \
             create resource \"pods/eviction\" in API group \"\" in the namespace \"ml\""
        );
    }

    #[test]
    fn the_refusal_reads_as_the_api_servers() {
        let patch = Attributes::of("PATCH", &"/api/v1/nodes/n1/status".parse().unwrap()).unwrap();
        assert_eq!(
            patch.forbidden_message("system:serviceaccount:gpud:gpud"),
            "nodes \"n1\" is forbidden: User \"system:serviceaccount:gpud:gpud\" cannot patch \
             resource \"nodes/status\" in API group \"\" at the cluster scope"
        );
        let create = Attributes::of(
            "POST",
            &"/apis/nfd.k8s-sigs.io/v1alpha1/namespaces/gpud/nodefeatures"
                .parse()
                .unwrap(),
        )
        .unwrap();
        assert_eq!(
            create.forbidden_message("system:serviceaccount:gpud:gpud"),
            "nodefeatures.nfd.k8s-sigs.io is forbidden: User \"system:serviceaccount:gpud:gpud\" \
             cannot create resource \"nodefeatures\" in API group \"nfd.k8s-sigs.io\" in the \
             namespace \"gpud\""
        );
    }

    /// A manifest without the rule gpud needs fails the check, naming the request: the check
    /// itself can fail.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_missing_rule_is_caught() {
        missing_rule_is_caught(
            &["node-status"],
            ("gpud-node-status", "nodes/status"),
            |_| {},
            &format!("patch nodes/status {NODE}"),
            "cannot patch resource \"nodes/status\"",
        );
    }

    /// The same for the remediation's eviction rule: the pod holding a GPU to be reset is not
    /// evicted.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_missing_eviction_rule_is_caught() {
        let (namespace, pod) = TRAINING_POD;
        missing_rule_is_caught(
            &["node-status", "remediation"],
            ("gpud-remediation", "pods/eviction"),
            |running| {
                // The health watcher runs once the node status has published.
                running.answered(1, "PATCH", &format!("/api/v1/nodes/{NODE}/status"), || {});
                running
                    .node
                    .inject(&format!("process {RESET_GPU} {TRAINING_PID} 1024"));
                running.node.inject(&format!("xid {RESET_GPU} 95"));
            },
            &format!("create pods/eviction {pod} in namespace {namespace}"),
            "cannot create resource \"pods/eviction\"",
        );
    }

    /// Runs the node-status container of base + `components` with the rules for `resource`
    /// dropped from the (Cluster)Role `role`, driven by `drive`: the first request refused is
    /// `refused`, and gpud's log says so in the API server's words (`words`).
    fn missing_rule_is_caught(
        components: &[&str],
        (role, resource): (&str, &str),
        drive: impl FnOnce(&Running),
        refused: &str,
        words: &str,
    ) {
        if !kubectl_present() {
            return;
        }
        let mut objects = render("base", components);
        for object in &mut objects {
            let kind = object["kind"].as_str().unwrap_or_default();
            if kind.ends_with("Role") && object["metadata"]["name"] == role {
                let rules = object["rules"].as_array_mut().unwrap();
                rules.retain(|r| r["resources"] != json!([resource]));
            }
        }
        let rbac = Rbac::bound_to(&objects, ACCOUNT.0, ACCOUNT.1);
        let pod =
            &objects.iter().find(|o| o["kind"] == "DaemonSet").unwrap()["spec"]["template"]["spec"];
        let manifest = pod["containers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == "node-status")
            .unwrap();
        let container = Container::from_manifest(manifest, pod, &objects);
        let what = format!("{components:?} without {resource}");
        let running = Running::start(what.clone(), &container, rbac);
        drive(&running);
        let first = common::until(&format!("{what}: a refusal"), 30, || {
            let forbidden = running.api.forbidden();
            forbidden.into_iter().next().ok_or_else(|| running.log())
        });
        assert_eq!(first.0, refused);
        // gpud says what was refused, in the API server's words (quoted in its log or not).
        let escaped = words.replace('"', "\\\"");
        common::until(&format!("{what}: {words:?} in gpud's log"), 30, || {
            let log = running.log();
            (log.contains(words) || log.contains(&escaped))
                .then_some(())
                .ok_or(log)
        });
    }
}
