//! The reconciler's view of its Node through the API server: the requested config
//! (`nvidia.com/mig.config`), the reported state (`nvidia.com/mig.config.state`) and the reason
//! of a failure (the annotation [`REASON_ANNOTATION`]). Calls go through the one
//! Node client ([`crate::kube::NodeClient`]) with field manager [`FIELD_MANAGER`].
//!
//! Changes are waited for with a watch on the one Node (field selector on its name) from the
//! version last seen; a change brings the Node with it, and a watch that ends quietly (the API
//! server closes watches at will) is opened again from the version its bookmarks reached, so
//! a Node that does not change costs one watch request per renewal and no read.

use serde_json::{Value, json};

use crate::kube::{ApiError, NodeClient};
pub use crate::mig_state::State;

/// The label naming the config to apply (set by the cluster admin or the GPU Operator).
pub const CONFIG_LABEL: &str = "nvidia.com/mig.config";
/// The label the reconciler reports progress in: `pending`, `rebooting`, `success`, `failed`.
pub const STATE_LABEL: &str = "nvidia.com/mig.config.state";
/// Why the last attempt failed (removed on success).
pub const REASON_ANNOTATION: &str = "gpud.io/mig.config.reason";
/// Field manager recorded for the reconciler's writes.
pub const FIELD_MANAGER: &str = "gpud-mig";

/// What the reconciler reads from the Node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct View {
    /// The requested config; `None` when the label is missing or empty (nothing to do).
    pub wanted: Option<String>,
    /// The state label now.
    pub state: Option<String>,
    /// The reason annotation now.
    pub reason: Option<String>,
    /// The Node's `resourceVersion`, where a watch for the next change starts.
    pub version: String,
}

impl View {
    /// Whether the Node already says `state` with `reason`.
    pub fn says(&self, state: State, reason: Option<&str>) -> bool {
        self.state.as_deref() == Some(state.as_str()) && self.reason.as_deref() == reason
    }
}

/// The merge patch that reports `state`, with `reason` (none removes the annotation).
pub fn report_patch(state: State, reason: Option<&str>) -> Value {
    json!({"metadata": {
        "labels": {STATE_LABEL: state.as_str()},
        "annotations": {REASON_ANNOTATION: reason},
    }})
}

/// Reads the requested config, the state and the reason from the Node.
pub async fn read(client: &NodeClient) -> Result<View, ApiError> {
    Ok(view_of(client.get().await?))
}

/// The reconciler's view of `node` (as read, or as a watch sent it).
pub fn view_of(node: k8s_openapi::api::core::v1::Node) -> View {
    let wanted = wanted_of(&node);
    let labels = node.metadata.labels.unwrap_or_default();
    let annotations = node.metadata.annotations.unwrap_or_default();
    View {
        wanted,
        state: labels.get(STATE_LABEL).cloned(),
        reason: annotations.get(REASON_ANNOTATION).cloned(),
        version: node.metadata.resource_version.unwrap_or_default(),
    }
}

/// The MIG config `node`'s label asks for (an empty label asks for none).
fn wanted_of(node: &k8s_openapi::api::core::v1::Node) -> Option<String> {
    node.metadata
        .labels
        .as_ref()?
        .get(CONFIG_LABEL)
        .filter(|v| !v.is_empty())
        .cloned()
}

/// Whether a Node a watch sent matters to the reconciler: it asks for another config than
/// `known`, the one last seen (`None`: none seen yet, so anything matters). Conditions,
/// other labels and the reconciler's own state reports do not.
pub fn asks_otherwise(
    known: Option<&Option<String>>,
    node: &k8s_openapi::api::core::v1::Node,
) -> bool {
    known.is_none_or(|known| wanted_of(node) != *known)
}

/// Writes `state` and `reason` on the Node.
pub async fn report(
    client: &NodeClient,
    state: State,
    reason: Option<&str>,
) -> Result<(), ApiError> {
    client
        .merge(
            &report_patch(state, reason),
            "reporting the MIG config state",
        )
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_sets_the_state_and_sets_or_removes_the_reason() {
        assert_eq!(
            report_patch(State::Failed, Some("GPU 0: busy")),
            json!({"metadata": {"labels": {"nvidia.com/mig.config.state": "failed"},
                   "annotations": {"gpud.io/mig.config.reason": "GPU 0: busy"}}})
        );
        assert_eq!(
            report_patch(State::Success, None),
            json!({"metadata": {"labels": {"nvidia.com/mig.config.state": "success"},
                   "annotations": {"gpud.io/mig.config.reason": null}}})
        );
    }
}
