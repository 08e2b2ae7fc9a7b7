//! Replacing a running `gpud run` on the simulated dgx-h100 (8 GPUs, MPS with 2 replicas per
//! GPU) under the load a node has, once by a takeover and once by a cold restart, side by side:
//!
//! - a scraper on `/metrics` at 50 requests/s, on a new connection each time;
//! - a kubelet that follows the device plugin's registrations, watches ListAndWatch on the
//!   newest and calls Allocate every 100 ms; a device list that withdraws a device that was
//!   healthy, or a stream that ends with no newer registration (a real kubelet then marks every
//!   device unhealthy), counts as withdrawn devices;
//! - a kubelet's DRA health stream (NodeWatchResources) on the DRA plugin socket, opened again
//!   whenever it ends, as the kubelet does;
//! - an XID injected on GPU 2 right after the new process starts.
//!
//! Reported per way: failed scrapes, the longest time without an answer, withdrawn devices,
//! failed Allocates, the longest time without a DRA health stream and the healthy DRA devices
//! it withdrew, the XID 79 count before and after, whether the MPS control daemon is the same
//! process, and the time from the new process's start to the old one having finished.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../tests/common/mod.rs"]
mod common;
#[path = "../tests/common/fake_api.rs"]
mod fake_api;
#[path = "../tests/common/fake_kubelet.rs"]
mod fake_kubelet;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::Node;
use common::http::{self, ScrapeReport, Scraper, free_port};
use fake_kubelet::{FakeKubelet, list_and_watch};
use gpud::proto::deviceplugin::device_plugin_client::DevicePluginClient;
use gpud::proto::deviceplugin::{AllocateRequest, ContainerAllocateRequest};
use gpud::proto::drahealth_v1::dra_resource_health_client::DraResourceHealthClient;
use gpud::proto::drahealth_v1::{HealthStatus, NodeWatchResourcesRequest};

struct Gpud {
    child: Child,
    log: PathBuf,
}

impl Drop for Gpud {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn log_when(path: &Path, needle: &str) -> String {
    common::file_when(path, needle, 30)
}

/// The `key=value` field of the last log line holding `needle`.
fn field(log: &str, needle: &str, key: &str) -> Option<u64> {
    let line = log.lines().rev().find(|l| l.contains(needle))?;
    let at = line.find(&format!("{key}="))? + key.len() + 1;
    line[at..]
        .split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

#[derive(Debug, Default)]
struct KubeletView {
    withdrawn: AtomicU64,
    allocate_failed: AtomicU64,
    allocated: AtomicU64,
}

/// Follows registrations, watches the newest plugin and allocates on it until `stop`.
async fn kubelet_loop(mut kubelet: FakeKubelet, view: Arc<KubeletView>, stop: Arc<AtomicBool>) {
    let mut current: Option<Plugin> = None;
    let healthy: Arc<Mutex<BTreeSet<String>>> = Arc::default();
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    while !stop.load(Ordering::SeqCst) {
        // A registration switches the resource to the new endpoint at once, as the kubelet's
        // Register call does; the old stream's end after that means nothing.
        let Some((client, stream)) = current.as_mut() else {
            if let Some(registration) = kubelet.registration_within(5).await {
                current = Some(connect(&kubelet, &registration.endpoint).await);
            }
            continue;
        };
        tokio::select! {
            registration = kubelet.registration_within(100) => {
                if let Some(registration) = registration {
                    current = Some(connect(&kubelet, &registration.endpoint).await);
                }
            }
            message = stream.message() => match message {
                Ok(Some(list)) => {
                    let now: BTreeSet<String> = list
                        .devices
                        .iter()
                        .filter(|d| d.health == "Healthy")
                        .map(|d| d.id.clone())
                        .collect();
                    let mut before = healthy.lock().unwrap();
                    let lost = before.difference(&now).count() as u64;
                    view.withdrawn.fetch_add(lost, Ordering::SeqCst);
                    *before = now;
                }
                _ => {
                    // The plugin's stream ended with no newer registration: the kubelet marks
                    // every device of the resource unhealthy until one comes.
                    let mut before = healthy.lock().unwrap();
                    view.withdrawn.fetch_add(before.len() as u64, Ordering::SeqCst);
                    before.clear();
                    current = None;
                }
            },
            _ = tick.tick() => {
                let ids: Vec<String> = healthy.lock().unwrap().iter().take(1).cloned().collect();
                if ids.is_empty() {
                    continue;
                }
                let request = AllocateRequest {
                    container_requests: vec![ContainerAllocateRequest { devices_ids: ids }],
                };
                match client.allocate(request).await {
                    Ok(_) => view.allocated.fetch_add(1, Ordering::SeqCst),
                    Err(_) => view.allocate_failed.fetch_add(1, Ordering::SeqCst),
                };
            }
        }
    }
}

type Plugin = (
    DevicePluginClient<tonic::transport::Channel>,
    tonic::Streaming<gpud::proto::deviceplugin::ListAndWatchResponse>,
);

async fn connect(kubelet: &FakeKubelet, endpoint: &str) -> Plugin {
    let mut client = kubelet.plugin(endpoint).await;
    let stream = list_and_watch(&mut client).await;
    (client, stream)
}

#[derive(Debug, Default)]
struct HealthView {
    lists: AtomicU64,
    withdrawn: AtomicU64,
    longest_gap_ms: AtomicU64,
}

/// A kubelet's DRA health stream on the plugin socket until `stop`: opened again at once
/// whenever it ends; the time from an end to the next list is a gap.
async fn health_loop(socket: PathBuf, view: Arc<HealthView>, stop: Arc<AtomicBool>) {
    let endpoint =
        tonic::transport::Endpoint::from_shared(format!("unix:{}", socket.display())).unwrap();
    let mut healthy: BTreeSet<String> = BTreeSet::new();
    let mut ended: Option<Instant> = None;
    while !stop.load(Ordering::SeqCst) {
        let stream = async {
            let channel = endpoint.connect().await.ok()?;
            let mut client = DraResourceHealthClient::new(channel);
            let response = client
                .node_watch_resources(NodeWatchResourcesRequest {})
                .await
                .ok()?;
            Some(response.into_inner())
        };
        let Some(mut stream) = stream.await else {
            tokio::time::sleep(Duration::from_millis(5)).await;
            continue;
        };
        loop {
            tokio::select! {
                message = stream.message() => match message {
                    Ok(Some(list)) => {
                        if let Some(at) = ended.take() {
                            let gap = at.elapsed().as_millis() as u64;
                            view.longest_gap_ms.fetch_max(gap, Ordering::SeqCst);
                        }
                        view.lists.fetch_add(1, Ordering::SeqCst);
                        let now: BTreeSet<String> = list
                            .devices
                            .iter()
                            .filter(|d| d.health == HealthStatus::Healthy as i32)
                            .filter_map(|d| d.device.as_ref().map(|id| id.device_name.clone()))
                            .collect();
                        let lost = healthy.difference(&now).count() as u64;
                        view.withdrawn.fetch_add(lost, Ordering::SeqCst);
                        healthy = now;
                    }
                    _ => {
                        ended = Some(Instant::now());
                        break;
                    }
                },
                () = tokio::time::sleep(Duration::from_millis(100)) => {
                    if stop.load(Ordering::SeqCst) {
                        return;
                    }
                }
            }
        }
    }
}

fn xid_79(port: u16) -> u64 {
    http::get(port, "/metrics")
        .ok()
        .and_then(|a| {
            a.body
                .lines()
                .find(|l| l.starts_with("gpud_xid_errors_total{") && l.contains("xid=\"79\""))
                .and_then(|l| l.rsplit_once(' '))
                .and_then(|(_, n)| n.parse().ok())
        })
        .unwrap_or(0)
}

fn mps_pid(node: &Node) -> String {
    std::fs::read_to_string(
        node.dir
            .path()
            .join("mps/nvidia.com/gpu/pipe/fake-daemon.pid"),
    )
    .unwrap_or_default()
    .trim()
    .to_owned()
}

#[derive(Debug)]
struct Outcome {
    scrapes: ScrapeReport,
    withdrawn: u64,
    health_gap_ms: u64,
    health_withdrawn: u64,
    allocate_failed: u64,
    allocated: u64,
    xid_before: u64,
    xid_after: u64,
    same_mps_daemon: bool,
    replaced_ms: u64,
}

/// One replacement under load: `hot` takes over, otherwise the old process is stopped first.
async fn replace(hot: bool) -> Outcome {
    let node = Node::new("dgx-h100");
    let bin = node.dir.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::copy(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/mps/nvidia-cuda-mps-control"),
        bin.join("nvidia-cuda-mps-control"),
    )
    .unwrap();
    std::fs::write(
        node.dir.path().join("config.yaml"),
        format!(
            "version: v1\nflags:\n  mpsRoot: {}\nsharing:\n  mps:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 2\n",
            node.dir.path().join("mps").display()
        ),
    )
    .unwrap();
    let api = fake_api::FakeApi::start(serde_json::json!({}));
    // Written as <node>/kubeconfig, where start() points gpud.
    api.kubeconfig(node.dir.path());
    let kubelet = FakeKubelet::start(node.dir.path()).await;
    let socket = kubelet.socket();
    let port = free_port();
    let mut old = start(&node, &socket, port, "old");
    log_when(&old.log, "All subsystems ready");
    node.inject("xid 2 79");
    http::wait_for(port, "/metrics", 10, |_| xid_79(port) == 1);
    let mps_before = mps_pid(&node);

    let stop = Arc::new(AtomicBool::new(false));
    let view = Arc::new(KubeletView::default());
    #[allow(clippy::disallowed_methods)] // a fake kubelet, not a gpud subsystem: no span to keep
    let watcher = tokio::spawn(kubelet_loop(kubelet, Arc::clone(&view), Arc::clone(&stop)));
    let scraping = Scraper::start(port);
    let health = Arc::new(HealthView::default());
    #[allow(clippy::disallowed_methods)] // a fake kubelet, not a gpud subsystem: no span to keep
    let health_watch = tokio::spawn(health_loop(
        node.dir.path().join("plugins/gpu.nvidia.com/dra.sock"),
        Arc::clone(&health),
        Arc::clone(&stop),
    ));
    // The load settles on the old process first.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let xid_before = xid_79(port);

    let began = Instant::now();
    let replaced_ms;
    let new;
    if hot {
        new = start(&node, &socket, port, "new");
        node.inject("xid 2 79");
        let text = log_when(&new.log, "Took over: the gpud taken over from has finished");
        replaced_ms = field(&text, "Took over", "takeover_ms").unwrap_or(0);
        log_when(&old.log, "waiting to be stopped");
        common::send_signal(&old.child, "TERM");
        old.child.wait().unwrap();
    } else {
        common::send_signal(&old.child, "TERM");
        old.child.wait().unwrap();
        new = start(&node, &socket, port, "new");
        node.inject("xid 2 79");
        log_when(&new.log, "All subsystems ready");
        replaced_ms = began.elapsed().as_millis() as u64;
    }
    // The load goes on against the new process for a moment.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let xid_after = xid_79(port);
    let same_mps_daemon = mps_pid(&node) == mps_before && !mps_before.is_empty();
    stop.store(true, Ordering::SeqCst);
    let scrapes = tokio::task::spawn_blocking(move || scraping.finish())
        .await
        .unwrap();
    watcher.await.unwrap();
    health_watch.await.unwrap();
    assert!(
        health.lists.load(Ordering::SeqCst) > 0,
        "no DRA health list"
    );
    drop(new);
    Outcome {
        scrapes,
        withdrawn: view.withdrawn.load(Ordering::SeqCst),
        health_gap_ms: health.longest_gap_ms.load(Ordering::SeqCst),
        health_withdrawn: health.withdrawn.load(Ordering::SeqCst),
        allocate_failed: view.allocate_failed.load(Ordering::SeqCst),
        allocated: view.allocated.load(Ordering::SeqCst),
        xid_before,
        xid_after,
        same_mps_daemon,
        replaced_ms,
    }
}

/// `gpud run` on the node, registering with the kubelet at `socket`; its log in `<name>.log`.
fn start(node: &Node, socket: &Path, port: u16, name: &str) -> Gpud {
    let log = node.dir.path().join(format!("{name}.log"));
    let path = |rel: &str| node.dir.path().join(rel).display().to_string();
    let mut args: Vec<String> = ["run", "--dra", "--kubeconfig", &path("kubeconfig")]
        .map(String::from)
        .to_vec();
    args.extend(node.dra_flags());
    args.extend(
        [
            "--doctor-interval",
            "0",
            "--kubelet-socket",
            socket.to_str().unwrap(),
            "--extended-resource-owner",
            "device-plugin",
            "--config-file",
            &path("config.yaml"),
            "--mps-skip-shm-mount",
            "--output-file",
            &path("features"),
            "--kmsg",
            "",
            "--health-poll-interval",
            "50ms",
            "-a",
            &format!("127.0.0.1:{port}"),
        ]
        .map(String::from),
    );
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut command = node.gpud(&args);
    #[allow(clippy::disallowed_methods)]
    let search = std::env::var("PATH").unwrap_or_default();
    command
        .env("PATH", format!("{}:{search}", path("bin")))
        .env("GPUD_LOG", "info")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap());
    Gpud {
        child: command.spawn().expect("start gpud run"),
        log,
    }
}

/// The rows of the table for one way of replacing.
fn cells(o: &Outcome) -> Vec<(&'static str, String)> {
    let of = |part: u64, all: u64| format!("{part} of {all}");
    vec![
        (
            "failed scrapes (of 50/s)",
            of(
                o.scrapes.failed.len() as u64,
                o.scrapes.answered + o.scrapes.failed.len() as u64,
            ),
        ),
        (
            "longest time without an answer (ms)",
            o.scrapes.longest_gap.as_millis().to_string(),
        ),
        (
            "healthy devices withdrawn from the kubelet",
            o.withdrawn.to_string(),
        ),
        (
            "longest time without a DRA health stream (ms)",
            o.health_gap_ms.to_string(),
        ),
        (
            "healthy devices withdrawn from DRA health",
            o.health_withdrawn.to_string(),
        ),
        (
            "Allocate calls failed",
            of(o.allocate_failed, o.allocated + o.allocate_failed),
        ),
        (
            "XID 79 count before -> after one more XID",
            format!("{} -> {}", o.xid_before, o.xid_after),
        ),
        (
            "MPS control daemon kept (same pid)",
            o.same_mps_daemon.to_string(),
        ),
        (
            "new process start -> old finished (cold: ready)",
            o.replaced_ms.to_string(),
        ),
    ]
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let hot = replace(true).await;
    let cold = replace(false).await;
    println!("upgrade: gpud run --dra on dgx-h100 (MPS, 2 replicas) replaced under load");
    println!("{:<48} {:>16} {:>16}", "", "takeover", "cold restart");
    for ((what, hot), (_, cold)) in cells(&hot).into_iter().zip(cells(&cold)) {
        println!("{what:<48} {hot:>16} {cold:>16}");
    }
}
