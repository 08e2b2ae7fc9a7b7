//! `gpud run`: the subsystems in one process over one inventory, against a fake kubelet, a
//! real HTTP scrape and the simulated node. The point of one process is that one event
//! reaches every consumer, so the tests follow an XID through all of them.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
#[path = "common/fake_kubelet.rs"]
mod fake_kubelet;

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::Node;
use common::http::{self, free_port};
use fake_kubelet::{FakeKubelet, list_and_watch, next_list};

/// A running `gpud run`, killed on drop.
struct Daemon {
    child: Child,
    port: u16,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Daemon {
    /// Sends SIGTERM and returns the exit code.
    fn stop(&mut self) -> Option<i32> {
        common::send_signal(&self.child, "TERM");
        self.child.wait().unwrap().code()
    }
}

fn command(node: &Node, kubelet: &FakeKubelet, port: u16, extra: &[&str]) -> Command {
    let socket = kubelet.socket();
    let address = format!("127.0.0.1:{port}");
    let features = features_path(node);
    let mut args = vec![
        "run",
        "--output-file",
        features.to_str().unwrap(),
        "--no-timestamp",
        "--kubelet-socket",
        socket.to_str().unwrap(),
        "--kmsg",
        "",
        "--health-poll-interval",
        "50ms",
        "-a",
        &address,
        "-c",
        "100",
    ];
    args.extend_from_slice(extra);
    node.gpud(&args)
}

fn features_path(node: &Node) -> std::path::PathBuf {
    node.dir.path().join("features.d-gfd")
}

/// The features file once `accept` holds.
fn labels_when(node: &Node, accept: impl Fn(&str) -> bool) -> String {
    let path = features_path(node);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        if accept(&text) {
            return text;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "labels never matched:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn start(node: &Node, kubelet: &FakeKubelet, extra: &[&str]) -> Daemon {
    let port = free_port();
    let child = command(node, kubelet, port, extra)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start gpud run");
    Daemon { child, port }
}

/// [`start`] with gpud's log (at `info`) in `<node>/stderr.log`, whose path it returns.
fn start_logged(
    node: &Node,
    kubelet: &FakeKubelet,
    extra: &[&str],
) -> (Daemon, std::path::PathBuf) {
    let port = free_port();
    let log_path = node.dir.path().join("stderr.log");
    let child = command(node, kubelet, port, extra)
        .env("GPUD_LOG", "info")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log_path).unwrap())
        .spawn()
        .expect("start gpud run");
    (Daemon { child, port }, log_path)
}

/// The metrics body once `accept` holds (blocking HTTP on a worker thread).
fn metrics_when(port: u16, accept: impl Fn(&str) -> bool) -> String {
    tokio::task::block_in_place(|| http::wait_for(port, "/metrics", 10, |a| accept(&a.body)).body)
}

fn lines_starting<'a>(body: &'a str, prefix: &str) -> Vec<&'a str> {
    body.lines().filter(|l| l.starts_with(prefix)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_xid_reaches_the_kubelet_the_labels_and_the_metrics() {
    let node = Node::new("dgx-h100");
    let mut kubelet = FakeKubelet::start(node.dir.path()).await;
    let daemon = start(&node, &kubelet, &[]);

    let reg = kubelet.next_registration(10).await;
    assert_eq!(reg.resource_name, "nvidia.com/gpu");
    let mut client = kubelet.plugin(&reg.endpoint).await;
    let mut stream = list_and_watch(&mut client).await;
    let list = next_list(&mut stream, 5).await;
    assert_eq!(list.devices.len(), 8);
    assert!(list.devices.iter().all(|d| d.health == "Healthy"));
    let sick_uuid = list.devices[3].id.clone();

    let body = metrics_when(daemon.port, |b| b.contains("DCGM_FI_DEV_GPU_UTIL{"));
    assert_eq!(lines_starting(&body, "DCGM_FI_DEV_GPU_UTIL{").len(), 8);
    labels_when(&node, |l| l.contains("gpud.io/gpu.healthy=8\n"));

    node.inject("xid 3 79");
    let update = next_list(&mut stream, 5).await;
    let health: Vec<(&str, &str)> = update
        .devices
        .iter()
        .map(|d| (d.id.as_str(), d.health.as_str()))
        .collect();
    for (id, state) in health {
        let expected = if id == sick_uuid {
            "Unhealthy"
        } else {
            "Healthy"
        };
        assert_eq!(state, expected, "{id}");
    }

    let body = metrics_when(daemon.port, |b| b.contains("gpud_xid_errors_total{"));
    let xids = lines_starting(&body, "gpud_xid_errors_total{");
    assert_eq!(xids.len(), 1, "{xids:?}");
    assert!(
        xids[0].contains(&format!("UUID=\"{sick_uuid}\"")) && xids[0].ends_with("xid=\"79\"} 1")
    );
    let unhealthy: Vec<&str> = lines_starting(&body, "gpud_gpu_health{")
        .into_iter()
        .filter(|l| !l.contains("state=\"healthy\"") && !l.ends_with(" 0"))
        .collect();
    assert_eq!(unhealthy.len(), 1, "{unhealthy:?}");
    assert!(
        unhealthy[0].contains("gpu=\"3\"")
            && unhealthy[0].contains("state=\"unhealthy\"")
            && unhealthy[0].ends_with(" 1")
    );

    let labels = labels_when(&node, |l| l.contains("gpud.io/gpu.unhealthy=1\n"));
    assert!(labels.contains("gpud.io/gpu.healthy=7\n"), "{labels}");
    assert!(
        labels.contains("gpud.io/gpu.health=unhealthy\n"),
        "{labels}"
    );
    // GFD's own labels keep counting the GPU: it is still there, only withdrawn.
    assert!(labels.contains("nvidia.com/gpu.count=8\n"), "{labels}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn labels_are_the_standalone_labellers() {
    for (fixture, extra) in [
        ("dgx-h100", &[][..]),
        ("a100-mig", &["--mig-strategy", "mixed"][..]),
    ] {
        let node = Node::new(fixture);
        let mut standalone = vec!["labeller", "--oneshot", "--no-timestamp", "-o", "-"];
        standalone.extend_from_slice(extra);
        let expected = common::stdout_ok(&node.run(&standalone));
        let kubelet = FakeKubelet::start(node.dir.path()).await;
        let _daemon = start(&node, &kubelet, extra);
        let written = labels_when(&node, |l| !l.is_empty());
        assert_eq!(written, expected, "{fixture}");
    }
}

/// A sysfs tree in which every GPU of `fixture` (from its inventory golden) is an NVIDIA 3D
/// controller, as on the machines the labeller goldens describe (`nvidia.com/gpu.mode=compute`).
fn compute_gpus_sysfs(node: &Node, fixture: &str) -> std::path::PathBuf {
    let golden = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/golden/inventory")
        .join(format!("{fixture}.json"));
    let inventory: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(golden).unwrap()).unwrap();
    let root = node.dir.path().join("sys");
    for gpu in inventory["gpus"].as_array().unwrap() {
        let bus = gpu["pci"]["bus_id"].as_str().unwrap();
        let dir = root
            .join("bus/pci/devices")
            .join(bus[4..].to_ascii_lowercase());
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("class"), "0x030200\n").unwrap();
        std::fs::write(dir.join("vendor"), "0x10de\n").unwrap();
    }
    root
}

/// DRA mode: with the device plugin off (another allocation path owns the GPUs), the labeller
/// still writes GFD's whole label set, byte for byte the standalone labeller's golden file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_device_plugin_the_labels_are_gfds_whole_set() {
    for (fixture, strategy) in [("dgx-h100", "none"), ("a100-mig", "mixed")] {
        let node = Node::new(fixture);
        let sysfs = compute_gpus_sysfs(&node, fixture);
        let mut kubelet = FakeKubelet::start(node.dir.path()).await;
        let (_daemon, log_path) = start_logged(
            &node,
            &kubelet,
            &[
                "--disable",
                "device-plugin",
                "--mig-strategy",
                strategy,
                "--sysfs-root",
                sysfs.to_str().unwrap(),
            ],
        );
        let written = labels_when(&node, |l| !l.is_empty());
        common::assert_golden(&format!("labeller/{fixture}.{strategy}.txt"), &written);
        assert!(
            written.contains("nvidia.com/gpu.product=")
                && written.contains("nvidia.com/gpu.count="),
            "{written}"
        );
        no_device_plugin(&log_path, &mut kubelet);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disabled_subsystems_do_not_start() {
    let node = Node::new("pcie-4gpu");
    let mut kubelet = FakeKubelet::start(node.dir.path()).await;
    let daemon = start(&node, &kubelet, &["--disable", "exporter,labeller"]);
    let reg = kubelet.next_registration(10).await;
    assert_eq!(reg.resource_name, "nvidia.com/gpu");
    // Registered means running; the exporter's port stays closed, no labels are written.
    assert!(http::get(daemon.port, "/metrics").is_err());
    assert!(!features_path(&node).exists());

    let node = Node::new("pcie-4gpu");
    let mut kubelet = FakeKubelet::start(node.dir.path()).await;
    let (daemon, log_path) = start_logged(&node, &kubelet, &["--disable", "device-plugin"]);
    let body = metrics_when(daemon.port, |b| b.contains("DCGM_FI_DEV_GPU_UTIL{"));
    assert_eq!(lines_starting(&body, "DCGM_FI_DEV_GPU_UTIL{").len(), 4);
    no_device_plugin(&log_path, &mut kubelet);
}

/// gpud's start line lists the subsystems it runs: once it is written, a device plugin that
/// is not among them is one that never registers.
fn no_device_plugin(log_path: &std::path::Path, kubelet: &mut FakeKubelet) {
    let log = logged(log_path, "gpud started", 1);
    let started = log.lines().find(|l| l.contains("gpud started")).unwrap();
    assert!(started.contains(" subsystems="), "{started}");
    assert!(!started.contains("device-plugin"), "{started}");
    assert!(kubelet.registered_already().is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_stops_cleanly() {
    let node = Node::new("pcie-4gpu");
    let mut kubelet = FakeKubelet::start(node.dir.path()).await;
    let mut daemon = start(&node, &kubelet, &[]);
    kubelet.next_registration(10).await;
    metrics_when(daemon.port, |b| b.contains("DCGM_FI_DEV_GPU_UTIL{"));
    labels_when(&node, |l| !l.is_empty());
    assert_eq!(daemon.stop(), Some(0));
    // As GFD does, a looping labeller takes its features file with it.
    assert!(!features_path(&node).exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subsystem_that_cannot_start_stops_the_daemon() {
    let node = Node::new("pcie-4gpu");
    let kubelet = FakeKubelet::start(node.dir.path()).await;
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let out = tokio::time::timeout(
        Duration::from_secs(10),
        tokio::task::spawn_blocking(move || command(&node, &kubelet, port, &[]).output()),
    )
    .await
    .expect("gpud run exits when its port is taken")
    .unwrap()
    .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "gpud: exporter: cannot listen on 127.0.0.1:{port}"
        )),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_the_plugin_and_the_labeller_and_keeps_them_when_bad() {
    let node = Node::new("a100-mig");
    let config = node.dir.path().join("config.yaml");
    std::fs::write(&config, "version: v1\nflags:\n  migStrategy: none\n").unwrap();
    let mut kubelet = FakeKubelet::start(node.dir.path()).await;
    let (daemon, log_path) = start_logged(
        &node,
        &kubelet,
        &["--config-file", config.to_str().unwrap()],
    );
    assert_eq!(
        kubelet.next_registration(10).await.resource_name,
        "nvidia.com/gpu"
    );
    labels_when(&node, |l| l.contains("nvidia.com/gpu.product="));
    assert!(!labels_when(&node, |_| true).contains("nvidia.com/mig-"));

    std::fs::write(&config, "version: v1\nflags:\n  migStrategy: mixed\n").unwrap();
    common::send_signal(&daemon.child, "HUP");
    let mut mig_resources = Vec::new();
    while let Some(reg) = kubelet.registration_within(5000).await {
        mig_resources.push(reg.resource_name);
        if mig_resources.len() == 3 {
            break;
        }
    }
    mig_resources.sort();
    assert_eq!(
        mig_resources,
        [
            "nvidia.com/mig-1g.10gb",
            "nvidia.com/mig-2g.20gb",
            "nvidia.com/mig-3g.40gb"
        ],
        "the device plugin follows the new strategy"
    );
    let mixed = labels_when(&node, |l| l.contains("nvidia.com/mig.strategy=mixed\n"));
    assert!(mixed.contains("nvidia.com/mig-3g.40gb.count="), "{mixed}");

    std::fs::write(&config, "version: v1\nflags:\n  migStrategy: sometimes\n").unwrap();
    common::send_signal(&daemon.child, "HUP");
    // The refusal is logged once the reload is decided: no subsystem was given new settings,
    // so whatever a reload would change has not changed by now.
    logged(&log_path, "Configuration not reloaded", 1);
    assert_eq!(
        labels_when(&node, |_| true),
        mixed,
        "a bad reload keeps the labels"
    );
    assert!(kubelet.registered_already().is_none(), "and the resources");
}

#[test]
fn bad_nvidia_config_exits_65_naming_the_field() {
    let node = Node::new("pcie-4gpu");
    let config = node.dir.path().join("config.yaml");
    std::fs::write(&config, "version: v1\nflags:\n  migStrategy: sometimes\n").unwrap();
    let out = node.run(&["run", "--config-file", config.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(65));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("flags.migStrategy") && stderr.contains("sometimes"),
        "{stderr}"
    );
}

/// Polls the log file until `line` appears `times` times; returns the log.
fn logged(path: &std::path::Path, line: &str, times: usize) -> String {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let log = std::fs::read_to_string(path).unwrap_or_default();
        if log.matches(line).count() >= times {
            return log;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{line:?} not logged {times} times:\n{log}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A reload, good or bad, is one log line: not one per subsystem, not a WARN and an ERROR.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_reload_outcome_is_one_log_line() {
    let node = Node::new("pcie-4gpu");
    let config = node.dir.path().join("config.yaml");
    std::fs::write(&config, "version: v1\nflags:\n  migStrategy: none\n").unwrap();
    let kubelet = FakeKubelet::start(node.dir.path()).await;
    let (daemon, log_path) = start_logged(
        &node,
        &kubelet,
        &["--config-file", config.to_str().unwrap()],
    );
    logged(&log_path, "All subsystems ready", 1);

    let changed = "version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 2\n";
    std::fs::write(&config, changed).unwrap();
    common::send_signal(&daemon.child, "HUP");
    logged(&log_path, "Configuration reloaded", 1);
    std::fs::write(&config, "version: v1\nflags:\n  migStrategy: sometimes\n").unwrap();
    common::send_signal(&daemon.child, "HUP");
    logged(&log_path, "Configuration not reloaded", 1);
    // Reloads are handled one at a time: once a third one's line is written, every line about
    // the second is too. The lines before the third's are the two reloads'.
    common::send_signal(&daemon.child, "HUP");
    let log = logged(&log_path, "Configuration not reloaded", 2);
    let third = log.rfind("Configuration not reloaded").unwrap();
    let before_third = &log[..log[..third].rfind('\n').unwrap()];
    let about_reload: Vec<&str> = before_third
        .lines()
        .filter(|l| l.to_lowercase().contains("reload") || l.contains("sometimes"))
        .collect();
    assert_eq!(about_reload.len(), 2, "{about_reload:#?}");
    assert!(
        about_reload[0].contains(" INFO Configuration reloaded trigger=\"SIGHUP\""),
        "{}",
        about_reload[0]
    );
    assert!(about_reload[1].contains(
        " WARN Configuration not reloaded; keeping the running one trigger=\"SIGHUP\" error=\
         "
    ));
    assert!(about_reload[1].ends_with(
        "config.yaml: field flags.migStrategy: invalid value \"sometimes\": must be one of none, single, mixed"
    ), "{}", about_reload[1]);
}

/// A config file over 1 MiB is refused before parsing, naming its size; one nested too deep is
/// refused at once; a huge value is quoted as a short excerpt. Each exits 65 with one short line.
#[test]
fn oversized_deep_and_long_valued_configs_exit_65_with_a_short_message() {
    let node = Node::new("pcie-4gpu");
    let config = node.dir.path().join("config.yaml");
    let run = |text: &str| {
        std::fs::write(&config, text).unwrap();
        let started = std::time::Instant::now();
        let out = node.run(&["run", "--config-file", config.to_str().unwrap()]);
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(65), "{stderr}");
        (stderr, started.elapsed())
    };
    let path = config.display();

    let (stderr, _) = run(&"x".repeat(2 * 1024 * 1024));
    assert_eq!(
        stderr,
        format!(
            "gpud: {path}: 2097152 bytes is over the 1048576-byte limit for this file; \
             refused without parsing (check that the path names the intended file)\n"
        )
    );

    let (stderr, took) = run(&format!("version: v1\nflags: {}", "[".repeat(200_000)));
    println!("200 KB of nested brackets refused in {took:?}");
    assert_eq!(
        stderr,
        format!(
            "gpud: {path}: line 2: nested 65 levels deep, over the limit of 64; refused without \
             parsing\n"
        )
    );

    let value = "v".repeat(1_000_000);
    let (stderr, _) = run(&format!("version: v1\nflags:\n  migStrategy: {value}\n"));
    assert_eq!(
        stderr,
        format!(
            "gpud: {path}: field flags.migStrategy: invalid value \"{}\"… (1000000 bytes in \
             all): must be one of none, single, mixed\n",
            "v".repeat(80)
        )
    );
    let (stderr, _) = run(&format!(
        "version: v1\nflags:\n  failOnInitError: \"{value}\"\n"
    ));
    assert!(stderr.len() < 400, "{} bytes: {stderr:.400}", stderr.len());
    assert!(
        stderr.contains(&format!("\"{}\"…", "v".repeat(80))),
        "{stderr:.400}"
    );
}

/// With `--watch-config`, a ConfigMap update (a new `..data` folder renamed into place, the
/// file a symlink through it) reloads as SIGHUP does: one log line naming the file, the new
/// sharing settings in the labels; a broken update keeps them and says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_configmap_update_reloads_with_watch_config() {
    let node = Node::new("pcie-4gpu");
    let mount = node.dir.path().join("nvidia-config");
    let publish = |version: &str, text: &str| {
        let folder = mount.join(format!("..{version}"));
        std::fs::create_dir_all(&folder).unwrap();
        std::fs::write(folder.join("config.yaml"), text).unwrap();
        let temp = mount.join("..data_tmp");
        std::os::unix::fs::symlink(format!("..{version}"), &temp).unwrap();
        std::fs::rename(&temp, mount.join("..data")).unwrap();
    };
    std::fs::create_dir_all(&mount).unwrap();
    publish("v1", "version: v1\nflags:\n  migStrategy: none\n");
    std::os::unix::fs::symlink("..data/config.yaml", mount.join("config.yaml")).unwrap();
    let config = mount.join("config.yaml");

    let kubelet = FakeKubelet::start(node.dir.path()).await;
    let log_path = node.dir.path().join("stderr.log");
    let child = command(
        &node,
        &kubelet,
        free_port(),
        &["--config-file", config.to_str().unwrap(), "--watch-config"],
    )
    .env("GPUD_LOG", "info")
    .stdout(Stdio::null())
    .stderr(std::fs::File::create(&log_path).unwrap())
    .spawn()
    .unwrap();
    let _daemon = Daemon { child, port: 0 };
    logged(&log_path, "All subsystems ready", 1);
    labels_when(&node, |l| l.contains("nvidia.com/gpu.replicas=1"));

    publish(
        "v2",
        "version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 2\n",
    );
    let log = logged(&log_path, "Configuration reloaded", 1);
    let expected = format!("trigger=\"{} changed\"", config.display());
    assert!(log.contains(&expected), "{log}");
    labels_when(&node, |l| l.contains("nvidia.com/gpu.replicas=2"));

    publish("v3", "version: v1\nflags:\n  migStrategy: sometimes\n");
    let log = logged(&log_path, "Configuration not reloaded", 1);
    assert_eq!(log.matches("Configuration reloaded").count(), 1, "{log}");
    assert!(
        log.contains("flags.migStrategy: invalid value \"sometimes\""),
        "{log}"
    );
}

/// With `--watch-config`, a config folder removed and made again (a hostPath replaced, a
/// volume remounted) ends the folder's inotify watch: gpud says so and polls the file from
/// then on, so the next change still reloads instead of going unseen until a SIGHUP.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_config_folder_made_again_is_polled_and_its_next_change_reloads() {
    let node = Node::new("pcie-4gpu");
    let folder = node.dir.path().join("nvidia-config");
    std::fs::create_dir_all(&folder).unwrap();
    let config = folder.join("config.yaml");
    std::fs::write(&config, "version: v1\nflags:\n  migStrategy: none\n").unwrap();
    let kubelet = FakeKubelet::start(node.dir.path()).await;
    let log_path = node.dir.path().join("stderr.log");
    let child = command(
        &node,
        &kubelet,
        free_port(),
        &["--config-file", config.to_str().unwrap(), "--watch-config"],
    )
    .env("GPUD_LOG", "info")
    .stdout(Stdio::null())
    .stderr(std::fs::File::create(&log_path).unwrap())
    .spawn()
    .unwrap();
    let _daemon = Daemon { child, port: 0 };
    logged(&log_path, "All subsystems ready", 1);

    std::fs::remove_dir_all(&folder).unwrap();
    logged(&log_path, "Cannot watch the config folders any more", 1);
    std::fs::create_dir_all(&folder).unwrap();
    std::fs::write(
        &config,
        "version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 2\n",
    )
    .unwrap();
    let log = logged(&log_path, "Configuration reloaded", 1);
    assert!(
        log.contains("a config folder was removed or moved"),
        "{log}"
    );
    labels_when(&node, |l| l.contains("nvidia.com/gpu.replicas=2"));
}

/// The GPUs a device list withdraws, by index in `ids` (the first list's order).
fn unhealthy(list: &gpud::proto::deviceplugin::ListAndWatchResponse, ids: &[String]) -> Vec<usize> {
    let mut sick: Vec<usize> = list
        .devices
        .iter()
        .filter(|d| d.health != "Healthy")
        .map(|d| ids.iter().position(|id| *id == d.id).unwrap())
        .collect();
    sick.sort_unstable();
    sick
}

/// Registers with the (restarted) plugin and returns its ListAndWatch stream and first list.
async fn first_list(
    kubelet: &mut FakeKubelet,
) -> (
    tonic::Streaming<gpud::proto::deviceplugin::ListAndWatchResponse>,
    gpud::proto::deviceplugin::ListAndWatchResponse,
) {
    let reg = kubelet.next_registration(10).await;
    let mut client = kubelet.plugin(&reg.endpoint).await;
    let mut stream = list_and_watch(&mut client).await;
    let list = next_list(&mut stream, 5).await;
    (stream, list)
}

/// A verdict only an XID proves survives a restart (NVML keeps no trace of an XID and the
/// kernel log is read from its end), from the very first device list, until the GPU is seen
/// reset: by the running gpud, or from what NVML says after a reset made while it was down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn xid_verdicts_survive_a_restart_until_the_gpu_is_seen_reset() {
    let node = Node::new("dgx-h100");
    let mut kubelet = FakeKubelet::start(node.dir.path()).await;
    let mut daemon = start(&node, &kubelet, &[]);
    let (mut stream, list) = first_list(&mut kubelet).await;
    let ids: Vec<String> = list.devices.iter().map(|d| d.id.clone()).collect();
    assert_eq!(unhealthy(&list, &ids), Vec::<usize>::new());
    // Fell off the bus (reboot), uncorrectable SRAM error (reset), NVLink error (no
    // recovery action from the driver).
    node.inject_all(&["xid 2 79".into(), "xid 3 119".into(), "xid 5 74".into()]);
    loop {
        let list = next_list(&mut stream, 5).await;
        if unhealthy(&list, &ids) == [2, 3, 5] {
            break;
        }
    }
    assert_eq!(daemon.stop(), Some(0));

    let mut daemon = start(&node, &kubelet, &[]);
    let (mut stream, list) = first_list(&mut kubelet).await;
    assert_eq!(
        unhealthy(&list, &ids),
        [2, 3, 5],
        "withdrawn from the first list on"
    );
    // GPU 3 is reset while gpud runs (NVML's recovery action back to none): back in service,
    // the others stay withdrawn.
    node.inject("reset 3");
    loop {
        let list = next_list(&mut stream, 5).await;
        let sick = unhealthy(&list, &ids);
        if sick != [2, 3, 5] {
            assert_eq!(sick, [2, 5]);
            break;
        }
    }
    assert_eq!(daemon.stop(), Some(0));

    // GPU 2 is reset while gpud is down: the next gpud sees it from what NVML says now.
    node.inject("reset 2");
    let _daemon = start(&node, &kubelet, &[]);
    let (_stream, list) = first_list(&mut kubelet).await;
    assert_eq!(unhealthy(&list, &ids), [5]);
    let kept = std::fs::read_to_string(node.dir.path().join("state/health/run.json")).unwrap();
    assert!(kept.contains(&ids[5]) && !kept.contains(&ids[2]), "{kept}");
}
