//! The pods of this node, as a directory from pod UID and container ID to names: one LIST of
//! the node's pods (field selector `spec.nodeName`), then one WATCH from its resourceVersion,
//! reopened from the last version seen when the API server ends it, and a fresh LIST only
//! when the version is too old (410 Gone). No call per lookup: readers get the latest
//! [`PodDirectory`] from a `watch` channel.

use std::sync::Arc;
use std::time::Duration;

use ::kube::api::{Api, ListParams, WatchEvent, WatchParams};
use k8s_openapi::api::core::v1::Pod;
use tokio::sync::watch;
use tokio_stream::StreamExt;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::ApiError;
use super::call::bounded;
use crate::backoff::{self, Backoff};
use crate::pod_directory::{PodDirectory, PodEntry};

/// How long one watch may stay open before it is reopened (the API server's own limit is
/// a few minutes more).
const WATCH_SECONDS: u32 = 290;

/// Adds or replaces `pod` (an object without a UID is no pod to name).
fn put(directory: &mut PodDirectory, pod: &Pod) {
    if let Some((uid, entry)) = entry(pod) {
        directory.insert(uid, entry);
    }
}

/// Forgets `pod`.
fn remove(directory: &mut PodDirectory, pod: &Pod) {
    if let Some(uid) = &pod.metadata.uid {
        directory.remove(uid);
    }
}

/// A pod's UID and entry; `None` for an object without a UID.
fn entry(pod: &Pod) -> Option<(String, PodEntry)> {
    let uid = pod.metadata.uid.clone()?;
    let status = pod.status.as_ref();
    let containers = status
        .into_iter()
        .flat_map(|s| {
            let normal = s.container_statuses.iter().flatten();
            let init = s.init_container_statuses.iter().flatten();
            normal.chain(init)
        })
        .filter_map(|c| {
            let id = c.container_id.as_deref()?;
            let id = id.split_once("://").map_or(id, |(_, id)| id);
            Some((id.to_owned(), c.name.clone()))
        })
        .collect();
    Some((
        uid,
        PodEntry {
            namespace: pod.metadata.namespace.clone().unwrap_or_default(),
            name: pod.metadata.name.clone().unwrap_or_default(),
            containers,
        },
    ))
}

/// Follows the pods of `node` into `directory` until `cancel` fires. Failures are retried
/// with backoff and logged; the last directory stays meanwhile, and `trouble` holds what
/// failed (the API server's answer, with the RBAC hint on a 403) until a list is answered or
/// a watch opens again: the exporter says it on `/readyz` and serves its metrics on.
pub async fn follow(
    client: ::kube::Client,
    node: String,
    directory: watch::Sender<Arc<PodDirectory>>,
    trouble: watch::Sender<Option<String>>,
    cancel: CancellationToken,
) {
    let pods: Api<Pod> = Api::all(client);
    let selector = format!("spec.nodeName={node}");
    let mut backoff = Backoff::new(backoff::seed_from(&node).rotate_left(7));
    // The version the directory is current at; `None`: list again.
    let mut version: Option<String> = None;
    loop {
        let step = async {
            match &version {
                None => {
                    let (listed, at) = list(&pods, &selector).await?;
                    info!(pods = listed.len(), "Listed this node's pods");
                    directory.send_replace(Arc::new(listed));
                    Ok(Some(at))
                }
                Some(from) => watch_once(&pods, &selector, from, &directory, &trouble)
                    .await
                    .map(Some),
            }
        };
        let result = tokio::select! {
            () = cancel.cancelled() => return,
            result = step => result,
        };
        match result {
            Ok(next) => {
                version = next;
                backoff.reset();
                resolved(&trouble);
            }
            Err(err) => {
                // 410: the version is gone from the API server's window; list again.
                if err.status() == Some(410) {
                    version = None;
                }
                let delay = err.paced(backoff.next_delay());
                let text = crate::logging::error_chain(&err);
                warn!(error = %text, retry_in = ?delay, "Cannot follow this node's pods; retrying");
                trouble.send_replace(Some(format!(
                    "per-pod usage cannot name this node's pods: {text}; retrying with backoff"
                )));
                tokio::select! {
                    () = cancel.cancelled() => return,
                    () = tokio::time::sleep(delay) => {}
                }
            }
        }
    }
}

/// Clears `trouble`: the API server answered.
fn resolved(trouble: &watch::Sender<Option<String>>) {
    trouble.send_if_modified(|trouble| trouble.take().is_some());
}

async fn list(pods: &Api<Pod>, selector: &str) -> Result<(PodDirectory, String), ApiError> {
    let params = ListParams::default().fields(selector);
    let listed = bounded(|| "listing this node's pods".to_owned(), pods.list(&params)).await?;
    let mut directory = PodDirectory::default();
    for pod in &listed.items {
        put(&mut directory, pod);
    }
    Ok((
        directory,
        listed.metadata.resource_version.unwrap_or_default(),
    ))
}

/// One watch from `from` until the API server ends it; returns the last version seen.
async fn watch_once(
    pods: &Api<Pod>,
    selector: &str,
    from: &str,
    directory: &watch::Sender<Arc<PodDirectory>>,
    trouble: &watch::Sender<Option<String>>,
) -> Result<String, ApiError> {
    // Bookmarks are asked for by default: a quiet node's version stays fresh.
    let params = WatchParams::default()
        .fields(selector)
        .timeout(WATCH_SECONDS);
    let what = || "watching this node's pods".to_owned();
    let stream = bounded(what, pods.watch(&params, from)).await?;
    resolved(trouble);
    let mut stream = std::pin::pin!(stream);
    let mut version = from.to_owned();
    let limit = Duration::from_secs(u64::from(WATCH_SECONDS) + 30);
    while let Ok(Some(event)) = tokio::time::timeout(limit, stream.next()).await {
        let event = event.map_err(|source| ApiError::Api {
            what: what(),
            source,
        })?;
        let mut changed = |pod: &Pod, apply: fn(&mut PodDirectory, &Pod)| {
            if let Some(v) = &pod.metadata.resource_version {
                version.clone_from(v);
            }
            directory.send_modify(|d| apply(Arc::make_mut(d), pod));
        };
        match event {
            WatchEvent::Added(pod) | WatchEvent::Modified(pod) => {
                changed(&pod, put);
            }
            WatchEvent::Deleted(pod) => changed(&pod, remove),
            WatchEvent::Bookmark(mark) => version = mark.metadata.resource_version,
            WatchEvent::Error(status) => {
                return Err(ApiError::Api {
                    what: what(),
                    source: ::kube::Error::Api(status),
                });
            }
        }
    }
    Ok(version)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pod_maps_its_container_ids_to_names() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "train-0", "namespace": "ml", "uid": "u-1"},
            "status": {
                "containerStatuses": [
                    {"name": "trainer", "containerID": "containerd://abc123", "image": "i",
                     "imageID": "", "ready": true, "restartCount": 0},
                    {"name": "starting", "image": "i", "imageID": "", "ready": false,
                     "restartCount": 0}
                ],
                "initContainerStatuses": [
                    {"name": "setup", "containerID": "cri-o://def456", "image": "i",
                     "imageID": "", "ready": false, "restartCount": 0}
                ]
            }
        }))
        .unwrap();
        let mut directory = PodDirectory::default();
        put(&mut directory, &pod);
        let entry = directory.pod("u-1").unwrap();
        assert_eq!(
            (entry.namespace.as_str(), entry.name.as_str()),
            ("ml", "train-0")
        );
        assert_eq!(entry.containers["abc123"], "trainer");
        assert_eq!(entry.containers["def456"], "setup");
        assert_eq!(
            entry.containers.len(),
            2,
            "a container not started has no ID yet"
        );
        remove(&mut directory, &pod);
        assert!(directory.is_empty());
    }
}
