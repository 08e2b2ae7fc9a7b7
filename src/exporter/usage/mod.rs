//! Per-pod GPU usage on shared GPUs: each container's own GPU memory and share of the GPU's
//! engines, from NVML's per-process data ([`crate::nvml::processes`]), the process's cgroup
//! ([`cgroup`], [`owners`]) and this node's pods ([`crate::pod_directory`], from the API server's
//! [`crate::kube::pods`] or the container runtime's [`crate::cri`]).
//!
//! The sampler thread reads the processes and their owners with each sample; the renderer
//! sums them per device and container ([`totals`]) and writes the `gpud_container_gpu_*`
//! families ([`render`]). Processes of no pod known to gpud (host processes, a pod the API
//! server has not told about yet, a process whose PID was reused) are summed under `pod=""`,
//! never dropped; a pod that ended has no process and so no series.

pub mod cgroup;
pub mod owners;
mod render;
mod totals;

use std::path::PathBuf;
use std::time::Duration;

pub use render::render;
pub use totals::{Totals, totals};

/// How often the container runtime is asked for this node's pods: a pod started since the
/// last answer has its processes under `pod=""` until the next.
pub const RUNTIME_INTERVAL: Duration = Duration::from_secs(5);

/// Where per-pod usage comes from.
#[derive(Debug, Clone)]
pub struct UsageConfig {
    /// The host's `/proc` (NVML reports host PIDs).
    pub proc_root: PathBuf,
    /// Where pod UIDs and container IDs get their names.
    pub names: PodNames,
}

/// The source of this node's pods' names: either one, never both.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodNames {
    /// A watch of this node's pods on the API server.
    Api {
        /// The node whose pods name the containers.
        node: String,
        /// kubeconfig for the API server; `None`: the in-cluster service account.
        kubeconfig: Option<PathBuf>,
    },
    /// The container runtime's pod sandbox and container lists over its CRI socket, asked
    /// every `interval`.
    Runtime { socket: PathBuf, interval: Duration },
}
