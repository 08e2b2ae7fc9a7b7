//! The daemon core, black-box: every long-running applet starts, becomes ready, reloads on
//! SIGHUP (also one that arrives while it is still starting) and stops cleanly on SIGTERM through the one
//! supervisor, and every subsystem's log lines carry its name.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
#[path = "common/fake_api.rs"]
mod fake_api;
#[path = "common/fake_kubelet.rs"]
mod fake_kubelet;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::Node;
use common::http::{self, free_port};
use fake_api::FakeApi;
use fake_kubelet::FakeKubelet;

/// One long-running applet under test, with its stderr in a file.
struct Applet {
    child: Child,
    port: u16,
    log: PathBuf,
}

impl Drop for Applet {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Applet {
    fn spawn(mut cmd: Command, port: u16, log: PathBuf) -> Applet {
        let stderr = std::fs::File::create(&log).unwrap();
        let child = cmd
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("spawn gpud");
        Applet { child, port, log }
    }

    fn signal(&self, name: &str) {
        common::send_signal(&self.child, name);
    }

    /// Sends SIGHUP the moment gpud's first instruction in `main` has run (it blocks the
    /// signals it handles): the earliest moment any program can protect itself, since
    /// between `execve` and `main` only the dynamic loader runs.
    fn hangup_at_once(&self) {
        let status = format!("/proc/{}/status", self.child.id());
        // Generous: six lifecycle tests poll at once on a two-core machine.
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let text = std::fs::read_to_string(&status).unwrap_or_default();
            // bit 0: SIGHUP. Blocked from main's first instruction until the supervisor's
            // handler is installed and takes it (caught): on a loaded machine the poll may
            // see only the second state, which is as safe a moment to send it.
            let has_hup = |field: &str| {
                text.lines()
                    .find_map(|l| l.strip_prefix(field))
                    .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
                    .is_some_and(|mask| mask & 1 == 1)
            };
            if has_hup("SigBlk:") || has_hup("SigCgt:") {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "gpud never blocked nor caught SIGHUP"
            );
            // Give the core to gpud (and the other tests' gpuds) rather than spin on it.
            std::thread::yield_now();
        }
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGHUP).unwrap();
    }

    /// Waits until `/readyz` answers 200 and returns its body.
    fn ready(&mut self) -> String {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(answer) = http::get(self.port, "/readyz")
                && answer.status == 200
            {
                return answer.body;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!(
                    "gpud exited with {status} before it was ready:\n{}",
                    self.stderr()
                );
            }
            assert!(
                Instant::now() < deadline,
                "not ready within 20 s:\n{}",
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits until the log holds `count` lines containing `text`.
    fn logged(&mut self, text: &str, count: usize) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while self.stderr().matches(text).count() < count {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("gpud exited with {status}:\n{}", self.stderr());
            }
            assert!(
                Instant::now() < deadline,
                "{text:?} not logged {count} times within 20 s:\n{}",
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn stop(&mut self) -> Option<i32> {
        self.signal("TERM");
        self.child.wait().unwrap().code()
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// The peers an applet talks to: the kubelet's registration socket and a kubeconfig for the
/// API server.
struct Peers {
    kubelet: PathBuf,
    kubeconfig: PathBuf,
}

/// The command line of each long-running applet on `node`, with its admin endpoint (or
/// metrics port) on `port`.
fn command(applet: &str, node: &Node, peers: &Peers, port: u16) -> Command {
    let dir = node.dir.path();
    let address = format!("127.0.0.1:{port}");
    let features = dir.join("gfd");
    let kubelet = peers.kubelet.to_str().unwrap();
    let kubeconfig = peers.kubeconfig.to_str().unwrap();
    let mut args: Vec<&str> = vec![applet, "--kmsg", "", "--health-poll-interval", "50ms"];
    match applet {
        "device-plugin" => args.extend(["--kubelet-socket", kubelet]),
        "exporter" => args.extend(["-a", &address, "-c", "100"]),
        "health" => {}
        "labeller" => args.extend(["-o", features.to_str().unwrap(), "--no-timestamp"]),
        "node-status" => args.extend(["--kubeconfig", kubeconfig]),
        "run" => args.extend([
            "--kubelet-socket",
            kubelet,
            "-o",
            features.to_str().unwrap(),
            "-a",
            &address,
            "-c",
            "100",
        ]),
        other => panic!("no command line for {other}"),
    }
    let mut cmd = node.gpud(&args);
    if !matches!(applet, "exporter" | "run") {
        cmd.env("GPUD_HEALTH_ADDRESS", &address);
    }
    cmd.env("GPUD_SYSFS_ROOT", dir);
    cmd
}

/// The subsystems each applet runs.
fn subsystems(applet: &str) -> &'static [&'static str] {
    match applet {
        "device-plugin" => &["rescan", "health", "device-plugin", "admin"],
        "exporter" => &["rescan", "health", "exporter"],
        "health" => &["health", "printer", "admin"],
        "labeller" => &["rescan", "health", "labeller", "admin"],
        "node-status" => &["health", "node-status", "admin"],
        "run" => &[
            "rescan",
            "doctor",
            "health",
            "exporter",
            "device-plugin",
            "labeller",
        ],
        other => panic!("no subsystems for {other}"),
    }
}

/// Start → SIGHUP as soon as `main` runs → ready → SIGHUP → SIGTERM, `rounds` times; asserts that
/// each round became ready with every subsystem listed, reloaded twice, and exited 0 with
/// every subsystem's start, readiness and stop in its own span.
async fn lifecycle(applet: &str, rounds: usize) {
    let node = Node::new("dgx-h100");
    let kubelet = FakeKubelet::start(node.dir.path()).await;
    let api = FakeApi::start_with_node(serde_json::json!({}));
    let peers = Peers {
        kubelet: kubelet.socket(),
        kubeconfig: api.kubeconfig(node.dir.path()),
    };
    for round in 0..rounds {
        let port = free_port();
        let log = node.dir.path().join(format!("{applet}-{round}.log"));
        let mut gpud = Applet::spawn(command(applet, &node, &peers, port), port, log);
        gpud.hangup_at_once();
        let body = tokio::task::block_in_place(|| gpud.ready());
        let mut expected: Vec<String> = subsystems(applet)
            .iter()
            .map(|name| format!("{name} ready"))
            .collect();
        let mut listed: Vec<String> = body.lines().skip(1).map(str::to_owned).collect();
        expected.sort();
        listed.sort();
        assert_eq!(body.lines().next(), Some("ready"), "{body}");
        assert_eq!(listed, expected, "round {round}: /readyz of {applet}");
        tokio::task::block_in_place(|| gpud.logged("Configuration reloaded", 1));
        gpud.signal("HUP");
        tokio::task::block_in_place(|| gpud.logged("Configuration reloaded", 2));
        let code = tokio::task::block_in_place(|| gpud.stop());
        let stderr = gpud.stderr();
        assert_eq!(code, Some(0), "round {round}: {applet} exit code\n{stderr}");
        for name in subsystems(applet) {
            for event in ["Starting", "Ready", "Stopped"] {
                let line = format!(" {name}: {event}");
                assert!(
                    stderr.contains(&line),
                    "round {round}: {applet} did not log {line:?}:\n{stderr}"
                );
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn device_plugin_lifecycle() {
    lifecycle("device-plugin", 50).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exporter_lifecycle() {
    lifecycle("exporter", 50).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_lifecycle() {
    lifecycle("health", 50).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn labeller_lifecycle() {
    lifecycle("labeller", 50).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_lifecycle() {
    lifecycle("run", 50).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_status_lifecycle() {
    lifecycle("node-status", 50).await;
}

/// `command` with its address space limited to `kib` (RLIMIT_AS, as `ulimit -v` sets it).
#[allow(unsafe_code)] // pre_exec: the limit must be set in the child, after fork
fn with_address_space_kib(mut command: Command, kib: u64) -> Command {
    use std::os::unix::process::CommandExt;
    // SAFETY: the closure runs in the child between fork and exec, where only
    // async-signal-safe calls are allowed: setrlimit is one (a plain system call), and the
    // closure allocates nothing and touches no lock.
    unsafe {
        command.pre_exec(move || {
            use nix::sys::resource::{Resource, setrlimit};
            setrlimit(Resource::RLIMIT_AS, kib * 1024, kib * 1024).map_err(std::io::Error::from)
        });
    }
    command
}

/// The lowest address-space limit, to 256 KiB, under which `gpud --version` runs: what the
/// binary and its libraries map before any of gpud's code runs (a debug build maps far more
/// than a release build, so the test measures it rather than assume it).
fn exec_floor_kib(node: &Node) -> u64 {
    let runs = |kib: u64| {
        let mut command = with_address_space_kib(node.gpud(&["--version"]), kib);
        command.output().unwrap().status.success()
    };
    let (mut low, mut high) = (1024, 4 * 1024 * 1024);
    assert!(runs(high), "gpud --version fails under {high} KiB");
    while high - low > 256 {
        let mid = (low + high) / 2;
        if runs(mid) {
            high = mid;
        } else {
            low = mid;
        }
    }
    high
}

/// Under an address-space limit that leaves no room to start (a small container's `ulimit -v`),
/// `gpud run` says so in one line and exits 1: no panic, no backtrace, no abort, no hang.
#[test]
fn run_under_too_small_an_address_space_limit_exits_with_one_line() {
    let node = Node::new("dgx-h100");
    let limit = exec_floor_kib(&node) + 2 * 1024;
    let mut command = with_address_space_kib(
        // Not the exporter's default port: should it get as far as binding, tests in
        // parallel would collide on :9400.
        node.gpud(&[
            "run",
            "--kmsg",
            "",
            "--kubelet-socket",
            "",
            "-a",
            "127.0.0.1:0",
        ]),
        limit,
    );
    let out = command.env("RUST_BACKTRACE", "1").output().unwrap();
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(!stderr.contains("panicked at"), "{stderr}");
    assert!(!stderr.contains("stack backtrace"), "{stderr}");
    let prefix = format!(
        "gpud: cannot start: out of memory: the address-space limit (ulimit -v) is {limit} KiB \
         and "
    );
    let line = stderr
        .strip_prefix(&prefix)
        .and_then(|rest| rest.strip_suffix("\n"))
        .unwrap_or_else(|| panic!("{stderr}"));
    let (mapped, rest) = line
        .split_once(" KiB of it is mapped already, leaving ")
        .unwrap();
    let (free, rest) = rest.split_once(" KiB where gpud run needs ").unwrap();
    let (mapped, free): (u64, u64) = (mapped.parse().unwrap(), free.parse().unwrap());
    assert_eq!(free, limit - mapped, "{stderr}");
    assert_eq!(
        rest,
        format!(
            "{} KiB: raise the container's memory limit or the ulimit",
            gpud::daemon::address_space::NEEDED_KIB
        )
    );
}

/// The health watcher starts first and the others wait for it (at most 5 s): a watcher hung at
/// start (its NVML event set never created) holds them back, and a SIGTERM meanwhile ends that
/// wait at once. The others never start, and gpud is gone within its 5 s grace for the hung
/// call, not after the wait and then the grace.
#[test]
fn a_stop_while_the_others_wait_for_the_health_watcher_is_answered_at_once() {
    let node = Node::new("dgx-h100");
    node.inject("hang nvmlEventSetCreate");
    let port = free_port();
    let mut cmd = node.gpud(&["health", "--kmsg", ""]);
    cmd.env("GPUD_HEALTH_ADDRESS", format!("127.0.0.1:{port}"));
    let mut applet = Applet::spawn(cmd, port, node.dir.path().join("gpud.log"));
    applet.logged("health: Starting", 1);
    let asked = Instant::now();
    let code = applet.stop();
    let took = asked.elapsed();
    let log = applet.stderr();
    assert!(log.contains("Stopping on signal"), "{log}");
    assert!(!log.contains("printer: Starting"), "{log}");
    assert!(!log.contains("admin: Starting"), "{log}");
    assert!(took < Duration::from_secs(8), "{took:?}\n{log}");
    // The hung call is left behind, as any subsystem that misses the grace.
    assert!(
        log.contains("Some subsystems did not stop in time"),
        "{log}"
    );
    assert_eq!(code, Some(0), "{log}");
}
