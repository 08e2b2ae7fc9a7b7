//! `gpud health --once`: the health of every device now, as a table or JSON lines, and the
//! exit code scripts branch on.

use std::time::SystemTime;

use super::tracker::Tracker;
use super::watcher::WatcherConfig;
use crate::inventory::transitions::state_word;
use crate::inventory::{Health, HealthState, Inventory, Snapshot};
use crate::nvml::{GpuSignals, Nvml};

/// One poll of every signal on top of discovery; returns the snapshot to print.
pub fn poll_once(nvml: &Nvml, inventory: &Inventory, config: WatcherConfig) -> Snapshot {
    let tracker = observed(&nvml.poll_signals(), config);
    inventory.update(|snapshot| tracker.apply(snapshot));
    (*inventory.current()).clone()
}

/// What [`poll_once`] prints, from signals already polled (`gpud doctor`'s bundle judges the
/// signals its preflight read instead of calling NVML again).
pub fn assess<'a>(
    snapshot: &mut Snapshot,
    signals: impl IntoIterator<Item = &'a GpuSignals>,
    config: WatcherConfig,
) {
    observed(signals, config).apply(snapshot);
}

/// A tracker that has seen one poll's `signals`, now.
fn observed<'a>(
    signals: impl IntoIterator<Item = &'a GpuSignals>,
    config: WatcherConfig,
) -> Tracker {
    let mut tracker = Tracker::new(config.policy, config.tracker);
    let now = SystemTime::now();
    for signals in signals {
        tracker.observe_signals(signals, now);
    }
    tracker
}

/// The exit code for a snapshot: 0 all healthy, 1 something degraded, 2 something unhealthy.
pub fn exit_code(snapshot: &Snapshot) -> u8 {
    let worst = snapshot
        .gpus
        .iter()
        .flat_map(|gpu| {
            std::iter::once(gpu.health.state).chain(gpu.mig.devices.iter().map(|m| m.health.state))
        })
        .max()
        .unwrap_or(HealthState::Healthy);
    match worst {
        HealthState::Healthy => 0,
        HealthState::Degraded => 1,
        HealthState::Unhealthy => 2,
    }
}

/// The health table: one row per GPU and per MIG device. Columns are as wide as their widest
/// cell, so a MIG profile such as `3g.40gb` never runs into its UUID.
pub fn table(snapshot: &Snapshot) -> String {
    let mut rows: Vec<(String, &str, &Health)> = Vec::new();
    for gpu in &snapshot.gpus {
        rows.push((gpu.index.to_string(), &gpu.uuid, &gpu.health));
        for mig in &gpu.mig.devices {
            rows.push((format!("  {}", mig.profile), &mig.uuid, &mig.health));
        }
    }
    // The widest cell of a column (its heading included), plus one space.
    let width = |heading: &str, cell: &dyn Fn(&(String, &str, &Health)) -> usize| {
        rows.iter().map(cell).fold(heading.len(), usize::max) + 1
    };
    let device_width = width("GPU", &|(device, _, _)| device.chars().count());
    let uuid_width = width("UUID", &|(_, uuid, _)| uuid.chars().count());
    let mut out = format!(
        "{:<device_width$}{:<uuid_width$}{:<11}{}\n",
        "GPU", "UUID", "STATE", "REASON — ACTION"
    );
    for (device, uuid, health) in rows {
        out.push_str(&row(&device, uuid, health, device_width, uuid_width));
    }
    out
}

fn row(
    device: &str,
    uuid: &str,
    health: &Health,
    device_width: usize,
    uuid_width: usize,
) -> String {
    let mut line = format!(
        "{device:<device_width$}{uuid:<uuid_width$}{:<11}",
        state_word(health.state)
    );
    if let Some(reason) = &health.reason {
        line.push_str(reason);
    }
    if let Some(action) = &health.action {
        line.push_str(" — ");
        line.push_str(action);
    }
    format!("{}\n", line.trim_end())
}

/// One JSON object per GPU and per MIG device.
pub fn json_lines(snapshot: &Snapshot) -> String {
    #[derive(serde::Serialize)]
    struct Row<'a> {
        gpu: u32,
        uuid: &'a str,
        mig_profile: Option<&'a str>,
        health: &'a Health,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inventory::model::{MigDevice, Node};
    use crate::inventory::test_support::{gpu, mig, with_migs};

    #[test]
    fn table_columns_fit_mig_profiles() {
        let slice = MigDevice {
            profile: "3g.40gb".into(),
            ..mig(0, "MIG-7fe9", 2, 0)
        };
        let snapshot = Snapshot {
            node: Node {
                hostname: "node-a".into(),
                driver_version: "570.133.20".into(),
                cuda_driver_version: None,
                nvml_version: None,
                machine_type: None,
            },
            gpus: vec![with_migs(
                gpu(0, "GPU-0a1b", "NVIDIA A100", 40960),
                vec![slice],
            )],
            topology: Vec::new(),
        };
        assert_eq!(
            table(&snapshot),
            "GPU       UUID     STATE      REASON — ACTION\n\
             0         GPU-0a1b healthy\n\
             \x20 3g.40gb MIG-7fe9 healthy\n"
        );
    }
}
