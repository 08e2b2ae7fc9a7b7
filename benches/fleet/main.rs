//! Fleet scale: what gpud costs the API server, measured on hundreds of simulated nodes on
//! this machine and extrapolated to 5 000.
//!
//! N release `gpud run` processes (`GPUD_FLEET_NODES`, default sized to memory, at least 200),
//! each its own node on the simulated driver, with the labeller's Node sink, node status, the
//! DRA plugin and the MIG reconciler on, against one API stand-in ([`api::FleetApi`]) that
//! counts every request. Four scenarios, each printing a table with the linear extrapolation
//! to 5 000 nodes and the figure that would dominate there:
//!
//! 1. steady state for `GPUD_FLEET_DURATION` (10 minutes by default);
//! 2. correlated fault: the same fatal XID on every node within one second;
//! 3. API server outage (60 s at full duration, shorter with it) and the herd after it;
//! 4. rolling restart of every gpud in batches of 10 %.
//!
//! `GPUD_FLEET_OUTAGE` sets the outage's length apart from the run's (60 s after a short
//! steady state, to look at the herd alone). The run ends with `key: value` lines for scripts. `GPUD_FLEET_ARGS` adds `gpud run` flags
//! to every node (say, to compare intervals); `GPUD_FLEET_GPUD` runs another gpud binary (an
//! older build, to compare).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod api;
mod counts;
mod nodes;
#[path = "../support/proc.rs"]
mod proc;
#[path = "../../tests/common/rebind.rs"]
mod rebind;
mod report;

use std::time::{Duration, Instant};

use api::FleetApi;
use nodes::{Node, Setup};

/// What the fleet's readiness check needs of a node's Node and slices.
const GPU_CONDITION: &str = "GPUHealthy";
/// The fatal XID every node sees in the correlated fault (the GPU fell off the bus).
const FATAL_XID: u32 = 79;

#[allow(clippy::disallowed_methods)] // the bench's own switches
fn setting(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// At least 200 nodes; more where half the available memory holds more at 32 MiB each.
fn default_nodes() -> usize {
    let available_kib: u64 = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find_map(|l| l.strip_prefix("MemAvailable:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0);
    usize::try_from(available_kib / 2 / (32 * 1024))
        .unwrap_or(200)
        .clamp(200, 400)
}

fn main() {
    let nodes: usize = setting("GPUD_FLEET_NODES")
        .map(|n| n.parse().expect("GPUD_FLEET_NODES: a number of nodes"))
        .unwrap_or_else(default_nodes);
    let duration = setting("GPUD_FLEET_DURATION")
        .map(|d| {
            humantime::parse_duration(&d).expect("GPUD_FLEET_DURATION: a duration such as 10m")
        })
        .unwrap_or(Duration::from_secs(600));
    let extra: Vec<String> = setting("GPUD_FLEET_ARGS")
        .map(|a| a.split_whitespace().map(str::to_owned).collect())
        .unwrap_or_default();
    // The outage and the waits scale with the run: 60 s at 10 minutes, unless
    // GPUD_FLEET_OUTAGE sets it (the full outage after a short steady state).
    let outage = setting("GPUD_FLEET_OUTAGE").map_or_else(
        || (duration / 10).clamp(Duration::from_secs(10), Duration::from_secs(60)),
        |d| humantime::parse_duration(&d).expect("GPUD_FLEET_OUTAGE: a duration such as 60s"),
    );

    let exe = std::env::current_exe().unwrap();
    let setup = Setup {
        // Another build (the one before a change) to compare with.
        gpud: setting("GPUD_FLEET_GPUD")
            .map_or_else(|| env!("CARGO_BIN_EXE_gpud").into(), Into::into),
        mock: exe.parent().unwrap().join("libnvidia_ml_mock.so"),
        mig_config: std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("packaging/mig/config-default.yaml"),
        extra,
    };
    let root = tempfile::Builder::new()
        .prefix("gpud-fleet")
        .tempdir()
        .unwrap();
    let names: Vec<String> = (0..nodes).map(|i| format!("gpu-node-{i:04}")).collect();
    let mut api = FleetApi::start(&names);
    let mut fleet: Vec<Node> = (0..nodes)
        .map(|i| Node::new(root.path(), i, &|n| api.kubeconfig(n)))
        .collect();
    println!(
        "fleet: {nodes} simulated nodes (gpud run: labeller Node sink, node status, DRA, MIG \
         reconciler), steady state {}, outage {}",
        humantime::format_duration(duration),
        humantime::format_duration(outage)
    );

    // Start: in waves, so the start itself is not the measurement.
    let started = Instant::now();
    for node in &mut fleet {
        node.start(&setup);
        std::thread::sleep(Duration::from_millis(20));
    }
    let converged = wait_until(Duration::from_secs(300), || settled(&api, &fleet));
    println!(
        "started: {} of {nodes} nodes published in {:.0} s (RSS per gpud: {} MiB)",
        settled_count(&api, &fleet),
        started.elapsed().as_secs_f64(),
        rss_mib(&fleet)
    );
    if !converged {
        report::logs_of_unsettled(&api, &fleet);
    }
    // The first minute after start (doctor, first relabel) is not the steady state.
    std::thread::sleep(Duration::from_secs(30).min(duration / 4));

    // 1. Steady state.
    let before = api.shared.counts.tally();
    let steady_second = api.shared.counts.second() as usize;
    let mut watch_samples = Vec::new();
    let steady_start = Instant::now();
    while steady_start.elapsed() < duration {
        std::thread::sleep(Duration::from_secs(5).min(duration));
        watch_samples.push(api.shared.counts.open_watches());
    }
    let steady = api.shared.counts.tally().since(&before);
    let steady_summary = report::steady(&steady, nodes, (steady_second, duration), &watch_samples);

    // 2. Correlated fault, with the API server rate-limited as priority and fairness would be
    // (half a request per node per second), so 429s happen and their Retry-After is exercised.
    let before = api.shared.counts.tally();
    let second = api.shared.counts.second() as usize;
    api.limit(fault_limit(nodes));
    let unchanged_before = api.unchanged_writes();
    let fault_start = Instant::now();
    for node in &fleet {
        node.inject(&format!("xid 0 {FATAL_XID}"));
    }
    let injected = fault_start.elapsed();
    let all = wait_until(Duration::from_secs(300), || {
        unhealthy(&api, &fleet, 1) == fleet.len()
    });
    let fault_converged = fault_start.elapsed();
    // What follows the conditions (labels, slices, events) settles too.
    std::thread::sleep(outage.min(Duration::from_secs(30)));
    api.limit(0);
    let fault = api.shared.counts.tally().since(&before);
    let fault_summary = report::fault(
        &fault,
        nodes,
        second,
        injected,
        all.then_some(fault_converged),
        unhealthy(&api, &fleet, 1),
        api.unchanged_writes() - unchanged_before,
    );

    // 3. Outage: the API server goes away; meanwhile a tenth of the nodes lose a second GPU;
    // it comes back on the same port with what it held.
    let steady_watches: Vec<i64> = api.shared.counts.open_watches();
    let changed: Vec<usize> = (0..nodes).step_by(10).collect();
    api.stop();
    let down = Instant::now();
    std::thread::sleep(outage / 2);
    for &i in &changed {
        fleet[i].inject(&format!("xid 1 {FATAL_XID}"));
    }
    std::thread::sleep(outage.saturating_sub(down.elapsed()));
    let before = api.shared.counts.tally();
    let unchanged_before = api.unchanged_writes();
    api.start_again();
    let back = Instant::now();
    let back_second = api.shared.counts.second() as usize;
    let outage_done = wait_until(Duration::from_secs(300), || {
        let open = api.shared.counts.open_watches();
        let watching = open
            .iter()
            .zip(&steady_watches)
            .all(|(now, before)| now >= before.min(&2));
        watching && changed.iter().all(|&i| shows_unhealthy(&api, &fleet[i], 2))
    });
    let outage_converged = back.elapsed();
    std::thread::sleep(Duration::from_secs(60).saturating_sub(back.elapsed()));
    let after = api.shared.counts.tally().since(&before);
    let outage_summary = report::outage(
        &after,
        nodes,
        back_second,
        outage,
        outage_done.then_some(outage_converged),
        &changed,
        (
            api.unchanged_writes() - unchanged_before,
            changed
                .iter()
                .filter(|&&i| !shows_unhealthy(&api, &fleet[i], 2))
                .count(),
        ),
    );

    // 4. Rolling restart in batches of 10 %.
    let before = api.shared.counts.tally();
    let batch = (nodes / 10).max(1);
    let restart_start = Instant::now();
    for chunk in (0..nodes).collect::<Vec<_>>().chunks(batch) {
        for &i in chunk {
            fleet[i].terminate();
        }
        for &i in chunk {
            fleet[i].reap();
        }
        for &i in chunk {
            fleet[i].start(&setup);
        }
        // The batch is back when each of its nodes has its watches open again.
        wait_until(Duration::from_secs(120), || {
            let open = api.shared.counts.open_watches();
            chunk.iter().all(|&i| open[i] >= steady_watches[i].min(2))
        });
    }
    let restart = api.shared.counts.tally().since(&before);
    report::restart(&restart, nodes, batch, restart_start.elapsed());

    for node in &fleet {
        node.terminate();
    }
    for node in &mut fleet {
        node.reap();
    }
    println!();
    println!("nodes: {nodes}");
    println!(
        "steady_writes_per_node_hour: {:.2}",
        steady_summary.writes_per_node_hour
    );
    println!(
        "steady_lists_per_node_hour: {:.2}",
        steady_summary.lists_per_node_hour
    );
    println!("watches_per_node: {:.2}", steady_summary.watches_per_node);
    println!(
        "fault_converged_s: {}",
        fault_summary.map_or("never".to_owned(), |s| format!("{:.1}", s.as_secs_f64()))
    );
    println!(
        "outage_peak_second_fraction: {:.3}",
        outage_summary.peak_fraction
    );
    println!(
        "outage_converged_s: {}",
        outage_summary
            .converged
            .map_or("never".to_owned(), |s| format!("{:.1}", s.as_secs_f64()))
    );
}

/// The API server's rate during the fault: half a request per node per second (2 500/s for
/// 5 000 nodes, about what one API server instance serves).
fn fault_limit(nodes: usize) -> u64 {
    (nodes as u64 / 2).max(20)
}

/// Polls `done` every 200 ms until it holds or `limit` passes; whether it held.
fn wait_until(limit: Duration, mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if done() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Nodes whose Node carries gpud's condition and labels and whose slices are published.
fn settled(api: &FleetApi, fleet: &[Node]) -> bool {
    settled_count(api, fleet) == fleet.len()
}

fn settled_count(api: &FleetApi, fleet: &[Node]) -> usize {
    fleet
        .iter()
        .filter(|n| {
            api.condition(&n.name, GPU_CONDITION).is_some()
                && api.label(&n.name, "nvidia.com/gpu.count").is_some()
                && api.slices_of(&n.name) > 0
        })
        .count()
}

/// Nodes whose condition shows at least `gpus` unhealthy GPUs.
fn unhealthy(api: &FleetApi, fleet: &[Node], gpus: usize) -> usize {
    fleet
        .iter()
        .filter(|n| shows_unhealthy(api, n, gpus))
        .count()
}

fn shows_unhealthy(api: &FleetApi, node: &Node, gpus: usize) -> bool {
    api.condition_message(&node.name, GPU_CONDITION)
        .is_some_and(|m| m.contains(&format!(", {gpus} unhealthy")))
}

/// Median resident memory of the running gpud processes, in MiB.
fn rss_mib(fleet: &[Node]) -> u64 {
    let mut rss: Vec<u64> = fleet
        .iter()
        .filter_map(Node::pid)
        .map(proc::rss_kib)
        .collect();
    rss.sort_unstable();
    rss.get(rss.len() / 2).copied().unwrap_or(0) / 1024
}
