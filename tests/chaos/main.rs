//! `make chaos`: the real `gpud run` (the release binary, `GPUD_CHAOS_BIN`) on the simulated
//! node (`GPUD_CHAOS_MOCK`, the library `make mock` builds) and a simulated kubelet, driven
//! through faults with exact expectations. Loopback and unix sockets only; it stops by itself
//! in a few minutes. It prints one row per scenario: the load held, the faults survived, and
//! what was lost (must be 0). docs/reliability.md quotes the table.
//!
//! `#[ignore]`d so `cargo test --workspace` leaves it out; `make chaos` runs it with
//! `--ignored`. Without the variables it runs the debug binary and the test build's mock.

#![allow(clippy::unwrap_used, clippy::expect_used)]
// A test harness, not an API: its helper types need no Debug.
#![allow(missing_debug_implementations)]

#[path = "../common/mod.rs"]
mod common;
#[path = "../common/fake_api.rs"]
mod fake_api;
#[path = "../common/fake_kubelet.rs"]
mod fake_kubelet;
#[path = "../common/fake_pod_resources.rs"]
mod fake_pod_resources;

mod scenarios;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::Node;
use fake_kubelet::FakeKubelet;

/// One row of the table.
pub struct Row {
    pub scenario: &'static str,
    pub load: String,
    pub faults: String,
    pub lost: u64,
}

/// The binary and mock under test.
#[allow(clippy::disallowed_methods)] // the suite's own switches, set by `make chaos`
fn under_test() -> (PathBuf, Option<PathBuf>) {
    let bin = std::env::var_os("GPUD_CHAOS_BIN").map_or_else(common::gpud_bin, PathBuf::from);
    let mock = std::env::var_os("GPUD_CHAOS_MOCK").map(PathBuf::from);
    (bin, mock)
}

/// A running `gpud run` on a node, its stderr in `<node>/gpud.log`; killed on drop.
pub struct Gpud {
    pub child: Child,
    pub port: u16,
    pub features: PathBuf,
    pub config: PathBuf,
    pub log: PathBuf,
}

impl Gpud {
    /// Starts `gpud run` against `kubelet` with the exporter on `port`.
    pub fn start(node: &Node, kubelet: &FakeKubelet, port: u16) -> Gpud {
        Gpud::start_with(node, kubelet, port, &[])
    }

    /// [`Gpud::start`] with `extra` arguments.
    pub fn start_with(node: &Node, kubelet: &FakeKubelet, port: u16, extra: &[&str]) -> Gpud {
        let (bin, mock) = under_test();
        let features = node.dir.path().join("features.d").join("gfd");
        std::fs::create_dir_all(features.parent().unwrap()).unwrap();
        let config = node.dir.path().join("config.yaml");
        if !config.exists() {
            std::fs::write(&config, "version: v1\nflags:\n  migStrategy: none\n").unwrap();
        }
        let log = node.dir.path().join("gpud.log");
        let mut cmd = Command::new(bin);
        node.wire(&mut cmd);
        if let Some(mock) = mock {
            cmd.env("GPUD_NVML_LIB", mock);
        }
        cmd.env("GPUD_LOG", "info")
            .args(["run", "--output-file"])
            .arg(&features)
            .arg("--no-timestamp")
            .arg("--kubelet-socket")
            .arg(kubelet.socket())
            .args(["--kmsg", "", "--health-poll-interval", "50ms", "-c", "100"])
            .arg("-a")
            .arg(format!("127.0.0.1:{port}"))
            .arg("--config-file")
            .arg(&config)
            .args(extra)
            .stdout(Stdio::null())
            .stderr(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&log)
                    .unwrap(),
            );
        let child = cmd.spawn().expect("start gpud run");
        Gpud {
            child,
            port,
            features,
            config,
            log,
        }
    }

    /// Waits until `/readyz` answers 200.
    pub fn ready(&self) {
        tokio::task::block_in_place(|| {
            common::http::wait_for(self.port, "/readyz", 20, |a| a.status == 200)
        });
    }

    /// Resident memory in KiB.
    pub fn rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0)
    }

    /// Open file descriptors (sockets included).
    pub fn fds(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.child.id())).map_or(0, Iterator::count)
    }

    /// How many log lines contain `text` so far.
    pub fn logged(&self, text: &str) -> usize {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains(text))
            .count()
    }
}

impl Drop for Gpud {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Polls `check` every 10 ms until it returns `Some`, failing after `secs`.
pub fn poll<T>(what: &str, secs: u64, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(value) = check() {
            return value;
        }
        assert!(Instant::now() < deadline, "{what}: not within {secs}s");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "drives the release binary through faults for ~25 s; `make chaos` (and CI) runs it"]
async fn chaos() {
    let started = Instant::now();
    let rows = vec![
        scenarios::kubelet_restarts().await,
        scenarios::xid_storm().await,
        scenarios::lost_and_recovered_during_allocations().await,
        scenarios::reload_churn().await,
        scenarios::scrape_flood().await,
        scenarios::pod_resources_faults().await,
        scenarios::api_server_down_and_back().await,
        scenarios::kill_and_restart().await,
    ];
    println!();
    println!("| scenario | load held | faults survived | lost |");
    println!("|---|---|---|---|");
    for row in &rows {
        println!(
            "| {} | {} | {} | {} |",
            row.scenario, row.load, row.faults, row.lost
        );
    }
    println!("\nchaos suite: {:.0?} in all", started.elapsed());
    for row in &rows {
        assert_eq!(row.lost, 0, "{}", row.scenario);
    }
}
