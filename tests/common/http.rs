//! A minimal HTTP/1.1 client for black-box tests of gpud's HTTP endpoints: one request per
//! connection, `Connection: close`, the whole answer read to EOF.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Status code and body of one answer.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub content_type: Option<String>,
    pub body: String,
}

/// A loopback port that was free a moment ago, below the kernel's ephemeral range
/// (32768–60999 by default): a port the kernel hands out may be taken, between this call and
/// gpud's bind, as the local end of any outgoing connection on the machine (a test's client,
/// gpud's own API calls), which is what made `Address already in use` show up now and then.
/// Each test process counts through its own stretch of 16384..32768, picked from its pid, and
/// skips ports something already holds.
pub fn free_port() -> u16 {
    use std::sync::atomic::AtomicU32;
    const FIRST: u32 = 16384;
    const SPAN: u32 = 16384;
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let base = std::process::id().wrapping_mul(2654435761) % SPAN;
    for _ in 0..SPAN {
        let offset = (base + NEXT.fetch_add(1, Ordering::Relaxed)) % SPAN;
        let port = (FIRST + offset) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free loopback port in {FIRST}..{}", FIRST + SPAN)
}

/// `GET path` on `127.0.0.1:port`; `Err` when nothing answers.
pub fn get(port: u16, path: &str) -> std::io::Result<Answer> {
    let mut stream = TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n"
    )?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw)?;
    let text = String::from_utf8(raw).map_err(std::io::Error::other)?;
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| std::io::Error::other("no header end"))?;
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other("no status"))?;
    let content_type = head
        .lines()
        .find_map(|l| l.strip_prefix("content-type: "))
        .map(str::to_owned);
    Ok(Answer {
        status,
        content_type,
        body: body.to_owned(),
    })
}

/// Polls `GET path` until `accept` says yes, failing the test after `secs` seconds.
pub fn wait_for(port: u16, path: &str, secs: u64, accept: impl Fn(&Answer) -> bool) -> Answer {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Ok(answer) = get(port, path)
            && accept(&answer)
        {
            return answer;
        }
        assert!(
            Instant::now() < deadline,
            "GET {path} on port {port} did not give the expected answer within {secs}s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Scrapes `/metrics` 50 times a second on new connections until stopped; counts what failed
/// and the longest time without an answer.
pub struct Scraper {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<ScrapeReport>>,
}

#[derive(Debug, Default)]
pub struct ScrapeReport {
    pub answered: u64,
    pub failed: Vec<String>,
    pub longest_gap: Duration,
}

impl Scraper {
    pub fn start(port: u16) -> Scraper {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            let mut report = ScrapeReport::default();
            let mut last = Instant::now();
            while !flag.load(Ordering::SeqCst) {
                match get(port, "/metrics") {
                    Ok(answer) if answer.status == 200 => {
                        report.answered += 1;
                        report.longest_gap = report.longest_gap.max(last.elapsed());
                        last = Instant::now();
                    }
                    Ok(answer) => report.failed.push(format!("status {}", answer.status)),
                    Err(err) => report.failed.push(err.to_string()),
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            report.longest_gap = report.longest_gap.max(last.elapsed());
            report
        });
        Scraper {
            stop,
            thread: Some(thread),
        }
    }

    pub fn finish(mut self) -> ScrapeReport {
        self.stop.store(true, Ordering::SeqCst);
        self.thread.take().unwrap().join().unwrap()
    }
}
