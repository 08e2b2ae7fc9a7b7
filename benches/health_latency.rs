//! Injection-to-transition latency of the health watcher.
//!
//! Runs the release `gpud health --json` against the simulated driver, appends a fatal XID to
//! the control file, and times until the transition line arrives on gpud's stdout — the whole
//! path: the simulated driver's event delivery, NVML event wait, tracker, inventory publish,
//! and the applet printing the transition. Each GPU is then "reset" (lost + recover) so the
//! next round starts healthy (the loss is seen by the 20 ms poll). Prints median, p90, p99 and
//! max.

use std::fs::OpenOptions;
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const ROUNDS: usize = 200;
const GPUS: usize = 8;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let exe = std::env::current_exe()?;
    let deps = exe.parent().ok_or("no deps dir")?;
    let mock: PathBuf = deps.join("libnvidia_ml_mock.so");
    let dir = tempfile::tempdir()?;
    let control = dir.path().join("control");
    std::fs::write(&control, "")?;

    let mut child = Command::new(env!("CARGO_BIN_EXE_gpud"))
        .args(["health", "--json", "--kmsg", "", "--poll-interval", "20ms"])
        .env("GPUD_NVML_LIB", &mock)
        .env("NVML_MOCK_FIXTURE", "dgx-h100")
        .env("NVML_MOCK_CONTROL", &control)
        .env("GPUD_STATE_DIR", dir.path().join("state"))
        .env("GPUD_LOG", "warn")
        .stdout(Stdio::piped())
        .spawn()?;
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let (tx, lines) = mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    std::thread::sleep(Duration::from_millis(500));

    let mut file = OpenOptions::new().append(true).open(&control)?;
    let wait = |n: usize| -> Result<(), Box<dyn std::error::Error>> {
        for _ in 0..n {
            lines.recv_timeout(Duration::from_secs(10))?;
        }
        Ok(())
    };
    let mut samples = Vec::with_capacity(ROUNDS);
    for round in 0..ROUNDS {
        let gpu = round % GPUS;
        let start = Instant::now();
        writeln!(file, "xid {gpu} 79")?;
        file.flush()?;
        wait(1)?;
        samples.push(start.elapsed());
        // Reset the GPU so the next round on it starts healthy: lost, then recovered.
        writeln!(file, "lost {gpu}")?;
        file.flush()?;
        wait(1)?;
        writeln!(file, "recover {gpu}")?;
        file.flush()?;
        wait(1)?;
    }
    let _ = child.kill();
    let _ = child.wait();

    samples.sort();
    let pct = |p: f64| samples[((samples.len() as f64 - 1.0) * p).round() as usize];
    println!("health: XID injection -> published transition ({ROUNDS} rounds, dgx-h100)");
    println!(
        "  median {:>8.3} ms   p90 {:>8.3} ms   p99 {:>8.3} ms   max {:>8.3} ms   (goal: median < 10 ms)",
        ms(pct(0.5)),
        ms(pct(0.9)),
        ms(pct(0.99)),
        ms(samples[samples.len() - 1])
    );
    Ok(())
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}
