//! The workload an exporter really serves: a fresh body rendered every collect interval (1 s
//! here, to compress time), scraped once per interval by each of a few Prometheus servers on
//! keep-alive connections, or by a burst of new connections at once.
//!
//! Each interval's scrapes are sent at once, mid-interval, half a second after the body was
//! replaced and as long before the next sample; the server's CPU time (every gpud thread: the
//! simulated driver's control thread is not started) is read just before them and 20 ms after
//! the last answer, once the server has closed the burst's connections. CPU per scrape is
//! therefore what scraping costs a fresh body, sampling and rendering left out. Latency is
//! from sending the request (connecting, for the burst) to the last byte of the body.

use std::thread;
use std::time::{Duration, Instant};

use super::client::{Client, Error, Latencies, ms};
use super::proc::gpud_cpu_ns;
use super::servers::{Server, samples_in};

/// The collect interval of the run.
pub const INTERVAL: Duration = Duration::from_secs(1);
/// Intervals measured per scenario, unless `GPUD_BENCH_INTERVALS` says otherwise (more
/// intervals make the p99 of a single scraper more than its slowest scrape or two).
pub fn intervals() -> usize {
    std::env::var("GPUD_BENCH_INTERVALS")
        .ok()
        .and_then(|n| n.parse().ok())
        .filter(|n| *n > 0)
        .unwrap_or(20)
}

/// Who scrapes each interval.
pub struct Scenario {
    pub name: &'static str,
    /// Clients with a connection kept from one interval to the next, one scrape each.
    pub keep_alive: usize,
    /// Clients that connect, scrape once and close.
    pub burst: usize,
}

pub const SCENARIOS: [Scenario; 3] = [
    Scenario {
        name: "1 keep-alive scraper",
        keep_alive: 1,
        burst: 0,
    },
    Scenario {
        name: "4 keep-alive scrapers",
        keep_alive: 4,
        burst: 0,
    },
    Scenario {
        name: "64-connection burst",
        keep_alive: 0,
        burst: 64,
    },
];

/// What one scenario measured.
pub struct Outcome {
    pub scrapes: usize,
    pub cpu_ns: u64,
    pub latencies: Latencies,
}

impl Outcome {
    pub fn cpu_us_per_scrape(&self) -> f64 {
        self.cpu_ns as f64 / 1e3 / self.scrapes as f64
    }

    pub fn print(&self, server: &str, scenario: &str) {
        println!(
            "  {server:<24} {scenario:<22} {:>5} scrapes   CPU {:>7.1} us/scrape   p50 {:>6.3} ms   p99 {:>6.3} ms   max {:>6.3} ms",
            self.scrapes,
            self.cpu_us_per_scrape(),
            ms(self.latencies.percentile(0.5)),
            ms(self.latencies.percentile(0.99)),
            ms(self.latencies.max()),
        );
    }
}

/// When the exporter on `port` published its latest body, found by watching its sample count
/// change (polled every 5 ms on one connection).
fn body_replaced_at(port: u16) -> Result<Instant, Error> {
    let mut client = Client::connected(port)?;
    let first = samples_in(&String::from_utf8(client.get("/metrics")?.body)?);
    let deadline = Instant::now() + 5 * INTERVAL;
    while Instant::now() < deadline {
        thread::sleep(Duration::from_millis(5));
        if samples_in(&String::from_utf8(client.get("/metrics")?.body)?) != first {
            return Ok(Instant::now());
        }
    }
    Err("the exporter published no new body within 5 intervals".into())
}

/// Runs `scenario` against `server` for [`intervals`] intervals. Every answer must be 200 with
/// `expected_len` bytes, give or take the few that change between bodies.
pub fn measure(
    server: &Server,
    scenario: &Scenario,
    expected_len: usize,
) -> Result<Outcome, Error> {
    let (port, pid) = (server.port, server.proc.pid());
    let mut clients = (0..scenario.keep_alive)
        .map(|_| Client::connected(port))
        .collect::<Result<Vec<_>, _>>()?;
    let mut next = body_replaced_at(port)? + INTERVAL / 2;
    while next < Instant::now() + Duration::from_millis(200) {
        next += INTERVAL;
    }
    let (mut cpu_ns, mut latencies) = (0, Vec::new());
    for _ in 0..intervals() {
        thread::sleep(next.saturating_duration_since(Instant::now()));
        next += INTERVAL;
        let before = gpud_cpu_ns(pid);
        let round: Vec<Result<(Duration, usize), String>> = thread::scope(|scope| {
            let mut scrapes = Vec::new();
            for client in &mut clients {
                scrapes.push(scope.spawn(move || timed_scrape(client)));
            }
            for _ in 0..scenario.burst {
                scrapes.push(scope.spawn(move || timed_scrape(&mut Client::new(port))));
            }
            scrapes
                .into_iter()
                .map(|s| {
                    s.join()
                        .unwrap_or_else(|_| Err("scrape thread panicked".into()))
                })
                .collect()
        });
        // The burst's clients are gone: let the server close their connections.
        thread::sleep(Duration::from_millis(20));
        cpu_ns += gpud_cpu_ns(pid).saturating_sub(before);
        for scrape in round {
            let (latency, len) = scrape?;
            if len.abs_diff(expected_len) > 512 {
                return Err(format!("a {len}-byte body, expected about {expected_len}").into());
            }
            latencies.push(latency);
        }
    }
    Ok(Outcome {
        scrapes: latencies.len(),
        cpu_ns,
        latencies: Latencies::new(latencies),
    })
}

/// One `GET /metrics`: its latency and body length; anything but 200 is an error.
fn timed_scrape(client: &mut Client) -> Result<(Duration, usize), String> {
    let start = Instant::now();
    let response = client.get("/metrics").map_err(|e| e.to_string())?;
    let latency = start.elapsed();
    if response.status != 200 {
        return Err(format!("status {}", response.status));
    }
    Ok((latency, response.body.len()))
}
