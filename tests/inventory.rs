//! `gpud inventory` end to end on every built-in simulated node: golden JSON and tables, a GPU
//! lost and recovered mid-run, and the failures a node without a driver produces.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use common::{Node, assert_golden, stdout_ok};
use serde_json::Value;

const FIXTURES: &[&str] = &[
    "dgx-h100",
    "dgx-a100",
    "pcie-4gpu",
    "mixed",
    "a100-mig",
    "empty",
    "gb200-nvl",
];

#[test]
fn json_matches_golden_for_every_fixture() {
    for fixture in FIXTURES {
        let node = Node::new(fixture);
        let json = stdout_ok(&node.run(&["inventory"]));
        assert_golden(&format!("inventory/{fixture}.json"), &json);
    }
}

#[test]
fn table_matches_golden() {
    for fixture in ["dgx-h100", "pcie-4gpu", "a100-mig"] {
        let node = Node::new(fixture);
        let table = stdout_ok(&node.run(&["inventory", "--format", "table"]));
        assert_golden(&format!("inventory/{fixture}.table.txt"), &table);
    }
}

#[test]
fn goldens_are_blessed_only_outside_ci() {
    use std::ffi::OsStr;
    let on = Some(OsStr::new("1"));
    assert_eq!(common::blessing(None, None), Ok(false));
    assert_eq!(common::blessing(on, None), Ok(true));
    assert_eq!(common::blessing(None, Some(OsStr::new("true"))), Ok(false));
    assert_eq!(common::blessing(on, Some(OsStr::new("false"))), Ok(true));
    let refused = common::blessing(on, Some(OsStr::new("true"))).unwrap_err();
    assert!(refused.contains("unset GPUD_BLESS"), "{refused}");
}

#[test]
fn empty_node_has_no_gpus_and_succeeds() {
    let node = Node::new("empty");
    let json: Value = serde_json::from_str(&stdout_ok(&node.run(&["inventory"]))).unwrap();
    assert_eq!(json["gpus"], serde_json::json!([]));
    assert_eq!(json["topology"], serde_json::json!([]));
    assert!(
        json["node"]["driver_version"]
            .as_str()
            .is_some_and(|v| !v.is_empty())
    );
}

#[test]
fn missing_library_names_the_path_once_and_what_to_do() {
    let node = Node::new("dgx-h100");
    let out = node
        .gpud(&["inventory", "--nvml-lib", "/nonexistent/libnvidia-ml.so.1"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(69));
    assert!(out.stdout.is_empty());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        stderr,
        "gpud: cannot initialise NVML: /nonexistent/libnvidia-ml.so.1: cannot open shared \
         object file: No such file or directory\n\
         gpud: check the path given with --nvml-lib (GPUD_NVML_LIB), or leave it out to search \
         the usual places\n"
    );
}

#[test]
fn no_driver_says_to_install_it_or_name_the_library() {
    // No --nvml-lib: the search finds no driver on a machine without one (the build machine).
    let node = Node::new("dgx-h100");
    let out = Command::new(env!("CARGO_BIN_EXE_gpud"))
        .arg("inventory")
        .env_remove("GPUD_NVML_LIB")
        .env("LD_LIBRARY_PATH", node.dir.path())
        .output()
        .unwrap();
    if out.status.success() {
        eprintln!("skipped: this machine has an NVIDIA driver");
        return;
    }
    assert_eq!(out.status.code(), Some(69));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 2, "{stderr}");
    assert!(
        lines[0].starts_with("gpud: cannot initialise NVML: libnvidia-ml.so.1: ")
            && lines[0].contains("; not present: /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1, ")
            && lines[0].contains(", /run/nvidia/driver/usr/lib64/libnvidia-ml.so.1, "),
        "{stderr}"
    );
    assert_eq!(
        lines[0]
            .matches("/usr/local/nvidia/lib64/libnvidia-ml.so.1")
            .count(),
        1
    );
    assert_eq!(
        lines[1],
        "gpud: install the NVIDIA driver (or mount its files into this container), or give the \
         library's path with --nvml-lib PATH (GPUD_NVML_LIB)"
    );
}

#[test]
fn failing_init_is_one_line_with_the_nvml_error() {
    // The mock refuses to initialise with a fixture that does not exist, as a driver without
    // its kernel module does.
    let mut node = Node::new("dgx-h100");
    node.fixture = "/nonexistent/fixture.json".into();
    let out = node.run(&["inventory"]);
    assert_eq!(out.status.code(), Some(69));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let ours: Vec<&str> = stderr.lines().filter(|l| l.starts_with("gpud:")).collect();
    assert_eq!(ours.len(), 2, "{stderr}");
    assert!(
        ours[0].contains("libnvidia_ml_mock.so: nvmlInit failed"),
        "{stderr}"
    );
}

#[test]
fn gpu_lost_before_start_is_reported_by_index() {
    let node = Node::new("dgx-h100");
    node.inject("lost 5");
    let json: Value = serde_json::from_str(&stdout_ok(&node.run(&["inventory"]))).unwrap();
    let gpus = json["gpus"].as_array().unwrap();
    assert_eq!(gpus.len(), 8);
    assert_eq!(gpus[5]["index"], 5);
    assert_eq!(gpus[5]["health"]["state"], "unhealthy");
    assert_eq!(gpus[5]["health"]["source"], "discovery");
    for (i, gpu) in gpus.iter().enumerate().filter(|(i, _)| *i != 5) {
        assert_eq!(gpu["health"]["state"], "healthy", "GPU {i}");
        assert!(gpu["uuid"].as_str().unwrap().starts_with("GPU-"));
    }
}

/// Reads JSON lines from `gpud inventory --watch`.
struct Watcher {
    child: std::process::Child,
    lines: std::io::Lines<BufReader<std::process::ChildStdout>>,
}

impl Watcher {
    fn start(node: &Node) -> Watcher {
        let mut cmd = node.gpud(&["inventory", "--watch", "--interval", "50ms"]);
        // The warnings a lost GPU provokes on purpose stay out of the test output.
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let lines = BufReader::new(child.stdout.take().unwrap()).lines();
        Watcher { child, lines }
    }

    fn next(&mut self) -> Value {
        let line = self.lines.next().expect("watch output ended").unwrap();
        serde_json::from_str(&line).unwrap()
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn gpu_lost_mid_run_then_recovered() {
    let node = Node::new("dgx-h100");
    let mut watch = Watcher::start(&node);
    let before = watch.next();
    let uuid5 = before["gpus"][5]["uuid"].as_str().unwrap().to_owned();
    assert!(
        before["gpus"]
            .as_array()
            .unwrap()
            .iter()
            .all(|g| g["health"]["state"] == "healthy")
    );

    node.inject("lost 5");
    let lost = watch.next();
    let gpus = lost["gpus"].as_array().unwrap();
    assert_eq!(gpus.len(), 8);
    for (i, gpu) in gpus.iter().enumerate() {
        assert_eq!(
            gpu["uuid"], before["gpus"][i]["uuid"],
            "identity of GPU {i} kept"
        );
        let want = if i == 5 { "unhealthy" } else { "healthy" };
        assert_eq!(gpu["health"]["state"], want, "GPU {i}");
    }
    assert_eq!(gpus[5]["uuid"], uuid5.as_str());
    assert!(
        gpus[5]["health"]["reason"]
            .as_str()
            .unwrap()
            .starts_with("GPU is lost")
    );
    assert_eq!(
        lost["topology"], before["topology"],
        "topology of a lost GPU is remembered"
    );

    node.inject("recover 5");
    let recovered = watch.next();
    assert_eq!(recovered, before, "a recovered GPU is exactly as before");
}

#[test]
fn watch_prints_nothing_while_nothing_changes() {
    let node = Node::new("pcie-4gpu");
    let mut cmd = node.gpud(&["inventory", "--watch", "--interval", "20ms"]);
    // The rescanner says at debug level when a rescan found nothing new.
    let log = node.dir.path().join("gpud.log");
    let child = cmd
        .env("GPUD_LOG", "gpud::nvml::rescan=debug")
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if text.matches("Rescan found no change").count() >= 5 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "five rescans:\n{text}"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    // SIGTERM ends the watch cleanly.
    common::send_signal(&child, "TERM");
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{:?}", out.status);
    let text = String::from_utf8(out.stdout).unwrap();
    assert_eq!(
        text.lines().count(),
        1,
        "one document for an unchanged node:\n{text}"
    );
}
