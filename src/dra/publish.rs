//! Keeping the node's ResourceSlices on the API server equal to what the inventory says.
//!
//! Level-triggered: each sync lists the slices of this node and driver (field selectors
//! `spec.nodeName` and `spec.driver`), and only when they differ from the wanted ones writes
//! all of them under a generation one above any seen, then deletes the slices left over.
//! Anything can trigger a sync — an inventory change (MIG layout, a lost GPU, a health
//! change), the kubelet (re-)registering the plugin, any watch event on the node's slices,
//! the periodic resync — and a sync that finds nothing to do costs one list.
//!
//! What it costs the API server, per node: the first list reads from etcd; every later one
//! (`resourceVersion=0`) is answered from the API server's watch cache. The watch resumes from
//! the last version it saw (bookmarks keep that current while nothing changes), so renewing it
//! every few minutes replays nothing and lists nothing; only a watch that fails (410 Gone after
//! a long break, an outage) makes the publisher list again.
//!
//! Every write is read back ([`super::read_back`]): a field the API server dropped (its
//! feature gate off) is reported to [`ResourceApi::dropped_on_write`], and the caller builds
//! and publishes the slices again without it ([`Publisher::served_fields`] says what is kept).
//!
//! Why watch as well as re-list on registration: the kubelet deletes the node's slices when it
//! starts and again 30 s after it loses the plugin, in a retried `DeleteCollection` whose
//! timing relative to the plugin's (re-)registration is not fixed. Re-listing only when the
//! kubelet registers the plugin can run before the wipe and miss it; a watch sees the
//! deletion whenever it lands.

use kube::api::{
    Api, DeleteParams, DynamicObject, ListParams, PostParams, WatchEvent, WatchParams,
};
use serde_json::json;
use tokio::sync::Notify;
use tokio_stream::StreamExt;
use tracing::{debug, info};

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use super::api_version::{NewField, ResourceApi, ResourceApiError, ResourceVersion, ServedFields};
use super::objects::{Device, SliceSpec};
use super::partitions::{self, Group};
use super::read_back;

/// How long one watch request stays open at most before it is renewed.
const WATCH_MAX: Duration = Duration::from_secs(290);

/// How long the next watch request stays open: a fleet's renewals drift apart.
fn watch_seconds() -> u32 {
    u32::try_from(crate::backoff::period(WATCH_MAX).as_secs()).unwrap_or(u32::MAX)
}

/// A failed API call, with what it was doing (the node status's: the same calls, bounded by
/// the same timeout).
use crate::kube::{ApiError, bounded};

/// The slices of one node and driver.
#[derive(Clone)]
pub struct Publisher {
    api: Arc<ResourceApi>,
    driver: String,
    node: String,
    /// The highest generation written or seen.
    generation: i64,
    /// The resourceVersion the watch resumes from: the last list's or event's, shared with
    /// the clone that watches; `None` until the first list, and after a failed watch.
    seen: Arc<Mutex<Option<String>>>,
    /// How many lists have been answered, so the watch can wait for one to resume from.
    listed: Arc<tokio::sync::watch::Sender<u64>>,
}

impl std::fmt::Debug for Publisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Publisher")
            .field("driver", &self.driver)
            .field("node", &self.node)
            .field("generation", &self.generation)
            .finish()
    }
}

/// A slice on the server.
struct Existing {
    name: String,
    resource_version: Option<String>,
    spec: Option<SliceSpec>,
}

impl Publisher {
    pub fn new(api: Arc<ResourceApi>, driver: &str, node: &str) -> Publisher {
        Publisher {
            api,
            driver: driver.to_owned(),
            node: node.to_owned(),
            generation: 0,
            seen: Arc::new(Mutex::new(None)),
            listed: Arc::new(tokio::sync::watch::Sender::new(0)),
        }
    }

    fn selector(&self) -> String {
        format!("spec.nodeName={},spec.driver={}", self.node, self.driver)
    }

    /// The name of the `index`th slice: stable, so a rewrite replaces rather than adds.
    fn slice_name(&self, index: usize) -> String {
        format!("{}-{}-{index}", self.node, self.driver)
    }

    /// The slices' API in the version the server speaks.
    async fn slices(&self) -> Result<(Api<DynamicObject>, ResourceVersion), ResourceApiError> {
        let version = self.api.version().await?;
        Ok((Api::all_with(self.api.client(), &version.slices()), version))
    }

    /// The newer slice fields the API server keeps, for building the slices.
    pub async fn served_fields(&self) -> Result<ServedFields, ResourceApiError> {
        self.api.served_fields().await
    }

    /// The API server's `resource.k8s.io`.
    pub fn api(&self) -> &ResourceApi {
        &self.api
    }

    /// Whether the watch can resume from a version it saw, missing nothing.
    pub fn resumable(&self) -> bool {
        self.seen().is_some()
    }

    /// Follows how many lists have been answered (see [`Publisher::resumable`]).
    pub fn lists(&self) -> tokio::sync::watch::Receiver<u64> {
        self.listed.subscribe()
    }

    fn seen(&self) -> std::sync::MutexGuard<'_, Option<String>> {
        self.seen.lock().unwrap_or_else(PoisonError::into_inner)
    }

    async fn list(&self) -> Result<Vec<Existing>, ResourceApiError> {
        let (api, version) = self.slices().await?;
        let mut params = ListParams::default().fields(&self.selector());
        // After the first list, from the API server's cache: not older than what the watch
        // has seen, which is all a sync needs, and no read of etcd.
        if self.seen().is_some() {
            params = params.match_any();
        }
        let list = bounded(
            || format!("listing the ResourceSlices of node {}", self.node),
            api.list(&params),
        )
        .await?;
        // "0" is no position to resume from (a watch from it replays the current state).
        if let Some(at) = list.metadata.resource_version.clone().filter(|v| v != "0") {
            self.seen().get_or_insert(at);
        }
        self.listed
            .send_modify(|lists| *lists = lists.wrapping_add(1));
        let out: Vec<Existing> = list
            .items
            .into_iter()
            .map(|object| Existing {
                spec: object
                    .data
                    .get("spec")
                    .cloned()
                    .and_then(|spec| version.slice_from_wire(spec)),
                name: object.metadata.name.unwrap_or_default(),
                resource_version: object.metadata.resource_version,
            })
            .collect();
        Ok(out)
    }

    /// Makes the server's slices hold `devices` and the partitioned GPUs' `groups`, in the
    /// shape `served` says the server keeps; returns whether anything was written.
    pub async fn sync(
        &mut self,
        devices: Vec<Device>,
        groups: Vec<Group>,
        served: ServedFields,
    ) -> Result<bool, ResourceApiError> {
        let existing = self.list().await?;
        let seen = existing
            .iter()
            .filter_map(|e| e.spec.as_ref().map(|s| s.pool.generation))
            .max()
            .unwrap_or(0);
        let current = seen.max(self.generation);
        let build = |generation| {
            partitions::specs(
                &self.driver,
                &self.node,
                devices.clone(),
                groups.clone(),
                generation,
                served,
            )
        };
        let at_current = build(current);
        let up_to_date = existing.len() == at_current.len()
            && at_current.iter().enumerate().all(|(index, spec)| {
                let name = self.slice_name(index);
                existing
                    .iter()
                    .any(|e| e.name == name && e.spec.as_ref() == Some(spec))
            });
        if up_to_date {
            self.generation = current;
            return Ok(false);
        }
        let generation = current + 1;
        let wanted = build(generation);
        let (api, version) = self.slices().await?;
        let mut dropped = BTreeSet::new();
        // Slices with list-type attributes first: a server that refuses them then refuses
        // before anything else of this generation is written, and the publication without
        // lists that follows takes the same generation.
        let mut order: Vec<(usize, &SliceSpec)> = wanted.iter().enumerate().collect();
        order.sort_by_key(|(_, spec)| !has_lists(spec));
        for (index, spec) in order {
            let name = self.slice_name(index);
            let old = existing.iter().find(|e| e.name == name);
            let written = write(
                &api,
                version,
                &name,
                spec,
                old.and_then(|e| e.resource_version.clone()),
            )
            .await;
            match written {
                Ok((sent, kept)) => dropped.extend(read_back::dropped(&sent, &kept)),
                // A server without list-type attributes refuses the slice: the caller
                // publishes again, lists left out, at once.
                Err(err)
                    if read_back::refused_lists(
                        &version.slice_to_wire(spec),
                        err.status(),
                        &err.to_string(),
                    ) =>
                {
                    dropped.insert(NewField::ListAttributes);
                    self.api.dropped_on_write(&dropped);
                    return Ok(true);
                }
                Err(err) => return Err(err.into()),
            }
        }
        self.api.dropped_on_write(&dropped);
        for extra in existing
            .iter()
            .filter(|e| !(0..wanted.len()).any(|i| self.slice_name(i) == e.name))
        {
            bounded(
                || format!("deleting ResourceSlice {}", extra.name),
                api.delete(&extra.name, &DeleteParams::default()),
            )
            .await?;
        }
        self.generation = generation;
        let count: usize = wanted.iter().map(|s| s.devices.len()).sum();
        info!(
            generation,
            slices = wanted.len(),
            devices = count,
            "Published the node's ResourceSlices"
        );
        Ok(true)
    }

    /// Watches the node's slices and wakes `changed` on every event, until the watch ends
    /// (the caller opens it again at once) or fails (the caller lists again, then watches
    /// after a pause).
    pub async fn watch(&self, changed: &Notify) -> Result<(), ResourceApiError> {
        let (api, _) = self.slices().await?;
        let params = WatchParams::default()
            .fields(&self.selector())
            .timeout(watch_seconds());
        let from = self.seen().clone();
        // Bounded like every call: an API server that never answers the watch request is
        // reported and the watch reopened, instead of waiting on it forever.
        let stream = bounded(
            || format!("watching the ResourceSlices of node {}", self.node),
            api.watch(&params, from.as_deref().unwrap_or("0")),
        )
        .await?;
        // Opened from "0" (a list that named no version), a slice deleted between that list
        // and this watch sends it no event: the publisher lists again now the watch is open.
        if from.is_none() {
            changed.notify_one();
        }
        let mut stream = std::pin::pin!(stream);
        while let Some(event) = stream.next().await {
            let at = match &event {
                Ok(
                    WatchEvent::Added(object)
                    | WatchEvent::Modified(object)
                    | WatchEvent::Deleted(object),
                ) => object.metadata.resource_version.clone(),
                Ok(WatchEvent::Bookmark(bookmark)) => {
                    Some(bookmark.metadata.resource_version.clone())
                }
                _ => None,
            };
            if let Some(at) = at.filter(|v| v != "0") {
                *self.seen() = Some(at);
            }
            match event {
                Ok(WatchEvent::Deleted(object)) => {
                    debug!(slice = ?object.metadata.name, "ResourceSlice deleted");
                    changed.notify_one();
                }
                Ok(WatchEvent::Added(_) | WatchEvent::Modified(_)) => changed.notify_one(),
                Ok(WatchEvent::Bookmark(_)) => {}
                Ok(WatchEvent::Error(status)) => {
                    // 410 Gone: the version is older than the API server keeps; list anew.
                    *self.seen() = None;
                    return Err(ResourceApiError::Call(ApiError::Api {
                        what: format!("watching the ResourceSlices of node {}", self.node),
                        source: kube::Error::Api(status),
                    }));
                }
                Err(source) => {
                    return Err(ResourceApiError::Call(ApiError::Api {
                        what: format!("watching the ResourceSlices of node {}", self.node),
                        source,
                    }));
                }
            }
        }
        Ok(())
    }
}

/// Whether a device of `spec` carries a list-type attribute.
fn has_lists(spec: &SliceSpec) -> bool {
    spec.devices.iter().any(|d| {
        d.attributes
            .values()
            .any(super::objects::Attribute::is_list)
    })
}

/// Writes slice `name` in `version`: replaces the one at `resource_version`, or creates it.
/// Returns the spec sent and the spec the API server answered with (what it kept).
async fn write(
    api: &Api<DynamicObject>,
    version: ResourceVersion,
    name: &str,
    spec: &SliceSpec,
    resource_version: Option<String>,
) -> Result<(serde_json::Value, serde_json::Value), ApiError> {
    let what = || format!("writing ResourceSlice {name}");
    let sent = version.slice_to_wire(spec);
    let data = json!({"spec": sent});
    let mut object = DynamicObject::new(name, &version.slices()).data(data);
    let params = PostParams {
        field_manager: Some("gpud".to_owned()),
        ..PostParams::default()
    };
    let answered = match resource_version {
        Some(version) => {
            object.metadata.resource_version = Some(version);
            bounded(what, api.replace(name, &params, &object)).await?
        }
        None => bounded(what, api.create(&params, &object)).await?,
    };
    let kept = answered.data.get("spec").cloned().unwrap_or_default();
    Ok((sent, kept))
}
