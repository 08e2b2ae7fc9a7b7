//! gpud beside the exporter users would pick instead on a node without DCGM: nvitop-exporter
//! (Python, prometheus_client), on the same simulated dgx-h100, each collecting every second.
//!
//! Both run at once. Idle: CPU over 10 s with no scrapes (every thread of each process; the
//! simulated driver's control thread is not started), and resident memory. Then, one after the
//! other, 4 clients scrape as fast as each answers for 5 s: throughput, latency percentiles,
//! CPU per request, resident memory after. nvitop-exporter's server speaks HTTP/1.0 and closes
//! every connection after its answer, so its clients reconnect for each request; gpud keeps
//! them open, as Prometheus does.

use std::path::Path;
use std::time::Duration;

use super::client::{Error, get_once, ms};
use super::load::{Budget, flat_out};
use super::proc::{rss_kib, threads_cpu_ns};
use super::servers::{Node, Server, start_exporter, start_nvitop};

const IDLE: Duration = Duration::from_secs(10);
const LOAD: Duration = Duration::from_secs(5);
const CONNECTIONS: usize = 4;

fn cpu_ns(server: &Server) -> u64 {
    threads_cpu_ns(server.proc.pid(), |_| true)
}

/// Runs the comparison; says so and returns when nvitop-exporter is not installed.
pub fn run(gpud: &Path, nvitop: Option<&Path>, node: &Node<'_>) -> Result<(), Error> {
    let Some(nvitop) = nvitop else {
        println!(
            "\nnvitop-exporter: not installed (benches/exporter.sh installs it from PyPI into a virtual environment); comparison skipped"
        );
        return Ok(());
    };
    let servers = [
        ("gpud exporter", start_exporter(gpud, node, 1_000)?),
        ("nvitop-exporter", start_nvitop(nvitop, node)?),
    ];
    // Past start-up work (imports, discovery, the first samples).
    std::thread::sleep(Duration::from_secs(3));
    let before: Vec<u64> = servers.iter().map(|(_, s)| cpu_ns(s)).collect();
    std::thread::sleep(IDLE);
    let idle_percent: Vec<f64> = servers
        .iter()
        .zip(&before)
        .map(|((_, s), b)| (cpu_ns(s) - b) as f64 / IDLE.as_nanos() as f64 * 100.0)
        .collect();
    println!(
        "\n{}: gpud exporter and nvitop-exporter side by side, both collecting every 1 s; {CONNECTIONS} clients for {} s each",
        node.fixture,
        LOAD.as_secs()
    );
    for ((name, server), idle) in servers.iter().zip(idle_percent) {
        let rss_idle = rss_kib(server.proc.pid());
        let body_len = get_once(server.port, "/metrics")?.body.len();
        let accept = |r: &super::client::Response| {
            if r.status == 200 && !r.body.is_empty() {
                Ok(())
            } else {
                Err(format!("status {}, {} bytes", r.status, r.body.len()))
            }
        };
        let run = flat_out(
            server.port,
            CONNECTIONS,
            Budget::Time(LOAD),
            &accept,
            || cpu_ns(server),
        )?;
        println!(
            "  {name:<16} body {:>6} B   {:>7.0} req/s   p50 {:>7.3} ms   p99 {:>7.3} ms   CPU {:>7.1} us/request   \
             idle CPU {idle:.2} % of a core   RSS {:.1} MiB idle, {:.1} MiB after",
            body_len,
            run.per_second(),
            ms(run.latencies.percentile(0.5)),
            ms(run.latencies.percentile(0.99)),
            run.cpu_us_per_request(),
            rss_idle as f64 / 1024.0,
            rss_kib(server.proc.pid()) as f64 / 1024.0,
        );
    }
    Ok(())
}
