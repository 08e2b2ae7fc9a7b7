//! Per-pod GPU usage on shared GPUs: each container's own GPU memory and share of the GPU's
//! engines, from NVML's per-process data ([`crate::nvml::processes`]), the process's cgroup
//! ([`cgroup`], [`owners`]) and this node's pods ([`crate::kube::pods`]).
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

pub use render::render;
pub use totals::{Totals, totals};

/// Where per-pod usage comes from.
#[derive(Debug, Clone)]
pub struct UsageConfig {
    /// The host's `/proc` (NVML reports host PIDs).
    pub proc_root: PathBuf,
    /// The node whose pods name the containers.
    pub node: String,
    /// kubeconfig for the API server; `None`: the in-cluster service account.
    pub kubeconfig: Option<PathBuf>,
}
