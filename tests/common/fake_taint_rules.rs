//! The fake API server's `DeviceTaintRule`s (cluster-scoped, `resource.k8s.io`): served in
//! one version set with [`FakeApi::serve_taint_rules`] (`v1` as 1.37 serves them, `v1alpha3`
//! as 1.33–1.36 do with the alpha API on) and 404 in every other, as a 1.34 server without
//! the alpha API answers. A list, or with `watch=true` the changes after the given
//! resourceVersion until the watch's timeout; admins' writes go through
//! [`FakeApi::put_taint_rule`] and [`FakeApi::delete_taint_rule`].

use super::*;

/// `GET /apis/resource.k8s.io/{version}/devicetaintrules`.
pub(super) async fn list_taint_rules(
    State(s): State<Shared>,
    UrlPath(version): UrlPath<String>,
    uri: axum::http::Uri,
) -> Result<axum::response::Response, (StatusCode, axum::Json<Value>)> {
    let params = query(&uri);
    let mut state = s.lock().unwrap();
    gate_status(&mut state)?;
    state
        .taint_rule_requests
        .push(format!("GET {}", uri.path()));
    if state.taint_rule_version.as_deref() != Some(version.as_str()) {
        return Err(failure_body(
            StatusCode::NOT_FOUND,
            "NotFound",
            "the server could not find the requested resource",
            Value::Null,
        ));
    }
    if params.get("watch").map(String::as_str) != Some("true") {
        return Ok(list_answer(
            &format!("resource.k8s.io/{version}"),
            "DeviceTaintRuleList",
            state.taint_rule_changes.version,
            state.taint_rules.values(),
            None,
        ));
    }
    let (from, timeout) = watch_window(&params);
    state.taint_rule_watches += 1;
    drop(state);
    Ok(stream_changes(
        Arc::clone(&s),
        Vec::new(),
        from,
        None,
        timeout,
        |state| &state.taint_rule_changes.events,
        |state| Arc::clone(&state.taint_rule_changes.changed),
    ))
}

impl FakeApi {
    /// Serves DeviceTaintRules in `version` only (`None`: in none).
    pub fn serve_taint_rules(&self, version: Option<&str>) {
        self.state.lock().unwrap().taint_rule_version = version.map(str::to_owned);
    }

    /// Creates or replaces DeviceTaintRule `rule` (by its name), as an admin does.
    pub fn put_taint_rule(&self, mut rule: Value) {
        let name = rule["metadata"]["name"].as_str().unwrap().to_owned();
        let mut state = self.state.lock().unwrap();
        let kind = if state.taint_rules.contains_key(&name) {
            "MODIFIED"
        } else {
            "ADDED"
        };
        state.taint_rule_changes.record(kind, &mut rule);
        state.taint_rules.insert(name, rule);
    }

    /// Deletes DeviceTaintRule `name`.
    pub fn delete_taint_rule(&self, name: &str) {
        let mut state = self.state.lock().unwrap();
        if let Some(mut rule) = state.taint_rules.remove(name) {
            state.taint_rule_changes.record("DELETED", &mut rule);
        }
    }

    /// `GET path` of every DeviceTaintRule list and watch (kept apart from the other
    /// `resource.k8s.io` requests: the rules are read in their own version).
    pub fn taint_rule_requests(&self) -> Vec<String> {
        self.state.lock().unwrap().taint_rule_requests.clone()
    }

    /// How many DeviceTaintRule watches were opened.
    pub fn taint_rule_watches(&self) -> u32 {
        self.state.lock().unwrap().taint_rule_watches
    }
}
