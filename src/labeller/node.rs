//! Sink 2: the node's own labels, through the Kubernetes API, for clusters without NFD.
//!
//! The labeller owns exactly the keys it wrote: their names are kept in the node annotation
//! [`OWNED_ANNOTATION`] (as NFD keeps `nfd.node.kubernetes.io/feature-labels`). Each sync reads
//! the node, then sends one JSON merge patch that sets the current labels, deletes owned keys
//! that are no longer produced, and updates the annotation. Labels set by anyone else are
//! never in the patch, so they survive. A value Kubernetes would reject is left out with a
//! warning (one bad value must not block every other label), as NFD does.
//!
//! The patch itself is a pure function ([`plan`]); the client is a thin shell around it.

use std::collections::BTreeSet;

use serde_json::{Map, Value, json};
use tracing::warn;

use super::FIELD_MANAGER;
use super::labels::Labels;
use super::syntax::{is_valid_label_key, is_valid_label_value};
use crate::kube::{ApiError, NodeClient};

/// Node annotation listing the label keys the labeller manages (comma-separated, sorted).
pub const OWNED_ANNOTATION: &str = "gpud.io/labels";

/// What one sync changes on the node.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// The merge patch to send, `None` when the node already carries exactly these labels.
    pub patch: Option<Value>,
    /// Labels left out because Kubernetes would reject them, as `key=value`.
    pub rejected: Vec<String>,
}

/// Works out the patch from the node's current labels and annotations and the wanted labels.
pub fn plan(
    current_labels: &std::collections::BTreeMap<String, String>,
    current_owned: Option<&str>,
    wanted: &Labels,
) -> Plan {
    let mut rejected = Vec::new();
    let valid: Labels = wanted
        .iter()
        .filter(|(k, v)| {
            let ok = is_valid_label_key(k) && is_valid_label_value(v);
            if !ok {
                rejected.push(format!("{k}={v}"));
            }
            ok
        })
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let owned: BTreeSet<&str> = current_owned
        .unwrap_or_default()
        .split(',')
        .map(str::trim)
        .filter(|k| !k.is_empty())
        .collect();
    let mut labels = Map::new();
    for (key, value) in &valid {
        if current_labels.get(key) != Some(value) {
            labels.insert(key.clone(), Value::String(value.clone()));
        }
    }
    for key in owned.iter().filter(|k| !valid.contains_key(**k)) {
        if current_labels.contains_key(*key) {
            labels.insert((*key).to_owned(), Value::Null);
        }
    }
    let owned_now = valid
        .keys()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .join(",");
    let owned_before = owned.iter().copied().collect::<Vec<_>>().join(",");
    if labels.is_empty() && owned_now == owned_before && current_owned.is_some() {
        return Plan {
            patch: None,
            rejected,
        };
    }
    Plan {
        patch: Some(json!({
            "metadata": {
                "labels": labels,
                "annotations": { OWNED_ANNOTATION: owned_now },
            }
        })),
        rejected,
    }
}

/// Writes the labels on this node's Node, through the one Node client.
#[derive(Debug)]
pub struct NodeSink {
    client: NodeClient,
}

impl NodeSink {
    /// A sink for `node`'s labels over an existing connection.
    pub fn new(client: ::kube::Client, node: String) -> Self {
        NodeSink {
            client: NodeClient::new(client, node, FIELD_MANAGER),
        }
    }

    /// The node this sink labels.
    pub fn node(&self) -> &str {
        self.client.node()
    }

    /// One attempt: reads the node and patches its labels if they differ. Returns whether a
    /// patch was sent.
    pub async fn sync(&self, wanted: &Labels) -> Result<bool, ApiError> {
        let node = self.client.get().await?;
        let labels = node.metadata.labels.unwrap_or_default();
        let owned = node
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(OWNED_ANNOTATION))
            .map(String::as_str);
        let plan = plan(&labels, owned, wanted);
        for label in &plan.rejected {
            warn!(node = %self.node(), label = %label, "Label is not valid Kubernetes syntax; not set on the node");
        }
        let Some(patch) = plan.patch else {
            return Ok(false);
        };
        self.client.merge(&patch, "writing the labels").await?;
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn first_sync_sets_labels_and_records_ownership() {
        let current = map(&[("kubernetes.io/hostname", "n1")]);
        let wanted = map(&[
            ("nvidia.com/gpu.count", "8"),
            ("nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3"),
        ]);
        let plan = plan(&current, None, &wanted);
        assert_eq!(
            plan.patch,
            Some(json!({"metadata": {
                "labels": {"nvidia.com/gpu.count": "8", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
                "annotations": {"gpud.io/labels": "nvidia.com/gpu.count,nvidia.com/gpu.product"}
            }}))
        );
    }

    #[test]
    fn removes_only_owned_keys_no_longer_produced() {
        let current = map(&[
            ("kubernetes.io/hostname", "n1"),
            ("nvidia.com/gpu.count", "8"),
            ("nvidia.com/mig-1g.10gb.count", "7"),
            ("nvidia.com/device-plugin.config", "a100"),
        ]);
        let owned = "nvidia.com/gpu.count,nvidia.com/mig-1g.10gb.count";
        let wanted = map(&[("nvidia.com/gpu.count", "8")]);
        let plan = plan(&current, Some(owned), &wanted);
        assert_eq!(
            plan.patch,
            Some(json!({"metadata": {
                "labels": {"nvidia.com/mig-1g.10gb.count": null},
                "annotations": {"gpud.io/labels": "nvidia.com/gpu.count"}
            }}))
        );
    }

    #[test]
    fn nothing_to_do_sends_nothing() {
        let current = map(&[("nvidia.com/gpu.count", "8")]);
        let wanted = current.clone();
        assert_eq!(
            plan(&current, Some("nvidia.com/gpu.count"), &wanted).patch,
            None
        );
    }

    #[test]
    fn invalid_values_are_left_out() {
        let wanted = map(&[
            (
                "nvidia.com/gpu.machine",
                "a-very-long-machine-name-that-goes-on-and-on-and-on-past-63-chars",
            ),
            ("nvidia.com/gpu.count", "1"),
        ]);
        let plan = plan(&BTreeMap::new(), None, &wanted);
        assert_eq!(plan.rejected.len(), 1);
        assert_eq!(
            plan.patch,
            Some(json!({"metadata": {
                "labels": {"nvidia.com/gpu.count": "1"},
                "annotations": {"gpud.io/labels": "nvidia.com/gpu.count"}
            }}))
        );
    }
}
