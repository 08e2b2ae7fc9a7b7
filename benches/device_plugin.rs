//! Device-plugin latencies, measured against the release `gpud device-plugin` on the simulated
//! dgx-h100 and the fake kubelet:
//! - XID injection to the Unhealthy device list arriving on the kubelet's ListAndWatch stream;
//! - Allocate round trip over the plugin socket;
//! - GetPreferredAllocation computed in-process on the 8-GPU NVSwitch topology, every size.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../tests/common/fake_kubelet.rs"]
mod fake_kubelet;

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use fake_kubelet::{FakeKubelet, list_and_watch, next_list};
use gpud::device_plugin::preferred::preferred;
use gpud::device_plugin::resources::resources;
use gpud::device_plugin::settings::{Settings, SharedPolicy};
use gpud::inventory::Snapshot;
use gpud::proto::deviceplugin::{AllocateRequest, ContainerAllocateRequest};

const XID_ROUNDS: usize = 100;
const ALLOCATE_ROUNDS: usize = 2000;
const PREFERRED_ROUNDS: usize = 2000;

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

    let _ = child.kill();
    let _ = child.wait();
}
