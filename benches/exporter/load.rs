//! Load as fast as the server answers: keep-alive `GET /metrics` from a few connections at
//! once, for a number of requests or a time, with the server's CPU time over the run.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use super::client::{Client, Error, Latencies, Response};

/// How much load.
#[derive(Clone, Copy)]
pub enum Budget {
    Requests(usize),
    Time(Duration),
}

/// Result of one run.
pub struct Run {
    pub requests: usize,
    pub wall: Duration,
    pub latencies: Latencies,
    /// CPU time the server spent on the run, in ns.
    pub server_cpu_ns: u64,
}

impl Run {
    pub fn per_second(&self) -> f64 {
        self.requests as f64 / self.wall.as_secs_f64()
    }

    pub fn cpu_us_per_request(&self) -> f64 {
        self.server_cpu_ns as f64 / 1e3 / self.requests as f64
    }
}

/// `connections` keep-alive clients sending `GET /metrics` one after the other until `budget`
/// is spent; every answer must satisfy `accept`. `server_cpu` reads the server's CPU time in ns.
pub fn flat_out(
    port: u16,
    connections: usize,
    budget: Budget,
    accept: &(dyn Fn(&Response) -> Result<(), String> + Sync),
    server_cpu: impl Fn() -> u64,
) -> Result<Run, Error> {
    let cpu_before = server_cpu();
    let issued = AtomicUsize::new(0);
    let start = Instant::now();
    let per_worker = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..connections)
            .map(|_| {
                let issued = &issued;
                scope.spawn(move || -> Result<Vec<Duration>, String> {
                    let mut client = Client::connected(port).map_err(|e| e.to_string())?;
                    let mut latencies = Vec::new();
                    loop {
                        let more = match budget {
                            Budget::Requests(n) => issued.fetch_add(1, Ordering::Relaxed) < n,
                            Budget::Time(d) => start.elapsed() < d,
                        };
                        if !more {
                            return Ok(latencies);
                        }
                        let t = Instant::now();
                        let response = client.get("/metrics").map_err(|e| e.to_string())?;
                        latencies.push(t.elapsed());
                        accept(&response)?;
                    }
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| {
                w.join()
                    .unwrap_or_else(|_| Err("load thread panicked".into()))
            })
            .collect::<Vec<_>>()
    });
    let mut latencies = Vec::new();
    for worker in per_worker {
        latencies.extend(worker?);
    }
    let wall = start.elapsed();
    let server_cpu_ns = server_cpu().saturating_sub(cpu_before);
    Ok(Run {
        requests: latencies.len(),
        wall,
        latencies: Latencies::new(latencies),
        server_cpu_ns,
    })
}

/// The throughput ratio of `first` over `other`, from alternating rounds: each round's ratio
/// is taken between neighbours in time, which saw the same load from the rest of a shared
/// machine, so their median is steadier than a ratio of the two medians. Median, lowest and
/// highest ratio.
pub fn paired_ratio(first: &[Run], other: &[Run]) -> (f64, f64, f64) {
    let mut ratios: Vec<f64> = first
        .iter()
        .zip(other)
        .map(|(a, b)| a.per_second() / b.per_second())
        .collect();
    ratios.sort_by(f64::total_cmp);
    match (ratios.first(), ratios.last()) {
        (Some(low), Some(high)) => (ratios[ratios.len() / 2], *low, *high),
        _ => (0.0, 0.0, 0.0),
    }
}
