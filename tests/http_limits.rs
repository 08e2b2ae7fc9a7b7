//! The HTTP server's bounds, black-box against `gpud exporter` on the simulated dgx-h100 with
//! the open-file limit systemd usually gives a service (soft and hard 1024): 2 000 idle
//! connections and 200 slowloris connections do not keep a scraper out, and the server closes
//! them, and idle keep-alive connections, after their timeouts.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "common/mod.rs"]
mod common;

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::Node;
use common::http::{self, free_port};

const IDLE: usize = 2_000;
const SLOWLORIS: usize = 200;
const KEEP_ALIVE: usize = 10;
/// The timeouts the exporter runs with here (its defaults are 10 s and 60 s).
const HEADER_TIMEOUT: Duration = Duration::from_secs(5);
const IDLE_TIMEOUT: Duration = Duration::from_secs(9);
/// `min(--http-max-connections default, 1024 - descriptors reserved for the process)`.
const CAP: u64 = 512;

/// `gpud exporter` under `ulimit -n 1024`, killed on drop.
struct Exporter {
    child: Child,
    port: u16,
}

impl Drop for Exporter {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(node: &Node) -> Exporter {
    let port = free_port();
    let mut cmd = Command::new("sh");
    // `ulimit -n` without -S or -H sets both limits; exec keeps the pid.
    cmd.args(["-c", "ulimit -n 1024 && exec \"$0\" \"$@\""])
        .arg(common::gpud_bin())
        .args(["exporter", "-a", &format!("127.0.0.1:{port}"), "-c", "100"])
        .args(["--kmsg", ""])
        .arg(format!(
            "--http-header-timeout={}s",
            HEADER_TIMEOUT.as_secs()
        ))
        .arg(format!("--http-idle-timeout={}s", IDLE_TIMEOUT.as_secs()));
    node.wire(&mut cmd);
    cmd.env("GPUD_LOG", "warn");
    let child = cmd
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn gpud exporter");
    let exporter = Exporter { child, port };
    http::wait_for(port, "/readyz", 20, |a| a.status == 200);
    exporter
}

/// Lets this test process hold every connection it opens.
fn raise_own_fd_limit(needed: u64) {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
    assert!(
        hard >= needed,
        "this test opens {needed} sockets; the hard open-file limit is {hard} (raise it with ulimit -Hn)"
    );
    if soft < needed {
        setrlimit(Resource::RLIMIT_NOFILE, needed, hard).unwrap();
    }
}

fn connect(port: u16) -> TcpStream {
    TcpStream::connect(("127.0.0.1", port)).expect("connect")
}

/// Whether the server has closed `stream` (EOF or reset); the stream must be non-blocking.
/// The server never writes to these connections unasked.
fn closed(stream: &mut TcpStream) -> bool {
    let mut buf = [0; 16];
    match stream.read(&mut buf) {
        Ok(0) => true,
        Ok(n) => panic!("unexpected {n} bytes from the server"),
        Err(err) if err.kind() == ErrorKind::WouldBlock => false,
        Err(_) => true,
    }
}

/// Connections the server has not closed yet, each checked once and left out once closed.
fn still_open(streams: &mut Vec<TcpStream>) -> usize {
    streams.retain_mut(|s| !closed(s));
    streams.len()
}

/// Reads one response (head and `Content-Length` body) from a blocking stream.
fn read_response(stream: &mut TcpStream) -> (String, Vec<u8>) {
    let mut head = Vec::new();
    let mut byte = [0; 1];
    while !head.ends_with(b"\r\n\r\n") {
        stream.read_exact(&mut byte).expect("response head");
        head.push(byte[0]);
    }
    let head = String::from_utf8(head).unwrap();
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length: "))
        .expect("content-length")
        .parse()
        .unwrap();
    let mut body = vec![0; length];
    stream.read_exact(&mut body).expect("response body");
    (head, body)
}

/// A counter or gauge of the exporter's own families.
fn metric(body: &str, name: &str) -> u64 {
    body.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("no {name} in the body"))
        .parse()
        .unwrap()
}

fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count()
}

#[test]
fn hostile_connections_neither_keep_a_scraper_out_nor_stay_open() {
    raise_own_fd_limit((IDLE + SLOWLORIS + KEEP_ALIVE) as u64 + 200);
    let node = Node::new("dgx-h100");
    let exporter = start(&node);
    let pid = exporter.child.id();
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let open_files = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap();
    assert_eq!(
        open_files.split_whitespace().collect::<Vec<_>>()[3..5],
        ["1024", "1024"],
        "{open_files}"
    );

    // The hostile clients: silent ones, then ones that trickle a request head.
    let opened = Instant::now();
    let mut idle: Vec<TcpStream> = (0..IDLE).map(|_| connect(exporter.port)).collect();
    let mut slowloris: Vec<TcpStream> = (0..SLOWLORIS)
        .map(|_| {
            let mut stream = connect(exporter.port);
            stream
                .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: ")
                .unwrap();
            stream
        })
        .collect();
    // Keep-alive clients that made one request and then say nothing.
    let mut keep_alive: Vec<TcpStream> = (0..KEEP_ALIVE)
        .map(|_| {
            let mut stream = connect(exporter.port);
            stream
                .write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
                .unwrap();
            let (head, body) = read_response(&mut stream);
            assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
            assert_eq!(body, b"OK");
            stream
        })
        .collect();
    let answered = Instant::now();
    for stream in idle.iter().chain(&slowloris).chain(&keep_alive) {
        stream.set_nonblocking(true).unwrap();
    }
    assert!(
        open_fds(pid) > CAP as usize,
        "the connection cap is full of hostile connections"
    );

    // A scraper gets the whole body at once.
    let start = Instant::now();
    let mut scraper = connect(exporter.port);
    scraper
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let (head, body) = read_response(&mut scraper);
    let took = start.elapsed();
    assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
    let body = String::from_utf8(body).unwrap();
    assert_eq!(
        body.lines()
            .filter(|l| l.starts_with("DCGM_FI_DEV_GPU_UTIL{"))
            .count(),
        8
    );
    assert!(
        body.ends_with('\n') && body.contains("\ngpud_http_connections_max 512\n"),
        "the whole body"
    );
    assert!(took < Duration::from_millis(100), "scrape took {took:?}");
    drop(scraper);
    assert!(
        opened.elapsed() < HEADER_TIMEOUT,
        "setting up took {:?}: the hostile connections timed out before the scrape",
        opened.elapsed()
    );

    // The hostile connections go at the header timeout; trickling does not extend it. The
    // keep-alive ones outlive it and go at the idle timeout.
    let mut trickled = Instant::now();
    let mut keep_alive_checked = false;
    let deadline = answered + IDLE_TIMEOUT + Duration::from_secs(3);
    loop {
        if trickled.elapsed() >= Duration::from_secs(1) {
            trickled = Instant::now();
            // A failed write means the server closed it; the read below sees that too.
            for stream in &mut slowloris {
                let _ = stream.write(b"a");
            }
        }
        let hostile_open = still_open(&mut idle) + still_open(&mut slowloris);
        if !keep_alive_checked && answered.elapsed() >= HEADER_TIMEOUT + Duration::from_secs(2) {
            assert_eq!(
                hostile_open, 0,
                "hostile connections open past the header timeout"
            );
            assert_eq!(
                still_open(&mut keep_alive),
                KEEP_ALIVE,
                "keep-alive connections closed at the header timeout"
            );
            keep_alive_checked = true;
        }
        if keep_alive_checked && still_open(&mut keep_alive) == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "still open after the idle timeout: {} keep-alive, {hostile_open} hostile",
            keep_alive.len()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        answered.elapsed() >= IDLE_TIMEOUT - Duration::from_millis(500),
        "keep-alive connections closed after {:?}",
        answered.elapsed()
    );

    // Every hostile connection was closed exactly once, each way counted.
    let body = http::wait_for(exporter.port, "/metrics", 5, |a| {
        a.status == 200
            && a.body
                .contains("\ngpud_http_connections_timed_out_total{phase=\"idle\"} 10\n")
    })
    .body;
    let header_timeouts = metric(
        &body,
        "gpud_http_connections_timed_out_total{phase=\"header\"}",
    );
    let evicted = metric(&body, "gpud_http_connections_evicted_total");
    let refused = metric(&body, "gpud_http_connections_refused_total");
    assert_eq!(
        header_timeouts + evicted + refused,
        (IDLE + SLOWLORIS) as u64,
        "{header_timeouts} header timeouts, {evicted} evicted, {refused} refused"
    );
    assert!(
        evicted >= (IDLE + SLOWLORIS + KEEP_ALIVE + 1) as u64 - CAP,
        "{evicted} evicted"
    );
    assert!(
        header_timeouts >= SLOWLORIS as u64,
        "the newest connections, the slowloris ones among them, were not evicted but timed out: {header_timeouts}"
    );
    assert_eq!(metric(&body, "gpud_http_connections_max"), CAP);
    assert!(metric(&body, "gpud_http_connections_open") <= 1);
}
