//! `gpud health`: the health watcher on its own, printing every transition; or, with `--once`,
//! the current health of every device and an exit code for scripts.

use std::ffi::OsString;
use std::io::Write;
use std::process::ExitCode;
use std::time::SystemTime;

use clap::Parser;
use tokio_util::sync::CancellationToken;

use crate::cli::{self, CommonArgs, HealthArgs, NodeArgs};
use crate::health::tracker::Tracker;
use crate::health::transitions::{self, state_word};
use crate::health::watcher::{self, WatcherConfig};
use crate::inventory::{HealthState, Inventory, Snapshot};

/// Watch GPU health: XIDs, ECC errors, row remapping, lost GPUs, temperature and NVLinks.
///
/// Prints one line per health transition. XIDs that NVIDIA's device plugin treats as
/// application errors (13, 31, 43, 45, 68, 109) are ignored; DP_DISABLE_HEALTHCHECKS and
/// DP_ENABLE_HEALTHCHECKS adjust that list exactly as they do for NVIDIA's plugin.
#[derive(Debug, Parser)]
#[command(name = "gpud health", version)]
struct Args {
    #[command(flatten)]
    common: CommonArgs,

    #[command(flatten)]
    node: NodeArgs,

    /// Print the health of every device now and exit: 0 all healthy, 1 degraded, 2 unhealthy.
    #[arg(long)]
    once: bool,

    /// Print JSON (one object per line) instead of text.
    #[arg(long)]
    json: bool,

    #[command(flatten)]
    health: HealthArgs,
}

/// Entry point.
pub fn main(argv: Vec<OsString>) -> ExitCode {
    let args: Args = match cli::parse(argv) {
        Ok(args) => args,
        Err(code) => return code,
    };
    let (settings, _) = match args.health.resolve() {
        Ok(resolved) => resolved,
        Err(code) => return code,
    };
    let nvml = match args.common.start() {
        Ok(nvml) => nvml,
        Err(code) => return code,
    };
    let inventory = match Inventory::discover(nvml.clone(), args.node.facts()) {
        Ok(inventory) => inventory,
        Err(err) => return cli::fail_nvml(&err),
    };
    if args.once {
        return once(&nvml, &inventory, settings, args.json);
    }
    match cli::runtime(1) {
        Ok(runtime) => runtime.block_on(watch(nvml, inventory, settings, args.json)),
        Err(code) => code,
    }
}

/// Runs the watcher and prints each transition until SIGINT/SIGTERM.
async fn watch(
    nvml: crate::nvml::Nvml,
    inventory: Inventory,
    config: WatcherConfig,
    json: bool,
) -> ExitCode {
    let cancel = CancellationToken::new();
    let mut updates = inventory.subscribe();
    let mut last = updates.borrow_and_update().clone();
    let watcher = tokio::spawn(watcher::run(cancel.clone(), nvml, inventory, config));
    let stop = crate::signals::shutdown();
    tokio::pin!(stop);
    let code = loop {
        tokio::select! {
            () = &mut stop => break ExitCode::SUCCESS,
            changed = updates.changed() => {
                if changed.is_err() {
                    break ExitCode::SUCCESS;
                }
                let now = updates.borrow_and_update().clone();
                if !print_transitions(&last, &now, json) {
                    break ExitCode::SUCCESS;
                }
                last = now;
            }
        }
    };
    cancel.cancel();
    match watcher.await {
        Ok(Err(err)) => cli::fail_nvml(&err),
        _ => code,
    }
}

/// Prints transitions; `false` once stdout is closed.
fn print_transitions(before: &Snapshot, after: &Snapshot, json: bool) -> bool {
    let now = SystemTime::now();
    let mut out = std::io::stdout().lock();
    for change in transitions::between(before, after) {
        let line = if json {
            change.json(now)
        } else {
            format!(
                "{} {}",
                humantime::format_rfc3339_seconds(now),
                change.line()
            )
        };
        if writeln!(out, "{line}").and_then(|()| out.flush()).is_err() {
            return false;
        }
    }
    true
}

/// `--once`: one poll of every signal on top of discovery, printed as a table (or JSON).
fn once(
    nvml: &crate::nvml::Nvml,
    inventory: &Inventory,
    config: WatcherConfig,
    json: bool,
) -> ExitCode {
    let mut tracker = Tracker::new(config.policy, config.tracker);
    let now = SystemTime::now();
    for signals in nvml.poll_signals() {
        tracker.observe_signals(&signals, now);
    }
    inventory.update(|snapshot| tracker.apply(snapshot));
    let snapshot = inventory.current();
    let text = if json {
        health_json(&snapshot)
    } else {
        health_table(&snapshot)
    };
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(text.as_bytes()).and_then(|()| out.flush());
    let worst = snapshot
        .gpus
        .iter()
        .flat_map(|gpu| {
            std::iter::once(gpu.health.state).chain(gpu.mig.devices.iter().map(|m| m.health.state))
        })
        .max()
        .unwrap_or(HealthState::Healthy);
    ExitCode::from(match worst {
        HealthState::Healthy => 0,
        HealthState::Degraded => 1,
        HealthState::Unhealthy => 2,
    })
}

/// The health table: one row per GPU and per MIG device.
pub fn health_table(snapshot: &Snapshot) -> String {
    let mut out = format!(
        "{:<5}{:<42}{:<11}{}\n",
        "GPU", "UUID", "STATE", "REASON — ACTION"
    );
    for gpu in &snapshot.gpus {
        out.push_str(&row(&gpu.index.to_string(), &gpu.uuid, &gpu.health));
        for mig in &gpu.mig.devices {
            out.push_str(&row(&format!("  {}", mig.profile), &mig.uuid, &mig.health));
        }
    }
    out
}

fn row(device: &str, uuid: &str, health: &crate::inventory::Health) -> String {
    let mut line = format!("{device:<5}{uuid:<42}{:<11}", state_word(health.state));
    if let Some(reason) = &health.reason {
        line.push_str(reason);
    }
    if let Some(action) = &health.action {
        line.push_str(" — ");
        line.push_str(action);
    }
    format!("{}\n", line.trim_end())
}

fn health_json(snapshot: &Snapshot) -> String {
    #[derive(serde::Serialize)]
    struct Row<'a> {
        gpu: u32,
        uuid: &'a str,
        mig_profile: Option<&'a str>,
        health: &'a crate::inventory::Health,
    }
    let mut out = String::new();
    for gpu in &snapshot.gpus {
        let rows = std::iter::once(Row {
            gpu: gpu.index,
            uuid: &gpu.uuid,
            mig_profile: None,
            health: &gpu.health,
        })
        .chain(gpu.mig.devices.iter().map(|m| Row {
            gpu: gpu.index,
            uuid: &m.uuid,
            mig_profile: Some(&m.profile),
            health: &m.health,
        }));
        for r in rows {
            if let Ok(line) = serde_json::to_string(&r) {
                out.push_str(&line);
                out.push('\n');
            }
        }
    }
    out
}
