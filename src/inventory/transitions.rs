//! Health transitions: what changed between two snapshots, as lines for people and JSON for
//! machines.

use std::time::SystemTime;

use serde::Serialize;

use super::health::{Health, HealthState};
use super::model::Snapshot;

/// One device whose health changed.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Transition {
    /// NVML index of the GPU (or of the MIG device's parent).
    pub gpu: u32,
    /// GPU UUID, or the MIG device's UUID.
    pub uuid: String,
    /// For a MIG device: its profile and instance ids.
    pub mig: Option<MigRef>,
    /// State before.
    pub from: HealthState,
    /// State now, with reason and action.
    pub to: Health,
}

/// Which MIG device a transition is about.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MigRef {
    pub profile: String,
    pub gpu_instance_id: u32,
    pub compute_instance_id: u32,
}

/// Every device whose health differs between `before` and `after`, GPUs by index with their
/// MIG devices after them. Devices that appear or vanish are not transitions.
pub fn between(before: &Snapshot, after: &Snapshot) -> Vec<Transition> {
    let mut out = Vec::new();
    for new in &after.gpus {
        let Some(old) = before.gpu(new.index) else {
            continue;
        };
        if old.health != new.health {
            out.push(Transition {
                gpu: new.index,
                uuid: new.uuid.clone(),
                mig: None,
                from: old.health.state,
                to: new.health.clone(),
            });
        }
        for mig in &new.mig.devices {
            let Some(old_mig) = old.mig.devices.iter().find(|m| m.uuid == mig.uuid) else {
                continue;
            };
            if old_mig.health != mig.health {
                out.push(Transition {
                    gpu: new.index,
                    uuid: mig.uuid.clone(),
                    mig: Some(MigRef {
                        profile: mig.profile.clone(),
                        gpu_instance_id: mig.gpu_instance_id,
                        compute_instance_id: mig.compute_instance_id,
                    }),
                    from: old_mig.health.state,
                    to: mig.health.clone(),
                });
            }
        }
    }
    out
}

/// Lower-case word for a state.
pub fn state_word(state: HealthState) -> &'static str {
    state.word()
}

impl Transition {
    /// One line for people:
    /// `GPU 3 GPU-… healthy -> unhealthy: XID 79: GPU has fallen off the bus — drain and reboot the node`.
    pub fn line(&self) -> String {
        let device = match &self.mig {
            None => format!("GPU {} {}", self.gpu, self.uuid),
            Some(mig) => format!(
                "GPU {} MIG {} {} (GI {} CI {})",
                self.gpu, mig.profile, self.uuid, mig.gpu_instance_id, mig.compute_instance_id
            ),
        };
        let mut line = format!(
            "{device} {} -> {}",
            state_word(self.from),
            state_word(self.to.state)
        );
        if let Some(reason) = &self.to.reason {
            line.push_str(": ");
            line.push_str(reason);
        }
        if let Some(action) = &self.to.action {
            line.push_str(" — ");
            line.push_str(action);
        }
        line
    }

    /// The JSON form, stamped with the time it was printed.
    pub fn json(&self, at: SystemTime) -> String {
        #[derive(Serialize)]
        struct Line<'a> {
            time: String,
            #[serde(flatten)]
            transition: &'a Transition,
        }
        let line = Line {
            time: humantime::format_rfc3339_seconds(at).to_string(),
            transition: self,
        };
        serde_json::to_string(&line).unwrap_or_else(|err| format!("{{\"error\":\"{err}\"}}"))
    }
}
