//! A MIG reconfiguration while the exporter runs: the rescan finds it, and every family that is
//! reported per GPU instance switches to exactly the new set of instances.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use serde_json::json;

use crate::common::Node;
use crate::faults::with_xid;
use crate::harness::{Exporter, family};

/// The `a100-mig` fixture's only GPU.
const UUID: &str = "GPU-92943319-76de-de32-f55a-b6a72767408c";

/// `(GPU_I_PROFILE, GPU_I_ID)` pairs.
type Instances = BTreeSet<(String, String)>;

/// The value of label `name` in one series line.
fn label<'a>(line: &'a str, name: &str) -> Option<&'a str> {
    let start = line.find(&format!(",{name}=\""))? + name.len() + 3;
    let len = line[start..].find('"')?;
    Some(&line[start..start + len])
}

/// For every family with series per GPU instance, the instances it reports.
fn instances_by_family(body: &str) -> BTreeMap<String, Instances> {
    let mut out: BTreeMap<String, Instances> = BTreeMap::new();
    for line in body.lines().filter(|l| !l.starts_with('#')) {
        let (Some(profile), Some(id)) = (label(line, "GPU_I_PROFILE"), label(line, "GPU_I_ID"))
        else {
            continue;
        };
        let family = line.split('{').next().unwrap().to_owned();
        out.entry(family)
            .or_default()
            .insert((profile.to_owned(), id.to_owned()));
    }
    out
}

fn set(pairs: &[(&str, &str)]) -> Instances {
    pairs
        .iter()
        .map(|(p, i)| ((*p).to_owned(), (*i).to_owned()))
        .collect()
}

/// A GPU instance in the state file's form, with one compute instance filling it.
fn gpu_instance(
    id: u32,
    profile_id: u32,
    start: u32,
    size: u32,
    ci_profile_id: u32,
) -> serde_json::Value {
    json!({"id": id, "profile_id": profile_id, "placement": {"start": start, "size": size},
           "compute_instances": [{"id": 0, "profile_id": ci_profile_id,
                                  "placement": {"start": 0, "size": size.min(3)}}]})
}

/// 3g.40gb (GI profile 9) in slots 4-7.
fn three_g(id: u32) -> serde_json::Value {
    gpu_instance(id, 9, 4, 4, 2)
}

/// 1g.10gb (GI profile 19) in slot `start`.
fn one_g(id: u32, start: u32) -> serde_json::Value {
    gpu_instance(id, 19, start, 1, 0)
}

/// The rescan interval the test runs with.
const RESCAN: Duration = Duration::from_millis(200);

/// Polls `/metrics` until every per-instance family (the same `families` as before) reports
/// exactly `expected`, failing after `within`. Returns how long it took.
fn wait_for_layout(
    exporter: &Exporter,
    families: &BTreeSet<String>,
    expected: &Instances,
    within: Duration,
) -> Duration {
    let start = Instant::now();
    loop {
        let body = exporter.get("/metrics").body;
        let now = instances_by_family(&body);
        if now.keys().eq(families.iter()) && now.values().all(|set| set == expected) {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < within,
            "after {within:?} the instances per family are {now:#?}, expected {expected:?} in each of {families:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn mig_reconfiguration_reaches_metrics_within_a_few_rescans() {
    let node = Node::new("a100-mig");
    let interval = format!("{}ms", RESCAN.as_millis());
    let exporter = Exporter::start(&node, &["--rescan-interval", &interval]);
    // A few rescans: the change is seen by the next rescan, the next sample (100 ms) fills in
    // the new instances' own readings; the rest is slack for a busy machine.
    let within = RESCAN * 10;

    // The fixture's layout, in every per-instance family (readings, GPM, health).
    let body = exporter.metrics_after(2);
    let families: BTreeSet<String> = instances_by_family(&body).into_keys().collect();
    assert!(
        families.contains("DCGM_FI_DEV_FB_USED") && families.contains("gpud_gpu_health"),
        "{families:?}"
    );
    let fixture = set(&[("1g.10gb", "8"), ("2g.20gb", "4"), ("3g.40gb", "1")]);
    assert!(
        instances_by_family(&body).values().all(|s| *s == fixture),
        "{body}"
    );

    // Two instances go, one new one comes.
    node.write_mig_state(UUID, json!([three_g(1), one_g(7, 0)]));
    let took = wait_for_layout(
        &exporter,
        &families,
        &set(&[("1g.10gb", "7"), ("3g.40gb", "1")]),
        within,
    );
    eprintln!("first change reached /metrics after {took:?}");

    // The 3g instance goes and two more 1g instances come.
    node.write_mig_state(UUID, json!([one_g(7, 0), one_g(9, 1), one_g(10, 2)]));
    let took = wait_for_layout(
        &exporter,
        &families,
        &set(&[("1g.10gb", "10"), ("1g.10gb", "7"), ("1g.10gb", "9")]),
        within,
    );
    eprintln!("second change reached /metrics after {took:?}");
}

#[test]
fn xid_totals_of_a_removed_instance_go_with_it() {
    let node = Node::new("a100-mig");
    let interval = format!("{}ms", RESCAN.as_millis());
    let exporter = Exporter::start(&node, &["--rescan-interval", &interval]);
    // One XID on GPU instance 4 (2g.20gb), one on the GPU as a whole.
    with_xid(&node, &exporter, "xid 0 43 4 0");
    node.inject("xid 0 43");
    let gpu_line = |body: &str| {
        family(body, "gpud_xid_errors_total")
            .into_iter()
            .find(|l| !l.contains("GPU_I_ID="))
            .map(str::to_owned)
    };
    let body = exporter.metrics_until(10, |b| gpu_line(b).is_some());
    assert_eq!(
        family(&body, "gpud_xid_errors_total")
            .iter()
            .map(|l| label(l, "GPU_I_ID"))
            .collect::<Vec<_>>(),
        [None, Some("4")]
    );
    let whole_gpu = gpu_line(&body).unwrap();

    // Instance 4 goes: its total goes too, rather than turning into a second whole-GPU series.
    node.write_mig_state(UUID, json!([three_g(1), one_g(7, 0)]));
    let body = exporter.metrics_until(10, |b| !b.contains("GPU_I_ID=\"4\""));
    assert_eq!(family(&body, "gpud_xid_errors_total"), [whole_gpu.as_str()]);
}

#[test]
fn a_zero_rescan_interval_is_a_usage_error() {
    let node = Node::new("a100-mig");
    let out = node.run(&["exporter", "--rescan-interval", "0s"]);
    assert_eq!(out.status.code(), Some(64));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr).lines().next(),
        Some(
            "error: invalid value '0s' for '--rescan-interval <DURATION>': must be longer than zero, e.g. 5s"
        )
    );
}
