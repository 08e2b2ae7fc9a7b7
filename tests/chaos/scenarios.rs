//! The scenarios of the chaos suite, each on its own simulated node and `gpud run`.

use std::collections::BTreeMap;
use std::io::Write;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use gpud::proto::deviceplugin::{AllocateRequest, ContainerAllocateRequest, ListAndWatchResponse};

use serde_json::json;

use super::common::Node;
use super::common::http::{self, free_port};
use super::fake_api::FakeApi;
use super::fake_kubelet::{FakeKubelet, list_and_watch, next_list};
use super::fake_pod_resources::{self as pod_resources, Holder, Mode};
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
        // From `listen` to the Register call arriving at the kubelet, both stamped where they
        // happen: the test's own scheduling adds nothing.
        let (arrived, reg) = kubelet.next_registration_at(10).await;
        let took = arrived.saturating_duration_since(listening);
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
/// (no flapping), memory bounded (under 32 MiB of growth).
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
    // The kubelet's view: GPUs 0-3 withdrawn once each, 4-7 untouched. "No further
    // transition" has no event of its own, so a marker follows the storm down the same path
    // (an XID, after every storm XID was counted): once GPU 7's withdrawal arrives, every
    // transition the storm caused has arrived before it.
    node.inject("xid 7 79");
    let mut flips = BTreeMap::new();
    let mut last = health(&first);
    while last[7] == "Healthy" {
        let list = next_list(&mut stream, 20).await;
        let now = health(&list);
        for (i, (a, b)) in last.iter().zip(&now).enumerate() {
            if a != b {
                *flips.entry(i).or_insert(0) += 1;
            }
        }
        last = now;
    }
    let expected: BTreeMap<usize, i32> = (0..4).chain([7]).map(|i| (i, 1)).collect();
    if flips != expected {
        println!("health transitions {flips:?}, expected {expected:?}");
        lost += 1;
    }
    let rss_after = gpud.rss_kib();
    // The storm's counters are a few hundred numbers; 32 MiB of growth would be a leak per
    // event (or an unbounded queue), not noise.
    if rss_after > rss_before + 32 * 1024 {
        println!("RSS {rss_before} → {rss_after} KiB");
        lost += 1;
    }
    Row {
        scenario: "XID storm, 6 codes on 4 of 8 GPUs",
        load: format!(
            "{} XIDs in one burst; RSS {} → {} MiB",
            lines.len(),
            rss_before / 1024,
            rss_after / 1024
        ),
        faults: format!("{} XIDs, 4 withdrawals (+1 marker)", lines.len()),
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

/// The `DCGM_` series of a body, each as its family and GPU (pod labels come and go with the
/// kubelet; the series must not).
fn dcgm_series(body: &str) -> std::collections::BTreeSet<String> {
    body.lines()
        .filter(|l| l.starts_with("DCGM_"))
        .filter_map(|l| {
            let (family, labels) = l.split_once('{')?;
            let gpu = labels.split(',').find(|l| l.starts_with("gpu="))?;
            Some(format!("{family}{{{gpu}}}"))
        })
        .collect()
}

/// Whether every GPU's utilisation carries the pod `pod-<gpu>` and attribution is up.
fn attributed(body: &str, gpus: usize) -> bool {
    body.contains("\ngpud_pod_resources_up 1\n")
        && (0..gpus).all(|g| {
            body.lines().any(|l| {
                l.starts_with(&format!("DCGM_FI_DEV_GPU_UTIL{{gpu=\"{g}\","))
                    && l.contains(&format!("pod=\"pod-{g}\""))
            })
        })
}

/// Whether attribution is off and no series carries a pod label.
fn unattributed(body: &str) -> bool {
    body.contains("\ngpud_pod_resources_up 0\n") && !body.contains("pod=\"")
}

/// The kubelet's pod-resources socket missing, failing, hanging and restarting, while a
/// scraper keeps asking for `/metrics`: every scrape answers in time with every GPU's series,
/// pod labels come back each time the kubelet answers again, descriptors stay bounded.
pub async fn pod_resources_faults() -> Row {
    const GPUS: usize = 4;
    /// A scrape reads the cache and never waits on the kubelet; a `List` that hangs times out
    /// after 5 s, so a scrape that waited on it would take longer than this.
    const SCRAPE_DEADLINE: Duration = Duration::from_secs(2);
    let node = Node::new("pcie-4gpu");
    let kubelet = FakeKubelet::start(node.dir.path()).await;
    let socket = node.dir.path().join("pod-resources.sock");
    let ids: Vec<String> = (0..GPUS).map(|g| g.to_string()).collect();
    let held: Vec<[&str; 1]> = ids.iter().map(|id| [id.as_str()]).collect();
    let names: Vec<String> = (0..GPUS).map(|g| format!("pod-{g}")).collect();
    // Pod `pod-<n>` holds GPU n, by index.
    let holders: Vec<Holder<'_>> = (0..GPUS)
        .map(|g| Holder {
            namespace: "ml",
            pod: &names[g],
            container: "main",
            resource: "nvidia.com/gpu",
            ids: &held[g],
        })
        .collect();
    let pods = pod_resources::answer(&holders);
    let gpud = Gpud::start_with(
        &node,
        &kubelet,
        free_port(),
        &[
            "-k",
            "--pod-resources-kubelet-socket",
            socket.to_str().unwrap(),
            "--pod-resources-poll-interval",
            "100ms",
        ],
    );
    gpud.ready();
    let port = gpud.port;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let scraper = {
        let stop = std::sync::Arc::clone(&stop);
        std::thread::spawn(move || {
            let (mut scrapes, mut lost, mut worst) = (0u64, 0u64, Duration::ZERO);
            // Every series seen so far: the sampler may add fields after the first scrape,
            // but a series once there must stay.
            let mut seen = std::collections::BTreeSet::new();
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                let started = Instant::now();
                let answer = http::get(port, "/metrics");
                let took = started.elapsed();
                worst = worst.max(took);
                scrapes += 1;
                let series = answer
                    .as_ref()
                    .map(|a| dcgm_series(&a.body))
                    .unwrap_or_default();
                let missing: Vec<&String> = seen.difference(&series).collect();
                let whole = answer.as_ref().is_ok_and(|a| {
                    a.status == 200 && a.body.matches("DCGM_FI_DEV_GPU_UTIL{").count() == GPUS
                });
                if !whole || !missing.is_empty() || took >= SCRAPE_DEADLINE {
                    println!("scrape {scrapes}: {took:?}, missing {missing:?}");
                    lost += 1;
                }
                seen.extend(series);
                // Pacing the load, not waiting for anything.
                std::thread::sleep(Duration::from_millis(20));
            }
            (scrapes, lost, worst)
        })
    };
    let metrics_until = |what: &str, accept: fn(&str, usize) -> bool| {
        tokio::task::block_in_place(|| {
            poll(what, 30, || {
                let body = http::get(port, "/metrics").ok()?.body;
                accept(&body, GPUS).then_some(())
            })
        });
    };
    let (mut faults, mut lost) = (0, 0);

    // No socket at all: the exporter starts without attribution.
    metrics_until("attribution off without a socket", |b, _| unattributed(b));
    faults += 1;
    let mut server = pod_resources::FakeKubelet::start(&socket, pods.clone());
    metrics_until("pod labels", attributed);
    let fds_before = gpud.fds();

    // Errors, then a hang (the call accepted and never answered), each healed.
    for mode in [Mode::Fail, Mode::Hang] {
        let connections = server.connections();
        server.set_mode(mode);
        metrics_until("attribution off while failing", |b, _| unattributed(b));
        server.set_mode(Mode::Answer);
        metrics_until("pod labels back", attributed);
        faults += 1;
        // One connection per failed poll at most: a client that leaked one per attempt, or
        // retried in a loop, would open far more (a poll every 100 ms).
        let opened = server.connections() - connections;
        if opened > 3 {
            println!("{mode:?}: {opened} connections opened");
            lost += 1;
        }
    }

    // Restarts: the socket gone (attribution off), then a fresh server on it.
    for _ in 0..5 {
        drop(server);
        metrics_until("attribution off without a socket", |b, _| unattributed(b));
        server = pod_resources::FakeKubelet::start(&socket, pods.clone());
        metrics_until("pod labels back after a restart", attributed);
        faults += 1;
    }
    let fds_after = gpud.fds();
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let (scrapes, scrape_lost, worst) = tokio::task::block_in_place(|| scraper.join().unwrap());
    lost += scrape_lost;
    // A descriptor leaked per reconnect would show as about ten more.
    if fds_after > fds_before + 3 {
        println!("descriptors {fds_before} → {fds_after}");
        lost += 1;
    }
    drop(server);
    Row {
        scenario: "pod-resources socket faults",
        load: format!(
            "{scrapes} scrapes of 4 GPUs, worst {worst:.1?} (< 2 s); fds {fds_before} → {fds_after}"
        ),
        faults: format!("{faults} (missing, errors, hang, 5 restarts)"),
        lost,
    }
}

/// `key=value` lines of a features file.
fn file_labels(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

/// The API server down while the labels change, and back: the Node ends with exactly the
/// labels the labeller wrote to its file beside the foreign ones (nothing lost, nothing
/// stale), the retries back off (bounded), and the Node catches up within a backoff step.
pub async fn api_server_down_and_back() -> Row {
    const SINK_FAILED: &str = "Cannot write the labels to node test-node; retrying";
    let foreign = json!({"kubernetes.io/hostname": "test-node", "example.com/rack": "r7"});
    let node = Node::new("pcie-4gpu");
    let kubelet = FakeKubelet::start(node.dir.path()).await;
    let mut api = FakeApi::start(foreign.clone());
    let kubeconfig = api.kubeconfig(node.dir.path());
    let gpud = Gpud::start_with(
        &node,
        &kubelet,
        free_port(),
        &[
            "--sink",
            "both",
            "--kubeconfig",
            kubeconfig.to_str().unwrap(),
        ],
    );
    gpud.ready();
    let features = gpud.features.clone();
    let on_file = move || file_labels(&std::fs::read_to_string(&features).unwrap_or_default());
    let foreign: BTreeMap<String, String> = serde_json::from_value(foreign).unwrap();
    let expected = |file: BTreeMap<String, String>| {
        let mut all = foreign.clone();
        all.extend(file);
        all
    };
    let converged = |api: &FakeApi, secs: u64| {
        tokio::task::block_in_place(|| {
            poll("the Node's labels equal the labeller's", secs, || {
                (api.node_labels() == expected(on_file())).then_some(())
            })
        });
    };
    converged(&api, 20);
    let (mut lost, mut worst, mut retries) = (0, Duration::ZERO, 0);
    let changes = ["lost 1", "recover 1", "lost 2", "recover 2"];
    for change in changes {
        let before = on_file();
        let failed = gpud.logged(SINK_FAILED);
        api.stop();
        node.inject(change);
        tokio::task::block_in_place(|| {
            poll("the labels change", 20, || {
                (on_file() != before).then_some(())
            });
            // Down long enough for three attempts to fail (0.5 s, then 1 s between them).
            poll("three failed writes", 30, || {
                (gpud.logged(SINK_FAILED) >= failed + 3).then_some(())
            });
        });
        api.restart();
        let back = Instant::now();
        converged(&api, 30);
        let took = back.elapsed();
        worst = worst.max(took);
        let attempts = gpud.logged(SINK_FAILED) - failed;
        retries += attempts;
        // The next attempt is one backoff step (2 s, up to 25 % more) after the third failure;
        // a fourth failure is a retry that raced the restart.
        if attempts > 4 || took > Duration::from_secs(10) {
            println!("{change}: {attempts} failed writes, the Node caught up {took:?} after");
            lost += 1;
        }
    }
    Row {
        scenario: "API server down and back (Node sink)",
        load: format!(
            "{} labels kept exact; caught up ≤ {worst:.1?} after the restart",
            expected(on_file()).len()
        ),
        faults: format!(
            "{} outages, each across a label change; {retries} failed writes, backed off",
            changes.len()
        ),
        lost,
    }
}
