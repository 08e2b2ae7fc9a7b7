//! `gpud run --remediation` end to end: the real binary on the simulated NVML, a fake kubelet
//! and a fake API server. The reset command is a script that resets the simulated GPU through
//! the control file (and logs each call), so every test asserts what was reset, when, and what
//! the kubelet, the metrics, the record and the Node show.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
#[path = "common/fake_api.rs"]
mod fake_api;
#[path = "common/fake_kubelet.rs"]
mod fake_kubelet;
#[path = "common/fake_pod_resources.rs"]
mod fake_pod_resources;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use common::http::{self, free_port};
use common::{Node, reset_command, until};
use fake_api::{FakeApi, Fault, Rule};
use fake_kubelet::{FakeKubelet, list_and_watch, next_list};
use serde_json::Value;

/// A simulated node with a reset command that resets its GPUs.
struct Site {
    node: Node,
    port: u16,
}

impl Site {
    fn new(fixture: &str) -> Site {
        let site = Site {
            node: Node::new(fixture),
            port: free_port(),
        };
        site.reset_script("");
        site
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.node.dir.path().join(rel)
    }

    /// The reset command: logs its arguments, runs `before` (a hang, a failure), then resets
    /// the GPUs named by `-i <bus id>[,<bus id>…]` through the control file.
    fn reset_script(&self, before: &str) {
        reset_command::write(&self.node, before);
    }

    /// The reset command's calls so far.
    fn resets(&self) -> Vec<String> {
        reset_command::calls(&self.node)
    }

    /// `gpud run --remediation reset …` with the exporter on this site's port, the device
    /// plugin and the labeller off unless `kubelet` is given.
    fn command(&self, kubelet: Option<&FakeKubelet>, extra: &[&str]) -> Command {
        let reset = self.path("reset.sh");
        let address = format!("127.0.0.1:{}", self.port);
        let mut args = vec![
            "run",
            "--kmsg",
            "",
            "-a",
            &address,
            "-c",
            "100",
            "--remediation-reset-command",
            reset.to_str().unwrap(),
        ];
        // Defaults a test may set otherwise: fast health polls, reset mode, no cluster budget.
        for (flag, value) in [
            ("--health-poll-interval", "50ms"),
            ("--remediation", "reset"),
            ("--remediation-max-concurrent", "0"),
        ] {
            if !extra.contains(&flag) {
                args.extend([flag, value]);
            }
        }
        let socket;
        match kubelet {
            Some(kubelet) => {
                socket = kubelet.socket();
                args.extend([
                    "--kubelet-socket",
                    socket.to_str().unwrap(),
                    "--disable",
                    "labeller",
                ]);
            }
            None => args.extend(["--disable", "device-plugin,labeller"]),
        }
        args.extend_from_slice(extra);
        let mut cmd = self.node.gpud(&args);
        cmd.env("GPUD_LOG", "info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(self.path("stderr.log")).unwrap());
        cmd
    }

    /// Starts gpud and waits until it is ready (the health watcher listens for XIDs).
    fn start(&self, kubelet: Option<&FakeKubelet>, extra: &[&str]) -> Daemon {
        let daemon = Daemon(
            self.command(kubelet, extra)
                .spawn()
                .expect("start gpud run"),
        );
        if kubelet.is_none() {
            self.wait_ready();
        }
        daemon
    }

    fn wait_ready(&self) {
        http::wait_for(self.port, "/readyz", 20, |a| a.status == 200);
    }

    /// The record of GPU `index`'s remediation once `accept` holds.
    fn record_when(&self, uuid: &str, what: &str, accept: impl Fn(&Value) -> bool) -> Value {
        self.record_within(uuid, what, 20, accept)
    }

    /// [`Site::record_when`] with its own limit, for waits that include a documented delay.
    fn record_within(
        &self,
        uuid: &str,
        what: &str,
        seconds: u64,
        accept: impl Fn(&Value) -> bool,
    ) -> Value {
        reset_command::record_when(&self.node, uuid, what, seconds, || self.log(), accept)
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.path("stderr.log")).unwrap_or_default()
    }

    /// Asserts that gpud's log has `needle`, showing the log when it has not.
    fn assert_logged(&self, needle: &str) {
        let log = self.log();
        assert!(log.contains(needle), "no {needle:?} in:\n{log}");
    }

    fn metrics_when(&self, accept: impl Fn(&str) -> bool) -> String {
        http::wait_for(self.port, "/metrics", 20, |a| accept(&a.body)).body
    }

    /// The UUID and PCI bus id of GPU `index`, from `gpud inventory`.
    fn gpu(&self, index: usize) -> (String, String) {
        let out = common::stdout_ok(&self.node.run(&["inventory"]));
        let inventory: Value = serde_json::from_str(&out).unwrap();
        let gpu = &inventory["gpus"][index];
        (
            gpu["uuid"].as_str().unwrap().to_owned(),
            gpu["pci"]["bus_id"].as_str().unwrap().to_owned(),
        )
    }
}

/// A running gpud, killed on drop.
struct Daemon(Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The phase `gpud_remediation_state` sets for GPU `uuid` in a metrics body, when it sets
/// exactly one.
fn phase_of(body: &str, uuid: &str) -> Option<String> {
    let set: Vec<&str> = body
        .lines()
        .filter(|l| l.starts_with("gpud_remediation_state{") && l.contains(uuid))
        .filter(|l| l.ends_with(" 1"))
        .collect();
    match set.as_slice() {
        [line] => line
            .split("state=\"")
            .nth(1)
            .and_then(|rest| rest.split('"').next())
            .map(str::to_owned),
        _ => None,
    }
}

/// Every device list the kubelet got from one registration, gathered in the background: each
/// list as `(device id, health)` pairs, in the order they came; the condition variable wakes
/// whoever waits for the next one.
#[derive(Clone, Default)]
struct Lists(Arc<(Mutex<Vec<DeviceList>>, Condvar)>);

/// One device list: each device's id and health.
type DeviceList = Vec<(String, String)>;

impl Lists {
    /// Registers with gpud's device plugin and gathers its lists from now on.
    #[allow(clippy::disallowed_methods)] // the kubelet's side, not a gpud subsystem: no span
    async fn gather(kubelet: &mut FakeKubelet) -> Lists {
        let registration = kubelet.next_registration(20).await;
        let mut client = kubelet.plugin(&registration.endpoint).await;
        let mut stream = list_and_watch(&mut client).await;
        let lists = Lists::default();
        let gathered = lists.clone();
        tokio::spawn(async move {
            let _client = client;
            while let Ok(Some(list)) = stream.message().await {
                let devices = list.devices.into_iter().map(|d| (d.id, d.health)).collect();
                gathered.0.0.lock().unwrap().push(devices);
                gathered.0.1.notify_all();
            }
        });
        lists
    }

    /// How many lists came so far.
    fn len(&self) -> usize {
        self.0.0.lock().unwrap().len()
    }

    /// GPU `uuid`'s health in each list from the `from`th on.
    fn health_of(&self, uuid: &str, from: usize) -> Vec<String> {
        self.0.0.lock().unwrap()[from..]
            .iter()
            .filter_map(|list| list.iter().find(|(id, _)| id == uuid))
            .map(|(_, health)| health.clone())
            .collect()
    }

    /// Waits until the latest list has GPU `uuid` with `health`.
    fn until_latest(&self, uuid: &str, health: &str, secs: u64) {
        until(&format!("GPU {uuid} {health} to the kubelet"), secs, || {
            let latest = self.health_of(uuid, 0).last().cloned();
            match latest.as_deref() == Some(health) {
                true => Ok(()),
                false => Err(format!("{:?}", self.health_of(uuid, 0))),
            }
        });
    }

    /// Asserts that no list from the `from`th on offers GPU `uuid` as `Healthy`, through the
    /// end of the next `window`: each list is checked as it arrives. An absence needs a bound;
    /// the window is several times the second in which gpud used to offer it.
    fn never_healthy_for(&self, uuid: &str, from: usize, window: Duration) {
        let deadline = Instant::now() + window;
        let (lists, arrived) = &*self.0;
        let mut lists = lists.lock().unwrap();
        loop {
            let seen: Vec<&str> = lists[from..]
                .iter()
                .filter_map(|list| list.iter().find(|(id, _)| id == uuid))
                .map(|(_, health)| health.as_str())
                .collect();
            assert!(
                !seen.contains(&"Healthy"),
                "the kubelet was offered GPU {uuid} before its fault was cleared: {seen:?}"
            );
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            lists = arrived.wait_timeout(lists, left).unwrap().0;
        }
    }
}

fn phase_is(phase: &'static str) -> impl Fn(&Value) -> bool {
    move |gpu: &Value| gpu["phase"] == phase
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_gpu_is_reset_verified_and_given_back_to_the_kubelet() {
    let site = Site::new("dgx-h100");
    let (uuid, bus_id) = site.gpu(3);
    let mut kubelet = FakeKubelet::start(site.node.dir.path()).await;
    let _gpud = site.start(Some(&kubelet), &[]);
    let registration = kubelet.next_registration(10).await;
    let mut client = kubelet.plugin(&registration.endpoint).await;
    let mut stream = list_and_watch(&mut client).await;
    let first = next_list(&mut stream, 10).await;
    assert!(first.devices.iter().all(|d| d.health == "Healthy"));

    site.node.inject("xid 3 95");
    // Withdrawn, then back: the kubelet sees GPU 3 unhealthy and then healthy again, and no
    // other GPU change.
    let mut saw_unhealthy = false;
    loop {
        let list = next_list(&mut stream, 20).await;
        let sick: Vec<&str> = list
            .devices
            .iter()
            .filter(|d| d.health != "Healthy")
            .map(|d| d.id.as_str())
            .collect();
        match sick.as_slice() {
            [id] => {
                assert_eq!(*id, uuid);
                saw_unhealthy = true;
            }
            [] if saw_unhealthy => break,
            [] => {}
            more => panic!("other GPUs were withdrawn: {more:?}"),
        }
    }
    assert_eq!(site.resets(), [format!("-i {bus_id}")]);
    let record = site.record_when(&uuid, "GPU 3 back in service", phase_is("healthy"));
    assert_eq!(record["reset_count"], 1);
    let body = site.metrics_when(|b| b.contains("gpud_remediation_duration_seconds_count 1"));
    assert!(
        body.contains("gpud_remediation_total{action=\"reset\",result=\"success\"} 1"),
        "{body}"
    );
    assert_eq!(phase_of(&body, &uuid).as_deref(), Some("healthy"), "{body}");
    let log = site.log();
    for (from, to) in [
        ("healthy", "quarantined"),
        ("quarantined", "draining"),
        ("draining", "resetting"),
        ("resetting", "verifying"),
        ("verifying", "healthy"),
    ] {
        let needle = format!("from={from} to={to}");
        assert_eq!(log.matches(&needle).count(), 1, "{needle} once in:\n{log}");
    }
}

/// Two PCIe GPUs joined by an NVLink bridge are reset as one: the sound peer is withdrawn
/// from the kubelet with the faulty GPU, drained (its own process waited for), reset by the
/// same command and given back with it; the other pair is never touched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gpu_is_reset_together_with_its_nvlink_bridged_peer() {
    let site = Site::new("pcie-4gpu");
    let (faulty, faulty_bus) = site.gpu(0);
    let (peer, peer_bus) = site.gpu(1);
    let mut kubelet = FakeKubelet::start(site.node.dir.path()).await;
    let _gpud = site.start(Some(&kubelet), &[]);
    let registration = kubelet.next_registration(10).await;
    let mut client = kubelet.plugin(&registration.endpoint).await;
    let mut stream = list_and_watch(&mut client).await;
    let first = next_list(&mut stream, 10).await;
    assert!(first.devices.iter().all(|d| d.health == "Healthy"));

    site.node.inject("process 1 4343 1024 50");
    site.node.inject("xid 0 95");
    // The kubelet sees GPU 0, then GPU 0 and its peer, withdrawn; then both back (the peer
    // let go a moment after the GPU it was held for).
    let mut withdrawn_together = false;
    loop {
        let list = next_list(&mut stream, 20).await;
        let mut sick: Vec<&str> = list
            .devices
            .iter()
            .filter(|d| d.health != "Healthy")
            .map(|d| d.id.as_str())
            .collect();
        sick.sort_unstable();
        let mut pair = [faulty.as_str(), peer.as_str()];
        pair.sort_unstable();
        if sick == pair {
            withdrawn_together = true;
        } else if sick.is_empty() && withdrawn_together {
            break;
        } else if withdrawn_together {
            assert_eq!(sick, [peer.as_str()], "withdrawn after the pair");
        } else {
            assert!(
                sick == [faulty.as_str()] || sick.is_empty(),
                "withdrawn: {sick:?}"
            );
        }
        if withdrawn_together && site.resets().is_empty() {
            // Held, not reset: the peer's own process still runs.
            let held = site.record_when(&peer, "GPU 1 held for GPU 0", phase_is("draining"));
            assert_eq!(held["leader"], faulty.as_str());
            let reason = held["held_for"].as_str().unwrap();
            assert!(reason.contains("NVLink peer"), "{reason}");
            site.record_when(&faulty, "GPU 0 waits for GPU 1's process", |g| {
                g["reason"]
                    .as_str()
                    .unwrap_or_default()
                    .contains("pid 4343")
            });
            assert!(site.resets().is_empty(), "reset under the peer's process");
            site.node.inject("process-end 1 4343");
        }
    }
    assert_eq!(site.resets(), [format!("-i {faulty_bus},{peer_bus}")]);
    let leader = site.record_when(&faulty, "GPU 0 back", phase_is("healthy"));
    assert_eq!(leader["reset_count"], 1);
    let held = site.record_when(&peer, "GPU 1 let go", phase_is("healthy"));
    assert_eq!(
        held["reset_count"], 0,
        "the peer's own reset budget is untouched"
    );
    assert!(
        held.get("leader").is_none() && held.get("held_for").is_none(),
        "{held}"
    );
    site.assert_logged("GPU remediation (held for its NVLink peer)");
}

/// An idle GPU's NVLink peer is withdrawn from the kubelet as soon as the GPU starts
/// draining, before the reset that takes it too runs, and stays withdrawn through the reset:
/// no pod can be placed on a GPU about to be reset. The reset command here waits until the
/// test lets it end, so "during the reset" is a state the test holds, not a race. The health
/// watcher polls once a minute: the hold must reach it through the inventory at once, not
/// through the record file it reads at its next poll (which used to come after the reset).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_gpus_nvlink_peer_is_withdrawn_before_and_during_the_reset() {
    let site = Site::new("pcie-4gpu");
    let release = site.path("release");
    site.reset_script(&format!(
        "while [ ! -e {} ]; do sleep 0.05; done",
        release.display()
    ));
    let (faulty, faulty_bus) = site.gpu(0);
    let (peer, peer_bus) = site.gpu(1);
    let mut kubelet = FakeKubelet::start(site.node.dir.path()).await;
    let _gpud = site.start(Some(&kubelet), &["--health-poll-interval", "1m"]);
    let lists = Lists::gather(&mut kubelet).await;
    lists.until_latest(&peer, "Healthy", 10);

    site.node.inject("xid 0 95");
    site.record_when(&faulty, "GPU 0 resetting", phase_is("resetting"));
    // The reset command runs (and waits): the peer is out of service now, to the kubelet.
    lists.until_latest(&peer, "Unhealthy", 10);
    lists.until_latest(&faulty, "Unhealthy", 10);
    let held = site.record_when(&peer, "GPU 1 reset with GPU 0", phase_is("resetting"));
    assert_eq!(held["leader"], faulty.as_str());
    // The record says resetting just before the command starts; the command logs its call.
    let call = format!("-i {faulty_bus},{peer_bus}");
    until("the reset command running", 10, || match site.resets() {
        calls if calls.is_empty() => Err("not yet".to_owned()),
        calls if calls == [call.clone()] => Ok(()),
        calls => panic!("{calls:?}"),
    });
    lists.until_latest(&peer, "Unhealthy", 1);
    // It went out before the reset began: the drain waited for the hold to be in place.
    site.assert_logged("to be withdrawn from service");

    std::fs::write(&release, "").unwrap();
    site.record_when(&faulty, "GPU 0 back", phase_is("healthy"));
    site.record_when(&peer, "GPU 1 let go", phase_is("healthy"));
    lists.until_latest(&peer, "Healthy", 20);
    lists.until_latest(&faulty, "Healthy", 20);
}

#[test]
fn a_busy_gpu_waits_for_its_process_to_end_before_the_reset() {
    let site = Site::new("dgx-h100");
    let (uuid, _) = site.gpu(2);
    let _gpud = site.start(None, &[]);
    site.node.inject("process 2 4242 1024 50");
    site.node.inject("xid 2 95");
    let record = site.record_when(&uuid, "GPU 2 draining", |g| {
        g["phase"] == "draining" && g["reason"].as_str().unwrap().contains("pid 4242")
    });
    assert_eq!(record["reset_count"], 0);
    assert!(site.resets().is_empty(), "reset under a running process");
    site.node.inject("process-end 2 4242");
    let record = site.record_when(&uuid, "GPU 2 back", phase_is("healthy"));
    assert_eq!(record["reset_count"], 1);
    assert_eq!(site.resets().len(), 1);
}

#[test]
fn a_drain_that_does_not_end_escalates_and_never_resets() {
    let site = Site::new("dgx-h100");
    let (uuid, _) = site.gpu(2);
    let _gpud = site.start(None, &["--remediation-drain-timeout", "1s"]);
    site.node.inject("process 2 4242 1024 50");
    site.node.inject("xid 2 95");
    let record = site.record_when(&uuid, "GPU 2 escalated", phase_is("escalated"));
    assert_eq!(record["escalation"], "DrainTimedOut");
    assert_eq!(
        record["reason"],
        "not drained within 1s: waiting for 1 process(es) to end (pid 4242)"
    );
    assert!(site.resets().is_empty());
    // `gpud inventory` shows it, from the daemon's record.
    let table = common::stdout_ok(&site.node.run(&["inventory", "--format", "table"]));
    let line = table
        .lines()
        .find(|l| l.starts_with("  Remediation:"))
        .unwrap_or_else(|| panic!("{table}"));
    assert!(
        line.starts_with("  Remediation: escalated since 20"),
        "{line}"
    );
    assert!(
        line.ends_with(": not drained within 1s: waiting for 1 process(es) to end (pid 4242)"),
        "{line}"
    );
    let json: Value =
        serde_json::from_str(&common::stdout_ok(&site.node.run(&["inventory"]))).unwrap();
    assert_eq!(json["gpus"][2]["remediation"]["phase"], "escalated");
    assert_eq!(json["gpus"][1].get("remediation"), None);
}

#[test]
fn reboot_asked_by_the_driver_escalates_on_the_node() {
    let site = Site::new("dgx-h100");
    let (uuid, _) = site.gpu(1);
    let api = FakeApi::start(serde_json::json!({}));
    let kubeconfig = api.kubeconfig(site.node.dir.path());
    let _gpud = site.start(None, &["--kubeconfig", kubeconfig.to_str().unwrap()]);
    site.node.inject("recovery-action 1 reboot");
    site.node.inject("xid 1 79");
    let record = site.record_when(&uuid, "GPU 1 escalated", phase_is("escalated"));
    assert_eq!(record["escalation"], "RebootRequired");
    let condition = until("the escalation on the Node", 20, || {
        api.condition("GPURemediationRequired")
            .filter(|c| c["status"] == "True")
            .ok_or_else(|| format!("{:#}", api.node()))
    });
    assert_eq!(condition["reason"], "RebootRequired");
    let message = condition["message"].as_str().unwrap();
    assert!(
        message.starts_with(&format!("GPU 1 ({uuid}): XID 79")),
        "{message}"
    );
    assert!(message.ends_with("needs a node reboot"), "{message}");
    until("the escalation's event", 20, || {
        let events = api.events();
        events
            .iter()
            .find(|e| e["reason"] == "GPURemediationRequired")
            .map(|e| assert_eq!(e["type"], "Warning"))
            .ok_or_else(|| format!("{events:#?}"))
    });
    assert!(site.resets().is_empty());
}

/// With `--remediation-reboot-command`, an escalation that asks for a reboot runs it, once
/// however many GPUs ask (the node reboots once); the escalation stays on the Node for the
/// reboot to answer.
#[test]
fn the_reboot_command_runs_once_for_the_gpus_that_ask_for_a_reboot() {
    let site = Site::new("dgx-h100");
    let (first, _) = site.gpu(1);
    let (second, _) = site.gpu(2);
    let reboots = site.path("reboots.log");
    let reboot = site.path("reboot.sh");
    std::fs::write(
        &reboot,
        format!("#!/bin/sh\necho \"$@\" >> {}\n", reboots.display()),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&reboot, std::fs::Permissions::from_mode(0o755)).unwrap();
    let command = format!("{} --now", reboot.display());
    let _gpud = site.start(None, &["--remediation-reboot-command", &command]);
    site.node.inject("xid 1 79");
    let record = site.record_when(&first, "GPU 1 escalated, reboot asked", |g| {
        g["phase"] == "escalated" && g["reboot_asked"] == true
    });
    assert_eq!(record["escalation"], "RebootRequired");
    site.metrics_when(|b| {
        b.contains("gpud_remediation_total{action=\"reboot\",result=\"success\"} 1")
    });
    assert_eq!(std::fs::read_to_string(&reboots).unwrap(), "--now\n");
    // A second GPU asking for a reboot escalates too, but the node reboots once.
    site.node.inject("xid 2 79");
    site.record_when(&second, "GPU 2 escalated", phase_is("escalated"));
    site.metrics_when(|b| {
        b.contains("gpud_remediation_total{action=\"escalate\",result=\"RebootRequired\"} 2")
    });
    assert_eq!(std::fs::read_to_string(&reboots).unwrap(), "--now\n");
    assert!(site.resets().is_empty());
}

/// The budget's Leases live in the API server: while it does not answer, a drained GPU waits
/// for a slot and is never reset; when it answers again the slot is taken and the GPU reset.
#[test]
fn with_the_api_server_down_a_drained_gpu_waits_for_its_slot_and_is_not_reset() {
    let site = Site::new("dgx-h100");
    let (uuid, _) = site.gpu(3);
    let mut api = FakeApi::start(serde_json::json!({}));
    let kubeconfig = api.kubeconfig(site.node.dir.path());
    let mut cmd = site.command(
        None,
        &[
            "--kubeconfig",
            kubeconfig.to_str().unwrap(),
            "--remediation-max-concurrent",
            "1",
            "--remediation-lease-duration",
            "2s",
        ],
    );
    cmd.env("NODE_NAME", "node-a");
    let _gpud = Daemon(cmd.spawn().unwrap());
    site.wait_ready();
    api.stop();
    site.node.inject("xid 3 95");
    site.record_when(&uuid, "GPU 3 waiting for a slot", |g| {
        g["phase"] == "draining"
            && g["reason"]
                .as_str()
                .unwrap_or_default()
                .starts_with("idle; waiting for a remediation slot")
    });
    until("the budget's warning", 20, || {
        let log = site.log();
        log.contains("Cannot take a remediation slot: no GPU is reset until the API server answers")
            .then_some(())
            .ok_or(log)
    });
    assert!(site.resets().is_empty(), "reset without a slot");
    api.restart();
    // The process's reachability gate sends its next probe at a random point of a window
    // that doubled with every failed probe while the server was away (1, 2, 4, 8, 16 s …, at
    // most GATE_MAX, 64 s): the slot, and so the reset, can come that long after the restart.
    site.record_within(&uuid, "GPU 3 back", 70, phase_is("healthy"));
    assert_eq!(site.resets().len(), 1);
    let lease = &api.leases()["gpud/gpud-remediation-0"];
    let writes = api.lease_writes();
    assert!(
        writes.iter().any(|w| w.holder() == Some("node-a")),
        "{writes:?} {lease:#}"
    );
    site.assert_logged("The API server answers again");
}

/// A reset GPU must pass the doctor's checks of it before it goes back: an NVLink that stayed
/// down (a degradation the health verdict tolerates, a failure for the doctor) keeps it out
/// and escalates, naming the check; the user's verify command then never runs.
#[test]
fn a_reset_gpu_that_fails_the_doctors_checks_is_escalated_not_given_back() {
    let site = Site::new("dgx-h100");
    let (uuid, _) = site.gpu(4);
    let verified = site.path("verified");
    let verify = format!("touch {}", verified.display());
    let _gpud = site.start(None, &["--remediation-verify-command", &verify]);
    site.node.inject("nvlink-down 4 2");
    site.node.inject("xid 4 95");
    let record = site.record_when(&uuid, "GPU 4 escalated", phase_is("escalated"));
    assert_eq!(record["escalation"], "ResetFailed");
    assert_eq!(
        record["reason"],
        "reset, but the doctor's checks fail: gpu.nvlink: GPU 4: NVLink 2 down"
    );
    assert_eq!(record["reset_count"], 1);
    assert!(
        !verified.exists(),
        "the verify command ran after a failed check"
    );
    site.metrics_when(|b| {
        b.contains("gpud_remediation_total{action=\"verify\",result=\"failed\"} 1")
    });

    // A GPU that passes them runs the verify command and goes back.
    let (other, _) = site.gpu(5);
    site.node.inject("xid 5 95");
    site.record_when(&other, "GPU 5 back", phase_is("healthy"));
    assert!(verified.exists(), "the verify command did not run");
    // GPU 4's verdict is only degraded now (the reset cleared its XID), yet it stays out:
    // held until a reboot, not given back by its verdict.
    let record = site.record_when(&uuid, "GPU 4 still escalated", phase_is("escalated"));
    assert_eq!(
        record["held_for"],
        "it failed its checks after gpud reset it; it returns to service after the node reboots"
    );
    assert!(
        !site.log().contains("from=escalated to=healthy"),
        "{}",
        site.log()
    );
    site.metrics_when(|b| {
        b.contains("gpud_remediation_total{action=\"verify\",result=\"success\"} 1")
    });
}

#[test]
fn a_failing_reset_escalates_and_a_gpu_that_keeps_failing_is_suspected_hardware() {
    let site = Site::new("dgx-h100");
    let (uuid, _) = site.gpu(4);
    let _gpud = site.start(None, &["--remediation-max-resets", "2"]);
    // Two faults, two resets that work.
    for n in 1..=2 {
        site.node.inject("xid 4 95");
        site.record_when(&uuid, "GPU 4 back", |g| {
            g["phase"] == "healthy" && g["reset_count"] == n
        });
    }
    // The third within the window: no third reset.
    site.node.inject("xid 4 95");
    let record = site.record_when(&uuid, "GPU 4 escalated", phase_is("escalated"));
    assert_eq!(record["escalation"], "HardwareSuspected");
    assert!(
        record["reason"]
            .as_str()
            .unwrap()
            .starts_with("reset 2 times within 1day"),
        "{record}"
    );
    assert_eq!(site.resets().len(), 2);

    // A reset command that fails escalates at once.
    let (other, _) = site.gpu(5);
    site.reset_script("echo 'Unable to reset this GPU because it is in use' >&2; exit 255");
    site.node.inject("xid 5 95");
    let record = site.record_when(&other, "GPU 5 escalated", phase_is("escalated"));
    assert_eq!(record["escalation"], "ResetFailed");
    let reason = record["reason"].as_str().unwrap();
    assert!(
        reason
            .ends_with("failed (exit status: 255: Unable to reset this GPU because it is in use)"),
        "{reason}"
    );
    let body = site.metrics_when(|b| {
        b.contains("gpud_remediation_total{action=\"reset\",result=\"failed\"} 1")
    });
    assert!(
        body.contains("gpud_remediation_total{action=\"escalate\",result=\"HardwareSuspected\"} 1"),
        "{body}"
    );
    assert!(
        body.contains("gpud_remediation_total{action=\"escalate\",result=\"ResetFailed\"} 1"),
        "{body}"
    );
}

#[test]
fn a_hung_reset_is_killed_at_its_timeout_and_escalates() {
    let site = Site::new("dgx-h100");
    let (uuid, _) = site.gpu(0);
    site.reset_script("sleep 600");
    let _gpud = site.start(None, &["--remediation-reset-timeout", "1s"]);
    site.node.inject("xid 0 95");
    let record = site.record_when(&uuid, "GPU 0 escalated", phase_is("escalated"));
    assert_eq!(record["escalation"], "ResetFailed");
    assert!(
        record["reason"]
            .as_str()
            .unwrap()
            .ends_with("did not finish within 1s and was killed"),
        "{record}"
    );
}

#[test]
fn a_restart_in_the_middle_of_a_reset_verifies_and_never_resets_again() {
    let site = Site::new("dgx-h100");
    let (uuid, _) = site.gpu(6);
    // The first reset resets the GPU, then hangs: gpud is killed while it runs.
    site.reset_script(&format!(
        "echo \"reset $2\" >> {}; sleep 600",
        site.node.control_path().display()
    ));
    let mut gpud = site.start(None, &[]);
    // The driver asks for the reset, so NVML shows when it happened (the recovery action
    // back to none): the restarted gpud may go on to check the GPU.
    site.node.inject("recovery-action 6 reset");
    site.node.inject("xid 6 95");
    site.record_when(&uuid, "GPU 6 resetting", phase_is("resetting"));
    // The mock has applied the reset the command wrote.
    common::file_when(&site.node.control_path(), "reset 0000", 20);
    gpud.0.kill().unwrap();
    gpud.0.wait().unwrap();
    site.reset_script("");
    let _again = site.start(None, &[]);
    let record = site.record_when(&uuid, "GPU 6 back", phase_is("healthy"));
    kill_reset_left_running(&site);
    assert_eq!(record["reset_count"], 1);
    assert_eq!(site.resets().len(), 1, "reset twice: {:?}", site.resets());
    site.assert_logged("gpud restarted while the reset ran");
}

/// The pids of the live processes whose command line has `token` (zombies are dead).
fn pids_with(token: &str) -> Vec<String> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|entry| {
            let dir = entry.path();
            let cmdline = std::fs::read(dir.join("cmdline")).unwrap_or_default();
            let live = std::fs::read_to_string(dir.join("stat")).is_ok_and(|stat| {
                stat.rsplit(')')
                    .next()
                    .is_some_and(|rest| !rest.trim_start().starts_with('Z'))
            });
            live && String::from_utf8_lossy(&cmdline).contains(token)
        })
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .collect()
}

/// Kills the reset command a killed gpud left running (the kernel ends what it started).
fn kill_reset_left_running(site: &Site) {
    let script = site.path("reset.sh");
    for pid in pids_with(script.to_str().unwrap()) {
        let _ = Command::new("kill").args(["-KILL", &pid]).status();
    }
}

/// A reset command that exits 0 without resetting the GPU (the driver still asks for a reset,
/// XID 79 is still there): the GPU is escalated and held out of service until the node
/// reboots; the kubelet never sees it `Healthy`, neither while it is checked nor after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_that_exits_0_but_leaves_the_fault_never_gives_the_gpu_back() {
    let site = Site::new("dgx-h100");
    let (uuid, _) = site.gpu(3);
    site.reset_script("exit 0");
    let mut kubelet = FakeKubelet::start(site.node.dir.path()).await;
    let _gpud = site.start(Some(&kubelet), &[]);
    let lists = Lists::gather(&mut kubelet).await;
    lists.until_latest(&uuid, "Healthy", 20);
    let from = lists.len();

    site.node.inject("recovery-action 3 reset");
    site.node.inject("xid 3 79");
    let record = site.record_when(&uuid, "GPU 3 escalated", phase_is("escalated"));
    assert_eq!(record["escalation"], "ResetFailed", "{record}");
    let held = record["held_for"].as_str().unwrap_or_default();
    assert!(held.contains("after the node reboots"), "{record}");
    assert_eq!(site.resets().len(), 1, "{:?}", site.resets());
    assert!(
        lists
            .health_of(&uuid, from)
            .iter()
            .any(|h| h == "Unhealthy"),
        "never withdrawn"
    );
    lists.never_healthy_for(&uuid, from, Duration::from_secs(3));
    site.record_when(&uuid, "GPU 3 still escalated", phase_is("escalated"));
}

/// gpud killed while a reset that never happened ran, then started again: NVML shows no
/// reset, so the GPU is held out of service (never reset again); the kubelet of the restarted
/// gpud never sees it `Healthy`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_during_a_reset_that_never_ended_keeps_the_gpu_out_of_service() {
    let site = Site::new("dgx-h100");
    let (uuid, _) = site.gpu(6);
    site.reset_script("sleep 600");
    let mut kubelet = FakeKubelet::start(site.node.dir.path()).await;
    let mut gpud = site.start(Some(&kubelet), &[]);
    let first = Lists::gather(&mut kubelet).await;
    first.until_latest(&uuid, "Healthy", 20);
    site.node.inject("xid 6 95");
    site.record_when(&uuid, "GPU 6 resetting", phase_is("resetting"));
    first.until_latest(&uuid, "Unhealthy", 20);
    until("the reset command to run", 20, || {
        match site.resets().len() {
            1 => Ok(()),
            _ => Err(site.log()),
        }
    });
    gpud.0.kill().unwrap();
    gpud.0.wait().unwrap();

    let _again = site.start(Some(&kubelet), &[]);
    let lists = Lists::gather(&mut kubelet).await;
    let record = site.record_when(&uuid, "GPU 6 held", phase_is("escalated"));
    kill_reset_left_running(&site);
    assert_eq!(record["escalation"], "ResetFailed", "{record}");
    assert!(
        record["reason"]
            .as_str()
            .unwrap_or_default()
            .contains("cannot tell whether it ended"),
        "{record}"
    );
    assert!(
        record["held_for"]
            .as_str()
            .unwrap_or_default()
            .contains("after the node reboots"),
        "{record}"
    );
    lists.until_latest(&uuid, "Unhealthy", 20);
    lists.never_healthy_for(&uuid, 0, Duration::from_secs(3));
    assert_eq!(site.resets().len(), 1, "reset again: {:?}", site.resets());
}

/// While the reset GPU is checked (here: a verify command that waits to be let go) the
/// kubelet does not have it; once every check passed it does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gpu_being_verified_is_withdrawn_until_its_checks_pass() {
    let site = Site::new("dgx-h100");
    let (uuid, _) = site.gpu(2);
    let verify = site.path("verify.sh");
    std::fs::write(
        &verify,
        format!(
            "#!/bin/sh\ntouch {started}\nwhile [ ! -e {go} ]; do sleep 0.05; done\n",
            started = site.path("verifying").display(),
            go = site.path("go").display(),
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&verify, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut kubelet = FakeKubelet::start(site.node.dir.path()).await;
    let _gpud = site.start(
        Some(&kubelet),
        &["--remediation-verify-command", verify.to_str().unwrap()],
    );
    let lists = Lists::gather(&mut kubelet).await;
    lists.until_latest(&uuid, "Healthy", 20);
    let from = lists.len();

    site.node.inject("xid 2 95");
    until("the verify command to start", 20, || {
        match site.path("verifying").exists() {
            true => Ok(()),
            false => Err(site.log()),
        }
    });
    site.record_when(&uuid, "GPU 2 verifying", phase_is("verifying"));
    lists.never_healthy_for(&uuid, from, Duration::from_secs(2));
    let before_go = lists.len();
    std::fs::write(site.path("go"), "").unwrap();
    lists.until_latest(&uuid, "Healthy", 20);
    site.record_when(&uuid, "GPU 2 back", phase_is("healthy"));
    let seen = lists.health_of(&uuid, from);
    assert_eq!(
        seen.first().map(String::as_str),
        Some("Unhealthy"),
        "{seen:?}"
    );
    assert!(
        lists.health_of(&uuid, from)[..before_go - from]
            .iter()
            .all(|h| h == "Unhealthy"),
        "{seen:?}"
    );
}

/// A reset command that writes far more to stderr than a pipe holds before it resets the GPU:
/// read while it runs, it is neither blocked nor killed, and the GPU comes back.
#[test]
fn a_reset_command_that_writes_megabytes_to_stderr_is_not_taken_for_hung() {
    let site = Site::new("dgx-h100");
    let (uuid, _) = site.gpu(1);
    site.reset_script("head -c 1000000 /dev/zero | tr '\\0' x >&2");
    let _gpud = site.start(None, &["--remediation-reset-timeout", "10s"]);
    site.node.inject("xid 1 95");
    let record = site.record_when(&uuid, "GPU 1 back", phase_is("healthy"));
    assert_eq!(record["reset_count"], 1, "{record}");
    site.metrics_when(|b| {
        b.contains("gpud_remediation_total{action=\"reset\",result=\"success\"} 1")
    });
}

/// Whether processes may be put in a PID namespace here (root); under CI they must be.
fn can_contain(test: &str) -> bool {
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0");
    !common::tool_missing(
        !root,
        &format!("{test} needs root (CI is set)"),
        &format!("skipping: {test} needs root"),
    )
}

/// A reset command that hangs after starting a child that left its session (`setsid`), and
/// that child's own child: at the timeout all of them are killed, not only the command's
/// process group.
#[test]
fn a_hung_reset_and_every_process_it_started_are_killed_at_its_timeout() {
    if !can_contain("a_hung_reset_and_every_process_it_started_are_killed_at_its_timeout") {
        return;
    }
    let site = Site::new("dgx-h100");
    let (uuid, _) = site.gpu(5);
    // A duration no other process has on its command line.
    let token = format!("900.{}", std::process::id());
    site.reset_script(&format!(
        "setsid sh -c 'sleep {token} & sleep {token}' </dev/null >/dev/null 2>&1 &\nwhile [ -z \"$(pgrep -f {token})\" ]; do sleep 0.05; done\ntouch {started}\nsleep 600",
        started = site.path("detached").display(),
    ));
    let _gpud = site.start(None, &["--remediation-reset-timeout", "2s"]);
    site.node.inject("xid 5 95");
    until("the detached child to start", 20, || {
        match site.path("detached").exists() {
            true => Ok(()),
            false => Err(site.log()),
        }
    });
    assert!(pids_with(&token).len() >= 2, "{:?}", pids_with(&token));
    let record = site.record_when(&uuid, "GPU 5 escalated", phase_is("escalated"));
    assert!(
        record["reason"]
            .as_str()
            .unwrap_or_default()
            .ends_with("did not finish within 2s and was killed"),
        "{record}"
    );
    until(
        "every process of the reset to end",
        10,
        || match pids_with(&token).as_slice() {
            [] => Ok(()),
            pids => Err(format!("still running: {pids:?}")),
        },
    );
}

#[test]
fn report_mode_decides_but_never_acts() {
    let site = Site::new("dgx-h100");
    let (uuid, _) = site.gpu(3);
    let _gpud = site.start(None, &["--remediation", "report"]);
    site.node.inject("xid 3 95");
    let record = site.record_when(&uuid, "GPU 3 reported", |g| {
        g["phase"] == "quarantined"
            && g["reason"]
                .as_str()
                .unwrap()
                .ends_with("would drain and reset it (--remediation report)")
    });
    assert_eq!(record["reset_count"], 0);
    assert!(site.resets().is_empty());
}

#[test]
fn half_the_gpus_failing_at_once_is_a_node_fault_not_eight_resets() {
    let site = Site::new("dgx-h100");
    let uuids: Vec<String> = (0..5).map(|i| site.gpu(i).0).collect();
    let _gpud = site.start(None, &[]);
    site.node
        .inject_all(&(0..5).map(|i| format!("xid {i} 95")).collect::<Vec<_>>());
    for uuid in &uuids {
        let record = site.record_when(uuid, "escalated", phase_is("escalated"));
        assert_eq!(record["escalation"], "RebootRequired");
    }
    assert!(site.resets().is_empty(), "{:?}", site.resets());
}

#[test]
fn a_missing_reset_command_is_refused_at_start() {
    let node = Node::new("dgx-h100");
    let out = node.run(&[
        "run",
        "--remediation",
        "reset",
        "--remediation-reset-command",
        "/nonexistent/nvidia-smi -r",
        "--remediation-max-concurrent",
        "0",
    ]);
    assert_eq!(out.status.code(), Some(64));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "gpud: --remediation-reset-command: \"/nonexistent/nvidia-smi\" is not an executable \
         file; install it or point the flag at the reset command, or run --remediation report\n"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_a_daemonset_the_device_plugin_container_takes_the_reset_from_the_record() {
    // Two containers, as the DaemonSet runs them: the device plugin, and the node status with
    // the remediation. They share only the state directory (and the node).
    let site = Site::new("dgx-h100");
    let (uuid, bus_id) = site.gpu(5);
    let api = FakeApi::start(serde_json::json!({}));
    let kubeconfig = api.kubeconfig(site.node.dir.path());
    let mut kubelet = FakeKubelet::start(site.node.dir.path()).await;
    let socket = kubelet.socket();
    let _plugin = Daemon(
        site.node
            .gpud(&[
                "device-plugin",
                "--kubelet-socket",
                socket.to_str().unwrap(),
                "--kmsg",
                "",
                "--health-poll-interval",
                "50ms",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let reset = site.path("reset.sh");
    let _status = Daemon(
        site.node
            .gpud(&[
                "node-status",
                "--kubeconfig",
                kubeconfig.to_str().unwrap(),
                "--kmsg",
                "",
                "--health-poll-interval",
                "50ms",
                "--remediation",
                "reset",
                "--remediation-reset-command",
                reset.to_str().unwrap(),
                "--remediation-max-concurrent",
                "0",
            ])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(site.path("stderr.log")).unwrap())
            .spawn()
            .unwrap(),
    );
    // And the exporter's container: the remediation's metrics come from the record.
    let address = format!("127.0.0.1:{}", site.port);
    let _exporter = Daemon(
        site.node
            .gpud(&[
                "exporter",
                "-a",
                &address,
                "-c",
                "100",
                "--kmsg",
                "",
                "--health-poll-interval",
                "50ms",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    site.wait_ready();
    let before = site.metrics_when(|b| b.contains("DCGM_FI_DEV_GPU_TEMP"));
    assert!(
        !before.contains("gpud_remediation"),
        "no record, no families"
    );
    let registration = kubelet.next_registration(10).await;
    let mut client = kubelet.plugin(&registration.endpoint).await;
    let mut stream = list_and_watch(&mut client).await;
    next_list(&mut stream, 10).await;
    // Both watchers must be listening before the fault.
    until("the node status up", 20, || {
        api.condition("GPUHealthy")
            .ok_or_else(|| "no GPUHealthy".to_owned())
    });
    site.node.inject("xid 5 95");
    let mut saw_unhealthy = false;
    loop {
        let list = next_list(&mut stream, 20).await;
        let sick = list
            .devices
            .iter()
            .any(|d| d.id == uuid && d.health != "Healthy");
        if sick {
            saw_unhealthy = true;
        } else if saw_unhealthy {
            break;
        }
    }
    assert_eq!(site.resets(), [format!("-i {bus_id}")]);
    site.record_when(&uuid, "GPU 5 back", phase_is("healthy"));
    // The exporter reads the counters at its next render, its health watcher the phases at
    // its next poll.
    let body = site.metrics_when(|b| {
        b.contains("gpud_remediation_duration_seconds_count 1")
            && phase_of(b, &uuid).as_deref() == Some("healthy")
    });
    assert!(
        body.contains("gpud_remediation_total{action=\"reset\",result=\"success\"} 1"),
        "{body}"
    );
    // A phase other than healthy reaches the exporter's container too.
    let (escalated, _) = site.gpu(6);
    site.node.inject("xid 6 79");
    site.metrics_when(|b| phase_of(b, &escalated).as_deref() == Some("escalated"));
}

#[test]
fn the_pods_holding_a_busy_gpu_are_evicted_and_a_disruption_budget_is_respected() {
    let site = Site::new("dgx-h100");
    let (uuid, _) = site.gpu(3);
    let socket = site.path("pod-resources.sock");
    let _pod_resources = fake_pod_resources::FakeKubelet::start(
        &socket,
        fake_pod_resources::answer(&[fake_pod_resources::Holder {
            namespace: "ml",
            pod: "train",
            container: "main",
            resource: "nvidia.com/gpu",
            ids: &[&uuid],
        }]),
    );
    let api = FakeApi::start(serde_json::json!({}));
    api.put_pod(serde_json::json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "train", "namespace": "ml", "uid": "uid-train"}}));
    let path = "/api/v1/namespaces/ml/pods/train/eviction";
    // The budget allows no disruption the first time and asks for 1 s.
    api.refuse(Rule::exact("POST", path, Fault::DisruptionBudget(1)).times(1));
    let kubeconfig = api.kubeconfig(site.node.dir.path());
    let _gpud = site.start(
        None,
        &[
            "--kubeconfig",
            kubeconfig.to_str().unwrap(),
            "--remediation-evict",
            "--remediation-pod-resources-socket",
            socket.to_str().unwrap(),
        ],
    );
    site.node.inject("process 3 4242 1024 80");
    site.node.inject("xid 3 95");
    until("the pod evicted", 20, || {
        (api.evictions() == ["ml/train"])
            .then_some(())
            .ok_or_else(|| format!("{:?}\n{}", api.evictions(), site.log()))
    });
    let tries = api.requests_to("POST", path);
    let statuses: Vec<u16> = tries.iter().map(|r| r.status).collect();
    assert_eq!(statuses, [429, 201]);
    assert!(
        tries[1].at - tries[0].at >= std::time::Duration::from_secs(1),
        "Retry-After honoured"
    );
    assert!(
        site.resets().is_empty(),
        "reset before the pod's process ended"
    );
    // The pod's container stops: its process leaves the GPU.
    site.node.inject("process-end 3 4242");
    let record = site.record_when(&uuid, "GPU 3 back", phase_is("healthy"));
    assert_eq!(record["reset_count"], 1);
    let body = site.metrics_when(|b| {
        b.contains("gpud_remediation_total{action=\"evict\",result=\"success\"} 1")
    });
    assert!(
        body.contains("gpud_remediation_total{action=\"evict\",result=\"refused\"} 1"),
        "{body}"
    );
}

/// An eviction RBAC forbids (403) is not a reason to reset: the GPU stays out of service,
/// draining under its pod's process, and never reset; `/readyz` and the log say what RBAC
/// must grant.
#[test]
fn a_forbidden_eviction_keeps_the_gpu_out_of_service_and_names_the_missing_rbac() {
    let site = Site::new("dgx-h100");
    let (uuid, _) = site.gpu(3);
    let socket = site.path("pod-resources.sock");
    let _pod_resources = fake_pod_resources::FakeKubelet::start(
        &socket,
        fake_pod_resources::answer(&[fake_pod_resources::Holder {
            namespace: "ml",
            pod: "train",
            container: "main",
            resource: "nvidia.com/gpu",
            ids: &[&uuid],
        }]),
    );
    let api = FakeApi::start(serde_json::json!({}));
    api.put_pod(serde_json::json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "train", "namespace": "ml", "uid": "uid-train"}}));
    let path = "/api/v1/namespaces/ml/pods/train/eviction";
    api.refuse(Rule::exact("POST", path, Fault::Forbidden));
    let kubeconfig = api.kubeconfig(site.node.dir.path());
    let _gpud = site.start(
        None,
        &[
            "--kubeconfig",
            kubeconfig.to_str().unwrap(),
            "--remediation-evict",
            "--remediation-pod-resources-socket",
            socket.to_str().unwrap(),
        ],
    );
    site.node.inject("process 3 4242 1024 80");
    site.node.inject("xid 3 95");
    let hint = "the eviction of pod ml/train is forbidden: gpud's service account needs the verb \
                create on the resource pods/eviction";
    let record = site.record_when(&uuid, "GPU 3 draining, its eviction forbidden", |g| {
        g["phase"] == "draining" && g["reason"].as_str().unwrap_or_default().contains(hint)
    });
    assert!(
        record["reason"]
            .as_str()
            .unwrap()
            .starts_with("waiting for 1 process(es) to end (pid 4242); "),
        "{record}"
    );
    let ready = http::wait_for(site.port, "/readyz", 20, |a| a.body.contains(hint));
    assert!(
        ready
            .body
            .contains("GPU 3 draining: waiting for 1 process(es)"),
        "{}",
        ready.body
    );
    site.assert_logged("Cannot evict a pod holding the GPU: the API server forbids it");
    site.assert_logged("pods/eviction");
    // Asked again (RBAC may be fixed), never reset meanwhile.
    until("the eviction asked again", 20, || {
        let tries = api.requests_to("POST", path);
        (tries.len() >= 2)
            .then_some(())
            .ok_or_else(|| format!("{} tries", tries.len()))
    });
    assert!(
        api.requests_to("POST", path)
            .iter()
            .all(|r| r.status == 403),
        "only refusals"
    );
    assert!(site.resets().is_empty(), "reset under the pod's process");
    assert_eq!(
        site.record_when(&uuid, "GPU 3 still draining", |_| true)["phase"],
        "draining"
    );
}

/// The escalation condition RBAC forbids writing (403): the GPU stays escalated and out of
/// service (never reset), and `/readyz` and the log say what RBAC must grant.
#[test]
fn a_forbidden_escalation_condition_is_said_on_readyz_with_the_missing_rbac() {
    let site = Site::new("dgx-h100");
    let (uuid, _) = site.gpu(1);
    let api = FakeApi::start(serde_json::json!({}));
    // Only the remediation's writes (its field manager): the node status's go through.
    api.refuse(
        Rule::prefix("PATCH", "/api/v1/nodes/", Fault::Forbidden)
            .query("fieldManager=gpud-remediation"),
    );
    let kubeconfig = api.kubeconfig(site.node.dir.path());
    let _gpud = site.start(None, &["--kubeconfig", kubeconfig.to_str().unwrap()]);
    site.node.inject("xid 1 79");
    let record = site.record_when(&uuid, "GPU 1 escalated", phase_is("escalated"));
    assert_eq!(record["escalation"], "RebootRequired");
    let hint = "the GPURemediationRequired condition cannot be written on the Node: the API \
                server forbids it: gpud's service account needs the verb patch on the resource \
                nodes/status";
    let ready = http::wait_for(site.port, "/readyz", 20, |a| a.body.contains(hint));
    assert!(ready.body.contains("GPU 1 escalated: "), "{}", ready.body);
    site.assert_logged(
        "Cannot write the GPURemediationRequired condition on the Node: the API server forbids it",
    );
    assert_eq!(api.condition("GPURemediationRequired"), None);
    assert!(site.resets().is_empty());
}

/// Three gpud processes playing three nodes against one API server, each resetting through a
/// script that logs when its reset starts and ends (in nanoseconds) to one shared file.
struct Fleet {
    api: FakeApi,
    sites: Vec<Site>,
    timeline: tempfile::NamedTempFile,
}

impl Fleet {
    fn new(hold: &str) -> Fleet {
        let api = FakeApi::start(serde_json::json!({}));
        let timeline = tempfile::NamedTempFile::new().unwrap();
        let sites: Vec<Site> = (0..3).map(|_| Site::new("dgx-h100")).collect();
        for (n, site) in sites.iter().enumerate() {
            site.reset_script(&format!(
                "echo \"start {n} $(date +%s%N)\" >> {t}\n{hold}\necho \"end {n} $(date +%s%N)\" >> {t}",
                t = timeline.path().display()
            ));
        }
        Fleet {
            api,
            sites,
            timeline,
        }
    }

    fn start(&self, n: usize) -> Daemon {
        let kubeconfig = self.api.kubeconfig(self.sites[n].node.dir.path());
        let mut cmd = self.sites[n].command(
            None,
            &[
                "--kubeconfig",
                kubeconfig.to_str().unwrap(),
                "--remediation-max-concurrent",
                "1",
                "--remediation-lease-duration",
                "2s",
            ],
        );
        cmd.env("NODE_NAME", format!("node-{n}"));
        let daemon = Daemon(cmd.spawn().unwrap());
        self.sites[n].wait_ready();
        daemon
    }

    /// `(node, start, end)` of every reset, in nanoseconds; `end` is `None` while it runs.
    fn resets(&self) -> Vec<(usize, u128, Option<u128>)> {
        let text = std::fs::read_to_string(self.timeline.path()).unwrap();
        let mut out: Vec<(usize, u128, Option<u128>)> = Vec::new();
        for line in text.lines() {
            let words: Vec<&str> = line.split(' ').collect();
            let (node, at) = (words[1].parse().unwrap(), words[2].parse().unwrap());
            match words[0] {
                "start" => out.push((node, at, None)),
                _ => out.iter_mut().rev().find(|r| r.0 == node).unwrap().2 = Some(at),
            }
        }
        out
    }
}

#[test]
fn three_nodes_with_one_slot_never_reset_at_the_same_time() {
    let fleet = Fleet::new("sleep 0.5");
    let uuids: Vec<String> = fleet.sites.iter().map(|s| s.gpu(1).0).collect();
    // Declared after the fleet: stopped before its files go.
    let _gpuds: Vec<Daemon> = (0..3).map(|n| fleet.start(n)).collect();
    for site in &fleet.sites {
        site.node.inject("xid 1 95");
    }
    for (site, uuid) in fleet.sites.iter().zip(&uuids) {
        site.record_when(uuid, "every node's GPU back", phase_is("healthy"));
    }
    let mut resets = fleet.resets();
    assert_eq!(resets.len(), 3, "{resets:?}");
    resets.sort_by_key(|r| r.1);
    for pair in resets.windows(2) {
        let (before, after) = (&pair[0], &pair[1]);
        assert!(
            before.2.unwrap() <= after.1,
            "nodes {} and {} reset at once: {resets:?}",
            before.0,
            after.0
        );
    }
    let nodes: std::collections::BTreeSet<usize> = resets.iter().map(|r| r.0).collect();
    assert_eq!(nodes.len(), 3);
    // One Lease, free again at the end.
    let leases = fleet.api.leases();
    assert_eq!(
        leases.keys().collect::<Vec<_>>(),
        ["gpud/gpud-remediation-0"]
    );
    until("the slot given back", 10, || {
        let lease = &fleet.api.leases()["gpud/gpud-remediation-0"];
        lease["spec"]["holderIdentity"]
            .is_null()
            .then_some(())
            .ok_or_else(|| format!("{lease:#}"))
    });
}

#[test]
fn a_killed_holders_slot_is_taken_only_after_its_lease_expires() {
    let fleet = Fleet::new("sleep 600");
    let uuid = fleet.sites[1].gpu(2).0;
    let mut holder = fleet.start(0);
    let _waiting = fleet.start(1);
    fleet.sites[0].node.inject("xid 2 95");
    until("node 0 resetting", 20, || {
        (fleet.resets().len() == 1)
            .then_some(())
            .ok_or_else(|| fleet.sites[0].log())
    });
    fleet.sites[1].node.inject("xid 2 95");
    fleet.sites[1].record_when(&uuid, "node 1 waiting for a slot", |g| {
        g["phase"] == "draining"
            && g["reason"]
                .as_str()
                .unwrap()
                .contains("waiting for a remediation slot")
    });
    holder.0.kill().unwrap();
    holder.0.wait().unwrap();
    let killed = std::time::Instant::now();
    until("node 1 resetting", 20, || {
        (fleet.resets().len() == 2)
            .then_some(())
            .ok_or_else(|| fleet.sites[1].log())
    });
    let waited = killed.elapsed();
    assert!(
        waited >= std::time::Duration::from_millis(1500),
        "the slot was taken {waited:?} after its holder died"
    );
    let writes = fleet.api.lease_writes();
    let holders: Vec<Option<&str>> = writes
        .iter()
        .map(|w| w.lease["spec"]["holderIdentity"].as_str())
        .collect();
    assert_eq!(holders.first(), Some(&Some("node-0")), "{holders:?}");
    assert_eq!(holders.last(), Some(&Some("node-1")), "{holders:?}");
    assert_eq!(
        fleet.resets().iter().map(|r| r.0).collect::<Vec<_>>(),
        [0, 1]
    );
}

/// GPU 4's MIG devices as `profile@start`, sorted, from `gpud inventory`.
fn mig_layout(site: &Site) -> Vec<String> {
    let out = common::stdout_ok(&site.node.run(&["inventory"]));
    let inventory: Value = serde_json::from_str(&out).unwrap();
    let mut layout: Vec<String> = inventory["gpus"][4]["mig"]["devices"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|m| {
            format!(
                "{}@{}",
                m["profile"].as_str().unwrap(),
                m["placement"]["start"]
            )
        })
        .collect();
    layout.sort();
    layout
}

/// The state directory every gpud of the site shares (`GPUD_STATE_DIR`), made as gpud makes it.
fn state_dir(site: &Site) -> PathBuf {
    use std::os::unix::fs::DirBuilderExt;
    let dir = site.path("state");
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)
        .unwrap();
    dir
}

/// Resets GPU 4 through an XID and waits until it is back in service.
fn reset_gpu_4(site: &Site, uuid: &str) {
    let _gpud = site.start(None, &[]);
    site.node.inject("xid 4 95");
    let record = site.record_when(uuid, "GPU 4 back", phase_is("healthy"));
    assert_eq!(record["reset_count"], 1);
}

#[test]
fn with_no_owner_recorded_a_reset_gpus_mig_layout_is_not_made_again() {
    let site = Site::new("h100-mig");
    let (uuid, _) = site.gpu(4);
    assert_eq!(mig_layout(&site).len(), 7);
    reset_gpu_4(&site, &uuid);
    // Nobody recorded the seven 1g.10gb devices: they could be an operator's half-made change.
    site.assert_logged("No owner of the GPU's MIG layout is recorded");
    assert_eq!(mig_layout(&site), Vec::<String>::new());
}

#[test]
fn a_reset_remakes_the_layout_the_mig_manager_recorded_not_the_one_it_found() {
    let site = Site::new("h100-mig");
    let (uuid, _) = site.gpu(4);
    let config = site.path("mig.yaml");
    let entry = |profile: &str, count: u32| {
        format!(
            "    - devices: [4]\n      mig-enabled: true\n      mig-devices:\n        \"{profile}\": {count}\n"
        )
    };
    std::fs::write(
        &config,
        format!(
            "version: v1\nmig-configs:\n  gpu4-3g:\n{}  gpu4-1g:\n{}",
            entry("3g.40gb", 2),
            entry("1g.10gb", 7)
        ),
    )
    .unwrap();
    let config = config.to_str().unwrap();
    // The MIG manager, as in its own container: it brings GPU 4 to the Node's config.
    let api = FakeApi::start(serde_json::json!({"nvidia.com/mig.config": "gpu4-3g"}));
    let kubeconfig = api.kubeconfig(site.node.dir.path());
    let mig_state = site.path("mig-state");
    let _manager = Daemon(
        site.node
            .gpud(&[
                "mig",
                "reconcile",
                "--mig-config-file",
                config,
                "--node-name",
                "test-node",
                "--kubeconfig",
                kubeconfig.to_str().unwrap(),
                "--mig-state-dir",
                mig_state.to_str().unwrap(),
                "--health-address",
                "",
            ])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(site.path("manager.log")).unwrap())
            .spawn()
            .unwrap(),
    );
    until("the MIG manager's success", 60, || {
        match api.node_labels().get("nvidia.com/mig.config.state") {
            Some(state) if state == "success" => Ok(()),
            other => Err(format!("{other:?}")),
        }
    });
    let applied = mig_layout(&site);
    assert_eq!(applied.len(), 2, "{applied:?}");
    assert!(
        applied.iter().all(|d| d.starts_with("3g.40gb@")),
        "{applied:?}"
    );
    let owners: Value = serde_json::from_str(
        &std::fs::read_to_string(state_dir(&site).join("mig-layout-owners.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(owners["gpus"][&uuid]["owner"], "mig-manager");
    assert_eq!(owners["gpus"][&uuid]["layout"].as_array().unwrap().len(), 2);
    // Someone repartitions GPU 4 behind the MIG manager's back.
    common::stdout_ok(
        &site
            .node
            .run(&["mig", "apply", "-f", config, "-c", "gpu4-1g"]),
    );
    assert_eq!(mig_layout(&site).len(), 7);
    reset_gpu_4(&site, &uuid);
    site.assert_logged("Made the GPU's MIG layout again after its reset");
    site.assert_logged("gpu_instances=2");
    assert_eq!(mig_layout(&site), applied);
}

#[test]
fn a_reset_remakes_the_mig_devices_of_the_claims_dra_dynamic_mig_prepared() {
    let site = Site::new("h100-mig");
    let (uuid, _) = site.gpu(4);
    // As a DRA plugin with dynamic MIG in another container leaves them: GPU 4 is its, and two
    // prepared claims hold MIG devices on it.
    let checkpoint = site.path("checkpoint.json");
    let device = |name: &str| {
        serde_json::json!({"requestNames": ["gpu"], "pool": "test-node", "device": name,
            "uuid": format!("MIG-{name}"), "gpuUuid": uuid, "cdiDeviceIds": []})
    };
    let claims = serde_json::json!({"version": 1, "claims": {
        "uid-a": {"namespace": "ns", "name": "a", "devices": [device("gpu-4-mig-3g40gb-9-4")]},
        "uid-b": {"namespace": "ns", "name": "b", "devices": [device("gpu-4-mig-1g10gb-19-0")]},
    }});
    std::fs::write(&checkpoint, claims.to_string()).unwrap();
    let owners = serde_json::json!({"version": 1, "gpus": {
        &uuid: {"owner": "dra-dynamic-mig", "checkpoint": checkpoint},
    }});
    std::fs::write(
        state_dir(&site).join("mig-layout-owners.json"),
        owners.to_string(),
    )
    .unwrap();
    assert_eq!(mig_layout(&site).len(), 7);
    reset_gpu_4(&site, &uuid);
    site.assert_logged("gpu_instances=2");
    assert_eq!(mig_layout(&site), ["1g.10gb@0", "3g.40gb@4"]);
}
