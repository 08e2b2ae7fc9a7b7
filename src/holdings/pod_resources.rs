//! What the device plugin gave to running pods, from the kubelet's pod-resources API: the
//! DRA plugin refuses a claim a GPU that a pod already has.

use std::path::Path;
use std::time::Duration;

use tonic::transport::Endpoint;

use crate::inventory::Snapshot;
use crate::proto::podresources::ListPodResourcesRequest;
use crate::proto::podresources::pod_resources_lister_client::PodResourcesListerClient;

/// How long one pod-resources call may take.
const LIST_TIMEOUT: Duration = Duration::from_secs(5);

/// Where the kubelet serves the pod-resources API.
pub const DEFAULT_SOCKET: &str = "/var/lib/kubelet/pod-resources/kubelet.sock";

/// The resource-name prefix of the device plugin's resources.
pub const RESOURCE_PREFIX: &str = "nvidia.com/";

/// A device held by someone: its UUID, its GPU's UUID (the same for a whole GPU) and who.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holding {
    pub uuid: String,
    pub gpu_uuid: String,
    pub owner: String,
}

impl Holding {
    /// Whether this holding and a device (`uuid` on GPU `gpu_uuid`) cannot both be handed
    /// out: the same device, or a whole GPU and a MIG device on it. Two MIG devices of one
    /// GPU do not clash.
    pub fn clashes(&self, uuid: &str, gpu_uuid: &str) -> bool {
        self.uuid == uuid || self.uuid == gpu_uuid || self.gpu_uuid == uuid
    }
}

/// The GPUs and MIG devices the device plugin has given to running pods, each with the pod
/// (`namespace/name`) that has it, from the kubelet's pod-resources `List`.
///
/// Device IDs are UUIDs, UUIDs with a replica suffix (`GPU-…::1`, time-slicing) or NVML
/// indices (`3`, MIG `3:1`, with `deviceIDStrategy: index`); all three are mapped to UUIDs. A
/// MIG device also counts as holding its GPU.
pub async fn device_plugin_holders(
    socket: &Path,
    snapshot: &Snapshot,
) -> Result<Vec<Holding>, String> {
    let what = |e: &dyn std::fmt::Display| {
        format!(
            "cannot ask the kubelet's pod-resources API at {}: {e}",
            socket.display()
        )
    };
    let endpoint = Endpoint::from_shared(format!("unix:{}", socket.display()))
        .map_err(|e| what(&e))?
        .connect_timeout(Duration::from_secs(1));
    let channel = endpoint.connect().await.map_err(|e| what(&e))?;
    let mut client = PodResourcesListerClient::new(channel);
    let answer = tokio::time::timeout(LIST_TIMEOUT, client.list(ListPodResourcesRequest {}))
        .await
        .map_err(|_| what(&"no answer within 5s"))?
        .map_err(|e| what(&e))?
        .into_inner();
    let mut out = Vec::new();
    for pod in answer.pod_resources {
        let owner = format!("{}/{}", pod.namespace, pod.name);
        let ids = pod
            .containers
            .iter()
            .flat_map(|c| &c.devices)
            .filter(|d| d.resource_name.starts_with(RESOURCE_PREFIX))
            .flat_map(|d| &d.device_ids);
        for id in ids {
            let (uuid, gpu_uuid) = uuids_of(id, snapshot);
            out.push(Holding {
                uuid,
                gpu_uuid,
                owner: owner.clone(),
            });
        }
    }
    Ok(out)
}

/// The UUID a device-plugin device ID stands for, and its GPU's.
fn uuids_of(id: &str, snapshot: &Snapshot) -> (String, String) {
    let base = id.split("::").next().unwrap_or(id);
    for gpu in &snapshot.gpus {
        if gpu.uuid == base || gpu.index.to_string() == base {
            return (gpu.uuid.clone(), gpu.uuid.clone());
        }
        for mig in &gpu.mig.devices {
            if mig.uuid == base || format!("{}:{}", gpu.index, mig.index) == base {
                return (mig.uuid.clone(), gpu.uuid.clone());
            }
        }
    }
    (base.to_owned(), base.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inventory::model::{MigDevice, Node};
    use crate::inventory::test_support::{gpu, mig, with_migs};

    #[test]
    fn device_plugin_ids_map_to_uuids_in_every_spelling() {
        let migged: MigDevice = mig(1, "MIG-b1", 1, 0);
        let snapshot = Snapshot {
            node: Node {
                hostname: "n".into(),
                driver_version: "570.133.20".into(),
                cuda_driver_version: None,
                nvml_version: None,
                machine_type: None,
            },
            gpus: vec![
                gpu(0, "GPU-a", "A100", 81920),
                with_migs(gpu(1, "GPU-b", "A100", 81920), vec![migged]),
            ],
            topology: Vec::new(),
        };
        let pair = |a: &str, b: &str| (a.to_owned(), b.to_owned());
        assert_eq!(uuids_of("GPU-a", &snapshot), pair("GPU-a", "GPU-a"));
        assert_eq!(uuids_of("GPU-a::3", &snapshot), pair("GPU-a", "GPU-a"));
        assert_eq!(uuids_of("0", &snapshot), pair("GPU-a", "GPU-a"));
        assert_eq!(uuids_of("MIG-b1", &snapshot), pair("MIG-b1", "GPU-b"));
        assert_eq!(uuids_of("1:1", &snapshot), pair("MIG-b1", "GPU-b"));
        let whole = Holding {
            uuid: "GPU-b".into(),
            gpu_uuid: "GPU-b".into(),
            owner: "p".into(),
        };
        assert!(whole.clashes("MIG-b1", "GPU-b"));
        let part = Holding {
            uuid: "MIG-b1".into(),
            gpu_uuid: "GPU-b".into(),
            owner: "p".into(),
        };
        assert!(part.clashes("GPU-b", "GPU-b"));
        assert!(!part.clashes("MIG-b2", "GPU-b"));
    }
}
