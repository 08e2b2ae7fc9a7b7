//! The whole daemon (`gpud run`) on the simulated dgx-h100 (8 GPUs):
//! - start-up: process spawn to the device plugin registered with the fake kubelet AND
//!   `/metrics` serving all 8 GPUs (goal < 200 ms);
//! - resident memory after start and after a minute of default-interval work (goal ≤ 16 MiB);
//! - idle CPU of gpud's own threads at the default intervals (goal ≤ 0.5 % of a core).

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../tests/common/fake_kubelet.rs"]
mod fake_kubelet;
#[path = "support/proc.rs"]
mod proc;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fake_kubelet::FakeKubelet;

const START_ROUNDS: usize = 20;
const IDLE_WINDOW: Duration = Duration::from_secs(20);

struct Daemon(Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn(mock: &Path, dir: &Path, kubelet: &FakeKubelet, port: u16, extra: &[&str]) -> Daemon {
    let address = format!("127.0.0.1:{port}");
    let features = dir.join("gfd");
    let socket = kubelet.socket();
    let mut args = vec![
        "run",
        "--kubelet-socket",
        socket.to_str().unwrap(),
        "--kmsg",
        "",
        "-a",
        &address,
        "-o",
        features.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let child = Command::new(env!("CARGO_BIN_EXE_gpud"))
        .args(&args)
        .env("GPUD_NVML_LIB", mock)
        .env("NVML_MOCK_FIXTURE", "dgx-h100")
        .env("GPUD_STATE_DIR", features.with_file_name("state"))
        .env("GPUD_LOG", "warn")
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    Daemon(child)
}

/// Whether `/metrics` answers with all 8 GPUs' utilisation.
fn serves_all_gpus(port: u16) -> bool {
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let request = "GET /metrics HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n";
    if stream.write_all(request.as_bytes()).is_err() {
        return false;
    }
    let mut body = String::new();
    let _ = stream.read_to_string(&mut body);
    body.starts_with("HTTP/1.1 200") && body.matches("DCGM_FI_DEV_GPU_UTIL{").count() == 8
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap()
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let exe = std::env::current_exe().unwrap();
    let mock = exe.parent().unwrap().join("libnvidia_ml_mock.so");
    println!("gpud run on the simulated dgx-h100 (8 GPUs)");

    let mut starts = Vec::with_capacity(START_ROUNDS);
    for _ in 0..START_ROUNDS {
        let dir = tempfile::tempdir().unwrap();
        let mut kubelet = FakeKubelet::start(dir.path()).await;
        let port = free_port();
        let began = Instant::now();
        let _daemon = spawn(&mock, dir.path(), &kubelet, port, &[]);
        kubelet.next_registration(10).await;
        while !tokio::task::block_in_place(|| serves_all_gpus(port)) {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        starts.push(began.elapsed());
    }
    starts.sort();
    println!(
        "  start to registered + metrics served  median {:>7.1} ms   max {:>7.1} ms   ({START_ROUNDS} runs; goal < 200 ms)",
        ms(starts[START_ROUNDS / 2]),
        ms(starts[START_ROUNDS - 1])
    );

    // Default intervals: health polls every 5 s, the exporter samples every 30 s, the
    // labeller relabels every 60 s, the inventory is rescanned every 30 s.
    let dir = tempfile::tempdir().unwrap();
    let mut kubelet = FakeKubelet::start(dir.path()).await;
    let port = free_port();
    let daemon = spawn(&mock, dir.path(), &kubelet, port, &[]);
    kubelet.next_registration(10).await;
    while !tokio::task::block_in_place(|| serves_all_gpus(port)) {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let pid = daemon.0.id();
    let rss_start = proc::rss_kib(pid);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let cpu_before = proc::gpud_cpu_ns(pid);
    let idle_began = Instant::now();
    tokio::time::sleep(IDLE_WINDOW).await;
    let cpu = proc::gpud_cpu_ns(pid) - cpu_before;
    let share = cpu as f64 / idle_began.elapsed().as_nanos() as f64 * 100.0;
    println!(
        "  idle CPU (gpud threads, {} s)          {share:.3} % of a core   (goal ≤ 0.5 %)",
        IDLE_WINDOW.as_secs()
    );
    println!(
        "  resident memory                       {:.1} MiB at start, {:.1} MiB after {} s   (goal ≤ 16 MiB)",
        rss_start as f64 / 1024.0,
        proc::rss_kib(pid) as f64 / 1024.0,
        IDLE_WINDOW.as_secs() + 2
    );
}
