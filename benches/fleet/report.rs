//! The fleet's tables: each scenario's figures per node, extrapolated linearly to
//! [`CLUSTER`] nodes, with the figure that would dominate there.

use std::collections::BTreeMap;
use std::time::Duration;

use super::api::FleetApi;
use super::counts::{Tally, Verb};
use super::nodes::Node;

/// The cluster size every table extrapolates to.
pub const CLUSTER: f64 = 5000.0;

/// What the summary lines need of the steady state.
pub struct Steady {
    pub writes_per_node_hour: f64,
    pub lists_per_node_hour: f64,
    pub watches_per_node: f64,
}

/// Scenario 1: requests per node per hour by verb and resource, bytes, open watches, and the
/// busiest second from `from` (nodes' periodic checks in step show there).
pub fn steady(
    tally: &Tally,
    nodes: usize,
    (from, duration): (usize, Duration),
    watches: &[Vec<i64>],
) -> Steady {
    let hours = duration.as_secs_f64() / 3600.0;
    let n = nodes as f64;
    let per_node_hour = |x: u64| x as f64 / n / hours;
    println!();
    println!(
        "== 1. steady state: {nodes} nodes for {}",
        humantime::format_duration(duration)
    );
    println!(
        "  {:<7} {:<15} {:>14} {:>16} {:>18}",
        "verb", "resource", "req/node/hour", "KiB/node/hour", "5000 nodes: req/s"
    );
    let mut dominant: Option<(f64, String)> = None;
    for ((verb, resource), sum) in tally.by_call() {
        if sum.requests == 0 && sum.bytes == 0 {
            continue;
        }
        let rate = per_node_hour(sum.requests);
        let cluster = rate * CLUSTER / 3600.0;
        println!(
            "  {:<7} {:<15} {:>14.1} {:>16.1} {:>18.2}",
            verb.name(),
            resource,
            rate,
            per_node_hour(sum.bytes) / 1024.0,
            cluster
        );
        if dominant.as_ref().is_none_or(|(top, _)| cluster > *top) {
            dominant = Some((cluster, format!("{} {resource}", verb.name())));
        }
    }
    let (requests, writes, lists, bytes) = tally.totals();
    let bare: u64 = tally.bare_lists.iter().sum();
    println!(
        "  {:<23} {:>14.1} {:>16.1} {:>18.2}",
        "all",
        per_node_hour(requests),
        per_node_hour(bytes) / 1024.0,
        per_node_hour(requests) * CLUSTER / 3600.0
    );
    println!(
        "  writes: {:.2}/node/hour ({:.2}/s at 5000 nodes); LISTs: {:.2}/node/hour, of them \
         without a resourceVersion: {:.2}",
        per_node_hour(writes),
        per_node_hour(writes) * CLUSTER / 3600.0,
        per_node_hour(lists),
        per_node_hour(bare)
    );
    let samples: Vec<f64> = watches
        .iter()
        .map(|s| s.iter().sum::<i64>() as f64 / n)
        .collect();
    let average = samples.iter().sum::<f64>() / samples.len().max(1) as f64;
    let most = watches.iter().flatten().copied().max().unwrap_or(0);
    println!(
        "  open watches per node: {average:.2} on average, {most} at most ({:.0} open at 5000 \
         nodes)",
        average * CLUSTER
    );
    let (top, at) = peak(tally, from);
    println!(
        "  busiest second: {top} requests (second {at}) = {:.3} x nodes, {:.1} x an average \
         second ({:.0} req/s at 5000 nodes)",
        f64::from(top) / n,
        f64::from(top) / (requests as f64 / duration.as_secs_f64()).max(f64::MIN_POSITIVE),
        f64::from(top) / n * CLUSTER
    );
    if let Some((rate, what)) = dominant {
        println!("  dominant at 5000 nodes: {what} ({rate:.2} req/s)");
    }
    Steady {
        writes_per_node_hour: per_node_hour(writes),
        lists_per_node_hour: per_node_hour(lists),
        watches_per_node: average,
    }
}

/// Writes taken per node by resource, as `verb resource n.nn` (and the refused ones).
fn writes_by_resource(tally: &Tally, nodes: usize) -> String {
    let mut parts = Vec::new();
    for ((verb, resource), sum) in tally.by_call() {
        if verb.writes() && sum.requests > 0 {
            parts.push(format!(
                "{} {resource} {:.2} (+{:.2} refused)",
                verb.name(),
                (sum.requests - sum.refused) as f64 / nodes as f64,
                sum.refused as f64 / nodes as f64
            ));
        }
    }
    parts.join(", ")
}

/// The busiest second from `from` on, and which second it was (relative to `from`).
fn peak(tally: &Tally, from: usize) -> (u32, usize) {
    let seconds = tally.seconds(from, tally.per_second.len());
    seconds
        .iter()
        .enumerate()
        .map(|(i, n)| (*n, i))
        .max()
        .unwrap_or((0, 0))
}

/// Scenario 2: the same fatal XID on every node.
pub fn fault(
    tally: &Tally,
    nodes: usize,
    from: usize,
    injected: Duration,
    converged: Option<Duration>,
    showing: usize,
    repeated: u64,
) -> Option<Duration> {
    let (requests, writes, _, _) = tally.totals();
    let (top, at) = peak(tally, from);
    let scale = CLUSTER / nodes as f64;
    println!();
    println!(
        "== 2. correlated fault: XID 79 on GPU 0 of all {nodes} nodes within {:.2} s \
         (API server limited to {} req/s, 429 with Retry-After past it)",
        injected.as_secs_f64(),
        super::fault_limit(nodes)
    );
    println!(
        "  every Node shows it after: {}",
        converged.map_or(format!("never ({showing} of {nodes})"), |d| format!(
            "{:.1} s",
            d.as_secs_f64()
        ))
    );
    println!(
        "  peak: {top} req/s (second {at}); 5000 nodes: {:.0} req/s",
        top as f64 * scale
    );
    println!(
        "  requests: {:.2}/node, writes: {:.2}/node ({})",
        requests as f64 / nodes as f64,
        writes as f64 / nodes as f64,
        writes_by_resource(tally, nodes)
    );
    let code = |c: u16| tally.codes.get(&c).copied().unwrap_or(0);
    println!(
        "  answers 409: {}, 429: {} ({:.2}/node); 5000 nodes: {:.0} writes in the wave",
        code(409),
        code(429),
        code(429) as f64 / nodes as f64,
        writes as f64 * scale
    );
    let per_node = tally.writes_by_node(nodes);
    let most = per_node.iter().max().copied().unwrap_or(0);
    println!(
        "  most writes by one node: {most}; writes that changed nothing (repeated): {repeated}; \
         dominant at 5000 nodes: the peak second ({:.0} req/s)",
        top as f64 * scale
    );
    converged
}

/// What the summary lines need of the outage.
pub struct Outage {
    pub peak_fraction: f64,
    pub converged: Option<Duration>,
}

/// Scenario 3: the herd after an outage.
pub fn outage(
    tally: &Tally,
    nodes: usize,
    from: usize,
    length: Duration,
    converged: Option<Duration>,
    changed: &[usize],
    // Writes that changed nothing, and changes never written.
    (repeated, lost): (u64, usize),
) -> Outage {
    let seconds = tally.seconds(from, from + 60);
    let (top, at) = seconds
        .iter()
        .enumerate()
        .map(|(i, n)| (*n, i))
        .max()
        .unwrap_or((0, 0));
    let scale = CLUSTER / nodes as f64;
    let (requests, writes, lists, _) = tally.totals();
    println!();
    println!(
        "== 3. API server down {} s and back ({} nodes lost a second GPU meanwhile)",
        length.as_secs(),
        changed.len()
    );
    println!("  requests in each second of the first minute back:");
    for (row, chunk) in seconds.chunks(10).enumerate() {
        let cells: Vec<String> = chunk.iter().map(|n| format!("{n:>5}")).collect();
        println!(
            "    {:>2}-{:>2} s: {}",
            row * 10,
            row * 10 + 9,
            cells.join(" ")
        );
    }
    let fraction = f64::from(top) / nodes as f64;
    println!(
        "  busiest second: {top} requests (second {at}) = {fraction:.3} x nodes (goal ≤ 0.2); \
         5000 nodes: {:.0} req/s",
        f64::from(top) * scale
    );
    let made_of: Vec<String> = tally
        .calls_in(from + at)
        .iter()
        .map(|((verb, resource), n)| format!("{n} {} {resource}", verb.name()))
        .collect();
    println!("  the busiest second was: {}", made_of.join(", "));
    herd_or_burst(tally, from, at, changed);
    let window: Vec<String> = tally
        .by_call()
        .iter()
        .map(|((verb, resource), sum)| {
            format!(
                "{} {resource} {:.2}",
                verb.name(),
                sum.requests as f64 / nodes as f64
            )
        })
        .collect();
    println!("  per node in the window: {}", window.join(", "));
    println!(
        "  every node converged (watches reopened, changes written) after: {}",
        converged.map_or("never".to_owned(), |d| format!("{:.1} s", d.as_secs_f64()))
    );
    let writers = tally.writes_by_node(nodes);
    let by_changed: u64 = writers
        .iter()
        .enumerate()
        .filter(|(i, _)| changed.contains(i))
        .map(|(_, w)| *w)
        .sum();
    println!(
        "  in the window: {:.2} requests/node, {:.2} LISTs/node; writes {} (by the {} changed \
         nodes {by_changed}, by the others {}: what else changed while the API server was \
         away, such as the doctor's verdict); writes that changed nothing (repeated): \
         {repeated}; changes lost: {lost}",
        requests as f64 / nodes as f64,
        lists as f64 / nodes as f64,
        writes,
        changed.len(),
        writes - by_changed,
    );
    println!(
        "  dominant at 5000 nodes: the busiest second ({:.0} req/s)",
        f64::from(top) * scale
    );
    Outage {
        peak_fraction: fraction,
        converged,
    }
}

/// Whether a busy second after the outage was many nodes or a few nodes' bursts: the nodes
/// in the busiest second, and how one node's requests in the first minute fall into seconds.
fn herd_or_burst(tally: &Tally, from: usize, at: usize, changed: &[usize]) {
    let per_node = tally.node_seconds(from, from + 60);
    let busiest = u32::try_from(from + at).unwrap_or(u32::MAX);
    let in_busiest: Vec<u32> = per_node
        .values()
        .filter_map(|seconds| seconds.get(&busiest).copied())
        .collect();
    println!(
        "  in it: {} nodes, {:.1} requests each",
        in_busiest.len(),
        f64::from(in_busiest.iter().sum::<u32>()) / in_busiest.len().max(1) as f64
    );
    for (label, of_changed) in [("unchanged", false), ("changed", true)] {
        let nodes: Vec<&BTreeMap<u32, u32>> = per_node
            .iter()
            .filter(|(node, _)| changed.contains(node) == of_changed)
            .map(|(_, seconds)| seconds)
            .collect();
        let requests = median(nodes.iter().map(|s| s.values().sum::<u32>()).collect());
        let seconds = median(nodes.iter().map(|s| s.len() as u32).collect());
        let top = median(
            nodes
                .iter()
                .map(|s| s.values().copied().max().unwrap_or(0))
                .collect(),
        );
        let mut calls: BTreeMap<(Verb, &str), u32> = BTreeMap::new();
        for &(second, node, verb, resource) in &tally.log {
            let in_window = (from..from + 60).contains(&(second as usize));
            if in_window && changed.contains(&node) == of_changed {
                *calls.entry((verb, resource)).or_default() += 1;
            }
        }
        let calls: Vec<String> = calls
            .iter()
            .map(|((verb, resource), n)| {
                format!(
                    "{} {resource} {:.2}",
                    verb.name(),
                    f64::from(*n) / nodes.len().max(1) as f64
                )
            })
            .collect();
        println!(
            "  {label} nodes: {requests} requests in {seconds} seconds, {top} in the node's \
             busiest second (medians of {} nodes); each: {}",
            nodes.len(),
            calls.join(", ")
        );
    }
}

fn median(mut values: Vec<u32>) -> u32 {
    values.sort_unstable();
    values.get(values.len() / 2).copied().unwrap_or(0)
}

/// Scenario 4: rolling restart.
pub fn restart(tally: &Tally, nodes: usize, batch: usize, took: Duration) {
    let n = nodes as f64;
    let (requests, writes, lists, _) = tally.totals();
    let bare: u64 = tally.bare_lists.iter().sum();
    println!();
    println!(
        "== 4. rolling restart of all {nodes} gpud in batches of {batch} ({:.0} s)",
        took.as_secs_f64()
    );
    println!(
        "  per restart: {:.2} requests, {:.2} LISTs ({:.2} without a resourceVersion), {:.2} \
         writes",
        requests as f64 / n,
        lists as f64 / n,
        bare as f64 / n,
        writes as f64 / n
    );
    let mut rows: Vec<((Verb, &str), u64)> = tally
        .by_call()
        .into_iter()
        .map(|(k, s)| (k, s.requests))
        .filter(|(_, r)| *r > 0)
        .collect();
    rows.sort_by_key(|row| std::cmp::Reverse(row.1));
    for ((verb, resource), count) in &rows {
        println!(
            "    {:<7} {:<15} {:>8.2}/restart; 5000 nodes: {:>8.0} per rollout",
            verb.name(),
            resource,
            *count as f64 / n,
            *count as f64 / n * CLUSTER
        );
    }
    if let Some(((verb, resource), count)) = rows.first() {
        println!(
            "  dominant at 5000 nodes: {} {resource} ({:.0} per rollout, {:.0} per batch)",
            verb.name(),
            *count as f64 / n * CLUSTER,
            *count as f64 / n * CLUSTER / 10.0
        );
    }
}

/// The end of the log of every node that did not settle, to say why.
pub fn logs_of_unsettled(api: &FleetApi, fleet: &[Node]) {
    for node in fleet
        .iter()
        .filter(|n| api.condition(&n.name, "GPUHealthy").is_none() || api.slices_of(&n.name) == 0)
        .take(3)
    {
        let log = std::fs::read_to_string(node.dir.join("gpud.log")).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(5).collect();
        println!("  {} did not settle: {}", node.name, tail.join(" | "));
    }
}
