//! `gpud labeller` end to end on the simulated nodes: exact labels per fixture and strategy,
//! the features file's atomic rewrite under a concurrent reader, relabelling on inventory
//! changes and SIGHUP, removal on exit, bad configs, and the Node and NodeFeature sinks
//! against a fake Kubernetes API server on loopback.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
#[path = "common/fake_api.rs"]
mod fake_api;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{Node, assert_golden, send_signal, stdout_ok};
use fake_api::{FakeApi, Fault, Rule};
use serde_json::{Value, json};

const FIXTURES: &[&str] = &[
    "dgx-h100",
    "dgx-a100",
    "pcie-4gpu",
    "mixed",
    "a100-mig",
    "empty",
    "gb200-nvl",
];

/// A 256-byte PCI configuration space of an NVIDIA GPU whose capability list holds a power
/// management capability and a vendor-specific one: with the `VF` signature and a host driver
/// record when `host` (version, branch) is given, as a vGPU's; without, as a physical GPU's.
fn config_space(host: Option<(&str, &str)>) -> Vec<u8> {
    let mut c = vec![0u8; 256];
    c[0..4].copy_from_slice(&[0xde, 0x10, 0x30, 0x23]);
    c[0x06] = 0x10; // status: capability list present
    c[0x34] = 0x60; // first capability
    c[0x60..0x64].copy_from_slice(&[0x01, 0x68, 0x03, 0x00]); // power management, next 0x68
    let mut vendor = vec![0x09, 0x00, 0x00];
    match host {
        Some((version, branch)) => {
            vendor.extend_from_slice(b"VF");
            vendor.extend_from_slice(&[0x00, 22]);
            for field in [version, branch] {
                let mut bytes = field.as_bytes().to_vec();
                bytes.resize(10, 0);
                vendor.extend_from_slice(&bytes);
            }
        }
        None => vendor.extend_from_slice(&[0x01, 0x00, 0x14, 0x00]),
    }
    vendor[2] = vendor.len() as u8;
    c[0x68..0x68 + vendor.len()].copy_from_slice(&vendor);
    c
}

/// A sysfs tree with every GPU of `fixture` (from its inventory golden) as a PCI device:
/// `class` (3D controllers, except the L40S, a VGA controller), `vendor` and `config` (a
/// physical GPU's); plus a host bridge of another vendor.
fn fake_sysfs(node: &Node, fixture: &str) -> PathBuf {
    let golden = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/golden/inventory")
        .join(format!("{fixture}.json"));
    let inventory: Value = serde_json::from_str(&std::fs::read_to_string(golden).unwrap()).unwrap();
    let root = node.dir.path().join("sys");
    for gpu in inventory["gpus"].as_array().unwrap() {
        let bus = gpu["pci"]["bus_id"].as_str().unwrap();
        let address = bus[4..].to_ascii_lowercase();
        let dir = root.join("bus/pci/devices").join(address);
        std::fs::create_dir_all(&dir).unwrap();
        let class = if gpu["name"].as_str().unwrap().contains("L40S") {
            "0x030000"
        } else {
            "0x030200"
        };
        std::fs::write(dir.join("class"), format!("{class}\n")).unwrap();
        std::fs::write(dir.join("vendor"), "0x10de\n").unwrap();
        std::fs::write(dir.join("config"), config_space(None)).unwrap();
    }
    let bridge = root.join("bus/pci/devices/0000:00:00.0");
    std::fs::create_dir_all(&bridge).unwrap();
    std::fs::write(bridge.join("vendor"), "0x8086\n").unwrap();
    std::fs::write(bridge.join("class"), "0x060000\n").unwrap();
    std::fs::create_dir_all(&root).unwrap();
    root
}

fn labeller(node: &Node, sysfs: &Path, extra: &[&str]) -> Command {
    let mut cmd = node.gpud(&["labeller", "--sysfs-root", sysfs.to_str().unwrap()]);
    cmd.args(extra);
    cmd
}

fn parse_labels(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .map(|l| {
            let (k, v) = l
                .split_once('=')
                .unwrap_or_else(|| panic!("not key=value: {l:?}"));
            (k.to_owned(), v.to_owned())
        })
        .collect()
}

#[test]
fn oneshot_file_matches_golden_for_every_fixture_and_strategy() {
    for fixture in FIXTURES {
        for strategy in ["none", "single", "mixed"] {
            let node = Node::new(fixture);
            let sysfs = fake_sysfs(&node, fixture);
            let out = node.dir.path().join("features.d/gfd");
            std::fs::create_dir_all(out.parent().unwrap()).unwrap();
            let output = labeller(
                &node,
                &sysfs,
                &[
                    "--oneshot",
                    "--no-timestamp",
                    "--mig-strategy",
                    strategy,
                    "-o",
                    out.to_str().unwrap(),
                ],
            )
            .output()
            .unwrap();
            assert!(
                output.status.success(),
                "{fixture}: {}",
                String::from_utf8_lossy(&output.stderr)
            );
            assert!(output.stdout.is_empty());
            let text = std::fs::read_to_string(&out).unwrap();
            assert_golden(&format!("labeller/{fixture}.{strategy}.txt"), &text);
            // A oneshot run leaves its file in place.
            assert!(out.exists());
        }
    }
}

#[test]
fn timestamp_is_unix_seconds_and_stdout_works() {
    let node = Node::new("pcie-4gpu");
    let sysfs = fake_sysfs(&node, "pcie-4gpu");
    let before = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    for dash in ["-", ""] {
        let text = stdout_ok(
            &labeller(&node, &sysfs, &["--oneshot", "-o", dash])
                .output()
                .unwrap(),
        );
        let labels = parse_labels(&text);
        let ts: u64 = labels["nvidia.com/gfd.timestamp"].parse().unwrap();
        assert!(ts >= before && ts <= before + 60, "{ts}");
        assert_eq!(labels["nvidia.com/gpu.product"], "NVIDIA-A100-80GB-PCIe");
    }
}

#[test]
fn health_labels_false_leaves_them_out() {
    let node = Node::new("pcie-4gpu");
    let sysfs = fake_sysfs(&node, "pcie-4gpu");
    let with = |extra: &[&str]| {
        let mut args = vec!["--oneshot", "-o", "-"];
        args.extend_from_slice(extra);
        parse_labels(&stdout_ok(
            &labeller(&node, &sysfs, &args).output().unwrap(),
        ))
    };
    assert_eq!(with(&[])["gpud.io/gpu.health"], "healthy");
    assert_eq!(with(&["--health-labels"])["gpud.io/gpu.health"], "healthy");
    let without = with(&["--health-labels=false"]);
    assert!(
        without.keys().all(|k| !k.starts_with("gpud.io/")),
        "{without:?}"
    );
    assert_eq!(without["nvidia.com/gpu.count"], "4");

    let help = stdout_ok(&node.run(&["labeller", "--help"]));
    let option = help
        .split("\n      --health-labels[=<BOOL>]\n")
        .nth(1)
        .and_then(|rest| rest.split("\n\n      -").next())
        .unwrap_or_else(|| panic!("no --health-labels[=<BOOL>] in:\n{help}"));
    assert!(
        option.ends_with("[env: GPUD_HEALTH_LABELS=]\n          [default: true]"),
        "{option}"
    );
}

#[test]
fn missing_features_folder_says_what_to_do() {
    let node = Node::new("pcie-4gpu");
    let sysfs = fake_sysfs(&node, "pcie-4gpu");
    let file = node.dir.path().join("no-nfd/features.d/gfd");
    let out = labeller(&node, &sysfs, &["--oneshot", "-o", file.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let expected = format!(
        "cannot write {}: the folder {} does not exist (is node-feature-discovery installed on \
         this host?); print the labels with -o -, write them elsewhere with -o PATH, or label \
         the Node through the API with --sink node\n",
        file.display(),
        file.parent().unwrap().display()
    );
    assert!(stderr.ends_with(&expected), "{stderr}");
    assert_eq!(
        stderr.matches(&file.display().to_string()).count(),
        1,
        "{stderr}"
    );
}

#[test]
fn config_file_and_environment_with_gfd_precedence() {
    let node = Node::new("a100-mig");
    let sysfs = fake_sysfs(&node, "a100-mig");
    let config = node.dir.path().join("config.yaml");
    std::fs::write(
        &config,
        "version: v1\nflags:\n  migStrategy: mixed\n  gfd:\n    noTimestamp: true\n    oneshot: true\n    outputFile: \"\"\nsharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/mig-1g.10gb\n      replicas: 3\n",
    )
    .unwrap();
    // The config file through CONFIG_FILE: mixed strategy and time-slicing of one profile.
    let mut cmd = labeller(&node, &sysfs, &[]);
    cmd.env("CONFIG_FILE", &config);
    let labels = parse_labels(&stdout_ok(&cmd.output().unwrap()));
    assert_eq!(labels["nvidia.com/mig.strategy"], "mixed");
    assert_eq!(
        labels["nvidia.com/mig-1g.10gb.product"],
        "NVIDIA-A100-SXM4-80GB-MIG-1g.10gb-SHARED"
    );
    assert_eq!(labels["nvidia.com/mig-1g.10gb.replicas"], "3");
    assert!(!labels.contains_key("nvidia.com/gfd.timestamp"));

    // GFD_MIG_STRATEGY beats the file; the flag beats the environment.
    let mut cmd = labeller(&node, &sysfs, &["--config-file", config.to_str().unwrap()]);
    cmd.env("GFD_MIG_STRATEGY", "single");
    let labels = parse_labels(&stdout_ok(&cmd.output().unwrap()));
    assert_eq!(labels["nvidia.com/mig.strategy"], "single");
    assert_eq!(
        labels["nvidia.com/gpu.product"],
        "NVIDIA-A100-SXM4-80GB-MIG-INVALID"
    );
    let mut cmd = labeller(
        &node,
        &sysfs,
        &[
            "--config-file",
            config.to_str().unwrap(),
            "--mig-strategy",
            "none",
        ],
    );
    cmd.env("GFD_MIG_STRATEGY", "single");
    let labels = parse_labels(&stdout_ok(&cmd.output().unwrap()));
    assert!(!labels.contains_key("nvidia.com/mig.strategy"));
}

#[test]
fn bad_config_exits_65_naming_file_field_and_value() {
    let node = Node::new("dgx-h100");
    let sysfs = fake_sysfs(&node, "dgx-h100");
    let config = node.dir.path().join("config.yaml");
    std::fs::write(
        &config,
        "sharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 1\n",
    )
    .unwrap();
    let out = labeller(
        &node,
        &sysfs,
        &["--oneshot", "--config-file", config.to_str().unwrap()],
    )
    .output()
    .unwrap();
    assert_eq!(out.status.code(), Some(65));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        format!(
            "gpud: {}: field sharing.timeSlicing.resources[0].replicas: invalid value \"1\": must be at least 2\n",
            config.display()
        )
    );

    let mut cmd = labeller(&node, &sysfs, &["--oneshot"]);
    cmd.env("GFD_SLEEP_INTERVAL", "often");
    let out = cmd.output().unwrap();
    assert_eq!(out.status.code(), Some(65));
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .starts_with("gpud: environment variable GFD_SLEEP_INTERVAL: field flags.gfd.sleepInterval: invalid value \"often\""),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let out = labeller(&node, &sysfs, &["--mig-strategy", "both"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--mig-strategy"));
}

#[test]
fn without_nvml_fails_unless_fail_on_init_error_is_false() {
    let node = Node::new("dgx-h100");
    let sysfs = fake_sysfs(&node, "dgx-h100");
    let out = labeller(
        &node,
        &sysfs,
        &[
            "--oneshot",
            "-o",
            "-",
            "--nvml-lib",
            "/nonexistent/libnvidia-ml.so.1",
        ],
    )
    .output()
    .unwrap();
    assert_eq!(out.status.code(), Some(69));
    let out = labeller(
        &node,
        &sysfs,
        &[
            "--oneshot",
            "-o",
            "-",
            "--nvml-lib",
            "/nonexistent/libnvidia-ml.so.1",
            "--fail-on-init-error=false",
        ],
    )
    .output()
    .unwrap();
    let labels = parse_labels(&stdout_ok(&out));
    assert_eq!(
        labels.keys().collect::<Vec<_>>(),
        ["nvidia.com/gfd.timestamp"]
    );
}

#[test]
fn gpu_mode_is_unknown_without_sysfs() {
    let node = Node::new("dgx-h100");
    let empty = node.dir.path().join("no-sys");
    std::fs::create_dir_all(&empty).unwrap();
    let text = stdout_ok(
        &labeller(&node, &empty, &["--oneshot", "-o", "-"])
            .output()
            .unwrap(),
    );
    let labels = parse_labels(&text);
    assert_eq!(labels["nvidia.com/gpu.mode"], "unknown");
    assert_eq!(labels["nvidia.com/vgpu.present"], "false");
}

/// The vGPU labels of a one-shot run on `fixture` whose first GPU has `config` as its
/// configuration space; with the run's stderr.
fn vgpu_run(fixture: &str, config: &[u8]) -> (Vec<String>, String) {
    let node = Node::new(fixture);
    let sysfs = fake_sysfs(&node, fixture);
    let first = std::fs::read_dir(sysfs.join("bus/pci/devices"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| std::fs::read_to_string(p.join("vendor")).unwrap() == "0x10de\n")
        .min()
        .unwrap();
    std::fs::write(first.join("config"), config).unwrap();
    let out = labeller(&node, &sysfs, &["--oneshot", "--no-timestamp", "-o", "-"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let vgpu = parse_labels(&stdout_ok(&out))
        .into_iter()
        .filter(|(k, _)| k.starts_with("nvidia.com/vgpu."))
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    (vgpu, stderr)
}

#[test]
fn vgpu_labels_from_the_pci_configuration_space() {
    // A guest whose GPU is a vGPU: the host's vGPU manager driver from the capability.
    let (labels, stderr) = vgpu_run("pcie-4gpu", &config_space(Some(("550.90.05", "r550_00"))));
    assert_eq!(
        labels,
        [
            "nvidia.com/vgpu.host-driver-branch=r550_00",
            "nvidia.com/vgpu.host-driver-version=550.90.05",
            "nvidia.com/vgpu.present=true",
        ],
        "{stderr}"
    );
    assert!(!stderr.contains("vGPU"), "{stderr}");

    // Physical GPUs only.
    let (labels, stderr) = vgpu_run("pcie-4gpu", &config_space(None));
    assert_eq!(labels, ["nvidia.com/vgpu.present=false"]);
    assert!(!stderr.contains("vGPU"), "{stderr}");

    // Without privilege sysfs gives 64 bytes: false, and a warning naming the device.
    let (labels, stderr) = vgpu_run("pcie-4gpu", &config_space(None)[..64]);
    assert_eq!(labels, ["nvidia.com/vgpu.present=false"]);
    assert!(
        stderr.contains(
            "Cannot read the vGPU capability, so nvidia.com/vgpu.present is false: PCI device \
             0000:1b:00.0: only 64 bytes of PCI configuration space readable, 256 needed"
        ),
        "{stderr}"
    );
}

/// Waits until `path` holds labels for which `done` holds; returns them.
fn wait_for(
    path: &Path,
    secs: u64,
    done: impl Fn(&BTreeMap<String, String>) -> bool,
) -> BTreeMap<String, String> {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Ok(text) = std::fs::read_to_string(path) {
            let labels = parse_labels(&text);
            if done(&labels) {
                return labels;
            }
        }
        assert!(
            Instant::now() < deadline,
            "condition not met within {secs}s in {}",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn spawn(mut cmd: Command) -> std::process::Child {
    cmd.stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn stop(child: std::process::Child) -> (Option<i32>, String) {
    send_signal(&child, "TERM");
    let output = child.wait_with_output().unwrap();
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn concurrent_reader_never_sees_a_partial_file_and_exit_removes_it() {
    let node = Node::new("dgx-h100");
    let sysfs = fake_sysfs(&node, "dgx-h100");
    let out = node.dir.path().join("gfd");
    // Every 5 ms the interval passes: a rescan and a rewrite.
    let child = spawn(labeller(
        &node,
        &sysfs,
        &["--sleep-interval", "5ms", "-o", out.to_str().unwrap()],
    ));
    let first = wait_for(&out, 20, |l| l.contains_key("nvidia.com/gpu.product"));
    let expected = std::fs::read_to_string(&out).unwrap();
    assert_eq!(parse_labels(&expected), first);

    use std::os::unix::fs::MetadataExt;
    // Each rewrite is a new file: (inode, mtime) identifies a version even when the file
    // system reuses the inode number of the one it replaced.
    let mut versions = std::collections::BTreeSet::new();
    let (mut reads, deadline) = (0u32, Instant::now() + Duration::from_secs(3));
    while Instant::now() < deadline {
        let meta = std::fs::metadata(&out).unwrap();
        let version = (meta.ino(), meta.mtime(), meta.mtime_nsec());
        let seen = std::fs::read_to_string(&out).unwrap();
        // The timestamp is fixed for the run, so every complete version is identical.
        assert_eq!(
            seen, expected,
            "partial or different file after {reads} reads"
        );
        versions.insert(version);
        reads += 1;
    }
    assert!(
        versions.len() >= 10,
        "the file was replaced only {} times",
        versions.len()
    );
    let leftovers: Vec<_> = std::fs::read_dir(node.dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".tmp"))
        .collect();
    assert!(leftovers.len() <= 1, "temporary files left: {leftovers:?}");

    let (code, stderr) = stop(child);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        !out.exists(),
        "a looping labeller removes its file on a clean exit"
    );
}

#[test]
fn relabels_when_the_inventory_changes_not_only_on_the_timer() {
    let node = Node::new("dgx-h100");
    let sysfs = fake_sysfs(&node, "dgx-h100");
    let out = node.dir.path().join("gfd");
    let child = spawn(labeller(
        &node,
        &sysfs,
        &[
            "--sleep-interval",
            "1h",
            "--rescan-interval",
            "100ms",
            "-o",
            out.to_str().unwrap(),
        ],
    ));
    let before = wait_for(&out, 20, |l| {
        l.get("gpud.io/gpu.healthy").map(String::as_str) == Some("8")
    });
    node.inject("lost 3");
    let after = wait_for(&out, 20, |l| {
        l.get("gpud.io/gpu.unhealthy").map(String::as_str) == Some("1")
    });
    assert_eq!(after["gpud.io/gpu.health"], "unhealthy");
    assert_eq!(after["gpud.io/gpu.healthy"], "7");
    // GFD's labels and the run's timestamp are unchanged.
    assert_eq!(after["nvidia.com/gpu.count"], "8");
    assert_eq!(
        after["nvidia.com/gfd.timestamp"],
        before["nvidia.com/gfd.timestamp"]
    );
    node.inject("recover 3");
    wait_for(&out, 20, |l| {
        l.get("gpud.io/gpu.health").map(String::as_str) == Some("healthy")
    });
    let (code, stderr) = stop(child);
    assert_eq!(code, Some(0), "{stderr}");
}

#[test]
fn health_labels_follow_xids_from_the_health_watcher() {
    let node = Node::new("dgx-h100");
    let sysfs = fake_sysfs(&node, "dgx-h100");
    let out = node.dir.path().join("gfd");
    // The rescan is an hour away: only the in-process health watcher can see an XID.
    let child = spawn(labeller(
        &node,
        &sysfs,
        &[
            "--sleep-interval",
            "1h",
            "--rescan-interval",
            "1h",
            "--kmsg",
            "",
            "--health-poll-interval",
            "50ms",
            "-o",
            out.to_str().unwrap(),
        ],
    ));
    wait_for(&out, 20, |l| {
        l.get("gpud.io/gpu.healthy").map(String::as_str) == Some("8")
    });
    node.inject("xid 5 79");
    let after = wait_for(&out, 20, |l| {
        l.get("gpud.io/gpu.unhealthy").map(String::as_str) == Some("1")
    });
    assert_eq!(after["gpud.io/gpu.health"], "unhealthy");
    assert_eq!(after["gpud.io/gpu.healthy"], "7");
    assert_eq!(after["nvidia.com/gpu.count"], "8");
    let (code, stderr) = stop(child);
    assert_eq!(code, Some(0), "{stderr}");
}

#[test]
fn sighup_reloads_the_config_and_keeps_the_old_one_when_bad() {
    let node = Node::new("a100-mig");
    let sysfs = fake_sysfs(&node, "a100-mig");
    let out = node.dir.path().join("gfd");
    let config = node.dir.path().join("config.yaml");
    std::fs::write(&config, "flags:\n  migStrategy: none\n").unwrap();
    let mut gpud = common::Running::spawn(labeller(
        &node,
        &sysfs,
        &[
            "--sleep-interval",
            "infinite",
            "--config-file",
            config.to_str().unwrap(),
            "-o",
            out.to_str().unwrap(),
        ],
    ));
    wait_for(&out, 20, |l| l.get("nvidia.com/gpu.product").is_some());
    assert!(!std::fs::read_to_string(&out).unwrap().contains("mig-"));

    std::fs::write(&config, "flags:\n  migStrategy: mixed\n").unwrap();
    send_signal(&gpud.child, "HUP");
    let mixed = wait_for(&out, 20, |l| l.contains_key("nvidia.com/mig-3g.40gb.count"));
    assert_eq!(mixed["nvidia.com/mig.strategy"], "mixed");

    std::fs::write(&config, "flags:\n  migStrategy: sometimes\n").unwrap();
    send_signal(&gpud.child, "HUP");
    // The refusal is logged once the reload is decided, with the labeller given nothing new:
    // the labels it would have rewritten are the ones to compare now.
    wait_until(20, "the bad reload refused", || {
        gpud.stderr()
            .contains("Configuration not reloaded; keeping the running one")
    });
    let still = parse_labels(&std::fs::read_to_string(&out).unwrap());
    assert_eq!(still, mixed, "a bad reload keeps the previous labels");

    send_signal(&gpud.child, "TERM");
    let code = gpud.child.wait().unwrap().code();
    let stderr = gpud.stderr();
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stderr.contains("flags.migStrategy"), "{stderr}");
    assert!(
        out.exists(),
        "an infinite-sleep labeller leaves its file, as GFD does"
    );
}

// === the API sinks against a fake API server ===

#[test]
fn node_sink_patches_owned_labels_and_keeps_foreign_ones() {
    let api = FakeApi::start(json!({
        "kubernetes.io/hostname": "test-node",
        "nvidia.com/device-plugin.config": "a100-shared",
        "nvidia.com/gpu.product": "stale-from-an-old-gfd",
    }));
    let node = Node::new("a100-mig");
    let sysfs = fake_sysfs(&node, "a100-mig");
    let kubeconfig = api.kubeconfig(node.dir.path());
    let run = |strategy: &str| {
        let output = labeller(
            &node,
            &sysfs,
            &[
                "--oneshot",
                "--no-timestamp",
                "--sink",
                "node",
                "--kubeconfig",
                kubeconfig.to_str().unwrap(),
                "--mig-strategy",
                strategy,
            ],
        )
        .output()
        .unwrap();
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        assert!(
            output.stdout.is_empty(),
            "the node sink alone writes no file or stdout"
        );
    };

    run("mixed");
    let expected: BTreeMap<String, String> = {
        let node = Node::new("a100-mig");
        let sysfs = fake_sysfs(&node, "a100-mig");
        let text = stdout_ok(
            &labeller(
                &node,
                &sysfs,
                &[
                    "--oneshot",
                    "--no-timestamp",
                    "--mig-strategy",
                    "mixed",
                    "-o",
                    "-",
                ],
            )
            .output()
            .unwrap(),
        );
        parse_labels(&text)
    };
    {
        let state = api.state.lock().unwrap();
        assert_eq!(state.patches.len(), 1);
        let (kind, body) = &state.patches[0];
        assert_eq!(kind, "application/merge-patch+json");
        let owned: Vec<&str> = expected.keys().map(String::as_str).collect();
        let mut labels = serde_json::Map::new();
        for (k, v) in &expected {
            labels.insert(k.clone(), Value::String(v.clone()));
        }
        assert_eq!(
            body,
            &json!({"metadata": {"labels": labels, "annotations": {"gpud.io/labels": owned.join(",")}}})
        );
    }
    let on_node = api.node_labels();
    assert_eq!(on_node["kubernetes.io/hostname"], "test-node");
    assert_eq!(on_node["nvidia.com/device-plugin.config"], "a100-shared");
    assert_eq!(on_node["nvidia.com/gpu.product"], "NVIDIA-A100-SXM4-80GB");
    assert_eq!(on_node["nvidia.com/mig-1g.10gb.count"], "1");

    // Switching to the none strategy removes the MIG labels it no longer produces, and only
    // those.
    run("none");
    {
        let state = api.state.lock().unwrap();
        assert_eq!(state.patches.len(), 2);
        let removed: Vec<&String> = state.patches[1].1["metadata"]["labels"]
            .as_object()
            .unwrap()
            .iter()
            .filter(|(_, v)| v.is_null())
            .map(|(k, _)| k)
            .collect();
        assert!(!removed.is_empty());
        assert!(
            removed.iter().all(|k| k.starts_with("nvidia.com/mig")),
            "{removed:?}"
        );
    }
    let on_node = api.node_labels();
    assert!(
        !on_node.keys().any(|k| k.starts_with("nvidia.com/mig-")),
        "{on_node:?}"
    );
    assert!(!on_node.contains_key("nvidia.com/mig.strategy"));
    assert_eq!(on_node["nvidia.com/device-plugin.config"], "a100-shared");
    assert_eq!(on_node["kubernetes.io/hostname"], "test-node");

    // Unchanged labels: the node is read, nothing is patched.
    run("none");
    assert_eq!(api.state.lock().unwrap().patches.len(), 2);
}

#[test]
fn node_sink_retries_with_backoff() {
    let api = FakeApi::start(json!({"kubernetes.io/hostname": "test-node"}));
    api.state.lock().unwrap().fail_next = 2;
    let node = Node::new("pcie-4gpu");
    let sysfs = fake_sysfs(&node, "pcie-4gpu");
    let kubeconfig = api.kubeconfig(node.dir.path());
    let started = Instant::now();
    let output = labeller(
        &node,
        &sysfs,
        &[
            "--oneshot",
            "--sink",
            "node",
            "--kubeconfig",
            kubeconfig.to_str().unwrap(),
        ],
    )
    .output()
    .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    // Two failed GETs, then GET + PATCH; the retries waited (0.5 s, then 1 s, plus jitter).
    let state = api.state.lock().unwrap();
    assert_eq!(state.requests, 4);
    assert_eq!(state.patches.len(), 1);
    assert!(started.elapsed() >= Duration::from_millis(1500));
    assert!(
        String::from_utf8_lossy(&output.stderr)
            .contains("Cannot write the labels to node test-node; retrying")
    );
}

#[test]
fn node_sink_refused_by_rbac_says_so_backs_off_and_converges_when_allowed() {
    let api = FakeApi::start(json!({"kubernetes.io/hostname": "test-node"}));
    let rule = api.refuse(Rule::exact(
        "PATCH",
        "/api/v1/nodes/test-node",
        Fault::Forbidden,
    ));
    let node = Node::new("pcie-4gpu");
    let sysfs = fake_sysfs(&node, "pcie-4gpu");
    let kubeconfig = api.kubeconfig(node.dir.path());
    let mut gpud = common::Running::spawn(labeller(
        &node,
        &sysfs,
        &[
            "--oneshot",
            "--no-timestamp",
            "--sink",
            "node",
            "--kubeconfig",
            kubeconfig.to_str().unwrap(),
        ],
    ));
    let refused = backed_off_refusals(&api, rule, "PATCH", "/api/v1/nodes/test-node", 403);
    api.allow_all();
    let exit = finished(&mut gpud.child);
    let log = gpud.stderr();
    assert!(exit.success(), "{exit:?}\n{log}");
    let converged = api.log().last().unwrap().at - *refused.last().unwrap();
    eprintln!("403: converged {converged:?} after the last refusal");
    // The labels are on the Node, exactly once written.
    let labels = api.node_labels();
    assert_eq!(labels["nvidia.com/gpu.count"], "4", "{labels:?}");
    assert_eq!(api.state.lock().unwrap().patches.len(), 1);
    // The error names the node and RBAC.
    assert!(
        log.contains("Cannot write the labels to node test-node; retrying"),
        "{log}"
    );
    assert!(log.contains("forbidden by RBAC"), "{log}");
    assert!(log.contains("cannot patch resource"), "{log}");
}

/// Waits until rule `rule` refused three `method` requests to `path` with `code` and their
/// answers are recorded (written just after each refusal is sent); asserts they came on the
/// backoff, not in a storm (the pauses start at 0.5 s and double; jitter adds at most a
/// quarter, so each is longer than the one before), and returns when each arrived.
fn backed_off_refusals(
    api: &FakeApi,
    rule: usize,
    method: &str,
    path: &str,
    code: u16,
) -> Vec<Instant> {
    let answered = || -> Vec<Instant> {
        api.requests_to(method, path)
            .iter()
            .filter(|r| r.status == code)
            .map(|r| r.at)
            .collect()
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while api.refused_by(rule) < 3 || answered().len() < 3 {
        assert!(Instant::now() < deadline, "three refusals: {:?}", api.log());
        std::thread::sleep(Duration::from_millis(20));
    }
    let refused = answered();
    let gaps: Vec<Duration> = refused.windows(2).map(|w| w[1] - w[0]).collect();
    eprintln!("{code}: {} refused {method}s, gaps {gaps:?}", refused.len());
    assert!(gaps[0] >= Duration::from_millis(450), "{gaps:?}");
    assert!(gaps.windows(2).all(|g| g[1] > g[0]), "{gaps:?}");
    refused
}

/// How a labeller that should finish on its own within 20 s exited.
fn finished(child: &mut std::process::Child) -> std::process::ExitStatus {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        assert!(Instant::now() < deadline, "the labeller did not finish");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn node_sink_needs_a_node_name() {
    let node = Node::new("pcie-4gpu");
    let sysfs = fake_sysfs(&node, "pcie-4gpu");
    let mut cmd = labeller(&node, &sysfs, &["--oneshot", "--sink", "node"]);
    cmd.env_remove("NODE_NAME");
    let out = cmd.output().unwrap();
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains("NODE_NAME"));
}

// === the NodeFeature sink ===

const FEATURES: &str = "/apis/nfd.k8s-sigs.io/v1alpha1/namespaces";

/// The labels a oneshot run prints for `args` (what a sink must carry).
fn printed_labels(node: &Node, sysfs: &Path, args: &[&str]) -> BTreeMap<String, String> {
    let mut all = vec!["--oneshot", "-o", "-"];
    all.extend_from_slice(args);
    parse_labels(&stdout_ok(&labeller(node, sysfs, &all).output().unwrap()))
}

/// A pod of the DaemonSet `gpu-feature-discovery`, as the API server returns it.
fn daemon_set_pod(namespace: &str, name: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": name, "namespace": namespace, "uid": "pod-uid-1",
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet",
                                 "name": "gpu-feature-discovery", "uid": "ds-uid-1",
                                 "controller": true, "blockOwnerDeletion": true}],
        },
    })
}

/// GFD's owner references for [`daemon_set_pod`].
fn gfd_owners(pod: &str) -> Value {
    json!([
        {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "gpu-feature-discovery",
         "uid": "ds-uid-1", "controller": true},
        {"apiVersion": "v1", "kind": "Pod", "name": pod, "uid": "pod-uid-1"},
    ])
}

/// Splits a request URI into its path and asserts the labeller's field manager is named.
fn path_of(uri: &str) -> &str {
    let (path, query) = uri.split_once('?').unwrap_or((uri, ""));
    assert!(
        query.split('&').any(|p| p == "fieldManager=gpud-labeller"),
        "{uri}"
    );
    path
}

fn wait_until(secs: u64, what: &str, done: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !done() {
        assert!(Instant::now() < deadline, "{what}: not within {secs}s");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn node_feature_sink_creates_updates_and_leaves_an_unchanged_object_alone() {
    let api = FakeApi::start(json!({}));
    api.state.lock().unwrap().pods.insert(
        "gpu-operator/gfd-x7k2p".into(),
        daemon_set_pod("gpu-operator", "gfd-x7k2p"),
    );
    let node = Node::new("a100-mig");
    let sysfs = fake_sysfs(&node, "a100-mig");
    let run = |strategy: &str| {
        let mut cmd = node_feature_oneshot(&node, &sysfs, &api, "gpu-operator");
        cmd.args(["--mig-strategy", strategy])
            .env("POD_NAME", "gfd-x7k2p");
        let output = cmd.output().unwrap();
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        assert!(
            output.stdout.is_empty(),
            "the NodeFeature sink alone writes no file or stdout"
        );
    };
    let mixed = printed_labels(
        &node,
        &sysfs,
        &["--no-timestamp", "--mig-strategy", "mixed"],
    );
    let none = printed_labels(&node, &sysfs, &["--no-timestamp", "--mig-strategy", "none"]);
    assert_ne!(mixed, none);

    run("mixed");
    let created = {
        let state = api.state.lock().unwrap();
        assert_eq!(state.writes.len(), 1);
        let (method, uri, body) = &state.writes[0];
        assert_eq!(method, "POST");
        assert_eq!(
            path_of(uri),
            format!("{FEATURES}/gpu-operator/nodefeatures")
        );
        assert_eq!(
            body,
            &json!({
                "apiVersion": "nfd.k8s-sigs.io/v1alpha1",
                "kind": "NodeFeature",
                "metadata": {
                    "name": "nvidia-features-for-test-node",
                    "namespace": "gpu-operator",
                    "labels": {"nfd.node.kubernetes.io/node-name": "test-node"},
                    "ownerReferences": gfd_owners("gfd-x7k2p"),
                },
                "spec": {
                    "features": {"flags": {}, "attributes": {}, "instances": {}},
                    "labels": mixed,
                },
            })
        );
        state.node_features["gpu-operator/nvidia-features-for-test-node"].clone()
    };

    // Other labels: the stored object, as read (uid, resourceVersion …), with the new spec.
    run("none");
    {
        let state = api.state.lock().unwrap();
        assert_eq!(state.writes.len(), 2);
        let (method, uri, body) = &state.writes[1];
        assert_eq!(method, "PUT");
        assert_eq!(
            path_of(uri),
            format!("{FEATURES}/gpu-operator/nodefeatures/nvidia-features-for-test-node")
        );
        let mut expected = created.clone();
        expected["spec"]["labels"] = serde_json::to_value(&none).unwrap();
        assert_eq!(body, &expected);
        assert_eq!(
            state.node_features["gpu-operator/nvidia-features-for-test-node"]["metadata"]["resourceVersion"],
            "2"
        );
    }

    // The same labels again: the pod and the object are read, nothing is written.
    let before = api.state.lock().unwrap().requests;
    run("none");
    let state = api.state.lock().unwrap();
    assert_eq!(state.writes.len(), 2);
    assert_eq!(state.requests, before + 2);
}

#[test]
fn node_feature_sink_loop_writes_on_change_only_and_keeps_the_object_on_exit() {
    let api = FakeApi::start(json!({}));
    let node = Node::new("dgx-h100");
    let sysfs = fake_sysfs(&node, "dgx-h100");
    let kubeconfig = api.kubeconfig(node.dir.path());
    // No NAMESPACE: GFD's default namespace; no POD_NAME: no owner references.
    let child = spawn(labeller(
        &node,
        &sysfs,
        &[
            "--sink",
            "node-feature",
            "--kubeconfig",
            kubeconfig.to_str().unwrap(),
            "--sleep-interval",
            "100ms",
            "--rescan-interval",
            "100ms",
        ],
    ));
    let key = "default/nvidia-features-for-test-node";
    wait_until(20, "the object is created", || {
        api.state.lock().unwrap().node_features.contains_key(key)
    });
    let (created, requests) = {
        let state = api.state.lock().unwrap();
        let body = &state.writes[0].2;
        assert_eq!(state.writes[0].0, "POST");
        assert_eq!(body["metadata"].get("ownerReferences"), None);
        assert_eq!(body["metadata"]["namespace"], "default");
        (state.node_features[key].clone(), state.requests)
    };
    let labels: BTreeMap<String, String> =
        serde_json::from_value(created["spec"]["labels"].clone()).unwrap();
    assert_eq!(labels["gpud.io/gpu.healthy"], "8");
    assert!(labels.contains_key("nvidia.com/gfd.timestamp"));

    // Every 100 ms a pass finds the labels it confirmed on the object: it neither reads nor
    // writes it again (that is every five minutes, not every pass).
    assert_eq!(api.state.lock().unwrap().writes.len(), 1);
    assert!(
        api.state.lock().unwrap().requests <= requests + 1,
        "passes with unchanged labels read the object"
    );

    node.inject("lost 3");
    wait_until(20, "the object is updated", || {
        api.state.lock().unwrap().writes.len() == 2
    });
    {
        let state = api.state.lock().unwrap();
        let (method, uri, body) = &state.writes[1];
        assert_eq!(method, "PUT");
        assert_eq!(
            path_of(uri),
            format!("{FEATURES}/default/nodefeatures/nvidia-features-for-test-node")
        );
        let mut expected = created.clone();
        let mut changed = labels.clone();
        changed.insert("gpud.io/gpu.health".into(), "unhealthy".into());
        changed.insert("gpud.io/gpu.healthy".into(), "7".into());
        changed.insert("gpud.io/gpu.unhealthy".into(), "1".into());
        expected["spec"]["labels"] = serde_json::to_value(&changed).unwrap();
        assert_eq!(body, &expected);
    }

    let (code, stderr) = stop(child);
    assert_eq!(code, Some(0), "{stderr}");
    let state = api.state.lock().unwrap();
    assert_eq!(
        state.writes.len(),
        2,
        "nothing is written or deleted on exit"
    );
    assert!(state.node_features.contains_key(key));
}

#[test]
fn node_feature_sink_retries_after_a_failure() {
    let api = FakeApi::start(json!({}));
    {
        let mut state = api.state.lock().unwrap();
        state.fail_next = 1;
        state
            .pods
            .insert("gpu/gfd-1".into(), daemon_set_pod("gpu", "gfd-1"));
    }
    let node = Node::new("pcie-4gpu");
    let sysfs = fake_sysfs(&node, "pcie-4gpu");
    let kubeconfig = api.kubeconfig(node.dir.path());
    let started = Instant::now();
    let mut cmd = labeller(
        &node,
        &sysfs,
        &[
            "--oneshot",
            "--sink",
            "node-feature",
            "--kubeconfig",
            kubeconfig.to_str().unwrap(),
        ],
    );
    cmd.env("NAMESPACE", "gpu").env("POD_NAME", "gfd-1");
    let output = cmd.output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    // The pod read fails once; after 0.5 s (plus jitter): pod, object (404), create. The
    // failure did not cost the owner references.
    let state = api.state.lock().unwrap();
    assert_eq!(state.requests, 4);
    assert_eq!(state.writes.len(), 1);
    assert_eq!(
        state.writes[0].2["metadata"]["ownerReferences"],
        gfd_owners("gfd-1")
    );
    assert!(started.elapsed() >= Duration::from_millis(500));
    assert!(
        stderr.contains(
            "Cannot write the labels to NodeFeature gpu/nvidia-features-for-test-node; retrying"
        ),
        "{stderr}"
    );
}

const STALE_FEATURE: &str = "gpu/nvidia-features-for-test-node";

/// A fake API server holding this node's NodeFeature object in namespace `gpu` with labels
/// gpud must replace, and the labels it must end up with.
fn stale_node_feature(node: &Node, sysfs: &Path) -> (FakeApi, BTreeMap<String, String>) {
    let api = FakeApi::start(json!({}));
    api.state.lock().unwrap().node_features.insert(
        STALE_FEATURE.into(),
        json!({
            "apiVersion": "nfd.k8s-sigs.io/v1alpha1", "kind": "NodeFeature",
            "metadata": {"name": "nvidia-features-for-test-node", "namespace": "gpu",
                         "uid": "nf-uid", "resourceVersion": "1",
                         "labels": {"nfd.node.kubernetes.io/node-name": "test-node"}},
            "spec": {"features": {"flags": {}, "attributes": {}, "instances": {}},
                     "labels": {"nvidia.com/gpu.count": "0"}},
        }),
    );
    let wanted = printed_labels(node, sysfs, &["--no-timestamp"]);
    (api, wanted)
}

/// `gpud labeller --oneshot --no-timestamp --sink node-feature` against `api`, in
/// `namespace`.
fn node_feature_oneshot(node: &Node, sysfs: &Path, api: &FakeApi, namespace: &str) -> Command {
    let kubeconfig = api.kubeconfig(node.dir.path());
    let mut cmd = labeller(
        node,
        sysfs,
        &[
            "--oneshot",
            "--no-timestamp",
            "--sink",
            "node-feature",
            "--kubeconfig",
            kubeconfig.to_str().unwrap(),
        ],
    );
    cmd.env("NAMESPACE", namespace);
    cmd
}

fn feature_labels(api: &FakeApi) -> BTreeMap<String, String> {
    let object = api.state.lock().unwrap().node_features[STALE_FEATURE].clone();
    serde_json::from_value(object["spec"]["labels"].clone()).unwrap()
}

#[test]
fn a_conflict_on_the_node_feature_update_reads_it_again_and_retries_at_once() {
    let node = Node::new("pcie-4gpu");
    let sysfs = fake_sysfs(&node, "pcie-4gpu");
    let (api, wanted) = stale_node_feature(&node, &sysfs);
    let object = format!("{FEATURES}/gpu/nodefeatures/nvidia-features-for-test-node");
    let rule = api.refuse(Rule::exact("PUT", &object, Fault::Conflict).times(1));
    let output = node_feature_oneshot(&node, &sysfs, &api, "gpu")
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{log}");
    assert_eq!(api.refused_by(rule), 1);
    // The refused update, then at once a fresh read and the update from it.
    let calls = api.requests_to("*", &object);
    assert_eq!(
        calls
            .iter()
            .map(|r| (r.method.as_str(), r.status))
            .collect::<Vec<_>>(),
        [("GET", 200), ("PUT", 409), ("GET", 200), ("PUT", 200)],
        "{calls:?}"
    );
    let converged = calls[3].at - calls[1].at;
    eprintln!("409 on the NodeFeature update: converged {converged:?} after the refusal");
    assert!(converged < Duration::from_millis(450), "{converged:?}");
    assert_eq!(feature_labels(&api), wanted);
    assert!(
        log.contains(
            "The NodeFeature gpu/nvidia-features-for-test-node changed while gpud wrote its \
             labels; reading it again"
        ),
        "{log}"
    );
    assert!(
        log.contains(
            "NodeFeature gpu/nvidia-features-for-test-node: 409 Conflict: Operation cannot be \
             fulfilled on nodefeatures.nfd.k8s-sigs.io \"nvidia-features-for-test-node\": the \
             object has been modified; please apply your changes to the latest version and try \
             again"
        ),
        "{log}"
    );
    // Retried at once, it landed: no failure to report.
    assert!(!log.contains("Cannot write the labels"), "{log}");
}

#[test]
fn a_node_feature_update_refused_by_rbac_says_so_backs_off_and_converges_when_allowed() {
    let node = Node::new("pcie-4gpu");
    let sysfs = fake_sysfs(&node, "pcie-4gpu");
    let (api, wanted) = stale_node_feature(&node, &sysfs);
    let object = format!("{FEATURES}/gpu/nodefeatures/nvidia-features-for-test-node");
    let rule = api.refuse(Rule::exact("PUT", &object, Fault::Forbidden));
    let mut gpud = common::Running::spawn(node_feature_oneshot(&node, &sysfs, &api, "gpu"));
    let refused = backed_off_refusals(&api, rule, "PUT", &object, 403);
    api.allow_all();
    let exit = finished(&mut gpud.child);
    let log = gpud.stderr();
    assert!(exit.success(), "{exit:?}\n{log}");
    // After the last refusal: one read and the update, which lands.
    let after: Vec<(String, u16)> = api
        .requests_to("*", &object)
        .iter()
        .filter(|r| r.at > *refused.last().unwrap())
        .map(|r| (r.method.clone(), r.status))
        .collect();
    let allowed = after
        .iter()
        .position(|r| r.1 == 200 && r.0 == "PUT")
        .unwrap();
    assert_eq!(after[allowed - 1], ("GET".to_owned(), 200), "{after:?}");
    assert_eq!(feature_labels(&api), wanted);
    assert!(
        log.contains(
            "Cannot write the labels to NodeFeature gpu/nvidia-features-for-test-node; retrying"
        ),
        "{log}"
    );
    assert!(
        log.contains(
            "NodeFeature gpu/nvidia-features-for-test-node: 403 Forbidden: \
             nodefeatures.nfd.k8s-sigs.io \"nvidia-features-for-test-node\" is forbidden: User \
             \"system:serviceaccount:gpu-operator:gpud\" cannot update resource \"nodefeatures\" \
             in API group \"nfd.k8s-sigs.io\" in the namespace \"gpu\" (forbidden by RBAC: \
             gpud's service account needs this verb on this resource; check the Role or \
             ClusterRole bound to it)"
        ),
        "{log}"
    );
}

#[test]
fn explicit_use_node_feature_api_selects_the_node_feature_sink() {
    let api = FakeApi::start(json!({}));
    let node = Node::new("pcie-4gpu");
    let sysfs = fake_sysfs(&node, "pcie-4gpu");
    let kubeconfig = api.kubeconfig(node.dir.path());
    let expected = printed_labels(&node, &sysfs, &["--no-timestamp"]);
    let config = node.dir.path().join("config.yaml");
    std::fs::write(&config, "version: v1\nflags:\n  useNodeFeatureAPI: true\n").unwrap();
    let config_off = node.dir.path().join("config-off.yaml");
    std::fs::write(
        &config_off,
        "version: v1\nflags:\n  useNodeFeatureAPI: false\n",
    )
    .unwrap();
    let run = |namespace: &str, args: &[&str], vars: &[(&str, &str)]| {
        let mut all = vec![
            "--oneshot",
            "--no-timestamp",
            "-o",
            "-",
            "--kubeconfig",
            kubeconfig.to_str().unwrap(),
        ];
        all.extend_from_slice(args);
        let mut cmd = labeller(&node, &sysfs, &all);
        cmd.env("NAMESPACE", namespace).envs(vars.iter().copied());
        let output = cmd.output().unwrap();
        assert!(
            output.status.success(),
            "{namespace}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8(output.stdout).unwrap()
    };
    let written = || -> Vec<String> {
        api.state
            .lock()
            .unwrap()
            .writes
            .iter()
            .map(|(_, _, body)| body["metadata"]["namespace"].as_str().unwrap().to_owned())
            .collect()
    };

    // GFD's default (true) alone keeps the features file, here stdout; the API is not used.
    assert_eq!(parse_labels(&run("default", &[], &[])), expected);
    // So does useNodeFeatureAPI set to false, and --sink file over an explicit true.
    let off = ["--config-file", config_off.to_str().unwrap()];
    assert_eq!(parse_labels(&run("off", &off, &[])), expected);
    let on_env = [("USE_NODE_FEATURE_API", "true")];
    assert_eq!(
        parse_labels(&run("file", &["--sink", "file"], &on_env)),
        expected
    );
    assert_eq!(api.state.lock().unwrap().requests, 0);

    // Set by the environment (either name), the config file or the flag: the NodeFeature
    // object, and nothing printed.
    assert_eq!(run("env", &[], &on_env), "");
    assert_eq!(
        run("gfd-env", &[], &[("GFD_USE_NODE_FEATURE_API", "1")]),
        ""
    );
    assert_eq!(
        run(
            "file-key",
            &["--config-file", config.to_str().unwrap()],
            &[]
        ),
        ""
    );
    assert_eq!(run("flag", &["--use-node-feature-api"], &[]), "");
    assert_eq!(written(), ["env", "gfd-env", "file-key", "flag"]);
    let state = api.state.lock().unwrap();
    for (_, _, body) in &state.writes {
        assert_eq!(
            body["spec"]["labels"],
            serde_json::to_value(&expected).unwrap()
        );
    }
}

#[test]
fn node_feature_sink_needs_a_node_name_and_a_namespace() {
    let node = Node::new("pcie-4gpu");
    let sysfs = fake_sysfs(&node, "pcie-4gpu");
    let usage = |args: &[&str], vars: &[(&str, &str)], unset: &[&str]| {
        let mut cmd = labeller(&node, &sysfs, args);
        cmd.envs(vars.iter().copied());
        for name in unset {
            cmd.env_remove(name);
        }
        let out = cmd.output().unwrap();
        assert_eq!(out.status.code(), Some(64));
        String::from_utf8(out.stderr).unwrap()
    };
    assert_eq!(
        usage(
            &["--oneshot", "--sink", "node-feature"],
            &[],
            &["NODE_NAME"]
        ),
        "gpud: --sink node-feature needs the node name (--node-name or NODE_NAME)\n"
    );
    assert_eq!(
        usage(
            &["--oneshot"],
            &[("USE_NODE_FEATURE_API", "true")],
            &["NODE_NAME"]
        ),
        "gpud: useNodeFeatureAPI (the node-feature sink) needs the node name (--node-name or NODE_NAME)\n"
    );
    assert_eq!(
        usage(
            &["--oneshot", "--sink", "node-feature", "--namespace", ""],
            &[],
            &[]
        ),
        "gpud: --sink node-feature needs the namespace (--namespace or NAMESPACE)\n"
    );
    assert_eq!(
        usage(
            &["--oneshot", "--use-node-feature-api"],
            &[("NAMESPACE", "")],
            &[]
        ),
        "gpud: useNodeFeatureAPI (the node-feature sink) needs the namespace (--namespace or NAMESPACE)\n"
    );
}

#[test]
fn a_features_file_that_cannot_be_written_is_an_error_then_retried_until_it_can() {
    let node = Node::new("pcie-4gpu");
    let sysfs = fake_sysfs(&node, "pcie-4gpu");
    // A folder where the file should be: even root cannot replace it with a file.
    let file = node.dir.path().join("gfd");
    std::fs::create_dir(&file).unwrap();
    let path = file.to_str().unwrap();
    let out = labeller(&node, &sysfs, &["--oneshot", "-o", path])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.ends_with(&format!(
            "gpud: labeller: cannot write the features file: {path}: cannot replace the file: \
             Is a directory (os error 21)\n"
        )),
        "{stderr}"
    );

    // Looping: not ready while the file cannot be written, and the labels land once it can.
    let port = common::http::free_port();
    let address = format!("127.0.0.1:{port}");
    let child = spawn(labeller(
        &node,
        &sysfs,
        &[
            "-o",
            path,
            "--sleep-interval",
            "200ms",
            "--health-address",
            &address,
        ],
    ));
    let refused = common::http::wait_for(port, "/readyz", 20, |a| a.status == 503);
    assert!(refused.body.contains("labeller"), "{}", refused.body);
    std::fs::remove_dir(&file).unwrap();
    let labels = wait_for(&file, 20, |l| l.contains_key("nvidia.com/gpu.count"));
    assert_eq!(labels["nvidia.com/gpu.count"], "4");
    common::http::wait_for(port, "/readyz", 20, |a| a.status == 200);
    let (code, stderr) = stop(child);
    assert_eq!(code, Some(0));
    assert!(
        stderr.contains("Cannot write the features file; retrying on the next pass"),
        "{stderr}"
    );
}
