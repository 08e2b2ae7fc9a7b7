//! The device plugin's gRPC sockets as clients other than tonic see them: a raw HTTP/2 client
//! sending the `:authority` values older kubelets, grpcio and grpcurl send (paths, percent-
//! encoded paths), Python grpcio itself with default options, and the sockets' mode under a
//! permissive umask.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
#[path = "common/fake_kubelet.rs"]
mod fake_kubelet;

use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{Node, stdout_ok};
use fake_kubelet::FakeKubelet;
use gpud::grpc::hpack::Decoder;
use gpud::proto::deviceplugin::{
    AllocateRequest, AllocateResponse, ContainerAllocateRequest, ContainerAllocateResponse,
    DevicePluginOptions,
};
use prost::Message;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

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

// === a raw HTTP/2 client ===

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;
const RST_STREAM: u8 = 0x3;
const SETTINGS: u8 = 0x4;
const PING: u8 = 0x6;
const GOAWAY: u8 = 0x7;
const END_STREAM: u8 = 0x1;
const ACK: u8 = 0x1;
const END_HEADERS: u8 = 0x4;

/// How a request carries its `:authority`.
#[derive(Clone, Copy)]
enum Authority<'a> {
    /// A literal with incremental indexing (name: static index 1), so it enters the
    /// connection's header table, newest first (index 62).
    Indexed(&'a str),
    /// A reference to the header table (e.g. 62 for the newest entry).
    Reference(u8),
}

/// What came back for one call.
#[derive(Debug, PartialEq)]
struct Reply {
    headers: Vec<(String, String)>,
    /// The gRPC messages' bytes, each without its 5-byte prefix.
    messages: Vec<Vec<u8>>,
    trailers: Vec<(String, String)>,
}

/// An HTTP/2 client built from frames by hand; response headers are decoded with gpud's
/// HPACK decoder (h2's encoder uses Huffman coding and its dynamic table).
struct RawClient {
    socket: UnixStream,
    next_stream: u32,
    decoder: Decoder,
}

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = u32::try_from(payload.len()).unwrap().to_be_bytes();
    let mut out = vec![len[1], len[2], len[3], kind, flags];
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// A literal string field value: raw, with a one-byte length.
fn literal(out: &mut Vec<u8>, text: &[u8]) {
    out.push(u8::try_from(text.len()).unwrap());
    out.extend_from_slice(text);
}

impl RawClient {
    async fn connect(path: &std::path::Path) -> RawClient {
        let mut socket = UnixStream::connect(path).await.unwrap();
        let mut hello = PREFACE.to_vec();
        hello.extend(frame(SETTINGS, 0, 0, b""));
        socket.write_all(&hello).await.unwrap();
        RawClient {
            socket,
            next_stream: 1,
            decoder: Decoder::new(4096, 1 << 20),
        }
    }

    /// One unary gRPC call: HEADERS with literal fields, one DATA frame, then the response
    /// up to its trailers. Panics on RST_STREAM or GOAWAY, naming the error code.
    async fn call(&mut self, method: &str, authority: Authority<'_>, message: &[u8]) -> Reply {
        let stream = self.next_stream;
        self.next_stream += 2;
        let mut block = vec![0x83, 0x86]; // :method POST, :scheme http
        block.push(0x04); // :path, literal without indexing
        literal(
            &mut block,
            format!("/v1beta1.DevicePlugin/{method}").as_bytes(),
        );
        match authority {
            Authority::Indexed(value) => {
                block.push(0x41);
                literal(&mut block, value.as_bytes());
            }
            Authority::Reference(index) => block.push(0x80 | index),
        }
        block.extend([0x0f, 0x10]); // content-type (static 31), literal without indexing
        literal(&mut block, b"application/grpc");
        block.push(0x00); // te: trailers, new name
        literal(&mut block, b"te");
        literal(&mut block, b"trailers");
        let mut body = vec![0];
        body.extend(u32::try_from(message.len()).unwrap().to_be_bytes());
        body.extend_from_slice(message);
        let mut out = frame(HEADERS, END_HEADERS, stream, &block);
        out.extend(frame(DATA, END_STREAM, stream, &body));
        self.socket.write_all(&out).await.unwrap();
        tokio::time::timeout(Duration::from_secs(10), self.response(stream))
            .await
            .expect("no response within 10 s")
    }

    async fn response(&mut self, stream: u32) -> Reply {
        let mut blocks = Vec::new();
        let mut data = Vec::new();
        loop {
            let mut head = [0u8; 9];
            self.socket.read_exact(&mut head).await.unwrap();
            let len = usize::from(head[0]) << 16 | usize::from(head[1]) << 8 | usize::from(head[2]);
            let (kind, flags) = (head[3], head[4]);
            let id = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
            let mut payload = vec![0; len];
            self.socket.read_exact(&mut payload).await.unwrap();
            match kind {
                SETTINGS if flags & ACK == 0 => {
                    self.socket
                        .write_all(&frame(SETTINGS, ACK, 0, b""))
                        .await
                        .unwrap();
                }
                PING if flags & ACK == 0 => {
                    self.socket
                        .write_all(&frame(PING, ACK, 0, &payload))
                        .await
                        .unwrap();
                }
                RST_STREAM | GOAWAY => panic!(
                    "frame type {kind} on stream {id}: error code {:?}",
                    &payload[payload.len() - 4..]
                ),
                HEADERS if id == stream => {
                    // h2 sends neither padding nor priority, and small blocks in one frame.
                    assert_eq!(flags & 0x28, 0, "unexpected HEADERS flags {flags:#x}");
                    assert_ne!(flags & END_HEADERS, 0, "CONTINUATION not expected");
                    let mut fields = Vec::new();
                    self.decoder
                        .decode(&payload, |f| {
                            fields.push((
                                String::from_utf8(f.name.to_vec()).unwrap(),
                                String::from_utf8(f.value.to_vec()).unwrap(),
                            ))
                        })
                        .unwrap();
                    blocks.push(fields);
                    if flags & END_STREAM != 0 {
                        break;
                    }
                }
                DATA if id == stream => data.extend(payload),
                _ => {}
            }
        }
        let mut messages = Vec::new();
        let mut rest = data.as_slice();
        while !rest.is_empty() {
            assert_eq!(rest[0], 0, "compressed message");
            let len = u32::from_be_bytes([rest[1], rest[2], rest[3], rest[4]]) as usize;
            messages.push(rest[5..5 + len].to_vec());
            rest = &rest[5 + len..];
        }
        let trailers = blocks.pop().unwrap();
        let mut headers = blocks.pop().unwrap_or_default();
        // hyper adds the time of day; it says nothing about the call.
        headers.retain(|(name, _)| name != "date");
        Reply {
            headers,
            messages,
            trailers,
        }
    }
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
#[allow(clippy::disallowed_methods)] // CI decides whether a missing grpcio fails
fn grpcio_available() -> bool {
    let runs = |code: &str| {
        Command::new(python())
            .args(["-c", code])
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if !runs("") {
        eprintln!("grpcio check skipped: python3 is not installed");
        return false;
    }
    if !runs("import grpc") {
        assert!(
            std::env::var_os("CI").is_none(),
            "python3's grpcio package is required in CI (make test installs it in target/py-venv)"
        );
        eprintln!(
            "grpcio check skipped: grpcio is not installed (tests/python/venv.sh installs it)"
        );
        return false;
    }
    true
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
