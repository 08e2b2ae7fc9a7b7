//! gpud's runtime side on a real container runtime: containerd 1.7 and 2.x, each configured by
//! `gpud runtime configure --enable-cdi` from its own default config, run as daemons (see
//! tests/runtime/containerd.rs) and driven through the CRI API as a kubelet drives them —
//! RunPodSandbox (host network), CreateContainer with `CDI_devices` and with a `cdi.k8s.io/`
//! annotation, StartContainer, ContainerStatus (verbose), ExecSync, teardown. The GPUs are the
//! simulated node's, their device nodes made here with mknod and their driver libraries built
//! here; the specs are written by `gpud cdi generate`, the CDI names handed out by
//! `gpud device-plugin`'s Allocate. Inside each container the test checks what the spec says
//! is there: exactly the allocated GPU's node and the control nodes, the env, the mounted
//! libraries, and the effects of gpud's `createContainer` hooks (the `create-symlinks` link,
//! the linker cache naming the mounted libraries). `--revert` then gives back the default
//! config, and containerd still starts with it. `gpud exporter --pod-usage-cri-socket` names a
//! container's GPU process from containerd's lists.
//!
//! Root only (mknod, mounts, cgroups); skipped without containerd, runc or root unless `CI`
//! is set. One daemon per version serves every case.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
#[path = "runtime/containerd.rs"]
mod containerd;
#[path = "runtime/cri_api.rs"]
mod cri_api;
#[allow(dead_code)] // the exporter tests' harness; only part of it is used here
#[path = "exporter/harness.rs"]
mod exporter;
#[path = "common/fake_api.rs"]
mod fake_api;
#[path = "common/fake_dra_kubelet.rs"]
mod fake_dra_kubelet;
#[path = "common/fake_kubelet.rs"]
mod fake_kubelet;
#[path = "common/raw_grpc.rs"]
mod raw_grpc;

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};

use common::{Node, gpud_bin, stdout_ok};
use containerd::{Build, Containerd, Pod, V1_7, V2, mknod_memory_device};
use cri_api::{CdiDevice, Cri, KeyValue, RUNNING};
use fake_api::FakeApi;
use fake_kubelet::FakeKubelet;
use gpud::proto::deviceplugin::{AllocateRequest, ContainerAllocateRequest};
use gpud::proto::dra_v1::{NodePrepareResourcesRequest, NodeUnprepareResourcesRequest};
use serde_json::{Value, json};

/// The simulated node's driver version (fixture `pcie-4gpu`).
const DRIVER: &str = "570.133.20";
const LIB_DIR: &str = "/usr/lib/x86_64-linux-gnu";
/// The driver libraries the fake installation has, by SONAME.
const LIBRARIES: &[&str] = &["libcuda", "libnvidia-ml"];
/// The host folders containerd would write to with its defaults: none may appear or vanish.
const HOST_PATHS: &[&str] = &[
    "/var/lib/containerd",
    "/opt/containerd",
    "/etc/cni",
    "/opt/cni",
    "/var/run/nri",
    "/var/run/cdi/nvidia.json",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn containerd_1_7_runs_gpu_containers_from_gpuds_specs() {
    runs_gpu_containers(V1_7).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn containerd_2_runs_gpu_containers_from_gpuds_specs() {
    runs_gpu_containers(V2).await;
}

/// The device nodes of the fake installation and the memory device each stands for (major 1):
/// each GPU a different one, so a container's node tells which host node it was given.
const NODES: &[(&str, u32)] = &[
    ("nvidia0", 3),
    ("nvidia1", 5),
    ("nvidia2", 7),
    ("nvidia3", 9),
    ("nvidiactl", 3),
    ("nvidia-uvm", 3),
];

/// A fake driver installation on the simulated node: device nodes under `devroot/dev` (made
/// with mknod) and real shared libraries with the driver's SONAMEs under `driver`.
struct FakeDriver {
    dir: PathBuf,
}

impl FakeDriver {
    fn new(node: &Node) -> FakeDriver {
        let dir = node.dir.path().to_path_buf();
        for (name, minor) in NODES {
            mknod_memory_device(&dir.join("devroot/dev").join(name), *minor);
        }
        let libs = dir.join("driver").join(LIB_DIR.trim_start_matches('/'));
        fs::create_dir_all(&libs).unwrap();
        let source = dir.join("empty.c");
        fs::write(&source, "int gpud_driver_symbol(void) { return 1; }\n").unwrap();
        for lib in LIBRARIES {
            let output = Command::new("cc")
                .args(["-shared", "-fPIC", "-nostdlib", "-o"])
                .arg(libs.join(format!("{lib}.so.{DRIVER}")))
                .arg(format!("-Wl,-soname,{lib}.so.1"))
                .arg(&source)
                .output()
                .unwrap();
            assert!(output.status.success(), "cc: {output:?}");
        }
        FakeDriver { dir }
    }

    /// `gpud cdi generate` for this installation into `out`, with `extra` flags; the spec.
    fn generate(&self, node: &Node, out: &Path, extra: &[&str]) -> Value {
        let root = |rel: &str| self.dir.join(rel).display().to_string();
        let (driver, dev, hook) = (root("driver"), root("devroot"), gpud_bin());
        let mut args = vec![
            "cdi",
            "generate",
            "--driver-root",
            &driver,
            "--dev-root",
            &dev,
            "--nvidia-cdi-hook-path",
            hook.to_str().unwrap(),
            "--device-name-strategy",
            "index",
            "--output",
            out.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        stdout_ok(&node.run(&args));
        serde_json::from_str(&fs::read_to_string(out).unwrap()).unwrap()
    }
}

/// A CDI name as the kubelet passes it in `CDI_devices`.
fn cdi_field(names: &[String]) -> Vec<CdiDevice> {
    names
        .iter()
        .map(|name| CdiDevice { name: name.clone() })
        .collect()
}

/// ExecSync's stdout, the command having exited 0.
async fn exec(cri: &mut Cri, id: &str, cmd: &[&str]) -> String {
    let answer = cri.exec_sync(id, cmd).await;
    assert_eq!(
        answer.exit_code,
        0,
        "{cmd:?} in {id}: {}",
        String::from_utf8_lossy(&answer.stderr)
    );
    String::from_utf8(answer.stdout).unwrap()
}

/// The edits `spec` makes for its device `name`: the device's own and the spec's shared ones.
fn edits<'a>(spec: &'a Value, name: &str) -> [&'a Value; 2] {
    let device = spec["devices"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["name"] == name)
        .unwrap_or_else(|| panic!("no device {name} in {spec}"));
    [&device["containerEdits"], &spec["containerEdits"]]
}

fn all<'a>(edits: &[&'a Value], key: &str) -> Vec<&'a Value> {
    edits
        .iter()
        .filter_map(|e| e[key].as_array())
        .flatten()
        .collect()
}

/// Asserts that container `id` got exactly what `spec` gives device `name` (GPU `minor`):
/// in the OCI spec containerd made (device nodes, gpud's hooks in order), and inside the
/// running container (only this GPU's node beside the control nodes, the host node it names,
/// the control node writable; the env; the
/// mounted libraries byte for byte; the `create-symlinks` link; the libraries in the linker
/// cache `update-ldcache` rebuilt).
async fn assert_gpu(cri: &mut Cri, id: &str, spec: &Value, name: &str, minor: u32) {
    let edits = edits(spec, name);
    let status = cri.container_status(id).await;
    assert_eq!(status.status.as_ref().unwrap().state, RUNNING);
    let info: Value = serde_json::from_str(&status.info["info"]).unwrap();
    let oci = &info["runtimeSpec"];

    let mut nodes: Vec<&str> = all(&edits, "deviceNodes")
        .iter()
        .map(|n| n["path"].as_str().unwrap())
        .collect();
    nodes.sort_unstable();
    let gpu = format!("/dev/nvidia{minor}");
    assert_eq!(nodes, ["/dev/nvidia-uvm", &gpu, "/dev/nvidiactl"]);
    let mut in_oci: Vec<&str> = oci["linux"]["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["path"].as_str().unwrap())
        .collect();
    in_oci.sort_unstable();
    assert_eq!(in_oci, nodes, "{oci}");
    let hooks: Vec<(&Value, &Value)> = all(&edits, "hooks")
        .iter()
        .map(|h| (&h["path"], &h["args"]))
        .collect();
    let oci_hooks: Vec<(&Value, &Value)> = oci["hooks"]["createContainer"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| (&h["path"], &h["args"]))
        .collect();
    assert_eq!(oci_hooks, hooks);
    assert_eq!(hooks.len(), 4, "{hooks:?}");
    assert!(
        hooks
            .iter()
            .all(|(path, _)| *path == gpud_bin().to_str().unwrap())
    );

    // Inside: exactly this GPU and the control nodes, character devices it can write.
    let listed = exec(cri, id, &["sh", "-c", "ls /dev | grep nvidia"]).await;
    let mut expected: Vec<String> = nodes
        .iter()
        .map(|p| p.trim_start_matches("/dev/").to_owned())
        .collect();
    expected.sort_unstable();
    let mut seen: Vec<String> = listed.lines().map(str::to_owned).collect();
    seen.sort_unstable();
    assert_eq!(seen, expected);
    let kind = exec(cri, id, &["stat", "-c", "%F %t:%T", &gpu]).await;
    let host = NODES[usize::try_from(minor).unwrap()].1;
    assert_eq!(kind, format!("character special file 1:{host:x}\n"));
    exec(cri, id, &["sh", "-c", "echo gpu > /dev/nvidiactl"]).await;

    let env = exec(cri, id, &["env"]).await;
    for var in all(&edits, "env") {
        let var = var.as_str().unwrap();
        assert!(env.lines().any(|l| l == var), "{var} not in:\n{env}");
    }
    let mounts = all(&edits, "mounts");
    assert_eq!(mounts.len(), LIBRARIES.len());
    for mount in mounts {
        let inside = mount["containerPath"].as_str().unwrap();
        let host = fs::read(mount["hostPath"].as_str().unwrap()).unwrap();
        let answer = cri.exec_sync(id, &["cat", inside]).await;
        assert_eq!(answer.exit_code, 0);
        assert!(
            answer.stdout == host,
            "{inside} differs from the host's file"
        );
    }

    // gpud's hooks ran: create-symlinks' link, and update-ldcache's cache.
    let link = exec(cri, id, &["readlink", &format!("{LIB_DIR}/libcuda.so")]).await;
    assert_eq!(link, "libcuda.so.1\n");
    let cache = exec(cri, id, &["ldconfig", "-p"]).await;
    for lib in LIBRARIES {
        let line = format!("{lib}.so.1 (libc6,x86-64) => {LIB_DIR}/{lib}.so.1");
        assert!(
            cache.lines().any(|l| l.trim() == line),
            "no {line:?} in:\n{cache}"
        );
    }
}

/// A running `gpud device-plugin`, killed on drop.
struct Plugin(Child);

impl Drop for Plugin {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// What must not change on the host: which of [`HOST_PATHS`] exist.
fn host_state() -> Vec<(&'static str, bool)> {
    HOST_PATHS
        .iter()
        .map(|p| (*p, Path::new(p).exists()))
        .collect()
}

async fn runs_gpu_containers(build: Build) {
    if containerd::missing(build) {
        return;
    }
    let host_before = host_state();
    let node = Node::new("pcie-4gpu");
    let driver = FakeDriver::new(&node);
    let mut containerd = Containerd::prepare(build);
    let default = fs::read_to_string(&containerd.config).unwrap();

    // Item 1: configured by gpud, from containerd's own default config.
    // Two spec folders: the node's (`gpud cdi generate` writes there) and the DRA plugin's.
    let dra_cdi = node.dir.path().join("cdi");
    fs::create_dir_all(&dra_cdi).unwrap();
    let cdi_dir = containerd.cdi.display().to_string();
    let dirs = format!("{cdi_dir},{}", dra_cdi.display());
    containerd.configure(&["--enable-cdi", "--cdi-spec-dirs", &dirs]);
    let mut dump = containerd.command("containerd", &["--config"]);
    let dump = stdout_ok(
        &dump
            .arg(&containerd.config)
            .args(["config", "dump"])
            .output()
            .unwrap(),
    );
    // 2.x quotes strings with '.
    let dump = dump.replace('\'', "\"");
    assert!(dump.contains("enable_cdi = true"), "{dump}");
    let listed = format!("cdi_spec_dirs = [\"{cdi_dir}\", \"{}\"]", dra_cdi.display());
    assert!(dump.contains(&listed), "{dump}");

    containerd.start();
    let (mut cri, version) = Cri::connect(&containerd.socket).await;
    eprintln!(
        "containerd {} (Debian {}, config version {}, CRI {})",
        version.runtime_version, build.suite, build.config_version, version.runtime_api_version
    );
    assert_eq!(version.runtime_name, "containerd");
    assert!(
        version.runtime_version.starts_with(build.version),
        "{version:?}"
    );
    assert_eq!(version.runtime_api_version, "v1");
    containerd.import_image(&mut cri).await;

    // `gpud cdi generate`'s spec, asked for through the CRI field and the annotation.
    let spec = driver.generate(&node, &containerd.cdi.join("nvidia.json"), &[]);
    let mut pod = Pod::run(&mut cri, &containerd, "gpu-pod", &pod_uid(1)).await;
    let mut config = pod.container("cdi-field");
    config.cdi_devices = cdi_field(&["nvidia.com/gpu=1".into()]);
    let field = pod.start(&mut cri, config).await.unwrap();
    assert_gpu(&mut cri, &field, &spec, "1", 1).await;
    let mut config = pod.container("cdi-annotation");
    config
        .annotations
        .insert("cdi.k8s.io/gpud-test_gpu".into(), "nvidia.com/gpu=2".into());
    let annotated = pod.start(&mut cri, config).await.unwrap();
    assert_gpu(&mut cri, &annotated, &spec, "2", 2).await;
    let mut config = pod.container("unknown-gpu");
    config.cdi_devices = cdi_field(&["nvidia.com/gpu=9".into()]);
    let refused = pod.start(&mut cri, config).await.unwrap_err();
    assert!(
        refused.contains("unresolvable CDI devices nvidia.com/gpu=9"),
        "{refused}"
    );

    // Item 2: the device plugin's Allocate, its answer passed on as the kubelet does.
    let plugin_spec = driver.generate(
        &node,
        &containerd.cdi.join("k8s-device-plugin.json"),
        &["--vendor", "k8s.device-plugin.nvidia.com", "--class", "gpu"],
    );
    let mut kubelet = FakeKubelet::start(node.dir.path()).await;
    let log = fs::File::create(node.dir.path().join("device-plugin.log")).unwrap();
    let socket = kubelet.socket();
    let _plugin = Plugin(
        node.gpud(&[
            "device-plugin",
            "--kubelet-socket",
            socket.to_str().unwrap(),
            "--kmsg",
            "",
            "--device-list-strategy",
            "cdi-cri,cdi-annotations",
            "--device-id-strategy",
            "index",
        ])
        .stderr(log)
        .spawn()
        .unwrap(),
    );
    let registration = kubelet.next_registration(10).await;
    let mut plugin = kubelet.plugin(&registration.endpoint).await;
    let mut allocate = async |ids: &[&str]| {
        let request = AllocateRequest {
            container_requests: vec![ContainerAllocateRequest {
                devices_ids: ids.iter().map(|s| (*s).to_owned()).collect(),
            }],
        };
        let answer = plugin.allocate(request).await.unwrap().into_inner();
        answer.container_responses.into_iter().next().unwrap()
    };
    let envs = |envs: &HashMap<String, String>| -> Vec<KeyValue> {
        envs.iter()
            .map(|(key, value)| KeyValue {
                key: key.clone(),
                value: value.clone(),
            })
            .collect()
    };

    // cdi-cri: the names in `CDI_devices`.
    let answer = allocate(&["3"]).await;
    let names: Vec<String> = answer.cdi_devices.iter().map(|d| d.name.clone()).collect();
    assert_eq!(names, ["k8s.device-plugin.nvidia.com/gpu=3"]);
    let mut config = pod.container("plugin-cdi-cri");
    config.cdi_devices = cdi_field(&names);
    config.envs = envs(&answer.envs);
    let by_field = pod.start(&mut cri, config).await.unwrap();
    assert_gpu(&mut cri, &by_field, &plugin_spec, "3", 3).await;

    // cdi-annotations: the annotation alone.
    let answer = allocate(&["0"]).await;
    assert_eq!(answer.annotations.len(), 1, "{:?}", answer.annotations);
    let (key, value) = answer.annotations.iter().next().unwrap();
    assert!(key.starts_with("cdi.k8s.io/"), "{key}");
    assert_eq!(value, "k8s.device-plugin.nvidia.com/gpu=0");
    let mut config = pod.container("plugin-cdi-annotations");
    config.annotations.extend(answer.annotations.clone());
    config.envs = envs(&answer.envs);
    let by_annotation = pod.start(&mut cri, config).await.unwrap();
    assert_gpu(&mut cri, &by_annotation, &plugin_spec, "0", 0).await;

    // Item 6: an MPS share, with the pipe folder and shm gpud's Allocate names.
    mps_share_reaches_the_container(&node, &mut cri, &mut pod, &plugin_spec).await;

    // Item 4: per-pod usage named by containerd's CRI.
    pod_usage_names_the_container(&node, &containerd, &mut cri, &mut pod, &field).await;

    // Item 3: a claim prepared by `gpud dra`, resolved from the spec gpud wrote for it.
    dra_claim_reaches_the_container(&node, &mut cri, &mut pod).await;

    pod.remove(&mut cri).await;
    containerd.stop();

    // `--revert` gives back containerd's default, which it still starts with.
    containerd.configure(&["--revert"]);
    assert_eq!(fs::read_to_string(&containerd.config).unwrap(), default);
    containerd.start();
    let (cri, version) = Cri::connect(&containerd.socket).await;
    assert_eq!(version.runtime_name, "containerd");
    drop(cri);

    // Nothing left: no process naming the daemon's socket, no cgroup folder, no host folder.
    let socket = containerd.socket.display().to_string();
    let cgroup = containerd.cgroup.clone();
    drop(containerd);
    assert_eq!(containerd::processes_naming(&socket), Vec::<i32>::new());
    assert_eq!(containerd::cgroup_roots(&cgroup), Vec::<PathBuf>::new());
    assert_eq!(host_state(), host_before);
}

/// `gpud exporter --pod-usage-cri-socket <containerd's socket>` names the pod, namespace and
/// container of container `id`'s process (its host PID from ContainerStatus, made a process
/// of GPU 1 by the simulated driver) from containerd's lists; the container removed, its
/// series goes.
async fn pod_usage_names_the_container(
    node: &Node,
    containerd: &Containerd,
    cri: &mut Cri,
    pod: &mut Pod,
    id: &str,
) {
    const MEMORY: &str = "gpud_container_gpu_memory_used_bytes";
    let info: Value = serde_json::from_str(&cri.container_status(id).await.info["info"]).unwrap();
    let pid = info["pid"].as_u64().unwrap();
    let cgroup = fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    assert!(cgroup.contains(&format!("/{id}\n")), "{cgroup}");
    node.inject(&format!("process 1 {pid} 1024 40"));
    let socket = containerd.socket.display().to_string();
    let usage = exporter::Exporter::start_with(
        node,
        &[
            "--pod-usage",
            "--pod-usage-cri-socket",
            &socket,
            "--node-name",
            "",
        ],
        // The real clock: per-process samples keep coming.
        &[("NVML_MOCK_CLOCK", "")],
    );
    let named = |body: &str| {
        exporter::family(body, MEMORY)
            .into_iter()
            .filter(|l| l.contains("pod=\"gpu-pod\""))
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    let body = usage.metrics_until(20, |b| !named(b).is_empty());
    let lines = named(&body);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(
        lines[0].starts_with(&format!("{MEMORY}{{gpu=\"1\",")),
        "{}",
        lines[0]
    );
    assert!(
        lines[0].ends_with(
            ",container=\"cdi-field\",namespace=\"gpud-test\",pod=\"gpu-pod\"} 1073741824"
        ),
        "{}",
        lines[0]
    );
    pod.remove_container(cri, id).await;
    usage.metrics_until(20, |b| named(b).is_empty());
    node.inject(&format!("process-end 1 {pid}"));
}

/// `gpud dra` prepares a claim for GPU 2 (NodePrepareResources, as the kubelet); containerd
/// resolves the CDI ID it answers from the spec gpud wrote for the claim, and the container
/// gets exactly that GPU. Unprepared, the claim's spec is gone and a new container asking for
/// the ID gets containerd's error.
async fn dra_claim_reaches_the_container(node: &Node, cri: &mut Cri, pod: &mut Pod) {
    let api = FakeApi::start(json!({}));
    let kubeconfig = api.kubeconfig(node.dir.path());
    let dev_root = node.dir.path().join("devroot").display().to_string();
    let mut args: Vec<String> = vec!["dra".into()];
    args.extend(node.dra_flags());
    args.extend(
        [
            "--dra-dev-root",
            &dev_root,
            "--dra-nvidia-cdi-hook-path",
            gpud_bin().to_str().unwrap(),
            "--kubeconfig",
            kubeconfig.to_str().unwrap(),
            "--kmsg",
            "",
        ]
        .map(String::from),
    );
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let log = fs::File::create(node.dir.path().join("dra.log")).unwrap();
    let _dra = Plugin(node.gpud(&args).stderr(log).spawn().unwrap());
    let registration = node
        .dir
        .path()
        .join("plugins_registry/gpu.nvidia.com-reg.sock");
    common::until("the DRA plugin's registration socket", 15, || {
        std::os::unix::net::UnixStream::connect(&registration).map_err(|e| {
            format!(
                "{e}: {}",
                fs::read_to_string(node.dir.path().join("dra.log")).unwrap_or_default()
            )
        })
    });
    fake_dra_kubelet::register(&registration).await;
    let plugin = node.dir.path().join("plugins/gpu.nvidia.com/dra.sock");

    let uid = "claim-uid-2";
    api.put_claim(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"namespace": "gpud-test", "name": "gpu-claim", "uid": uid},
        "status": {"allocation": {"devices": {"results": [{"request": "gpu",
            "driver": "gpu.nvidia.com", "pool": "test-node", "device": "gpu-2"}]}}}
    }));
    let claim = || fake_dra_kubelet::claim_v1("gpud-test", "gpu-claim", uid);
    let request = NodePrepareResourcesRequest {
        claims: vec![claim()],
    };
    let answer = fake_dra_kubelet::prepare_v1(&plugin, request).await;
    assert_eq!(answer.claims[uid].error, "");
    let ids: Vec<String> = answer.claims[uid]
        .devices
        .iter()
        .flat_map(|d| d.cdi_device_ids.clone())
        .collect();
    let id = format!("k8s.gpu.nvidia.com/claim={uid}-gpu-2");
    assert_eq!(ids, std::slice::from_ref(&id));
    let spec_file = node
        .dir
        .path()
        .join(format!("cdi/k8s.gpu.nvidia.com-claim_{uid}.yaml"));
    let spec: Value = serde_yaml_ng::from_str(&fs::read_to_string(&spec_file).unwrap()).unwrap();

    let mut config = pod.container("dra-claim");
    config.cdi_devices = cdi_field(&ids);
    let claimed = pod.start(cri, config).await.unwrap();
    assert_gpu(cri, &claimed, &spec, &format!("{uid}-gpu-2"), 2).await;

    let request = NodeUnprepareResourcesRequest {
        claims: vec![claim()],
    };
    let answer = fake_dra_kubelet::unprepare_v1(&plugin, request).await;
    assert_eq!(answer.claims[uid].error, "");
    assert!(!spec_file.exists(), "the claim's spec is still there");
    let mut config = pod.container("dra-unprepared");
    config.cdi_devices = cdi_field(&ids);
    let refused = pod.start(cri, config).await.unwrap_err();
    assert!(
        refused.contains(&format!("unresolvable CDI devices {id}")),
        "{refused}"
    );
}

/// `gpud run` with an MPS sharing config (a stand-in control binary, 4 replicas per GPU) and
/// the `cdi-cri` strategy allocates a share of GPU 1; its answer passed on as the kubelet
/// does, the container gets the GPU, the env naming the pipe folder, and the daemon's pipe
/// folder and shm mounted where Allocate says: files gpud's daemon made there are seen inside.
async fn mps_share_reaches_the_container(
    node: &Node,
    cri: &mut Cri,
    pod: &mut Pod,
    plugin_spec: &Value,
) {
    let bin = node.dir.path().join("bin");
    fs::create_dir_all(&bin).unwrap();
    let control =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/mps/nvidia-cuda-mps-control");
    fs::copy(control, bin.join("nvidia-cuda-mps-control")).unwrap();
    let root = node.dir.path().join("mps");
    let config = node.dir.path().join("mps.yaml");
    fs::write(
        &config,
        format!(
            "version: v1\nflags:\n  mpsRoot: {}\nsharing:\n  mps:\n    resources:\n    \
             - name: nvidia.com/gpu\n      replicas: 4\n",
            root.display()
        ),
    )
    .unwrap();
    let kubelet_dir = node.dir.path().join("mps-kubelet");
    fs::create_dir_all(&kubelet_dir).unwrap();
    let mut kubelet = FakeKubelet::start(&kubelet_dir).await;
    let port = common::http::free_port();
    let address = format!("127.0.0.1:{port}");
    let socket = kubelet.socket();
    let log = fs::File::create(node.dir.path().join("mps.log")).unwrap();
    let mut command = node.gpud(&[
        "run",
        "--disable",
        "labeller,exporter",
        "--doctor-interval",
        "0",
        "--kmsg",
        "",
        "--config-file",
        config.to_str().unwrap(),
        "--kubelet-socket",
        socket.to_str().unwrap(),
        "--device-list-strategy",
        "cdi-cri",
        "--device-id-strategy",
        "index",
        "--mps-skip-shm-mount",
        "--mps-probe-interval",
        "100ms",
        "--health-address",
        &address,
    ]);
    #[allow(clippy::disallowed_methods)] // the fake control binary goes first on the PATH
    let path = std::env::var("PATH").unwrap_or_default();
    command.env("PATH", format!("{}:{path}", bin.display()));
    let mut gpud = Plugin(command.stderr(log).spawn().unwrap());
    common::http::wait_for(port, "/readyz", 20, |a| a.status == 200);
    let registration = kubelet.next_registration(10).await;
    let mut plugin = kubelet.plugin(&registration.endpoint).await;
    let request = AllocateRequest {
        container_requests: vec![ContainerAllocateRequest {
            devices_ids: vec!["1::2".into()],
        }],
    };
    let answer = plugin.allocate(request).await.unwrap().into_inner();
    let answer = answer.container_responses.into_iter().next().unwrap();
    let names: Vec<String> = answer.cdi_devices.iter().map(|d| d.name.clone()).collect();
    assert_eq!(names, ["k8s.device-plugin.nvidia.com/gpu=1"]);
    let pipe = "/mps/nvidia.com/gpu/pipe";
    assert_eq!(answer.envs["CUDA_MPS_PIPE_DIRECTORY"], pipe);
    let mounts: Vec<(&str, String)> = answer
        .mounts
        .iter()
        .map(|m| (m.container_path.as_str(), m.host_path.clone()))
        .collect();
    let resource = root.join("nvidia.com/gpu");
    let host_pipe = resource.join("pipe").display().to_string();
    let host_shm = root.join("shm").display().to_string();
    assert_eq!(
        mounts,
        [(pipe, host_pipe.clone()), ("/dev/shm", host_shm.clone())]
    );
    fs::write(root.join("shm/gpud-test"), "shared\n").unwrap();

    let mut config = pod.container("mps-share");
    config.cdi_devices = cdi_field(&names);
    config.envs = answer
        .envs
        .iter()
        .map(|(key, value)| KeyValue {
            key: key.clone(),
            value: value.clone(),
        })
        .collect();
    config.mounts = answer
        .mounts
        .iter()
        .map(|m| cri_api::Mount {
            container_path: m.container_path.clone(),
            host_path: m.host_path.clone(),
            readonly: m.read_only,
        })
        .collect();
    let share = pod.start(cri, config).await.unwrap();
    assert_gpu(cri, &share, plugin_spec, "1", 1).await;
    let env = exec(cri, &share, &["env"]).await;
    assert!(
        env.lines()
            .any(|l| l == format!("CUDA_MPS_PIPE_DIRECTORY={pipe}")),
        "{env}"
    );
    let daemon = fs::read_to_string(resource.join("pipe/fake-daemon.pid")).unwrap();
    let seen = exec(cri, &share, &["cat", &format!("{pipe}/fake-daemon.pid")]).await;
    assert_eq!(seen, daemon);
    assert_eq!(
        exec(cri, &share, &["cat", "/dev/shm/gpud-test"]).await,
        "shared\n"
    );
    pod.remove_container(cri, &share).await;
    // SIGTERM, so gpud quits its (stand-in) MPS daemon before it goes.
    let pid = nix::unistd::Pid::from_raw(i32::try_from(gpud.0.id()).unwrap());
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    common::until("gpud run to stop", 10, || {
        match gpud.0.try_wait().unwrap() {
            Some(_) => Ok(()),
            None => Err("still running".to_owned()),
        }
    });
}

/// A pod UID in the form the kubelet's cgroup names carry (the exporter reads them back).
fn pod_uid(n: u32) -> String {
    format!("{:08x}-9c1e-4d2b-8a2f-{n:012x}", std::process::id())
}
