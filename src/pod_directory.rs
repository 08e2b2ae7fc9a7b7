//! This node's pods as a directory from pod UID and container ID to names: what per-pod usage
//! labels a process with. Plain data, filled by either source of names — the API server's
//! watch ([`crate::kube::pods`]) or the container runtime's lists ([`crate::cri`]) — and read
//! by the renderer.

use std::collections::HashMap;

/// One pod: its names, and its containers by ID.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodEntry {
    pub namespace: String,
    pub name: String,
    /// Container ID (without the runtime's `containerd://` prefix) → container name.
    pub containers: HashMap<String, String>,
}

/// This node's pods by UID.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodDirectory {
    pods: HashMap<String, PodEntry>,
}

impl PodDirectory {
    /// A directory of `pods`, by UID.
    pub fn from_pods(pods: HashMap<String, PodEntry>) -> Self {
        PodDirectory { pods }
    }

    /// The pod with this UID.
    pub fn pod(&self, uid: &str) -> Option<&PodEntry> {
        self.pods.get(uid)
    }

    /// Pods known.
    pub fn len(&self) -> usize {
        self.pods.len()
    }

    /// Whether no pod is known.
    pub fn is_empty(&self) -> bool {
        self.pods.is_empty()
    }

    /// Adds or replaces the pod with this UID.
    pub fn insert(&mut self, uid: String, entry: PodEntry) {
        self.pods.insert(uid, entry);
    }

    /// Forgets the pod with this UID.
    pub fn remove(&mut self, uid: &str) {
        self.pods.remove(uid);
    }
}
