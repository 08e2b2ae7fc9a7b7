//! `gpud health --once`: the health of every device now, as a table or JSON lines, and the
//! exit code scripts branch on.

use std::path::Path;
use std::time::SystemTime;

use super::tracker::Tracker;
use super::watcher::WatcherConfig;
use crate::inventory::health::HealthSource;
use crate::inventory::model::Gpu;
use crate::inventory::transitions::state_word;
use crate::inventory::{Health, HealthState, Inventory, Remedy, Snapshot};
use crate::nvml::{GpuSignals, Nvml};
use crate::remediation_state::{GpuRemediation, Phase, record};

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

/// Marks unhealthy every GPU that gpud's remediation has out of its way back to service, as
/// the record at `path` (`<state-dir>/remediation.json`) says for this boot: the daemon's
/// health watchers, device plugin and exporter hold it so, and one poll sees none of the XIDs
/// behind it. A record that cannot be read fails closed: whether a GPU is held is unknown,
/// which is never "healthy", so every GPU is marked unhealthy and `Err` says why.
pub fn hold_by_record(snapshot: &mut Snapshot, path: &Path) -> Result<(), String> {
    match record::views_checked(path) {
        Ok(views) => {
            for gpu in &mut snapshot.gpus {
                let Some(view) = views.get(&gpu.uuid) else {
                    continue;
                };
                if view.phase == Phase::Healthy {
                    continue;
                }
                hold(gpu, held_reason(view), held_action(view));
                gpu.remediation = Some(view.clone());
            }
            Ok(())
        }
        Err(why) => {
            let reason = format!(
                "gpud's remediation record cannot be read ({why}): whether gpud's remediation holds this GPU out of service is unknown"
            );
            for gpu in &mut snapshot.gpus {
                hold(
                    gpu,
                    reason.clone(),
                    "repair or remove the record, or run gpud health --once as a user that can read it".to_owned(),
                );
            }
            Err(format!(
                "{why}; every GPU is reported unhealthy, since whether gpud's remediation holds it out of service is unknown"
            ))
        }
    }
}

/// Why the record holds a GPU: its phase and the reason it is there.
fn held_reason(view: &GpuRemediation) -> String {
    match view.reason.is_empty() {
        true => format!("held out of service by gpud's remediation: {}", view.phase),
        false => format!(
            "held out of service by gpud's remediation: {}: {}",
            view.phase, view.reason
        ),
    }
}

/// When a GPU the record holds comes back.
fn held_action(view: &GpuRemediation) -> String {
    match &view.held_for {
        Some(why) => format!("none: {why}"),
        None => "none: gpud's remediation decides what it needs".to_owned(),
    }
}

/// Makes `gpu` (and its MIG devices) unhealthy for `reason`; a fault of its own stays named
/// first.
fn hold(gpu: &mut Gpu, reason: String, action: String) {
    let health = match gpu.health.state {
        HealthState::Unhealthy => Health {
            reason: Some(match &gpu.health.reason {
                Some(own) => format!("{own}; {reason}"),
                None => reason,
            }),
            ..gpu.health.clone()
        },
        _ => Health {
            state: HealthState::Unhealthy,
            reason: Some(reason),
            xid: None,
            action: Some(action),
            remedy: Some(Remedy::None),
            since: Some(SystemTime::now()),
            source: Some(HealthSource::Remediation),
        },
    };
    for mig in &mut gpu.mig.devices {
        if mig.health.state != HealthState::Unhealthy {
            mig.health = health.clone();
        }
    }
    gpu.health = health;
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
        /// Where gpud's remediation has the GPU, when its record holds it.
        #[serde(skip_serializing_if = "Option::is_none")]
        remediation: Option<&'a GpuRemediation>,
    }
    let mut out = String::new();
    for gpu in &snapshot.gpus {
        let rows = std::iter::once(Row {
            gpu: gpu.index,
            uuid: &gpu.uuid,
            mig_profile: None,
            health: &gpu.health,
            remediation: gpu.remediation.as_ref(),
        })
        .chain(gpu.mig.devices.iter().map(|m| Row {
            gpu: gpu.index,
            uuid: &m.uuid,
            mig_profile: Some(&m.profile),
            health: &m.health,
            remediation: None,
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
