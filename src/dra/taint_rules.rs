//! The `DeviceTaintRule`s a cluster admin writes (KEP-5055: `resource.k8s.io/v1` from
//! Kubernetes 1.37, `v1alpha3` before with the alpha API on) that select this node's devices,
//! put into the inventory ([`crate::inventory::device_taints`]) so that `gpud inventory`, the
//! exporter, the node status and the remediation all see them.
//!
//! A rule selects by `spec.deviceSelector` `driver`, `pool` and `device`, each matching
//! anything when absent; gpud's pool is the node's name. The taint itself is applied by the
//! scheduler and the eviction controller, not written into gpud's slices, so gpud never
//! republishes to undo it: its slices stay what the inventory's health makes them.
//!
//! What the rules put on the GPUs is also kept in `<state-dir>/device-taints.json` whenever it
//! changes, where `gpud inventory` reads it.
//!
//! Followed as gpud's other watchers follow objects: a list, then a watch from its
//! resourceVersion (a 410 lists again), with backoff that follows the API server's
//! Retry-After after a failure. A server that serves the kind in neither version is said
//! once in the log and asked again every few minutes, quietly.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use kube::api::{Api, ApiResource, DynamicObject, ListParams, WatchEvent, WatchParams};
use tokio::sync::watch;
use tokio_stream::StreamExt;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::api_version::GROUP;
use crate::backoff::{self, Backoff};
use crate::dra_names;
use crate::inventory::device_taints::RuleTaint;
use crate::inventory::{Inventory, Snapshot};
use crate::kube::{ApiError, bounded};

/// The versions DeviceTaintRules are served in, best first.
pub const VERSIONS: [&str; 2] = ["v1", "v1alpha3"];
const WATCH_SECONDS: u32 = 290;
const RETRY_MAX: Duration = Duration::from_secs(30);
/// How often a server that serves no DeviceTaintRules is asked again.
const ASK_AGAIN: Duration = Duration::from_secs(300);

/// One rule as gpud reads it: what it selects and the taint.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Rule {
    pub driver: Option<String>,
    pub pool: Option<String>,
    pub device: Option<String>,
    pub key: String,
    pub value: Option<String>,
    pub effect: String,
}

impl Rule {
    /// The rule of a `DeviceTaintRule` object; `None` without a taint key.
    pub fn of(object: &serde_json::Value) -> Option<Rule> {
        let spec = &object["spec"];
        let text = |v: &serde_json::Value| v.as_str().map(str::to_owned);
        let selector = &spec["deviceSelector"];
        let taint = &spec["taint"];
        Some(Rule {
            driver: text(&selector["driver"]),
            pool: text(&selector["pool"]),
            device: text(&selector["device"]),
            key: text(&taint["key"]).filter(|k| !k.is_empty())?,
            value: text(&taint["value"]).filter(|v| !v.is_empty()),
            // Consumers treat an unknown (or missing) effect as None.
            effect: text(&taint["effect"]).unwrap_or_else(|| "None".to_owned()),
        })
    }

    fn selects(&self, driver: &str, pool: &str, device: &str) -> bool {
        let fits =
            |wanted: &Option<String>, have: &str| wanted.as_deref().is_none_or(|w| w == have);
        fits(&self.driver, driver) && fits(&self.pool, pool) && fits(&self.device, device)
    }
}

/// Each GPU's taints (by index) from `rules` (by name) on `snapshot`'s devices.
pub fn taints_by_gpu(
    rules: &BTreeMap<String, Rule>,
    driver: &str,
    pool: &str,
    snapshot: &Snapshot,
) -> BTreeMap<u32, Vec<RuleTaint>> {
    let mut out: BTreeMap<u32, Vec<RuleTaint>> = BTreeMap::new();
    for (device, d) in dra_names::devices(snapshot) {
        for (name, rule) in rules {
            if rule.selects(driver, pool, &device) {
                out.entry(d.gpu().index).or_default().push(RuleTaint {
                    rule: name.clone(),
                    device: device.clone(),
                    key: rule.key.clone(),
                    value: rule.value.clone(),
                    effect: rule.effect.clone(),
                });
            }
        }
    }
    for taints in out.values_mut() {
        taints.sort();
    }
    out
}

/// Puts `rules` into the inventory (publishing only when that changes it); each GPU's
/// taints by UUID.
fn apply(
    inventory: &Inventory,
    rules: &BTreeMap<String, Rule>,
    driver: &str,
    pool: &str,
) -> BTreeMap<String, Vec<RuleTaint>> {
    inventory.update(|snapshot| {
        let mut by_gpu = taints_by_gpu(rules, driver, pool, snapshot);
        for gpu in &mut snapshot.gpus {
            gpu.device_taints = by_gpu.remove(&gpu.index).unwrap_or_default();
        }
    });
    inventory
        .current()
        .gpus
        .iter()
        .filter(|g| !g.device_taints.is_empty())
        .map(|g| (g.uuid.clone(), g.device_taints.clone()))
        .collect()
}

/// Keeps the inventory's device taints equal to the rules on the API server, until `cancel`.
pub async fn follow(
    client: kube::Client,
    (driver, pool): (String, String),
    (inventory, state_dir): (Inventory, Option<PathBuf>),
    cancel: CancellationToken,
) {
    let (rules_tx, rules_rx) = watch::channel(Arc::new(BTreeMap::new()));
    let applier = keep_applied(
        rules_rx,
        (inventory, state_dir),
        (driver.clone(), pool.clone()),
        cancel.clone(),
    );
    let watcher = watch_rules(client, &pool, rules_tx, cancel);
    tokio::join!(applier, watcher);
}

/// Applies the rules again after every inventory change (a MIG device made, a rescan), and
/// keeps what they put on the GPUs in `state_dir` for `gpud inventory` (written when it
/// changes; a failed write is logged and tried on the next change).
async fn keep_applied(
    mut rules: watch::Receiver<Arc<BTreeMap<String, Rule>>>,
    (inventory, state_dir): (Inventory, Option<PathBuf>),
    (driver, pool): (String, String),
    cancel: CancellationToken,
) {
    let mut snapshots = inventory.subscribe();
    let mut kept: Option<BTreeMap<String, Vec<RuleTaint>>> = None;
    loop {
        let now = rules.borrow_and_update().clone();
        snapshots.borrow_and_update();
        let by_uuid = apply(&inventory, &now, &driver, &pool);
        if let Some(dir) = &state_dir
            && kept.as_ref() != Some(&by_uuid)
        {
            match save(dir, &by_uuid) {
                Ok(()) => kept = Some(by_uuid),
                Err(error) => {
                    warn!(error = %error, "Cannot keep the admins' device taints for gpud inventory; trying again on the next change");
                }
            }
        }
        tokio::select! {
            () = cancel.cancelled() => return,
            changed = rules.changed() => if changed.is_err() { return },
            changed = snapshots.changed() => if changed.is_err() { return },
        }
    }
}

fn resource(version: &str) -> ApiResource {
    ApiResource {
        group: GROUP.to_owned(),
        version: version.to_owned(),
        api_version: format!("{GROUP}/{version}"),
        kind: "DeviceTaintRule".to_owned(),
        plural: "devicetaintrules".to_owned(),
    }
}

/// Where the watcher is.
enum At {
    /// Nothing listed yet (or a 410): list, trying each version.
    Start,
    /// Listed in `version` at resourceVersion `from`: watch.
    Listed { version: &'static str, from: String },
}

async fn watch_rules(
    client: kube::Client,
    pool: &str,
    rules: watch::Sender<Arc<BTreeMap<String, Rule>>>,
    cancel: CancellationToken,
) {
    let mut backoff = Backoff::capped(backoff::seed_from(pool).rotate_left(13), RETRY_MAX);
    let mut at = At::Start;
    let mut told_unserved = false;
    let mut last_error: Option<String> = None;
    loop {
        let step = async {
            match &at {
                At::Start => list(&client, &rules).await,
                At::Listed { version, from } => watch_once(&client, version, from, &rules)
                    .await
                    .map(|from| Some(At::Listed { version, from })),
            }
        };
        let result = tokio::select! {
            () = cancel.cancelled() => return,
            result = step => result,
        };
        let pause = match result {
            Ok(Some(next)) => {
                if let (At::Start, At::Listed { version, .. }) = (&at, &next) {
                    info!(version = %version, rules = rules.borrow().len(), "Following DeviceTaintRules");
                }
                at = next;
                last_error = None;
                backoff.reset();
                None
            }
            Ok(None) => {
                if !told_unserved {
                    told_unserved = true;
                    warn!(
                        "The API server serves no DeviceTaintRules (resource.k8s.io v1 from Kubernetes 1.37, v1alpha3 before with the alpha API and feature gate DRADeviceTaintRules): an admin's device taints cannot reach gpud's view of its GPUs; asking again every few minutes"
                    );
                }
                Some(ASK_AGAIN)
            }
            Err(err) => {
                if err.status() == Some(410) {
                    at = At::Start;
                }
                let delay = err.paced(backoff.next_delay());
                let text = crate::logging::error_chain(&err);
                if last_error.as_deref() != Some(text.as_str()) {
                    warn!(error = %text, retry_in = ?delay, "Cannot follow DeviceTaintRules; retrying");
                    last_error = Some(text);
                }
                Some(delay)
            }
        };
        if let Some(pause) = pause {
            tokio::select! {
                () = cancel.cancelled() => return,
                () = tokio::time::sleep(pause) => {}
            }
        }
    }
}

/// Lists the rules in the first version served; `Ok(None)` when neither is.
async fn list(
    client: &kube::Client,
    rules: &watch::Sender<Arc<BTreeMap<String, Rule>>>,
) -> Result<Option<At>, ApiError> {
    for version in VERSIONS {
        let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource(version));
        let listed = bounded(
            || format!("listing DeviceTaintRules ({GROUP}/{version})"),
            api.list(&ListParams::default()),
        )
        .await;
        let listed = match listed {
            Ok(listed) => listed,
            Err(err) if err.status() == Some(404) => continue,
            Err(err) => return Err(err),
        };
        let mut now = BTreeMap::new();
        for object in &listed.items {
            if let (Some(name), Some(rule)) = (object.metadata.name.clone(), rule_of(object)) {
                now.insert(name, rule);
            }
        }
        rules.send_replace(Arc::new(now));
        return Ok(Some(At::Listed {
            version,
            from: listed.metadata.resource_version.unwrap_or_default(),
        }));
    }
    Ok(None)
}

fn rule_of(object: &DynamicObject) -> Option<Rule> {
    Rule::of(&serde_json::to_value(object).ok()?)
}

/// Watches from `from` until the watch ends; the last resourceVersion seen.
async fn watch_once(
    client: &kube::Client,
    version: &str,
    from: &str,
    rules: &watch::Sender<Arc<BTreeMap<String, Rule>>>,
) -> Result<String, ApiError> {
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource(version));
    let params = WatchParams::default().timeout(WATCH_SECONDS);
    let what = || format!("watching DeviceTaintRules ({GROUP}/{version})");
    let stream = bounded(what, api.watch(&params, from)).await?;
    let mut stream = std::pin::pin!(stream);
    let mut seen = from.to_owned();
    let limit = Duration::from_secs(u64::from(WATCH_SECONDS) + 30);
    while let Ok(Some(event)) = tokio::time::timeout(limit, stream.next()).await {
        let event = event.map_err(|source| ApiError::Api {
            what: what(),
            source,
        })?;
        let mut changed = |object: &DynamicObject, gone: bool| {
            if let Some(v) = &object.metadata.resource_version {
                seen.clone_from(v);
            }
            let Some(name) = object.metadata.name.clone() else {
                return;
            };
            rules.send_modify(|rules| {
                let rules = Arc::make_mut(rules);
                match rule_of(object).filter(|_| !gone) {
                    Some(rule) => rules.insert(name, rule),
                    None => rules.remove(&name),
                };
            });
        };
        match event {
            WatchEvent::Added(object) | WatchEvent::Modified(object) => changed(&object, false),
            WatchEvent::Deleted(object) => changed(&object, true),
            WatchEvent::Bookmark(mark) => seen = mark.metadata.resource_version,
            WatchEvent::Error(status) => {
                return Err(ApiError::Api {
                    what: what(),
                    source: kube::Error::Api(status),
                });
            }
        }
    }
    Ok(seen)
}

/// The file in the state directory where the DRA plugin keeps them for `gpud inventory`.
pub const FILE: &str = "device-taints.json";
/// The most bytes read back.
const MAX_BYTES: u64 = 1 << 20;

/// Each GPU's taints by UUID, as the DRA plugin last wrote them to `state_dir`: empty when
/// there is no such file or it cannot be read (it is shown, never acted on).
pub fn kept(state_dir: &std::path::Path) -> BTreeMap<String, Vec<RuleTaint>> {
    crate::files::read_bytes(&state_dir.join(FILE), MAX_BYTES)
        .ok()
        .and_then(|bytes| serde_json::from_slice(&bytes).ok())
        .unwrap_or_default()
}

/// Writes each GPU's taints by UUID to `state_dir` (atomically, readable by all).
pub fn save(
    state_dir: &std::path::Path,
    by_uuid: &BTreeMap<String, Vec<RuleTaint>>,
) -> Result<(), String> {
    let bytes = serde_json::to_vec_pretty(by_uuid).map_err(|e| e.to_string())?;
    std::fs::create_dir_all(state_dir)
        .map_err(|e| format!("{}: cannot create the folder: {e}", state_dir.display()))?;
    crate::files::write_atomic(&state_dir.join(FILE), &bytes, 0o644)
        .map_err(|e| crate::logging::error_chain(&e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inventory::test_support::gpu;
    use serde_json::json;

    #[test]
    fn a_rule_selects_by_driver_pool_and_device() {
        let object = json!({"spec": {
            "deviceSelector": {"driver": "gpu.nvidia.com", "pool": "node-a", "device": "gpu-1"},
            "taint": {"key": "example.com/maintenance", "value": "bios", "effect": "NoExecute"}}});
        let rule = Rule::of(&object).unwrap();
        let mut snapshot = Snapshot::default();
        snapshot
            .gpus
            .push(gpu(0, "GPU-a", "NVIDIA H100 80GB HBM3", 81559));
        let mut second = gpu(1, "GPU-b", "NVIDIA H100 80GB HBM3", 81559);
        second.minor_number = Some(1);
        snapshot.gpus.push(second);
        let rules: BTreeMap<String, Rule> = [("maint".to_owned(), rule)].into();
        let got = taints_by_gpu(&rules, "gpu.nvidia.com", "node-a", &snapshot);
        let names: Vec<_> = dra_names::devices(&snapshot).map(|(n, _)| n).collect();
        assert!(names.contains(&"gpu-1".to_owned()), "{names:?}");
        assert_eq!(
            got,
            BTreeMap::from([(
                1,
                vec![RuleTaint {
                    rule: "maint".into(),
                    device: "gpu-1".into(),
                    key: "example.com/maintenance".into(),
                    value: Some("bios".into()),
                    effect: "NoExecute".into(),
                }]
            )])
        );
        // Another node's pool, another driver: nothing here.
        assert!(taints_by_gpu(&rules, "gpu.nvidia.com", "node-b", &snapshot).is_empty());
        assert!(taints_by_gpu(&rules, "other.example.com", "node-a", &snapshot).is_empty());
        // No selector fields: every device.
        let all = Rule::of(&json!({"spec": {"taint": {"key": "k"}}})).unwrap();
        assert_eq!(all.effect, "None");
        let rules: BTreeMap<String, Rule> = [("all".to_owned(), all)].into();
        assert_eq!(
            taints_by_gpu(&rules, "gpu.nvidia.com", "node-a", &snapshot).len(),
            2
        );
        assert_eq!(Rule::of(&json!({"spec": {"taint": {}}})), None);
    }
}
