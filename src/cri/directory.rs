//! This node's pods from the container runtime's answers: pod UID, name and namespace from
//! each pod sandbox, container ID to container name from each container. Pure.
//!
//! The kubelet names what it creates twice, in the CRI metadata and in labels
//! (`io.kubernetes.pod.uid` and the rest); the metadata is read first and a label stands in
//! for an empty field. A sandbox with no pod UID was not made by the kubelet and is skipped. A
//! container whose sandbox is not in the sandbox list (created between the two calls) is
//! placed by its own labels.

use std::collections::HashMap;

use crate::pod_directory::{PodDirectory, PodEntry};
use crate::proto::cri_runtime::{Container, PodSandbox};

/// The kubelet's labels on sandboxes and containers.
pub const POD_UID: &str = "io.kubernetes.pod.uid";
pub const POD_NAME: &str = "io.kubernetes.pod.name";
pub const POD_NAMESPACE: &str = "io.kubernetes.pod.namespace";
pub const CONTAINER_NAME: &str = "io.kubernetes.container.name";

/// `field`, or the label `key` where the field is empty.
fn or_label(field: Option<&str>, labels: &HashMap<String, String>, key: &str) -> String {
    field
        .filter(|f| !f.is_empty())
        .or_else(|| labels.get(key).map(String::as_str))
        .unwrap_or_default()
        .to_owned()
}

/// A sandbox's pod UID and its (namespace, name) entry; `None` without a UID.
fn sandbox_pod(sandbox: &PodSandbox) -> Option<(String, PodEntry)> {
    let meta = sandbox.metadata.as_ref();
    let labels = &sandbox.labels;
    let uid = or_label(meta.map(|m| m.uid.as_str()), labels, POD_UID);
    if uid.is_empty() {
        return None;
    }
    let entry = PodEntry {
        namespace: or_label(meta.map(|m| m.namespace.as_str()), labels, POD_NAMESPACE),
        name: or_label(meta.map(|m| m.name.as_str()), labels, POD_NAME),
        containers: HashMap::new(),
    };
    Some((uid, entry))
}

/// The directory of the pods in `sandboxes` with the containers of `containers`.
pub fn directory(sandboxes: &[PodSandbox], containers: &[Container]) -> PodDirectory {
    let mut pods: HashMap<String, PodEntry> = HashMap::new();
    let mut uid_of_sandbox: HashMap<&str, String> = HashMap::new();
    for sandbox in sandboxes {
        let Some((uid, entry)) = sandbox_pod(sandbox) else {
            continue;
        };
        uid_of_sandbox.insert(sandbox.id.as_str(), uid.clone());
        // A pod whose sandbox was made again has several: the names are the same.
        pods.entry(uid).or_insert(entry);
    }
    for container in containers.iter().filter(|c| !c.id.is_empty()) {
        let labels = &container.labels;
        let uid = match uid_of_sandbox.get(container.pod_sandbox_id.as_str()) {
            Some(uid) => uid.clone(),
            None => or_label(None, labels, POD_UID),
        };
        if uid.is_empty() {
            continue;
        }
        let name = or_label(
            container.metadata.as_ref().map(|m| m.name.as_str()),
            labels,
            CONTAINER_NAME,
        );
        let entry = pods.entry(uid).or_insert_with(|| PodEntry {
            namespace: or_label(None, labels, POD_NAMESPACE),
            name: or_label(None, labels, POD_NAME),
            containers: HashMap::new(),
        });
        entry.containers.insert(container.id.clone(), name);
    }
    PodDirectory::from_pods(pods)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::cri_runtime::{ContainerMetadata, PodSandboxMetadata};

    fn labels(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn sandbox(id: &str, uid: &str, namespace: &str, name: &str) -> PodSandbox {
        PodSandbox {
            id: id.into(),
            metadata: Some(PodSandboxMetadata {
                name: name.into(),
                uid: uid.into(),
                namespace: namespace.into(),
                attempt: 0,
            }),
            labels: labels(&[(POD_UID, uid), (POD_NAME, name), (POD_NAMESPACE, namespace)]),
        }
    }

    fn container(id: &str, sandbox: &str, name: &str, extra: &[(&str, &str)]) -> Container {
        Container {
            id: id.into(),
            pod_sandbox_id: sandbox.into(),
            metadata: Some(ContainerMetadata {
                name: name.into(),
                attempt: 0,
            }),
            labels: labels(extra),
        }
    }

    #[test]
    fn sandboxes_name_pods_and_containers_name_their_ids() {
        let sandboxes = [
            sandbox("s1", "u-1", "ml", "train-0"),
            // The same pod's sandbox made again.
            sandbox("s1b", "u-1", "ml", "train-0"),
            sandbox("s2", "u-2", "web", "front"),
            // Not the kubelet's: no pod UID.
            PodSandbox {
                id: "s3".into(),
                ..Default::default()
            },
        ];
        let containers = [
            container("c1", "s1", "trainer", &[]),
            container("c1-old", "s1b", "setup", &[]),
            container("c2", "s2", "", &[(CONTAINER_NAME, "nginx")]),
            // Created after the sandbox list: placed by its labels.
            container(
                "c4",
                "s4",
                "late",
                &[(POD_UID, "u-4"), (POD_NAME, "new"), (POD_NAMESPACE, "ml")],
            ),
            container("c5", "s3", "orphan", &[]),
            container("", "s1", "no-id", &[]),
        ];
        let directory = directory(&sandboxes, &containers);
        assert_eq!(directory.len(), 3);
        let train = directory.pod("u-1").unwrap();
        assert_eq!(
            (train.namespace.as_str(), train.name.as_str()),
            ("ml", "train-0")
        );
        assert_eq!(
            train.containers,
            labels(&[("c1", "trainer"), ("c1-old", "setup")])
        );
        assert_eq!(directory.pod("u-2").unwrap().containers["c2"], "nginx");
        let late = directory.pod("u-4").unwrap();
        assert_eq!((late.namespace.as_str(), late.name.as_str()), ("ml", "new"));
        assert_eq!(late.containers["c4"], "late");
    }

    #[test]
    fn labels_stand_in_for_empty_metadata() {
        let mut bare = sandbox("s1", "u-1", "ml", "train-0");
        bare.metadata = None;
        let directory = directory(&[bare], &[]);
        let entry = directory.pod("u-1").unwrap();
        assert_eq!(
            (entry.namespace.as_str(), entry.name.as_str()),
            ("ml", "train-0")
        );
    }
}
