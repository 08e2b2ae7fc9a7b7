//! `gpud exporter` under load, on the simulated driver with a pinned clock, for two nodes:
//! `dgx-h100` (8 GPUs) and `h100-mig` (8 GPUs × 7 MIG instances = 56 series per field).
//!
//! 1. **Throughput against a static file server**: the exporter's `/metrics` body is copied
//!    into a directory a throwaway nginx serves on loopback, and the same load (keep-alive
//!    `GET /metrics` from 4 connections, a fixed number of requests) goes to both, in
//!    alternating rounds since the machine is usually shared; each is judged by its median
//!    round. Each round also records the server's CPU time per request (every gpud thread;
//!    nginx's master and workers), which other work on the machine disturbs far less than
//!    throughput. With `GPUD_BENCH_BASELINE` (below) that build takes its turns too.
//! 2. **A fresh body every interval** ([`realistic`]): what production looks like, a body
//!    rendered every collect interval and scraped once to a few times: CPU per scrape and
//!    latency for 1 and 4 keep-alive scrapers and a 64-connection burst. With
//!    `GPUD_BENCH_BASELINE=<another gpud binary>` the same runs are made against that build,
//!    side by side; `GPUD_BENCH_INTERVALS` sets how many intervals (20).
//! 3. **The peer** ([`peer`]): nvitop-exporter on the same simulated dgx-h100: throughput,
//!    latency, resident memory, idle CPU. Skipped with a line when it is not installed
//!    (`NVITOP_EXPORTER=<path>`, or on `PATH`).
//! 4. **CPU per sample cycle**: an exporter sampling every 100 ms with no scrapes; CPU time of
//!    every gpud thread divided by the cycles completed; and resident memory across the rounds.
//!
//! nginx is found on `PATH` or in `/usr/sbin`; `benches/exporter.sh` installs nginx and
//! nvitop-exporter when they are missing. `cargo bench --bench exporter_scrape -- h100-mig`
//! runs one node; `--scrape-only` runs only part 1, `--fresh-only` only part 2.

// Benches are configured by their environment (GPUD_BENCH_*, PATH).
#![allow(clippy::disallowed_methods)]

#[path = "exporter/client.rs"]
mod client;
#[path = "exporter/load.rs"]
mod load;
#[path = "exporter/peer.rs"]
mod peer;
#[path = "support/proc.rs"]
mod proc;
#[path = "exporter/realistic.rs"]
mod realistic;
#[path = "exporter/servers.rs"]
mod servers;

use std::path::{Path, PathBuf};
use std::time::Duration;

use client::{Error, Response, get_once, ms};
use load::{Budget, Run, flat_out, paired_ratio};
use proc::{gpud_cpu_ns, rss_kib, tree_cpu_ns};
use servers::{Node, find_program, samples_total, start_exporter, start_nginx};

/// Concurrent keep-alive connections of the throughput runs.
const CONNECTIONS: usize = 4;

fn main() -> Result<(), Error> {
    let exe = std::env::current_exe()?;
    let deps = exe.parent().ok_or("no deps dir")?;
    let mock = deps.join("libnvidia_ml_mock.so");
    let gpud = PathBuf::from(env!("CARGO_BIN_EXE_gpud"));
    let args: Vec<String> = std::env::args().skip(1).collect();
    let flag = |name: &str| args.iter().any(|a| a == name);
    let (scrape_only, fresh_only) = (flag("--scrape-only"), flag("--fresh-only"));
    let only: Vec<&String> = args.iter().filter(|a| !a.starts_with('-')).collect();
    let wanted = |fixture: &str| only.is_empty() || only.iter().any(|o| *o == fixture);
    let dir = tempfile::tempdir()?;
    let node = |fixture| Node {
        mock: &mock,
        fixture,
        dir: dir.path(),
    };
    let fixtures = [("dgx-h100", 20_000), ("h100-mig", 10_000)];

    let baseline = std::env::var_os("GPUD_BENCH_BASELINE").map(PathBuf::from);
    if !fresh_only {
        let nginx = find_program("nginx", &["/usr/sbin", "/sbin"]);
        if nginx.is_none() {
            println!(
                "exporter: nginx not found; run benches/exporter.sh (installs it) for the comparison"
            );
        }
        println!(
            "exporter: {CONNECTIONS} keep-alive connections on loopback; nginx serves the same body as a static file"
        );
        for (fixture, requests) in fixtures {
            if wanted(fixture) {
                throughput(
                    &gpud,
                    baseline.as_deref(),
                    &node(fixture),
                    nginx.as_deref(),
                    requests,
                )?;
            }
        }
    }
    if !scrape_only {
        for (fixture, _) in fixtures {
            if wanted(fixture) {
                fresh_bodies(&gpud, baseline.as_deref(), &node(fixture))?;
            }
        }
    }
    if !scrape_only && !fresh_only {
        if wanted("dgx-h100") {
            let nvitop = std::env::var_os("NVITOP_EXPORTER")
                .map(PathBuf::from)
                .or_else(|| find_program("nvitop-exporter", &[]));
            peer::run(&gpud, nvitop.as_deref(), &node("dgx-h100"))?;
        }
        for (fixture, _) in fixtures {
            if wanted(fixture) {
                cpu_per_cycle(&gpud, &node(fixture))?;
            }
        }
    }
    Ok(())
}

// === 1. throughput against nginx ===

/// Rounds of alternating load: the node is shared with other work, so gpud and nginx take
/// turns and each is judged by its median round.
const ROUNDS: usize = 7;

fn throughput(
    gpud: &Path,
    baseline: Option<&Path>,
    node: &Node<'_>,
    nginx: Option<&Path>,
    requests: usize,
) -> Result<(), Error> {
    // Sampling every second, as a busy node would; the clock is pinned, so bodies differ only in
    // gpud's own counters.
    let exporter = start_exporter(gpud, node, 1_000)?;
    let (port, pid) = (exporter.port, exporter.proc.pid());
    let body = get_once(port, "/metrics")?.body;
    println!(
        "\n{}: /metrics body {} bytes, {} series; {ROUNDS} alternating rounds of {} requests",
        node.fixture,
        body.len(),
        String::from_utf8_lossy(&body)
            .lines()
            .filter(|l| !l.starts_with('#'))
            .count(),
        requests / ROUNDS
    );
    // The servers that take turns.
    let mut servers: Vec<Contender> =
        vec![("gpud exporter", port, Box::new(move || gpud_cpu_ns(pid)))];
    let baseline = match baseline {
        Some(baseline) => Some(start_exporter(baseline, node, 1_000)?),
        None => None,
    };
    if let Some(server) = &baseline {
        let pid = server.proc.pid();
        servers.push(("baseline", server.port, Box::new(move || gpud_cpu_ns(pid))));
    }
    let nginx_dir = node.dir.join(format!("nginx-{}", node.fixture));
    std::fs::create_dir_all(&nginx_dir)?;
    let nginx = match nginx {
        Some(nginx) => Some(start_nginx(nginx, &nginx_dir, &body)?),
        None => None,
    };
    if let Some(server) = &nginx {
        let master = server.proc.pid();
        servers.push((
            "nginx (static file)",
            server.port,
            Box::new(move || tree_cpu_ns(master)),
        ));
    }
    // Every answer is 200 with the body's length, give or take the few bytes of gpud's
    // changing counters (and the baseline's body, which may lack some of gpud's families).
    let expected = body.len();
    let accept = move |r: &Response| {
        if r.status == 200 && r.body.len().abs_diff(expected) <= 2048 {
            Ok(())
        } else {
            Err(format!("status {}, {} bytes", r.status, r.body.len()))
        }
    };
    let rss_start = rss_kib(pid);
    let mut rss_marks = Vec::new();
    let mut served = 0;
    let mut rounds: Vec<Vec<Run>> = servers.iter().map(|_| Vec::new()).collect();
    let per_round = Budget::Requests(requests / ROUNDS);
    for _ in 0..ROUNDS {
        for ((_, port, cpu), runs) in servers.iter().zip(&mut rounds) {
            runs.push(flat_out(*port, CONNECTIONS, per_round, &accept, cpu)?);
        }
        served += rounds[0].last().map_or(0, |run| run.requests);
        rss_marks.push((served, rss_kib(pid)));
    }
    let paired: Vec<(f64, f64, f64)> = rounds
        .iter()
        .skip(1)
        .map(|runs| paired_ratio(&rounds[0], runs))
        .collect();
    let medians: Vec<(f64, Run)> = rounds
        .into_iter()
        .map(|runs| (median_cpu(&runs), median(runs)))
        .collect();
    for ((name, ..), (_, run)) in servers.iter().zip(&medians) {
        report(name, run);
    }
    let (gpud_cpu, _) = &medians[0];
    for (((name, ..), (cpu, _)), (ratio, low, high)) in
        servers.iter().zip(&medians).skip(1).zip(paired)
    {
        let goal = if name.starts_with("nginx") {
            " (goal >= 80 %)"
        } else {
            ""
        };
        println!(
            "  gpud / {name}: throughput {:.0} %{goal} (median of the rounds' ratios; {:.0}–{:.0} %), \
             server CPU per request (median round) {gpud_cpu:.1} / {cpu:.1} us = {:.0} %",
            100.0 * ratio,
            100.0 * low,
            100.0 * high,
            100.0 * gpud_cpu / cpu
        );
    }
    let mut rss = format!("  gpud RSS: {:.1} MiB at start", rss_start as f64 / 1024.0);
    for (n, kib) in rss_marks {
        rss.push_str(&format!(", {:.1} after {n}", kib as f64 / 1024.0));
    }
    println!("{rss} scrapes (goal <= 16 MiB, flat)");
    Ok(())
}

/// A server that takes its turns in the throughput rounds: name, port, and how to read its CPU
/// time in ns.
type Contender = (&'static str, u16, Box<dyn Fn() -> u64>);

/// The median of the rounds' server CPU time per request, in µs.
fn median_cpu(rounds: &[Run]) -> f64 {
    let mut cpu: Vec<f64> = rounds.iter().map(Run::cpu_us_per_request).collect();
    cpu.sort_by(f64::total_cmp);
    cpu[cpu.len() / 2]
}

/// The round with the median throughput.
fn median(mut rounds: Vec<Run>) -> Run {
    rounds.sort_by(|a, b| a.per_second().total_cmp(&b.per_second()));
    let mid = rounds.len() / 2;
    rounds.swap_remove(mid)
}

fn report(name: &str, run: &Run) {
    println!(
        "  {name:<20} {:>9.0} req/s   p50 {:>7.3} ms   p99 {:>7.3} ms   max {:>7.3} ms   ({} requests)",
        run.per_second(),
        ms(run.latencies.percentile(0.5)),
        ms(run.latencies.percentile(0.99)),
        ms(run.latencies.max()),
        run.requests
    );
}

// === 2. a fresh body every interval ===

fn fresh_bodies(gpud: &Path, baseline: Option<&Path>, node: &Node<'_>) -> Result<(), Error> {
    let mut servers = vec![("gpud exporter", start_exporter(gpud, node, 1_000)?)];
    if let Some(baseline) = baseline {
        servers.push(("baseline", start_exporter(baseline, node, 1_000)?));
    }
    let mut expected = Vec::new();
    for (_, server) in &servers {
        expected.push(get_once(server.port, "/metrics")?.body.len());
    }
    println!(
        "\n{}: a fresh body every {} s, scraped mid-interval; {} intervals per scenario{}",
        node.fixture,
        realistic::INTERVAL.as_secs(),
        realistic::intervals(),
        baseline.map_or(String::new(), |b| format!("; baseline is {}", b.display()))
    );
    for (n, scenario) in realistic::SCENARIOS.iter().enumerate() {
        // Alternate which server goes first.
        let mut order: Vec<usize> = (0..servers.len()).collect();
        if n % 2 == 1 {
            order.reverse();
        }
        for i in order {
            let (name, server) = &servers[i];
            realistic::measure(server, scenario, expected[i])?.print(name, scenario.name);
        }
    }
    if baseline.is_none() {
        println!(
            "  (GPUD_BENCH_BASELINE=<path to another gpud build> runs the same against that build)"
        );
    }
    Ok(())
}

// === 4. CPU per sample cycle ===

fn cpu_per_cycle(gpud: &Path, node: &Node<'_>) -> Result<(), Error> {
    let exporter = start_exporter(gpud, node, 100)?;
    let (port, pid) = (exporter.port, exporter.proc.pid());
    std::thread::sleep(Duration::from_millis(500));
    let (cpu0, cycles0) = (gpud_cpu_ns(pid), samples_total(port)?);
    std::thread::sleep(Duration::from_secs(10));
    let (cpu1, cycles1) = (gpud_cpu_ns(pid), samples_total(port)?);
    let cycles = cycles1.saturating_sub(cycles0).max(1);
    let per_cycle_ms = (cpu1 - cpu0) as f64 / cycles as f64 / 1e6;
    println!(
        "\n{}: CPU per sample cycle {per_cycle_ms:.3} ms ({cycles} cycles at 100 ms, all gpud threads) \
         = {:.2} % of a core at the default 30 s interval",
        node.fixture,
        per_cycle_ms / 30_000.0 * 100.0
    );
    Ok(())
}
