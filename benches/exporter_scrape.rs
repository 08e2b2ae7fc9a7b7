//! Scrape throughput, latency, CPU and memory of `gpud exporter`, side by side with nginx
//! serving the same bytes.
//!
//! For each node (`dgx-h100`: 8 GPUs; `h100-mig`: 8 GPUs × 7 MIG instances = 56 series per
//! field) the release binary runs on the simulated driver with a pinned clock. Its `/metrics`
//! body is copied into a directory a throwaway nginx serves as a static file on loopback, and
//! the same load — keep-alive HTTP/1.1 `GET /metrics` from a fixed number of connections, a
//! bounded number of requests — is sent to both, one after the other, in the same run.
//!
//! Also measured:
//! * CPU per sample cycle: a second exporter sampling every 100 ms with no scrapes; CPU time of
//!   every gpud thread (from `/proc/<pid>/task/*/schedstat`) excluding the simulated driver's
//!   control-file thread (`nvml-mock-contr…`, which polls a file every millisecond and is not
//!   part of gpud), divided by the cycles completed;
//! * resident memory of the exporter at start and after each round of scrapes (10 000 or more
//!   in all on `dgx-h100`).
//!
//! The machine that runs this is usually shared, so the two servers take turns: several
//! rounds of the same load alternate between gpud and nginx, and each is judged by its median
//! round. Each round also records the server's CPU time per request (every gpud thread but the
//! simulated driver's control watcher; nginx's master and workers), which other work on the
//! machine disturbs far less than throughput.
//!
//! nginx is found on `PATH` or in `/usr/sbin`; `benches/exporter.sh` installs it when missing.

#[path = "support/proc.rs"]
mod proc;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use proc::{gpud_cpu_ns, rss_kib, threads_cpu_ns};

type Error = Box<dyn std::error::Error>;

/// Concurrent keep-alive connections of the load generator.
const CONNECTIONS: usize = 4;

fn main() -> Result<(), Error> {
    let exe = std::env::current_exe()?;
    let deps = exe.parent().ok_or("no deps dir")?;
    let mock = deps.join("libnvidia_ml_mock.so");
    let nginx = find_nginx();
    if nginx.is_none() {
        println!(
            "exporter: nginx not found; run benches/exporter.sh (installs it) for the comparison"
        );
    }
    println!(
        "exporter: {CONNECTIONS} keep-alive connections on loopback; nginx serves the same body as a static file"
    );
    // `cargo bench --bench exporter_scrape -- h100-mig` runs one node only; `--scrape-only`
    // leaves out the CPU-per-cycle runs (for repeating the comparison).
    let args: Vec<String> = std::env::args().skip(1).collect();
    let scrape_only = args.iter().any(|a| a == "--scrape-only");
    let only: Vec<&String> = args.iter().filter(|a| !a.starts_with('-')).collect();
    let wanted = |fixture: &str| only.is_empty() || only.iter().any(|o| *o == fixture);
    for (fixture, requests) in [("dgx-h100", 20_000), ("h100-mig", 10_000)] {
        if wanted(fixture) {
            scrape_bench(&mock, nginx.as_deref(), fixture, requests)?;
        }
    }
    for fixture in ["dgx-h100", "h100-mig"] {
        if wanted(fixture) && !scrape_only {
            cpu_per_cycle(&mock, fixture)?;
        }
    }
    Ok(())
}

// === processes ===

/// A child process stopped on drop: SIGTERM first, so that nginx's master takes its workers
/// down with it (SIGKILL would leave them running), then SIGKILL if it is still there.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let pid = self.0.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        for _ in 0..100 {
            if matches!(self.0.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> Result<u16, Error> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

fn start_exporter(
    mock: &Path,
    dir: &Path,
    fixture: &str,
    interval_ms: u64,
) -> Result<(Proc, u16), Error> {
    let port = free_port()?;
    let control = dir.join("control");
    std::fs::write(&control, "")?;
    let child = Command::new(env!("CARGO_BIN_EXE_gpud"))
        .args([
            "exporter",
            "-a",
            &format!("127.0.0.1:{port}"),
            "-c",
            &interval_ms.to_string(),
            "--kmsg",
            "",
        ])
        .env("GPUD_NVML_LIB", mock)
        .env("NVML_MOCK_FIXTURE", fixture)
        .env("NVML_MOCK_CLOCK", "1000")
        .env("NVML_MOCK_CONTROL", &control)
        .env("NODE_NAME", "bench-node")
        .env("GPUD_LOG", "warn")
        .stdout(Stdio::null())
        .spawn()?;
    let proc = Proc(child);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok((200, _)) = get_once(port, "/readyz") {
            return Ok((proc, port));
        }
        if Instant::now() > deadline {
            return Err("exporter not ready".into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[allow(clippy::disallowed_methods)] // PATH is searched like a shell does
fn find_nginx() -> Option<PathBuf> {
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/sbin")])
        .map(|d| d.join("nginx"))
        .find(|p| p.is_file())
}

/// nginx serving `body` at `/metrics` with the exporter's content type, on loopback.
fn start_nginx(nginx: &Path, dir: &Path, body: &[u8]) -> Result<(Proc, u16), Error> {
    use std::os::unix::fs::PermissionsExt;
    let port = free_port()?;
    let www = dir.join("www");
    std::fs::create_dir_all(&www)?;
    std::fs::write(www.join("metrics"), body)?;
    // nginx workers may run as another user: let them read the directory.
    for path in [dir, &www] {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))?;
    }
    std::fs::set_permissions(www.join("metrics"), std::fs::Permissions::from_mode(0o644))?;
    let d = dir.display();
    let conf = format!(
        "worker_processes 2;\ndaemon off;\npid {d}/nginx.pid;\nerror_log {d}/nginx-error.log warn;\n\
         events {{ worker_connections 256; }}\n\
         http {{\n  access_log off;\n  sendfile on;\n  tcp_nopush on;\n  tcp_nodelay on;\n  keepalive_requests 1000000;\n\
           client_body_temp_path {d}/tmp-body;\n  proxy_temp_path {d}/tmp-proxy;\n  fastcgi_temp_path {d}/tmp-fcgi;\n\
           uwsgi_temp_path {d}/tmp-uwsgi;\n  scgi_temp_path {d}/tmp-scgi;\n\
           server {{\n    listen 127.0.0.1:{port};\n    root {www};\n\
             location = /metrics {{ default_type \"text/plain; version=0.0.4; charset=utf-8\"; }}\n  }}\n}}\n",
        www = www.display()
    );
    let conf_path = dir.join("nginx.conf");
    std::fs::write(&conf_path, conf)?;
    let child = Command::new(nginx)
        .arg("-c")
        .arg(&conf_path)
        .arg("-e")
        .arg(dir.join("nginx-error.log"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    let proc = Proc(child);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Ok((200, got)) = get_once(port, "/metrics") {
            if got == body {
                return Ok((proc, port));
            }
            return Err("nginx serves different bytes".into());
        }
        if Instant::now() > deadline {
            return Err("nginx did not start".into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

// === HTTP ===

/// One request on a fresh connection: status and body.
fn get_once(port: u16, path: &str) -> Result<(u16, Vec<u8>), Error> {
    let mut stream = TcpStream::connect(("127.0.0.1", port))?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )?;
    let mut reader = BufReader::new(stream);
    let (status, body) = read_response(&mut reader)?;
    Ok((status, body))
}

/// Reads one response (status line, headers, `Content-Length` body).
fn read_response(reader: &mut BufReader<TcpStream>) -> Result<(u16, Vec<u8>), Error> {
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let status: u16 = line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or("bad status line")?;
    let mut length = 0usize;
    loop {
        line.clear();
        reader.read_line(&mut line)?;
        let header = line.trim_end();
        if header.is_empty() {
            break;
        }
        if let Some((name, value)) = header.split_once(':')
            && name.eq_ignore_ascii_case("content-length")
        {
            length = value.trim().parse()?;
        }
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body)?;
    Ok((status, body))
}

/// Result of one load run.
struct Load {
    requests: usize,
    wall: Duration,
    latencies: Vec<Duration>,
    /// CPU time the server spent on the round, in ns.
    server_cpu_ns: u64,
}

impl Load {
    fn per_second(&self) -> f64 {
        self.requests as f64 / self.wall.as_secs_f64()
    }

    fn cpu_us_per_request(&self) -> f64 {
        self.server_cpu_ns as f64 / 1e3 / self.requests as f64
    }

    fn percentile(&self, p: f64) -> Duration {
        let i = ((self.latencies.len() as f64 - 1.0) * p).round() as usize;
        self.latencies[i]
    }
}

/// `requests` keep-alive `GET /metrics` over [`CONNECTIONS`] connections; every answer must be
/// 200 with `expected_len` bytes, give or take the few bytes of gpud's changing sample count
/// and duration. `server_cpu` reads the server's CPU time in ns.
fn load(
    port: u16,
    requests: usize,
    expected_len: usize,
    server_cpu: impl Fn() -> u64,
) -> Result<Load, Error> {
    let cpu_before = server_cpu();
    let next = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let workers: Vec<_> = (0..CONNECTIONS)
        .map(|_| {
            let next = Arc::clone(&next);
            std::thread::spawn(move || -> Result<Vec<Duration>, String> {
                let stream = TcpStream::connect(("127.0.0.1", port)).map_err(|e| e.to_string())?;
                stream.set_nodelay(true).map_err(|e| e.to_string())?;
                let mut writer = stream.try_clone().map_err(|e| e.to_string())?;
                let mut reader = BufReader::with_capacity(256 * 1024, stream);
                let mut latencies = Vec::new();
                while next.fetch_add(1, Ordering::Relaxed) < requests {
                    let t = Instant::now();
                    writer
                        .write_all(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
                        .map_err(|e| e.to_string())?;
                    let (status, body) = read_response(&mut reader).map_err(|e| e.to_string())?;
                    latencies.push(t.elapsed());
                    if status != 200 || body.len().abs_diff(expected_len) > 64 {
                        return Err(format!("status {status}, {} bytes", body.len()));
                    }
                }
                Ok(latencies)
            })
        })
        .collect();
    let mut latencies = Vec::with_capacity(requests);
    for worker in workers {
        latencies.extend(worker.join().map_err(|_| "load thread panicked")??);
    }
    let wall = start.elapsed();
    let server_cpu_ns = server_cpu().saturating_sub(cpu_before);
    latencies.sort();
    Ok(Load {
        requests: latencies.len(),
        wall,
        latencies,
        server_cpu_ns,
    })
}

/// CPU time of process `pid` and its children (nginx's master and workers), in ns.
fn tree_cpu_ns(pid: u32) -> u64 {
    let children = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter(|child| {
            // The parent pid is the second field after the parenthesised command name.
            std::fs::read_to_string(format!("/proc/{child}/stat"))
                .ok()
                .and_then(|stat| {
                    let (_, rest) = stat.rsplit_once(')')?;
                    rest.split_whitespace().nth(1)?.parse::<u32>().ok()
                })
                == Some(pid)
        });
    let all = |_: &str| true;
    threads_cpu_ns(pid, all)
        + children
            .map(|child| threads_cpu_ns(child, all))
            .sum::<u64>()
}

fn samples_total(port: u16) -> Result<u64, Error> {
    let (_, body) = get_once(port, "/metrics")?;
    let text = String::from_utf8(body)?;
    Ok(text
        .lines()
        .find_map(|l| l.strip_prefix("gpud_samples_total "))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0))
}

// === benchmarks ===

/// Rounds of alternating load: the node is shared with other work, so gpud and nginx take
/// turns and each is judged by its median round.
const ROUNDS: usize = 5;

fn scrape_bench(
    mock: &Path,
    nginx: Option<&Path>,
    fixture: &str,
    requests: usize,
) -> Result<(), Error> {
    let dir = tempfile::tempdir()?;
    // Sampling every second, as a busy node would; the clock is pinned, so bodies differ only in
    // gpud's own sample count and duration.
    let (exporter, port) = start_exporter(mock, dir.path(), fixture, 1_000)?;
    let pid = exporter.0.id();
    while samples_total(port)? < 2 {
        std::thread::sleep(Duration::from_millis(50));
    }
    let (_, body) = get_once(port, "/metrics")?;
    println!(
        "\n{fixture}: /metrics body {} bytes, {} series; {ROUNDS} alternating rounds of {} requests",
        body.len(),
        String::from_utf8_lossy(&body)
            .lines()
            .filter(|l| !l.starts_with('#'))
            .count(),
        requests / ROUNDS
    );
    let nginx = match nginx {
        Some(nginx) => Some(start_nginx(nginx, dir.path(), &body)?),
        None => None,
    };
    let rss_start = rss_kib(pid);
    let mut rss_marks = Vec::new();
    let mut served = 0;
    let (mut gpud_rounds, mut nginx_rounds) = (Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        let round = load(port, requests / ROUNDS, body.len(), || gpud_cpu_ns(pid))?;
        served += round.requests;
        rss_marks.push((served, rss_kib(pid)));
        gpud_rounds.push(round);
        if let Some((nginx, nginx_port)) = &nginx {
            let master = nginx.0.id();
            nginx_rounds.push(load(*nginx_port, requests / ROUNDS, body.len(), || {
                tree_cpu_ns(master)
            })?);
        }
    }
    let gpud_cpu = median_cpu(&gpud_rounds);
    let gpud = median(gpud_rounds);
    report("gpud exporter", &gpud);
    if !nginx_rounds.is_empty() {
        let nginx_cpu = median_cpu(&nginx_rounds);
        let static_file = median(nginx_rounds);
        report("nginx (static file)", &static_file);
        println!(
            "  gpud / nginx throughput: {:.0} % (goal >= 80 %)",
            100.0 * gpud.per_second() / static_file.per_second()
        );
        println!(
            "  server CPU per request (median round): gpud {gpud_cpu:.1} us, nginx {nginx_cpu:.1} us \
             (gpud / nginx {:.0} %)",
            100.0 * gpud_cpu / nginx_cpu
        );
    } else {
        println!("  server CPU per request (median round): gpud {gpud_cpu:.1} us");
    }
    let mut rss = format!("  gpud RSS: {:.1} MiB at start", rss_start as f64 / 1024.0);
    for (n, kib) in rss_marks {
        rss.push_str(&format!(", {:.1} after {n}", kib as f64 / 1024.0));
    }
    println!("{rss} scrapes (goal <= 16 MiB, flat)");
    Ok(())
}

/// The median of the rounds' server CPU time per request, in µs.
fn median_cpu(rounds: &[Load]) -> f64 {
    let mut cpu: Vec<f64> = rounds.iter().map(Load::cpu_us_per_request).collect();
    cpu.sort_by(f64::total_cmp);
    cpu[cpu.len() / 2]
}

/// The round with the median throughput.
fn median(mut rounds: Vec<Load>) -> Load {
    rounds.sort_by(|a, b| a.per_second().total_cmp(&b.per_second()));
    let mid = rounds.len() / 2;
    rounds.swap_remove(mid)
}

fn report(name: &str, load: &Load) {
    println!(
        "  {name:<20} {:>9.0} req/s   p50 {:>7.3} ms   p99 {:>7.3} ms   max {:>7.3} ms   ({} requests)",
        load.per_second(),
        ms(load.percentile(0.5)),
        ms(load.percentile(0.99)),
        ms(load.latencies[load.latencies.len() - 1]),
        load.requests
    );
}

fn cpu_per_cycle(mock: &Path, fixture: &str) -> Result<(), Error> {
    let dir = tempfile::tempdir()?;
    let (exporter, port) = start_exporter(mock, dir.path(), fixture, 100)?;
    let pid = exporter.0.id();
    std::thread::sleep(Duration::from_millis(500));
    let (cpu0, cycles0) = (gpud_cpu_ns(pid), samples_total(port)?);
    std::thread::sleep(Duration::from_secs(10));
    let (cpu1, cycles1) = (gpud_cpu_ns(pid), samples_total(port)?);
    let cycles = cycles1.saturating_sub(cycles0).max(1);
    let per_cycle_ms = (cpu1 - cpu0) as f64 / cycles as f64 / 1e6;
    println!(
        "\n{fixture}: CPU per sample cycle {per_cycle_ms:.3} ms ({cycles} cycles at 100 ms, all gpud threads, \
         simulated driver's control thread excluded) = {:.2} % of a core at the default 30 s interval",
        per_cycle_ms / 30_000.0 * 100.0
    );
    Ok(())
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}
