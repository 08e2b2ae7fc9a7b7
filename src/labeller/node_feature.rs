//! Sink 3: NFD's `NodeFeature` object, GFD's output since v0.19 (`useNodeFeatureAPI`).
//!
//! nfd-master turns the `spec.labels` of every NodeFeature object carrying the label
//! `nfd.node.kubernetes.io/node-name=<node>` into labels of that node, so the labeller needs
//! no access to Nodes and nfd-master stays the one writer of NFD-managed labels. As GFD does,
//! the labeller keeps one object per node, `nvidia-features-for-<node>`, in its namespace:
//! it creates the object when missing; otherwise it sets the node-name label, the owner
//! references and the spec on the object it read and sends it back as an update (carrying
//! the read `resourceVersion`, so a concurrent writer makes this sync fail and retry rather
//! than be overwritten). Nothing is sent when the object already says exactly that.
//!
//! The object is left in place on exit, as GFD leaves it: its owner references (the
//! DaemonSet that runs the labeller, as controller, and the labeller's Pod, found from
//! `POD_NAME`) let Kubernetes' garbage collector remove it with the DaemonSet.
//!
//! The decision is a pure function ([`plan`]); the client is a thin shell around it. The
//! kind is reached through kube's dynamic API, so no NFD types are compiled in.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, PostParams};
use serde_json::{Value, json};
use tracing::{debug, info, warn};

use super::FIELD_MANAGER;
use super::labels::Labels;
use crate::kube::ApiError;

/// NFD's API group.
pub const GROUP: &str = "nfd.k8s-sigs.io";
/// The version of NFD's API that GFD writes.
pub const VERSION: &str = "v1alpha1";
/// The kind.
pub const KIND: &str = "NodeFeature";
/// The kind's resource (plural) name, as in RBAC rules and URLs.
pub const PLURAL: &str = "nodefeatures";
/// The label nfd-master selects a node's NodeFeature objects by.
pub const NODE_NAME_LABEL: &str = "nfd.node.kubernetes.io/node-name";
/// GFD's object name is this prefix followed by the node name.
pub const NAME_PREFIX: &str = "nvidia-features-for-";

/// The object's name for `node`.
pub fn object_name(node: &str) -> String {
    format!("{NAME_PREFIX}{node}")
}

/// The NodeFeature kind for kube's dynamic API.
pub fn resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(GROUP, VERSION, KIND), PLURAL)
}

/// The owner references GFD gives the object: the DaemonSet owning `pod` (as controller),
/// then the pod itself. None when no DaemonSet owns the pod (a pod started by hand is
/// not worth tying the object to: it would be collected with the pod).
pub fn owner_references(pod: &Pod) -> Vec<OwnerReference> {
    let Some(daemon_set) = pod
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|owner| owner.kind == "DaemonSet")
    else {
        return Vec::new();
    };
    vec![
        OwnerReference {
            api_version: daemon_set.api_version.clone(),
            kind: daemon_set.kind.clone(),
            name: daemon_set.name.clone(),
            uid: daemon_set.uid.clone(),
            controller: Some(true),
            block_owner_deletion: None,
        },
        OwnerReference {
            api_version: "v1".to_owned(),
            kind: "Pod".to_owned(),
            name: pod.metadata.name.clone().unwrap_or_default(),
            uid: pod.metadata.uid.clone().unwrap_or_default(),
            controller: None,
            block_owner_deletion: None,
        },
    ]
}

/// What one sync sends.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// No object yet: create this one.
    Create(DynamicObject),
    /// The object differs: replace it with this one (the read object, updated).
    Replace(DynamicObject),
    /// The object already holds exactly these labels, owners and node.
    Nothing,
}

/// The spec GFD writes: the labels, and empty raw-feature sets (GFD sends no raw features).
fn spec(wanted: &Labels) -> Value {
    json!({
        "features": {"flags": {}, "attributes": {}, "instances": {}},
        "labels": wanted,
    })
}

/// Drops members that are null, empty objects or empty arrays, at every depth: the API
/// server and Go clients treat a missing, null and empty map alike, so a stored object
/// that differs from the wanted one only in these forms must not count as a change.
fn normalised(value: &Value) -> Value {
    match value {
        Value::Object(fields) => Value::Object(
            fields
                .iter()
                .map(|(k, v)| (k.clone(), normalised(v)))
                .filter(|(_, v)| !is_empty(v))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(normalised).collect()),
        other => other.clone(),
    }
}

fn is_empty(value: &Value) -> bool {
    match value {
        Value::Null => true,
        Value::Object(fields) => fields.is_empty(),
        Value::Array(items) => items.is_empty(),
        _ => false,
    }
}

/// Works out the write from the object as read (`None` when there is none) and the wanted
/// state: the object's labels are exactly the node-name label, its owners exactly `owners`
/// (none when empty), its spec exactly [`spec`] of `wanted`.
pub fn plan(
    current: Option<&DynamicObject>,
    namespace: &str,
    node: &str,
    owners: &[OwnerReference],
    wanted: &Labels,
) -> Action {
    let labels = BTreeMap::from([(NODE_NAME_LABEL.to_owned(), node.to_owned())]);
    let owner_references = (!owners.is_empty()).then(|| owners.to_vec());
    let spec = spec(wanted);
    let Some(current) = current else {
        let mut object = DynamicObject::new(&object_name(node), &resource())
            .within(namespace)
            .data(json!({ "spec": spec }));
        object.metadata.labels = Some(labels);
        object.metadata.owner_references = owner_references;
        return Action::Create(object);
    };
    let same_labels = current.metadata.labels.as_ref() == Some(&labels);
    let same_owners = current
        .metadata
        .owner_references
        .as_deref()
        .unwrap_or_default()
        == owners;
    let same_spec =
        normalised(current.data.get("spec").unwrap_or(&Value::Null)) == normalised(&spec);
    if same_labels && same_owners && same_spec {
        return Action::Nothing;
    }
    let mut object = current.clone();
    object.metadata.labels = Some(labels);
    object.metadata.owner_references = owner_references;
    match object.data.as_object_mut() {
        Some(fields) => {
            fields.insert("spec".to_owned(), spec);
        }
        None => object.data = json!({ "spec": spec }),
    }
    Action::Replace(object)
}

/// A client for one node's NodeFeature object.
#[derive(Clone)]
pub struct NodeFeatureSink {
    api: Api<DynamicObject>,
    pods: Api<Pod>,
    namespace: String,
    node: String,
    name: String,
    pod_name: Option<String>,
    /// The owner references, once worked out (they do not change while the pod runs).
    owners: Option<Vec<OwnerReference>>,
}

impl std::fmt::Debug for NodeFeatureSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeFeatureSink")
            .field("namespace", &self.namespace)
            .field("name", &self.name)
            .field("pod_name", &self.pod_name)
            .finish()
    }
}

impl NodeFeatureSink {
    /// A sink for `node`'s object in `namespace`; `pod_name` is the labeller's own pod, whose
    /// DaemonSet becomes the object's owner (no owners without it).
    pub fn new(
        client: kube::Client,
        namespace: String,
        node: String,
        pod_name: Option<String>,
    ) -> Self {
        NodeFeatureSink {
            api: Api::namespaced_with(client.clone(), &namespace, &resource()),
            pods: Api::namespaced(client, &namespace),
            name: object_name(&node),
            namespace,
            node,
            pod_name: pod_name.filter(|p| !p.is_empty()),
            owners: None,
        }
    }

    /// The node whose labels this sink carries.
    pub fn node(&self) -> &str {
        &self.node
    }

    /// `NodeFeature <namespace>/<name>`, for messages.
    pub fn target(&self) -> String {
        format!("{KIND} {}/{}", self.namespace, self.name)
    }

    /// The owner references, read from the labeller's pod on first use. A pod that cannot
    /// be read for good (gone, or RBAC without `get` on pods) means no owners, with a
    /// warning, as GFD carries on; any other failure fails this sync, to be retried.
    async fn owners(&mut self) -> Result<Vec<OwnerReference>, ApiError> {
        if let Some(owners) = &self.owners {
            return Ok(owners.clone());
        }
        let owners = match &self.pod_name {
            None => {
                debug!("No pod name (POD_NAME); the NodeFeature object gets no owner references");
                Vec::new()
            }
            Some(pod) => match self.pods.get(pod).await {
                Ok(pod) => {
                    let owners = owner_references(&pod);
                    if owners.is_empty() {
                        info!(
                            "The pod is not run by a DaemonSet; the NodeFeature object gets no owner references"
                        );
                    }
                    owners
                }
                Err(kube::Error::Api(status)) if matches!(status.code, 403 | 404) => {
                    warn!(pod = %pod, namespace = %self.namespace, error = %crate::logging::error_chain(&status),
                          "Cannot read the labeller's pod; the NodeFeature object gets no owner references");
                    Vec::new()
                }
                Err(source) => {
                    return Err(ApiError::Api {
                        what: format!("pod {}/{pod}", self.namespace),
                        source,
                    });
                }
            },
        };
        self.owners = Some(owners.clone());
        Ok(owners)
    }

    /// One attempt: reads the object, then creates or replaces it if it differs. Returns
    /// whether anything was written.
    pub async fn sync(&mut self, wanted: &Labels) -> Result<bool, ApiError> {
        let owners = self.owners().await?;
        let target = self.target();
        let current = self
            .api
            .get_opt(&self.name)
            .await
            .map_err(|source| ApiError::Api {
                what: target.clone(),
                source,
            })?;
        let params = PostParams {
            field_manager: Some(FIELD_MANAGER.to_owned()),
            ..PostParams::default()
        };
        match plan(
            current.as_ref(),
            &self.namespace,
            &self.node,
            &owners,
            wanted,
        ) {
            Action::Nothing => Ok(false),
            Action::Create(object) => {
                self.api
                    .create(&params, &object)
                    .await
                    .map_err(|source| match &source {
                        // The collection itself is missing: nothing serves the kind.
                        kube::Error::Api(status) if status.code == 404 => ApiError::Hinted {
                            what: target,
                            hint: "is NFD's NodeFeature CRD (nodefeatures.nfd.k8s-sigs.io) installed?",
                            source,
                        },
                        _ => ApiError::Api {
                            what: target,
                            source,
                        },
                    })?;
                Ok(true)
            }
            Action::Replace(object) => {
                self.api
                    .replace(&self.name, &params, &object)
                    .await
                    .map_err(|source| ApiError::Api {
                        what: target,
                        source,
                    })?;
                Ok(true)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> Labels {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn owners() -> Vec<OwnerReference> {
        let pod = Pod {
            metadata: ObjectMeta {
                name: Some("gfd-x7k2p".into()),
                uid: Some("pod-uid".into()),
                owner_references: Some(vec![OwnerReference {
                    api_version: "apps/v1".into(),
                    kind: "DaemonSet".into(),
                    name: "gfd".into(),
                    uid: "ds-uid".into(),
                    controller: Some(true),
                    block_owner_deletion: Some(true),
                }]),
                ..ObjectMeta::default()
            },
            ..Pod::default()
        };
        owner_references(&pod)
    }

    fn to_json(action: &Action) -> Value {
        match action {
            Action::Create(o) | Action::Replace(o) => serde_json::to_value(o).unwrap(),
            Action::Nothing => Value::Null,
        }
    }

    #[test]
    fn owners_are_the_daemon_set_as_controller_then_the_pod() {
        assert_eq!(
            serde_json::to_value(owners()).unwrap(),
            json!([
                {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "gfd", "uid": "ds-uid", "controller": true},
                {"apiVersion": "v1", "kind": "Pod", "name": "gfd-x7k2p", "uid": "pod-uid"},
            ])
        );
        assert_eq!(owner_references(&Pod::default()), Vec::new());
    }

    #[test]
    fn missing_object_is_created_with_gfd_name_label_and_owners() {
        let wanted = labels(&[("nvidia.com/gpu.count", "8")]);
        let action = plan(None, "gpu", "n1", &owners(), &wanted);
        assert!(matches!(action, Action::Create(_)));
        assert_eq!(
            to_json(&action),
            json!({
                "apiVersion": "nfd.k8s-sigs.io/v1alpha1",
                "kind": "NodeFeature",
                "metadata": {
                    "name": "nvidia-features-for-n1",
                    "namespace": "gpu",
                    "labels": {"nfd.node.kubernetes.io/node-name": "n1"},
                    "ownerReferences": [
                        {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "gfd", "uid": "ds-uid", "controller": true},
                        {"apiVersion": "v1", "kind": "Pod", "name": "gfd-x7k2p", "uid": "pod-uid"},
                    ],
                },
                "spec": {
                    "features": {"flags": {}, "attributes": {}, "instances": {}},
                    "labels": {"nvidia.com/gpu.count": "8"},
                },
            })
        );
        // Without owners the field is left out rather than sent empty.
        let bare = to_json(&plan(None, "gpu", "n1", &[], &wanted));
        assert_eq!(bare["metadata"].get("ownerReferences"), None);
    }

    fn stored(spec: Value, node_labels: Value) -> DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": "nfd.k8s-sigs.io/v1alpha1",
            "kind": "NodeFeature",
            "metadata": {"name": "nvidia-features-for-n1", "namespace": "gpu",
                         "resourceVersion": "41", "labels": node_labels},
            "spec": spec,
            "status": {"numberOfLabels": 1},
        }))
        .unwrap()
    }

    #[test]
    fn matching_object_is_left_alone_whatever_form_its_empty_maps_take() {
        let wanted = labels(&[("nvidia.com/gpu.count", "8")]);
        let node_label = json!({"nfd.node.kubernetes.io/node-name": "n1"});
        // As the API server stores GFD's own object: features without empty maps.
        for features in [
            json!({}),
            json!(null),
            json!({"flags": null, "instances": {}}),
        ] {
            let current = stored(
                json!({"features": features, "labels": {"nvidia.com/gpu.count": "8"}}),
                node_label.clone(),
            );
            assert_eq!(
                plan(Some(&current), "gpu", "n1", &[], &wanted),
                Action::Nothing,
                "{features}"
            );
        }
    }

    #[test]
    fn changed_labels_replace_the_read_object() {
        let wanted = labels(&[("nvidia.com/gpu.count", "7")]);
        let current = stored(
            json!({"labels": {"nvidia.com/gpu.count": "8"}}),
            json!({"nfd.node.kubernetes.io/node-name": "n1", "stray": "x"}),
        );
        let action = plan(Some(&current), "gpu", "n1", &owners(), &wanted);
        assert!(matches!(action, Action::Replace(_)));
        assert_eq!(
            to_json(&action),
            json!({
                "apiVersion": "nfd.k8s-sigs.io/v1alpha1",
                "kind": "NodeFeature",
                "metadata": {
                    "name": "nvidia-features-for-n1",
                    "namespace": "gpu",
                    "resourceVersion": "41",
                    "labels": {"nfd.node.kubernetes.io/node-name": "n1"},
                    "ownerReferences": serde_json::to_value(owners()).unwrap(),
                },
                "spec": {
                    "features": {"flags": {}, "attributes": {}, "instances": {}},
                    "labels": {"nvidia.com/gpu.count": "7"},
                },
                "status": {"numberOfLabels": 1},
            })
        );
    }

    #[test]
    fn a_stray_label_or_lost_owner_is_a_change_too() {
        let wanted = labels(&[("a", "1")]);
        let spec = json!({"labels": {"a": "1"}});
        let node_label = json!({"nfd.node.kubernetes.io/node-name": "n1"});
        let stray = stored(
            spec.clone(),
            json!({"nfd.node.kubernetes.io/node-name": "n1", "x": "y"}),
        );
        assert!(matches!(
            plan(Some(&stray), "gpu", "n1", &[], &wanted),
            Action::Replace(_)
        ));
        let unowned = stored(spec, node_label);
        assert!(matches!(
            plan(Some(&unowned), "gpu", "n1", &owners(), &wanted),
            Action::Replace(_)
        ));
        assert_eq!(
            plan(Some(&unowned), "gpu", "n1", &[], &wanted),
            Action::Nothing
        );
    }

    #[test]
    fn kind_and_name() {
        let resource = resource();
        assert_eq!(resource.api_version, "nfd.k8s-sigs.io/v1alpha1");
        assert_eq!(resource.plural, "nodefeatures");
        assert_eq!(object_name("gpu-node-7"), "nvidia-features-for-gpu-node-7");
    }
}
