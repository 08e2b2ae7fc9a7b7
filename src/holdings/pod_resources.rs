//! What running pods hold, from the kubelet's pod-resources API: what the device plugin gave
//! them (the DRA plugin refuses a claim a GPU that a pod already has), and every pod that
//! holds a given GPU by either path, device plugin or DRA claim (the pods to evict before the
//! GPU is reset).
//!
//! One `List` call and one mapping of its answer serve both: device-plugin device IDs by
//! [`uuids_of`], DRA devices by gpud's own device names ([`crate::dra_names`]).

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use tonic::transport::Endpoint;

use crate::dra_names;
use crate::inventory::Snapshot;
use crate::proto::podresources::pod_resources_lister_client::PodResourcesListerClient;
use crate::proto::podresources::{
    ContainerResources, ListPodResourcesRequest, ListPodResourcesResponse,
};

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

/// A pod, by namespace and name; shown as `namespace/name`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PodName {
    pub namespace: String,
    pub name: String,
}

impl std::fmt::Display for PodName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
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
    let answer = list(socket).await?;
    Ok(held(&answer, snapshot, None)
        .map(|(pod, uuid, gpu_uuid)| Holding {
            uuid,
            gpu_uuid,
            owner: pod.to_string(),
        })
        .collect())
}

/// Every pod that holds GPU `gpu_uuid` or one of its MIG devices, sorted, each once: through
/// the device plugin (as [`device_plugin_holders`]) or through a DRA claim of driver
/// `dra_driver` (`gpu.nvidia.com` unless configured), from one pod-resources `List`.
pub async fn gpu_holders(
    socket: &Path,
    snapshot: &Snapshot,
    dra_driver: &str,
    gpu_uuid: &str,
) -> Result<Vec<PodName>, String> {
    let answer = list(socket).await?;
    let pods: BTreeSet<PodName> = held(&answer, snapshot, Some(dra_driver))
        .filter(|(_, _, gpu)| gpu == gpu_uuid)
        .map(|(pod, _, _)| pod)
        .collect();
    Ok(pods.into_iter().collect())
}

/// The kubelet's pod-resources `List` answer.
async fn list(socket: &Path) -> Result<ListPodResourcesResponse, String> {
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
    Ok(
        tokio::time::timeout(LIST_TIMEOUT, client.list(ListPodResourcesRequest {}))
            .await
            .map_err(|_| what(&"no answer within 5s"))?
            .map_err(|e| what(&e))?
            .into_inner(),
    )
}

/// Every device a pod of `answer` holds, as (pod, device UUID, its GPU's UUID): the device
/// plugin's (resources `nvidia.com/…`) and, with `dra_driver`, the devices of that driver's
/// claims.
fn held<'a>(
    answer: &'a ListPodResourcesResponse,
    snapshot: &'a Snapshot,
    dra_driver: Option<&'a str>,
) -> impl Iterator<Item = (PodName, String, String)> + 'a {
    answer.pod_resources.iter().flat_map(move |pod| {
        let name = PodName {
            namespace: pod.namespace.clone(),
            name: pod.name.clone(),
        };
        pod.containers
            .iter()
            .flat_map(move |container| container_devices(container, snapshot, dra_driver))
            .map(move |(uuid, gpu_uuid)| (name.clone(), uuid, gpu_uuid))
    })
}

/// The devices one container holds, as (device UUID, its GPU's UUID).
fn container_devices<'a>(
    container: &'a ContainerResources,
    snapshot: &'a Snapshot,
    dra_driver: Option<&'a str>,
) -> impl Iterator<Item = (String, String)> + 'a {
    let plugin = container
        .devices
        .iter()
        .filter(|d| d.resource_name.starts_with(RESOURCE_PREFIX))
        .flat_map(|d| &d.device_ids)
        .map(|id| uuids_of(id, snapshot));
    // The pool is not compared: the kubelet lists only this node's pods, and the driver's
    // pools are per node. The device name is set by every kubelet that gpud's DRA plugin
    // serves (1.32 and later), so the CDI device names need not be read.
    let claimed = container
        .dynamic_resources
        .iter()
        .flat_map(|claim| &claim.claim_resources)
        .filter(move |r| dra_driver == Some(r.driver_name.as_str()))
        .filter_map(|r| claimed_uuids(&r.device_name, snapshot));
    plugin.chain(claimed)
}

/// The UUID a DRA device name stands for, and its GPU's. A MIG device that no longer exists
/// (or a GPU whose MIG mode changed since) is taken for the whole GPU its name says: a pod
/// may still have that GPU open.
fn claimed_uuids(name: &str, snapshot: &Snapshot) -> Option<(String, String)> {
    if let Some(device) = dra_names::find(snapshot, name) {
        return Some((device.uuid().to_owned(), device.gpu().uuid.clone()));
    }
    let gpu = dra_names::gpu_named(snapshot, name)?;
    Some((gpu.uuid.clone(), gpu.uuid.clone()))
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
    use crate::inventory::model::{MigDevice, Placement};
    use crate::inventory::test_support::{gpu, mig, snapshot, with_migs};
    use crate::proto::podresources::{
        ClaimResource, ContainerDevices, DynamicResource, PodResources,
    };

    /// A pod whose one container holds `plugin` device IDs of `nvidia.com/gpu` and the DRA
    /// devices `claimed` as (driver, device name).
    fn pod(name: &str, plugin: &[&str], claimed: &[(&str, &str)]) -> PodResources {
        PodResources {
            name: name.into(),
            namespace: "ml".into(),
            containers: vec![ContainerResources {
                name: "c".into(),
                devices: vec![ContainerDevices {
                    resource_name: "nvidia.com/gpu".into(),
                    device_ids: plugin.iter().map(|s| (*s).to_owned()).collect(),
                    topology: None,
                }],
                dynamic_resources: vec![DynamicResource {
                    claim_name: format!("{name}-claim"),
                    claim_namespace: "ml".into(),
                    claim_resources: claimed
                        .iter()
                        .map(|(driver, device)| ClaimResource {
                            driver_name: (*driver).into(),
                            pool_name: "n".into(),
                            device_name: (*device).into(),
                            ..Default::default()
                        })
                        .collect(),
                }],
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    #[test]
    fn pods_hold_devices_through_the_device_plugin_and_through_claims() {
        let placed = MigDevice {
            placement: Some(Placement { start: 0, size: 1 }),
            gpu_instance_profile_id: Some(19),
            ..mig(0, "MIG-b0", 1, 0)
        };
        let snapshot = snapshot(vec![
            gpu(0, "GPU-a", "A100", 81920),
            with_migs(gpu(1, "GPU-b", "A100", 81920), vec![placed]),
        ]);
        let driver = "gpu.nvidia.com";
        let answer = ListPodResourcesResponse {
            pod_resources: vec![
                pod("plugin", &["GPU-a"], &[]),
                pod("claim", &[], &[(driver, "gpu-1-mig-1g10gb-19-0")]),
                pod("other-driver", &[], &[("other.example.com", "gpu-0")]),
                // A MIG device destroyed since: the name's GPU.
                pod("stale", &[], &[(driver, "gpu-1-mig-2g20gb-14-4")]),
            ],
        };
        let triple = |p: &str, u: &str, g: &str| {
            let pod = PodName {
                namespace: "ml".into(),
                name: p.into(),
            };
            (pod, u.to_owned(), g.to_owned())
        };
        assert_eq!(
            held(&answer, &snapshot, Some(driver)).collect::<Vec<_>>(),
            [
                triple("plugin", "GPU-a", "GPU-a"),
                triple("claim", "MIG-b0", "GPU-b"),
                triple("stale", "GPU-b", "GPU-b"),
            ]
        );
        // Without a driver, only the device plugin's.
        assert_eq!(
            held(&answer, &snapshot, None).collect::<Vec<_>>(),
            [triple("plugin", "GPU-a", "GPU-a")]
        );
        assert_eq!(triple("p", "", "").0.to_string(), "ml/p");
    }

    #[test]
    fn device_plugin_ids_map_to_uuids_in_every_spelling() {
        let migged: MigDevice = mig(1, "MIG-b1", 1, 0);
        let snapshot = snapshot(vec![
            gpu(0, "GPU-a", "A100", 81920),
            with_migs(gpu(1, "GPU-b", "A100", 81920), vec![migged]),
        ]);
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
