//! Running `gpud exporter` on a simulated node and reading its endpoints.

use std::io::{BufRead, BufReader};
use std::process::{Child, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::time::{Duration, Instant};

use crate::common::Node;
use crate::common::http::{self, Answer};

/// A running `gpud exporter` on a loopback port, killed on drop.
pub struct Exporter {
    pub port: u16,
    child: Child,
    stderr: Receiver<String>,
    /// Every stderr line read so far.
    pub log: Vec<String>,
}

impl Exporter {
    /// Starts the exporter on `node` with `args` (after `-a 127.0.0.1:<port>`, a 100 ms collect
    /// interval and no kernel log) and waits until it is ready.
    pub fn start(node: &Node, args: &[&str]) -> Exporter {
        Self::start_with(node, args, &[])
    }

    /// [`Exporter::start`] with extra environment variables.
    pub fn start_with(node: &Node, args: &[&str], env: &[(&str, &str)]) -> Exporter {
        Self::start_following(node, "", args, env)
    }

    /// [`Exporter::start_with`], following `kmsg` as the kernel log (`""`: none).
    pub fn start_following(
        node: &Node,
        kmsg: &str,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Exporter {
        let port = http::free_port();
        let address = format!("127.0.0.1:{port}");
        let mut all = vec!["exporter", "-a", &address, "-c", "100", "--kmsg", kmsg];
        all.extend_from_slice(args);
        let mut cmd = node.gpud(&all);
        for (key, value) in env {
            cmd.env(key, value);
        }
        cmd.env("GPUD_LOG", "info");
        let mut child = cmd
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn gpud exporter");
        let stderr = child.stderr.take().expect("stderr");
        let (tx, rx) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut exporter = Exporter {
            port,
            child,
            stderr: rx,
            log: Vec::new(),
        };
        exporter.wait_ready();
        exporter
    }

    fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(answer) = http::get(self.port, "/readyz")
                && answer.status == 200
            {
                return;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                self.drain_log();
                panic!(
                    "gpud exporter exited with {status} before it was ready:\n{}",
                    self.log.join("\n")
                );
            }
            assert!(Instant::now() < deadline, "gpud exporter not ready in 20s");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Collects the stderr lines printed so far.
    pub fn drain_log(&mut self) {
        while let Ok(line) = self.stderr.try_recv() {
            self.log.push(line);
        }
    }

    /// `GET path`, which must answer.
    pub fn get(&self, path: &str) -> Answer {
        http::get(self.port, path).unwrap_or_else(|e| panic!("GET {path}: {e}"))
    }

    /// The `/metrics` body once at least `cycles` samples are in it (rates and GPM metrics
    /// need two).
    pub fn metrics_after(&self, cycles: u64) -> String {
        http::wait_for(self.port, "/metrics", 20, |a| {
            a.status == 200 && samples(&a.body) >= cycles
        })
        .body
    }

    /// Polls `/metrics` until `accept` holds, failing after `secs` seconds.
    pub fn metrics_until(&self, secs: u64, accept: impl Fn(&str) -> bool) -> String {
        http::wait_for(self.port, "/metrics", secs, |a| {
            a.status == 200 && accept(&a.body)
        })
        .body
    }
}

impl Drop for Exporter {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `gpud_samples_total` of a body.
pub fn samples(body: &str) -> u64 {
    body.lines()
        .find_map(|l| l.strip_prefix("gpud_samples_total "))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// The body without the lines that change from run to run (sample count, duration and age, and the
/// HTTP connection counters, which depend on the test's own requests and on the fd limit).
pub fn stable(body: &str) -> String {
    const VOLATILE: [&str; 3] = [
        "gpud_samples_total",
        "gpud_sample_duration_seconds",
        "gpud_exporter_last_sample_age_seconds",
    ];
    let mut out = String::with_capacity(body.len());
    for line in body.lines() {
        let name = line
            .strip_prefix("# HELP ")
            .or_else(|| line.strip_prefix("# TYPE "))
            .unwrap_or(line);
        if name.starts_with("gpud_http_")
            || VOLATILE
                .iter()
                .any(|v| name.starts_with(v) && name[v.len()..].starts_with([' ', '{']))
        {
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// Sample lines (not comments) of one family.
pub fn family<'a>(body: &'a str, name: &str) -> Vec<&'a str> {
    body.lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with(['{', ' ']))
        })
        .collect()
}

/// The value of the one sample of `name` whose labels contain every `labels` pair.
pub fn value(body: &str, name: &str, labels: &[(&str, &str)]) -> Option<String> {
    family(body, name)
        .into_iter()
        .find(|l| {
            labels
                .iter()
                .all(|(k, v)| l.contains(&format!("{k}=\"{v}\"")))
        })
        .and_then(|l| l.rsplit_once(' '))
        .map(|(_, v)| v.to_owned())
}
