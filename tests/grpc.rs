//! The device plugin's gRPC sockets as clients other than tonic see them: a raw HTTP/2 client
//! sending the `:authority` values older kubelets, grpcio and grpcurl send (paths, percent-
//! encoded paths), Python grpcio itself with default options, and the sockets' mode under a
//! permissive umask.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
#[path = "common/fake_kubelet.rs"]
mod fake_kubelet;
#[path = "common/raw_grpc.rs"]
mod raw_grpc;

use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{Node, stdout_ok};
use fake_kubelet::FakeKubelet;
use gpud::proto::deviceplugin::{
    AllocateRequest, AllocateResponse, ContainerAllocateRequest, ContainerAllocateResponse,
    DevicePluginOptions,
};
use prost::Message;
use raw_grpc::{Authority, RawClient, Reply};
use serde_json::{Value, json};

/// A running `gpud device-plugin`, killed when dropped.
struct Plugin(Child);

impl Drop for Plugin {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start(mut cmd: Command, kubelet: &FakeKubelet, extra: &[&str]) -> Plugin {
    cmd.args(["device-plugin", "--kubelet-socket"])
        .arg(kubelet.socket())
        .args(["--kmsg", "", "--health-poll-interval", "50ms"])
        .args(extra);
    Plugin(cmd.spawn().expect("start gpud device-plugin"))
}

fn uuids(node: &Node) -> Vec<String> {
    let inventory: Value = serde_json::from_str(&stdout_ok(&node.run(&["inventory"]))).unwrap();
    inventory["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["uuid"].as_str().unwrap().to_owned())
        .collect()
}

fn ok_reply(message: Vec<u8>) -> Reply {
    Reply {
        headers: vec![
            (":status".into(), "200".into()),
            ("content-type".into(), "application/grpc".into()),
        ],
        messages: vec![message],
        trailers: vec![("grpc-status".into(), "0".into())],
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn any_authority_is_served_on_a_raw_http2_connection() {
    let node = Node::new("pcie-4gpu");
    let uuids = uuids(&node);
    let mut kubelet = FakeKubelet::start(node.dir.path()).await;
    let _gpud = start(node.gpud(&[]), &kubelet, &[]);
    let reg = kubelet.next_registration(10).await;
    let socket = node.dir.path().join(&reg.endpoint);

    let options = ok_reply(
        DevicePluginOptions {
            pre_start_required: false,
            get_preferred_allocation_available: true,
        }
        .encode_to_vec(),
    );
    let request = AllocateRequest {
        container_requests: vec![ContainerAllocateRequest {
            devices_ids: vec![uuids[2].clone(), uuids[0].clone()],
        }],
    }
    .encode_to_vec();
    let allocated = AllocateResponse {
        container_responses: vec![ContainerAllocateResponse {
            envs: [(
                "NVIDIA_VISIBLE_DEVICES".to_owned(),
                format!("{},{}", uuids[2], uuids[0]),
            )]
            .into(),
            ..Default::default()
        }],
    };
    let allocated = ok_reply(allocated.encode_to_vec());

    for authority in [
        "var/lib/kubelet/device-plugins/nvidia-gpu.sock",
        "/var/lib/kubelet/device-plugins/nvidia-gpu.sock",
        "%2Fvar%2Flib%2Fkubelet%2Fdevice-plugins%2Fnvidia-gpu.sock",
        "localhost",
    ] {
        let mut client = RawClient::connect(&socket).await;
        let reply = client
            .call("GetDevicePluginOptions", Authority::Indexed(authority), b"")
            .await;
        assert_eq!(reply, options, "{authority}");
        // The same authority again, now by reference to the connection's header table.
        for _ in 0..2 {
            let reply = client
                .call("Allocate", Authority::Reference(62), &request)
                .await;
            assert_eq!(reply, allocated, "{authority}");
        }
    }
}

// === grpcio ===

/// The Python the checks run: the virtual environment `make test` keeps in target/py-venv
/// (tests/python/venv.sh), else the system's python3.
fn python() -> std::path::PathBuf {
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/py-venv/bin/python");
    if venv.exists() {
        venv
    } else {
        "python3".into()
    }
}

/// Whether python3 with grpcio is here. Where python3 is, CI makes the environment with grpcio
/// (`make test`), so there its absence is a failure rather than a skip.
fn grpcio_available() -> bool {
    let runs = |code: &str| {
        Command::new(python())
            .args(["-c", code])
            .output()
            .is_ok_and(|o| o.status.success())
    };
    !common::tool_missing(
        !runs(""),
        "python3 is required in CI (the grpcio client check)",
        "grpcio check skipped: python3 is not installed",
    ) && !common::tool_missing(
        !runs("import grpc"),
        "python3's grpcio package is required in CI (make test installs it in target/py-venv)",
        "grpcio check skipped: grpcio is not installed (tests/python/venv.sh installs it)",
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_grpcio_with_default_options() {
    if !grpcio_available() {
        return;
    }
    let node = Node::new("pcie-4gpu");
    let uuids = uuids(&node);
    let mut kubelet = FakeKubelet::start(node.dir.path()).await;
    let _gpud = start(node.gpud(&[]), &kubelet, &[]);
    let reg = kubelet.next_registration(10).await;
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/grpcio/check.py");
    let child = Command::new(python())
        .arg(script)
        .arg(node.dir.path().join(&reg.endpoint))
        .args([&uuids[3], &uuids[1]])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The script bounds each call to 10 s; this bounds the whole run.
    let output = tokio::task::spawn_blocking(move || wait_bounded(child, Duration::from_secs(60)))
        .await
        .unwrap();
    assert!(
        output.status.success(),
        "grpcio check failed\nstdout: {}\nstderr: {}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    let result: Value = serde_json::from_slice(&output.stdout).unwrap();
    let envs = json!([{"NVIDIA_VISIBLE_DEVICES": format!("{},{}", uuids[3], uuids[1])}]);
    assert_eq!(
        result,
        json!({
            "options": {"pre_start_required": false, "get_preferred_allocation_available": true},
            "devices": uuids,
            "health": ["Healthy", "Healthy", "Healthy", "Healthy"],
            "allocations": [envs, envs],
        })
    );
}

/// Waits for `child`, killing it and failing the test after `limit`.
fn wait_bounded(mut child: Child, limit: Duration) -> Output {
    let deadline = Instant::now() + limit;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("grpcio check did not finish within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

// === socket mode ===

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plugin_sockets_are_0600_under_umask_000() {
    let node = Node::new("a100-mig");
    let mut kubelet = FakeKubelet::start(node.dir.path()).await;
    let _gpud = start(
        node.gpud_under_umask("000", &[]),
        &kubelet,
        &["--mig-strategy", "mixed"],
    );
    let mut endpoints = Vec::new();
    for _ in 0..3 {
        endpoints.push(kubelet.next_registration(10).await.endpoint);
    }
    endpoints.sort();
    let mut sockets = Vec::new();
    for entry in std::fs::read_dir(node.dir.path()).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name().into_string().unwrap();
        let meta = entry.metadata().unwrap();
        assert!(!name.starts_with('.'), "staging leftover {name}");
        if meta.file_type().is_socket() && name != "kubelet.sock" {
            sockets.push((name, meta.permissions().mode() & 0o7777));
        }
    }
    sockets.sort();
    let expected: Vec<(String, u32)> = endpoints.into_iter().map(|e| (e, 0o600)).collect();
    assert_eq!(sockets, expected);
    // The plugins serve on them.
    let mut client = kubelet.plugin(&expected[0].0).await;
    let list =
        fake_kubelet::next_list(&mut fake_kubelet::list_and_watch(&mut client).await, 5).await;
    assert_eq!(list.devices.len(), 1);
}
