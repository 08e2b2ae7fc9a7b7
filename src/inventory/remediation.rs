//! Where gpud's remediation has each GPU, as the inventory carries it: written by the
//! remediation subsystem, read by the health watcher, the exporter and `gpud inventory` (the
//! record and the counters are in `remediation_state`).

use serde::{Deserialize, Serialize};

/// Where one GPU is on its way back to service.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// In service (or never out of it).
    Healthy,
    /// Unhealthy: withdrawn from the kubelet and tainted, waiting for a decision or a slot.
    Quarantined,
    /// Waiting for the processes on it to end (and, when asked, evicting the pods that hold it).
    Draining,
    /// The reset command runs.
    Resetting,
    /// Reset: checked before it goes back to work.
    Verifying,
    /// Beyond what a reset fixes: the Node condition asks a person or a node-repair engine.
    Escalated,
}

impl Phase {
    /// Every phase, in the order of the way back.
    pub const ALL: [Phase; 6] = [
        Phase::Healthy,
        Phase::Quarantined,
        Phase::Draining,
        Phase::Resetting,
        Phase::Verifying,
        Phase::Escalated,
    ];

    /// The lower-case word used in logs, metrics and `gpud inventory`.
    pub fn word(self) -> &'static str {
        match self {
            Phase::Healthy => "healthy",
            Phase::Quarantined => "quarantined",
            Phase::Draining => "draining",
            Phase::Resetting => "resetting",
            Phase::Verifying => "verifying",
            Phase::Escalated => "escalated",
        }
    }
}

impl std::fmt::Display for Phase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.word())
    }
}

/// One GPU's remediation as the inventory carries it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuRemediation {
    /// Where it is now.
    pub phase: Phase,
    /// When it entered that phase (RFC 3339, UTC).
    pub since: String,
    /// Why it is there, in words.
    pub reason: String,
    /// How many resets gpud has run on this GPU.
    pub resets: u32,
    /// When the last reset gpud ran finished (milliseconds since the epoch). Every health
    /// watcher on the node clears what it saw before then that a reset clears: gpud knows it
    /// reset the GPU even when NVML leaves no trace of it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_reset_ms: Option<u64>,
    /// Set while the GPU, sound itself, is held out of service because the reset of an NVLink
    /// peer takes it too: why, in words. Every health watcher on the node withdraws it then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held_for: Option<String>,
}
