//! Labeller costs on the simulated DGX H100, through the release binary:
//! - `gpud labeller --oneshot -o -` wall time (process start, NVML load, discovery, labels,
//!   output): median, p90, max over 30 runs;
//! - relabel latency: a GPU falls off the bus, time until the features file says so, with a
//!   100 ms rescan interval (so the figure is dominated by that interval), 10 rounds;
//! - resident memory of the looping labeller after it settled.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const RUNS: usize = 30;

fn gpud(mock: &Path, dir: &Path) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_gpud"));
    cmd.arg("labeller")
        .env("GPUD_NVML_LIB", mock)
        .env("NVML_MOCK_FIXTURE", "dgx-h100")
        .env("NVML_MOCK_CONTROL", dir.join("control"))
        .env("GPUD_STATE_DIR", dir.join("state"))
        .env("GPUD_LOG", "warn")
        .env("NODE_NAME", "bench");
    cmd
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let exe = std::env::current_exe()?;
    let mock: PathBuf = exe
        .parent()
        .ok_or("no deps dir")?
        .join("libnvidia_ml_mock.so");
    let dir = tempfile::tempdir()?;
    std::fs::write(dir.path().join("control"), "")?;

    let mut times = Vec::with_capacity(RUNS);
    for _ in 0..RUNS {
        let start = Instant::now();
        let out = gpud(&mock, dir.path())
            .args(["--oneshot", "-o", "-"])
            .output()?;
        times.push(start.elapsed());
        if !out.status.success() || out.stdout.is_empty() {
            return Err(format!("oneshot failed: {}", String::from_utf8_lossy(&out.stderr)).into());
        }
    }
    times.sort();
    println!(
        "oneshot (8 GPUs): median {:?}, p90 {:?}, max {:?}",
        percentile(&times, 0.5),
        percentile(&times, 0.9),
        times[times.len() - 1]
    );

    let file = dir.path().join("gfd");
    let mut child = gpud(&mock, dir.path())
        .args(["--rescan-interval", "100ms", "-o"])
        .arg(&file)
        .stdout(Stdio::null())
        .spawn()?;
    let wait_for = |needle: &str, limit: Duration| -> Result<Duration, String> {
        let start = Instant::now();
        while start.elapsed() < limit {
            if std::fs::read_to_string(&file).is_ok_and(|t| t.contains(needle)) {
                return Ok(start.elapsed());
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        Err(format!("{needle} not seen"))
    };
    wait_for("gpud.io/gpu.healthy=8", Duration::from_secs(10))?;
    std::thread::sleep(Duration::from_secs(2));
    let status = std::fs::read_to_string(format!("/proc/{}/status", child.id()))?;
    let rss = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .unwrap_or("VmRSS: ?")
        .to_owned();
    let control = dir.path().join("control");
    let mut relabels = Vec::new();
    let mut script = String::new();
    for _ in 0..10 {
        script.push_str("lost 3\n");
        std::fs::write(&control, &script)?;
        relabels.push(wait_for(
            "gpud.io/gpu.unhealthy=1",
            Duration::from_secs(10),
        )?);
        script.push_str("recover 3\n");
        std::fs::write(&control, &script)?;
        wait_for("gpud.io/gpu.healthy=8", Duration::from_secs(10))?;
    }
    relabels.sort();
    println!(
        "relabel after a lost GPU (100 ms rescan interval, 10 rounds): median {:?}, max {:?}",
        percentile(&relabels, 0.5),
        relabels[relabels.len() - 1]
    );
    println!(
        "looping labeller resident memory: {}",
        rss.trim_start_matches("VmRSS:").trim()
    );
    let _ = Command::new("kill").arg(child.id().to_string()).status();
    let _ = child.wait();
    Ok(())
}
