//! Upgrades without a gap, end to end: a second `gpud run` on the simulated node takes over
//! from the running one — the metrics port, the device plugin (under a socket of its own that
//! the kubelet switches to), the XID counts — while a scraper and a kubelet keep calling; and
//! the ways a takeover fails: a hung or vanishing old process, one that speaks another
//! version, a second newcomer, a stranger on the socket, a state folder that cannot be written;
//! a newcomer killed at each step of its takeover (the old one serves the kubelet again within
//! a second), and a state directory another user could write to, refused at start.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
#[path = "common/fake_kubelet.rs"]
mod fake_kubelet;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::http::{self, Scraper, free_port};
use common::{Node, file_when};
use fake_kubelet::{FakeKubelet, list_and_watch, next_list};

/// A `gpud run` with its log in a file.
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

impl Gpud {
    fn start(node: &Node, kubelet: &FakeKubelet, port: u16, name: &str) -> Gpud {
        Gpud::start_with(node, kubelet, port, name, |_| {})
    }

    fn start_with(
        node: &Node,
        kubelet: &FakeKubelet,
        port: u16,
        name: &str,
        adjust: impl FnOnce(&mut Command),
    ) -> Gpud {
        let mut command = Command::new(common::gpud_bin());
        command.args(run_args(node, kubelet, port));
        node.wire(&mut command);
        adjust(&mut command);
        Gpud::spawn(command, node.dir.path().join(format!("{name}.log")))
    }

    fn spawn(mut command: Command, log: PathBuf) -> Gpud {
        command
            .env("GPUD_LOG", "info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap());
        Gpud {
            child: command.spawn().expect("start gpud run"),
            log,
        }
    }

    fn log_when(&self, needle: &str, secs: u64) -> String {
        file_when(&self.log, needle, secs)
    }

    fn stop(&mut self) -> Option<i32> {
        common::send_signal(&self.child, "TERM");
        self.child.wait().unwrap().code()
    }

    fn exit_within(&mut self, secs: u64) -> Option<i32> {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.code();
            }
            assert!(
                Instant::now() < deadline,
                "still running after {secs} s:\n{}",
                std::fs::read_to_string(&self.log).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// `gpud run`'s arguments on the simulated node.
fn run_args(node: &Node, kubelet: &FakeKubelet, port: u16) -> Vec<String> {
    [
        "run",
        "--kubelet-socket",
        kubelet.socket().to_str().unwrap(),
        "--output-file",
        node.dir.path().join("features").to_str().unwrap(),
        "--kmsg",
        "",
        "--health-poll-interval",
        "50ms",
        "-a",
        &format!("127.0.0.1:{port}"),
        "-c",
        "100",
    ]
    .map(str::to_owned)
    .to_vec()
}

fn unhealthy(list: &gpud::proto::deviceplugin::ListAndWatchResponse) -> Vec<String> {
    let mut sick: Vec<String> = list
        .devices
        .iter()
        .filter(|d| d.health != "Healthy")
        .map(|d| d.id.clone())
        .collect();
    sick.sort();
    sick
}

/// The value of the one `gpud_xid_errors_total` line for XID 79 once there is one.
fn xid_79_total(port: u16, at_least: u64) -> u64 {
    let answer = tokio::task::block_in_place(|| {
        http::wait_for(port, "/metrics", 10, |a| {
            xid_79(&a.body).is_some_and(|n| n >= at_least)
        })
    });
    xid_79(&answer.body).unwrap()
}

fn xid_79(body: &str) -> Option<u64> {
    body.lines()
        .find(|l| l.starts_with("gpud_xid_errors_total{") && l.contains("xid=\"79\""))
        .and_then(|l| l.rsplit_once(' '))
        .and_then(|(_, n)| n.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_gpud_takes_over_the_port_the_kubelet_and_the_counts_without_a_gap() {
    let node = Node::new("dgx-h100");
    let mut kubelet = FakeKubelet::start(node.dir.path()).await;
    let port = free_port();
    let mut old = Gpud::start(&node, &kubelet, port, "old");
    let first = kubelet.next_registration(10).await;
    assert_eq!(first.endpoint, "nvidia-gpu.sock");
    let mut client = kubelet.plugin(&first.endpoint).await;
    let mut old_stream = list_and_watch(&mut client).await;
    let list = next_list(&mut old_stream, 5).await;
    let ids: Vec<String> = list.devices.iter().map(|d| d.id.clone()).collect();
    assert_eq!(ids.len(), 8);
    node.inject("xid 2 79");
    while unhealthy(&next_list(&mut old_stream, 5).await) != [ids[2].clone()] {}
    assert_eq!(xid_79_total(port, 1), 1);
    old.log_when("All subsystems ready", 10);

    let scraper = Scraper::start(port);
    let started = Instant::now();
    let new = Gpud::start(&node, &kubelet, port, "new");
    let second = kubelet.next_registration(15).await;
    assert_eq!(second.resource_name, "nvidia.com/gpu");
    assert!(
        second.endpoint.starts_with("nvidia-gpu-") && second.endpoint != first.endpoint,
        "the new process registers under a socket of its own: {}",
        second.endpoint
    );
    let mut client = kubelet.plugin(&second.endpoint).await;
    let mut new_stream = list_and_watch(&mut client).await;
    let list = next_list(&mut new_stream, 5).await;
    assert_eq!(
        list.devices
            .iter()
            .map(|d| d.id.clone())
            .collect::<Vec<_>>(),
        ids,
        "every device listed"
    );
    assert_eq!(
        unhealthy(&list),
        [ids[2].clone()],
        "GPU 2 stays withdrawn; no healthy device is withdrawn"
    );
    // An XID during the takeover is counted once, on top of the count taken over.
    node.inject("xid 2 79");
    let text = new.log_when("Took over: the gpud taken over from has finished", 20);
    assert!(text.contains("Taking over from the running gpud"), "{text}");
    old.log_when("Handed over to the new gpud; waiting to be stopped", 10);
    let took = started.elapsed();
    assert_eq!(xid_79_total(port, 2), 2, "monotone and exact");
    let report = scraper.finish();
    assert!(
        report.failed.is_empty(),
        "failed scrapes during the takeover: {:?}",
        report.failed
    );
    assert!(report.answered > 0);
    eprintln!(
        "takeover: {} ms, {} scrapes answered, longest gap {} ms",
        took.as_millis(),
        report.answered,
        report.longest_gap.as_millis()
    );

    // The old process removed its own socket and left the new one's.
    assert_eq!(old.stop(), Some(0));
    assert!(!kubelet.dir.join(&first.endpoint).exists());
    assert!(kubelet.dir.join(&second.endpoint).exists());
    assert!(node.dir.path().join("features").exists(), "labels kept");
    // The new one still serves, and is the one to take over from next.
    http::get(port, "/metrics").expect("still serving");
    assert!(node.dir.path().join("state/handover/run.sock").exists());
    drop(new);
}

/// A stand-in for an old gpud on the handover socket, in a process of its own (the new gpud
/// stops an old one that cannot hand over): it reads the hello, then `behaviour` — `close`
/// (killed mid-handover), `hang`, or `refuse` (speaks another version).
fn fake_old(socket: &Path, behaviour: &str) -> Child {
    std::fs::create_dir_all(socket.parent().unwrap()).unwrap();
    let script = r#"
import socket, struct, sys, time, os
path, behaviour, ready = sys.argv[1], sys.argv[2], sys.argv[3]
server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
server.bind(path)
server.listen(1)
open(ready, "w").close()
conn, _ = server.accept()
length = struct.unpack(">I", conn.recv(4))[0]
conn.recv(length)
if behaviour == "close":
    sys.exit(0)
if behaviour == "refuse":
    body = b'{"type":"refused","reason":"this gpud speaks handover versions [9]","busy":false}'
    conn.sendall(struct.pack(">I", len(body)) + body)
time.sleep(600)
"#;
    let ready = socket.with_extension("ready");
    let child = Command::new("python3")
        .args(["-c", script])
        .arg(socket)
        .arg(behaviour)
        .arg(&ready)
        .spawn()
        .expect("python3 for the fake old gpud");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !ready.exists() {
        assert!(Instant::now() < deadline, "the fake old gpud did not start");
        std::thread::sleep(Duration::from_millis(10));
    }
    child
}

fn handover_socket(node: &Node) -> PathBuf {
    node.dir.path().join("state/handover/run.sock")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_old_gpud_that_fails_the_handover_is_stopped_and_the_new_one_starts_cold() {
    for (behaviour, says) in [
        ("close", "went away during the handover"),
        ("hang", "no answer within the deadline"),
        ("refuse", "speaks handover versions [9]"),
    ] {
        let node = Node::new("dgx-h100");
        let mut kubelet = FakeKubelet::start(node.dir.path()).await;
        let mut old = fake_old(&handover_socket(&node), behaviour);
        let started = Instant::now();
        let mut new = Gpud::start(&node, &kubelet, free_port(), "new");
        let registration = kubelet.next_registration(20).await;
        assert_eq!(
            registration.endpoint, "nvidia-gpu.sock",
            "{behaviour}: a cold start keeps the usual name"
        );
        let text = new.log_when("Serving after a cold start", 20);
        assert!(text.contains(says), "{behaviour}: {text}");
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "{behaviour}: {:?}",
            started.elapsed()
        );
        // The old one is gone: exited by itself, or stopped by the new one.
        let status = tokio::task::block_in_place(|| old.wait()).unwrap();
        if behaviour != "close" {
            assert!(
                !status.success(),
                "{behaviour}: stopped by a signal: {status}"
            );
        }
        assert_eq!(new.stop(), Some(0));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strangers_and_a_second_newcomer_are_refused_and_the_old_gpud_keeps_serving() {
    use std::io::{Read, Write};
    let node = Node::new("dgx-h100");
    let mut kubelet = FakeKubelet::start(node.dir.path()).await;
    let port = free_port();
    let old = Gpud::start(&node, &kubelet, port, "old");
    kubelet.next_registration(10).await;
    old.log_when("All subsystems ready", 10);
    let socket = handover_socket(&node);

    // Garbage: refused, logged, nothing else happens.
    let mut stranger = std::os::unix::net::UnixStream::connect(&socket).unwrap();
    stranger.write_all(b"\x00\x00\x00\x05hello").unwrap();
    let mut rest = Vec::new();
    stranger.read_to_end(&mut rest).unwrap();
    assert!(rest.is_empty());
    old.log_when("Refused a connection on the handover socket", 10);

    // A newcomer that takes the offer and never says stop (it was killed mid-handover, or is
    // slow): while it holds the offer, a second newcomer is refused and exits.
    let mut first = std::os::unix::net::UnixStream::connect(&socket).unwrap();
    let hello = br#"{"type":"hello","versions":[1],"pid":1,"netns":null}"#;
    first
        .write_all(&(hello.len() as u32).to_be_bytes())
        .unwrap();
    first.write_all(hello).unwrap();
    let mut length = [0u8; 4];
    first.read_exact(&mut length).unwrap();
    let mut offer = vec![0u8; u32::from_be_bytes(length) as usize];
    first.read_exact(&mut offer).unwrap();
    let offer: serde_json::Value = serde_json::from_slice(&offer).unwrap();
    assert_eq!(offer["type"], "offer", "{offer}");
    assert_eq!(offer["version"], 1);
    assert!(offer["state"].get("xid-ledger").is_some(), "{offer}");
    // No network namespace given: the TCP port is not handed to it.
    assert!(
        !offer["sockets"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s.as_str().unwrap().starts_with("tcp:")),
        "{offer}"
    );

    let mut second = Gpud::start(&node, &kubelet, free_port(), "second");
    assert_eq!(second.exit_within(15), Some(69));
    let text = std::fs::read_to_string(&second.log).unwrap();
    assert!(
        text.contains("is handing over to another new gpud already"),
        "{text}"
    );

    // The first newcomer goes away: the old one serves on, and registers anew (the kubelet
    // may have switched to the newcomer's socket).
    drop(first);
    assert_eq!(
        kubelet.next_registration(5).await.endpoint,
        "nvidia-gpu.sock",
        "the old gpud registered anew"
    );
    old.log_when("The takeover was abandoned; serving again in full", 10);
    http::get(port, "/metrics").expect("the old gpud still serves");
}

/// The first device list the plugin at `endpoint` sends, as the kubelet asks for it; fails
/// after 5 s (a socket nobody answers on must not hang the test).
async fn served_list(
    kubelet: &FakeKubelet,
    endpoint: &str,
) -> gpud::proto::deviceplugin::ListAndWatchResponse {
    tokio::time::timeout(Duration::from_secs(5), async {
        let mut client = kubelet.plugin(endpoint).await;
        let mut stream = list_and_watch(&mut client).await;
        next_list(&mut stream, 5).await
    })
    .await
    .unwrap_or_else(|_| panic!("{endpoint} sent no device list within 5 s"))
}

/// Whether `message` is among the messages on the notification socket since the last look.
fn notified(socket: &std::os::unix::net::UnixDatagram, message: &str) -> Result<(), String> {
    let mut seen = Vec::new();
    let mut buf = [0u8; 256];
    while let Ok(n) = socket.recv(&mut buf) {
        seen.push(String::from_utf8_lossy(&buf[..n]).into_owned());
    }
    if seen.iter().any(|m| m == message) {
        Ok(())
    } else {
        Err(format!("seen {seen:?}"))
    }
}

/// The value of the machine label in the features file.
fn machine_label(features: &Path) -> Option<String> {
    std::fs::read_to_string(features)
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("nvidia.com/gpu.machine="))
        .map(str::to_owned)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newcomer_killed_at_any_step_of_its_takeover_leaves_the_old_gpud_serving_the_kubelet_within_a_second()
 {
    for step in ["connected", "hello-sent", "offer-received", "before-stop"] {
        let node = Node::new("dgx-h100");
        let mut kubelet = FakeKubelet::start(node.dir.path()).await;
        let port = free_port();
        // systemd's notification socket: both processes are of one unit.
        let notify_path = node.dir.path().join("notify");
        let notify = std::os::unix::net::UnixDatagram::bind(&notify_path).unwrap();
        notify
            .set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        let old = Gpud::start_with(&node, &kubelet, port, "old", |c| {
            c.env("NOTIFY_SOCKET", &notify_path);
        });
        let first = kubelet.next_registration(10).await;
        assert_eq!(first.endpoint, "nvidia-gpu.sock");
        old.log_when("All subsystems ready", 10);
        let features = node.dir.path().join("features");
        let own_machine = machine_label(&features).expect("the old gpud's machine label");

        // The newcomer labels the node differently, so that its labels are told apart.
        let other_machine = node.dir.path().join("newcomer_product_name");
        std::fs::write(&other_machine, "Newcomer Box\n").unwrap();
        let mut new = Gpud::start_with(&node, &kubelet, port, &format!("new-{step}"), |c| {
            c.env("GPUD_TEST_HANDOVER_PAUSE", step)
                .env("GFD_MACHINE_TYPE_FILE", &other_machine)
                .env("NOTIFY_SOCKET", &notify_path);
        });
        new.log_when(&format!("Paused at handover step {step}"), 20);
        if step == "before-stop" {
            // The case of the report: the kubelet switched to the newcomer's socket and the
            // labels are the newcomer's when it dies.
            let switched = kubelet.next_registration(15).await;
            assert!(
                switched.endpoint.starts_with("nvidia-gpu-"),
                "{}",
                switched.endpoint
            );
            let new_main = format!("MAINPID={}", new.child.id());
            common::until("the newcomer's MAINPID", 10, || {
                notified(&notify, &new_main)
            });
            common::until("the newcomer's labels", 10, || {
                match machine_label(&features) {
                    Some(m) if m.starts_with("Newcomer") => Ok(()),
                    other => Err(format!("{other:?}")),
                }
            });
        }
        new.child.kill().unwrap();
        let killed = Instant::now();
        new.child.wait().unwrap();

        let (arrived, again) =
            tokio::time::timeout(Duration::from_secs(5), kubelet.next_registration_at(10))
                .await
                .unwrap_or_else(|_| panic!("{step}: the old gpud never registered again"));
        assert_eq!(
            again.endpoint, first.endpoint,
            "{step}: the old gpud registers its own socket anew"
        );
        let took = arrived.saturating_duration_since(killed);
        assert!(
            took < Duration::from_secs(1),
            "{step}: registered {took:?} after the kill"
        );
        eprintln!(
            "{step}: registered again {} ms after the kill",
            took.as_millis()
        );
        let list = served_list(&kubelet, &again.endpoint).await;
        assert_eq!(list.devices.len(), 8, "{step}");
        assert!(unhealthy(&list).is_empty(), "{step}: {list:?}");
        assert!(
            killed.elapsed() < Duration::from_secs(2),
            "{step}: every GPU healthy to the kubelet {:?} after the kill",
            killed.elapsed()
        );
        common::until(
            &format!("{step}: the old gpud's labels again"),
            2,
            || match machine_label(&features) {
                Some(m) if m == own_machine => Ok(()),
                other => Err(format!("{other:?}")),
            },
        );
        // systemd learns that the old process is the main one again.
        let old_main = format!("MAINPID={}", old.child.id());
        common::until(&format!("{step}: {old_main}"), 2, || {
            notified(&notify, &old_main)
        });
        let text = old.log_when("serving again in full", 5);
        assert!(!text.contains("Handed over"), "{step}: {text}");
        http::get(port, "/metrics").expect("the old gpud still serves its port");
    }
}

/// `gpud run` on `node` with the state directory `state`, which must refuse to start; its
/// error output.
fn refused_start(node: &Node, kubelet: &FakeKubelet, state: &Path, name: &str) -> String {
    let mut gpud = Gpud::start_with(node, kubelet, free_port(), name, |command| {
        command.env("GPUD_STATE_DIR", state);
    });
    let code = gpud.exit_within(30);
    let text = std::fs::read_to_string(&gpud.log).unwrap();
    assert_eq!(code, Some(65), "{name}: {text}");
    text
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_state_directory_another_user_could_write_or_a_symlink_in_it_is_refused_at_start() {
    use std::os::unix::fs::PermissionsExt;
    let chmod = |path: &Path, mode: u32| {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap()
    };
    let node = Node::new("dgx-h100");
    let kubelet = FakeKubelet::start(node.dir.path()).await;

    let state = node.dir.path().join("world-writable");
    std::fs::create_dir(&state).unwrap();
    chmod(&state, 0o777);
    let text = refused_start(&node, &kubelet, &state, "world-writable");
    assert!(
        text.contains(&format!("{} has mode 0777", state.display())) && text.contains("chmod 0700"),
        "{text}"
    );
    assert!(!state.join("handover").exists(), "nothing made in it");

    let state = node.dir.path().join("foreign");
    std::fs::create_dir(&state).unwrap();
    chmod(&state, 0o700);
    std::os::unix::fs::chown(&state, Some(65534), None).unwrap();
    let text = refused_start(&node, &kubelet, &state, "foreign");
    assert!(
        text.contains(&format!("{} is owned by uid 65534", state.display()))
            && text.contains("chown 0"),
        "{text}"
    );

    let state = node.dir.path().join("open-handover");
    std::fs::create_dir_all(state.join("handover")).unwrap();
    chmod(&state.join("handover"), 0o777);
    let text = refused_start(&node, &kubelet, &state, "open-handover");
    assert!(
        text.contains(&format!(
            "the handover folder {}",
            state.join("handover").display()
        )) && text.contains("mode 0777"),
        "{text}"
    );

    // A symlinked handover folder: refused, and nothing is bound where it points.
    let state = node.dir.path().join("linked-handover");
    let elsewhere = node.dir.path().join("elsewhere");
    std::fs::create_dir_all(&state).unwrap();
    std::fs::create_dir_all(&elsewhere).unwrap();
    chmod(&elsewhere, 0o700);
    std::os::unix::fs::symlink(&elsewhere, state.join("handover")).unwrap();
    let text = refused_start(&node, &kubelet, &state, "linked-handover");
    assert!(
        text.contains(&format!(
            "the handover folder {} is a symlink",
            state.join("handover").display()
        )),
        "{text}"
    );
    assert_eq!(
        std::fs::read_dir(&elsewhere).unwrap().count(),
        0,
        "nothing followed the link"
    );

    // A symlinked socket: refused, and its target is left alone.
    let state = node.dir.path().join("linked-socket");
    std::fs::create_dir_all(state.join("handover")).unwrap();
    chmod(&state.join("handover"), 0o700);
    let target = node.dir.path().join("target-file");
    std::fs::write(&target, "kept").unwrap();
    std::os::unix::fs::symlink(&target, state.join("handover/run.sock")).unwrap();
    let text = refused_start(&node, &kubelet, &state, "linked-socket");
    assert!(text.contains("is a symlink"), "{text}");
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "kept");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_state_folder_that_cannot_be_written_costs_the_handover_not_the_start() {
    let node = Node::new("dgx-h100");
    let mut kubelet = FakeKubelet::start(node.dir.path()).await;
    let blocker = node.dir.path().join("not-a-folder");
    std::fs::write(&blocker, "a file where the state folder should be").unwrap();
    let port = free_port();
    let gpud = Gpud::start_with(&node, &kubelet, port, "gpud", |command| {
        command.env("GPUD_STATE_DIR", blocker.join("state"));
    });
    assert_eq!(
        kubelet.next_registration(10).await.endpoint,
        "nvidia-gpu.sock"
    );
    // The kept health verdicts cannot be written either: the watcher is not ready (it says
    // so on /readyz) and the handover socket is tried once the wait for readiness ends.
    gpud.log_when("Cannot serve the handover socket", 45);
    http::wait_for(port, "/metrics", 10, |a| a.status == 200);
    let readyz = http::wait_for(port, "/readyz", 10, |a| a.status == 503);
    assert!(
        readyz.body.contains("cannot keep the health verdicts"),
        "{}",
        readyz.body
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gpud_upgrade_starts_the_installed_binary_which_takes_over() {
    let node = Node::new("dgx-h100");
    let mut kubelet = FakeKubelet::start(node.dir.path()).await;
    // The binary at its installed path, replaced there before the upgrade (by rename, as
    // package managers do).
    let bin = node.dir.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let installed = bin.join("gpud");
    std::fs::copy(common::gpud_bin(), &installed).unwrap();
    let port = free_port();
    let mut command = Command::new(&installed);
    command.args(run_args(&node, &kubelet, port));
    node.wire(&mut command);
    let mut old = Gpud::spawn(command, node.dir.path().join("old.log"));
    kubelet.next_registration(10).await;
    old.log_when("All subsystems ready", 10);
    let staged = bin.join("gpud.new");
    std::fs::copy(common::gpud_bin(), &staged).unwrap();
    std::fs::rename(&staged, &installed).unwrap();

    let output = node
        .gpud(&["upgrade", "--timeout", "30s"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.contains("took over from gpud"), "{stdout}");
    let new_pid: i32 = stdout
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap();
    let _new = KillOnDrop(new_pid);
    // The old process started the new one itself, so it exits rather than wait.
    assert_eq!(old.exit_within(10), Some(0));
    let registration = kubelet.next_registration(10).await;
    assert!(
        registration.endpoint.starts_with("nvidia-gpu-"),
        "{}",
        registration.endpoint
    );
    http::get(port, "/metrics").expect("the new gpud serves the port");
}

/// Stops a process this test did not start itself (the one `gpud upgrade` had started).
struct KillOnDrop(i32);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.0.to_string()])
            .status();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_gpud_is_killed_and_the_new_one_serves_its_port_cold() {
    let node = Node::new("dgx-h100");
    let mut kubelet = FakeKubelet::start(node.dir.path()).await;
    let port = free_port();
    let mut old = Gpud::start(&node, &kubelet, port, "old");
    kubelet.next_registration(10).await;
    old.log_when("All subsystems ready", 10);
    // Stopped: it holds its sockets and answers nothing, as a process stuck in the driver.
    common::send_signal(&old.child, "STOP");
    let started = Instant::now();
    let new = Gpud::start(&node, &kubelet, port, "new");
    let text = new.log_when("Serving after a cold start", 20);
    assert!(text.contains("no answer within the deadline"), "{text}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(
        kubelet.next_registration(10).await.endpoint,
        "nvidia-gpu.sock"
    );
    let status = tokio::task::block_in_place(|| old.child.wait()).unwrap();
    assert!(!status.success(), "killed: {status}");
    http::wait_for(port, "/metrics", 10, |a| a.status == 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_socket_replaced_before_an_abandoned_takeover_is_served_again() {
    let node = Node::new("dgx-h100");
    let mut kubelet = FakeKubelet::start(node.dir.path()).await;
    let port = free_port();
    let old = Gpud::start(&node, &kubelet, port, "old");
    let first = kubelet.next_registration(10).await;
    old.log_when("All subsystems ready", 10);
    let mut new = Gpud::start_with(&node, &kubelet, port, "new", |c| {
        c.env("GPUD_TEST_HANDOVER_PAUSE", "before-stop");
    });
    new.log_when("Paused at handover step before-stop", 20);
    assert_ne!(kubelet.next_registration(15).await.endpoint, first.endpoint);
    // The old process's socket file replaced by one nobody answers on (renamed over it, as a
    // newcomer binding the name itself would leave it): registering it anew would hand the
    // kubelet a socket that lists nothing.
    let socket = kubelet.dir.join(&first.endpoint);
    let staged = kubelet.dir.join("nvidia-gpu.sock.staged");
    let _silent = std::os::unix::net::UnixListener::bind(&staged).unwrap();
    std::fs::rename(&staged, &socket).unwrap();
    new.child.kill().unwrap();
    let killed = Instant::now();
    new.child.wait().unwrap();

    let again = kubelet.next_registration(5).await;
    assert_eq!(again.endpoint, first.endpoint);
    let list = served_list(&kubelet, &again.endpoint).await;
    assert_eq!(list.devices.len(), 8);
    assert!(unhealthy(&list).is_empty(), "{list:?}");
    assert!(
        killed.elapsed() < Duration::from_secs(2),
        "served again {:?} after the kill",
        killed.elapsed()
    );
    old.log_when("not the one this process bound", 5);
}

/// `gpud upgrade`'s exit code and stderr.
fn upgrade(node: &Node, args: &[&str]) -> (Option<i32>, String) {
    let mut all = vec!["upgrade"];
    all.extend_from_slice(args);
    let output = node.gpud(&all).output().unwrap();
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn gpud_upgrade_with_no_gpud_running_says_so_and_exits_69() {
    let node = Node::new("dgx-h100");
    let (code, stderr) = upgrade(&node, &["--timeout", "5s"]);
    let socket = node.dir.path().join("state/handover/run.sock");
    assert_eq!(code, Some(69), "{stderr}");
    assert!(
        stderr.contains(&format!("no running gpud answers on {}", socket.display()))
            && stderr.contains("is it running, with this --state-dir?"),
        "{stderr}"
    );
    let (code, stderr) = upgrade(&node, &["--state-dir", ""]);
    assert_eq!(code, Some(64), "{stderr}");
    assert!(stderr.contains("--state-dir is empty"), "{stderr}");
}

/// A `gpud run` started from a copy of the binary at `installed`, with `env` more.
async fn installed_gpud(
    node: &Node,
    kubelet: &mut FakeKubelet,
    installed: &Path,
    port: u16,
    env: &[(&str, &str)],
) -> Gpud {
    std::fs::create_dir_all(installed.parent().unwrap()).unwrap();
    std::fs::copy(common::gpud_bin(), installed).unwrap();
    let mut command = Command::new(installed);
    command.args(run_args(node, kubelet, port));
    node.wire(&mut command);
    command.envs(env.iter().copied());
    let old = Gpud::spawn(command, node.dir.path().join("old.log"));
    kubelet.next_registration(10).await;
    old.log_when("All subsystems ready", 10);
    old
}

/// Replaces the installed binary by rename, as package managers do.
fn install(installed: &Path, contents: &[u8]) {
    use std::os::unix::fs::PermissionsExt;
    let staged = installed.with_extension("new");
    std::fs::write(&staged, contents).unwrap();
    std::fs::set_permissions(&staged, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::rename(&staged, installed).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gpud_upgrade_to_a_binary_that_fails_to_start_leaves_the_running_gpud_serving() {
    let node = Node::new("dgx-h100");
    let mut kubelet = FakeKubelet::start(node.dir.path()).await;
    let installed = node.dir.path().join("bin/gpud");
    let port = free_port();
    let mut old = installed_gpud(&node, &mut kubelet, &installed, port, &[]).await;
    let old_pid = old.child.id();
    // A new binary that cannot run: it exits at once.
    install(&installed, b"#!/bin/sh\necho 'broken build' >&2\nexit 3\n");

    let started = Instant::now();
    let (code, stderr) = tokio::task::block_in_place(|| upgrade(&node, &["--timeout", "30s"]));
    assert_eq!(code, Some(69), "{stderr}");
    assert!(
        stderr.contains("exited before it took over")
            && stderr.contains(&format!("the running gpud (pid {old_pid}) keeps serving")),
        "{stderr}"
    );
    // Seen at once, not after --timeout.
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    assert!(
        old.child.try_wait().unwrap().is_none(),
        "the running gpud exited"
    );
    old.log_when(
        "The gpud started to take over exited; this one keeps serving",
        10,
    );
    http::get(port, "/metrics").expect("the running gpud still serves its port");
    assert_eq!(old.stop(), Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gpud_upgrade_stops_a_newcomer_that_never_takes_over_and_the_running_gpud_serves_on() {
    let node = Node::new("dgx-h100");
    let mut kubelet = FakeKubelet::start(node.dir.path()).await;
    let installed = node.dir.path().join("bin/gpud");
    let port = free_port();
    // The newcomer inherits the running gpud's environment: it stops at its last step, with
    // every subsystem serving, and never tells the old one to stop.
    let pause = [("GPUD_TEST_HANDOVER_PAUSE", "before-stop")];
    let mut old = installed_gpud(&node, &mut kubelet, &installed, port, &pause).await;
    let old_pid = old.child.id();
    install(&installed, &std::fs::read(common::gpud_bin()).unwrap());

    let (code, stderr) = tokio::task::block_in_place(|| upgrade(&node, &["--timeout", "10s"]));
    assert_eq!(code, Some(69), "{stderr}");
    assert!(
        stderr.contains("did not take over from the running gpud")
            && stderr.contains(&format!("(pid {old_pid}) within 10s, so it was stopped"))
            && stderr.contains("--timeout"),
        "{stderr}"
    );
    // The newcomer (its log goes where the running gpud's does) got to its last step.
    old.log_when("Paused at handover step before-stop", 1);
    // It had switched the kubelet to its socket; stopped, it hands the node back.
    let text = old.log_when("serving again in full", 15);
    assert!(!text.contains("Handed over"), "{text}");
    assert!(
        old.child.try_wait().unwrap().is_none(),
        "the running gpud exited"
    );
    let mut endpoints = Vec::new();
    while endpoints.last().map(String::as_str) != Some("nvidia-gpu.sock") {
        assert!(endpoints.len() < 4, "{endpoints:?}");
        endpoints.push(kubelet.next_registration(10).await.endpoint);
    }
    assert!(endpoints[0].starts_with("nvidia-gpu-"), "{endpoints:?}");
    http::wait_for(port, "/metrics", 10, |a| a.status == 200);
    assert_eq!(old.stop(), Some(0));
}
