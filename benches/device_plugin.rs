//! Device-plugin latencies, measured against the release `gpud device-plugin` on the simulated
//! dgx-h100 and the fake kubelet:
//! - XID injection to the Unhealthy device list arriving on the kubelet's ListAndWatch stream;
//! - Allocate round trip over the plugin socket;
//! - GetPreferredAllocation computed in-process on the 8-GPU NVSwitch topology, every size;
//! - the `:authority` rewriting every plugin connection passes through: per request
//!   in-process, and as Allocate round trips against two in-process servers, one with and one
//!   without it, interleaved so that load on the machine affects both alike.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../tests/common/fake_kubelet.rs"]
mod fake_kubelet;

use std::collections::HashMap;
use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fake_kubelet::{FakeKubelet, list_and_watch, next_list};
use gpud::device_plugin::preferred::preferred;
use gpud::device_plugin::server::{PluginService, PluginState};
use gpud::grpc::rewrite::{PREFACE, Rewriter};
use gpud::inventory::Snapshot;
use gpud::proto::deviceplugin::device_plugin_client::DevicePluginClient;
use gpud::proto::deviceplugin::device_plugin_server::DevicePluginServer;
use gpud::proto::deviceplugin::{AllocateRequest, ContainerAllocateRequest};
use gpud::resources::resources;
use gpud::resources::settings::{Settings, SharedPolicy};

const XID_ROUNDS: usize = 100;
const ALLOCATE_ROUNDS: usize = 2000;
const PREFERRED_ROUNDS: usize = 2000;
const REWRITE_BATCHES: usize = 200;
const REWRITE_BATCH: usize = 1000;

/// A kubelet's first Allocate header block on a connection, as an HPACK encoder that indexes
/// every field and Huffman-codes strings (as grpc-go's does) writes it: POST, http, the
/// Allocate path, the authority, content-type, user-agent, te. With `localhost` (kubelet
/// 1.26 on) and with the socket path (older kubelets).
const FIRST_LOCALHOST: &str = concat!(
    "8386449663b8632a4615ef97b9885d745b31aa621a28390692ff4186a0e41d139d095f8b1d75d0620d263d4c",
    "4d65647a8a9acac8b4c7602bba25c14082497f864d833505b11f",
);
const FIRST_PATH: &str = concat!(
    "8386449663b8632a4615ef97b9885d745b31aa621a28390692ff41a263b8ec628346c75b632d054b1217b988",
    "55aba2d98d5218abb9a430d69abb5741c9d75f8b1d75d0620d263d4c4d65647a8a9acac8b4c7602bba25c140",
    "82497f864d833505b11f",
);
/// Every later request on the connection: the same fields, all by reference to the table.
const NEXT_BLOCK: &str = "8386c2c1c0bfbe";

fn pct(samples: &mut [Duration], p: f64) -> Duration {
    samples.sort();
    samples[((samples.len() as f64 - 1.0) * p).round() as usize]
}

fn report(name: &str, samples: &mut [Duration], goal: &str) {
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let (p50, p99) = (pct(samples, 0.5), pct(samples, 0.99));
    let max = samples[samples.len() - 1];
    println!(
        "  {name:<34} median {:>8.3} ms   p99 {:>8.3} ms   max {:>8.3} ms   ({} runs; {goal})",
        ms(p50),
        ms(p99),
        ms(max),
        samples.len()
    );
}

fn hex(text: &str) -> Vec<u8> {
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).unwrap())
        .collect()
}

/// A HEADERS frame with `block`, then a DATA frame with a 100-byte message, on stream 1.
fn request(block: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    for (kind, flags, payload) in [(1u8, 4u8, block), (0, 1, &[0u8; 105][..])] {
        let len = (payload.len() as u32).to_be_bytes();
        out.extend_from_slice(&[len[1], len[2], len[3], kind, flags, 0, 0, 0, 1]);
        out.extend_from_slice(payload);
    }
    out
}

/// Nanoseconds per request of the rewriter: `connection` is pushed once, then `next` in
/// batches; or, with `next` empty, a new connection per request.
fn rewrite_cost(name: &str, connection: &[u8], next: &[u8]) {
    let mut per_request = Vec::with_capacity(REWRITE_BATCHES);
    let mut out = Vec::with_capacity(4096);
    let mut rewriter = Rewriter::new();
    rewriter.push(connection, &mut out).unwrap();
    for _ in 0..REWRITE_BATCHES {
        let start = Instant::now();
        for _ in 0..REWRITE_BATCH {
            out.clear();
            if next.is_empty() {
                rewriter = Rewriter::new();
                rewriter.push(connection, &mut out).unwrap();
            } else {
                rewriter.push(next, &mut out).unwrap();
            }
            std::hint::black_box(&out);
        }
        per_request.push(start.elapsed().as_nanos() as f64 / REWRITE_BATCH as f64);
    }
    per_request.sort_by(f64::total_cmp);
    let p = |q: f64| per_request[((per_request.len() - 1) as f64 * q).round() as usize];
    println!(
        "  {name:<46} median {:>7.0} ns   p99 {:>7.0} ns   ({REWRITE_BATCHES} x {REWRITE_BATCH} requests)",
        p(0.5),
        p(0.99)
    );
}

fn rewrite_costs() {
    println!("  :authority rewriting per request (HEADERS + 100-byte DATA), in-process:");
    let next = request(&hex(NEXT_BLOCK));
    for (label, first) in [("localhost", FIRST_LOCALHOST), ("socket path", FIRST_PATH)] {
        let mut connection = PREFACE.to_vec();
        connection.extend_from_slice(&[0, 0, 0, 4, 0, 0, 0, 0, 0]);
        connection.extend(request(&hex(first)));
        rewrite_cost(
            &format!("{label}: new connection, first request"),
            &connection,
            &[],
        );
        rewrite_cost(&format!("{label}: later requests"), &connection, &next);
    }
}

async fn client(path: &Path) -> DevicePluginClient<tonic::transport::Channel> {
    let endpoint = tonic::transport::Endpoint::try_from(format!("unix://{}", path.display()));
    DevicePluginClient::new(endpoint.unwrap().connect().await.unwrap())
}

/// Allocate round trips against the same service served through `gpud::grpc` (socket bound
/// with its mode, connections wrapped) and through tonic alone, alternating call by call.
async fn wrapper_round_trips(snapshot: &Snapshot, ids: &[String]) {
    let settings = Settings::default();
    let state = PluginState {
        resource: Arc::new(resources(snapshot, &settings).unwrap().remove(0)),
        snapshot: Arc::new(snapshot.clone()),
        settings: Arc::new(settings),
        control_nodes: Arc::new(Vec::new()),
        mig_caps: Arc::new(HashMap::new()),
    };
    let (_state, rx) = tokio::sync::watch::channel(state);
    let dir = tempfile::tempdir().unwrap();
    let wrapped = dir.path().join("wrapped.sock");
    let plain = dir.path().join("plain.sock");
    let listener = gpud::grpc::bind(&wrapped, gpud::grpc::SOCKET_MODE).unwrap();
    let service = DevicePluginServer::new(PluginService::new(rx.clone()));
    gpud::logging::spawn(
        tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(gpud::grpc::incoming(listener)),
    );
    let listener = tokio::net::UnixListener::bind(&plain).unwrap();
    let service = DevicePluginServer::new(PluginService::new(rx));
    gpud::logging::spawn(
        tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener)),
    );
    let mut clients = [client(&wrapped).await, client(&plain).await];
    let mut samples = [Vec::new(), Vec::new()];
    for round in 0..2 * ALLOCATE_ROUNDS {
        let pair = vec![ids[round % 8].clone(), ids[(round + 1) % 8].clone()];
        let start = Instant::now();
        clients[round % 2]
            .allocate(AllocateRequest {
                container_requests: vec![ContainerAllocateRequest { devices_ids: pair }],
            })
            .await
            .unwrap();
        samples[round % 2].push(start.elapsed());
    }
    let [with, without] = &mut samples;
    report("Allocate, gpud::grpc socket", with, "in-process server");
    report("Allocate, plain tonic socket", without, "same, interleaved");
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let exe = std::env::current_exe().unwrap();
    let mock = exe.parent().unwrap().join("libnvidia_ml_mock.so");
    let dir = tempfile::tempdir().unwrap();
    let control = dir.path().join("control");
    std::fs::write(&control, "").unwrap();

    let inventory = Command::new(env!("CARGO_BIN_EXE_gpud"))
        .args(["inventory"])
        .env("GPUD_NVML_LIB", &mock)
        .env("NVML_MOCK_FIXTURE", "dgx-h100")
        .output()
        .unwrap();
    let snapshot: Snapshot = serde_json::from_slice(&inventory.stdout).unwrap();

    let mut kubelet = FakeKubelet::start(dir.path()).await;
    let mut child = Command::new(env!("CARGO_BIN_EXE_gpud"))
        .args([
            "device-plugin",
            "--kubelet-socket",
            kubelet.socket().to_str().unwrap(),
            "--kmsg",
            "",
            "--health-poll-interval",
            "20ms",
        ])
        .env("GPUD_NVML_LIB", &mock)
        .env("NVML_MOCK_FIXTURE", "dgx-h100")
        .env("NVML_MOCK_CONTROL", &control)
        .env("GPUD_STATE_DIR", dir.path().join("state"))
        .env("GPUD_LOG", "warn")
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let reg = kubelet.next_registration(10).await;
    let mut client = kubelet.plugin(&reg.endpoint).await;
    let mut stream = list_and_watch(&mut client).await;
    let first = next_list(&mut stream, 5).await;
    let ids: Vec<String> = first.devices.iter().map(|d| d.id.clone()).collect();
    println!("device-plugin on dgx-h100 (release build, simulated driver, fake kubelet)");

    // XID -> Unhealthy on ListAndWatch; then reset the GPU so the next round starts healthy.
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .open(&control)
        .unwrap();
    let mut xid = Vec::with_capacity(XID_ROUNDS);
    for round in 0..XID_ROUNDS {
        let gpu = round % 8;
        let start = Instant::now();
        writeln!(file, "xid {gpu} 79").unwrap();
        loop {
            let list = next_list(&mut stream, 5).await;
            if list.devices[gpu].health == "Unhealthy" {
                break;
            }
        }
        xid.push(start.elapsed());
        writeln!(file, "lost {gpu}").unwrap();
        tokio::time::sleep(Duration::from_millis(60)).await;
        writeln!(file, "recover {gpu}").unwrap();
        loop {
            let list = next_list(&mut stream, 5).await;
            if list.devices[gpu].health == "Healthy" {
                break;
            }
        }
    }
    report(
        "XID -> ListAndWatch Unhealthy",
        &mut xid,
        "goal p99 < 100 ms",
    );

    let mut allocate = Vec::with_capacity(ALLOCATE_ROUNDS);
    for round in 0..ALLOCATE_ROUNDS {
        let pair = vec![ids[round % 8].clone(), ids[(round + 1) % 8].clone()];
        let start = Instant::now();
        client
            .allocate(AllocateRequest {
                container_requests: vec![ContainerAllocateRequest { devices_ids: pair }],
            })
            .await
            .unwrap();
        allocate.push(start.elapsed());
    }
    report(
        "Allocate (2 GPUs, round trip)",
        &mut allocate,
        "gRPC over the unix socket",
    );

    let resource = resources(&snapshot, &Settings::default())
        .unwrap()
        .remove(0);
    let mut pref = Vec::with_capacity(PREFERRED_ROUNDS);
    for round in 0..PREFERRED_ROUNDS {
        let size = 1 + round % 8;
        let start = Instant::now();
        let chosen = preferred(
            &resource,
            &snapshot,
            &ids,
            &[],
            size,
            SharedPolicy::Distributed,
        );
        pref.push(start.elapsed());
        assert_eq!(chosen.len(), size);
    }
    report(
        "GetPreferredAllocation (8 GPUs)",
        &mut pref,
        "all sizes 1-8, in-process; goal < 1 ms",
    );

    rewrite_costs();
    wrapper_round_trips(&snapshot, &ids).await;

    let _ = child.kill();
    let _ = child.wait();
}
