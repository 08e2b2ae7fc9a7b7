//! Which MPS control daemons a node needs: one per MPS-shared resource, over that resource's
//! GPUs, with the limits NVIDIA's daemon sets, checked against what MPS supports.
//!
//! The resources are the device plugin's own (`device_plugin::resources`), so the daemons and
//! the advertised replicas can never disagree on names or GPUs.

use std::path::Path;

use crate::cuda_mps::layout;
use crate::cuda_mps::server;
use crate::inventory::Snapshot;
use crate::resources;
use crate::resources::settings::Settings;

/// Most MPS clients per GPU from compute capability 7.5 (Turing) on.
pub const MAX_CLIENTS_NEW: u32 = 48;
/// Most MPS clients per GPU before compute capability 7.5.
pub const MAX_CLIENTS_OLD: u32 = 16;

/// One GPU under a daemon.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedGpu {
    pub uuid: String,
    /// NVML index on the node.
    pub index: u32,
    pub memory_mib: u64,
}

/// One control daemon.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DaemonPlan {
    /// The advertised resource name (`nvidia.com/gpu`, or its `.shared` rename).
    pub resource: String,
    pub replicas: u32,
    /// In NVML index order: the order of `CUDA_VISIBLE_DEVICES`, so the daemon's device
    /// ordinals are positions in this list.
    pub gpus: Vec<PlannedGpu>,
}

/// Why MPS cannot run as configured (exit 65 at start).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    #[error("sharing using MPS is not supported for MIG devices")]
    MigDevices,
    #[error(
        "invalid MPS replicas for {resource}: {replicas} replicas exceed the maximum of \
         {max} MPS clients of GPU {uuid} (compute capability {capability}); lower \
         sharing.mps.resources[].replicas to at most {max}"
    )]
    TooManyReplicas {
        resource: String,
        replicas: u32,
        max: u32,
        uuid: String,
        capability: String,
    },
    #[error("cannot offer the node's devices: {0}")]
    Resources(#[from] resources::ResourceError),
}

/// The daemons `settings` call for on this node; none unless the sharing strategy is MPS.
pub fn plan(settings: &Settings, snapshot: &Snapshot) -> Result<Vec<DaemonPlan>, PlanError> {
    if settings.mps_root.is_none() {
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    for resource in resources::resources(snapshot, settings)? {
        let Some(replicas) = resource.replicas else {
            continue;
        };
        let mut gpus: Vec<PlannedGpu> = Vec::new();
        for device in &resource.devices {
            if device.mig.is_some() {
                return Err(PlanError::MigDevices);
            }
            if gpus.iter().any(|g| g.uuid == device.uuid) {
                continue;
            }
            let Some(gpu) = snapshot.gpus.iter().find(|g| g.uuid == device.uuid) else {
                continue;
            };
            let capability = gpu.compute_capability.clone().unwrap_or_default();
            let max = max_clients(&capability);
            if replicas > max {
                return Err(PlanError::TooManyReplicas {
                    resource: resource.name.clone(),
                    replicas,
                    max,
                    uuid: gpu.uuid.clone(),
                    capability,
                });
            }
            gpus.push(PlannedGpu {
                uuid: gpu.uuid.clone(),
                index: gpu.index,
                memory_mib: gpu.memory_mib,
            });
        }
        gpus.sort_by_key(|g| g.index);
        out.push(DaemonPlan {
            resource: resource.name,
            replicas,
            gpus,
        });
    }
    Ok(out)
}

/// MPS's client limit for a compute capability such as `9.0` (an unreadable one gets the
/// lower limit).
pub fn max_clients(capability: &str) -> u32 {
    let mut parts = capability.split('.').map(|p| p.parse::<u32>().ok());
    match (parts.next().flatten(), parts.next().flatten()) {
        (Some(major), Some(minor)) if (major, minor) >= (7, 5) => MAX_CLIENTS_NEW,
        (Some(major), None) if major >= 8 => MAX_CLIENTS_NEW,
        _ => MAX_CLIENTS_OLD,
    }
}

impl DaemonPlan {
    /// The daemon's whole environment (and that of every command sent to it).
    pub fn env(&self, root: &Path) -> Vec<(String, String)> {
        let gpus: Vec<String> = self.gpus.iter().map(|g| g.uuid.clone()).collect();
        server::environment(
            &layout::pipe_dir(root, &self.resource),
            &layout::log_dir(root, &self.resource),
            &gpus,
        )
    }

    /// The commands that set the daemon's defaults, in order: each GPU's pinned memory limit
    /// (its memory split evenly between the replicas, in MiB, by the daemon's ordinal of the
    /// GPU), then the active thread percentage (100 split evenly).
    pub fn limit_commands(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .gpus
            .iter()
            .enumerate()
            .filter(|(_, gpu)| gpu.memory_mib > 0)
            .map(|(ordinal, gpu)| {
                format!(
                    "set_default_device_pinned_mem_limit {ordinal} {}M",
                    gpu.memory_mib / u64::from(self.replicas)
                )
            })
            .collect();
        out.push(format!(
            "set_default_active_thread_percentage {}",
            100 / self.replicas
        ));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_limits_follow_compute_capability() {
        assert_eq!(max_clients("9.0"), 48);
        assert_eq!(max_clients("7.5"), 48);
        assert_eq!(max_clients("7.0"), 16);
        assert_eq!(max_clients("6.1"), 16);
        assert_eq!(max_clients(""), 16);
    }

    #[test]
    fn limits_split_memory_and_threads() {
        let plan = DaemonPlan {
            resource: "nvidia.com/gpu".into(),
            replicas: 3,
            gpus: vec![
                PlannedGpu {
                    uuid: "GPU-a".into(),
                    index: 2,
                    memory_mib: 81559,
                },
                PlannedGpu {
                    uuid: "GPU-b".into(),
                    index: 5,
                    memory_mib: 81559,
                },
            ],
        };
        assert_eq!(
            plan.limit_commands(),
            [
                "set_default_device_pinned_mem_limit 0 27186M",
                "set_default_device_pinned_mem_limit 1 27186M",
                "set_default_active_thread_percentage 33",
            ]
        );
        assert_eq!(
            plan.env(Path::new("/run/nvidia/mps")),
            [
                (
                    "CUDA_MPS_PIPE_DIRECTORY".to_owned(),
                    "/run/nvidia/mps/nvidia.com/gpu/pipe".to_owned()
                ),
                (
                    "CUDA_MPS_LOG_DIRECTORY".to_owned(),
                    "/run/nvidia/mps/nvidia.com/gpu/log".to_owned()
                ),
                ("CUDA_VISIBLE_DEVICES".to_owned(), "GPU-a,GPU-b".to_owned()),
            ]
        );
    }
}
