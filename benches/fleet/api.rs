//! The fleet's API server stand-in: one process-local HTTP server holding many Nodes and
//! everything gpud writes about them, fast enough that hundreds of gpud processes measure
//! themselves and not it.
//!
//! Each node's gpud gets a kubeconfig whose server URL ends in `/n/<node>` (kube-rs keeps a
//! base path), so every request is counted against the node that made it, discovery included.
//! It serves what `gpud run` asks for with the labeller's Node sink, node status, the DRA
//! plugin and the MIG reconciler on:
//!
//! - discovery of `resource.k8s.io` (`v1`);
//! - Nodes: get, JSON merge patch (labels, annotations, taints; a `resourceVersion` in the
//!   patch is checked, 409 when stale), server-side apply of status conditions, and watches
//!   by `metadata.name` field selector from a resourceVersion, with bookmarks when asked for
//!   and 410 Gone when the version is older than what the node's event log still holds;
//! - events: create (409 for a name already created);
//! - ResourceSlices: create, replace (409 on a stale `resourceVersion`), delete, get, list and
//!   watch by `spec.nodeName` field selector;
//! - ResourceClaims: get (404: the fleet has no claims);
//! - anything else under `/apis/…/namespaces/…` (Leases, NodeFeatures): a generic store with
//!   create, get, replace and delete.
//!
//! Every request is counted by verb, resource and node with the bytes both ways ([`Counts`]),
//! and per second of the run. [`FleetApi::stop`] takes it down as a crash does (the port
//! refuses, open connections and watches close) and [`FleetApi::start_again`] brings it back on
//! the same port with everything it held. An optional server-wide rate ([`FleetApi::limit`])
//! answers 429 with `Retry-After`, as API priority and fairness does under load.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::Response;
use serde_json::{Value, json};
use tokio::sync::{Notify, oneshot};

use super::counts::{Counts, Verb};
use super::rebind;

/// Node watch events and slice events kept per node; a watch from a version older than the
/// oldest kept is answered 410 Gone, as an API server's watch cache does.
const EVENT_LOG: usize = 32;
/// How often an open watch that asked for bookmarks gets one.
const BOOKMARK_EVERY: Duration = Duration::from_secs(60);

/// Everything the stand-in holds.
#[derive(Default)]
struct Store {
    /// The last resourceVersion given to anything.
    version: u64,
    nodes: HashMap<String, NodeEntry>,
    /// ResourceSlices by name.
    slices: BTreeMap<String, Value>,
    /// Slice events per node (`spec.nodeName`).
    slice_logs: HashMap<String, Log>,
    /// Event names created.
    events: std::collections::HashSet<String>,
    /// Any other object, by its path.
    objects: HashMap<String, Value>,
    /// Requests left in this second under the server-wide limit, and which second.
    budget: Option<(u64, u32)>,
    /// Writes taken that changed nothing (a patch, apply or replace of what was there).
    unchanged_writes: u64,
}

/// One Node and its event log.
struct NodeEntry {
    object: Value,
    log: Log,
}

/// Watch events of one node (its Node, or its slices), oldest first.
#[derive(Default)]
struct Log {
    events: VecDeque<(u64, Value)>,
    /// Events below this version were dropped from the log.
    compacted: u64,
    wake: Arc<Notify>,
}

impl Log {
    fn push(&mut self, version: u64, event: Value) {
        if self.events.len() == EVENT_LOG
            && let Some((dropped, _)) = self.events.pop_front()
        {
            self.compacted = dropped;
        }
        self.events.push_back((version, event));
        self.wake.notify_waiters();
    }

    fn after(&self, version: u64) -> Vec<(u64, Value)> {
        self.events
            .iter()
            .filter(|(v, _)| *v > version)
            .cloned()
            .collect()
    }
}

/// Shared between the handlers and the harness.
pub struct Shared {
    store: Mutex<Store>,
    pub counts: Counts,
    /// Server-wide requests per second before 429s; 0: no limit.
    limit: AtomicU64,
}

type Answer = (StatusCode, Value);

fn refusal(code: StatusCode, reason: &str, message: &str) -> Answer {
    (
        code,
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
               "reason": reason, "message": message, "code": code.as_u16()}),
    )
}

fn not_found(what: &str) -> Answer {
    refusal(
        StatusCode::NOT_FOUND,
        "NotFound",
        &format!("{what} not found"),
    )
}

/// The serving thread of one up period.
struct Serving {
    stop: oneshot::Sender<()>,
    thread: std::thread::JoinHandle<()>,
}

/// The running stand-in.
pub struct FleetApi {
    pub shared: Arc<Shared>,
    pub port: u16,
    serving: Option<Serving>,
}

impl FleetApi {
    /// Serves on a fresh loopback port, holding `nodes` (Nodes with no labels yet).
    pub fn start(nodes: &[String]) -> FleetApi {
        let mut store = Store::default();
        for name in nodes {
            store.version += 1;
            let object = json!({"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": name, "uid": format!("uid-{name}"),
                             "resourceVersion": store.version.to_string(),
                             "labels": {"kubernetes.io/hostname": name}},
                "spec": {}, "status": {"conditions": []}});
            store.nodes.insert(
                name.clone(),
                NodeEntry {
                    object,
                    log: Log::default(),
                },
            );
        }
        let shared = Arc::new(Shared {
            store: Mutex::new(store),
            counts: Counts::new(nodes),
            limit: AtomicU64::new(0),
        });
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("binding the stand-in");
        let port = listener.local_addr().expect("its address").port();
        let serving = Some(serve(listener, Arc::clone(&shared)));
        FleetApi {
            shared,
            port,
            serving,
        }
    }

    /// The kubeconfig text for `node`: the server URL carries the node's name as a base path.
    pub fn kubeconfig(&self, node: &str) -> String {
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fleet\n  cluster:\n    server: \
             http://127.0.0.1:{}/n/{node}\ncontexts:\n- name: fleet\n  context:\n    cluster: \
             fleet\n    user: fleet\ncurrent-context: fleet\nusers:\n- name: fleet\n  user: {{}}\n",
            self.port
        )
    }

    /// Down as a crashed API server: the port refuses and every open connection closes.
    pub fn stop(&mut self) {
        if let Some(Serving { stop, thread }) = self.serving.take() {
            let _ = stop.send(());
            let _ = thread.join();
        }
    }

    /// Up again on the same port, with what it held.
    pub fn start_again(&mut self) {
        self.stop();
        let listener = rebind::rebind(self.port);
        self.serving = Some(serve(listener, Arc::clone(&self.shared)));
    }

    /// Answers 429 (`Retry-After: 1`) past `per_second` requests in a second; 0 lifts it.
    pub fn limit(&self, per_second: u64) {
        self.shared.limit.store(per_second, Ordering::Relaxed);
    }

    /// The status of condition `kind` on `node`'s Node.
    pub fn condition(&self, node: &str, kind: &str) -> Option<String> {
        self.condition_field(node, kind, "status")
    }

    /// The message of condition `kind` on `node`'s Node.
    pub fn condition_message(&self, node: &str, kind: &str) -> Option<String> {
        self.condition_field(node, kind, "message")
    }

    fn condition_field(&self, node: &str, kind: &str, field: &str) -> Option<String> {
        let store = self.shared.store.lock().expect("store");
        let node = store.nodes.get(node)?;
        node.object["status"]["conditions"]
            .as_array()?
            .iter()
            .find(|c| c["type"] == kind)
            .and_then(|c| c[field].as_str().map(str::to_owned))
    }

    /// A label of `node`'s Node.
    pub fn label(&self, node: &str, key: &str) -> Option<String> {
        let store = self.shared.store.lock().expect("store");
        store.nodes.get(node)?.object["metadata"]["labels"][key]
            .as_str()
            .map(str::to_owned)
    }

    /// Writes taken so far that changed nothing: repeats of what the object held.
    pub fn unchanged_writes(&self) -> u64 {
        self.shared.store.lock().expect("store").unchanged_writes
    }

    /// How many ResourceSlices `node` has.
    pub fn slices_of(&self, node: &str) -> usize {
        let store = self.shared.store.lock().expect("store");
        store
            .slices
            .values()
            .filter(|s| s["spec"]["nodeName"] == node)
            .count()
    }
}

impl Drop for FleetApi {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Serves on `listener` in a thread with its own runtime; stopping drops the runtime and with
/// it every connection.
fn serve(listener: std::net::TcpListener, shared: Arc<Shared>) -> Serving {
    listener.set_nonblocking(true).expect("nonblocking");
    let app = axum::Router::new()
        .fallback(handle)
        .with_state(Arc::clone(&shared));
    let (stop, stopped) = oneshot::channel::<()>();
    let thread = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).expect("listener");
            tokio::select! {
                served = axum::serve(listener, app) => { let _ = served; }
                _ = stopped => {}
            }
        });
        rt.shutdown_background();
    });
    Serving { stop, thread }
}

/// The query's parameters, `%`-decoded.
fn params(query: Option<&str>) -> HashMap<String, String> {
    query
        .unwrap_or_default()
        .split('&')
        .filter_map(|pair| pair.split_once('='))
        .map(|(k, v)| (k.to_owned(), decode(v)))
        .collect()
}

fn decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("3f");
                out.push(u8::from_str_radix(hex, 16).unwrap_or(b'?'));
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
    String::from_utf8_lossy(&out).into_owned()
}

/// The value of `key` in a field selector such as `spec.nodeName=n,spec.driver=d`.
fn selector_value<'a>(selector: Option<&'a String>, key: &str) -> Option<&'a str> {
    selector?
        .split(',')
        .filter_map(|term| term.split_once('='))
        .find(|(k, _)| *k == key)
        .map(|(_, v)| v)
}

/// What one request is, for counting and dispatch.
struct Call<'a> {
    node: &'a str,
    /// The path after `/n/<node>`, split.
    parts: Vec<&'a str>,
    params: HashMap<String, String>,
}

async fn handle(State(shared): State<Arc<Shared>>, request: Request) -> Response {
    let (head, body) = request.into_parts();
    let body = axum::body::to_bytes(body, 4 << 20)
        .await
        .unwrap_or_default();
    let path = head.uri.path().to_owned();
    let Some(rest) = path.strip_prefix("/n/") else {
        return reply(
            &shared,
            "",
            Verb::Other,
            "unknown",
            body.len(),
            not_found("path"),
        );
    };
    let (node, rest) = rest.split_once('/').unwrap_or((rest, ""));
    let call = Call {
        node,
        parts: rest.split('/').filter(|p| !p.is_empty()).collect(),
        params: params(head.uri.query()),
    };
    let resource = resource_of(&call.parts);
    let verb = verb_of(&head.method, &head.headers, &call);
    if verb == Verb::List && !call.params.contains_key("resourceVersion") {
        shared.counts.list_without_version(node);
    }
    if let Some(answer) = over_limit(&shared) {
        return reply(&shared, node, verb, resource, body.len(), answer);
    }
    if verb == Verb::Watch {
        return watch(&shared, &call, resource, body.len());
    }
    let answer = {
        let mut store = shared.store.lock().expect("store");
        dispatch(&mut store, &head.method, &call, &body)
    };
    reply(&shared, node, verb, resource, body.len(), answer)
}

/// A 429 past the server-wide rate, counted.
fn over_limit(shared: &Shared) -> Option<Answer> {
    let limit = shared.limit.load(Ordering::Relaxed);
    if limit == 0 {
        return None;
    }
    let second = shared.counts.second();
    let mut store = shared.store.lock().expect("store");
    let left = match store.budget {
        Some((at, left)) if at == second => left,
        _ => u32::try_from(limit).unwrap_or(u32::MAX),
    };
    if left == 0 {
        return Some(refusal(
            StatusCode::TOO_MANY_REQUESTS,
            "TooManyRequests",
            "Too many requests, please try again later.",
        ));
    }
    store.budget = Some((second, left - 1));
    None
}

fn reply(
    shared: &Shared,
    node: &str,
    verb: Verb,
    resource: &'static str,
    bytes_in: usize,
    (code, body): Answer,
) -> Response {
    let text = body.to_string();
    shared
        .counts
        .record(node, verb, resource, code.as_u16(), bytes_in + text.len());
    let mut response = Response::new(Body::from(text));
    *response.status_mut() = code;
    let headers = response.headers_mut();
    headers.insert(
        "content-type",
        axum::http::HeaderValue::from_static("application/json"),
    );
    if code == StatusCode::TOO_MANY_REQUESTS {
        headers.insert("retry-after", axum::http::HeaderValue::from_static("1"));
    }
    response
}

/// The resource a path names, as the tables print it.
fn resource_of(parts: &[&str]) -> &'static str {
    match parts {
        ["api", "v1", "nodes", _, "status"] => "nodes/status",
        ["api", "v1", "nodes", ..] => "nodes",
        ["api", "v1", "namespaces", _, "events", ..] => "events",
        ["apis", "resource.k8s.io"] => "discovery",
        ["apis", "resource.k8s.io", _, "resourceslices", ..] => "resourceslices",
        [
            "apis",
            "resource.k8s.io",
            _,
            "namespaces",
            _,
            "resourceclaims",
            ..,
        ] => "resourceclaims",
        ["apis", "coordination.k8s.io", ..] => "leases",
        ["apis", "nfd.k8s-sigs.io", ..] => "nodefeatures",
        ["api", "v1", "namespaces", _, "pods", ..] | ["api", "v1", "pods"] => "pods",
        _ => "other",
    }
}

fn verb_of(method: &Method, headers: &HeaderMap, call: &Call<'_>) -> Verb {
    let named = match call.parts.as_slice() {
        ["api", "v1", "nodes"] | ["apis", _, _, "resourceslices"] => false,
        ["apis", "resource.k8s.io"] => true,
        [.., "namespaces", _, _] => false,
        _ => true,
    };
    match *method {
        Method::GET
            if call
                .params
                .get("watch")
                .is_some_and(|w| w == "true" || w == "1") =>
        {
            Verb::Watch
        }
        Method::GET if named => Verb::Get,
        Method::GET => Verb::List,
        Method::POST => Verb::Create,
        Method::PUT => Verb::Update,
        Method::DELETE => Verb::Delete,
        Method::PATCH
            if headers
                .get("content-type")
                .is_some_and(|t| t.as_bytes().starts_with(b"application/apply-patch")) =>
        {
            Verb::Apply
        }
        Method::PATCH => Verb::Patch,
        _ => Verb::Other,
    }
}

fn dispatch(store: &mut Store, method: &Method, call: &Call<'_>, body: &Bytes) -> Answer {
    let parsed = || serde_json::from_slice::<Value>(body).unwrap_or(Value::Null);
    match (method, call.parts.as_slice()) {
        (&Method::GET, ["apis", "resource.k8s.io"]) => (
            StatusCode::OK,
            json!({"kind": "APIGroup", "apiVersion": "v1", "name": "resource.k8s.io",
                "versions": [{"groupVersion": "resource.k8s.io/v1", "version": "v1"}],
                "preferredVersion": {"groupVersion": "resource.k8s.io/v1", "version": "v1"}}),
        ),
        (&Method::GET, ["api", "v1", "nodes", name]) => match store.nodes.get(*name) {
            Some(node) => (StatusCode::OK, node.object.clone()),
            None => not_found("node"),
        },
        (&Method::PATCH, ["api", "v1", "nodes", name]) => patch_node(store, name, &parsed()),
        (&Method::PATCH, ["api", "v1", "nodes", name, "status"]) => {
            apply_conditions(store, name, &parsed())
        }
        (&Method::POST, ["api", "v1", "namespaces", _, "events"]) => {
            let event = parsed();
            let name = event["metadata"]["name"].as_str().unwrap_or_default();
            if !store.events.insert(name.to_owned()) {
                return refusal(StatusCode::CONFLICT, "AlreadyExists", "event exists");
            }
            (StatusCode::CREATED, event)
        }
        (&Method::GET, ["apis", "resource.k8s.io", _, "resourceslices"]) => {
            let node = selector_value(call.params.get("fieldSelector"), "spec.nodeName");
            let items: Vec<&Value> = store
                .slices
                .values()
                .filter(|s| node.is_none_or(|n| s["spec"]["nodeName"] == n))
                .collect();
            (
                StatusCode::OK,
                json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSliceList",
                       "metadata": {"resourceVersion": store.version.to_string()},
                       "items": items}),
            )
        }
        (&Method::POST, ["apis", "resource.k8s.io", _, "resourceslices"]) => {
            write_slice(store, None, parsed())
        }
        (&Method::PUT, ["apis", "resource.k8s.io", _, "resourceslices", name]) => {
            write_slice(store, Some(name), parsed())
        }
        (&Method::GET, ["apis", "resource.k8s.io", _, "resourceslices", name]) => {
            match store.slices.get(*name) {
                Some(slice) => (StatusCode::OK, slice.clone()),
                None => not_found("resourceslice"),
            }
        }
        (&Method::DELETE, ["apis", "resource.k8s.io", _, "resourceslices", name]) => {
            match store.slices.remove(*name) {
                Some(slice) => {
                    slice_event(store, "DELETED", slice.clone());
                    (StatusCode::OK, slice)
                }
                None => not_found("resourceslice"),
            }
        }
        (
            &Method::GET,
            [
                "apis",
                "resource.k8s.io",
                _,
                "namespaces",
                _,
                "resourceclaims",
                _,
            ],
        ) => not_found("resourceclaim"),
        (_, [.., "namespaces", _, _kind]) if *method == Method::POST => {
            let mut object = parsed();
            let name = object["metadata"]["name"].as_str().unwrap_or_default();
            let key = format!("{}/{name}", call.parts.join("/"));
            if store.objects.contains_key(&key) {
                return refusal(StatusCode::CONFLICT, "AlreadyExists", "exists");
            }
            store.version += 1;
            object["metadata"]["resourceVersion"] = json!(store.version.to_string());
            store.objects.insert(key, object.clone());
            (StatusCode::CREATED, object)
        }
        (_, [.., "namespaces", _, _kind, _name]) => {
            let key = call.parts.join("/");
            match *method {
                Method::GET => match store.objects.get(&key) {
                    Some(object) => (StatusCode::OK, object.clone()),
                    None => not_found("object"),
                },
                Method::PUT => {
                    let mut object = parsed();
                    let stored = store
                        .objects
                        .get(&key)
                        .map(|o| o["metadata"]["resourceVersion"].clone());
                    if stored.is_none() {
                        return not_found("object");
                    }
                    if stored != Some(object["metadata"]["resourceVersion"].clone()) {
                        return refusal(StatusCode::CONFLICT, "Conflict", "stale resourceVersion");
                    }
                    store.version += 1;
                    object["metadata"]["resourceVersion"] = json!(store.version.to_string());
                    store.objects.insert(key, object.clone());
                    (StatusCode::OK, object)
                }
                Method::DELETE => match store.objects.remove(&key) {
                    Some(object) => (StatusCode::OK, object),
                    None => not_found("object"),
                },
                _ => refusal(StatusCode::METHOD_NOT_ALLOWED, "MethodNotAllowed", "method"),
            }
        }
        _ => not_found("path"),
    }
}

/// A JSON merge patch of a Node (RFC 7386); a `metadata.resourceVersion` in it must match.
fn patch_node(store: &mut Store, name: &str, patch: &Value) -> Answer {
    let version = store.version + 1;
    let Some(node) = store.nodes.get_mut(name) else {
        return not_found("node");
    };
    if let Some(wanted) = patch["metadata"]["resourceVersion"].as_str()
        && node.object["metadata"]["resourceVersion"] != wanted
    {
        return refusal(
            StatusCode::CONFLICT,
            "Conflict",
            "the object has been modified",
        );
    }
    let before = node.object.clone();
    merge(&mut node.object, patch);
    node.object["metadata"]["resourceVersion"] = before["metadata"]["resourceVersion"].clone();
    if node.object == before {
        let answer = (StatusCode::OK, node.object.clone());
        store.unchanged_writes += 1;
        return answer;
    }
    store.version = version;
    node_changed(node, version);
    (StatusCode::OK, node.object.clone())
}

/// A new version of a changed Node, and its watchers told.
fn node_changed(node: &mut NodeEntry, version: u64) {
    node.object["metadata"]["resourceVersion"] = json!(version.to_string());
    let event = json!({"type": "MODIFIED", "object": node.object});
    node.log.push(version, event);
}

/// Server-side apply of conditions: each applied type replaces the condition of that type.
/// An apply that changes nothing leaves the version as it was, as the API server does.
fn apply_conditions(store: &mut Store, name: &str, applied: &Value) -> Answer {
    let version = store.version + 1;
    let Some(node) = store.nodes.get_mut(name) else {
        return not_found("node");
    };
    let mut conditions = node.object["status"]["conditions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let before = conditions.clone();
    for condition in applied["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
    {
        match conditions
            .iter_mut()
            .find(|c| c["type"] == condition["type"])
        {
            Some(existing) => *existing = condition.clone(),
            None => conditions.push(condition.clone()),
        }
    }
    if conditions == before {
        let answer = (StatusCode::OK, node.object.clone());
        store.unchanged_writes += 1;
        return answer;
    }
    node.object["status"]["conditions"] = Value::Array(conditions);
    store.version = version;
    node_changed(node, version);
    (StatusCode::OK, node.object.clone())
}

fn merge(target: &mut Value, patch: &Value) {
    let Value::Object(patch) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = json!({});
    }
    let Value::Object(map) = target else { return };
    for (key, value) in patch {
        if value.is_null() {
            map.remove(key);
        } else {
            merge(map.entry(key.clone()).or_insert(Value::Null), value);
        }
    }
}

/// Creates (`name` none) or replaces a ResourceSlice; a replace must name the stored version.
fn write_slice(store: &mut Store, name: Option<&str>, mut object: Value) -> Answer {
    let key = name
        .map(str::to_owned)
        .or_else(|| object["metadata"]["name"].as_str().map(str::to_owned))
        .unwrap_or_default();
    let stored = store
        .slices
        .get(&key)
        .map(|s| s["metadata"]["resourceVersion"].clone());
    let kind = match (name, stored) {
        (None, Some(_)) => return refusal(StatusCode::CONFLICT, "AlreadyExists", "exists"),
        (None, None) => "ADDED",
        (Some(_), None) => return not_found("resourceslice"),
        (Some(_), Some(version)) if version != object["metadata"]["resourceVersion"] => {
            return refusal(
                StatusCode::CONFLICT,
                "Conflict",
                "the object has been modified",
            );
        }
        (Some(_), Some(_)) => "MODIFIED",
    };
    if kind == "MODIFIED" && store.slices.get(&key) == Some(&object) {
        store.unchanged_writes += 1;
    }
    store.version += 1;
    object["metadata"]["resourceVersion"] = json!(store.version.to_string());
    store.slices.insert(key, object.clone());
    slice_event(store, kind, object.clone());
    let code = if kind == "ADDED" {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    (code, object)
}

fn slice_event(store: &mut Store, kind: &str, object: Value) {
    if kind == "DELETED" {
        store.version += 1;
    }
    let node = object["spec"]["nodeName"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let version = store.version;
    store
        .slice_logs
        .entry(node)
        .or_default()
        .push(version, json!({"type": kind, "object": object}));
}

/// A watch on one node's Node or slices: the events after the asked version (or the current
/// objects as ADDED from version 0 or none), then each change as it happens, bookmarks when
/// asked for, until `timeoutSeconds`; 410 Gone in an ERROR event when the version is too old.
#[allow(clippy::disallowed_methods)] // a stand-in server, not a gpud subsystem: no span to keep
fn watch(
    shared: &Arc<Shared>,
    call: &Call<'_>,
    resource: &'static str,
    bytes_in: usize,
) -> Response {
    let slices = resource == "resourceslices";
    let key = if slices {
        "spec.nodeName"
    } else {
        "metadata.name"
    };
    let Some(node) = selector_value(call.params.get("fieldSelector"), key).map(str::to_owned)
    else {
        let answer = refusal(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            "the fleet serves watches of one node",
        );
        return reply(shared, call.node, Verb::Watch, resource, bytes_in, answer);
    };
    let from: u64 = call
        .params
        .get("resourceVersion")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let timeout = call
        .params
        .get("timeoutSeconds")
        .and_then(|v| v.parse().ok())
        .unwrap_or(1800u64);
    let bookmarks = call
        .params
        .get("allowWatchBookmarks")
        .is_some_and(|b| b == "true");
    let (initial, wake, cursor) = {
        let mut store = shared.store.lock().expect("store");
        let now = store.version;
        let (log, objects): (&Log, Vec<Value>) = if slices {
            let objects = store
                .slices
                .values()
                .filter(|s| s["spec"]["nodeName"] == node.as_str())
                .cloned()
                .collect();
            (store.slice_logs.entry(node.clone()).or_default(), objects)
        } else {
            match store.nodes.get(&node) {
                Some(entry) => (&entry.log, vec![entry.object.clone()]),
                None => {
                    drop(store);
                    return reply(
                        shared,
                        call.node,
                        Verb::Watch,
                        resource,
                        bytes_in,
                        not_found("node"),
                    );
                }
            }
        };
        let initial: Vec<(u64, Value)> = if from == 0 {
            objects
                .into_iter()
                .map(|o| (now, json!({"type": "ADDED", "object": o})))
                .collect()
        } else if from < log.compacted {
            let gone = refusal(StatusCode::GONE, "Expired", "too old resource version").1;
            vec![(now, json!({"type": "ERROR", "object": gone}))]
        } else {
            log.after(from)
        };
        (
            initial,
            Arc::clone(&log.wake),
            if from == 0 { now } else { from },
        )
    };
    shared
        .counts
        .record(call.node, Verb::Watch, resource, 200, bytes_in);
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::convert::Infallible>>(16);
    let shared = Arc::clone(shared);
    let owner = call.node.to_owned();
    tokio::spawn(async move {
        let _open = shared.counts.watch_opened(&owner);
        let send = |event: &Value| {
            let line = format!("{event}\n");
            shared.counts.bytes(&owner, resource, line.len());
            Bytes::from(line)
        };
        let mut cursor = cursor;
        let mut gone = false;
        for (version, event) in &initial {
            gone |= event["type"] == "ERROR";
            cursor = cursor.max(*version);
            if tx.send(Ok(send(event))).await.is_err() {
                return;
            }
        }
        if gone {
            return;
        }
        let end = tokio::time::Instant::now() + Duration::from_secs(timeout);
        let mut bookmark_at = tokio::time::Instant::now() + BOOKMARK_EVERY;
        loop {
            let notified = wake.notified();
            let mut notified = std::pin::pin!(notified);
            notified.as_mut().enable();
            let (events, now) = {
                let store = shared.store.lock().expect("store");
                let log = if slices {
                    store.slice_logs.get(&node)
                } else {
                    store.nodes.get(&node).map(|n| &n.log)
                };
                (
                    log.map(|l| l.after(cursor)).unwrap_or_default(),
                    store.version,
                )
            };
            for (version, event) in events {
                cursor = cursor.max(version);
                if tx.send(Ok(send(&event))).await.is_err() {
                    return;
                }
            }
            let wake_at = if bookmarks { bookmark_at.min(end) } else { end };
            let woken = tokio::select! {
                // The client went away: the watch is closed.
                () = tx.closed() => return,
                woken = tokio::time::timeout_at(wake_at, notified) => woken,
            };
            if woken.is_err() {
                if bookmarks && tokio::time::Instant::now() >= bookmark_at {
                    let kind = if slices { "ResourceSlice" } else { "Node" };
                    let event = json!({"type": "BOOKMARK", "object": {"kind": kind,
                        "apiVersion": if slices { "resource.k8s.io/v1" } else { "v1" },
                        "metadata": {"resourceVersion": now.to_string()}}});
                    cursor = cursor.max(now);
                    if tx.send(Ok(send(&event))).await.is_err() {
                        return;
                    }
                    bookmark_at = tokio::time::Instant::now() + BOOKMARK_EVERY;
                }
                if tokio::time::Instant::now() >= end {
                    return;
                }
            }
        }
    });
    let body = Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx));
    let mut response = Response::new(body);
    response.headers_mut().insert(
        "content-type",
        axum::http::HeaderValue::from_static("application/json"),
    );
    response
}
