//! `gpud health` end to end: faults injected through the simulated driver's control file and
//! the kernel log, transitions read from the applet's JSON output.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{Node, Running, http};
use serde_json::Value;

/// `gpud health --json` on `node`, polling fast, with the given kernel log (or none).
fn watch(node: &Node, kmsg: &str, env: &[(&str, &str)]) -> Running {
    let port = http::free_port();
    let address = format!("127.0.0.1:{port}");
    let mut cmd = node.gpud(&[
        "health",
        "--json",
        "--poll-interval",
        "50ms",
        "--kmsg",
        kmsg,
        "--health-address",
        &address,
    ]);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let running = Running::spawn(cmd);
    // The watcher is ready once its event set is registered; an injection before that is a
    // fault that happened before gpud started, which the driver does not replay as an event.
    http::wait_for(port, "/readyz", 20, |a| a.status == 200);
    running
}

fn next(running: &Running) -> Value {
    serde_json::from_str(&running.next_line(10)).unwrap()
}

/// The fields that matter of a transition line.
fn summary(line: &Value) -> (u64, String, String, String, Value) {
    (
        line["gpu"].as_u64().unwrap(),
        line["from"].as_str().unwrap().to_owned(),
        line["to"]["state"].as_str().unwrap().to_owned(),
        line["to"]["reason"].as_str().unwrap_or("").to_owned(),
        line["to"]["action"].clone(),
    )
}

/// Nothing was printed since the last line: a double-bit ECC event on `gpu` (counted whatever
/// the XID policy says), injected now, makes the very next line. Events are handled in order,
/// so this proves the inputs before it were handled, without waiting out a window.
fn nothing_before_marker(node: &Node, gpud: &Running, gpu: u64) {
    node.inject(&format!("dbe {gpu}"));
    let line = next(gpud);
    assert_eq!(summary(&line).0, gpu, "a line before the marker: {line}");
    assert!(
        summary(&line)
            .3
            .starts_with("uncorrectable (double-bit) ECC error"),
        "a line before the marker: {line}"
    );
}

#[test]
fn fatal_xid_makes_the_gpu_unhealthy_until_it_is_reset() {
    let node = Node::new("dgx-h100");
    let gpud = watch(&node, "", &[]);
    node.inject("xid 3 79");
    let line = next(&gpud);
    assert_eq!(
        summary(&line),
        (
            3,
            "healthy".into(),
            "unhealthy".into(),
            "XID 79: GPU has fallen off the bus".into(),
            "drain and reboot the node".into()
        )
    );
    // The same for programs: a value, not words.
    assert_eq!(line["to"]["remedy"], "reboot_node", "{line}");
    assert_eq!(line["to"]["xid"], 79);
    assert_eq!(line["to"]["source"], "watcher");
    assert!(line["uuid"].as_str().unwrap().starts_with("GPU-"));
    assert!(line["mig"].is_null());
    // The GPU drops off and comes back: that is a reset, and it clears the fatal XID.
    node.inject("lost 3");
    let lost = next(&gpud);
    assert_eq!(
        (
            lost["gpu"].as_u64(),
            lost["to"]["reason"]
                .as_str()
                .map(|s| s.starts_with("GPU is lost"))
        ),
        (Some(3), Some(true))
    );
    node.inject("recover 3");
    let back = next(&gpud);
    assert_eq!(
        (back["gpu"].as_u64(), back["to"]["state"].as_str()),
        (Some(3), Some("healthy"))
    );
}

#[test]
fn application_xids_are_ignored_and_warnings_degrade() {
    let node = Node::new("dgx-h100");
    let gpud = watch(&node, "", &[]);
    for code in [13, 31, 43, 45, 68, 109] {
        node.inject(&format!("xid 1 {code}"));
    }
    node.inject("xid 2 63");
    let line = next(&gpud);
    assert_eq!(
        summary(&line).0,
        2,
        "the application XIDs on GPU 1 changed nothing: {line}"
    );
    assert_eq!(summary(&line).2, "degraded");
    assert!(summary(&line).3.starts_with("XID 63: "), "{line}");
    nothing_before_marker(&node, &gpud, 7);
}

#[test]
fn unknown_xid_is_critical_with_consult_the_documentation() {
    let node = Node::new("pcie-4gpu");
    let gpud = watch(&node, "", &[]);
    node.inject("xid 0 4242");
    let line = next(&gpud);
    assert_eq!(summary(&line).2, "unhealthy");
    assert_eq!(line["to"]["action"], "consult the XID documentation");
}

#[test]
fn env_overrides_behave_as_nvidias() {
    let node = Node::new("pcie-4gpu");
    let gpud = watch(
        &node,
        "",
        &[
            ("DP_DISABLE_HEALTHCHECKS", "79"),
            ("DP_ENABLE_HEALTHCHECKS", "13"),
        ],
    );
    node.inject("xid 0 79");
    node.inject("xid 1 13");
    let line = next(&gpud);
    assert_eq!(summary(&line).0, 1, "79 ignored, 13 enabled: {line}");
    assert_eq!(summary(&line).2, "unhealthy");
    nothing_before_marker(&node, &gpud, 3);

    let node = Node::new("pcie-4gpu");
    let gpud = watch(&node, "", &[("DP_DISABLE_HEALTHCHECKS", "all")]);
    node.inject("xid 0 79");
    node.inject("xid 1 48");
    // All XID checks disabled: the marker after them is the first line.
    nothing_before_marker(&node, &gpud, 3);
}

#[test]
fn double_bit_ecc_until_the_counter_resets() {
    let node = Node::new("dgx-a100");
    let gpud = watch(&node, "", &[]);
    node.inject("dbe 4");
    let line = next(&gpud);
    assert_eq!(
        summary(&line),
        (
            4,
            "healthy".into(),
            "unhealthy".into(),
            "uncorrectable (double-bit) ECC error".into(),
            "drain and reset the GPU".into()
        )
    );
    node.inject("recover 4");
    assert_eq!(summary(&next(&gpud)).2, "healthy");
}

#[test]
fn pending_row_remap_until_reset() {
    let node = Node::new("dgx-h100");
    let gpud = watch(&node, "", &[]);
    node.inject("remap-pending 6");
    let line = next(&gpud);
    assert_eq!(summary(&line).0, 6);
    assert_eq!(summary(&line).2, "unhealthy");
    assert!(
        summary(&line).3.starts_with("row remapping pending"),
        "{line}"
    );
    node.inject("recover 6");
    assert_eq!(summary(&next(&gpud)).2, "healthy");
}

#[test]
fn mig_attributed_xid_marks_only_that_instance() {
    let node = Node::new("a100-mig");
    let inventory: Value =
        serde_json::from_str(&common::stdout_ok(&node.run(&["inventory"]))).unwrap();
    let migs = inventory["gpus"][0]["mig"]["devices"]
        .as_array()
        .unwrap()
        .clone();
    let target = migs[1]["uuid"].as_str().unwrap();

    let gpud = watch(&node, "", &[]);
    node.inject(&format!("xid {target} 4242"));
    let line = next(&gpud);
    assert_eq!(line["uuid"], target);
    assert_eq!(line["mig"]["gpu_instance_id"], migs[1]["gpu_instance_id"]);
    assert_eq!(line["to"]["state"], "unhealthy");
    // The GPU and the other instances are untouched: a fault on a second instance, injected
    // now, is the next line.
    let second = migs[2]["uuid"].as_str().unwrap();
    node.inject(&format!("xid {second} 4242"));
    let line = next(&gpud);
    assert_eq!(
        line["uuid"], second,
        "a line before the second instance's: {line}"
    );

    // A GPU-wide fault covers the GPU and every instance; the instance that already had its
    // own fault now shows the GPU-wide one, which is at least as severe.
    node.inject("xid 0 79");
    let lines: Vec<Value> = (0..=migs.len()).map(|_| next(&gpud)).collect();
    assert_eq!(lines[0]["uuid"], inventory["gpus"][0]["uuid"]);
    assert!(lines[0]["mig"].is_null());
    for (line, mig) in lines[1..].iter().zip(&migs) {
        assert_eq!(line["uuid"], mig["uuid"]);
        assert_eq!(line["to"]["xid"], 79);
        let from = if mig["uuid"] == target || mig["uuid"] == second {
            "unhealthy"
        } else {
            "healthy"
        };
        assert_eq!(line["from"], from);
    }
    // Nothing more: a double-bit ECC error, more urgent than the XID, is the next line (the
    // GPU's, before its instances').
    nothing_before_marker(&node, &gpud, 0);
}

#[test]
fn kernel_log_xid_is_attributed_by_bus_id() {
    let node = Node::new("pcie-4gpu");
    let inventory: Value =
        serde_json::from_str(&common::stdout_ok(&node.run(&["inventory"]))).unwrap();
    let bus = inventory["gpus"][2]["pci"]["bus_id"]
        .as_str()
        .unwrap()
        .to_owned();
    // NVRM prints the bus id without the 8-digit domain and without the function.
    let short = format!("{}:{}", &bus[4..8], &bus[9..14]).to_ascii_lowercase();
    let kmsg = node.dir.path().join("kmsg");
    std::fs::write(&kmsg, "some unrelated line\n").unwrap();
    let gpud = watch(&node, kmsg.to_str().unwrap(), &[]);
    let record = format!(
        "4,1234,5678901,-;NVRM: Xid (PCI:{short}): 48, pid=4242, name=python3, Ch 00000008\n"
    );
    std::fs::OpenOptions::new()
        .append(true)
        .open(&kmsg)
        .unwrap()
        .write_all_at_end(record.as_bytes());
    let line = next(&gpud);
    assert_eq!(summary(&line).0, 2);
    assert!(summary(&line).3.starts_with("XID 48: "), "{line}");
}

trait AppendAll {
    fn write_all_at_end(self, bytes: &[u8]);
}

impl AppendAll for std::fs::File {
    fn write_all_at_end(mut self, bytes: &[u8]) {
        use std::io::Write;
        self.write_all(bytes).unwrap();
        self.sync_all().unwrap();
    }
}

#[test]
fn xid_storm_is_one_transition_with_bounded_memory() {
    let node = Node::new("dgx-h100");
    let gpud = watch(&node, "", &[]);
    node.inject("xid 0 79");
    assert_eq!(summary(&next(&gpud)).0, 0);
    let rss_before = gpud.rss_kib();
    let storm: String = (0..10_000).map(|_| "xid 0 79\n").collect();
    std::fs::OpenOptions::new()
        .append(true)
        .open(node.control_path())
        .unwrap()
        .write_all_at_end(storm.as_bytes());
    // Still responsive: a fault elsewhere right after the storm comes through.
    node.inject("dbe 5");
    let line = next(&gpud);
    assert_eq!(
        summary(&line).0,
        5,
        "the storm produced no further transition: {line}"
    );
    nothing_before_marker(&node, &gpud, 6);
    let growth = gpud.rss_kib().saturating_sub(rss_before);
    assert!(
        growth < 4096,
        "resident memory grew {growth} KiB during the storm"
    );
}

#[test]
fn once_reports_health_with_an_exit_code() {
    let node = Node::new("pcie-4gpu");
    let out = node.run(&["health", "--once", "--kmsg", ""]);
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8(out.stdout).unwrap();
    assert_eq!(text.lines().count(), 5, "{text}");
    assert!(
        text.lines().skip(1).all(|l| l.contains(" healthy")),
        "{text}"
    );

    node.inject("temp 1 95");
    let out = node.run(&["health", "--once", "--kmsg", ""]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );

    node.inject("remap-pending 3");
    let out = node.run(&["health", "--once", "--kmsg", "", "--json"]);
    assert_eq!(out.status.code(), Some(2));
    let rows: Vec<Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows[3]["health"]["state"], "unhealthy");
    assert_eq!(rows[3]["health"]["remedy"], "reset_gpu");
    assert_eq!(rows[1]["health"]["state"], "degraded");
    assert_eq!(rows[1]["health"]["remedy"], "check_cooling");
    assert_eq!(rows[0]["health"]["remedy"], Value::Null, "healthy");
}

#[test]
fn bad_config_exits_65_naming_file_field_and_value() {
    let node = Node::new("pcie-4gpu");
    let config = node.dir.path().join("gpud.yaml");
    std::fs::write(&config, "health:\n  pollInterval: sometimes\n").unwrap();
    let out = node.run(&["health", "--once", "--config", config.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(65));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.starts_with(&format!(
            "gpud: {}: field health.pollInterval: invalid value \"sometimes\"",
            config.display()
        )),
        "{stderr}"
    );
}

#[test]
fn a_reset_that_leaves_the_gpu_answering_is_seen() {
    let node = Node::new("dgx-h100");
    let gpud = watch(&node, "", &[]);
    node.inject("xid 3 79");
    let line = next(&gpud);
    assert_eq!(summary(&line).2, "unhealthy");
    // No `lost` in between: the GPU answers throughout, as after a fast reset. What shows the
    // reset is what NVML reports after it (the recovery action the XID raised back to none).
    // The watcher compares two polls, so the request is raised again until one poll has seen
    // it before the reset (each round waits for the verdict, not for time).
    let mut back = None;
    for _ in 0..20 {
        node.inject("recovery-action 3 reboot");
        std::thread::sleep(std::time::Duration::from_millis(150));
        node.inject("reset 3");
        if let Some(text) = gpud.line_within(1000) {
            back = Some(serde_json::from_str::<Value>(&text).unwrap());
            break;
        }
    }
    let back = back.expect("the reset was never seen");
    assert_eq!(
        (back["gpu"].as_u64(), back["to"]["state"].as_str()),
        (Some(3), Some("healthy"))
    );
}

/// The UUID of GPU `index`, from `gpud inventory`.
fn uuid_of(node: &Node, index: usize) -> String {
    let out = common::stdout_ok(&node.run(&["inventory"]));
    let inventory: Value = serde_json::from_str(&out).unwrap();
    inventory["gpus"][index]["uuid"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// Writes the remediation record as gpud's remediation would: GPU `uuid` escalated, in boot
/// `boot_id`.
fn write_record(node: &Node, boot_id: &str, uuid: &str) {
    let state = node.dir.path().join("state");
    std::fs::create_dir_all(&state).unwrap();
    let record = serde_json::json!({
        "boot_id": boot_id,
        "gpus": {uuid: {
            "phase": "escalated",
            "since": 1_800_000_000u64,
            "reason": "the reset command exited 1",
            "escalation": "ResetFailed",
        }},
    });
    std::fs::write(
        state.join("remediation.json"),
        serde_json::to_vec_pretty(&record).unwrap(),
    )
    .unwrap();
}

/// `gpud health --once` shows what gpud's remediation holds out of service (the record in the
/// state directory) as unhealthy, with the phase and the reason, and exits 2; a record of
/// another boot is ignored (the reboot reset every GPU); a damaged one fails closed.
#[test]
fn once_honours_the_remediation_record() {
    let node = Node::new("pcie-4gpu");
    let uuid = uuid_of(&node, 2);
    let boot_id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
    write_record(&node, boot_id.trim(), &uuid);
    let out = node.run(&["health", "--once", "--kmsg", ""]);
    let text = String::from_utf8(out.stdout).unwrap();
    assert_eq!(out.status.code(), Some(2), "{text}");
    let held: Vec<&str> = text.lines().filter(|l| l.contains(" unhealthy")).collect();
    assert_eq!(held.len(), 1, "{text}");
    assert!(
        held[0].starts_with("2 ") && held[0].contains(&uuid),
        "{text}"
    );
    assert!(
        held[0].contains(
            "held out of service by gpud's remediation: escalated: the reset command exited 1"
        ),
        "{text}"
    );

    let out = node.run(&["health", "--once", "--kmsg", "", "--json"]);
    assert_eq!(out.status.code(), Some(2));
    let rows: Vec<Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows[2]["health"]["state"], "unhealthy");
    assert_eq!(rows[2]["health"]["source"], "remediation");
    assert_eq!(rows[2]["remediation"]["phase"], "escalated");
    assert_eq!(rows[1]["health"]["state"], "healthy");
    assert_eq!(rows[1].get("remediation"), None);

    // Written before the node rebooted: every GPU was reset since.
    write_record(&node, "another-boot", &uuid);
    let out = node.run(&["health", "--once", "--kmsg", ""]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );

    // Damaged: whether a GPU is held is unknown, never healthy.
    let path = node.dir.path().join("state/remediation.json");
    std::fs::write(&path, "{\"boot_id\": ").unwrap();
    let out = node.run(&["health", "--once", "--kmsg", ""]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.starts_with(&format!(
            "gpud: {}: not a remediation record: ",
            path.display()
        )) && stderr.contains("every GPU is reported unhealthy"),
        "{stderr}"
    );
    let text = String::from_utf8(out.stdout).unwrap();
    assert_eq!(
        text.lines()
            .skip(1)
            .filter(|l| l.contains(" unhealthy") && l.contains("remediation record cannot be read"))
            .count(),
        4,
        "{text}"
    );
}

#[test]
fn a_kernel_log_that_fails_to_read_fails_readiness_naming_it_and_nvml_carries_on() {
    let node = Node::new("dgx-h100");
    // A folder opens like a file and fails every read (EISDIR): the reader's first read fails.
    let kmsg = node.dir.path().join("kmsg.d");
    std::fs::create_dir(&kmsg).unwrap();
    let port = http::free_port();
    let address = format!("127.0.0.1:{port}");
    let gpud = Running::spawn(node.gpud(&[
        "health",
        "--json",
        "--poll-interval",
        "50ms",
        "--kmsg",
        kmsg.to_str().unwrap(),
        "--health-address",
        &address,
    ]));
    let failed = format!(
        "health failed: the kernel log source stopped: reading {} failed: Is a directory (os \
         error 21); XIDs come from NVML events only until gpud restarts\n",
        kmsg.display()
    );
    let answer = http::wait_for(port, "/readyz", 20, |a| a.body.contains("kernel log"));
    assert_eq!(answer.status, 503, "{}", answer.body);
    assert!(answer.body.starts_with("not ready\n"), "{}", answer.body);
    assert!(answer.body.contains(&failed), "{}", answer.body);
    // The other sources carry on: an XID NVML reports still takes the GPU out of service.
    node.inject("xid 3 79");
    let line = next(&gpud);
    assert_eq!(
        (line["gpu"].as_u64(), line["to"]["state"].as_str()),
        (Some(3), Some("unhealthy"))
    );
}
