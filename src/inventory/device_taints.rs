//! Taints a cluster admin put on the node's DRA devices with `DeviceTaintRule`s, as the
//! inventory carries them (on each GPU, for the GPU and its MIG devices): written by the DRA
//! plugin's rule watcher (`crate::dra::taint_rules`, which also keeps them in the state
//! folder for `gpud inventory`), read by `gpud inventory`, the exporter,
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
