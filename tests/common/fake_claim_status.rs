//! The fake API server's `resourceclaims/status` subresource, for the device status DRA
//! drivers write (KEP-4817), with the semantics of a real server's server-side apply:
//! `application/apply-patch+yaml` only (415 otherwise), a field manager required (422),
//! 404 for a claim that does not exist, `status.devices[]` a list keyed by driver, pool,
//! device and shareID whose entries each belong to the manager that applied them (one
//! owned by another manager is a 409 conflict unless `force=true`; those the manager owned
//! and no longer applies are removed). From 1.36 the API server also authorizes the
//! synthetic `resourceclaims/driver` subresource, named after each driver whose entries
//! change, with verb `associated-node:patch`. With feature gate
//! `DRAResourceClaimDeviceStatus` turned off (a 1.34 stand-in) the write is taken and the
//! entries dropped, as a real server drops a gated field.

use super::*;

/// The gate that keeps `status.devices`.
pub const DEVICE_STATUS_GATE: &str = "DRAResourceClaimDeviceStatus";

/// One entry's key in the list: `driver/pool/device/shareID`.
fn entry_key(entry: &Value) -> String {
    ["driver", "pool", "device", "shareID"]
        .map(|k| entry[k].as_str().unwrap_or_default().to_owned())
        .join("/")
}

/// `PATCH …/namespaces/{ns}/resourceclaims/{name}/status`.
pub(super) async fn apply_claim_status(
    State(s): State<Shared>,
    UrlPath((version, ns, name)): UrlPath<(String, String, String)>,
    method: axum::http::Method,
    uri: axum::http::Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Reply {
    let mut state = s.lock().unwrap();
    gate_status(&mut state)?;
    resource_call(&mut state, &method, &uri, &version)?;
    let (manager, params) = apply_options(&headers, &uri)?;
    let claim_key = format!("{ns}/{name}");
    let Some(mut claim) = state.claims.get(&claim_key).cloned() else {
        return Err(failure_body(
            StatusCode::NOT_FOUND,
            "NotFound",
            &format!("resourceclaims.resource.k8s.io \"{name}\" not found"),
            json!({"name": name, "group": "resource.k8s.io", "kind": "resourceclaims"}),
        ));
    };
    let applied: Value =
        serde_json::from_slice(&body).map_err(|_| status(StatusCode::BAD_REQUEST, "BadRequest"))?;
    let force = params.get("force").is_some_and(|f| f == "true");
    let mut wanted = applied["status"]["devices"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let dropped = state.disabled_gates.contains(DEVICE_STATUS_GATE);
    if dropped {
        wanted.clear();
    }
    let owner = |state: &ApiState, entry: &str| {
        state
            .claim_status_managers
            .get(&format!("{claim_key}|{entry}"))
            .cloned()
    };
    for entry in &wanted {
        if let Some(other) = owner(&state, &entry_key(entry))
            && other != manager
            && !force
        {
            return Err(failure_body(
                StatusCode::CONFLICT,
                "Conflict",
                &format!(
                    "Apply failed with 1 conflict: conflict with \"{other}\": .status.devices"
                ),
                Value::Null,
            ));
        }
    }
    let applied_keys: Vec<String> = wanted.iter().map(entry_key).collect();
    let mut devices = claim["status"]["devices"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let mut changed_drivers: std::collections::BTreeSet<String> = wanted
        .iter()
        .filter(|e| !devices.contains(e))
        .filter_map(|e| e["driver"].as_str().map(str::to_owned))
        .collect();
    devices.retain(|e| {
        let key = entry_key(e);
        let mine = owner(&state, &key).as_deref() == Some(manager.as_str());
        if mine && !applied_keys.contains(&key) {
            changed_drivers.insert(e["driver"].as_str().unwrap_or_default().to_owned());
            return false;
        }
        true
    });
    // From 1.36 every driver whose entries change is authorized on its own.
    if server_minor(&state) >= 36
        && let Some(rbac) = &state.rbac
    {
        for driver in &changed_drivers {
            let synthetic = rbac::Attributes {
                verb: "associated-node:patch".into(),
                group: "resource.k8s.io".into(),
                resource: "resourceclaims".into(),
                subresource: Some("driver".into()),
                namespace: Some(ns.clone()),
                name: Some(driver.clone()),
            };
            if rbac.denies(&synthetic) {
                let user = rbac.user.clone();
                return Err(failure_body(
                    StatusCode::FORBIDDEN,
                    "Forbidden",
                    &synthetic.forbidden_message(&user),
                    Value::Null,
                ));
            }
        }
    }
    for entry in &wanted {
        match devices
            .iter_mut()
            .find(|e| entry_key(e) == entry_key(entry))
        {
            Some(existing) => *existing = entry.clone(),
            None => devices.push(entry.clone()),
        }
    }
    let prefix = format!("{claim_key}|");
    state
        .claim_status_managers
        .retain(|k, m| !(k.starts_with(&prefix) && *m == manager));
    for key in &applied_keys {
        state
            .claim_status_managers
            .insert(format!("{claim_key}|{key}"), manager.clone());
    }
    if devices.is_empty() {
        if let Some(status) = claim["status"].as_object_mut() {
            status.remove("devices");
        }
    } else {
        claim["status"]["devices"] = Value::Array(devices);
    }
    state
        .claim_status_applies
        .push((manager, claim_key.clone(), applied));
    state.claims.insert(claim_key, claim.clone());
    Ok(axum::Json(claim))
}

impl FakeApi {
    /// Claim `namespace/name` as the server holds it now.
    pub fn claim(&self, namespace: &str, name: &str) -> Option<Value> {
        self.state
            .lock()
            .unwrap()
            .claims
            .get(&format!("{namespace}/{name}"))
            .cloned()
    }

    /// (field manager, `namespace/name`, body) of every apply to a claim's status taken.
    pub fn claim_status_applies(&self) -> Vec<(String, String, Value)> {
        self.state.lock().unwrap().claim_status_applies.clone()
    }

    /// Writes claim `namespace/name`'s `status.devices` entry as field manager `manager`
    /// would (another driver's, or a person's).
    pub fn own_claim_device(&self, namespace: &str, name: &str, manager: &str, entry: Value) {
        let mut state = self.state.lock().unwrap();
        let claim_key = format!("{namespace}/{name}");
        let key = format!("{claim_key}|{}", entry_key(&entry));
        state.claim_status_managers.insert(key, manager.to_owned());
        let claim = state.claims.get_mut(&claim_key).unwrap();
        let devices = &mut claim["status"]["devices"];
        if !devices.is_array() {
            *devices = json!([]);
        }
        devices.as_array_mut().unwrap().push(entry);
    }
}
