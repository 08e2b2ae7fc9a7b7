//! Pod attribution: which pod, namespace and container use each GPU and GPU instance, from the
//! kubelet's pod-resources `List` answer.
//!
//! Pure: the answer and the inventory snapshot in, an [`Attribution`] out. Device IDs are
//! understood in every form the kubelet may hold for NVIDIA's resources:
//!
//! | device ID | means |
//! |---|---|
//! | `GPU-<uuid>` | a whole GPU (device plugin, `uuid` device-ID strategy) |
//! | `MIG-<uuid>` | a MIG device, attributed to its GPU instance |
//! | `<gpu>` / `<gpu>:<mig>` | a GPU or MIG device by index (`index` strategy) |
//! | `<any of the above>::<n>` | replica `n` of a shared (time-sliced or MPS) device |
//! | `nvidia<N>`, `nvidia<N>/gi<G>`, `nvidia<N>/vgpu<K>` | GKE's device names |
//!
//! Where dcgm-exporter keeps only the last container per device, every container that holds a
//! device is kept: a shared GPU yields one series per pod, told apart by a `vgpu` label that
//! carries the replica number(s) the container holds. A device ID without a replica suffix
//! adds no `vgpu` label, so an unshared GPU looks exactly as it does with dcgm-exporter.

use std::collections::BTreeMap;

use crate::inventory::Snapshot;
use crate::proto::podresources::ListPodResourcesResponse;

/// The resource every NVIDIA GPU is advertised as, unless renamed.
pub const GPU_RESOURCE: &str = "nvidia.com/gpu";
/// The prefix of MIG resources in the device plugin's mixed strategy.
pub const MIG_RESOURCE_PREFIX: &str = "nvidia.com/mig-";

/// A device the exporter has series for: a whole GPU or one GPU instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DeviceKey {
    /// NVML index of the GPU.
    pub gpu: u32,
    /// GPU-instance id, for MIG.
    pub gpu_instance: Option<u32>,
}

/// The labels one container adds to a device's series.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct PodLabels {
    pub namespace: String,
    pub pod: String,
    pub container: String,
    /// Replica number(s) of a shared device, comma-separated; `None` for an unshared device.
    pub vgpu: Option<String>,
}

/// Containers per device, each list sorted by namespace, pod and container.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Attribution {
    by_device: BTreeMap<DeviceKey, Vec<PodLabels>>,
}

impl Attribution {
    /// The containers attributed to a GPU's series (`gpu_instance: None`) or a GPU
    /// instance's. A whole MIG-enabled GPU given to a container counts for each of its
    /// instances.
    pub fn for_device(&self, key: DeviceKey) -> impl Iterator<Item = &PodLabels> {
        let own = self.by_device.get(&key).into_iter().flatten();
        let whole = key
            .gpu_instance
            .and_then(|_| {
                self.by_device.get(&DeviceKey {
                    gpu: key.gpu,
                    gpu_instance: None,
                })
            })
            .into_iter()
            .flatten();
        own.chain(whole)
    }

    /// Whether nothing is attributed.
    pub fn is_empty(&self) -> bool {
        self.by_device.is_empty()
    }

    /// Number of devices with at least one container.
    pub fn devices(&self) -> usize {
        self.by_device.len()
    }
}

/// Which resources count as GPUs: `nvidia.com/gpu`, every `nvidia.com/mig-*`, and the extra
/// names given with `--nvidia-resource-names` (renamed or shared resources).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResourceFilter {
    /// Extra resource names.
    pub extra: Vec<String>,
}

impl ResourceFilter {
    /// Whether `name` is a GPU resource.
    pub fn matches(&self, name: &str) -> bool {
        name == GPU_RESOURCE
            || name.starts_with(MIG_RESOURCE_PREFIX)
            || self.extra.iter().any(|extra| extra == name)
    }
}

/// A parsed device ID: what it names and the replica, if shared.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceRef {
    pub key: DeviceKey,
    pub replica: Option<String>,
}

/// Resolves one device ID against the node; `None` for IDs that name nothing on this node.
pub fn resolve(id: &str, snapshot: &Snapshot) -> Option<DeviceRef> {
    let (base, replica) = match id.split_once("::") {
        Some((base, replica)) => (base, Some(replica.to_owned())),
        None => (id, None),
    };
    let whole = |gpu: u32| DeviceKey {
        gpu,
        gpu_instance: None,
    };
    let key = if base.starts_with("GPU-") {
        whole(snapshot.gpus.iter().find(|g| g.uuid == base)?.index)
    } else if base.starts_with("MIG-") {
        snapshot.gpus.iter().find_map(|g| {
            g.mig
                .devices
                .iter()
                .find(|m| m.uuid == base)
                .map(|m| DeviceKey {
                    gpu: g.index,
                    gpu_instance: Some(m.gpu_instance_id),
                })
        })?
    } else if let Some(gke) = base.strip_prefix("nvidia") {
        return resolve_gke(gke, snapshot, replica);
    } else if let Some((gpu, mig)) = base.split_once(':') {
        let gpu: u32 = gpu.parse().ok()?;
        let mig: u32 = mig.parse().ok()?;
        let device = snapshot
            .gpu(gpu)?
            .mig
            .devices
            .iter()
            .find(|m| m.index == mig)?;
        DeviceKey {
            gpu,
            gpu_instance: Some(device.gpu_instance_id),
        }
    } else {
        let gpu: u32 = base.parse().ok()?;
        snapshot.gpu(gpu)?;
        whole(gpu)
    };
    Some(DeviceRef { key, replica })
}

/// GKE's names: `nvidia<N>`, `nvidia<N>/gi<G>[/vgpu<K>]`, `nvidia<N>/vgpu<K>`, where `N` is
/// the device minor number.
fn resolve_gke(rest: &str, snapshot: &Snapshot, replica: Option<String>) -> Option<DeviceRef> {
    let mut parts = rest.split('/');
    let minor: u32 = parts.next()?.parse().ok()?;
    let gpu = snapshot
        .gpus
        .iter()
        .find(|g| g.minor_number == Some(minor))?;
    let mut key = DeviceKey {
        gpu: gpu.index,
        gpu_instance: None,
    };
    let mut replica = replica;
    for part in parts {
        if let Some(gi) = part.strip_prefix("gi") {
            key.gpu_instance = Some(gi.parse().ok()?);
        } else if let Some(vgpu) = part.strip_prefix("vgpu") {
            vgpu.parse::<u32>().ok()?;
            replica = Some(vgpu.to_owned());
        } else {
            return None;
        }
    }
    Some(DeviceRef { key, replica })
}

/// Attributes every GPU resource in the kubelet's answer to the devices of this node.
pub fn attribute(
    answer: &ListPodResourcesResponse,
    filter: &ResourceFilter,
    snapshot: &Snapshot,
) -> Attribution {
    // (device, namespace, pod, container) → replicas held.
    let mut holders: BTreeMap<(DeviceKey, &str, &str, &str), Vec<String>> = BTreeMap::new();
    let mut shared: BTreeMap<(DeviceKey, &str, &str, &str), bool> = BTreeMap::new();
    for pod in &answer.pod_resources {
        for container in &pod.containers {
            for devices in &container.devices {
                if !filter.matches(&devices.resource_name) {
                    continue;
                }
                for id in &devices.device_ids {
                    let Some(device) = resolve(id, snapshot) else {
                        continue;
                    };
                    let who = (
                        device.key,
                        pod.namespace.as_str(),
                        pod.name.as_str(),
                        container.name.as_str(),
                    );
                    let replicas = holders.entry(who).or_default();
                    if let Some(replica) = device.replica {
                        shared.insert(who, true);
                        if !replicas.contains(&replica) {
                            replicas.push(replica);
                        }
                    }
                }
            }
        }
    }
    let mut by_device: BTreeMap<DeviceKey, Vec<PodLabels>> = BTreeMap::new();
    for (who, mut replicas) in holders {
        let (key, namespace, pod, container) = who;
        replicas.sort_by(|a, b| natural(a).cmp(&natural(b)).then_with(|| a.cmp(b)));
        let vgpu = shared
            .get(&who)
            .copied()
            .unwrap_or(false)
            .then(|| replicas.join(","));
        by_device.entry(key).or_default().push(PodLabels {
            namespace: namespace.to_owned(),
            pod: pod.to_owned(),
            container: container.to_owned(),
            vgpu,
        });
    }
    for list in by_device.values_mut() {
        list.sort();
    }
    Attribution { by_device }
}

/// Sort key that orders numeric replica ids numerically.
fn natural(s: &str) -> (u64, usize) {
    (s.parse().unwrap_or(u64::MAX), s.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inventory::model::{Gpu, Node, Pci};
    use crate::inventory::test_support;
    use crate::proto::podresources::{ContainerDevices, ContainerResources, PodResources};

    fn gpu(index: u32, uuid: &str, migs: &[(u32, &str, u32)]) -> Gpu {
        let base = test_support::gpu(index, uuid, "NVIDIA A100-SXM4-80GB", 81920);
        let devices = migs
            .iter()
            .map(|&(mig_index, uuid, gi)| test_support::mig(mig_index, uuid, gi, 0))
            .collect();
        test_support::with_migs(
            Gpu {
                minor_number: Some(index + 10),
                pci: Pci {
                    bus_id: format!("00000000:{:02X}:00.0", index + 7).into(),
                    ..base.pci.clone()
                },
                ..base
            },
            devices,
        )
    }

    fn node() -> Snapshot {
        Snapshot {
            node: Node {
                hostname: "n".into(),
                driver_version: "570.133.20".into(),
                cuda_driver_version: None,
                nvml_version: None,
                machine_type: None,
            },
            gpus: vec![
                gpu(0, "GPU-aaaa", &[]),
                gpu(1, "GPU-bbbb", &[(0, "MIG-b-1", 1), (1, "MIG-b-8", 8)]),
            ],
            topology: Vec::new(),
        }
    }

    fn whole(gpu: u32) -> DeviceKey {
        DeviceKey {
            gpu,
            gpu_instance: None,
        }
    }

    fn instance(gpu: u32, gi: u32) -> DeviceKey {
        DeviceKey {
            gpu,
            gpu_instance: Some(gi),
        }
    }

    /// A device ID and what it should resolve to.
    type Case<'a> = (&'a str, Option<(DeviceKey, Option<&'a str>)>);

    #[test]
    fn every_device_id_form_resolves() {
        let n = node();
        let cases: &[Case<'_>] = &[
            ("GPU-aaaa", Some((whole(0), None))),
            ("GPU-aaaa::3", Some((whole(0), Some("3")))),
            ("MIG-b-8", Some((instance(1, 8), None))),
            ("MIG-b-1::0", Some((instance(1, 1), Some("0")))),
            ("1", Some((whole(1), None))),
            ("0::2", Some((whole(0), Some("2")))),
            ("1:1", Some((instance(1, 8), None))),
            ("nvidia10", Some((whole(0), None))),
            ("nvidia11/gi8", Some((instance(1, 8), None))),
            ("nvidia10/vgpu4", Some((whole(0), Some("4")))),
            ("GPU-ffff", None),
            ("7", None),
            ("1:5", None),
            ("nvidia99", None),
            ("nvidia10/xyz", None),
            ("", None),
        ];
        for (id, want) in cases {
            let got = resolve(id, &n).map(|d| (d.key, d.replica));
            let want = want.map(|(k, r)| (k, r.map(str::to_owned)));
            assert_eq!(got, want, "{id}");
        }
    }

    fn answer(pods: &[(&str, &str, &str, &str, &[&str])]) -> ListPodResourcesResponse {
        ListPodResourcesResponse {
            pod_resources: pods
                .iter()
                .map(|(ns, pod, container, resource, ids)| PodResources {
                    name: (*pod).into(),
                    namespace: (*ns).into(),
                    containers: vec![ContainerResources {
                        name: (*container).into(),
                        devices: vec![ContainerDevices {
                            resource_name: (*resource).into(),
                            device_ids: ids.iter().map(|s| (*s).into()).collect(),
                            topology: None,
                        }],
                        ..Default::default()
                    }],
                    ..Default::default()
                })
                .collect(),
        }
    }

    fn labels(ns: &str, pod: &str, container: &str, vgpu: Option<&str>) -> PodLabels {
        PodLabels {
            namespace: ns.into(),
            pod: pod.into(),
            container: container.into(),
            vgpu: vgpu.map(str::to_owned),
        }
    }

    #[test]
    fn shared_gpu_keeps_every_pod_with_its_replicas() {
        let a = attribute(
            &answer(&[
                ("ml", "train-b", "main", "nvidia.com/gpu", &["GPU-aaaa::7"]),
                (
                    "ml",
                    "train-a",
                    "main",
                    "nvidia.com/gpu",
                    &["GPU-aaaa::10", "GPU-aaaa::2"],
                ),
                (
                    "web",
                    "infer",
                    "srv",
                    "nvidia.com/mig-1g.10gb",
                    &["MIG-b-8"],
                ),
                ("x", "cpu-only", "c", "cpu", &["0"]),
                (
                    "x",
                    "renamed",
                    "c",
                    "nvidia.com/gpu.shared",
                    &["GPU-aaaa::1"],
                ),
            ]),
            &ResourceFilter::default(),
            &node(),
        );
        assert_eq!(
            a.for_device(whole(0)).cloned().collect::<Vec<_>>(),
            [
                labels("ml", "train-a", "main", Some("2,10")),
                labels("ml", "train-b", "main", Some("7")),
            ]
        );
        assert_eq!(
            a.for_device(instance(1, 8)).cloned().collect::<Vec<_>>(),
            [labels("web", "infer", "srv", None)]
        );
        assert_eq!(a.for_device(instance(1, 1)).count(), 0);
        assert_eq!(a.devices(), 2, "cpu and unknown resources are ignored");

        let renamed = attribute(
            &answer(&[(
                "x",
                "renamed",
                "c",
                "nvidia.com/gpu.shared",
                &["GPU-aaaa::1"],
            )]),
            &ResourceFilter {
                extra: vec!["nvidia.com/gpu.shared".into()],
            },
            &node(),
        );
        assert_eq!(
            renamed.for_device(whole(0)).cloned().collect::<Vec<_>>(),
            [labels("x", "renamed", "c", Some("1"))]
        );
    }

    #[test]
    fn a_whole_mig_gpu_counts_for_each_instance() {
        let a = attribute(
            &answer(&[("ns", "p", "c", "nvidia.com/gpu", &["GPU-bbbb"])]),
            &ResourceFilter::default(),
            &node(),
        );
        assert_eq!(a.for_device(instance(1, 1)).count(), 1);
        assert_eq!(a.for_device(instance(1, 8)).count(), 1);
        assert_eq!(a.for_device(whole(0)).count(), 0);
    }
}
