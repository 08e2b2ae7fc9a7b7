//! The one client of this node's Node object. Every subsystem that reads or writes the Node
//! goes through it, each with its own field manager so the API server records which part of
//! gpud owns what:
//!
//! - labels and annotations: a JSON merge patch ([`NodeClient::merge`]) of exactly the keys
//!   the caller owns;
//! - conditions: server-side apply to `nodes/status` of only gpud's condition types
//!   ([`NodeClient::apply_conditions`]): conditions are a map keyed by type, so every other
//!   condition stays its owner's, and `force` takes back gpud's own entries;
//! - taints: one atomic list in the API, so server-side apply would claim all of them; instead
//!   the whole list goes in a merge patch with the `resourceVersion` it was read at
//!   ([`NodeClient::replace_taints`]), and a concurrent change is refused (409) so the caller
//!   starts again from a fresh read;
//! - a watch on the one Node ([`NodeClient::changed`]);
//! - events about the Node ([`NodeClient::create_event`]).
//!
//! Every call is bounded by [`CALL_TIMEOUT`](super::CALL_TIMEOUT).

use std::time::Duration;

use ::kube::api::{Api, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use k8s_openapi::api::core::v1::{Event, Node, Taint};
use serde_json::{Value, json};
use tokio_stream::StreamExt;

use super::ApiError;
use super::call::bounded;
use super::events::NodeEvent;

/// What [`NodeClient::changed`] saw.
#[derive(Debug)]
pub enum Watched {
    /// The Node changed; this is it now.
    Changed(Box<Node>),
    /// Nothing changed; the watch goes on from this version.
    Quiet(String),
}

/// The namespace events about the Node are created in.
pub const EVENTS_NAMESPACE: &str = "default";

/// What gpud reads of the Node for its conditions and taints.
#[derive(Debug, Clone, Default)]
pub struct NodeView {
    pub uid: Option<String>,
    pub resource_version: Option<String>,
    pub taints: Vec<Taint>,
    /// `(type, status, lastTransitionTime)` of every condition.
    pub conditions: Vec<(String, String, Option<String>)>,
    /// `(type, reason, message)` of every condition, to tell whether a write would change
    /// anything.
    pub said: Vec<(String, String, String)>,
}

/// The longest condition message gpud writes; longer ones are cut, ending in `…`.
pub const MAX_CONDITION_MESSAGE: usize = 1024;

/// `text` cut to [`MAX_CONDITION_MESSAGE`] bytes on a character boundary.
pub fn clip_message(mut text: String) -> String {
    if text.len() <= MAX_CONDITION_MESSAGE {
        return text;
    }
    let mut end = MAX_CONDITION_MESSAGE - '…'.len_utf8();
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.truncate(end);
    text.push('…');
    text
}

/// One condition as it is written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConditionRecord<'a> {
    pub kind: &'a str,
    pub status: &'a str,
    pub reason: &'a str,
    pub message: &'a str,
    pub transition: &'a str,
    pub heartbeat: &'a str,
}

/// This node's Node, for one field manager.
#[derive(Clone)]
pub struct NodeClient {
    nodes: Api<Node>,
    events: Api<Event>,
    node: String,
    manager: &'static str,
}

impl std::fmt::Debug for NodeClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeClient")
            .field("node", &self.node)
            .field("manager", &self.manager)
            .finish()
    }
}

impl NodeClient {
    /// A client of `node` whose writes are recorded under `manager`.
    pub fn new(client: ::kube::Client, node: String, manager: &'static str) -> Self {
        NodeClient {
            nodes: Api::all(client.clone()),
            events: Api::namespaced(client, EVENTS_NAMESPACE),
            node,
            manager,
        }
    }

    /// The client in `slot`, connecting (from `kubeconfig`, or in-cluster) when there is none
    /// yet: the helpers that write to the Node now and then connect on their first write, so
    /// an API server that is not there at start costs them a retry, not their start.
    pub async fn in_slot<'a>(
        slot: &'a mut Option<NodeClient>,
        kubeconfig: Option<&std::path::Path>,
        node: &str,
        manager: &'static str,
    ) -> Result<&'a mut NodeClient, ApiError> {
        match slot {
            Some(client) => Ok(client),
            None => {
                let connected = super::client::connect(kubeconfig).await?;
                Ok(slot.insert(NodeClient::new(connected, node.to_owned(), manager)))
            }
        }
    }

    /// The Node's name.
    pub fn node(&self) -> &str {
        &self.node
    }

    /// The Node as the API server has it now.
    pub async fn get(&self) -> Result<Node, ApiError> {
        bounded(
            || format!("reading node {}", self.node),
            self.nodes.get(&self.node),
        )
        .await
    }

    /// The Node's conditions, taints and version.
    pub async fn read(&self) -> Result<NodeView, ApiError> {
        let node = self.get().await?;
        let all = node.status.and_then(|s| s.conditions).unwrap_or_default();
        let said = all
            .iter()
            .map(|c| {
                (
                    c.type_.clone(),
                    c.reason.clone().unwrap_or_default(),
                    c.message.clone().unwrap_or_default(),
                )
            })
            .collect();
        let conditions = all
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
            said,
        })
    }

    /// Sends a JSON merge patch to the Node (labels, annotations); `what` names it in errors.
    pub async fn merge(&self, patch: &Value, what: &str) -> Result<(), ApiError> {
        let params = PatchParams {
            field_manager: Some(self.manager.to_owned()),
            ..PatchParams::default()
        };
        bounded(
            || format!("{what} of node {}", self.node),
            self.nodes.patch(&self.node, &params, &Patch::Merge(patch)),
        )
        .await
        .map(drop)
    }

    /// Applies `conditions` to the Node's status, owning exactly those types.
    pub async fn apply_conditions(
        &self,
        conditions: &[ConditionRecord<'_>],
    ) -> Result<(), ApiError> {
        let body = json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": self.node},
            "status": {"conditions": conditions.iter().map(|c| json!({
                "type": c.kind,
                "status": c.status,
                "reason": c.reason,
                "message": c.message,
                "lastTransitionTime": c.transition,
                "lastHeartbeatTime": c.heartbeat,
            })).collect::<Vec<Value>>()},
        });
        let params = PatchParams::apply(self.manager).force();
        bounded(
            || format!("applying conditions to node {}", self.node),
            self.nodes
                .patch_status(&self.node, &params, &Patch::Apply(&body)),
        )
        .await
        .map(drop)
    }

    /// Replaces the Node's whole taint list, if the Node is still at `resource_version`.
    pub async fn replace_taints(
        &self,
        taints: &[Taint],
        resource_version: Option<&str>,
    ) -> Result<(), ApiError> {
        let body = json!({
            "metadata": {"resourceVersion": resource_version},
            "spec": {"taints": taints},
        });
        let params = PatchParams {
            field_manager: Some(self.manager.to_owned()),
            ..PatchParams::default()
        };
        bounded(
            || format!("updating the taints of node {}", self.node),
            self.nodes.patch(&self.node, &params, &Patch::Merge(&body)),
        )
        .await
        .map(drop)
    }

    /// Waits until the Node changes after `version` in a way `matters` says the caller
    /// cares about, or `limit` passes, or the API server ends the watch (which it may do at
    /// any time). A change comes with the Node as the watch sent it, so the caller need not
    /// read it again; a quiet end comes with the version to watch from next (bookmarks and
    /// the changes that did not matter move it on), so a watch renewed every few minutes
    /// costs one request and no read. A change that does not matter (another part of gpud
    /// writing conditions or labels) keeps the watch open: ending it would cost a new watch
    /// per write to the Node, on every node of a fleet at once when they all see one fault.
    pub async fn changed(
        &self,
        version: &str,
        limit: Duration,
        matters: impl Fn(&Node) -> bool,
    ) -> Result<Watched, ApiError> {
        let seconds = u32::try_from(limit.as_secs().clamp(1, 290)).unwrap_or(290);
        let params = WatchParams::default()
            .fields(&format!("metadata.name={}", self.node))
            .timeout(seconds);
        let what = || format!("watching node {}", self.node);
        let stream = bounded(what, self.nodes.watch(&params, version)).await?;
        let mut stream = std::pin::pin!(stream);
        let mut at = version.to_owned();
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            match tokio::time::timeout_at(deadline, stream.next()).await {
                Ok(Some(Err(source))) => {
                    return Err(ApiError::Api {
                        what: what(),
                        source,
                    });
                }
                // The API server ends a watch with an ERROR event, a 410 Gone when `version`
                // is too old: an error, so that the caller reads again and a watch that keeps
                // failing is paced by the caller's backoff rather than reopened at once.
                Ok(Some(Ok(WatchEvent::Error(status)))) => {
                    return Err(ApiError::Api {
                        what: what(),
                        source: ::kube::Error::Api(status),
                    });
                }
                Ok(Some(Ok(WatchEvent::Bookmark(bookmark)))) => {
                    at = bookmark.metadata.resource_version;
                }
                Ok(Some(Ok(WatchEvent::Added(node) | WatchEvent::Modified(node))))
                    if !matters(&node) =>
                {
                    if let Some(version) = node.metadata.resource_version {
                        at = version;
                    }
                }
                Ok(Some(Ok(
                    WatchEvent::Added(node)
                    | WatchEvent::Modified(node)
                    | WatchEvent::Deleted(node),
                ))) => return Ok(Watched::Changed(Box::new(node))),
                Ok(None) | Err(_) => return Ok(Watched::Quiet(at)),
            }
        }
    }

    /// Creates `event` about the Node (`uid` is the Node's, when known). An event the API
    /// server already has (a retry after a lost answer) counts as created.
    pub async fn create_event(&self, event: &NodeEvent, uid: Option<&str>) -> Result<(), ApiError> {
        let at = humantime::format_rfc3339_seconds(event.at).to_string();
        let object = json!({
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": event.name(&self.node), "namespace": EVENTS_NAMESPACE},
            "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": self.node, "uid": uid},
            "type": event.kind.as_str(),
            "reason": event.reason,
            "message": event.message,
            "source": {"component": self.manager, "host": self.node},
            "reportingComponent": self.manager,
            "reportingInstance": self.node,
            "firstTimestamp": at,
            "lastTimestamp": at,
            "count": 1,
        });
        let event: Event = serde_json::from_value(object).map_err(|e| ApiError::Api {
            what: "building an event".to_owned(),
            source: ::kube::Error::SerdeError(e),
        })?;
        let created = bounded(
            || format!("creating an event for node {}", self.node),
            self.events.create(&PostParams::default(), &event),
        )
        .await;
        match created {
            Err(err) if err.status() == Some(409) => Ok(()),
            other => other.map(drop),
        }
    }
}
