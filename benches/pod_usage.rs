//! Per-pod usage (`gpud exporter --pod-usage`) on the simulated dgx-h100 with 8 GPUs × 16
//! processes, each in a pod of its own (the cgroup files in the four shapes gpud reads), against
//! the stand-in API server:
//! - CPU of gpud's threads per sample cycle, with and without per-pod usage;
//! - the scrape of the body with per-pod usage beside nginx serving the same bytes (the
//!   exporter's goal: at least 80 % of nginx's throughput);
//! - resident memory before and after 10 000 PIDs came and went (goal: flat).

#![allow(clippy::unwrap_used, clippy::expect_used)]
// A benchmark reads its tools' locations from the environment (nginx on PATH).
#![allow(clippy::disallowed_methods)]

// Shared with the exporter bench, which uses all of it.
#[allow(dead_code)]
#[path = "exporter/client.rs"]
mod client;
#[path = "../tests/common/fake_api.rs"]
mod fake_api;
#[allow(dead_code)]
#[path = "exporter/load.rs"]
mod load;
#[path = "support/proc.rs"]
mod proc;
#[allow(dead_code)]
#[path = "exporter/servers.rs"]
mod servers;

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use fake_api::FakeApi;
// A gpud exporter: stopped with SIGTERM, then SIGKILL, when dropped.
use serde_json::json;
use servers::Server as Exporter;

const GPUS: u32 = 8;
const PER_GPU: u32 = 16;
const CHURNED: u32 = 10_000;
const CPU_WINDOW: Duration = Duration::from_secs(10);
const SCRAPES: usize = 2_000;
const ROUNDS: usize = 7;

/// The `/metrics` body, "" when it does not answer 200.
fn get(port: u16) -> String {
    client::get_once(port, "/metrics")
        .ok()
        .filter(|r| r.status == 200)
        .map(|r| String::from_utf8_lossy(&r.body).into_owned())
        .unwrap_or_default()
}

/// A metric's value in a body, summed over its series.
fn total(body: &str, name: &str) -> f64 {
    body.lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum()
}

fn uid(n: u32) -> String {
    format!("{n:08x}-0000-4000-8000-000000000000")
}

fn container_id(n: u32) -> String {
    format!("{n:064x}")
}

/// Process `pid` in pod number `n`'s container, in one of the four cgroup shapes.
fn write_process(proc: &Path, pid: u32, n: u32) {
    let (uid, id) = (uid(n), container_id(n));
    let systemd = uid.replace('-', "_");
    let cgroup = match n % 4 {
        0 => format!("0::/kubepods/burstable/pod{uid}/{id}\n"),
        1 => format!(
            "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{systemd}.slice/cri-containerd-{id}.scope\n"
        ),
        2 => format!("11:memory:/kubepods/pod{uid}/{id}\n1:name=systemd:/kubepods/pod{uid}/{id}\n"),
        _ => format!("4:pids:/kubepods.slice/kubepods-pod{systemd}.slice/crio-{id}.scope\n"),
    };
    let dir = proc.join(pid.to_string());
    std::fs::create_dir_all(&dir).unwrap();
    let fields = vec!["0"; 18].join(" ");
    std::fs::write(
        dir.join("stat"),
        format!("{pid} (worker) S {fields} 100 0 0\n"),
    )
    .unwrap();
    std::fs::write(dir.join("cgroup"), cgroup).unwrap();
}

fn pod(n: u32) -> serde_json::Value {
    json!({"apiVersion": "v1", "kind": "Pod",
           "metadata": {"namespace": "bench", "name": format!("job-{n}"), "uid": uid(n)},
           "spec": {"nodeName": "test-node"},
           "status": {"containerStatuses": [{"name": "main",
               "containerID": format!("containerd://{}", container_id(n)),
               "image": "i", "imageID": "", "ready": true, "restartCount": 0}]}})
}

/// Starts one batch of processes (`first_pid..`), pod number = pid, 16 per GPU.
fn start_batch(control: &Path, proc: &Path, api: &FakeApi, first_pid: u32) -> Vec<(u32, u32)> {
    let mut lines = String::new();
    let mut started = Vec::new();
    for i in 0..GPUS * PER_GPU {
        let (gpu, pid) = (i / PER_GPU, first_pid + i);
        write_process(proc, pid, pid);
        api.put_pod(pod(pid));
        lines.push_str(&format!("process {gpu} {pid} {} {}\n", 256 + i, i % 7));
        started.push((gpu, pid));
    }
    append(control, &lines);
    started
}

fn end_batch(control: &Path, proc: &Path, api: &FakeApi, batch: &[(u32, u32)]) {
    let mut lines = String::new();
    for &(gpu, pid) in batch {
        lines.push_str(&format!("process-end {gpu} {pid}\n"));
        let _ = std::fs::remove_dir_all(proc.join(pid.to_string()));
        api.delete_pod("bench", &format!("job-{pid}"));
    }
    append(control, &lines);
}

fn append(file: &Path, text: &str) {
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(file)
        .unwrap();
    f.write_all(text.as_bytes()).unwrap();
}

/// `gpud exporter` sampling every `interval_ms`, with per-pod usage when `usage`.
fn spawn(mock: &Path, dir: &Path, api: &FakeApi, usage: bool, interval_ms: &str) -> Exporter {
    let port = servers::free_port().unwrap();
    let kubeconfig = api.kubeconfig(dir);
    let address = format!("127.0.0.1:{port}");
    let proc = dir.join("proc");
    let mut args = vec!["exporter", "-a", &address, "-c", interval_ms, "--kmsg", ""];
    let usage_args = [
        "--pod-usage",
        "--pod-usage-proc-root",
        proc.to_str().unwrap(),
        "--node-name",
        "test-node",
        "--kubeconfig",
        kubeconfig.to_str().unwrap(),
    ];
    if usage {
        args.extend_from_slice(&usage_args);
    }
    let child = Command::new(env!("CARGO_BIN_EXE_gpud"))
        .args(&args)
        .env("GPUD_NVML_LIB", mock)
        .env("NVML_MOCK_FIXTURE", "dgx-h100")
        .env("NVML_MOCK_CONTROL", dir.join("control"))
        .env("GPUD_STATE_DIR", "")
        .env("GPUD_LOG", "warn")
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    Exporter {
        proc: servers::Proc(child),
        port,
    }
}

/// Waits until a body satisfies `done`; returns it.
fn body_when(port: u16, done: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let body = get(port);
        if !body.is_empty() && done(&body) {
            return body;
        }
        if Instant::now() > deadline {
            let usage: Vec<&str> = body
                .lines()
                .filter(|l| l.contains("gpud_container"))
                .take(12)
                .collect();
            panic!("the exporter never got there:\n{}", usage.join("\n"));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// CPU ms per sample cycle over CPU_WINDOW, and the last sample's wall time.
fn cpu_per_cycle(exporter: &Exporter) -> (f64, f64) {
    let pid = exporter.proc.pid();
    let samples = |b: &str| total(b, "gpud_samples_total");
    let before_body = get(exporter.port);
    let cpu_before = proc::gpud_cpu_ns(pid);
    std::thread::sleep(CPU_WINDOW);
    let cpu = proc::gpud_cpu_ns(pid) - cpu_before;
    let after_body = get(exporter.port);
    let cycles = (samples(&after_body) - samples(&before_body)).max(1.0);
    (
        cpu as f64 / 1e6 / cycles,
        total(&after_body, "gpud_sample_duration_seconds") * 1000.0,
    )
}

/// The exporter's throughput on its body, beside nginx serving the same bytes: alternating
/// rounds of keep-alive load from 4 connections, the median round of each.
fn beside_nginx(exporter: &Exporter, dir: &Path) {
    let Some(nginx) = servers::find_program("nginx", &["/usr/sbin"]) else {
        println!("  nginx is missing (benches/exporter.sh installs it): no comparison");
        return;
    };
    let body = client::get_once(exporter.port, "/metrics").unwrap().body;
    let nginx = servers::start_nginx(&nginx, &dir.join("nginx"), &body).unwrap();
    let expected = body.len();
    let accept = move |r: &client::Response| {
        if r.status == 200 && r.body.len().abs_diff(expected) <= 4096 {
            Ok(())
        } else {
            Err(format!("status {}, {} bytes", r.status, r.body.len()))
        }
    };
    let gpud_pid = exporter.proc.pid();
    let nginx_pid = nginx.proc.pid();
    let mut gpud = Vec::new();
    let mut static_file = Vec::new();
    for _ in 0..ROUNDS {
        let budget = load::Budget::Requests(SCRAPES);
        let run = load::flat_out(exporter.port, 4, budget, &accept, || {
            proc::gpud_cpu_ns(gpud_pid)
        });
        gpud.push(run.unwrap());
        let run = load::flat_out(nginx.port, 4, budget, &accept, || {
            proc::tree_cpu_ns(nginx_pid)
        });
        static_file.push(run.unwrap());
    }
    let (ratio, low, high) = load::paired_ratio(&gpud, &static_file);
    let median = |runs: &[load::Run]| {
        let mut rates: Vec<f64> = runs.iter().map(load::Run::per_second).collect();
        rates.sort_by(f64::total_cmp);
        rates[rates.len() / 2]
    };
    println!(
        "  body {:.1} KiB: gpud {:.0} scrapes/s, nginx {:.0} scrapes/s (median rounds): {:.0} % \
         (median of the rounds' ratios, {:.0}–{:.0} %; goal >= 80 %)",
        expected as f64 / 1024.0,
        median(&gpud),
        median(&static_file),
        100.0 * ratio,
        100.0 * low,
        100.0 * high
    );
}

fn main() {
    let exe = std::env::current_exe().unwrap();
    let mock = exe.parent().unwrap().join("libnvidia_ml_mock.so");
    let processes = f64::from(GPUS * PER_GPU);
    println!(
        "per-pod usage on the simulated dgx-h100: {GPUS} GPUs x {PER_GPU} processes, each in a pod of its own"
    );

    for usage in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("proc")).unwrap();
        std::fs::write(dir.path().join("proc/uptime"), "100000.00 0\n").unwrap();
        let api = FakeApi::start(json!({}));
        let control = dir.path().join("control");
        start_batch(&control, &dir.path().join("proc"), &api, 1_000_000);
        let exporter = spawn(&mock, dir.path(), &api, usage, "1000");
        body_when(exporter.port, |b| {
            !usage
                || total(b, "gpud_container_gpu_processes") == processes
                    && !b.contains(",pod=\"\"}")
        });
        let (cpu, wall) = cpu_per_cycle(&exporter);
        println!(
            "  {:<18} CPU {cpu:>6.2} ms per sample cycle (wall {wall:>5.1} ms)",
            if usage { "with --pod-usage" } else { "without" },
        );
        if usage {
            // The scrape is judged as the exporter bench judges it: at the default collect
            // interval, so that sampling does not take turns with the load on the cores.
            drop(exporter);
            let exporter = spawn(&mock, dir.path(), &api, true, "30000");
            body_when(exporter.port, |b| {
                total(b, "gpud_container_gpu_processes") == processes && !b.contains(",pod=\"\"}")
            });
            beside_nginx(&exporter, dir.path());
        }
    }

    // Churn: batches of 128 new processes in new pods replace the last batch, until 10 000
    // PIDs have come and gone; each batch is waited for in the body.
    let dir = tempfile::tempdir().unwrap();
    let proc_dir = dir.path().join("proc");
    std::fs::create_dir_all(&proc_dir).unwrap();
    std::fs::write(proc_dir.join("uptime"), "100000.00 0\n").unwrap();
    let api = FakeApi::start(json!({}));
    let control = dir.path().join("control");
    let mut batch = start_batch(&control, &proc_dir, &api, 2_000_000);
    let exporter = spawn(&mock, dir.path(), &api, true, "100");
    let seen = |first: u32| {
        move |b: &str| {
            total(b, "gpud_container_gpu_processes") == processes
                && b.contains(&format!("pod=\"job-{first}\""))
        }
    };
    body_when(exporter.port, seen(2_000_000));
    let pid = exporter.proc.pid();
    let rss_before = proc::rss_kib(pid);
    let began = Instant::now();
    let mut churned = 0;
    let mut next = 2_000_000 + GPUS * PER_GPU;
    // Resident memory after each quarter: a rise that stops is the allocator settling, one
    // that keeps going would be a leak per process or pod.
    let mut marks = Vec::new();
    while churned < CHURNED {
        end_batch(&control, &proc_dir, &api, &batch);
        batch = start_batch(&control, &proc_dir, &api, next);
        body_when(exporter.port, seen(next));
        churned += GPUS * PER_GPU;
        next += GPUS * PER_GPU;
        if marks.len() < 4 && churned >= CHURNED / 4 * (marks.len() as u32 + 1) {
            marks.push(format!("{:.1}", proc::rss_kib(pid) as f64 / 1024.0));
        }
    }
    println!(
        "  churn: {churned} PIDs in as many pods came and went in {:.1} s; resident memory {:.1} MiB before, then {} MiB after each quarter (goal: flat)",
        began.elapsed().as_secs_f64(),
        rss_before as f64 / 1024.0,
        marks.join(", ")
    );
}
