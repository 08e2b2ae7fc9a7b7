//! XID storms: `gpud_xid_errors_total` counts every XID the driver delivers, from NVML events
//! and from the kernel log, and one XID reported both ways counts once.
//!
//! Each test ends its input with a sentinel XID from the same source: reports are handled in
//! order, so once the sentinel is counted everything before it is too, and the counts are
//! final — no waiting in the hope that they have settled.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::common::Node;
use crate::faults::with_xid;
use crate::harness::{Exporter, family, value};

/// XIDs of the storm, in turn.
const CODES: [u32; 4] = [94, 46, 13, 79];
/// Lines in a storm.
const STORM: usize = 10_000;
/// The XID that follows a storm (a code the storm does not use).
const SENTINEL: u32 = 31;
/// How long a storm may take to be counted (it takes seconds; the bound is for slow machines).
const DEADLINE_SECS: u64 = 120;

/// GPU 0 of `dgx-h100` as the kernel log names it.
const GPU0_KMSG: &str = "PCI:0000:18:00";

/// `gpud_xid_errors_total` of one GPU, by code.
fn totals(body: &str, gpu: u32) -> BTreeMap<u32, u64> {
    by_code(body, "gpud_xid_errors_total", gpu)
}

/// The samples of `metric` for `gpu`, by their `xid` label.
fn by_code(body: &str, metric: &str, gpu: u32) -> BTreeMap<u32, u64> {
    let gpu_label = format!("gpu=\"{gpu}\"");
    family(body, metric)
        .into_iter()
        .filter(|line| line.contains(&gpu_label))
        .map(|line| {
            let code = line
                .split("xid=\"")
                .nth(1)
                .and_then(|rest| rest.split('"').next())
                .and_then(|code| code.parse().ok())
                .unwrap_or_else(|| panic!("no xid label in {line}"));
            let count = line
                .rsplit_once(' ')
                .and_then(|(_, n)| n.parse().ok())
                .unwrap_or_else(|| panic!("no value in {line}"));
            (code, count)
        })
        .collect()
}

/// The storm's lines, one per occurrence, then the sentinel's.
fn storm_lines(line: impl Fn(usize, u32) -> String) -> Vec<String> {
    (0..STORM)
        .map(|i| line(i, CODES[i % CODES.len()]))
        .chain(std::iter::once(line(STORM, SENTINEL)))
        .collect()
}

/// One `/dev/kmsg` record of an XID on GPU 0, as a 535-series driver prints it.
fn kmsg_xid(seq: usize, code: u32) -> String {
    format!(
        "3,{},{},-;NVRM: Xid ({GPU0_KMSG}): {code}, pid=4242, name=python3, Ch 00000008",
        1_000 + seq,
        50_000_000 + seq * 10
    )
}

/// Appends lines to the kernel log file in one write.
fn append(path: &Path, lines: &[String]) {
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .open(path)
        .expect("open kernel log");
    for line in lines {
        writeln!(file, "{line}").expect("write kernel log");
    }
    file.sync_all().expect("sync kernel log");
}

/// A counters file with the two XID families (the default set lacks the windowed count).
fn xid_counters(node: &Node) -> String {
    let path = node.dir.path().join("xid-counters.csv");
    std::fs::write(
        &path,
        "DCGM_FI_DEV_XID_ERRORS, gauge, Value of the last XID error encountered.\n\
         DCGM_EXP_XID_ERRORS_COUNT, gauge, Count of XID errors within the window.\n",
    )
    .expect("write counters file");
    path.to_str().expect("utf-8 temp path").to_owned()
}

/// `gpud exporter` on `node` exporting the XID families, following `kmsg` (`""`: none).
fn start(node: &Node, kmsg: &str) -> Exporter {
    Exporter::start_following(node, kmsg, &["-f", &xid_counters(node)], &[])
}

fn kmsg_file(node: &Node, text: &str) -> PathBuf {
    let path = node.dir.path().join("kmsg");
    std::fs::write(&path, text).expect("write kernel log");
    path
}

/// Exactly 2 500 of each code, the sentinel once, all in the window too, nothing dropped.
fn assert_storm_counted(body: &str) {
    let per_code = (STORM / CODES.len()) as u64;
    let mut want: BTreeMap<u32, u64> = CODES.iter().map(|&code| (code, per_code)).collect();
    want.insert(SENTINEL, 1);
    assert_eq!(totals(body, 0), want, "gpud_xid_errors_total of GPU 0");
    assert_eq!(
        totals(body, 0).values().sum::<u64>(),
        STORM as u64 + 1,
        "every occurrence counted once"
    );
    assert_eq!(
        by_code(body, "DCGM_EXP_XID_ERRORS_COUNT", 0),
        want,
        "the windowed count holds the whole storm"
    );
    for source in ["window", "dedup"] {
        assert_eq!(
            value(body, "gpud_xid_events_dropped_total", &[("source", source)]).as_deref(),
            Some("0"),
            "{source}"
        );
    }
    assert_eq!(
        value(body, "DCGM_FI_DEV_XID_ERRORS", &[("gpu", "0")]).as_deref(),
        Some(SENTINEL.to_string().as_str()),
        "the last XID is the last one delivered"
    );
}

#[test]
fn an_nvml_xid_storm_is_counted_exactly() {
    let node = Node::new("dgx-h100");
    let exporter = start(&node, "");
    // Counted on GPU 7 once the watcher has registered for events: the storm is not lost to
    // a registration still in progress.
    with_xid(&node, &exporter, "xid 7 43");
    node.inject_all(&storm_lines(|_, code| format!("xid 0 {code}")));
    let body = exporter.metrics_until(DEADLINE_SECS, |b| totals(b, 0).contains_key(&SENTINEL));
    assert_storm_counted(&body);
}

#[test]
fn a_kernel_log_xid_storm_is_counted_exactly() {
    let node = Node::new("dgx-h100");
    let text = storm_lines(kmsg_xid).join("\n") + "\n";
    let kmsg = kmsg_file(&node, &text);
    let exporter = start(&node, kmsg.to_str().unwrap());
    let body = exporter.metrics_until(DEADLINE_SECS, |b| totals(b, 0).contains_key(&SENTINEL));
    assert_storm_counted(&body);
}

#[test]
fn an_xid_reported_by_nvml_and_by_the_kernel_log_counts_once() {
    let node = Node::new("dgx-h100");
    let kmsg = kmsg_file(&node, "");
    let exporter = start(&node, kmsg.to_str().unwrap());
    with_xid(&node, &exporter, "xid 7 43");
    // Five faults, each reported both ways, the kernel line first or last in turn.
    for i in 0..5 {
        let line = kmsg_xid(i, 48);
        if i % 2 == 0 {
            append(&kmsg, &[line]);
            node.inject("xid 0 48");
        } else {
            node.inject("xid 0 48");
            append(&kmsg, &[line]);
        }
    }
    // A GPU falling off the bus: the XID line, the driver's "fallen off" line (not an XID of
    // its own) and the NVML event are one XID 79.
    append(
        &kmsg,
        &[
            format!(
                "3,2000,60000000,-;NVRM: Xid ({GPU0_KMSG}): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
            ),
            "3,2001,60000001,-;NVRM: GPU 0000:18:00.0: GPU has fallen off the bus.".to_owned(),
        ],
    );
    node.inject("xid 0 79");
    // A sentinel from each source: once both are counted, every report before them is in.
    append(&kmsg, &[kmsg_xid(3000, SENTINEL)]);
    node.inject("xid 0 13");
    let body = exporter.metrics_until(DEADLINE_SECS, |b| {
        let t = totals(b, 0);
        t.contains_key(&SENTINEL) && t.contains_key(&13)
    });
    assert_eq!(
        totals(&body, 0),
        BTreeMap::from([(13, 1), (48, 5), (79, 1), (SENTINEL, 1)]),
        "one count per fault, whichever source reported it first"
    );
    assert_eq!(
        value(
            &body,
            "gpud_xid_events_dropped_total",
            &[("source", "dedup")]
        )
        .as_deref(),
        Some("0")
    );
}
