//! The parts of `resource.k8s.io/v1` objects gpud writes and reads, as small serde types:
//! ResourceSlice specs (written whole) and the ResourceClaim fields prepare needs. Older
//! versions the API server may serve instead are translated in [`super::api_version`].
//!
//! Own types rather than k8s-openapi's: gpud's k8s-openapi is built for the 1.33 API, which
//! has no `resource.k8s.io/v1`, and moving every other subsystem to a newer API feature for
//! two objects would change what they compile against. Unknown fields are ignored on read, so
//! what the API server adds (a taint's `timeAdded`, managed fields) never makes a slice look
//! different from the one gpud wants.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// `ResourceSlice.spec` for devices of one node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SliceSpec {
    pub driver: String,
    pub pool: Pool,
    pub node_name: String,
    #[serde(default)]
    pub devices: Vec<Device>,
    /// Counter sets the devices of the pool consume from (partitionable devices).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shared_counters: Vec<CounterSet>,
}

/// `ResourceSlice.spec.pool`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Pool {
    pub name: String,
    pub generation: i64,
    pub resource_slice_count: i64,
}

/// One device of a slice.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Device {
    pub name: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub attributes: BTreeMap<String, Attribute>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub capacity: BTreeMap<String, Capacity>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub taints: Vec<Taint>,
    /// What allocating the device takes from the pool's counter sets.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub consumes_counters: Vec<CounterConsumption>,
    /// Several claims may hold the device at once, each taking part of its capacities
    /// (consumable capacity, KEP-5075; [`super::shares`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_multiple_allocations: Option<bool>,
}

/// `sharedCounters[]`: a named set of counters that devices consume from; the scheduler never
/// allocates devices whose consumption together exceeds a counter.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CounterSet {
    pub name: String,
    pub counters: BTreeMap<String, Counter>,
}

/// One counter: a quantity.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counter {
    pub value: String,
}

/// `consumesCounters[]` of a device: what it takes from one counter set.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CounterConsumption {
    pub counter_set: String,
    pub counters: BTreeMap<String, Counter>,
}

/// A device attribute: exactly one typed value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Attribute {
    Int(i64),
    Bool(bool),
    String(String),
    /// A semantic version (`570.133.20`, `9.0.0`).
    Version(String),
    /// A list of ints (list-type attributes, KEP-5491): kept only by an API server with
    /// feature gate `DRAListTypeAttributes`.
    Ints(Vec<i64>),
}

impl Attribute {
    /// Whether this is a list-type value.
    pub fn is_list(&self) -> bool {
        matches!(self, Attribute::Ints(_))
    }
}

/// A device capacity: a quantity, and for a shared device how much of it a claim may take.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Capacity {
    pub value: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_policy: Option<RequestPolicy>,
}

impl Capacity {
    /// A plain quantity.
    pub fn of(value: String) -> Capacity {
        Capacity {
            value,
            request_policy: None,
        }
    }
}

/// `capacity.<name>.requestPolicy`: what a claim that names no amount takes (`default`) and
/// which amounts it may ask for (the scheduler rounds a request up to a valid one).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RequestPolicy {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub valid_values: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub valid_range: Option<ValidRange>,
}

/// `requestPolicy.validRange`: from `min`, in steps of `step`, up to `max` (the capacity when
/// unset).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ValidRange {
    pub min: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<String>,
}

/// A device taint (`NoSchedule`, or `None` for information only).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Taint {
    pub key: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    pub effect: String,
}

/// The ResourceClaim fields prepare reads.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Claim {
    #[serde(default)]
    pub metadata: ClaimMeta,
    #[serde(default)]
    pub status: ClaimStatus,
}

/// A claim's identity.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ClaimMeta {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub namespace: String,
    #[serde(default)]
    pub uid: String,
}

/// `ResourceClaim.status`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ClaimStatus {
    pub allocation: Option<Allocation>,
}

/// `status.allocation`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Allocation {
    #[serde(default)]
    pub devices: DeviceAllocation,
}

/// `status.allocation.devices`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct DeviceAllocation {
    #[serde(default)]
    pub results: Vec<AllocationResult>,
    #[serde(default)]
    pub config: Vec<AllocationConfig>,
}

/// One allocated device.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AllocationResult {
    #[serde(default)]
    pub request: String,
    #[serde(default)]
    pub driver: String,
    #[serde(default)]
    pub pool: String,
    #[serde(default)]
    pub device: String,
    #[serde(default)]
    pub admin_access: Option<bool>,
    #[serde(default, rename = "shareID")]
    pub share_id: Option<String>,
    /// What the claim takes of a shared device's capacities (`memory`), by capacity name.
    #[serde(default)]
    pub consumed_capacity: BTreeMap<String, String>,
}

/// One configuration entry of the allocation (from the class or the claim).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct AllocationConfig {
    #[serde(default)]
    pub source: String,
    /// The requests it applies to; empty: all of them.
    #[serde(default)]
    pub requests: Vec<String>,
    pub opaque: Option<Opaque>,
}

/// Driver-specific parameters.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Opaque {
    #[serde(default)]
    pub driver: String,
    #[serde(default)]
    pub parameters: serde_json::Value,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attributes_are_written_as_one_typed_field() {
        let json = serde_json::to_value(Attribute::Version("9.0.0".into())).unwrap();
        assert_eq!(json, serde_json::json!({"version": "9.0.0"}));
        let json = serde_json::to_value(Attribute::Int(7)).unwrap();
        assert_eq!(json, serde_json::json!({"int": 7}));
        let json = serde_json::to_value(Attribute::Ints(vec![0, 1])).unwrap();
        assert_eq!(json, serde_json::json!({"ints": [0, 1]}));
        assert!(Attribute::Ints(vec![0]).is_list() && !Attribute::Int(0).is_list());
    }

    #[test]
    fn a_taint_read_back_ignores_the_time_the_api_server_added() {
        let taint: Taint = serde_json::from_value(serde_json::json!({
            "key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoSchedule",
            "timeAdded": "2026-01-01T00:00:00Z"}))
        .unwrap();
        assert_eq!(
            taint,
            Taint {
                key: "gpu.nvidia.com/xid".into(),
                value: Some("79".into()),
                effect: "NoSchedule".into()
            }
        );
    }
}
