//! Saved verdicts fail closed: `gpud run` with the simulated driver and the fake kubelet, a
//! fatal XID kept in `<state-dir>/health/run.json`, the file damaged while gpud is down as a
//! bad sector, an editor, a rollback or a full disk would damage it. A GPU with a fatal XID
//! before the restart is never offered `Healthy` after it until gpud has fresh evidence for it;
//! the damaged file is moved aside and said once; a write that fails is retried until it lands,
//! and `/readyz` names it meanwhile.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
#[path = "common/fake_api.rs"]
mod fake_api;
#[path = "common/fake_kubelet.rs"]
mod fake_kubelet;

use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use common::Node;
use common::http::{self, free_port};
use fake_api::FakeApi;
use fake_kubelet::{FakeKubelet, list_and_watch, next_list};
use gpud::proto::deviceplugin::ListAndWatchResponse;

/// The sick GPU of every case.
const SICK: usize = 2;

/// A running `gpud run`, killed on drop.
struct Daemon {
    child: Child,
    /// The exporter's, which serves `/readyz` too.
    port: u16,
    log: PathBuf,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Daemon {
    fn stop(&mut self) {
        common::send_signal(&self.child, "TERM");
        assert_eq!(self.child.wait().unwrap().code(), Some(0));
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// `gpud run` on `node`, its log (at `info`) in `<node>/<log>`.
fn start(node: &Node, kubelet: &FakeKubelet, log: &str) -> Daemon {
    start_with(node, kubelet, log, &[])
}

/// [`start`] with `extra` flags.
fn start_with(node: &Node, kubelet: &FakeKubelet, log: &str, extra: &[&str]) -> Daemon {
    let port = free_port();
    let socket = kubelet.socket();
    let address = format!("127.0.0.1:{port}");
    let features = node.dir.path().join("features.d-gfd");
    let log = node.dir.path().join(log);
    let child = node
        .gpud(&[
            "run",
            "--output-file",
            features.to_str().unwrap(),
            "--kubelet-socket",
            socket.to_str().unwrap(),
            "--kmsg",
            "",
            "--health-poll-interval",
            "50ms",
            "-a",
            &address,
        ])
        .args(extra)
        .env("GPUD_LOG", "info")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("start gpud run");
    Daemon { child, port, log }
}

fn kept_path(node: &Node) -> PathBuf {
    node.dir.path().join("state/health/run.json")
}

/// The devices a list does not offer as `Healthy`, by index in `ids`.
fn unhealthy(list: &ListAndWatchResponse, ids: &[String]) -> Vec<usize> {
    let mut sick: Vec<usize> = list
        .devices
        .iter()
        .filter(|d| d.health != "Healthy")
        .map(|d| ids.iter().position(|id| *id == d.id).unwrap())
        .collect();
    sick.sort_unstable();
    sick
}

/// Registers with the plugin and returns its ListAndWatch stream and first list.
async fn first_list(
    kubelet: &mut FakeKubelet,
) -> (tonic::Streaming<ListAndWatchResponse>, ListAndWatchResponse) {
    let reg = kubelet.next_registration(10).await;
    let mut client = kubelet.plugin(&reg.endpoint).await;
    let mut stream = list_and_watch(&mut client).await;
    let list = next_list(&mut stream, 10).await;
    (stream, list)
}

/// A node whose GPU [`SICK`] had XID 79 (with NVML asking for a reset, as the driver does) while
/// gpud ran, the verdict kept in the file; gpud stopped. Returns the GPUs' ids.
async fn node_with_a_kept_fatal_xid(node: &Node, kubelet: &mut FakeKubelet) -> Vec<String> {
    let mut daemon = start(node, kubelet, "first.log");
    let (mut stream, list) = first_list(kubelet).await;
    let ids: Vec<String> = list.devices.iter().map(|d| d.id.clone()).collect();
    assert_eq!(unhealthy(&list, &ids), Vec::<usize>::new());
    node.inject_all(&[
        format!("xid {SICK} 79"),
        format!("recovery-action {SICK} reset"),
    ]);
    while unhealthy(&next_list(&mut stream, 10).await, &ids) != [SICK] {}
    common::until("the XID kept in the file", 10, || {
        let text = std::fs::read_to_string(kept_path(node)).unwrap_or_default();
        if text.contains(&ids[SICK]) {
            Ok(())
        } else {
            Err(text)
        }
    });
    daemon.stop();
    ids
}

/// Follows the device lists until GPU [`SICK`] is offered `Healthy`, asserting it never is
/// before `reset` (the simulated GPU reset, which clears NVML's ask for one) was done; `reset`
/// runs once the other GPUs are back in service and the doctor's failed check of the sick GPU
/// was said. Returns the lists seen.
async fn sick_gpu_stays_out_until_reset(
    node: &Node,
    daemon: &Daemon,
    stream: &mut tonic::Streaming<ListAndWatchResponse>,
    first: ListAndWatchResponse,
    ids: &[String],
) -> Vec<Vec<usize>> {
    let mut seen = vec![unhealthy(&first, ids)];
    assert!(
        seen[0].contains(&SICK),
        "offered from the first list: {seen:?}"
    );
    let mut reset_done = false;
    let deadline = Instant::now() + Duration::from_secs(40);
    loop {
        let last = seen.last().unwrap().clone();
        if !last.contains(&SICK) {
            assert!(
                reset_done,
                "GPU {SICK} offered Healthy before fresh evidence: {seen:?}"
            );
            return seen;
        }
        if !reset_done && last == [SICK] && daemon.log().contains("stays out of service") {
            node.inject(&format!("reset {SICK}"));
            reset_done = true;
        }
        assert!(
            Instant::now() < deadline,
            "lists: {seen:?}\n{}",
            daemon.log()
        );
        if let Ok(Ok(Some(list))) =
            tokio::time::timeout(Duration::from_millis(200), stream.message()).await
        {
            seen.push(unhealthy(&list, ids));
        }
    }
}

/// The files in the health folder whose names start with `prefix`.
fn named(dir: &Path, prefix: &str) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with(prefix))
        .collect()
}

/// One damage: the file damaged while gpud is down makes every GPU held (Unhealthy) from the
/// first list until the doctor's checks of it pass, GPU [`SICK`] until it is reset; the file
/// is moved aside with the damaged bytes and said once, also across a further restart.
async fn damaged_file_fails_closed(damage: impl FnOnce(&[u8], &str) -> Vec<u8>) {
    let node = Node::new("dgx-h100");
    let mut kubelet = FakeKubelet::start(node.dir.path()).await;
    let ids = node_with_a_kept_fatal_xid(&node, &mut kubelet).await;
    let path = kept_path(&node);
    let damaged = damage(&std::fs::read(&path).unwrap(), &ids[SICK]);
    std::fs::write(&path, &damaged).unwrap();

    let mut daemon = start(&node, &kubelet, "second.log");
    let (mut stream, list) = first_list(&mut kubelet).await;
    let seen = sick_gpu_stays_out_until_reset(&node, &daemon, &mut stream, list, &ids).await;
    // Every GPU the file could have covered was held before the watcher was ready (the doctor
    // may clear the good ones before the kubelet's first list).
    let log = daemon.log();
    assert_eq!(
        log.matches("Holding the GPU out of service until the doctor's checks of it pass")
            .count(),
        ids.len(),
        "{log}"
    );
    // The others came back on the doctor's evidence, before the sick GPU did.
    assert!(seen.iter().any(|sick| sick == &[SICK]), "{seen:?}");

    let health = path.parent().unwrap();
    let aside = named(health, "run.json.damaged-");
    assert_eq!(aside.len(), 1, "{aside:?}");
    assert_eq!(std::fs::read(&aside[0]).unwrap(), damaged);
    assert_eq!(
        log.matches("The kept health verdicts cannot be read")
            .count(),
        1,
        "{log}"
    );
    assert!(log.contains(&aside[0].display().to_string()), "{log}");
    let port = daemon.port;
    let metrics = tokio::task::block_in_place(|| http::get(port, "/metrics").unwrap().body);
    assert!(
        metrics.contains("gpud_health_kept_verdicts_damaged_total 1"),
        "{metrics}"
    );
    daemon.stop();

    // Said once: a further restart finds nothing damaged, and the GPU, reset, stays in service.
    let daemon = start(&node, &kubelet, "third.log");
    let (_stream, list) = first_list(&mut kubelet).await;
    assert_eq!(unhealthy(&list, &ids), Vec::<usize>::new());
    assert!(!daemon.log().contains("cannot be read"), "{}", daemon.log());
    assert_eq!(named(health, "run.json.damaged-").len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_flipped_bit_holds_the_gpus() {
    // A bit of the sick GPU's UUID: read as it is, the verdict would belong to no GPU here.
    damaged_file_fails_closed(|bytes, uuid| {
        let text = String::from_utf8(bytes.to_vec()).unwrap();
        let at = text.find(uuid).unwrap() + uuid.len() - 1;
        let mut bytes = bytes.to_vec();
        bytes[at] ^= 0x01;
        bytes
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_truncated_file_holds_the_gpus() {
    damaged_file_fails_closed(|bytes, _| bytes[..bytes.len() / 2].to_vec()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_with_wrong_types_holds_the_gpus() {
    // The XID's code as a string: `"code": "79"`.
    damaged_file_fails_closed(|bytes, _| {
        let text = String::from_utf8(bytes.to_vec()).unwrap();
        let key = text.find("\"code\"").expect("an XID in the file") + "\"code\"".len();
        let start = key + text[key..].find(|c: char| c.is_ascii_digit()).unwrap();
        let end = start + text[start..].find(|c: char| !c.is_ascii_digit()).unwrap();
        format!(
            "{}\"{}\"{}",
            &text[..start],
            &text[start..end],
            &text[end..]
        )
        .into_bytes()
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_file_holds_the_gpus() {
    damaged_file_fails_closed(|_, _| Vec::new()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_garbage_file_holds_the_gpus() {
    damaged_file_fails_closed(|_, _| {
        (0u32..4096)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect()
    })
    .await;
}

/// With a Node to report on (`--node-status`), the damaged file is said once as a Warning
/// event on it too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_file_is_said_once_as_a_node_event() {
    let node = Node::new("dgx-h100");
    let api = FakeApi::start(serde_json::json!({}));
    let kubeconfig = api.kubeconfig(node.dir.path());
    let mut kubelet = FakeKubelet::start(node.dir.path()).await;
    let ids = node_with_a_kept_fatal_xid(&node, &mut kubelet).await;
    std::fs::write(kept_path(&node), b"").unwrap();

    let flags = [
        "--node-status",
        "--kubeconfig",
        kubeconfig.to_str().unwrap(),
    ];
    let _daemon = start_with(&node, &kubelet, "second.log", &flags);
    let (mut stream, _) = first_list(&mut kubelet).await;
    // The other GPUs back on the doctor's evidence: the damage was said by then.
    while unhealthy(&next_list(&mut stream, 20).await, &ids) != [SICK] {}
    let damaged = |events: &[serde_json::Value]| {
        events
            .iter()
            .filter(|e| e["reason"] == "KeptVerdictsDamaged")
            .cloned()
            .collect::<Vec<_>>()
    };
    let said = common::until("the Node event", 20, || {
        let said = damaged(&api.events());
        if said.is_empty() {
            Err(format!("{:#?}", api.events()))
        } else {
            Ok(said)
        }
    });
    assert_eq!(said.len(), 1, "{said:#?}");
    assert_eq!(said[0]["type"], "Warning");
    let message = said[0]["message"].as_str().unwrap();
    assert!(
        message.contains("run.json") && message.contains("the file is empty"),
        "{message}"
    );
}

/// CRC-32 (IEEE), as the file's `checksum` names it: what a newer gpud computes too.
fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = 0xFFFF_FFFF_u32;
    for &byte in bytes {
        crc ^= u32::from(byte);
        for _ in 0..8 {
            crc = (crc >> 1) ^ (0xEDB8_8320 & (crc & 1).wrapping_neg());
        }
    }
    !crc
}

/// A newer gpud's file (what a rollback reads): `"version": 99`, fields this gpud does not
/// know at every level, its checksum right. The fatal XID it understands is kept: GPU [`SICK`]
/// is withdrawn from the first list on, the others are offered at once, nothing is moved aside.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newer_versions_file_keeps_the_fatal_xids_it_understands() {
    let node = Node::new("dgx-h100");
    let mut kubelet = FakeKubelet::start(node.dir.path()).await;
    let ids = node_with_a_kept_fatal_xid(&node, &mut kubelet).await;
    let path = kept_path(&node);
    let boot_id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
    let at = serde_json::json!({"secs_since_epoch": 1_800_000_000u64, "nanos_since_epoch": 0});
    let verdicts = serde_json::json!({
        "boot_id": boot_id.trim(),
        "placement": {"zone": "b"},
        "gpus": {&ids[SICK]: {
            "xids": [{"code": 79, "mig": null, "since": at, "last_seen": at,
                      "occurrences": 1, "driver": "575.51"}],
            "reset_marks": null,
            "quarantine": {"until": "reset"},
        }},
    });
    let inner = verdicts.to_string();
    let newer = format!(
        "{{\"version\": 99, \"generation\": 40, \"written_by\": \"gpud 9.9\", \"checksum\": \"crc32:{:08x}\", \"verdicts\": {inner}}}",
        crc32(inner.as_bytes())
    );
    std::fs::write(&path, newer).unwrap();

    let daemon = start(&node, &kubelet, "second.log");
    let (mut stream, list) = first_list(&mut kubelet).await;
    assert_eq!(unhealthy(&list, &ids), [SICK]);
    // Still withdrawn a while later (not a hold that evidence ends).
    let until = Instant::now() + Duration::from_secs(2);
    while Instant::now() < until {
        if let Ok(Ok(Some(list))) =
            tokio::time::timeout(Duration::from_millis(200), stream.message()).await
        {
            assert_eq!(unhealthy(&list, &ids), [SICK]);
        }
    }
    let log = daemon.log();
    assert!(log.contains("written by a newer gpud"), "{log}");
    assert!(!log.contains("cannot be read"), "{log}");
    assert!(named(path.parent().unwrap(), "run.json.damaged-").is_empty());
}

/// `/readyz` once `accept` holds (blocking HTTP on a worker thread); the test fails with the
/// last answer after 20 s.
fn readyz_when(port: u16, accept: impl Fn(&http::Answer) -> bool) -> http::Answer {
    tokio::task::block_in_place(|| {
        common::until("the /readyz answer", 20, || {
            match http::get(port, "/readyz") {
                Ok(answer) if accept(&answer) => Ok(answer),
                Ok(answer) => Err(format!("{} {}", answer.status, answer.body)),
                Err(err) => Err(err.to_string()),
            }
        })
    })
}

/// A write that fails (the health folder replaced by a file, as a full or broken disk refuses
/// it) is tried again: `/readyz` is 503 naming the file and the error meanwhile, and the write
/// lands once the folder can be written again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_write_is_retried_until_it_lands_and_readyz_names_it() {
    let node = Node::new("dgx-h100");
    let mut kubelet = FakeKubelet::start(node.dir.path()).await;
    let daemon = start(&node, &kubelet, "run.log");
    let (mut stream, list) = first_list(&mut kubelet).await;
    let ids: Vec<String> = list.devices.iter().map(|d| d.id.clone()).collect();
    readyz_when(daemon.port, |a| a.status == 200);
    let health = node.dir.path().join("state/health");
    std::fs::remove_dir_all(&health).unwrap();
    std::fs::write(&health, "in the way").unwrap();

    node.inject(&format!("xid {SICK} 79"));
    while unhealthy(&next_list(&mut stream, 10).await, &ids) != [SICK] {}
    let refused = readyz_when(daemon.port, |a| a.status == 503);
    assert!(
        refused.body.contains("cannot keep the health verdicts")
            && refused.body.contains(&health.display().to_string()),
        "{}",
        refused.body
    );

    std::fs::remove_file(&health).unwrap();
    readyz_when(daemon.port, |a| a.status == 200);
    let kept = std::fs::read_to_string(health.join("run.json")).unwrap();
    assert!(kept.contains(&ids[SICK]), "{kept}");
    assert_eq!(
        daemon
            .log()
            .matches("Cannot keep the health verdicts")
            .count(),
        1,
        "said once per failing streak: {}",
        daemon.log()
    );
}

/// A full disk (a 64 KiB tmpfs as the state directory, 0700 as gpud requires, filled): the write fails with ENOSPC,
/// `/readyz` names it, and it lands once space is back. Needs root to mount; skipped without
/// it, except in CI.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_is_retried_until_space_is_back() {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let root = status
        .lines()
        .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(2) == Some("0"));
    if common::tool_missing(
        !root,
        "the full-disk case needs root (mount -t tmpfs)",
        "skipped: the full-disk case needs root",
    ) {
        return;
    }
    let node = Node::new("dgx-h100");
    let state = node.dir.path().join("state");
    std::fs::create_dir_all(&state).unwrap();
    let mounted = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=64k,mode=0700", "tmpfs"])
        .arg(&state)
        .status()
        .unwrap();
    assert!(mounted.success(), "mount tmpfs on {}", state.display());
    let _unmount = Unmount(state.clone());

    let mut kubelet = FakeKubelet::start(node.dir.path()).await;
    let daemon = start(&node, &kubelet, "run.log");
    let (mut stream, list) = first_list(&mut kubelet).await;
    let ids: Vec<String> = list.devices.iter().map(|d| d.id.clone()).collect();
    readyz_when(daemon.port, |a| a.status == 200);
    // Fill the filesystem: writes until it refuses.
    let filler = state.join("filler");
    {
        use std::io::Write;
        let mut file = std::fs::File::create(&filler).unwrap();
        while file.write_all(&[0u8; 4096]).is_ok() {}
        let _ = file.sync_all();
    }

    node.inject(&format!("xid {SICK} 79"));
    while unhealthy(&next_list(&mut stream, 10).await, &ids) != [SICK] {}
    let refused = readyz_when(daemon.port, |a| a.status == 503);
    assert!(
        refused.body.contains("run.json") && refused.body.contains("No space left on device"),
        "{}",
        refused.body
    );

    std::fs::remove_file(&filler).unwrap();
    readyz_when(daemon.port, |a| a.status == 200);
    let kept = std::fs::read_to_string(state.join("health/run.json")).unwrap();
    assert!(kept.contains(&ids[SICK]), "{kept}");
    drop(daemon);
}

/// Unmounts the tmpfs when the test ends, passed or not.
struct Unmount(PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}
