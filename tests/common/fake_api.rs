//! A fake Kubernetes API server on loopback for the labeller's API sinks and the node status:
//! a Node whose labels and taints merge patches change (refused with 409 when the patch names
//! an older resourceVersion), whose status conditions server-side apply patches change with
//! per-condition field managers, NodeFeature objects with optimistic concurrency, events, and
//! pods, `resource.k8s.io` ResourceSlices (create, replace with optimistic concurrency,
//! delete, list and watch by the `spec.nodeName`/`spec.driver` field selectors, and
//! delete-collection, as the kubelet wipes a node's slices) and ResourceClaims (get), in the
//! versions its discovery document lists (`v1` unless set; objects are kept as written, with
//! no conversion between versions) and 404 in the others; `coordination.k8s.io/v1` Leases
//! (get, list, create, replace with optimistic concurrency, delete; every write logged with
//! its time, [`FakeApi::lease_writes`]); and pod evictions (the pod deleted, 404 for one that
//! is not there; a PodDisruptionBudget's refusal is [`Fault::DisruptionBudget`]). It can
//! fail the next requests with 500, and stop and come back on the same port (an API server
//! restart) with what it held.
//!
//! `GET /version` answers the Kubernetes release set with [`FakeApi::set_server_version`]
//! (v1.36.0 unless set; none: 404). Feature gates turned off with [`FakeApi::disable_gate`]
//! make slice writes lose their fields as a real API server's do, silently:
//! `DRAPartitionableDevices` clears `sharedCounters` and devices' `consumesCounters`,
//! `DRAConsumableCapacity` clears `allowMultipleAllocations` and capacities' `requestPolicy`;
//! before 1.36, and unless alpha gate `DRAListTypeAttributes` is turned on with
//! [`FakeApi::enable_gate`], list-type attribute values (`ints`, …) go and the attribute left
//! without a value is refused with 422.
//! From 1.35 a slice with both `sharedCounters` and devices is refused with 422, as there.
//!
//! It also says no as a real API server does: [`Rule`]s matched by method and path (and
//! optionally the Nth matching request) answer with a [`Fault`] (409, 410 or a watch ERROR
//! event carrying 410, 429 with `Retry-After` in seconds or as an HTTP date, a 429 or 5xx
//! with `Retry-After` and no `retryAfterSeconds` in its body, a 429 or 5xx with neither, 403, 422, a stall,
//! a dropped connection, a 200 whose body never ends), every refusal a real `metav1.Status`
//! body (but the plain-text 429s of priority and fairness and of a proxy). Server-side apply without a field manager is refused
//! with 422, writes to a Node that does not exist with 404, and every request is recorded
//! ([`Recorded`]: method, path with query, field manager, status answered). Given the rules
//! bound to a service account ([`rbac::Rbac`], from rendered manifests), it authorizes as
//! RBAC does and answers 403 to what they do not allow.

// Each test binary that includes this file uses part of it.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path as UrlPath, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::get;
use serde_json::{Value, json};
use tokio::sync::oneshot;

#[path = "fake_claim_status.rs"]
pub mod claim_status;
#[path = "rbac.rs"]
pub mod rbac;
#[path = "rebind.rs"]
mod rebind;
#[path = "fake_taint_rules.rs"]
pub mod taint_rules;

/// What the fake API server saw and holds.
#[derive(Default)]
pub struct ApiState {
    pub node: Value,
    /// (content type, body) of every PATCH.
    pub patches: Vec<(String, Value)>,
    /// Requests to fail with 500 before answering.
    pub fail_next: u32,
    pub requests: u32,
    /// NodeFeature objects by `namespace/name`.
    pub node_features: BTreeMap<String, Value>,
    /// (method, path and query, body) of every NodeFeature write.
    pub writes: Vec<(String, String, Value)>,
    /// Pods by `namespace/name`.
    pub pods: BTreeMap<String, Value>,
    /// Every change of a pod through [`FakeApi::put_pod`] / [`FakeApi::delete_pod`].
    pub pod_changes: Changes,
    /// Pod lists and watches: `(watch, query)` of each.
    pub pod_reads: Vec<(bool, String)>,
    /// Field manager of each Node condition, by condition type.
    pub condition_managers: BTreeMap<String, String>,
    /// (when, field manager, body) of every server-side apply to nodes/status.
    pub status_applies: Vec<(Instant, String, Value)>,
    /// The Node after every write that changed it.
    pub history: Vec<Value>,
    /// Events created, in order.
    pub events: Vec<Value>,
    /// The Node's resourceVersion, bumped by every change.
    pub node_version: u64,
    /// Wakes Node watches on every change.
    pub node_changed: Arc<tokio::sync::Notify>,
    /// Node watches opened.
    pub watches: u32,
    /// Node events sent on watches.
    pub node_events_sent: u32,
    /// Bumped to end every open Node watch, as an API server restarting does.
    pub node_watch_epoch: u64,
    /// ResourceSlices by name.
    pub slices: BTreeMap<String, Value>,
    /// Every change of a ResourceSlice: (resourceVersion, watch event), in order.
    pub slice_events: Vec<(u64, Value)>,
    /// The last resourceVersion given to a ResourceSlice.
    pub slice_version: u64,
    /// Wakes ResourceSlice watches on every change.
    pub slices_changed: Arc<tokio::sync::Notify>,
    /// ResourceSlice watches opened.
    pub slice_watches: u32,
    /// ResourceClaims by `namespace/name`.
    pub claims: BTreeMap<String, Value>,
    /// The `resource.k8s.io` versions served, best first as the API server lists them.
    pub resource_versions: Vec<String>,
    /// `METHOD path` of every `resource.k8s.io` request, discovery included.
    pub resource_requests: Vec<String>,
    /// Every request, in the order they arrived.
    pub log: Vec<Recorded>,
    /// Fault rules, tried in order; the first that fires answers.
    pub rules: Vec<Rule>,
    /// The rules of the account gpud runs as, when requests are authorized.
    pub rbac: Option<rbac::Rbac>,
    /// Leases by `namespace/name`.
    pub leases: BTreeMap<String, Value>,
    /// The last resourceVersion given to a Lease.
    pub lease_version: u64,
    /// Every Lease write taken, in order.
    pub lease_writes: Vec<LeaseWrite>,
    /// `namespace/name` of every pod evicted, in order.
    pub evictions: Vec<String>,
    /// The `gitVersion` `GET /version` answers; `None`: 404.
    pub server_version: Option<String>,
    /// Kubernetes feature gates turned off: slice writes lose their fields.
    pub disabled_gates: std::collections::BTreeSet<String>,
    /// Alpha feature gates turned on (off by default, as in a real cluster):
    /// `DRAListTypeAttributes`.
    pub enabled_gates: std::collections::BTreeSet<String>,
    /// The spec of every slice create and replace, as sent (before the gates cleared it).
    pub slice_writes: Vec<Value>,
    /// The field manager of each claim's `status.devices` entry, by
    /// `namespace/name|driver/pool/device/shareID` ([`claim_status`]).
    pub claim_status_managers: BTreeMap<String, String>,
    /// (field manager, `namespace/name`, body) of every apply to a claim's status.
    pub claim_status_applies: Vec<(String, String, Value)>,
    /// The `resource.k8s.io` version DeviceTaintRules are served in ([`taint_rules`]).
    pub taint_rule_version: Option<String>,
    /// DeviceTaintRules by name.
    pub taint_rules: BTreeMap<String, Value>,
    /// Every change of a DeviceTaintRule.
    pub taint_rule_changes: Changes,
    /// DeviceTaintRule watches opened.
    pub taint_rule_watches: u32,
    /// `GET path` of every DeviceTaintRule request.
    pub taint_rule_requests: Vec<String>,
}

/// One Lease write the fake API server took.
#[derive(Debug, Clone)]
pub struct LeaseWrite {
    /// When it was taken.
    pub at: Instant,
    /// `POST`, `PUT` or `DELETE`.
    pub method: String,
    /// `namespace/name`.
    pub key: String,
    /// The Lease as stored (as it was, for a DELETE).
    pub lease: Value,
}

impl LeaseWrite {
    /// The holder the Lease names after the write (`None` for none, and for a DELETE).
    pub fn holder(&self) -> Option<&str> {
        if self.method == "DELETE" {
            return None;
        }
        self.lease["spec"]["holderIdentity"]
            .as_str()
            .filter(|h| !h.is_empty())
    }
}

/// The changes of one kind of object that watches follow: (resourceVersion, watch event) in
/// order, the last version given, and what wakes the watches.
#[derive(Default)]
pub struct Changes {
    pub events: Vec<(u64, Value)>,
    pub version: u64,
    pub changed: Arc<tokio::sync::Notify>,
}

impl Changes {
    /// Gives `object` the next resourceVersion and records a `kind` event for it.
    fn record(&mut self, kind: &str, object: &mut Value) {
        self.version += 1;
        object["metadata"]["resourceVersion"] = json!(self.version.to_string());
        self.events
            .push((self.version, json!({"type": kind, "object": object})));
        self.changed.notify_waiters();
    }
}

/// One request as the fake API server saw it.
#[derive(Debug, Clone)]
pub struct Recorded {
    /// When it arrived.
    pub at: Instant,
    pub method: String,
    /// Path and query, as sent.
    pub path: String,
    /// The `fieldManager` query parameter, decoded.
    pub field_manager: Option<String>,
    /// The HTTP status answered; 0 while unanswered, and for a dropped connection.
    pub status: u16,
    /// Whether a fault rule answered it.
    pub refused: bool,
    /// What RBAC refused (`patch nodes test-node`), when it did.
    pub forbidden: Option<String>,
}

/// What a fault rule answers instead of the API server's real answer.
#[derive(Debug, Clone, PartialEq)]
pub enum Fault {
    /// 409 Conflict: the object was modified since the client read it.
    Conflict,
    /// 409 AlreadyExists, as a create of an existing name gets.
    AlreadyExists,
    /// HTTP 410 Gone (reason Expired), as a watch or list from a compacted resourceVersion.
    Gone,
    /// 200 and a single watch event of type ERROR carrying a 410 Expired Status, then the end
    /// of the stream: what a real API server sends when a watch's resourceVersion expires.
    GoneEvent,
    /// 429 TooManyRequests with `Retry-After: <seconds>` and `details.retryAfterSeconds`.
    TooManyRequests(u64),
    /// 429 as priority and fairness (or max-in-flight) answers it: `Retry-After: <seconds>`
    /// and a plain-text body, no `Status`.
    TooManyRequestsPlain(u64),
    /// 429 as a proxy in front of the API server may answer it: `Retry-After` as an HTTP date
    /// (RFC 9110) that many seconds from now, and a plain-text body.
    TooManyRequestsDate(u64),
    /// A 429 or 5xx (the code given) with `Retry-After: <seconds>` and a `Status` body that has
    /// no `retryAfterSeconds`, as an aggregated API server or a webhook's failure may answer.
    RetryAfterHeaderOnly(u16, u64),
    /// 429 as an eviction gets while a PodDisruptionBudget allows no disruption: reason
    /// TooManyRequests, message "Cannot evict pod as it would violate the pod's disruption
    /// budget.", `details.causes[0].reason` DisruptionBudget; with `retryAfterSeconds` and
    /// `Retry-After` when over 0 (the API server asks for 10 s while the budget is still
    /// being processed, and for nothing when it allows no disruption).
    DisruptionBudget(u64),
    /// A 429 or 5xx (the code given) with a `Status` body and no `Retry-After` at all: a 500
    /// InternalError, or a 429 that gives no hint when to come back.
    Failure(u16),
    /// 404 NotFound, as for an object that does not exist.
    NotFound,
    /// 403 Forbidden, as RBAC refuses.
    Forbidden,
    /// 422 Invalid.
    Invalid,
    /// No answer for this long, then the real answer (to a client still waiting).
    Stall(Duration),
    /// The connection closes without an answer.
    Drop,
    /// 200, then a body that never ends (the start of a JSON object, then `x` forever), as a
    /// broken proxy or API server may send: until the client hangs up.
    Endless,
}

/// A fault rule: which requests it refuses, and how.
#[derive(Debug, Clone)]
pub struct Rule {
    /// The method (`GET`, `PATCH`, …), or `*` for any.
    pub method: String,
    pub path: String,
    /// Whether `path` is a prefix of the request's path rather than all of it.
    pub prefix: bool,
    /// Text the query must contain (`watch=true`), if any.
    pub query: Option<String>,
    /// Only the Nth matching request (1-based), if set.
    pub nth: Option<u32>,
    /// At most this many refusals, if set.
    pub times: Option<u32>,
    pub fault: Fault,
    /// Matching requests so far.
    pub matched: u32,
    /// Refusals so far.
    pub fired: u32,
}

impl Rule {
    /// Refuses every `method` request to exactly `path` (no query) with `fault`.
    pub fn exact(method: &str, path: &str, fault: Fault) -> Rule {
        Rule {
            method: method.to_owned(),
            path: path.to_owned(),
            prefix: false,
            query: None,
            nth: None,
            times: None,
            fault,
            matched: 0,
            fired: 0,
        }
    }

    /// Refuses every `method` request to a path starting with `path` with `fault`.
    pub fn prefix(method: &str, path: &str, fault: Fault) -> Rule {
        Rule {
            prefix: true,
            ..Rule::exact(method, path, fault)
        }
    }

    /// Only requests whose query contains `text`.
    pub fn query(mut self, text: &str) -> Rule {
        self.query = Some(text.to_owned());
        self
    }

    /// Only the `n`th matching request (1-based).
    pub fn nth(mut self, n: u32) -> Rule {
        self.nth = Some(n);
        self
    }

    /// At most `n` refusals.
    pub fn times(mut self, n: u32) -> Rule {
        self.times = Some(n);
        self
    }

    /// Whether this rule refuses the request, counting it.
    fn fires(&mut self, method: &str, uri: &axum::http::Uri) -> bool {
        let path = uri.path();
        let path_ok = if self.prefix {
            path.starts_with(&self.path)
        } else {
            path == self.path
        };
        let query_ok = self
            .query
            .as_ref()
            .is_none_or(|q| uri.query().unwrap_or_default().contains(q.as_str()));
        if !(path_ok && query_ok && (self.method == "*" || self.method == method)) {
            return false;
        }
        self.matched += 1;
        if self.nth.is_some_and(|n| n != self.matched)
            || self.times.is_some_and(|t| self.fired >= t)
        {
            return false;
        }
        self.fired += 1;
        true
    }
}

impl ApiState {
    /// Records a change of the Node: a new resourceVersion, and watches wake.
    pub fn node_touched(&mut self) {
        self.node_version += 1;
        self.node["metadata"]["resourceVersion"] = json!(self.node_version.to_string());
        self.node_changed.notify_waiters();
    }
}

type Shared = Arc<Mutex<ApiState>>;
type Reply = Result<axum::Json<Value>, (StatusCode, axum::Json<Value>)>;

/// Records a `resource.k8s.io` request; 404 when its version is not served.
fn resource_call(
    state: &mut ApiState,
    method: &axum::http::Method,
    uri: &axum::http::Uri,
    version: &str,
) -> Result<(), (StatusCode, axum::Json<Value>)> {
    state
        .resource_requests
        .push(format!("{method} {}", uri.path()));
    if state.resource_versions.iter().any(|v| v == version) {
        Ok(())
    } else {
        Err(status(StatusCode::NOT_FOUND, "NotFound"))
    }
}

/// `GET /apis/resource.k8s.io`: the group's discovery document, 404 when no version is served.
async fn resource_group(State(s): State<Shared>, uri: axum::http::Uri) -> Reply {
    let mut state = s.lock().unwrap();
    gate_status(&mut state)?;
    state.resource_requests.push(format!("GET {}", uri.path()));
    let versions: Vec<Value> = state
        .resource_versions
        .iter()
        .map(|v| json!({"groupVersion": format!("resource.k8s.io/{v}"), "version": v}))
        .collect();
    let Some(preferred) = versions.first().cloned() else {
        return Err(status(StatusCode::NOT_FOUND, "NotFound"));
    };
    Ok(axum::Json(
        json!({"kind": "APIGroup", "apiVersion": "v1", "name": "resource.k8s.io",
        "versions": versions, "preferredVersion": preferred}),
    ))
}

/// `GET /version`: the release set, as an API server reports it.
async fn server_version(State(s): State<Shared>) -> Reply {
    let mut state = s.lock().unwrap();
    gate_status(&mut state)?;
    let Some(git) = state.server_version.clone() else {
        return Err(status(StatusCode::NOT_FOUND, "NotFound"));
    };
    let mut parts = git.trim_start_matches('v').split('.');
    let (major, minor) = (parts.next().unwrap_or("1"), parts.next().unwrap_or("0"));
    Ok(axum::Json(
        json!({"major": major, "minor": minor, "gitVersion": git,
        "gitCommit": "0000000000000000000000000000000000000000", "gitTreeState": "clean",
        "buildDate": "2026-01-01T00:00:00Z", "goVersion": "go1.25.0", "compiler": "gc",
        "platform": "linux/amd64"}),
    ))
}

/// The minor release `GET /version` answers (36 when none is set).
fn server_minor(state: &ApiState) -> u32 {
    state
        .server_version
        .as_deref()
        .and_then(|v| v.trim_start_matches('v').split('.').nth(1)?.parse().ok())
        .unwrap_or(36)
}

/// What the API server does to a slice before storing it: fields of disabled feature gates
/// cleared; from 1.35, counter sets beside devices refused (422).
fn admit_slice(
    state: &mut ApiState,
    object: &mut Value,
) -> Result<(), (StatusCode, axum::Json<Value>)> {
    state.slice_writes.push(object["spec"].clone());
    let lists_off =
        server_minor(state) < 36 || !state.enabled_gates.contains("DRAListTypeAttributes");
    if lists_off {
        drop_list_attributes(object)?;
    }
    let spec = &mut object["spec"];
    let gate = |name: &str| state.disabled_gates.contains(name);
    let mut devices: Vec<&mut serde_json::Map<String, Value>> = Vec::new();
    let partitionable_off = gate("DRAPartitionableDevices");
    if partitionable_off && let Some(fields) = spec.as_object_mut() {
        fields.remove("sharedCounters");
    }
    let counters = spec["sharedCounters"]
        .as_array()
        .is_some_and(|a| !a.is_empty());
    let has_devices = spec["devices"].as_array().is_some_and(|a| !a.is_empty());
    if counters && has_devices && server_minor(state) >= 35 {
        let mut refused = status(StatusCode::UNPROCESSABLE_ENTITY, "Invalid");
        refused.1.0["message"] = json!(
            "ResourceSlice.resource.k8s.io is invalid: spec.sharedCounters: Invalid value:              sharedCounters cannot be set together with devices"
        );
        return Err(refused);
    }
    for device in spec["devices"].as_array_mut().into_iter().flatten() {
        let Some(fields) = device.as_object_mut() else {
            continue;
        };
        if fields.contains_key("basic") {
            if let Some(basic) = fields.get_mut("basic").and_then(Value::as_object_mut) {
                devices.push(basic);
            }
        } else {
            devices.push(fields);
        }
    }
    for device in devices {
        if partitionable_off {
            device.remove("consumesCounters");
        }
        if gate("DRAConsumableCapacity") {
            device.remove("allowMultipleAllocations");
            for capacity in device
                .get_mut("capacity")
                .and_then(Value::as_object_mut)
                .into_iter()
                .flat_map(|c| c.values_mut())
            {
                if let Some(capacity) = capacity.as_object_mut() {
                    capacity.remove("requestPolicy");
                }
            }
        }
    }
    Ok(())
}

/// What an API server without list-type attributes (before 1.36, or feature gate
/// `DRAListTypeAttributes` off) does to a slice carrying them: the list fields go (unknown,
/// or dropped for the gate), and an attribute left without a value makes the slice invalid
/// (422), as its validation says.
fn drop_list_attributes(object: &mut Value) -> Result<(), (StatusCode, axum::Json<Value>)> {
    let name = object["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let devices = object["spec"]["devices"]
        .as_array_mut()
        .into_iter()
        .flatten();
    for (index, device) in devices.enumerate() {
        let data = if device.get("basic").is_some() {
            &mut device["basic"]
        } else {
            device
        };
        let attributes = data["attributes"].as_object_mut().into_iter().flatten();
        for (key, attribute) in attributes {
            let Some(fields) = attribute.as_object_mut() else {
                continue;
            };
            for list in ["ints", "bools", "strings", "versions"] {
                fields.remove(list);
            }
            if fields.is_empty() {
                let mut refused = status(StatusCode::UNPROCESSABLE_ENTITY, "Invalid");
                refused.1.0["message"] = json!(format!(
                    "ResourceSlice.resource.k8s.io \"{name}\" is invalid: \
                     spec.devices[{index}].attributes[{key}]: Required value: exactly one \
                     value must be specified"
                ));
                return Err(refused);
            }
        }
    }
    Ok(())
}

/// A Kubernetes `Status` error body, which kube needs to tell "not found" from a failure.
fn status(code: StatusCode, reason: &str) -> (StatusCode, axum::Json<Value>) {
    (
        code,
        axum::Json(
            json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                          "reason": reason, "code": code.as_u16(), "message": reason}),
        ),
    )
}

/// A `metav1.Status` failure as the API server sends it, with `details` when given.
fn failure_body(
    code: StatusCode,
    reason: &str,
    message: &str,
    details: Value,
) -> (StatusCode, axum::Json<Value>) {
    let mut body = json!({"kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": "Failure", "message": message, "reason": reason, "code": code.as_u16()});
    if !details.is_null() {
        body["details"] = details;
    }
    (code, axum::Json(body))
}

/// [`failure_body`] as a response.
fn failure(
    code: StatusCode,
    reason: &str,
    message: &str,
    details: Value,
) -> axum::response::Response {
    axum::response::IntoResponse::into_response(failure_body(code, reason, message, details))
}

/// The answer of a fault: a Status as the real API server words it.
fn refusal(fault: &Fault, method: &str, uri: &axum::http::Uri) -> axum::response::Response {
    let request = rbac::Attributes::of(method, uri);
    let (group, resource, name) = request.as_ref().map_or_else(Default::default, |r| {
        (
            r.group.clone(),
            r.resource.clone(),
            r.name.clone().unwrap_or_default(),
        )
    });
    let qualified = qualified(&group, &resource);
    if let Some(answer) = about_object(fault, &group, &resource, &name) {
        return axum::response::IntoResponse::into_response(answer);
    }
    let details = json!({"name": name, "group": group, "kind": resource});
    match fault {
        Fault::Conflict | Fault::AlreadyExists | Fault::NotFound => {
            unreachable!("answered by about_object")
        }
        Fault::DisruptionBudget(seconds) => {
            let mut details = json!({"causes": [{"reason": "DisruptionBudget",
                "message": "The disruption budget gpu-pdb needs 1 healthy pods and has 1 currently"}]});
            if *seconds > 0 {
                details["retryAfterSeconds"] = json!(seconds);
            }
            let mut response = failure(
                StatusCode::TOO_MANY_REQUESTS,
                "TooManyRequests",
                "Cannot evict pod as it would violate the pod's disruption budget.",
                details,
            );
            if *seconds > 0 {
                response.headers_mut().insert(
                    "retry-after",
                    axum::http::HeaderValue::from_str(&seconds.to_string()).unwrap(),
                );
            }
            response
        }
        Fault::Gone => failure(
            StatusCode::GONE,
            "Expired",
            "too old resource version: 1 (1000)",
            Value::Null,
        ),
        Fault::GoneEvent => {
            let event = json!({"type": "ERROR", "object": {"kind": "Status", "apiVersion": "v1",
                "metadata": {}, "status": "Failure", "message": "too old resource version: 1 (1000)",
                "reason": "Expired", "code": 410}});
            axum::response::IntoResponse::into_response(format!("{event}\n"))
        }
        Fault::TooManyRequests(seconds) => {
            let mut response = failure(
                StatusCode::TOO_MANY_REQUESTS,
                "TooManyRequests",
                "Too many requests, please try again later.",
                json!({"retryAfterSeconds": seconds}),
            );
            response.headers_mut().insert(
                "retry-after",
                axum::http::HeaderValue::from_str(&seconds.to_string()).unwrap(),
            );
            response
        }
        Fault::RetryAfterHeaderOnly(code, seconds) => {
            let code = StatusCode::from_u16(*code).unwrap();
            let reason = match code {
                StatusCode::TOO_MANY_REQUESTS => "TooManyRequests",
                StatusCode::SERVICE_UNAVAILABLE => "ServiceUnavailable",
                _ => "InternalError",
            };
            let mut response = failure(code, reason, "please try again later", details);
            response.headers_mut().insert(
                "retry-after",
                axum::http::HeaderValue::from_str(&seconds.to_string()).unwrap(),
            );
            response
        }
        Fault::Failure(code) => {
            let code = StatusCode::from_u16(*code).unwrap();
            let (reason, message) = match code {
                StatusCode::TOO_MANY_REQUESTS => (
                    "TooManyRequests",
                    "Too many requests, please try again later.",
                ),
                StatusCode::SERVICE_UNAVAILABLE => (
                    "ServiceUnavailable",
                    "the server is currently unable to handle the request",
                ),
                _ => (
                    "InternalError",
                    "an error on the server has prevented the request",
                ),
            };
            failure(code, reason, message, details)
        }
        Fault::TooManyRequestsPlain(seconds) => plain_429(&seconds.to_string()),
        Fault::TooManyRequestsDate(seconds) => plain_429(&httpdate::fmt_http_date(
            std::time::SystemTime::now() + Duration::from_secs(*seconds),
        )),
        Fault::Endless => {
            let head =
                Bytes::from_static(br#"{"apiVersion":"v1","kind":"Node","metadata":{"name":""#);
            let chunk = Bytes::from(vec![b'x'; 64 * 1024]);
            let body = std::iter::once(head).chain(std::iter::repeat(chunk));
            // tokio-stream's iterator yields to the runtime every few chunks, so the fake goes
            // on answering other requests while it streams.
            let stream = tokio_stream::iter(body.map(Ok::<_, std::convert::Infallible>));
            let mut response = axum::response::Response::new(axum::body::Body::from_stream(stream));
            response.headers_mut().insert(
                "content-type",
                axum::http::HeaderValue::from_static("application/json"),
            );
            response
        }
        Fault::Forbidden => forbidden_answer(
            &request.expect("a fault rule refusing discovery with 403"),
            "system:serviceaccount:gpu-operator:gpud",
        ),
        Fault::Invalid => failure(
            StatusCode::UNPROCESSABLE_ENTITY,
            "Invalid",
            &format!(
                "{qualified} \"{name}\" is invalid: metadata: Invalid value: \"{name}\": \
                 refused by a fault rule"
            ),
            details,
        ),
        Fault::Stall(_) | Fault::Drop => unreachable!("answered by the middleware"),
    }
}

/// `resource.group` as the API server names a resource in messages (`pods` in the core
/// group).
fn qualified(group: &str, resource: &str) -> String {
    if group.is_empty() {
        resource.to_owned()
    } else {
        format!("{resource}.{group}")
    }
}

/// The 409 or 404 of `fault` about object `name` of `resource` in `group`, in the API
/// server's words; `None` for a fault not about one object.
fn about_object(fault: &Fault, group: &str, resource: &str, name: &str) -> Option<Refused> {
    let qualified = qualified(group, resource);
    let details = json!({"name": name, "group": group, "kind": resource});
    let (code, reason, message) = match fault {
        Fault::Conflict => (
            StatusCode::CONFLICT,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {qualified} \"{name}\": the object has been \
                 modified; please apply your changes to the latest version and try again"
            ),
        ),
        Fault::AlreadyExists => (
            StatusCode::CONFLICT,
            "AlreadyExists",
            format!("{qualified} \"{name}\" already exists"),
        ),
        Fault::NotFound => (
            StatusCode::NOT_FOUND,
            "NotFound",
            format!("{qualified} \"{name}\" not found"),
        ),
        _ => return None,
    };
    Some(failure_body(code, reason, &message, details))
}

/// RBAC's 403 for `request` made as `user`.
fn forbidden_answer(request: &rbac::Attributes, user: &str) -> axum::response::Response {
    let details = json!({"name": request.name.clone().unwrap_or_default(),
                         "group": request.group, "kind": request.resource});
    failure(
        StatusCode::FORBIDDEN,
        "Forbidden",
        &request.forbidden_message(user),
        details,
    )
}

/// A plain-text 429 with `Retry-After: <retry_after>`.
fn plain_429(retry_after: &str) -> axum::response::Response {
    let mut response = axum::response::IntoResponse::into_response((
        StatusCode::TOO_MANY_REQUESTS,
        "Too many requests, please try again later.\n",
    ));
    response.headers_mut().insert(
        "retry-after",
        axum::http::HeaderValue::from_str(retry_after).unwrap(),
    );
    response
}

/// Records every request and answers it from the first fault rule that fires, else from the
/// routes.
#[allow(clippy::disallowed_methods)] // a fake peer, not a gpud subsystem: no span to keep
async fn faults(
    State(s): State<Shared>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let method = request.method().as_str().to_owned();
    let uri = request.uri().clone();
    let (index, fault, forbidden) = {
        let mut state = s.lock().unwrap();
        let fault = state
            .rules
            .iter_mut()
            .find_map(|rule| rule.fires(&method, &uri).then(|| rule.fault.clone()));
        // A fault rule answers first (it stands for something in front of the authorizer).
        let forbidden = match (&fault, &state.rbac) {
            (None, Some(rbac)) => rbac
                .refuses(&method, &uri)
                .map(|request| (request, rbac.user.clone())),
            _ => None,
        };
        state.log.push(Recorded {
            at: Instant::now(),
            method: method.clone(),
            path: uri
                .path_and_query()
                .map_or_else(|| uri.path().to_owned(), ToString::to_string),
            field_manager: query(&uri).get("fieldManager").map(|m| decode(m)),
            status: 0,
            refused: fault.is_some(),
            forbidden: forbidden.as_ref().map(|(request, _)| request.to_string()),
        });
        (state.log.len() - 1, fault, forbidden)
    };
    let response = match (fault, forbidden) {
        (None, Some((denied, user))) => forbidden_answer(&denied, &user),
        (None, None) => next.run(request).await,
        (Some(Fault::Stall(pause)), _) => {
            tokio::time::sleep(pause).await;
            next.run(request).await
        }
        (Some(Fault::Drop), _) => {
            // Unwinding ends this connection's task: the socket closes with no answer.
            // `resume_unwind` skips the panic hook, so nothing is printed; no lock is held.
            std::panic::resume_unwind(Box::new("connection dropped by a fault rule"))
        }
        (Some(fault), _) => refusal(&fault, &method, &uri),
    };
    s.lock().unwrap().log[index].status = response.status().as_u16();
    response
}

/// Applies an RFC 7386 JSON merge patch.
fn merge(target: &mut Value, patch: &Value) {
    match patch {
        Value::Object(fields) => {
            if !target.is_object() {
                *target = json!({});
            }
            let object = target.as_object_mut().unwrap();
            for (key, value) in fields {
                if value.is_null() {
                    object.remove(key);
                } else {
                    merge(object.entry(key.clone()).or_insert(Value::Null), value);
                }
            }
        }
        other => *target = other.clone(),
    }
}

fn gate(state: &mut ApiState) -> Result<(), StatusCode> {
    state.requests += 1;
    if state.fail_next > 0 {
        state.fail_next -= 1;
        return Err(StatusCode::INTERNAL_SERVER_ERROR);
    }
    Ok(())
}

fn gate_status(state: &mut ApiState) -> Result<(), (StatusCode, axum::Json<Value>)> {
    gate(state).map_err(|code| status(code, "InternalError"))
}

/// 404 `nodes "name" not found` unless `name` is the Node served.
fn node_named(state: &ApiState, name: &str) -> Result<(), (StatusCode, axum::Json<Value>)> {
    if state.node["metadata"]["name"] == name {
        return Ok(());
    }
    Err(failure_body(
        StatusCode::NOT_FOUND,
        "NotFound",
        &format!("nodes \"{name}\" not found"),
        json!({"name": name, "kind": "nodes"}),
    ))
}

async fn get_node(State(s): State<Shared>, UrlPath(name): UrlPath<String>) -> Reply {
    let mut state = s.lock().unwrap();
    gate_status(&mut state)?;
    node_named(&state, &name)?;
    Ok(axum::Json(state.node.clone()))
}

async fn patch_node(
    State(s): State<Shared>,
    UrlPath(name): UrlPath<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Reply {
    let mut state = s.lock().unwrap();
    gate_status(&mut state)?;
    node_named(&state, &name)?;
    let patch: Value = serde_json::from_slice(&body).map_err(|_| {
        failure_body(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            "the body is not JSON",
            Value::Null,
        )
    })?;
    let kind = headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    // Optimistic concurrency, as the API server does it for a patch that names a version.
    let wanted_version = &patch["metadata"]["resourceVersion"];
    if !wanted_version.is_null() && *wanted_version != state.node["metadata"]["resourceVersion"] {
        return Err(failure_body(
            StatusCode::CONFLICT,
            "Conflict",
            &format!(
                "Operation cannot be fulfilled on nodes \"{name}\": the object has been \
                 modified; please apply your changes to the latest version and try again"
            ),
            json!({"name": name, "kind": "nodes"}),
        ));
    }
    let mut node = state.node.clone();
    merge(&mut node, &patch);
    state.patches.push((kind, patch));
    store_node(&mut state, node);
    Ok(axum::Json(state.node.clone()))
}

/// `GET /api/v1/nodes?watch=true&fieldSelector=metadata.name=…&resourceVersion=V`: the
/// headers at once (a real API server answers a watch before anything changes), then a
/// `MODIFIED` event with the Node whenever it is newer than the last sent (at once if it
/// already is newer than `V`; changes in between are folded into one), until the watch's
/// timeout or [`FakeApi::end_node_watches`].
#[allow(clippy::disallowed_methods)] // a fake peer, not a gpud subsystem: no span to keep
async fn watch_nodes(
    State(s): State<Shared>,
    uri: axum::http::Uri,
) -> Result<axum::response::Response, StatusCode> {
    let query = query(&uri);
    let (mut sent, timeout) = watch_window(&query);
    let (changed, epoch) = {
        let mut state = s.lock().unwrap();
        gate(&mut state)?;
        if query.get("watch").map(String::as_str) != Some("true") {
            return Err(StatusCode::BAD_REQUEST);
        }
        state.watches += 1;
        (Arc::clone(&state.node_changed), state.node_watch_epoch)
    };
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<String, std::convert::Infallible>>(8);
    tokio::spawn(async move {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(timeout);
        loop {
            let notified = changed.notified();
            let mut notified = std::pin::pin!(notified);
            notified.as_mut().enable();
            let event = {
                let mut state = s.lock().unwrap();
                if state.node_watch_epoch != epoch {
                    return;
                }
                let newer = state.node_version > sent;
                if newer {
                    sent = state.node_version;
                    state.node_events_sent += 1;
                }
                newer.then(|| json!({"type": "MODIFIED", "object": state.node}))
            };
            if let Some(event) = event {
                if tx.send(Ok(format!("{event}\n"))).await.is_err() {
                    return;
                }
                continue;
            }
            tokio::select! {
                () = tx.closed() => return,
                woken = tokio::time::timeout_at(deadline, notified) => if woken.is_err() { return },
            }
        }
    });
    let body = axum::body::Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx));
    Ok(axum::response::Response::new(body))
}

/// A list of the `objects` that `selector` picks, at resourceVersion `version`.
fn list_answer<'a>(
    api_version: &str,
    kind: &str,
    version: u64,
    objects: impl Iterator<Item = &'a Value>,
    selector: Option<&String>,
) -> axum::response::Response {
    let items: Vec<&Value> = objects.filter(|o| selected(o, selector)).collect();
    let list = json!({"apiVersion": api_version, "kind": kind,
        "metadata": {"resourceVersion": version.to_string()}, "items": items});
    axum::response::IntoResponse::into_response(axum::Json(list))
}

/// A watch's `resourceVersion` (0 when absent) and `timeoutSeconds` (290 when absent).
fn watch_window(params: &BTreeMap<String, String>) -> (u64, u64) {
    let number = |key: &str, default: u64| {
        params
            .get(key)
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    (number("resourceVersion", 0), number("timeoutSeconds", 290))
}

/// Decodes `%XX` escapes and `+` of a query value.
fn decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap();
                out.push(u8::from_str_radix(hex, 16).unwrap());
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).unwrap()
}

/// Whether `object` matches a field selector such as `spec.nodeName=n,spec.driver=d`.
fn selected(object: &Value, selector: Option<&String>) -> bool {
    let Some(selector) = selector else {
        return true;
    };
    decode(selector)
        .split(',')
        .filter(|t| !t.is_empty())
        .all(|term| {
            let (path, want) = term.split_once('=').unwrap();
            let mut value = object;
            for part in path.split('.') {
                value = &value[part];
            }
            value.as_str() == Some(want)
        })
}

/// Records a ResourceSlice change: a new resourceVersion on `object`, an event, watches wake.
fn slice_changed(state: &mut ApiState, kind: &str, object: &mut Value) {
    state.slice_version += 1;
    object["metadata"]["resourceVersion"] = json!(state.slice_version.to_string());
    let event = json!({"type": kind, "object": object});
    state.slice_events.push((state.slice_version, event));
    state.slices_changed.notify_waiters();
}

/// `GET …/resourceslices`: a list, or with `watch=true` a stream of events after the given
/// resourceVersion (`0`: every current slice as ADDED first), until its timeout.
async fn list_slices(
    State(s): State<Shared>,
    UrlPath(version): UrlPath<String>,
    method: axum::http::Method,
    uri: axum::http::Uri,
) -> Result<axum::response::Response, (StatusCode, axum::Json<Value>)> {
    let params = query(&uri);
    let selector = params.get("fieldSelector").cloned();
    let mut state = s.lock().unwrap();
    gate_status(&mut state)?;
    resource_call(&mut state, &method, &uri, &version)?;
    if params.get("watch").map(String::as_str) != Some("true") {
        return Ok(list_answer(
            &format!("resource.k8s.io/{version}"),
            "ResourceSliceList",
            state.slice_version,
            state.slices.values(),
            selector.as_ref(),
        ));
    }
    state.slice_watches += 1;
    let (from, timeout) = watch_window(&params);
    let mut initial: Vec<Value> = Vec::new();
    let mut cursor = from;
    if from == 0 {
        initial = state
            .slices
            .values()
            .filter(|o| selected(o, selector.as_ref()))
            .map(|o| json!({"type": "ADDED", "object": o}))
            .collect();
        cursor = state.slice_version;
    }
    drop(state);
    Ok(stream_changes(
        Arc::clone(&s),
        initial,
        cursor,
        selector,
        timeout,
        |state| &state.slice_events,
        |state| Arc::clone(&state.slices_changed),
    ))
}

/// A watch's body: `initial` events, then every change after `cursor` that `selector` picks,
/// as it happens, until `timeout` seconds pass.
#[allow(clippy::disallowed_methods)] // a fake peer, not a gpud subsystem: no span to keep
fn stream_changes(
    shared: Shared,
    initial: Vec<Value>,
    mut cursor: u64,
    selector: Option<String>,
    timeout: u64,
    events: fn(&ApiState) -> &Vec<(u64, Value)>,
    changed: fn(&ApiState) -> Arc<tokio::sync::Notify>,
) -> axum::response::Response {
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<String, std::convert::Infallible>>(64);
    tokio::spawn(async move {
        for event in initial {
            if tx.send(Ok(format!("{event}\n"))).await.is_err() {
                return;
            }
        }
        let deadline = tokio::time::Instant::now() + Duration::from_secs(timeout);
        loop {
            let wake = changed(&shared.lock().unwrap());
            let notified = wake.notified();
            let mut notified = std::pin::pin!(notified);
            notified.as_mut().enable();
            let (new, last) = {
                let state = shared.lock().unwrap();
                let all = events(&state);
                let new: Vec<Value> = all
                    .iter()
                    .filter(|(v, e)| *v > cursor && selected(&e["object"], selector.as_ref()))
                    .map(|(_, e)| e.clone())
                    .collect();
                (new, all.last().map(|(v, _)| *v))
            };
            if let Some(last) = last {
                cursor = cursor.max(last);
            }
            for event in new {
                if tx.send(Ok(format!("{event}\n"))).await.is_err() {
                    return;
                }
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return;
            }
        }
    });
    let body = axum::body::Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx));
    axum::response::Response::new(body)
}

/// `GET /api/v1/pods`: this fake's pods as a list, or with `watch=true` the changes after the
/// given resourceVersion, both filtered by `fieldSelector` (`spec.nodeName=…`).
async fn list_pods(
    State(s): State<Shared>,
    uri: axum::http::Uri,
) -> Result<axum::response::Response, (StatusCode, axum::Json<Value>)> {
    let params = query(&uri);
    let selector = params.get("fieldSelector").cloned();
    let mut state = s.lock().unwrap();
    gate_status(&mut state)?;
    let watch = params.get("watch").map(String::as_str) == Some("true");
    state
        .pod_reads
        .push((watch, uri.query().unwrap_or_default().to_owned()));
    if !watch {
        return Ok(list_answer(
            "v1",
            "PodList",
            state.pod_changes.version,
            state.pods.values(),
            selector.as_ref(),
        ));
    }
    let (from, timeout) = watch_window(&params);
    drop(state);
    Ok(stream_changes(
        Arc::clone(&s),
        Vec::new(),
        from,
        selector,
        timeout,
        |state| &state.pod_changes.events,
        |state| Arc::clone(&state.pod_changes.changed),
    ))
}

async fn create_slice(
    State(s): State<Shared>,
    UrlPath(version): UrlPath<String>,
    method: axum::http::Method,
    uri: axum::http::Uri,
    body: Bytes,
) -> Result<(StatusCode, axum::Json<Value>), (StatusCode, axum::Json<Value>)> {
    let mut state = s.lock().unwrap();
    gate_status(&mut state)?;
    resource_call(&mut state, &method, &uri, &version)?;
    let mut object: Value =
        serde_json::from_slice(&body).map_err(|_| status(StatusCode::BAD_REQUEST, "BadRequest"))?;
    let name = object["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    if state.slices.contains_key(&name) {
        return Err(status(StatusCode::CONFLICT, "AlreadyExists"));
    }
    admit_slice(&mut state, &mut object)?;
    object["metadata"]["uid"] = json!(format!("slice-uid-{name}"));
    slice_changed(&mut state, "ADDED", &mut object);
    state.slices.insert(name, object.clone());
    Ok((StatusCode::CREATED, axum::Json(object)))
}

async fn get_slice(
    State(s): State<Shared>,
    UrlPath((version, name)): UrlPath<(String, String)>,
    method: axum::http::Method,
    uri: axum::http::Uri,
) -> Reply {
    let mut state = s.lock().unwrap();
    gate_status(&mut state)?;
    resource_call(&mut state, &method, &uri, &version)?;
    state
        .slices
        .get(&name)
        .cloned()
        .map(axum::Json)
        .ok_or_else(|| status(StatusCode::NOT_FOUND, "NotFound"))
}

async fn replace_slice(
    State(s): State<Shared>,
    UrlPath((version, name)): UrlPath<(String, String)>,
    method: axum::http::Method,
    uri: axum::http::Uri,
    body: Bytes,
) -> Reply {
    let mut state = s.lock().unwrap();
    gate_status(&mut state)?;
    resource_call(&mut state, &method, &uri, &version)?;
    let mut object: Value =
        serde_json::from_slice(&body).map_err(|_| status(StatusCode::BAD_REQUEST, "BadRequest"))?;
    let Some(old) = state.slices.get(&name) else {
        return Err(status(StatusCode::NOT_FOUND, "NotFound"));
    };
    if object["metadata"]["resourceVersion"] != old["metadata"]["resourceVersion"] {
        return Err(status(StatusCode::CONFLICT, "Conflict"));
    }
    object["metadata"]["uid"] = old["metadata"]["uid"].clone();
    admit_slice(&mut state, &mut object)?;
    slice_changed(&mut state, "MODIFIED", &mut object);
    state.slices.insert(name, object.clone());
    Ok(axum::Json(object))
}

async fn delete_slice(
    State(s): State<Shared>,
    UrlPath((version, name)): UrlPath<(String, String)>,
    method: axum::http::Method,
    uri: axum::http::Uri,
) -> Reply {
    let mut state = s.lock().unwrap();
    gate_status(&mut state)?;
    resource_call(&mut state, &method, &uri, &version)?;
    let Some(mut object) = state.slices.remove(&name) else {
        return Err(status(StatusCode::NOT_FOUND, "NotFound"));
    };
    slice_changed(&mut state, "DELETED", &mut object);
    Ok(axum::Json(object))
}

/// `DELETE …/resourceslices?fieldSelector=…`: what a starting kubelet does to its node's
/// slices.
async fn delete_slices(
    State(s): State<Shared>,
    UrlPath(version): UrlPath<String>,
    method: axum::http::Method,
    uri: axum::http::Uri,
) -> Reply {
    let params = query(&uri);
    let mut state = s.lock().unwrap();
    gate_status(&mut state)?;
    resource_call(&mut state, &method, &uri, &version)?;
    wipe(&mut state, params.get("fieldSelector"));
    Ok(axum::Json(
        json!({"kind": "Status", "apiVersion": "v1", "status": "Success"}),
    ))
}

fn wipe(state: &mut ApiState, selector: Option<&String>) {
    let names: Vec<String> = state
        .slices
        .iter()
        .filter(|(_, o)| selected(o, selector))
        .map(|(n, _)| n.clone())
        .collect();
    for name in names {
        if let Some(mut object) = state.slices.remove(&name) {
            slice_changed(state, "DELETED", &mut object);
        }
    }
}

async fn get_claim(
    State(s): State<Shared>,
    UrlPath((version, ns, name)): UrlPath<(String, String, String)>,
    method: axum::http::Method,
    uri: axum::http::Uri,
) -> Reply {
    let mut state = s.lock().unwrap();
    gate_status(&mut state)?;
    resource_call(&mut state, &method, &uri, &version)?;
    state
        .claims
        .get(&format!("{ns}/{name}"))
        .cloned()
        .map(axum::Json)
        .ok_or_else(|| status(StatusCode::NOT_FOUND, "NotFound"))
}

/// Stores a changed Node with a new resourceVersion, as the API server does on every write.
fn store_node(state: &mut ApiState, node: Value) {
    state.node = node;
    state.node_touched();
    state.history.push(state.node.clone());
}

/// `name=value` pairs of a query string.
fn query(uri: &axum::http::Uri) -> BTreeMap<String, String> {
    uri.query()
        .unwrap_or_default()
        .split('&')
        .filter_map(|pair| pair.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

/// The field manager and query of a server-side apply, checked as the API server checks
/// them: 415 for another content type, 422 without a field manager.
fn apply_options(
    headers: &HeaderMap,
    uri: &axum::http::Uri,
) -> Result<(String, BTreeMap<String, String>), Refused> {
    let kind = headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    if kind != "application/apply-patch+yaml" {
        return Err(status(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "UnsupportedMediaType",
        ));
    }
    let params = query(uri);
    let manager = params
        .get("fieldManager")
        .map(|m| decode(m))
        .unwrap_or_default();
    // The API server's validation of PatchOptions: apply needs a field manager.
    if manager.is_empty() {
        return Err(failure_body(
            StatusCode::UNPROCESSABLE_ENTITY,
            "Invalid",
            "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: is \
             required for apply patch",
            json!({"group": "meta.k8s.io", "kind": "PatchOptions",
                   "causes": [{"reason": "FieldValueRequired",
                               "message": "Required value: is required for apply patch",
                               "field": "fieldManager"}]}),
        ));
    }
    Ok((manager, params))
}

/// Server-side apply to nodes/status, for conditions (a list keyed by type): the applied
/// conditions are set and owned by the field manager, the ones it owned and no longer applies
/// are removed, and a condition owned by another manager is a conflict unless forced.
async fn apply_status(
    State(s): State<Shared>,
    UrlPath(name): UrlPath<String>,
    uri: axum::http::Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Reply {
    let mut state = s.lock().unwrap();
    gate_status(&mut state)?;
    let (manager, params) = apply_options(&headers, &uri)?;
    node_named(&state, &name)?;
    let applied: Value =
        serde_json::from_slice(&body).map_err(|_| status(StatusCode::BAD_REQUEST, "BadRequest"))?;
    let force = params.get("force").is_some_and(|f| f == "true");
    let wanted = applied["status"]["conditions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let mut conditions = state.node["status"]["conditions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    for condition in &wanted {
        let kind = condition["type"].as_str().unwrap_or_default().to_owned();
        if let Some(owner) = state.condition_managers.get(&kind)
            && *owner != manager
            && !force
        {
            return Err(status(StatusCode::CONFLICT, "Conflict"));
        }
    }
    let applied_kinds: Vec<&str> = wanted.iter().filter_map(|c| c["type"].as_str()).collect();
    let managers = state.condition_managers.clone();
    conditions.retain(|c| {
        let kind = c["type"].as_str().unwrap_or_default();
        applied_kinds.contains(&kind) || managers.get(kind) != Some(&manager)
    });
    for condition in &wanted {
        let kind = condition["type"].as_str().unwrap_or_default().to_owned();
        match conditions
            .iter_mut()
            .find(|c| c["type"] == condition["type"])
        {
            Some(existing) => *existing = condition.clone(),
            None => conditions.push(condition.clone()),
        }
        state.condition_managers.insert(kind, manager.clone());
    }
    state
        .condition_managers
        .retain(|kind, owner| *owner != manager || applied_kinds.contains(&kind.as_str()));
    let mut node = state.node.clone();
    node["status"]["conditions"] = Value::Array(conditions);
    state
        .status_applies
        .push((Instant::now(), manager, applied));
    store_node(&mut state, node);
    Ok(axum::Json(state.node.clone()))
}

async fn create_event(
    State(s): State<Shared>,
    UrlPath(ns): UrlPath<String>,
    body: Bytes,
) -> Result<(StatusCode, axum::Json<Value>), (StatusCode, axum::Json<Value>)> {
    let mut state = s.lock().unwrap();
    gate_status(&mut state)?;
    let mut event: Value =
        serde_json::from_slice(&body).map_err(|_| status(StatusCode::BAD_REQUEST, "BadRequest"))?;
    let name = event["metadata"]["name"].clone();
    if state.events.iter().any(|e| e["metadata"]["name"] == name) {
        return Err(status(StatusCode::CONFLICT, "AlreadyExists"));
    }
    event["metadata"]["namespace"] = json!(ns);
    state.events.push(event.clone());
    Ok((StatusCode::CREATED, axum::Json(event)))
}

async fn get_pod(State(s): State<Shared>, UrlPath((ns, name)): UrlPath<(String, String)>) -> Reply {
    let mut state = s.lock().unwrap();
    gate_status(&mut state)?;
    state
        .pods
        .get(&format!("{ns}/{name}"))
        .cloned()
        .map(axum::Json)
        .ok_or_else(|| status(StatusCode::NOT_FOUND, "NotFound"))
}

type Answer = axum::response::Response;
/// An error answer: a `Status` body with its code.
type Refused = (StatusCode, axum::Json<Value>);

/// The API server's answer `code` with `body`.
fn answer(code: StatusCode, body: Value) -> Answer {
    axum::response::IntoResponse::into_response((code, axum::Json(body)))
}

const LEASES: &str = "leases";
const COORDINATION: &str = "coordination.k8s.io";

/// `GET …/namespaces/{ns}/leases`: the namespace's Leases.
async fn list_leases(
    State(s): State<Shared>,
    UrlPath(ns): UrlPath<String>,
) -> Result<Answer, Refused> {
    let state = gated(&s)?;
    let prefix = format!("{ns}/");
    let items = state
        .leases
        .iter()
        .filter(|(key, _)| key.starts_with(&prefix))
        .map(|(_, lease)| lease);
    Ok(list_answer(
        "coordination.k8s.io/v1",
        "LeaseList",
        state.lease_version,
        items,
        None,
    ))
}

async fn get_lease(
    State(s): State<Shared>,
    UrlPath((ns, name)): UrlPath<(String, String)>,
) -> Result<Answer, Refused> {
    let state = gated(&s)?;
    match state.leases.get(&format!("{ns}/{name}")) {
        Some(lease) => Ok(answer(StatusCode::OK, lease.clone())),
        None => Err(lease_refusal(&Fault::NotFound, &name)),
    }
}

/// `POST …/namespaces/{ns}/leases`: 409 AlreadyExists for a name taken.
async fn create_lease(
    State(s): State<Shared>,
    UrlPath(ns): UrlPath<String>,
    body: Bytes,
) -> Result<Answer, Refused> {
    let mut state = gated(&s)?;
    let mut lease = lease_body(&body)?;
    let name = lease["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let key = format!("{ns}/{name}");
    if state.leases.contains_key(&key) {
        return Err(lease_refusal(&Fault::AlreadyExists, &name));
    }
    // What the API server adds on create.
    lease["metadata"]["namespace"] = json!(ns);
    lease["metadata"]["uid"] = json!(format!("lease-uid-{name}"));
    lease["metadata"]["creationTimestamp"] = json!("2025-01-01T00:00:00Z");
    let stored = store_lease(&mut state, "POST", key, lease);
    Ok(answer(StatusCode::CREATED, stored))
}

/// `PUT …/leases/{name}`: 409 Conflict when the body names a resourceVersion that is not the
/// Lease's (none: an unconditional update, as the API server allows for Leases).
async fn replace_lease(
    State(s): State<Shared>,
    UrlPath((ns, name)): UrlPath<(String, String)>,
    body: Bytes,
) -> Result<Answer, Refused> {
    let mut state = gated(&s)?;
    let mut lease = lease_body(&body)?;
    let key = format!("{ns}/{name}");
    let Some(old) = state.leases.get(&key) else {
        return Err(lease_refusal(&Fault::NotFound, &name));
    };
    let wanted = &lease["metadata"]["resourceVersion"];
    if !wanted.is_null() && *wanted != old["metadata"]["resourceVersion"] {
        return Err(lease_refusal(&Fault::Conflict, &name));
    }
    for kept in ["uid", "creationTimestamp", "namespace"] {
        lease["metadata"][kept] = old["metadata"][kept].clone();
    }
    let stored = store_lease(&mut state, "PUT", key, lease);
    Ok(answer(StatusCode::OK, stored))
}

async fn delete_lease(
    State(s): State<Shared>,
    UrlPath((ns, name)): UrlPath<(String, String)>,
) -> Result<Answer, Refused> {
    let mut state = gated(&s)?;
    let key = format!("{ns}/{name}");
    let Some(lease) = state.leases.remove(&key) else {
        return Err(lease_refusal(&Fault::NotFound, &name));
    };
    log_lease_write(&mut state, "DELETE", key, lease.clone());
    Ok(answer(StatusCode::OK, lease))
}

/// The state, once the 500s asked for are answered.
fn gated(s: &Shared) -> Result<std::sync::MutexGuard<'_, ApiState>, Refused> {
    let mut state = s.lock().unwrap();
    gate_status(&mut state)?;
    Ok(state)
}

/// The Lease a write sends.
fn lease_body(body: &[u8]) -> Result<Value, Refused> {
    serde_json::from_slice(body).map_err(|_| status(StatusCode::BAD_REQUEST, "BadRequest"))
}

/// `fault` about Lease `name`, in the API server's words.
fn lease_refusal(fault: &Fault, name: &str) -> Refused {
    about_object(fault, COORDINATION, LEASES, name).unwrap()
}

/// Stores a written Lease with the next resourceVersion, and logs the write.
fn store_lease(state: &mut ApiState, method: &str, key: String, mut lease: Value) -> Value {
    state.lease_version += 1;
    lease["metadata"]["resourceVersion"] = json!(state.lease_version.to_string());
    log_lease_write(state, method, key.clone(), lease.clone());
    state.leases.insert(key, lease.clone());
    lease
}

fn log_lease_write(state: &mut ApiState, method: &str, key: String, lease: Value) {
    state.lease_writes.push(LeaseWrite {
        at: Instant::now(),
        method: method.to_owned(),
        key,
        lease,
    });
}

/// `POST …/pods/{name}/eviction`: the pod deleted (as a watch of pods sees it) and 201, or
/// 404 when there is no such pod. A PodDisruptionBudget's refusal is a fault rule's
/// ([`Fault::DisruptionBudget`]).
async fn evict_pod(
    State(s): State<Shared>,
    UrlPath((ns, name)): UrlPath<(String, String)>,
) -> Result<Answer, Refused> {
    let mut state = gated(&s)?;
    let key = format!("{ns}/{name}");
    let Some(mut pod) = state.pods.remove(&key) else {
        return Err(about_object(&Fault::NotFound, "", "pods", &name).unwrap());
    };
    state.pod_changes.record("DELETED", &mut pod);
    state.evictions.push(key);
    Ok(answer(
        StatusCode::CREATED,
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
               "code": 201}),
    ))
}

async fn get_feature(
    State(s): State<Shared>,
    UrlPath((ns, name)): UrlPath<(String, String)>,
) -> Reply {
    let mut state = s.lock().unwrap();
    gate_status(&mut state)?;
    state
        .node_features
        .get(&format!("{ns}/{name}"))
        .cloned()
        .map(axum::Json)
        .ok_or_else(|| status(StatusCode::NOT_FOUND, "NotFound"))
}

async fn create_feature(
    State(s): State<Shared>,
    UrlPath(ns): UrlPath<String>,
    uri: axum::http::Uri,
    body: Bytes,
) -> Result<(StatusCode, axum::Json<Value>), (StatusCode, axum::Json<Value>)> {
    let mut state = s.lock().unwrap();
    gate_status(&mut state)?;
    let body: Value =
        serde_json::from_slice(&body).map_err(|_| status(StatusCode::BAD_REQUEST, "BadRequest"))?;
    state
        .writes
        .push(("POST".into(), uri.to_string(), body.clone()));
    let key = format!("{ns}/{}", body["metadata"]["name"].as_str().unwrap());
    if state.node_features.contains_key(&key) {
        return Err(status(StatusCode::CONFLICT, "AlreadyExists"));
    }
    // What an API server adds on create.
    let mut stored = body;
    stored["metadata"]["uid"] = json!("nf-uid");
    stored["metadata"]["resourceVersion"] = json!("1");
    stored["metadata"]["creationTimestamp"] = json!("2025-01-01T00:00:00Z");
    state.node_features.insert(key, stored.clone());
    Ok((StatusCode::CREATED, axum::Json(stored)))
}

async fn replace_feature(
    State(s): State<Shared>,
    UrlPath((ns, name)): UrlPath<(String, String)>,
    uri: axum::http::Uri,
    body: Bytes,
) -> Reply {
    let mut state = s.lock().unwrap();
    gate_status(&mut state)?;
    let body: Value =
        serde_json::from_slice(&body).map_err(|_| status(StatusCode::BAD_REQUEST, "BadRequest"))?;
    state
        .writes
        .push(("PUT".into(), uri.to_string(), body.clone()));
    let key = format!("{ns}/{name}");
    let Some(old) = state.node_features.get(&key) else {
        return Err(status(StatusCode::NOT_FOUND, "NotFound"));
    };
    // Optimistic concurrency, as the API server does it.
    let version = old["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_owned();
    if body["metadata"]["resourceVersion"] != json!(version) {
        return Err(status(StatusCode::CONFLICT, "Conflict"));
    }
    let mut stored = body;
    stored["metadata"]["resourceVersion"] =
        json!((version.parse::<u64>().unwrap() + 1).to_string());
    state.node_features.insert(key, stored.clone());
    Ok(axum::Json(stored))
}

/// `namespace/name` of a namespaced object.
fn key_of(object: &Value) -> String {
    let metadata = &object["metadata"];
    format!(
        "{}/{}",
        metadata["namespace"].as_str().unwrap(),
        metadata["name"].as_str().unwrap()
    )
}

/// The serving thread and what stops it.
struct Serving {
    stop: oneshot::Sender<()>,
    thread: JoinHandle<()>,
}

/// A running fake API server; stopped on drop.
pub struct FakeApi {
    pub state: Arc<Mutex<ApiState>>,
    pub port: u16,
    serving: Option<Serving>,
}

impl FakeApi {
    /// Serves a Node `test-node` with `labels` on a fresh loopback port.
    pub fn start(labels: Value) -> FakeApi {
        let state = Arc::new(Mutex::new(ApiState {
            node: json!({"apiVersion": "v1", "kind": "Node",
                         "metadata": {"name": "test-node", "labels": labels,
                                      "resourceVersion": "1"}}),
            node_version: 1,
            resource_versions: vec!["v1".into()],
            server_version: Some("v1.36.0".into()),
            ..ApiState::default()
        }));
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let serving = Some(serve(listener, Arc::clone(&state)));
        FakeApi {
            state,
            port,
            serving,
        }
    }

    /// Stops serving as a crashed API server does: the port refuses, open connections close.
    pub fn stop(&mut self) {
        if let Some(Serving { stop, thread }) = self.serving.take() {
            let _ = stop.send(());
            let _ = thread.join();
        }
    }

    /// Serves again on the same port, with what it held before.
    pub fn restart(&mut self) {
        self.stop();
        let listener = rebind::rebind(self.port);
        self.serving = Some(serve(listener, Arc::clone(&self.state)));
    }

    /// A kubeconfig in `dir` pointing at this server.
    pub fn kubeconfig(&self, dir: &Path) -> PathBuf {
        let path = dir.join("kubeconfig");
        std::fs::write(
            &path,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: http://127.0.0.1:{}\ncontexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake\ncurrent-context: fake\nusers:\n- name: fake\n  user: {{}}\n",
                self.port
            ),
        )
        .unwrap();
        path
    }

    /// Ends every open Node watch, as an API server does when it restarts: watchers watch
    /// again from the last version they saw.
    pub fn end_node_watches(&self) {
        let mut state = self.state.lock().unwrap();
        state.node_watch_epoch += 1;
        state.node_changed.notify_waiters();
    }

    /// Sets (or with `None` removes) a label of the Node, as a cluster admin would.
    pub fn set_label(&self, key: &str, value: Option<&str>) {
        let mut state = self.state.lock().unwrap();
        let labels = &mut state.node["metadata"]["labels"];
        if !labels.is_object() {
            *labels = json!({});
        }
        let labels = labels.as_object_mut().unwrap();
        match value {
            Some(value) => labels.insert(key.to_owned(), json!(value)),
            None => labels.remove(key),
        };
        state.node_touched();
    }

    /// The Node's annotations now.
    pub fn node_annotations(&self) -> BTreeMap<String, String> {
        let node = &self.state.lock().unwrap().node;
        serde_json::from_value(node["metadata"]["annotations"].clone()).unwrap_or_default()
    }

    /// Serves a Node `test-node` as `node` (its name is set here), for tests that need taints,
    /// conditions or a cordon on it.
    pub fn start_with_node(mut node: Value) -> FakeApi {
        let api = FakeApi::start(json!({}));
        node["apiVersion"] = json!("v1");
        node["kind"] = json!("Node");
        node["metadata"]["name"] = json!("test-node");
        node["metadata"]["uid"] = json!("node-uid-1");
        node["metadata"]["resourceVersion"] = json!("1");
        api.state.lock().unwrap().node = node;
        api
    }

    /// The Node now.
    pub fn node(&self) -> Value {
        self.state.lock().unwrap().node.clone()
    }

    /// The Node's condition of type `kind`, if any.
    pub fn condition(&self, kind: &str) -> Option<Value> {
        self.node()["status"]["conditions"]
            .as_array()?
            .iter()
            .find(|c| c["type"] == kind)
            .cloned()
    }

    /// The events created so far.
    pub fn events(&self) -> Vec<Value> {
        self.state.lock().unwrap().events.clone()
    }

    /// The ResourceSlices now, by name.
    pub fn slices(&self) -> BTreeMap<String, Value> {
        self.state.lock().unwrap().slices.clone()
    }

    /// Deletes the slices of node `node`, as a starting kubelet does.
    pub fn wipe_slices(&self, node: &str) {
        let selector = format!("spec.nodeName={node}");
        wipe(&mut self.state.lock().unwrap(), Some(&selector));
    }

    /// Adds or replaces a pod (by namespace and name), as a watch of pods sees it.
    pub fn put_pod(&self, mut pod: Value) {
        let key = key_of(&pod);
        let mut state = self.state.lock().unwrap();
        let kind = if state.pods.contains_key(&key) {
            "MODIFIED"
        } else {
            "ADDED"
        };
        state.pod_changes.record(kind, &mut pod);
        state.pods.insert(key, pod);
    }

    /// Deletes a pod, as a watch of pods sees it.
    pub fn delete_pod(&self, namespace: &str, name: &str) {
        let mut state = self.state.lock().unwrap();
        if let Some(mut pod) = state.pods.remove(&format!("{namespace}/{name}")) {
            state.pod_changes.record("DELETED", &mut pod);
        }
    }

    /// The Leases now, by `namespace/name`.
    pub fn leases(&self) -> BTreeMap<String, Value> {
        self.state.lock().unwrap().leases.clone()
    }

    /// Stores `lease` (its metadata names its namespace and name) with the next
    /// resourceVersion, as another client's write: `kubectl edit`, another holder.
    pub fn put_lease(&self, lease: Value) {
        let key = key_of(&lease);
        store_lease(&mut self.state.lock().unwrap(), "PUT", key, lease);
    }

    /// Every Lease write taken so far, in order.
    pub fn lease_writes(&self) -> Vec<LeaseWrite> {
        self.state.lock().unwrap().lease_writes.clone()
    }

    /// `namespace/name` of every pod evicted so far, in order.
    pub fn evictions(&self) -> Vec<String> {
        self.state.lock().unwrap().evictions.clone()
    }

    /// The pods now, by `namespace/name`.
    pub fn pods(&self) -> BTreeMap<String, Value> {
        self.state.lock().unwrap().pods.clone()
    }

    /// Stores (or replaces) a ResourceClaim; `claim` names its namespace and name.
    pub fn put_claim(&self, claim: Value) {
        let key = key_of(&claim);
        self.state.lock().unwrap().claims.insert(key, claim);
    }

    /// Serves `resource.k8s.io` in `versions` only (best first); none makes the group unknown.
    pub fn set_resource_versions(&self, versions: &[&str]) {
        self.state.lock().unwrap().resource_versions =
            versions.iter().map(|v| (*v).to_owned()).collect();
    }

    /// Answers `GET /version` with `git_version` (`v1.34.2`); `None`: 404.
    pub fn set_server_version(&self, git_version: Option<&str>) {
        self.state.lock().unwrap().server_version = git_version.map(str::to_owned);
    }

    /// Turns Kubernetes feature gate `gate` off: slice writes lose its fields.
    pub fn disable_gate(&self, gate: &str) {
        self.state
            .lock()
            .unwrap()
            .disabled_gates
            .insert(gate.to_owned());
    }

    /// Turns alpha feature gate `gate` on (`DRAListTypeAttributes`: slices keep list-type
    /// attributes, from 1.36).
    pub fn enable_gate(&self, gate: &str) {
        self.state
            .lock()
            .unwrap()
            .enabled_gates
            .insert(gate.to_owned());
    }

    /// The spec of every slice create and replace so far, as sent.
    pub fn slice_writes(&self) -> Vec<Value> {
        self.state.lock().unwrap().slice_writes.clone()
    }

    /// `METHOD path` of the `resource.k8s.io` requests so far.
    pub fn resource_requests(&self) -> Vec<String> {
        self.state.lock().unwrap().resource_requests.clone()
    }

    /// Deletes a ResourceClaim.
    pub fn delete_claim(&self, namespace: &str, name: &str) {
        self.state
            .lock()
            .unwrap()
            .claims
            .remove(&format!("{namespace}/{name}"));
    }

    /// Adds a fault rule (after the ones already there); returns its index.
    pub fn refuse(&self, rule: Rule) -> usize {
        let mut state = self.state.lock().unwrap();
        state.rules.push(rule);
        state.rules.len() - 1
    }

    /// Authorizes every request from now on with `rbac`, as the API server does for the
    /// account it names.
    pub fn authorize(&self, rbac: rbac::Rbac) {
        self.state.lock().unwrap().rbac = Some(rbac);
    }

    /// The requests RBAC refused so far (`patch nodes test-node`), with their paths.
    pub fn forbidden(&self) -> Vec<(String, String)> {
        self.log()
            .into_iter()
            .filter_map(|r| Some((r.forbidden?, format!("{} {}", r.method, r.path))))
            .collect()
    }

    /// Removes every fault rule: the API server answers normally again.
    pub fn allow_all(&self) {
        self.state.lock().unwrap().rules.clear();
    }

    /// How many requests rule `index` refused so far.
    pub fn refused_by(&self, index: usize) -> u32 {
        self.state.lock().unwrap().rules[index].fired
    }

    /// Every request so far.
    pub fn log(&self) -> Vec<Recorded> {
        self.state.lock().unwrap().log.clone()
    }

    /// The requests with `method` (`*`: any) whose path (query included) starts with `path`.
    pub fn requests_to(&self, method: &str, path: &str) -> Vec<Recorded> {
        self.log()
            .into_iter()
            .filter(|r| (method == "*" || r.method == method) && r.path.starts_with(path))
            .collect()
    }

    /// The Node's labels now.
    pub fn node_labels(&self) -> BTreeMap<String, String> {
        serde_json::from_value(self.state.lock().unwrap().node["metadata"]["labels"].clone())
            .unwrap()
    }
}

impl Drop for FakeApi {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Serves the routes on `listener` in a thread of its own until stopped; the thread's runtime
/// goes with it, and every connection with the runtime.
fn serve(listener: std::net::TcpListener, state: Shared) -> Serving {
    listener.set_nonblocking(true).unwrap();
    let features = "/apis/nfd.k8s-sigs.io/v1alpha1/namespaces/{ns}/nodefeatures";
    let app = Router::new()
        .route("/api/v1/nodes", get(watch_nodes))
        .route("/api/v1/nodes/{name}", get(get_node).patch(patch_node))
        .route(
            "/api/v1/nodes/{name}/status",
            axum::routing::patch(apply_status),
        )
        .route(
            "/api/v1/namespaces/{ns}/events",
            axum::routing::post(create_event),
        )
        .route("/api/v1/namespaces/{ns}/pods/{name}", get(get_pod))
        .route(
            "/api/v1/namespaces/{ns}/pods/{name}/eviction",
            axum::routing::post(evict_pod),
        )
        .route(
            "/apis/coordination.k8s.io/v1/namespaces/{ns}/leases",
            get(list_leases).post(create_lease),
        )
        .route(
            "/apis/coordination.k8s.io/v1/namespaces/{ns}/leases/{name}",
            get(get_lease).put(replace_lease).delete(delete_lease),
        )
        .route("/api/v1/pods", get(list_pods))
        .route("/version", get(server_version))
        .route("/apis/resource.k8s.io", get(resource_group))
        .route(
            "/apis/resource.k8s.io/{version}/resourceslices",
            get(list_slices).post(create_slice).delete(delete_slices),
        )
        .route(
            "/apis/resource.k8s.io/{version}/resourceslices/{name}",
            get(get_slice).put(replace_slice).delete(delete_slice),
        )
        .route(
            "/apis/resource.k8s.io/{version}/namespaces/{ns}/resourceclaims/{name}",
            get(get_claim),
        )
        .route(
            "/apis/resource.k8s.io/{version}/namespaces/{ns}/resourceclaims/{name}/status",
            axum::routing::patch(claim_status::apply_claim_status),
        )
        .route(
            "/apis/resource.k8s.io/{version}/devicetaintrules",
            get(taint_rules::list_taint_rules),
        )
        .route(features, axum::routing::post(create_feature))
        .route(
            &format!("{features}/{{name}}"),
            get(get_feature).put(replace_feature),
        )
        .layer(axum::middleware::from_fn_with_state(
            Arc::clone(&state),
            faults,
        ))
        .with_state(state);
    let (stop, stopped) = oneshot::channel::<()>();
    let thread = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            tokio::select! {
                served = axum::serve(listener, app) => served.unwrap(),
                _ = stopped => {}
            }
        });
    });
    Serving { stop, thread }
}
