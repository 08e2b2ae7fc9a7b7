//! What the API server dropped from a ResourceSlice gpud wrote. An API server whose feature
//! gate is off clears the gated fields silently (a 200 or 201 with the field gone), so the
//! only way to notice is to compare the slice sent with the slice the write answered.
//!
//! | field | feature gate |
//! |---|---|
//! | `spec.sharedCounters`, `devices[].consumesCounters` | `DRAPartitionableDevices` |
//! | `devices[].allowMultipleAllocations`, `devices[].capacity.*.requestPolicy` | `DRAConsumableCapacity` |
//! | `devices[].attributes.*.ints` (and the other list types) | `DRAListTypeAttributes` |
//!
//! A server without list-type attributes usually refuses the write instead (the attribute
//! left without a value is invalid: 422), which [`refused_lists`] recognises.
//! Devices are matched by name; a v1beta1 device's data is read from its `basic`.

use std::collections::BTreeSet;

use serde_json::Value;

use super::api_version::NewField;

/// The field groups present in `sent` (a slice spec as written) and missing from `kept` (the
/// spec the write answered).
pub fn dropped(sent: &Value, kept: &Value) -> BTreeSet<NewField> {
    let mut out = BTreeSet::new();
    if present(&sent["sharedCounters"]) && !present(&kept["sharedCounters"]) {
        out.insert(NewField::Counters);
    }
    let kept_devices = devices(kept);
    for device in devices(sent) {
        let name = &device["name"];
        let data = data_of(device);
        let back = kept_devices
            .iter()
            .find(|d| d["name"] == *name)
            .map_or(&Value::Null, |d| data_of(d));
        if present(&data["consumesCounters"]) && !present(&back["consumesCounters"]) {
            out.insert(NewField::Counters);
        }
        if present(&data["allowMultipleAllocations"]) && !present(&back["allowMultipleAllocations"])
        {
            out.insert(NewField::SharedCapacity);
        }
        let policies = |d: &Value| -> BTreeSet<String> {
            d["capacity"]
                .as_object()
                .into_iter()
                .flatten()
                .filter(|(_, c)| present(&c["requestPolicy"]))
                .map(|(name, _)| name.clone())
                .collect()
        };
        if !policies(data).is_subset(&policies(back)) {
            out.insert(NewField::SharedCapacity);
        }
        if !lists(data).is_subset(&lists(back)) {
            out.insert(NewField::ListAttributes);
        }
    }
    out
}

/// The list-type value fields of an attribute.
const LIST_TYPES: [&str; 4] = ["ints", "bools", "strings", "versions"];

/// The attributes of a device that carry a list.
fn lists(device: &Value) -> BTreeSet<String> {
    device["attributes"]
        .as_object()
        .into_iter()
        .flatten()
        .filter(|(_, a)| LIST_TYPES.iter().any(|t| present(&a[*t])))
        .map(|(name, _)| name.clone())
        .collect()
}

/// Whether `sent` (a slice spec) carried list-type attributes and the API server refused it as
/// invalid (422) naming device attributes: what a server without them does, since it drops the
/// list it does not know and then finds the attribute without a value.
pub fn refused_lists(sent: &Value, status: Option<u16>, message: &str) -> bool {
    status == Some(422)
        && message.contains(".attributes[")
        && devices(sent).iter().any(|d| !lists(data_of(d)).is_empty())
}

fn devices(spec: &Value) -> Vec<&Value> {
    spec["devices"].as_array().into_iter().flatten().collect()
}

/// A device's data: v1beta1 wraps it in `basic`.
fn data_of(device: &Value) -> &Value {
    match device.get("basic") {
        Some(basic) => basic,
        None => device,
    }
}

/// Set to something: not absent, null, false, or empty.
fn present(value: &Value) -> bool {
    match value {
        Value::Null | Value::Bool(false) => false,
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => !o.is_empty(),
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn shared_gpu() -> Value {
        json!({"name": "gpu-0", "allowMultipleAllocations": true, "capacity": {"memory": {
            "value": "80Gi", "requestPolicy": {"default": "80Gi",
            "validRange": {"min": "1Gi", "step": "1Gi"}}}}})
    }

    #[test]
    fn fields_the_server_cleared_are_named_by_their_feature() {
        let sent = json!({"devices": [shared_gpu()]});
        assert!(dropped(&sent, &sent).is_empty());
        let gate_off = json!({"devices": [{"name": "gpu-0", "capacity": {"memory": {
            "value": "80Gi"}}}]});
        assert_eq!(
            dropped(&sent, &gate_off).into_iter().collect::<Vec<_>>(),
            [NewField::SharedCapacity]
        );
        // Only the policy gone is enough to tell.
        let mut policy_gone = sent.clone();
        policy_gone["devices"][0]["capacity"]["memory"] = json!({"value": "80Gi"});
        assert_eq!(dropped(&sent, &policy_gone).len(), 1);

        let counters = json!({"sharedCounters": [{"name": "gpu-0-counters",
            "counters": {"memory": {"value": "80Gi"}}}], "devices": [{"name": "mig-0",
            "consumesCounters": [{"counterSet": "gpu-0-counters",
            "counters": {"memory": {"value": "10Gi"}}}]}]});
        let cleared = json!({"devices": [{"name": "mig-0"}]});
        assert_eq!(
            dropped(&counters, &cleared).into_iter().collect::<Vec<_>>(),
            [NewField::Counters]
        );
        // v1beta1 spelling.
        let basic =
            json!({"devices": [{"name": "gpu-0", "basic": {"allowMultipleAllocations": true}}]});
        let bare = json!({"devices": [{"name": "gpu-0", "basic": {}}]});
        assert_eq!(dropped(&basic, &bare).len(), 1);
        assert!(dropped(&basic, &basic).is_empty());
    }

    #[test]
    fn lists_dropped_or_refused_are_told_apart_from_other_refusals() {
        let sent = json!({"devices": [{"name": "gpu-0", "attributes": {
            "resource.kubernetes.io/numaNode": {"ints": [0, 1]}}}]});
        let scalar = json!({"devices": [{"name": "gpu-0", "attributes": {
            "resource.kubernetes.io/numaNode": {"int": 0}}}]});
        assert_eq!(
            dropped(
                &sent,
                &json!({"devices": [{"name": "gpu-0", "attributes": {
                "resource.kubernetes.io/numaNode": {}}}]})
            )
            .into_iter()
            .collect::<Vec<_>>(),
            [NewField::ListAttributes]
        );
        assert!(dropped(&sent, &sent).is_empty());
        let message = "ResourceSlice.resource.k8s.io \"n-d-0\" is invalid: \
            spec.devices[0].attributes[resource.kubernetes.io/numaNode]: Required value: \
            exactly one value must be specified";
        assert!(refused_lists(&sent, Some(422), message));
        // Not a list sent, another status, another field: not this.
        assert!(!refused_lists(&scalar, Some(422), message));
        assert!(!refused_lists(&sent, Some(409), message));
        assert!(!refused_lists(
            &sent,
            Some(422),
            "spec.pool.name: Invalid value"
        ));
    }
}
