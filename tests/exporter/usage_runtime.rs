//! Per-pod usage named from the container runtime's CRI socket (`--pod-usage-cri-socket`)
//! instead of the API server: the same `gpud_container_gpu_*` series, from a fake runtime's
//! `ListPodSandbox` and `ListContainers`; a runtime missing, failing or stalling is named in
//! the log and leaves the containers named from its last answer.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::common::Node;
use crate::fake_cri::{FakeRuntime, Mode, RuntimePod};
use crate::harness::{Exporter, family, value};
use crate::usage::{
    ID_A, ID_B, MEMORY, UID_A, UID_B, assert_two_pods_and_the_host, by_pod, fake_proc, process,
};

fn train_a() -> RuntimePod {
    RuntimePod::new("ml", "train-a", UID_A, &[("trainer", ID_A)])
}

fn infer_b() -> RuntimePod {
    RuntimePod::new("ml", "infer-b", UID_B, &[("server", ID_B)])
}

/// The exporter naming containers through `socket`, without a node name (the runtime only
/// knows this node's pods) or any API server.
fn start(node: &Node, proc: &Path, socket: &Path) -> Exporter {
    Exporter::start_with(
        node,
        &[
            "--pod-usage",
            "--pod-usage-proc-root",
            proc.to_str().unwrap(),
            "--pod-usage-cri-socket",
            socket.to_str().unwrap(),
            "--node-name",
            "",
        ],
        // The real clock, as in the API server's tests: per-process samples keep coming.
        &[("NVML_MOCK_CLOCK", "")],
    )
}

/// Waits until the log has `count` lines with every one of `needles`.
fn logged(exporter: &mut Exporter, needles: &[&str], count: usize) {
    crate::common::until("the log line", 30, || {
        exporter.drain_log();
        let found = exporter
            .log
            .iter()
            .filter(|l| needles.iter().all(|n| l.contains(n)))
            .count();
        if found >= count {
            Ok(())
        } else {
            Err(format!("{found} lines with {needles:?}"))
        }
    });
}

#[test]
fn containers_are_named_from_the_container_runtimes_lists() {
    let node = Node::new("dgx-h100");
    let proc = fake_proc();
    let socket = node.dir.path().join("containerd.sock");
    let runtime = FakeRuntime::start(&socket, vec![train_a(), infer_b()]);
    node.inject("process 0 101 2048 35 10");
    node.inject("process 0 102 1024 20 5");
    node.inject("process 0 103 512 5");
    let exporter = start(&node, proc.path(), &socket);
    let body = exporter.metrics_until(20, |b| {
        value(b, MEMORY, &[("pod", "infer-b")]).is_some()
            && value(b, MEMORY, &[("pod", "train-a")]).is_some()
    });
    // The same series as named through the API server.
    assert_two_pods_and_the_host(&body);

    // A pod the runtime starts later is named from its next answer.
    let uid = "dddddddd-4444-4444-8444-000000000004";
    let id = "d4".repeat(32);
    runtime.set(vec![
        train_a(),
        infer_b(),
        RuntimePod::new("web", "late", uid, &[("enc", &id)]),
    ]);
    process(
        proc.path(),
        104,
        4000,
        &format!("0::/kubepods/besteffort/pod{uid}/{id}\n"),
    );
    node.inject("process 1 104 512 5");
    let body = exporter.metrics_until(20, |b| value(b, MEMORY, &[("pod", "late")]).is_some());
    let line = family(&body, MEMORY)
        .into_iter()
        .find(|l| l.contains("pod=\"late\""))
        .unwrap();
    assert!(
        line.starts_with("gpud_container_gpu_memory_used_bytes{gpu=\"1\","),
        "{line}"
    );
    assert!(
        line.ends_with(",container=\"enc\",namespace=\"web\",pod=\"late\"} 536870912"),
        "{line}"
    );
    // Both lists are asked each round.
    let (sandboxes, containers) = runtime.calls();
    assert!(
        sandboxes >= 2 && containers + 1 >= sandboxes,
        "{sandboxes} {containers}"
    );
}

#[test]
fn a_runtime_missing_failing_or_stalling_is_logged_and_the_last_names_stay() {
    let node = Node::new("dgx-h100");
    let proc = fake_proc();
    let socket = node.dir.path().join("crio.sock");
    let shown = socket.display().to_string();
    node.inject("process 0 101 2048 35");
    let mut exporter = start(&node, proc.path(), &socket);

    // No runtime yet: the exporter serves, the process is no known pod's, the log says why.
    let body = exporter.metrics_until(20, |b| value(b, MEMORY, &[("pod", "")]).is_some());
    assert_eq!(by_pod(&body, MEMORY), [("".into(), "2147483648".into())]);
    let cannot = "Cannot list this node's pods from the container runtime";
    logged(&mut exporter, &[cannot, &shown], 1);

    // The runtime comes up: the next retry names the container.
    let runtime = FakeRuntime::start(&socket, vec![train_a()]);
    exporter.metrics_until(30, |b| value(b, MEMORY, &[("pod", "train-a")]).is_some());
    let answers = "Naming containers from the container runtime's CRI socket";
    logged(&mut exporter, &[answers, &shown], 1);

    // It fails: logged again, and the container stays named from the last answer.
    runtime.set_mode(Mode::Fail);
    logged(
        &mut exporter,
        &[cannot, &shown, "refused ListPodSandbox"],
        1,
    );
    let body = exporter.get("/metrics").body;
    assert_eq!(
        by_pod(&body, MEMORY),
        [("train-a".into(), "2147483648".into())]
    );

    // It answers, then stalls: the call is given up after its time limit and logged.
    runtime.set_mode(Mode::Answer);
    logged(&mut exporter, &[answers, &shown], 2);
    runtime.set_mode(Mode::Hang);
    logged(
        &mut exporter,
        &[cannot, &shown, "did not answer ListPodSandbox"],
        1,
    );
    let body = exporter.get("/metrics").body;
    assert_eq!(
        by_pod(&body, MEMORY),
        [("train-a".into(), "2147483648".into())]
    );

    // It answers again, with the pod gone: so is its name.
    runtime.set(vec![]);
    runtime.set_mode(Mode::Answer);
    let body = exporter.metrics_until(30, |b| value(b, MEMORY, &[("pod", "train-a")]).is_none());
    assert_eq!(by_pod(&body, MEMORY), [("".into(), "2147483648".into())]);
}

/// A container runtime too wedged to answer: its socket accepts connections and reads what
/// comes (counting the calls: HTTP/2 HEADERS frames), but never writes a byte, not even
/// HTTP/2's settings, and never closes a connection, as a runtime whose serving threads are
/// stuck holds every descriptor it accepted.
struct Wedged {
    accepted: Arc<AtomicUsize>,
    calls: Arc<AtomicUsize>,
}

impl Wedged {
    fn start(socket: &Path) -> Wedged {
        let listener = std::os::unix::net::UnixListener::bind(socket).unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let calls = Arc::new(AtomicUsize::new(0));
        let (counted, called) = (Arc::clone(&accepted), Arc::clone(&calls));
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { return };
                counted.fetch_add(1, Ordering::SeqCst);
                let called = Arc::clone(&called);
                std::thread::spawn(move || read_calls(stream, &called));
            }
        });
        Wedged { accepted, calls }
    }
}

/// Reads HTTP/2 frames from `stream` until its end, counting HEADERS frames into `calls`;
/// then holds the connection open for good.
fn read_calls(mut stream: std::os::unix::net::UnixStream, calls: &AtomicUsize) {
    use std::io::Read;
    const PREFACE: usize = 24;
    let mut read = Vec::new();
    let mut parsed = PREFACE;
    let mut buf = [0u8; 4096];
    while let Ok(n) = stream.read(&mut buf) {
        if n == 0 {
            break;
        }
        read.extend_from_slice(&buf[..n]);
        // A frame: 3 bytes of length, 1 of type (1: HEADERS), 1 of flags, 4 of stream ID.
        while read.len() >= parsed + 9 {
            let length = usize::from(read[parsed]) << 16
                | usize::from(read[parsed + 1]) << 8
                | usize::from(read[parsed + 2]);
            if read.len() < parsed + 9 + length {
                break;
            }
            if read[parsed + 3] == 1 {
                calls.fetch_add(1, Ordering::SeqCst);
            }
            parsed += 9 + length;
        }
    }
    std::mem::forget(stream);
}

#[test]
fn a_wedged_runtime_is_asked_again_on_the_connection_it_already_has() {
    let node = Node::new("dgx-h100");
    let proc = fake_proc();
    let socket = node.dir.path().join("wedged.sock");
    let shown = socket.display().to_string();
    let wedged = Wedged::start(&socket);
    let mut exporter = start(&node, proc.path(), &socket);
    // Three calls, each given up after its time limit and retried on the backoff.
    crate::common::until("three calls to the wedged runtime", 60, || {
        let calls = wedged.calls.load(Ordering::SeqCst);
        let accepted = wedged.accepted.load(Ordering::SeqCst);
        if calls >= 3 {
            Ok(())
        } else {
            Err(format!("{calls} calls on {accepted} connections"))
        }
    });
    logged(
        &mut exporter,
        &[
            "Cannot list this node's pods",
            &shown,
            "did not answer ListPodSandbox",
        ],
        1,
    );
    // All of them on one connection: none left open in the runtime per retry.
    let accepted = wedged.accepted.load(Ordering::SeqCst);
    let calls = wedged.calls.load(Ordering::SeqCst);
    assert_eq!(accepted, 1, "{calls} calls on {accepted} connections");
}

#[test]
fn a_stalled_runtime_that_restarts_is_reached_on_its_new_socket() {
    let node = Node::new("dgx-h100");
    let proc = fake_proc();
    let socket = node.dir.path().join("containerd.sock");
    let shown = socket.display().to_string();
    node.inject("process 0 101 2048 35");
    let runtime = FakeRuntime::start(&socket, vec![train_a()]);
    runtime.set_mode(Mode::Hang);
    let mut exporter = start(&node, proc.path(), &socket);
    logged(
        &mut exporter,
        &[
            "Cannot list this node's pods",
            &shown,
            "did not answer ListPodSandbox",
        ],
        1,
    );
    // The runtime is restarted: the connection kept after the timeout ends with it, and the
    // next list reaches the new runtime.
    runtime.set_mode(Mode::Fail);
    drop(runtime);
    let _restarted = FakeRuntime::start(&socket, vec![train_a()]);
    exporter.metrics_until(30, |b| value(b, MEMORY, &[("pod", "train-a")]).is_some());
    logged(
        &mut exporter,
        &[
            "Naming containers from the container runtime's CRI socket",
            &shown,
        ],
        1,
    );
}
