//! Keeping each prepared claim's `status.devices[]` ([`super::device_status`]) on the API
//! server: server-side apply on the `resourceclaims/status` subresource with the driver's
//! name as field manager (forced: the entries are keyed by this driver, so no other writer
//! should own them), once a claim is prepared, again whenever the inventory's verdict on one
//! of its devices changes, and an apply without entries after it is unprepared (server-side
//! apply removes what the manager owned and no longer applies).
//!
//! The writes never hold up or fail a prepare: they run in their own loop, retried with
//! backoff. A server that has no such field (before 1.32, a 1.32 server without the alpha
//! gate, a stand-in that drops it) answers 404 for the subresource, 405 or 422, or takes the
//! write and drops the entries: gpud notices on the first write, says so once in its log,
//! and writes no device status from then on; nothing else changes.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use kube::api::{Api, DynamicObject, Patch, PatchParams};
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::api_version::{GROUP, ResourceApi, ResourceApiError};
use super::device_status;
use super::health_stream;
use super::prepare::Preparer;
use super::topology;
use crate::backoff::Backoff;
use crate::holdings::Held;
use crate::inventory::{Inventory, Snapshot};
use crate::kube::{ApiError, bounded};
use crate::logging;

/// The longest pause between failed writes.
const RETRY_MAX: std::time::Duration = std::time::Duration::from_secs(30);

/// What became of one write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Written {
    /// The server holds the entries.
    Applied,
    /// The claim is gone: nothing to say of it any more.
    ClaimGone,
    /// The server has no device status; why, in words.
    NotServed(String),
}

/// Writes the device status of claims for one driver.
#[derive(Debug)]
pub struct StatusWriter {
    api: Arc<ResourceApi>,
    driver: String,
    /// Set once a write showed the server has no device status.
    off: AtomicBool,
}

impl StatusWriter {
    pub fn new(api: Arc<ResourceApi>, driver: &str) -> StatusWriter {
        StatusWriter {
            api,
            driver: driver.to_owned(),
            off: AtomicBool::new(false),
        }
    }

    /// Whether the server was found to have no device status.
    pub fn is_off(&self) -> bool {
        self.off.load(Ordering::Relaxed)
    }

    /// Applies `entries` as this driver's part of claim `namespace/name`'s `status.devices`
    /// (none: removes what it wrote before).
    pub async fn apply(
        &self,
        namespace: &str,
        name: &str,
        entries: &[Value],
    ) -> Result<Written, ResourceApiError> {
        let version = self.api.version().await?;
        let api: Api<DynamicObject> =
            Api::namespaced_with(self.api.client(), namespace, &version.claims());
        let mut body = json!({
            "apiVersion": format!("{GROUP}/{}", version.name()),
            "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": namespace},
        });
        if !entries.is_empty() {
            body["status"] = json!({"devices": entries});
        }
        let params = PatchParams::apply(&self.driver).force();
        let answer = bounded(
            || format!("writing the device status of ResourceClaim {namespace}/{name}"),
            api.patch_status(name, &params, &Patch::Apply(&body)),
        )
        .await;
        let written = match answer {
            Ok(object) if entries.is_empty() || self.kept(&object.data) => Written::Applied,
            Ok(_) => Written::NotServed(
                "the API server took the write and dropped status.devices (feature gate \
                 DRAResourceClaimDeviceStatus off)"
                    .to_owned(),
            ),
            Err(err) => match not_served(&err) {
                Some(why) => Written::NotServed(why),
                None if err.status() == Some(404) => Written::ClaimGone,
                None => return Err(err.into()),
            },
        };
        if let Written::NotServed(why) = &written
            && !self.off.swap(true, Ordering::Relaxed)
        {
            warn!(reason = %why, "The API server keeps no device status in ResourceClaims (KEP-4817; Kubernetes 1.33+ with feature gate DRAResourceClaimDeviceStatus, always on from 1.37): gpud writes none; claims are prepared as before");
        }
        Ok(written)
    }

    /// Whether the answer holds an entry of this driver.
    fn kept(&self, object: &Value) -> bool {
        object["status"]["devices"]
            .as_array()
            .is_some_and(|d| d.iter().any(|e| e["driver"] == self.driver.as_str()))
    }
}

/// Why an error says the server has no device status; `None` for any other error (a claim
/// that does not exist answers 404 too, naming it).
fn not_served(err: &ApiError) -> Option<String> {
    let ApiError::Api {
        source: kube::Error::Api(status),
        ..
    } = err
    else {
        return None;
    };
    let no_subresource = status.code == 404
        && status
            .message
            .contains("could not find the requested resource");
    (no_subresource || status.code == 405 || status.code == 422).then(|| {
        format!(
            "the status subresource answered {} {}: {}",
            status.code, status.reason, status.message
        )
    })
}

/// One claim's entries as last written.
struct Claimed {
    namespace: String,
    name: String,
    entries: Vec<Value>,
}

/// Writes every prepared claim's device status, after every prepare and unprepare (`held`
/// changes with each) and every inventory change, until `cancel`; idle once the server
/// shows it has none.
pub async fn keep(
    writer: Arc<StatusWriter>,
    preparer: Arc<Preparer>,
    (inventory, mut held): (Inventory, watch::Receiver<Held>),
    sysfs_root: PathBuf,
    seed: u64,
    cancel: CancellationToken,
) {
    let mut snapshots = inventory.subscribe();
    let mut written: BTreeMap<String, Claimed> = BTreeMap::new();
    // When each claim was first seen prepared: its `Ready` transition.
    let mut prepared_at: BTreeMap<String, String> = BTreeMap::new();
    let mut backoff = Backoff::capped(seed, RETRY_MAX);
    let mut last_error: Option<String> = None;
    loop {
        let snapshot = snapshots.borrow_and_update().clone();
        held.borrow_and_update();
        let failed = match sync(
            &writer,
            &preparer,
            &snapshot,
            &sysfs_root,
            (&mut written, &mut prepared_at),
        )
        .await
        {
            Ok(()) => {
                if last_error.take().is_some() {
                    info!("Device status written to the claims again");
                }
                backoff.reset();
                false
            }
            Err(err) => {
                let text = logging::error_chain(&err);
                if last_error.as_deref() != Some(text.as_str()) {
                    warn!(error = %text, "Cannot write the device status of a prepared claim; retrying with backoff");
                    last_error = Some(text);
                }
                true
            }
        };
        if writer.is_off() {
            // A helper that ends marks the plugin failed: this one has nothing left to do.
            cancel.cancelled().await;
            return;
        }
        let pause = async {
            if failed {
                tokio::time::sleep(backoff.next_delay()).await;
            } else {
                std::future::pending::<()>().await;
            }
        };
        tokio::select! {
            () = cancel.cancelled() => return,
            changed = snapshots.changed() => if changed.is_err() { return },
            changed = held.changed() => if changed.is_err() { return },
            () = pause => {}
        }
    }
}

/// One pass: the entries of every prepared claim that differ from what was written, and an
/// empty apply for every claim written and no longer prepared.
async fn sync(
    writer: &StatusWriter,
    preparer: &Preparer,
    snapshot: &Snapshot,
    sysfs_root: &std::path::Path,
    (written, prepared_at): (
        &mut BTreeMap<String, Claimed>,
        &mut BTreeMap<String, String>,
    ),
) -> Result<(), ResourceApiError> {
    let claims = preparer.prepared_claims().await;
    let health = health_stream::states(snapshot);
    let topology = topology::read(sysfs_root, snapshot);
    prepared_at.retain(|uid, _| claims.contains_key(uid));
    let mut first_error = None;
    for (uid, claim) in &claims {
        if claim.devices.is_empty() {
            continue;
        }
        let since = prepared_at.entry(uid.clone()).or_insert_with(|| {
            humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string()
        });
        let entries =
            device_status::entries(&writer.driver, claim, snapshot, (&health, &topology), since);
        if written.get(uid).is_some_and(|w| w.entries == entries) {
            continue;
        }
        match writer.apply(&claim.namespace, &claim.name, &entries).await {
            Ok(Written::NotServed(_)) => return Ok(()),
            Ok(Written::Applied | Written::ClaimGone) => {
                written.insert(
                    uid.clone(),
                    Claimed {
                        namespace: claim.namespace.clone(),
                        name: claim.name.clone(),
                        entries,
                    },
                );
            }
            Err(err) => {
                first_error.get_or_insert(err);
            }
        }
    }
    let gone: Vec<String> = written
        .keys()
        .filter(|uid| !claims.contains_key(*uid))
        .cloned()
        .collect();
    for uid in gone {
        let Some(claim) = written.get(&uid) else {
            continue;
        };
        match writer.apply(&claim.namespace, &claim.name, &[]).await {
            Ok(Written::NotServed(_)) => return Ok(()),
            Ok(Written::Applied | Written::ClaimGone) => {
                written.remove(&uid);
            }
            Err(err) => {
                first_error.get_or_insert(err);
            }
        }
    }
    first_error.map_or(Ok(()), Err)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api_error(code: u16, reason: &str, message: &str) -> ApiError {
        ApiError::Api {
            what: "writing".into(),
            source: kube::Error::Api(
                kube::core::Status::failure(message, reason)
                    .with_code(code)
                    .boxed(),
            ),
        }
    }

    #[test]
    fn a_missing_subresource_is_told_from_a_missing_claim() {
        let page = api_error(
            404,
            "NotFound",
            "the server could not find the requested resource",
        );
        assert!(not_served(&page).is_some());
        let claim = api_error(
            404,
            "NotFound",
            "resourceclaims.resource.k8s.io \"c1\" not found",
        );
        assert_eq!(not_served(&claim), None);
        assert!(not_served(&api_error(422, "Invalid", "status.devices: Forbidden")).is_some());
        assert_eq!(not_served(&api_error(500, "InternalError", "boom")), None);
    }
}
