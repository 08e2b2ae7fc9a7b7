//! The scenarios of the chaos suite, each on its own simulated node and `gpud run`.

use std::collections::BTreeMap;
use std::io::Write;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use gpud::proto::deviceplugin::{AllocateRequest, ContainerAllocateRequest, ListAndWatchResponse};

use super::common::Node;
use super::common::http::{self, free_port};
use super::fake_kubelet::{FakeKubelet, list_and_watch, next_list};
use super::{Gpud, Row, poll};

fn health(list: &ListAndWatchResponse) -> Vec<String> {
    list.devices.iter().map(|d| d.health.clone()).collect()
}

/// 20 kubelet restarts, each binding its socket 0–20 ms before it listens (the plugin's first
/// attempt is then refused): every re-registration within 50 ms of `listen`, and the device
/// list complete after each.
pub async fn kubelet_restarts() -> Row {
    let node = Node::new("pcie-4gpu");
    let mut kubelet = FakeKubelet::start(node.dir.path()).await;
    let gpud = Gpud::start(&node, &kubelet, free_port());
    kubelet.next_registration(20).await;
    gpud.ready();
    let (mut lost, mut worst) = (0, Duration::ZERO);
    for round in 0..20u64 {
        let listening = kubelet
            .restart_listening_after(Duration::from_millis(round % 3 * 10))
            .await;
        let reg = kubelet.next_registration(10).await;
        let took = listening.elapsed();
        worst = worst.max(took);
        let mut client = kubelet.plugin(&reg.endpoint).await;
        let list = next_list(&mut list_and_watch(&mut client).await, 10).await;
        if took >= Duration::from_millis(50) || list.devices.len() != 4 {
            println!(
                "kubelet restart {round}: {took:?}, {} devices",
                list.devices.len()
            );
            lost += 1;
        }
    }
    Row {
        scenario: "kubelet restarts (socket before listen)",
        load: format!("4 GPUs advertised; worst re-registration {worst:.1?} (< 50 ms)"),
        faults: "20 restarts".into(),
        lost,
    }
}

/// `gpud_xid_errors_total` for `gpu` and `code`.
fn xid_count(body: &str, gpu: usize, code: u32) -> u64 {
    body.lines()
        .filter(|l| l.starts_with("gpud_xid_errors_total{"))
        .filter(|l| {
            l.contains(&format!("gpu=\"{gpu}\"")) && l.contains(&format!("xid=\"{code}\"}}"))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

/// Mixed XIDs on four GPUs at once: every report counted exactly, each GPU withdrawn once
/// (no flapping), memory bounded.
pub async fn xid_storm() -> Row {
    const CODES: [u32; 6] = [13, 31, 43, 48, 63, 79];
    const REPEATS: usize = 10;
    let node = Node::new("dgx-h100");
    let mut kubelet = FakeKubelet::start(node.dir.path()).await;
    let gpud = Gpud::start(&node, &kubelet, free_port());
    let reg = kubelet.next_registration(20).await;
    gpud.ready();
    let mut client = kubelet.plugin(&reg.endpoint).await;
    let mut stream = list_and_watch(&mut client).await;
    let first = next_list(&mut stream, 10).await;
    let rss_before = gpud.rss_kib();
    let mut lines = Vec::new();
    for _ in 0..REPEATS {
        for code in CODES {
            for gpu in 0..4 {
                lines.push(format!("xid {gpu} {code}"));
            }
        }
    }
    node.inject_all(&lines);
    let port = gpud.port;
    let body = tokio::task::block_in_place(|| {
        poll("every XID counted", 120, || {
            let body = http::get(port, "/metrics").ok()?.body;
            let done = (0..4).all(|g| {
                CODES
                    .iter()
                    .all(|c| xid_count(&body, g, *c) >= REPEATS as u64)
            });
            done.then_some(body)
        })
    });
    let mut lost = 0;
    for gpu in 0..8 {
        for code in CODES {
            let want = if gpu < 4 { REPEATS as u64 } else { 0 };
            if xid_count(&body, gpu, code) != want {
                println!(
                    "gpu {gpu} xid {code}: {} counted, {want} sent",
                    xid_count(&body, gpu, code)
                );
                lost += 1;
            }
        }
    }
    // The kubelet's view: GPUs 0-3 withdrawn once each, 4-7 untouched.
    let mut flips = BTreeMap::new();
    let mut last = health(&first);
    while let Ok(Ok(Some(list))) =
        tokio::time::timeout(Duration::from_millis(1500), stream.message()).await
    {
        let now = health(&list);
        for (i, (a, b)) in last.iter().zip(&now).enumerate() {
            if a != b {
                *flips.entry(i).or_insert(0) += 1;
            }
        }
        last = now;
    }
    let expected: BTreeMap<usize, i32> = (0..4).map(|i| (i, 1)).collect();
    if flips != expected {
        println!("health transitions {flips:?}, expected {expected:?}");
        lost += 1;
    }
    let rss_after = gpud.rss_kib();
    Row {
        scenario: "XID storm, 6 codes on 4 of 8 GPUs",
        load: format!(
            "{} XIDs in one burst; RSS {} → {} MiB",
            lines.len(),
            rss_before / 1024,
            rss_after / 1024
        ),
        faults: format!("{} XIDs, 4 withdrawals", lines.len()),
        lost,
    }
}

/// GPU 1 lost and recovered five times while Allocate runs on the healthy GPUs.
pub async fn lost_and_recovered_during_allocations() -> Row {
    let node = Node::new("pcie-4gpu");
    let mut kubelet = FakeKubelet::start(node.dir.path()).await;
    let gpud = Gpud::start(&node, &kubelet, free_port());
    let reg = kubelet.next_registration(20).await;
    gpud.ready();
    let mut client = kubelet.plugin(&reg.endpoint).await;
    let mut stream = list_and_watch(&mut client).await;
    let first = next_list(&mut stream, 10).await;
    let ids: Vec<String> = first.devices.iter().map(|d| d.id.clone()).collect();
    let (mut lost, mut allocations) = (0, 0);
    for cycle in 0..5 {
        for (line, want) in [("lost 1", "Unhealthy"), ("recover 1", "Healthy")] {
            node.inject(line);
            let deadline = Instant::now() + Duration::from_secs(15);
            loop {
                // Allocations of healthy GPUs keep working whatever GPU 1 does.
                let answer = client
                    .allocate(AllocateRequest {
                        container_requests: vec![ContainerAllocateRequest {
                            devices_ids: vec![ids[0].clone(), ids[3].clone()],
                        }],
                    })
                    .await;
                allocations += 1;
                if answer.is_err() {
                    lost += 1;
                }
                match tokio::time::timeout(Duration::from_millis(200), stream.message()).await {
                    Ok(Ok(Some(list))) if list.devices[1].health == want => break,
                    Ok(Ok(Some(_))) | Err(_) => {}
                    Ok(other) => panic!("ListAndWatch ended: {other:?}"),
                }
                if Instant::now() > deadline {
                    println!("cycle {cycle}: GPU 1 never {want}");
                    lost += 1;
                    break;
                }
            }
        }
    }
    Row {
        scenario: "GPU lost and recovered during allocations",
        load: format!("{allocations} Allocate calls"),
        faults: "5 lost/recover cycles".into(),
        lost,
    }
}

/// 20 SIGHUPs alternating a valid and an invalid config: one log line per outcome, readiness
/// held, the device plugin's registration untouched by bad ones.
pub async fn reload_churn() -> Row {
    let node = Node::new("pcie-4gpu");
    let mut kubelet = FakeKubelet::start(node.dir.path()).await;
    let gpud = Gpud::start(&node, &kubelet, free_port());
    kubelet.next_registration(20).await;
    gpud.ready();
    let mut lost = 0;
    for round in 0..20 {
        let good = round % 2 == 0;
        let text = if good {
            "version: v1\nflags:\n  migStrategy: none\n"
        } else {
            "version: v1\nflags:\n  migStrategy: sometimes\n"
        };
        std::fs::write(&gpud.config, text).unwrap();
        super::common::send_signal(&gpud.child, "HUP");
        let (line, count) = if good {
            ("Configuration reloaded", round / 2 + 1)
        } else {
            ("Configuration not reloaded", round / 2 + 1)
        };
        let log = gpud.log.clone();
        tokio::task::block_in_place(|| {
            poll("reload outcome logged", 10, || {
                let text = std::fs::read_to_string(&log).ok()?;
                (text.matches(line).count() >= count).then_some(())
            })
        });
        if http::get(gpud.port, "/readyz").map(|a| a.status).ok() != Some(200) {
            lost += 1;
        }
    }
    let log = std::fs::read_to_string(&gpud.log).unwrap();
    let outcomes = log.lines().filter(|l| l.contains("reloaded")).count();
    if outcomes != 20 {
        println!("{outcomes} reload lines for 20 reloads");
        lost += 1;
    }
    Row {
        scenario: "config reload churn",
        load: "ready throughout".into(),
        faults: "10 valid + 10 invalid reloads, 20 log lines".into(),
        lost,
    }
}

/// 200 idle and 50 slowloris connections (cap 100) while 300 scrapes must all succeed.
pub async fn scrape_flood() -> Row {
    let node = Node::new("dgx-h100");
    let kubelet = FakeKubelet::start(node.dir.path()).await;
    let gpud = Gpud::start(&node, &kubelet, free_port());
    gpud.ready();
    let port = gpud.port;
    let (lost, scrapes) = tokio::task::block_in_place(|| {
        let mut held = Vec::new();
        for i in 0..250 {
            if let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) {
                if i % 5 == 0 {
                    // Slowloris: a request head that never ends.
                    let _ = stream.write_all(b"GET /metrics HTTP/1.1\r\nX-Slow: ");
                }
                held.push(stream);
            }
        }
        let mut lost = 0;
        let mut scrapes = 0;
        for round in 0..300 {
            if round % 10 == 0 {
                for stream in held.iter_mut().step_by(5) {
                    let _ = stream.write_all(b"a");
                }
            }
            scrapes += 1;
            match http::get(port, "/metrics") {
                Ok(a)
                    if a.status == 200 && a.body.matches("DCGM_FI_DEV_GPU_UTIL{").count() == 8 => {}
                other => {
                    println!("scrape {round}: {:?}", other.map(|a| a.status));
                    lost += 1;
                }
            }
        }
        drop(held);
        (lost, scrapes)
    });
    Row {
        scenario: "scrape flood (connection cap 100)",
        load: format!("{scrapes} scrapes, 8 GPUs each"),
        faults: "200 idle + 50 slowloris connections".into(),
        lost,
    }
}

/// kill -9 at varied moments and restart, five times, a temporary of a write killed midway
/// planted each time: no stale socket or temporary afterwards, the labels file always whole.
pub async fn kill_and_restart() -> Row {
    let node = Node::new("pcie-4gpu");
    let mut kubelet = FakeKubelet::start(node.dir.path()).await;
    let port = free_port();
    let mut lost = 0;
    let mut reads = 0u64;
    for round in 0..5u64 {
        let gpud = Gpud::start(&node, &kubelet, port);
        let features = gpud.features.clone();
        let dir = features.parent().unwrap().to_path_buf();
        kubelet.next_registration(20).await;
        gpud.ready();
        let labels = std::fs::read_to_string(&features).unwrap_or_default();
        let whole = |text: &str| text.ends_with('\n') && text.contains("nvidia.com/gpu.count=4\n");
        if !whole(&labels) {
            println!("round {round}: labels not whole: {labels:?}");
            lost += 1;
        }
        let temps: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|n| n.ends_with(".tmp"))
            .collect();
        if !temps.is_empty() {
            println!("round {round}: temporaries left: {temps:?}");
            lost += 1;
        }
        reads += 1;
        // Relabelling triggered by SIGHUP while the kill lands a varied moment later.
        super::common::send_signal(&gpud.child, "HUP");
        std::thread::sleep(Duration::from_millis(round * 37 % 100));
        super::common::send_signal(&gpud.child, "KILL");
        drop(gpud);
        // What a write killed midway leaves; the next run must remove it.
        std::fs::write(
            dir.join(format!(".gfd.{}.0.tmp", 4_000_000 + round)),
            "nvidia.com/gpu.cou",
        )
        .unwrap();
    }
    // The last restart, checked the same way, and its plugin socket the only one.
    let gpud = Gpud::start(&node, &kubelet, port);
    kubelet.next_registration(20).await;
    gpud.ready();
    let dir = gpud.features.parent().unwrap().to_path_buf();
    let leftovers: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n != "gfd")
        .collect();
    if !leftovers.is_empty() {
        println!("after the kills: {leftovers:?}");
        lost += 1;
    }
    let mut sockets: Vec<String> = std::fs::read_dir(node.dir.path())
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.ends_with(".sock"))
        .collect();
    sockets.sort();
    if sockets != ["kubelet.sock", "nvidia-gpu.sock"] {
        println!("sockets after the kills: {sockets:?}");
        lost += 1;
    }
    Row {
        scenario: "kill -9 and restart",
        load: format!("{reads} labels files checked whole"),
        faults: "5 kills, 5 planted temporaries".into(),
        lost,
    }
}
