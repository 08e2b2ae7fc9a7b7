//! Kubernetes RBAC as the API server's authorizer applies it, for the stand-in API server: the
//! request attributes a path and method name (verb, API group, resource with its subresource,
//! namespace, name), the rules a service account is bound to in rendered manifests
//! (ClusterRoles through ClusterRoleBindings everywhere, Roles through RoleBindings in their
//! namespace), and the 403 message a real API server gives when no rule allows a request.
//! Discovery (`/api`, `/apis/<group>`, `/version`) is allowed to everyone, as the built-in
//! `system:discovery` role does.

use axum::http::Uri;
use serde_json::Value;

/// What the authorizer decides on: the attributes of one resource request.
#[derive(Debug, Clone, PartialEq)]
pub struct Attributes {
    pub verb: String,
    /// `""` for the core group.
    pub group: String,
    pub resource: String,
    /// `status` in `nodes/status`.
    pub subresource: Option<String>,
    pub namespace: Option<String>,
    pub name: Option<String>,
}

impl Attributes {
    /// The attributes of `method uri`, or `None` for a non-resource (discovery) request.
    pub fn of(method: &str, uri: &Uri) -> Option<Attributes> {
        let parts: Vec<&str> = uri.path().trim_matches('/').split('/').collect();
        let (group, rest) = match parts.as_slice() {
            ["api", _, rest @ ..] => (String::new(), rest),
            ["apis", group, _, rest @ ..] => ((*group).to_owned(), rest),
            _ => return None,
        };
        let (namespace, rest) = match rest {
            ["namespaces", namespace, more @ ..] if !more.is_empty() => {
                (Some((*namespace).to_owned()), more)
            }
            other => (None, other),
        };
        let resource = (*rest.first()?).to_owned();
        let name = rest.get(1).map(|n| (*n).to_owned());
        let subresource = rest.get(2).map(|s| (*s).to_owned());
        let watch = uri
            .query()
            .unwrap_or_default()
            .split('&')
            .any(|pair| pair == "watch=true" || pair == "watch=1");
        let verb = match (method, name.is_some()) {
            ("GET", true) => "get",
            ("GET", false) if watch => "watch",
            ("GET", false) => "list",
            ("POST", _) => "create",
            ("PUT", _) => "update",
            ("PATCH", _) => "patch",
            ("DELETE", true) => "delete",
            ("DELETE", false) => "deletecollection",
            (other, _) => other,
        };
        Some(Attributes {
            verb: verb.to_owned(),
            group,
            resource,
            subresource,
            namespace,
            name,
        })
    }

    /// `nodes/status`, as rules name a subresource.
    pub fn resource_path(&self) -> String {
        match &self.subresource {
            Some(sub) => format!("{}/{sub}", self.resource),
            None => self.resource.clone(),
        }
    }

    /// The API server's message when `user` may not make this request.
    pub fn forbidden_message(&self, user: &str) -> String {
        let qualified = if self.group.is_empty() {
            self.resource.clone()
        } else {
            format!("{}.{}", self.resource, self.group)
        };
        let object = match &self.name {
            Some(name) => format!("{qualified} \"{name}\""),
            None => qualified,
        };
        let scope = match &self.namespace {
            Some(namespace) => format!("in the namespace \"{namespace}\""),
            None => "at the cluster scope".to_owned(),
        };
        format!(
            "{object} is forbidden: User \"{user}\" cannot {} resource \"{}\" in API group \
             \"{}\" {scope}",
            self.verb,
            self.resource_path(),
            self.group
        )
    }
}

impl std::fmt::Display for Attributes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.verb, self.resource_path())?;
        if !self.group.is_empty() {
            write!(f, ".{}", self.group)?;
        }
        if let Some(name) = &self.name {
            write!(f, " {name}")?;
        }
        if let Some(namespace) = &self.namespace {
            write!(f, " in namespace {namespace}")?;
        }
        Ok(())
    }
}

/// One PolicyRule, and where it applies: everywhere (a ClusterRole bound by a
/// ClusterRoleBinding) or in one namespace (a Role bound by a RoleBinding).
#[derive(Debug, Clone)]
struct Grant {
    namespace: Option<String>,
    api_groups: Vec<String>,
    resources: Vec<String>,
    verbs: Vec<String>,
    resource_names: Vec<String>,
}

impl Grant {
    fn allows(&self, request: &Attributes) -> bool {
        let any = |list: &[String], value: &str| list.iter().any(|v| v == "*" || v == value);
        let in_scope = match &self.namespace {
            None => true,
            Some(namespace) => request.namespace.as_ref() == Some(namespace),
        };
        in_scope
            && any(&self.api_groups, &request.group)
            && any(&self.resources, &request.resource_path())
            && any(&self.verbs, &request.verb)
            && (self.resource_names.is_empty()
                || request
                    .name
                    .as_ref()
                    .is_some_and(|name| self.resource_names.contains(name)))
    }
}

/// The rules one service account holds.
#[derive(Debug, Clone)]
pub struct Rbac {
    /// `system:serviceaccount:<namespace>:<name>`.
    pub user: String,
    grants: Vec<Grant>,
}

impl Rbac {
    /// The rules bound to service account `namespace/name` in rendered manifest `objects`.
    pub fn bound_to(objects: &[Value], namespace: &str, name: &str) -> Rbac {
        let named = |kind: &str, role: &str, role_namespace: Option<&str>| {
            objects.iter().find(|o| {
                o["kind"] == kind
                    && o["metadata"]["name"] == role
                    && role_namespace.is_none_or(|ns| o["metadata"]["namespace"] == ns)
            })
        };
        let mut grants = Vec::new();
        for binding in objects {
            let kind = binding["kind"].as_str().unwrap_or_default();
            if kind != "ClusterRoleBinding" && kind != "RoleBinding" {
                continue;
            }
            let subject = binding["subjects"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|s| {
                    s["kind"] == "ServiceAccount"
                        && s["name"] == name
                        && s["namespace"] == namespace
                });
            if !subject {
                continue;
            }
            let binding_namespace = binding["metadata"]["namespace"].as_str();
            // A RoleBinding grants in its own namespace, whichever kind of role it names.
            let scope = (kind == "RoleBinding").then(|| binding_namespace.unwrap_or_default());
            let role_kind = binding["roleRef"]["kind"].as_str().unwrap_or_default();
            let role_name = binding["roleRef"]["name"].as_str().unwrap_or_default();
            let role = match role_kind {
                "Role" => named("Role", role_name, binding_namespace),
                _ => named("ClusterRole", role_name, None),
            };
            let role = role.unwrap_or_else(|| {
                panic!(
                    "{kind} {} names {role_kind} {role_name}, which is not rendered",
                    binding["metadata"]["name"]
                )
            });
            let strings = |rule: &Value, field: &str| -> Vec<String> {
                rule[field]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|v| v.as_str().map(str::to_owned))
                    .collect()
            };
            for rule in role["rules"].as_array().into_iter().flatten() {
                grants.push(Grant {
                    namespace: scope.map(str::to_owned),
                    api_groups: strings(rule, "apiGroups"),
                    resources: strings(rule, "resources"),
                    verbs: strings(rule, "verbs"),
                    resource_names: strings(rule, "resourceNames"),
                });
            }
        }
        Rbac {
            user: format!("system:serviceaccount:{namespace}:{name}"),
            grants,
        }
    }

    /// Whether no rule allows `request` (the API server's own further checks, such as the
    /// synthetic `resourceclaims/driver` subresource).
    pub fn denies(&self, request: &Attributes) -> bool {
        !self.grants.iter().any(|g| g.allows(request))
    }

    /// The request's attributes when no rule allows it; `None` when allowed (or discovery).
    pub fn refuses(&self, method: &str, uri: &Uri) -> Option<Attributes> {
        let request = Attributes::of(method, uri)?;
        (!self.grants.iter().any(|g| g.allows(&request))).then_some(request)
    }
}
