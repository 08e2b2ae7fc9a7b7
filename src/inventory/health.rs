//! Health of a GPU or MIG device as the inventory carries it.
//!
//! A sick GPU is data, never an error: discovery marks a GPU that answers
//! `NVML_ERROR_GPU_IS_LOST` as unhealthy, and the health watcher overlays XID, ECC and other
//! verdicts. Every state can recover: a lost GPU that answers again is healthy on the next
//! rescan.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::SystemTime;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::remedy::Remedy;

/// Saved-verdict files the health watcher of this process found damaged (and moved aside):
/// counted here, beside the verdicts they held, for the exporter of the same process to report
/// as `gpud_health_kept_verdicts_damaged_total`.
static KEPT_VERDICTS_DAMAGED: AtomicU64 = AtomicU64::new(0);

/// Counts one damaged saved-verdicts file.
pub fn note_kept_verdicts_damaged() {
    KEPT_VERDICTS_DAMAGED.fetch_add(1, Ordering::Relaxed);
}

/// How many saved-verdicts files this process found damaged.
pub fn kept_verdicts_damaged() -> u64 {
    KEPT_VERDICTS_DAMAGED.load(Ordering::Relaxed)
}

/// The three states a device can be in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HealthState {
    /// Fit for work.
    Healthy,
    /// Works, but something needs attention (warning-level XID, correctable error storms).
    Degraded,
    /// Must not get new work.
    Unhealthy,
}

impl HealthState {
    /// Every state, best first.
    pub const ALL: [HealthState; 3] = [
        HealthState::Healthy,
        HealthState::Degraded,
        HealthState::Unhealthy,
    ];

    /// The lower-case word used in logs, labels and metrics.
    pub fn word(self) -> &'static str {
        match self {
            HealthState::Healthy => "healthy",
            HealthState::Degraded => "degraded",
            HealthState::Unhealthy => "unhealthy",
        }
    }
}

/// Who decided a health state; used when a rescan merges with the previous snapshot, so that
/// discovery only clears what discovery set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HealthSource {
    /// Enumeration: the device did not answer NVML.
    Discovery,
    /// The health watcher: events, polled counters, kernel log.
    Watcher,
    /// gpud's remediation holds a sound GPU out of service: the reset of an NVLink peer takes
    /// it too.
    Remediation,
}

/// Current health with the reason and what an operator should do.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(from = "HealthFields")]
pub struct Health {
    /// The state.
    pub state: HealthState,
    /// Why the device is not healthy (`None` when healthy).
    pub reason: Option<String>,
    /// The XID behind the state, if one caused it.
    pub xid: Option<u32>,
    /// Suggested action, for people, e.g. `drain and reboot the node`.
    pub action: Option<String>,
    /// What the device needs, for programs (`None` when healthy): what gpud's remediation
    /// decides by. The action's text above may be reworded; this may not.
    pub remedy: Option<Remedy>,
    /// When the device entered this state (RFC 3339, UTC).
    #[serde(serialize_with = "serialize_since")]
    pub since: Option<SystemTime>,
    /// Which subsystem set the state.
    pub source: Option<HealthSource>,
}

/// [`Health`] as read: `remedy` may be missing in what an earlier gpud wrote.
#[derive(Deserialize)]
struct HealthFields {
    state: HealthState,
    reason: Option<String>,
    xid: Option<u32>,
    action: Option<String>,
    #[serde(default)]
    remedy: Option<Remedy>,
    #[serde(default, deserialize_with = "deserialize_since")]
    since: Option<SystemTime>,
    #[serde(default)]
    source: Option<HealthSource>,
}

impl From<HealthFields> for Health {
    fn from(f: HealthFields) -> Self {
        // Written before verdicts carried a remedy: its action's text says which (the one
        // place text is mapped to a remedy).
        let remedy = f
            .remedy
            .or_else(|| f.action.as_deref().map(Remedy::from_legacy_phrase));
        Health {
            state: f.state,
            reason: f.reason,
            xid: f.xid,
            action: f.action,
            remedy,
            since: f.since,
            source: f.source,
        }
    }
}

/// Reason recorded for a GPU that returns `NVML_ERROR_GPU_IS_LOST`.
pub const LOST_REASON: &str =
    "GPU is lost: NVML reports it has fallen off the bus or is inaccessible";
/// Suggested action for a lost GPU.
pub const LOST_ACTION: &str = "drain and reboot the node; if it persists, inspect the hardware";

impl Health {
    /// A healthy device.
    pub fn healthy() -> Self {
        Health {
            state: HealthState::Healthy,
            reason: None,
            xid: None,
            action: None,
            remedy: None,
            since: None,
            source: None,
        }
    }

    /// A GPU that NVML reports as lost, noticed at `since`.
    pub fn lost(since: SystemTime) -> Self {
        Health {
            state: HealthState::Unhealthy,
            reason: Some(LOST_REASON.to_owned()),
            xid: None,
            action: Some(LOST_ACTION.to_owned()),
            remedy: Some(Remedy::RebootNode),
            since: Some(since),
            source: Some(HealthSource::Discovery),
        }
    }

    /// A device that answered NVML with an unexpected error during discovery.
    pub fn unreadable(reason: String, since: SystemTime) -> Self {
        Health {
            state: HealthState::Unhealthy,
            reason: Some(reason),
            xid: None,
            action: Some(Remedy::CheckDriver.phrase().to_owned()),
            remedy: Some(Remedy::CheckDriver),
            since: Some(since),
            source: Some(HealthSource::Discovery),
        }
    }

    /// Whether the device may take new work.
    pub fn is_healthy(&self) -> bool {
        self.state == HealthState::Healthy
    }

    /// Whether discovery (not the watcher) set this state.
    pub fn set_by_discovery(&self) -> bool {
        self.source == Some(HealthSource::Discovery)
    }
}

impl Default for Health {
    fn default() -> Self {
        Health::healthy()
    }
}

fn serialize_since<S: Serializer>(since: &Option<SystemTime>, s: S) -> Result<S::Ok, S::Error> {
    match since {
        Some(t) => s.collect_str(&humantime::format_rfc3339_seconds(*t)),
        None => s.serialize_none(),
    }
}

fn deserialize_since<'de, D: Deserializer<'de>>(d: D) -> Result<Option<SystemTime>, D::Error> {
    Option::<String>::deserialize(d)?
        .map(|text| humantime::parse_rfc3339(&text).map_err(serde::de::Error::custom))
        .transpose()
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use super::*;

    #[test]
    fn lost_serialises_with_reason_action_and_time() {
        let at = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let json = serde_json::to_value(Health::lost(at)).unwrap();
        assert_eq!(json["state"], "unhealthy");
        assert_eq!(json["reason"], LOST_REASON);
        assert_eq!(json["action"], LOST_ACTION);
        assert_eq!(json["remedy"], "reboot_node");
        assert_eq!(json["since"], "2027-01-15T08:00:00Z");
        assert_eq!(json["source"], "discovery");
    }

    #[test]
    fn healthy_has_no_reason() {
        let json = serde_json::to_value(Health::healthy()).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"state": "healthy", "reason": null, "xid": null,
                               "action": null, "remedy": null, "since": null, "source": null})
        );
    }

    #[test]
    fn a_verdict_reads_back_with_its_remedy_and_an_older_one_by_its_text() {
        let at = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let lost = Health::lost(at);
        let again: Health = serde_json::from_value(serde_json::to_value(&lost).unwrap()).unwrap();
        assert_eq!(again, lost);
        // The remedy decides, whatever the text says.
        let reworded: Health = serde_json::from_value(serde_json::json!({
            "state": "unhealthy", "reason": "r", "xid": 95,
            "action": "a new wording", "remedy": "reset_gpu"}))
        .unwrap();
        assert_eq!(reworded.remedy, Some(Remedy::ResetGpu));
        // Written by an earlier gpud: no remedy, only the text.
        let older: Health = serde_json::from_value(serde_json::json!({
            "state": "unhealthy", "reason": "r", "xid": 95,
            "action": "drain and reset the GPU", "since": null, "source": "watcher"}))
        .unwrap();
        assert_eq!(older.remedy, Some(Remedy::ResetGpu));
        assert_eq!(
            Remedy::from_legacy_phrase(LOST_ACTION),
            Remedy::RebootNode,
            "a lost GPU, as an earlier gpud wrote it"
        );
        let healthy: Health = serde_json::from_value(serde_json::json!({
            "state": "healthy", "reason": null, "xid": null, "action": null}))
        .unwrap();
        assert_eq!(healthy, Health::healthy());
    }
}
