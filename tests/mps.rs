//! MPS sharing end to end: `gpud run` (device plugin and MPS control daemons) and
//! `gpud mps-control-daemon` against the simulated node, a fake kubelet, and a fake
//! `nvidia-cuda-mps-control` (tests/fixtures/mps) that records every invocation.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
#[path = "common/fake_api.rs"]
mod fake_api;
#[path = "common/fake_kubelet.rs"]
mod fake_kubelet;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use common::{Node, http, stdout_ok};
use fake_api::FakeApi;
use fake_kubelet::{FakeKubelet, list_and_watch, next_list};
use gpud::proto::deviceplugin::{
    AllocateRequest, ContainerAllocateRequest, ContainerAllocateResponse, Mount,
};
use serde_json::Value;

/// The fake control binary copied into a `bin` folder of the node, where it records.
fn fake_control(node: &Node) -> PathBuf {
    let bin = node.dir.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let script =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/mps/nvidia-cuda-mps-control");
    std::fs::copy(&script, bin.join("nvidia-cuda-mps-control")).unwrap();
    bin
}

/// The recorded invocations, without the health probes (their number depends on timing).
fn recorded(bin: &Path) -> Vec<String> {
    std::fs::read_to_string(bin.join("mps-record.log"))
        .unwrap_or_default()
        .lines()
        .filter(|l| !l.starts_with("get_default_active_thread_percentage "))
        .map(str::to_owned)
        .collect()
}

/// Waits (up to 10 s) until `accept` holds for the recorded invocations.
fn wait_recorded(bin: &Path, accept: impl Fn(&[String]) -> bool) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let lines = recorded(bin);
        if accept(&lines) {
            return lines;
        }
        assert!(
            Instant::now() < deadline,
            "recorded so far:\n{}",
            lines.join("\n")
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Compute modes the simulated driver holds, by GPU UUID (only those changed from the
/// fixture's DEFAULT appear).
fn compute_modes(node: &Node) -> BTreeMap<String, u64> {
    let Ok(text) = std::fs::read_to_string(node.state_path()) else {
        return BTreeMap::new();
    };
    let state: Value = serde_json::from_str(&text).unwrap();
    state["compute_modes"]
        .as_object()
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k.clone(), v.as_u64().unwrap()))
                .collect()
        })
        .unwrap_or_default()
}

/// The environment a daemon of `dir` (`<mpsRoot>/<resource>`) over `gpus` is recorded with.
fn daemon_env(dir: &Path, gpus: &[impl AsRef<str>]) -> String {
    let gpus: Vec<&str> = gpus.iter().map(AsRef::as_ref).collect();
    format!(
        "CUDA_MPS_LOG_DIRECTORY={0}/log CUDA_MPS_PIPE_DIRECTORY={0}/pipe CUDA_VISIBLE_DEVICES={1}",
        dir.display(),
        gpus.join(",")
    )
}

fn uuids(node: &Node) -> Vec<String> {
    let inv: Value = serde_json::from_str(&stdout_ok(&node.run(&["inventory"]))).unwrap();
    inv["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["uuid"].as_str().unwrap().to_owned())
        .collect()
}

fn write_config(node: &Node, body: &str) -> PathBuf {
    let path = node.dir.path().join("config.yaml");
    std::fs::write(&path, body).unwrap();
    path
}

fn mps_config(root: &Path, replicas: u32) -> String {
    format!(
        "version: v1\nflags:\n  mpsRoot: {}\nsharing:\n  mps:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: {replicas}\n",
        root.display()
    )
}

/// A running gpud, stopped if the test ends before it did: SIGTERM first, so that it quits
/// its (fake) MPS daemons, then SIGKILL.
struct Gpud(Child);

impl Drop for Gpud {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = Command::new("kill")
                .args(["-TERM", &self.0.id().to_string()])
                .status();
            let deadline = Instant::now() + Duration::from_secs(5);
            while matches!(self.0.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `gpud <args>` on `node` with the fake control binary first on PATH; stderr to gpud.log.
fn spawn(node: &Node, bin: &Path, args: &[&str]) -> Gpud {
    spawn_logged(node, bin, args, "gpud.log")
}

/// [`spawn`] with stderr to `log`, a file in the node's folder.
fn spawn_logged(node: &Node, bin: &Path, args: &[&str], log: &str) -> Gpud {
    let log = std::fs::File::create(node.dir.path().join(log)).unwrap();
    let mut cmd: Command = node.gpud(args);
    #[allow(clippy::disallowed_methods)]
    let path = std::env::var("PATH").unwrap_or_default();
    cmd.env("PATH", format!("{}:{path}", bin.display()));
    Gpud(cmd.stderr(log).spawn().expect("start gpud"))
}

fn sigterm_and_wait(gpud: &mut Gpud) -> std::process::ExitStatus {
    let child = &mut gpud.0;
    Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        assert!(Instant::now() < deadline, "gpud did not stop on SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// gpud's log so far.
fn log(node: &Node) -> String {
    std::fs::read_to_string(node.dir.path().join("gpud.log")).unwrap_or_default()
}

/// gpud's log once it holds `line`.
fn log_when(node: &Node, line: &str) -> String {
    common::file_when(&node.dir.path().join("gpud.log"), line, 15)
}

fn daemon_pid(root: &Path, resource: &str) -> String {
    std::fs::read_to_string(root.join(resource).join("pipe/fake-daemon.pid"))
        .unwrap()
        .trim()
        .to_owned()
}

/// Whether process `pid` runs (a zombie waiting for its reaper does not).
fn running(pid: &str) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit(") ")
            .next()
            .is_some_and(|rest| !rest.starts_with('Z'))
    })
}

fn allocate(ids: &[String]) -> AllocateRequest {
    AllocateRequest {
        container_requests: vec![ContainerAllocateRequest {
            devices_ids: ids.to_vec(),
        }],
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_resource_start_allocate_restart_and_stop() {
    let node = Node::new("pcie-4gpu");
    let uuids = uuids(&node);
    let bin = fake_control(&node);
    let root = node.dir.path().join("mps");
    let config = write_config(&node, &mps_config(&root, 4));
    let kubelet_dir = node.dir.path().join("kubelet");
    std::fs::create_dir_all(&kubelet_dir).unwrap();
    let mut kubelet = FakeKubelet::start(&kubelet_dir).await;
    let port = http::free_port();
    let address = format!("127.0.0.1:{port}");
    let mut gpud = spawn(
        &node,
        &bin,
        &[
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
            kubelet.socket().to_str().unwrap(),
            "--mps-skip-shm-mount",
            "--mps-probe-interval",
            "100ms",
            "--health-address",
            &address,
        ],
    );
    http::wait_for(port, "/readyz", 20, |a| a.status == 200);

    // The start sequence: one daemon over the four GPUs by UUID, its own pipe and log
    // folders, then each GPU's pinned-memory limit (80 GiB / 4) and the thread percentage.
    let resource_dir = root.join("nvidia.com/gpu");
    let env = daemon_env(&resource_dir, &uuids);
    let started: Vec<String> = [
        "-d".to_owned(),
        "set_default_device_pinned_mem_limit 0 20480M".to_owned(),
        "set_default_device_pinned_mem_limit 1 20480M".to_owned(),
        "set_default_device_pinned_mem_limit 2 20480M".to_owned(),
        "set_default_device_pinned_mem_limit 3 20480M".to_owned(),
        "set_default_active_thread_percentage 25".to_owned(),
    ]
    .iter()
    .map(|c| format!("{c} | {env}"))
    .collect();
    assert_eq!(recorded(&bin), started);
    assert!(resource_dir.join(".started").exists());
    assert!(root.join(".ready").exists());
    assert!(root.join("shm").is_dir());
    let exclusive: BTreeMap<String, u64> = uuids.iter().map(|u| (u.clone(), 3)).collect();
    assert_eq!(
        compute_modes(&node),
        exclusive,
        "EXCLUSIVE_PROCESS on every GPU"
    );

    // The device plugin advertises 4 replicas per GPU, all healthy.
    let reg = kubelet.next_registration(10).await;
    assert_eq!(reg.resource_name, "nvidia.com/gpu");
    let mut client = kubelet.plugin(&reg.endpoint).await;
    let mut stream = list_and_watch(&mut client).await;
    let list = next_list(&mut stream, 5).await;
    assert_eq!(list.devices.len(), 16);
    assert_eq!(list.devices[1].id, format!("{}::1", uuids[0]));
    assert!(list.devices.iter().all(|d| d.health == "Healthy"));

    // Allocate as NVIDIA's plugin answers under MPS.
    let response = client
        .allocate(allocate(&[format!("{}::1", uuids[0])]))
        .await
        .unwrap()
        .into_inner();
    let expected = ContainerAllocateResponse {
        envs: [
            ("NVIDIA_VISIBLE_DEVICES".to_owned(), uuids[0].clone()),
            (
                "CUDA_MPS_PIPE_DIRECTORY".to_owned(),
                "/mps/nvidia.com/gpu/pipe".to_owned(),
            ),
        ]
        .into(),
        mounts: vec![
            Mount {
                container_path: "/mps/nvidia.com/gpu/pipe".into(),
                host_path: format!("{}/pipe", resource_dir.display()),
                read_only: false,
            },
            Mount {
                container_path: "/dev/shm".into(),
                host_path: format!("{}/shm", root.display()),
                read_only: false,
            },
        ],
        ..ContainerAllocateResponse::default()
    };
    assert_eq!(response.container_responses, vec![expected]);
    // failRequestsGreaterThanOne defaults to true under MPS.
    let err = client
        .allocate(allocate(&[
            format!("{}::0", uuids[0]),
            format!("{}::1", uuids[0]),
        ]))
        .await
        .unwrap_err();
    assert_eq!(
        err.message(),
        "invalid request: maximum request size for shared resources is 1; found 2"
    );

    // The daemon dies: its devices turn unhealthy, it is started again, they turn healthy.
    let pid = daemon_pid(&root, "nvidia.com/gpu");
    Command::new("kill").args(["-KILL", &pid]).status().unwrap();
    let list = next_list(&mut stream, 10).await;
    assert!(
        list.devices.iter().all(|d| d.health == "Unhealthy"),
        "{list:?}"
    );
    let list = next_list(&mut stream, 10).await;
    assert!(
        list.devices.iter().all(|d| d.health == "Healthy"),
        "{list:?}"
    );
    let mut restarted = started.clone();
    restarted.extend(started.iter().cloned());
    assert_eq!(wait_recorded(&bin, |l| l.len() >= 12), restarted);
    let killed = pid;
    let pid = daemon_pid(&root, "nvidia.com/gpu");
    assert_ne!(pid, killed, "a new daemon");
    assert!(running(&pid));

    // SIGTERM: `quit`, compute mode back to DEFAULT, markers gone.
    let status = sigterm_and_wait(&mut gpud);
    assert!(status.success(), "{status:?}");
    let mut stopped = restarted.clone();
    stopped.push(format!("quit | {env}"));
    assert_eq!(recorded(&bin), stopped);
    assert_eq!(
        compute_modes(&node),
        BTreeMap::new(),
        "DEFAULT on every GPU"
    );
    // `quit` stops the daemon: it does not inherit gpud's blocked SIGTERM.
    let deadline = Instant::now() + Duration::from_secs(5);
    while running(&pid) {
        assert!(Instant::now() < deadline, "the daemon outlived `quit`");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(!resource_dir.join(".started").exists());
    assert!(!resource_dir.join("log").exists());
    assert!(!root.join(".ready").exists());
}

#[test]
fn standalone_daemon_starts_reconfigures_on_sighup_and_stops() {
    let node = Node::new("dgx-h100");
    let uuids = uuids(&node);
    let bin = fake_control(&node);
    let root = node.dir.path().join("mps");
    let config = write_config(
        &node,
        &mps_config(&root, 2).replace(
            "sharing:\n  mps:\n",
            "sharing:\n  mps:\n    renameByDefault: true\n",
        ),
    );
    let port = http::free_port();
    let address = format!("127.0.0.1:{port}");
    let mut gpud = spawn(
        &node,
        &bin,
        &[
            "mps-control-daemon",
            "--config-file",
            config.to_str().unwrap(),
            "--mps-skip-shm-mount",
            "--health-address",
            &address,
        ],
    );
    http::wait_for(port, "/readyz", 20, |a| a.status == 200);
    let dir = root.join("nvidia.com/gpu.shared");
    let env = daemon_env(&dir, &uuids);
    let mut expected: Vec<String> = vec![format!("-d | {env}")];
    for ordinal in 0..8 {
        expected.push(format!(
            "set_default_device_pinned_mem_limit {ordinal} 40779M | {env}"
        ));
    }
    expected.push(format!("set_default_active_thread_percentage 50 | {env}"));
    assert_eq!(recorded(&bin), expected);
    assert!(dir.join(".started").exists());

    // SIGHUP with another resource name and replica count: the old daemon quits and gives
    // the GPUs back, the new one starts with the new limits.
    write_config(&node, &mps_config(&root, 4));
    Command::new("kill")
        .args(["-HUP", &gpud.0.id().to_string()])
        .status()
        .unwrap();
    let new_env = daemon_env(&root.join("nvidia.com/gpu"), &uuids);
    expected.push(format!("quit | {env}"));
    expected.push(format!("-d | {new_env}"));
    for ordinal in 0..8 {
        expected.push(format!(
            "set_default_device_pinned_mem_limit {ordinal} 20389M | {new_env}"
        ));
    }
    expected.push(format!(
        "set_default_active_thread_percentage 25 | {new_env}"
    ));
    assert_eq!(wait_recorded(&bin, |l| l.len() >= expected.len()), expected);
    assert!(
        !dir.join(".started").exists(),
        "the old resource's marker is gone"
    );

    assert!(sigterm_and_wait(&mut gpud).success());
    expected.push(format!("quit | {new_env}"));
    assert_eq!(recorded(&bin), expected);
    assert_eq!(compute_modes(&node), BTreeMap::new());
}

/// Two MPS resources cannot come from NVIDIA's schema (resource naming is fixed), so the
/// separation of their daemons is checked on the control layer gpud drives them through:
/// each gets its own pipe and log folders and only its GPUs, and neither sees the other.
#[test]
fn two_daemons_never_share_pipes_or_gpus() {
    use gpud::mps::control::Control;
    use gpud::mps::plan::{DaemonPlan, PlannedGpu};
    let node = Node::new("pcie-4gpu");
    let bin = fake_control(&node);
    let root = node.dir.path().join("mps");
    let gpu = |uuid: &str, index| PlannedGpu {
        uuid: uuid.into(),
        index,
        memory_mib: 81920,
    };
    let plans = [
        DaemonPlan {
            resource: "nvidia.com/gpu".into(),
            replicas: 2,
            gpus: vec![gpu("GPU-a", 0), gpu("GPU-b", 1)],
        },
        DaemonPlan {
            resource: "nvidia.com/gpu.big".into(),
            replicas: 4,
            gpus: vec![gpu("GPU-c", 2)],
        },
    ];
    let controls: Vec<Control> = plans
        .iter()
        .map(|plan| {
            std::fs::create_dir_all(root.join(&plan.resource).join("pipe")).unwrap();
            Control::new(bin.join("nvidia-cuda-mps-control"), plan.env(&root))
        })
        .collect();
    for (plan, control) in plans.iter().zip(&controls) {
        control.start_daemon().unwrap();
        for command in plan.limit_commands() {
            control.send(&command).unwrap();
        }
    }
    assert_eq!(
        controls[1]
            .send("get_default_active_thread_percentage")
            .unwrap(),
        "25.0"
    );
    assert_eq!(
        controls[0]
            .send("get_default_active_thread_percentage")
            .unwrap(),
        "50.0"
    );
    for control in &controls {
        control.send("quit").unwrap();
    }
    assert!(
        controls[0].probe().is_err(),
        "a quit daemon does not answer"
    );
    let a = daemon_env(&root.join("nvidia.com/gpu"), &["GPU-a", "GPU-b"]);
    let b = daemon_env(&root.join("nvidia.com/gpu.big"), &["GPU-c"]);
    assert_eq!(
        recorded(&bin),
        [
            format!("-d | {a}"),
            format!("set_default_device_pinned_mem_limit 0 40960M | {a}"),
            format!("set_default_device_pinned_mem_limit 1 40960M | {a}"),
            format!("set_default_active_thread_percentage 50 | {a}"),
            format!("-d | {b}"),
            format!("set_default_device_pinned_mem_limit 0 20480M | {b}"),
            format!("set_default_active_thread_percentage 25 | {b}"),
            format!("quit | {a}"),
            format!("quit | {b}"),
        ]
    );
}

/// Runs `gpud <applet> --config-file <config>` on `node` and asserts exit 65 with `message`
/// on stderr.
fn refused(node: &Node, applet: &str, config: &Path, message: &str) {
    let mut args = vec![applet, "--config-file", config.to_str().unwrap()];
    if applet != "mps-control-daemon" {
        args.extend(["--kmsg", ""]);
    }
    let out = node.run(&args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(65), "{applet}: {stderr}");
    assert!(stderr.contains(message), "{applet}: {stderr}");
}

#[test]
fn invalid_mps_configs_exit_65_with_the_reason() {
    let h100 = Node::new("dgx-h100");
    let root = h100.dir.path().join("mps");
    let uuid0 = uuids(&h100)[0].clone();
    let over = write_config(&h100, &mps_config(&root, 49));
    let too_many = format!(
        "sharing.mps: invalid MPS replicas for nvidia.com/gpu: 49 replicas exceed the maximum of 48 MPS clients of GPU {uuid0} (compute capability 9.0); lower sharing.mps.resources[].replicas to at most 48"
    );
    for applet in ["device-plugin", "mps-control-daemon", "run"] {
        refused(&h100, applet, &over, &too_many);
    }

    let mig = Node::new("h100-mig");
    let config = write_config(
        &mig,
        &mps_config(&root, 2).replace("flags:\n", "flags:\n  migStrategy: single\n"),
    );
    refused(
        &mig,
        "device-plugin",
        &config,
        "sharing.mps: sharing using MPS is not supported for MIG devices",
    );

    let mixed = write_config(
        &h100,
        &mps_config(&root, 2).replace("flags:\n", "flags:\n  migStrategy: mixed\n"),
    );
    refused(
        &h100,
        "mps-control-daemon",
        &mixed,
        "field flags.migStrategy: invalid value \"mixed\": sharing with MPS cannot be combined with the mixed MIG strategy",
    );

    let no_root = write_config(
        &h100,
        "version: v1\nsharing:\n  mps:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 2\n",
    );
    refused(
        &h100,
        "device-plugin",
        &no_root,
        "field flags.mpsRoot: invalid value \"\": sharing with MPS needs mpsRoot (--mps-root, MPS_ROOT)",
    );
}

#[test]
fn labels_are_gfds_for_mps() {
    let node = Node::new("dgx-h100");
    let root = node.dir.path().join("mps");
    let config = write_config(
        &node,
        &mps_config(&root, 4).replace("flags:\n", "flags:\n  gfd:\n    noTimestamp: true\n"),
    );
    let out = stdout_ok(&node.run(&[
        "labeller",
        "--oneshot",
        "-o",
        "-",
        "--config-file",
        config.to_str().unwrap(),
    ]));
    let mps: Vec<&str> = out
        .lines()
        .filter(|l| {
            l.starts_with("nvidia.com/mps.")
                || l.starts_with("nvidia.com/gpu.product=")
                || l.starts_with("nvidia.com/gpu.replicas=")
                || l.starts_with("nvidia.com/gpu.sharing-strategy=")
                || l.starts_with("nvidia.com/gpu.count=")
        })
        .collect();
    let mut mps = mps;
    mps.sort_unstable();
    assert_eq!(
        mps,
        [
            "nvidia.com/gpu.count=8",
            "nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3-SHARED",
            "nvidia.com/gpu.replicas=4",
            "nvidia.com/gpu.sharing-strategy=mps",
            "nvidia.com/mps.capable=true",
        ]
    );
    // Renamed: no -SHARED suffix, the label keys stay nvidia.com/gpu.*.
    let renamed = write_config(
        &node,
        &mps_config(&root, 4)
            .replace("flags:\n", "flags:\n  gfd:\n    noTimestamp: true\n")
            .replace("  mps:\n", "  mps:\n    renameByDefault: true\n"),
    );
    let out = stdout_ok(&node.run(&[
        "labeller",
        "--oneshot",
        "-o",
        "-",
        "--config-file",
        renamed.to_str().unwrap(),
    ]));
    assert!(
        out.contains("nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3\n"),
        "{out}"
    );
    assert!(
        out.contains("nvidia.com/gpu.sharing-strategy=mps\n"),
        "{out}"
    );
    assert!(out.contains("nvidia.com/mps.capable=true\n"), "{out}");
}

/// `gpud mps-control-daemon` with restart events on the Node of `api`, ready; the daemons'
/// root.
fn with_node_events(node: &Node, api: &FakeApi) -> (Gpud, PathBuf) {
    let bin = fake_control(node);
    let root = node.dir.path().join("mps");
    let config = write_config(node, &mps_config(&root, 2));
    let kubeconfig = api.kubeconfig(node.dir.path());
    let port = http::free_port();
    let address = format!("127.0.0.1:{port}");
    let gpud = spawn(
        node,
        &bin,
        &[
            "mps-control-daemon",
            "--config-file",
            config.to_str().unwrap(),
            "--mps-skip-shm-mount",
            "--mps-probe-interval",
            "100ms",
            "--node-events",
            "--kubeconfig",
            kubeconfig.to_str().unwrap(),
            "--health-address",
            &address,
        ],
    );
    http::wait_for(port, "/readyz", 20, |a| a.status == 200);
    (gpud, root)
}

#[test]
fn a_restart_is_an_event_on_the_node() {
    let node = Node::new("pcie-4gpu");
    let api = FakeApi::start(serde_json::json!({}));
    let (_gpud, root) = with_node_events(&node, &api);
    assert!(api.events().is_empty(), "no event for the first start");
    let pid = daemon_pid(&root, "nvidia.com/gpu");
    Command::new("kill").args(["-KILL", &pid]).status().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let events = loop {
        let events = api.events();
        if !events.is_empty() {
            break events;
        }
        assert!(Instant::now() < deadline, "no event for the restart");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0]["reason"], "MPSDaemonRestarted");
    assert_eq!(events[0]["type"], "Warning");
    assert_eq!(
        events[0]["message"],
        "MPS control daemon for nvidia.com/gpu stopped answering and was restarted"
    );
    assert_eq!(events[0]["involvedObject"]["kind"], "Node");
    assert_eq!(events[0]["involvedObject"]["name"], "test-node");
}

/// `gpud mps-control-daemon` for one resource of two replicas under `root`, running
/// `control`, with its admin endpoint on a port of its own (returned).
fn control_daemon(node: &Node, bin: &Path, control: &Path, root: &Path) -> (Gpud, u16) {
    let config = write_config(node, &mps_config(root, 2));
    let port = http::free_port();
    let address = format!("127.0.0.1:{port}");
    let gpud = spawn(
        node,
        bin,
        &[
            "mps-control-daemon",
            "--config-file",
            config.to_str().unwrap(),
            "--mps-skip-shm-mount",
            "--mps-control-binary",
            control.to_str().unwrap(),
            "--health-address",
            &address,
        ],
    );
    (gpud, port)
}

#[test]
fn a_missing_control_binary_keeps_the_daemon_not_ready_and_says_why() {
    let node = Node::new("pcie-4gpu");
    let bin = node.dir.path().join("no-such-bin");
    std::fs::create_dir_all(&bin).unwrap();
    let root = node.dir.path().join("mps");
    let missing = bin.join("nvidia-cuda-mps-control");
    let (_gpud, port) = control_daemon(&node, &bin, &missing, &root);
    let answer = http::wait_for(port, "/readyz", 20, |a| {
        a.status == 503
            && a.body
                .contains("mps not ready: the MPS control daemon for ")
    });
    assert!(
        answer.body.contains(&format!(
            "cannot start: cannot run the MPS control binary {} (install the driver's \
                 nvidia-cuda-mps-control on PATH or point --mps-control-binary at it)",
            missing.display()
        )),
        "{}",
        answer.body
    );
    assert!(!root.join("nvidia.com/gpu/.started").exists());
    // The log names the binary and the reason, so the fix (install the driver's MPS binary,
    // or point --mps-control-binary at it) is plain.
    log_when(&node, &missing.display().to_string());
}

/// The API server refuses the restart's event (403, then 429 with `Retry-After: 1`): gpud
/// retries on its backoff, waits out the `Retry-After`, says so once, and the event lands once.
#[test]
fn a_restart_event_the_api_server_refuses_is_retried_until_it_lands() {
    let node = Node::new("pcie-4gpu");
    let api = FakeApi::start(serde_json::json!({}));
    let events_path = "/api/v1/namespaces/default/events";
    api.refuse(fake_api::Rule::exact("POST", events_path, fake_api::Fault::Forbidden).times(1));
    api.refuse(
        fake_api::Rule::exact("POST", events_path, fake_api::Fault::TooManyRequests(1)).times(1),
    );
    let (_gpud, root) = with_node_events(&node, &api);
    let pid = daemon_pid(&root, "nvidia.com/gpu");
    Command::new("kill").args(["-KILL", &pid]).status().unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let posts = loop {
        let posts = api.requests_to("POST", events_path);
        if posts.len() == 3 && posts[2].status != 0 {
            break posts;
        }
        assert!(Instant::now() < deadline, "{posts:?}\n{}", log(&node));
        std::thread::sleep(Duration::from_millis(20));
    };
    let statuses: Vec<u16> = posts.iter().map(|r| r.status).collect();
    assert_eq!(statuses, [403, 429, 201]);
    // The 429's Retry-After is waited out before the next try.
    assert!(
        posts[2].at - posts[1].at >= Duration::from_secs(1),
        "{:?}",
        posts[2].at - posts[1].at
    );
    let events = api.events();
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0]["reason"], "MPSDaemonRestarted");
    let log = log_when(&node, "Node events are recorded again");
    assert_eq!(
        log.matches("Cannot record an event on the Node").count(),
        1,
        "one warning for the failing streak:\n{log}"
    );
    assert!(log.contains("is forbidden"), "{log}");
}

/// A control binary that hangs: every invocation records its pid beside it, then sleeps
/// for good (as a real one stuck on a driver that no longer answers).
fn hung_control(node: &Node) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let bin = node.dir.path().join("hung-bin");
    std::fs::create_dir_all(&bin).unwrap();
    let script = bin.join("nvidia-cuda-mps-control");
    std::fs::write(
        &script,
        "#!/bin/sh\necho $$ >> \"$(dirname \"$0\")/pids\"\nexec sleep 1000\n",
    )
    .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    bin
}

#[test]
fn a_hung_control_binary_is_killed_the_daemon_not_ready_with_the_reason_and_sigterm_stops_in_time()
{
    let node = Node::new("pcie-4gpu");
    let bin = hung_control(&node);
    let control = bin.join("nvidia-cuda-mps-control");
    let root = node.dir.path().join("mps");
    let (mut gpud, port) = control_daemon(&node, &bin, &control, &root);
    // The start is bounded: after 10 s the call is killed and /readyz says why.
    let reason = format!(
        "mps not ready: the MPS control daemon for nvidia.com/gpu cannot start: \
         `nvidia-cuda-mps-control -d` did not finish within 10s and was killed: the MPS control \
         binary {} hangs (a stuck driver or GPU? check `nvidia-smi` and the kernel log); gpud \
         tries again with backoff",
        control.display()
    );
    let answer = http::wait_for(port, "/readyz", 30, |a| {
        a.status == 503 && a.body.contains("cannot start")
    });
    assert!(answer.body.contains(&reason), "{}", answer.body);
    let log_path = node.dir.path().join("gpud.log");
    let log = std::fs::read_to_string(&log_path).unwrap();
    assert!(
        log.lines()
            .any(|l| l.contains("Cannot start the MPS control daemon")
                && l.contains("did not finish within 10s and was killed")),
        "{log}"
    );
    assert!(!root.join("nvidia.com/gpu/.started").exists());
    // The killed call is gone.
    let first = std::fs::read_to_string(bin.join("pids")).unwrap();
    let first = first.lines().next().unwrap().to_owned();
    assert!(!running(&first), "the hung call {first} still runs");

    // SIGTERM while the binary hangs (a start in flight, or about to be): gpud kills what it
    // runs, quits within its own bound, and exits within its 5 s grace.
    let asked = Instant::now();
    let status = sigterm_and_wait(&mut gpud);
    let took = asked.elapsed();
    eprintln!("a hung control binary: SIGTERM to exit {took:?}");
    assert!(status.success(), "{status:?}");
    assert!(took < Duration::from_secs(5), "{took:?}");
    let log = std::fs::read_to_string(&log_path).unwrap();
    assert!(!log.contains("did not stop in time"), "{log}");
    assert!(
        log.contains("The MPS control daemon did not take `quit`"),
        "{log}"
    );
    // Nothing it started is left behind.
    let pids = std::fs::read_to_string(bin.join("pids")).unwrap();
    for pid in pids.lines() {
        assert!(!running(pid), "control call {pid} outlived gpud");
    }
}

#[test]
fn a_new_gpud_adopts_the_running_mps_daemons_instead_of_restarting_them() {
    let node = Node::new("dgx-h100");
    let bin = fake_control(&node);
    let root = node.dir.path().join("mps");
    let config = write_config(&node, &mps_config(&root, 2));
    let port = http::free_port();
    let address = format!("127.0.0.1:{port}");
    let args = [
        "mps-control-daemon",
        "--config-file",
        config.to_str().unwrap(),
        "--mps-skip-shm-mount",
        "--health-address",
        &address,
    ];
    let mut old = spawn_logged(&node, &bin, &args, "old.log");
    http::wait_for(port, "/readyz", 20, |a| a.status == 200);
    let pid = daemon_pid(&root, "nvidia.com/gpu");
    let started = recorded(&bin);

    let mut new = spawn_logged(&node, &bin, &args, "new.log");
    let new_log = node.dir.path().join("new.log");
    common::file_when(&new_log, "Adopted the MPS control daemon", 15);
    common::file_when(
        &new_log,
        "Took over: the gpud taken over from has finished",
        15,
    );
    common::file_when(
        &node.dir.path().join("old.log"),
        "leaving the MPS control daemons running",
        15,
    );
    // The old process waits to be stopped; stopping it quits nothing.
    assert!(sigterm_and_wait(&mut old).success());
    assert_eq!(daemon_pid(&root, "nvidia.com/gpu"), pid, "the same daemon");
    assert!(running(&pid));
    assert_eq!(recorded(&bin), started, "no second start, no quit");
    assert!(root.join("nvidia.com/gpu/.started").exists());
    assert!(root.join(".ready").exists());
    // The admin port went along: the new process answers it.
    http::wait_for(port, "/readyz", 5, |a| a.status == 200);

    // The new one quits the daemon it adopted when it stops.
    assert!(sigterm_and_wait(&mut new).success());
    let env = daemon_env(&root.join("nvidia.com/gpu"), &uuids(&node));
    assert_eq!(recorded(&bin).last(), Some(&format!("quit | {env}")));
    assert!(!running(&pid));
    assert_eq!(compute_modes(&node), BTreeMap::new());
}
