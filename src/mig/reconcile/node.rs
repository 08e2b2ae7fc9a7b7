//! The reconciler's view of its Node through the API server: the requested config
//! (`nvidia.com/mig.config`), the reported state (`nvidia.com/mig.config.state`) and the reason
//! of a failure (the annotation [`REASON_ANNOTATION`]). It reuses the labeller's connection and
//! kubeconfig handling.
//!
//! Changes are waited for with a watch on the one Node (field selector on its name) from the
//! version last read; the loop re-reads the Node after every wake, so a watch that ends early
//! (the API server closes watches at will) costs one GET, never a missed change.

use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams, WatchParams};
use serde_json::{Value, json};
use tokio_stream::StreamExt;

use crate::labeller::api::ApiSinkError;

/// The label naming the config to apply (set by the cluster admin or the GPU Operator).
pub const CONFIG_LABEL: &str = "nvidia.com/mig.config";
/// The label the reconciler reports progress in: `pending`, `rebooting`, `success`, `failed`.
pub const STATE_LABEL: &str = "nvidia.com/mig.config.state";
/// Why the last attempt failed (removed on success).
pub const REASON_ANNOTATION: &str = "gpud.io/mig.config.reason";
/// Field manager recorded for the reconciler's writes.
pub const FIELD_MANAGER: &str = "gpud-mig";

/// The states the reconciler writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    Pending,
    Rebooting,
    Success,
    Failed,
}

impl State {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            State::Pending => "pending",
            State::Rebooting => "rebooting",
            State::Success => "success",
            State::Failed => "failed",
        }
    }
}

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

/// One node's client.
#[derive(Clone)]
pub struct NodeClient {
    api: Api<Node>,
    node: String,
}

impl std::fmt::Debug for NodeClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeClient")
            .field("node", &self.node)
            .finish()
    }
}

impl NodeClient {
    /// A client for `node` over an existing connection.
    pub fn new(client: kube::Client, node: String) -> Self {
        NodeClient {
            api: Api::all(client),
            node,
        }
    }

    fn error(&self) -> impl Fn(kube::Error) -> ApiSinkError + '_ {
        |source| ApiSinkError::Api {
            target: format!("node {}", self.node),
            source,
        }
    }

    /// Reads the Node.
    pub async fn read(&self) -> Result<View, ApiSinkError> {
        let node = self.api.get(&self.node).await.map_err(self.error())?;
        let labels = node.metadata.labels.unwrap_or_default();
        let annotations = node.metadata.annotations.unwrap_or_default();
        Ok(View {
            wanted: labels.get(CONFIG_LABEL).filter(|v| !v.is_empty()).cloned(),
            state: labels.get(STATE_LABEL).cloned(),
            reason: annotations.get(REASON_ANNOTATION).cloned(),
            version: node.metadata.resource_version.unwrap_or_default(),
        })
    }

    /// Waits until the Node changes after `version`, or `limit` passes, or the API server
    /// ends the watch.
    pub async fn changed(&self, version: &str, limit: Duration) -> Result<(), ApiSinkError> {
        let seconds = u32::try_from(limit.as_secs().clamp(1, 290)).unwrap_or(290);
        let params = WatchParams::default()
            .fields(&format!("metadata.name={}", self.node))
            .timeout(seconds);
        let stream = self
            .api
            .watch(&params, version)
            .await
            .map_err(self.error())?;
        let mut stream = std::pin::pin!(stream);
        let next = tokio::time::timeout(limit, stream.next()).await;
        match next {
            Ok(Some(Err(source))) => Err(self.error()(source)),
            _ => Ok(()),
        }
    }

    /// Writes `state` and `reason` on the Node.
    pub async fn report(&self, state: State, reason: Option<&str>) -> Result<(), ApiSinkError> {
        let params = PatchParams {
            field_manager: Some(FIELD_MANAGER.to_owned()),
            ..PatchParams::default()
        };
        self.api
            .patch(
                &self.node,
                &params,
                &Patch::Merge(&report_patch(state, reason)),
            )
            .await
            .map(drop)
            .map_err(self.error())
    }
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
