//! The Kubernetes API calls of the node status: read the Node, apply gpud's conditions to
//! `nodes/status`, replace gpud's taints, create events. Each call is bounded by a timeout, so
//! a slow API server delays only the next retry.
//!
//! - Conditions go through server-side apply with the field manager [`FIELD_MANAGER`]: the
//!   applied object holds only gpud's condition types, so the API server records gpud as the
//!   owner of exactly those list entries (conditions are a map keyed by type) and every other
//!   condition is left to its owner. `force` takes over gpud's own entries if something else
//!   wrote them.
//! - Taints are one atomic list in the API, so server-side apply would claim all of them:
//!   instead gpud sends the whole list with the Node's `resourceVersion`, in a merge patch,
//!   after copying every other taint from the Node it just read. If anyone changed the Node in
//!   between, the API server refuses (409) and the next attempt starts from a fresh read.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Event, Node, Taint};
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use super::conditions::Condition;
use super::events::NodeEvent;

/// The field manager of gpud's node status writes.
pub const FIELD_MANAGER: &str = "gpud";
/// Namespace of the Node's events (where the kubelet puts its own).
pub const EVENTS_NAMESPACE: &str = "default";
/// The longest one API call may take.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// A failed API call, with what it was doing.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    #[error("{what}: no answer from the API server within {CALL_TIMEOUT:?}")]
    Timeout { what: String },
    #[error("{what}: {source}")]
    Api {
        what: String,
        #[source]
        source: kube::Error,
    },
}

/// What gpud needs from its Node.
#[derive(Debug, Clone, Default)]
pub struct NodeView {
    pub uid: Option<String>,
    pub resource_version: Option<String>,
    pub taints: Vec<Taint>,
    /// `(type, status, lastTransitionTime)` of every condition.
    pub conditions: Vec<(String, String, Option<String>)>,
}

/// A condition as written, with its timestamps (RFC 3339).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Written {
    pub condition: Condition,
    pub transition: String,
    pub heartbeat: String,
}

/// The API calls for one node.
#[derive(Clone)]
pub struct NodeApi {
    nodes: Api<Node>,
    events: Api<Event>,
    node: String,
}

impl std::fmt::Debug for NodeApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeApi").field("node", &self.node).finish()
    }
}

/// Runs one API call with [`CALL_TIMEOUT`], naming it in the error.
pub async fn bounded<T>(
    what: impl Fn() -> String,
    call: impl std::future::Future<Output = Result<T, kube::Error>>,
) -> Result<T, CallError> {
    match tokio::time::timeout(CALL_TIMEOUT, call).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(source)) => Err(CallError::Api {
            what: what(),
            source,
        }),
        Err(_) => Err(CallError::Timeout { what: what() }),
    }
}

impl NodeApi {
    pub fn new(client: kube::Client, node: String) -> Self {
        NodeApi {
            nodes: Api::all(client.clone()),
            events: Api::namespaced(client, EVENTS_NAMESPACE),
            node,
        }
    }

    pub fn node(&self) -> &str {
        &self.node
    }

    /// Reads the Node.
    pub async fn read(&self) -> Result<NodeView, CallError> {
        let node = bounded(
            || format!("reading node {}", self.node),
            self.nodes.get(&self.node),
        )
        .await?;
        let conditions = node
            .status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .into_iter()
            .map(|c| {
                (
                    c.type_,
                    c.status,
                    c.last_transition_time.map(|t| t.0.to_string()),
                )
            })
            .collect();
        Ok(NodeView {
            uid: node.metadata.uid,
            resource_version: node.metadata.resource_version,
            taints: node.spec.and_then(|s| s.taints).unwrap_or_default(),
            conditions,
        })
    }

    /// Server-side applies `conditions` (all of gpud's) to the Node's status.
    pub async fn apply_conditions(&self, conditions: &[Written]) -> Result<(), CallError> {
        let body = json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": self.node},
            "status": {"conditions": conditions.iter().map(|w| json!({
                "type": w.condition.kind,
                "status": w.condition.status.as_str(),
                "reason": w.condition.reason,
                "message": w.condition.message,
                "lastTransitionTime": w.transition,
                "lastHeartbeatTime": w.heartbeat,
            })).collect::<Vec<Value>>()},
        });
        let params = PatchParams::apply(FIELD_MANAGER).force();
        bounded(
            || format!("applying conditions to node {}", self.node),
            self.nodes
                .patch_status(&self.node, &params, &Patch::Apply(&body)),
        )
        .await?;
        Ok(())
    }

    /// Replaces the Node's taints with `taints`, if the Node is still at `resource_version`.
    pub async fn replace_taints(
        &self,
        taints: &[Taint],
        resource_version: Option<&str>,
    ) -> Result<(), CallError> {
        let body = json!({
            "metadata": {"resourceVersion": resource_version},
            "spec": {"taints": taints},
        });
        let params = PatchParams {
            field_manager: Some(FIELD_MANAGER.to_owned()),
            ..PatchParams::default()
        };
        bounded(
            || format!("updating the taints of node {}", self.node),
            self.nodes.patch(&self.node, &params, &Patch::Merge(&body)),
        )
        .await?;
        Ok(())
    }

    /// Creates `event` about the Node (uid `uid`); one that already exists counts as created.
    pub async fn create_event(
        &self,
        event: &NodeEvent,
        uid: Option<&str>,
    ) -> Result<(), CallError> {
        let at = humantime::format_rfc3339_seconds(event.at).to_string();
        let object = json!({
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": event.name(&self.node), "namespace": EVENTS_NAMESPACE},
            "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": self.node, "uid": uid},
            "type": event.kind.as_str(),
            "reason": event.reason,
            "message": event.message,
            "source": {"component": FIELD_MANAGER, "host": self.node},
            "reportingComponent": FIELD_MANAGER,
            "reportingInstance": self.node,
            "firstTimestamp": at,
            "lastTimestamp": at,
            "count": 1,
        });
        let event: Event = serde_json::from_value(object).map_err(|e| CallError::Api {
            what: "building an event".to_owned(),
            source: kube::Error::SerdeError(e),
        })?;
        let created = bounded(
            || format!("creating an event for node {}", self.node),
            self.events.create(&PostParams::default(), &event),
        )
        .await;
        match created {
            Err(CallError::Api {
                source: kube::Error::Api(status),
                ..
            }) if status.code == 409 => Ok(()),
            other => other.map(|_| ()),
        }
    }
}
