//! Taints a cluster admin put on the node's DRA devices with `DeviceTaintRule`s, as the
//! inventory carries them (on each GPU, for the GPU and its MIG devices): written by the DRA
//! plugin's rule watcher (`crate::dra::taint_rules`), read by `gpud inventory`, the exporter,
//! the node status and the remediation, so that every part of gpud sees the admin's word
//! from one place.

use serde::{Deserialize, Serialize};

/// The effect that makes the scheduler's controller evict the device's pods: an admin's
/// maintenance.
pub const NO_EXECUTE: &str = "NoExecute";

/// One taint of one `DeviceTaintRule` on one device.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct RuleTaint {
    /// The `DeviceTaintRule`'s name.
    pub rule: String,
    /// The DRA device it selects: the GPU (`gpu-3`) or one of its MIG devices.
    pub device: String,
    /// The taint's key, e.g. `example.com/maintenance`.
    pub key: String,
    /// Its value, when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// `NoSchedule`, `NoExecute` or `None`.
    pub effect: String,
}

impl RuleTaint {
    /// `key=value:effect` (`key:effect` without a value), as `kubectl` writes taints.
    pub fn spelled(&self) -> String {
        match &self.value {
            Some(value) => format!("{}={value}:{}", self.key, self.effect),
            None => format!("{}:{}", self.key, self.effect),
        }
    }
}

/// The file in the state directory where the DRA plugin keeps them for `gpud inventory`.
pub const FILE: &str = "device-taints.json";
/// The most bytes read back.
const MAX_BYTES: u64 = 1 << 20;

/// Each GPU's taints by UUID, as the DRA plugin last wrote them to `state_dir`: empty when
/// there is no such file or it cannot be read (it is shown, never acted on).
pub fn load(state_dir: &std::path::Path) -> std::collections::BTreeMap<String, Vec<RuleTaint>> {
    crate::files::read_bytes(&state_dir.join(FILE), MAX_BYTES)
        .ok()
        .and_then(|bytes| serde_json::from_slice(&bytes).ok())
        .unwrap_or_default()
}

/// Writes each GPU's taints by UUID to `state_dir` (atomically, readable by all).
pub fn save(
    state_dir: &std::path::Path,
    by_uuid: &std::collections::BTreeMap<String, Vec<RuleTaint>>,
) -> Result<(), String> {
    let bytes = serde_json::to_vec_pretty(by_uuid).map_err(|e| e.to_string())?;
    std::fs::create_dir_all(state_dir)
        .map_err(|e| format!("{}: cannot create the folder: {e}", state_dir.display()))?;
    crate::files::write_atomic(&state_dir.join(FILE), &bytes, 0o644)
        .map_err(|e| crate::logging::error_chain(&e))
}
