//! XID to GPU back in service: the release `gpud run --remediation reset` on the simulated
//! dgx-h100 and the fake kubelet, with a reset command that resets the simulated GPU at once
//! (appends `reset <bus id>` to the control file). Each round injects a fatal XID (95, which
//! the catalog clears with a reset) on an idle GPU and times until the kubelet's ListAndWatch
//! shows it `Unhealthy` (out of service) and then `Healthy` again (back). Meanwhile GPUs 0 and
//! 1 run a process each (a pod's work): they must never leave `Healthy`, and the reset command
//! must only ever be given the failed GPU. Prints median, p90 and max.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../tests/common/fake_kubelet.rs"]
mod fake_kubelet;

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use fake_kubelet::{FakeKubelet, list_and_watch, next_list};

const ROUNDS: usize = 30;
/// The GPUs that fail in turn; 0 and 1 stay busy and healthy. Two of eight: more than half
/// failing within a minute would be a node fault (escalated, not reset).
const FAILING: [usize; 2] = [2, 5];

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let exe = std::env::current_exe()?;
    let mock = exe
        .parent()
        .ok_or("no deps dir")?
        .join("libnvidia_ml_mock.so");
    let dir = tempfile::tempdir()?;
    let control = dir.path().join("control");
    std::fs::write(&control, "process 0 100 4096 90\nprocess 1 101 4096 90\n")?;
    let resets = dir.path().join("resets.log");
    let script = dir.path().join("reset.sh");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\necho \"$2\" >> {}\necho \"reset $2\" >> {}\n",
            resets.display(),
            control.display()
        ),
    )?;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755))?;
    let mut kubelet = FakeKubelet::start(dir.path()).await;
    let socket = kubelet.socket();
    let child = Command::new(env!("CARGO_BIN_EXE_gpud"))
        .args(["run", "--kmsg", "", "--health-poll-interval", "5s"])
        .args(["--kubelet-socket", socket.to_str().ok_or("socket path")?])
        .args(["--disable", "labeller,exporter", "--health-address", ""])
        .args([
            "--remediation",
            "reset",
            "--remediation-max-concurrent",
            "0",
            // Each GPU fails fifteen times here: no hardware suspicion.
            "--remediation-max-resets",
            "1000",
        ])
        .args([
            "--remediation-reset-command",
            script.to_str().ok_or("script path")?,
        ])
        .env("GPUD_NVML_LIB", &mock)
        .env("NVML_MOCK_FIXTURE", "dgx-h100")
        .env("NVML_MOCK_CONTROL", &control)
        .env("GPUD_STATE_DIR", dir.path().join("state"))
        .env("GPUD_LOG", "warn")
        .stdout(Stdio::null())
        .spawn()?;
    // Killed however the bench ends, so a failed run leaves no gpud behind.
    let child = KillOnDrop(child);
    let registration = kubelet.next_registration(10).await;
    let mut client = kubelet.plugin(&registration.endpoint).await;
    let mut stream = list_and_watch(&mut client).await;
    let first = next_list(&mut stream, 10).await;
    let ids: Vec<String> = first.devices.iter().map(|d| d.id.clone()).collect();

    let mut file = std::fs::OpenOptions::new().append(true).open(&control)?;
    let mut out_of_service = Vec::with_capacity(ROUNDS);
    let mut back = Vec::with_capacity(ROUNDS);
    for round in 0..ROUNDS {
        let gpu = FAILING[round % FAILING.len()];
        let start = Instant::now();
        writeln!(file, "xid {gpu} 95")?;
        file.flush()?;
        let mut withdrawn = None;
        loop {
            let list = next_list(&mut stream, 20).await;
            for device in &list.devices {
                let busy = device.id == ids[0] || device.id == ids[1];
                if busy && device.health != "Healthy" {
                    return Err(
                        format!("busy GPU {} left service in round {round}", device.id).into(),
                    );
                }
            }
            let sick = list
                .devices
                .iter()
                .any(|d| d.id == ids[gpu] && d.health != "Healthy");
            match (sick, withdrawn) {
                (true, None) => withdrawn = Some(start.elapsed()),
                (false, Some(_)) => break,
                _ => {}
            }
        }
        out_of_service.push(withdrawn.ok_or("never withdrawn")?);
        back.push(start.elapsed());
    }
    drop(child);
    let reset_calls = std::fs::read_to_string(&resets)?.lines().count();
    if reset_calls != ROUNDS {
        return Err(format!("{reset_calls} resets for {ROUNDS} faults").into());
    }

    println!(
        "remediation: fatal XID on an idle GPU -> back in service ({ROUNDS} rounds, dgx-h100, instant reset command)"
    );
    report(
        "XID -> Unhealthy on ListAndWatch",
        &mut out_of_service,
        None,
    );
    report(
        "XID -> Healthy again on ListAndWatch",
        &mut back,
        Some("goal: median < 2 s"),
    );
    println!(
        "  the busy GPUs 0 and 1 stayed Healthy throughout; {reset_calls} resets for {ROUNDS} faults"
    );
    Ok(())
}

/// A child process killed and reaped when dropped.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn report(what: &str, samples: &mut [Duration], goal: Option<&str>) {
    samples.sort();
    let pct = |p: f64| samples[((samples.len() as f64 - 1.0) * p).round() as usize];
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "  {what}: median {:>8.1} ms   p90 {:>8.1} ms   max {:>8.1} ms{}",
        ms(pct(0.5)),
        ms(pct(0.9)),
        ms(pct(1.0)),
        goal.map(|g| format!("   ({g})")).unwrap_or_default()
    );
}
