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
//! Devices allocated through Dynamic Resource Allocation come in the answer's
//! `dynamic_resources`: a claim's devices are attributed when their driver is the GPU driver
//! (`gpu.nvidia.com` unless configured) and their pool is this node, and their device name is
//! resolved by [`crate::dra_names::find`] to a whole GPU (`gpu-<minor>`) or a MIG device
//! (`gpu-<minor>-mig-…`). Such a device gets the same `pod`, `namespace` and `container`
//! labels as one from the device plugin, and no other label, so series keep their identity
//! whichever way the GPU was allocated. A name the node does not have (a MIG device already
//! destroyed, another driver's naming) is left out and reported in
//! [`Attribution::unresolved`].
//!
//! Where dcgm-exporter keeps only the last container per device, every container that holds a
//! device is kept: a shared GPU yields one series per pod, told apart by a `vgpu` label that
//! carries the replica number(s) the container holds. A device ID without a replica suffix
//! adds no `vgpu` label, so an unshared GPU looks exactly as it does with dcgm-exporter. A DRA
//! claim shared by several containers or pods (one claim referenced by each, or a device
//! shared between claims) likewise gives each container its own series, without `vgpu`: the
//! containers are told apart by their own labels.

use std::collections::{BTreeMap, BTreeSet};

use crate::dra_names::{self, DraDevice};
use crate::inventory::Snapshot;
use crate::proto::podresources::ListPodResourcesResponse;

/// The resource every NVIDIA GPU is advertised as, unless renamed.
pub const GPU_RESOURCE: &str = "nvidia.com/gpu";
/// The prefix of MIG resources in the device plugin's mixed strategy.
pub const MIG_RESOURCE_PREFIX: &str = "nvidia.com/mig-";
/// The DRA driver whose claimed devices are GPUs, unless configured: NVIDIA's driver name,
/// which gpud's own DRA plugin also uses.
pub const DRA_DRIVER: &str = "gpu.nvidia.com";

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
    /// DRA device names of this node's pool that name no device here.
    unresolved: BTreeSet<String>,
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

    /// The claimed DRA device names, of the GPU driver and this node's pool, that name no
    /// GPU or MIG device of the node; sorted.
    pub fn unresolved(&self) -> &BTreeSet<String> {
        &self.unresolved
    }
}

/// Which resources count as GPUs: `nvidia.com/gpu`, every `nvidia.com/mig-*`, and the extra
/// names given with `--nvidia-resource-names` (renamed or shared resources); and which DRA
/// driver's claimed devices do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceFilter {
    /// Extra resource names.
    pub extra: Vec<String>,
    /// The DRA driver whose devices are GPUs and MIG devices.
    pub dra_driver: String,
}

impl Default for ResourceFilter {
    fn default() -> Self {
        ResourceFilter {
            extra: Vec::new(),
            dra_driver: DRA_DRIVER.to_owned(),
        }
    }
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

/// Attributes every GPU resource and every claimed device of the GPU driver in the kubelet's
/// answer to the devices of this node.
pub fn attribute(
    answer: &ListPodResourcesResponse,
    filter: &ResourceFilter,
    snapshot: &Snapshot,
) -> Attribution {
    let mut holders = Holders::default();
    let mut unresolved = BTreeSet::new();
    for pod in &answer.pod_resources {
        for container in &pod.containers {
            let who = (
                pod.namespace.as_str(),
                pod.name.as_str(),
                container.name.as_str(),
            );
            for devices in &container.devices {
                if !filter.matches(&devices.resource_name) {
                    continue;
                }
                for device in devices
                    .device_ids
                    .iter()
                    .filter_map(|id| resolve(id, snapshot))
                {
                    holders.add(device, who);
                }
            }
            let claimed = container
                .dynamic_resources
                .iter()
                .flat_map(|claim| &claim.claim_resources)
                .filter(|r| {
                    r.driver_name == filter.dra_driver && r.pool_name == snapshot.node.hostname
                });
            for resource in claimed {
                match dra_names::find(snapshot, &resource.device_name) {
                    Some(device) => holders.add(
                        DeviceRef {
                            key: dra_key(device),
                            replica: None,
                        },
                        who,
                    ),
                    None => {
                        unresolved.insert(resource.device_name.clone());
                    }
                }
            }
        }
    }
    Attribution {
        by_device: holders.into_labels(),
        unresolved,
    }
}

/// The series a DRA device is reported under.
fn dra_key(device: DraDevice<'_>) -> DeviceKey {
    DeviceKey {
        gpu: device.gpu().index,
        gpu_instance: match device {
            DraDevice::Gpu(_) => None,
            DraDevice::Mig(_, mig) => Some(mig.gpu_instance_id),
        },
    }
}

/// (namespace, pod, container).
type Container<'a> = (&'a str, &'a str, &'a str);

/// Who holds which device, and which replicas of it, while an answer is read.
#[derive(Default)]
struct Holders<'a> {
    /// (device, container) → replicas held; `None` while the container holds it unshared.
    held: BTreeMap<(DeviceKey, Container<'a>), Option<Vec<String>>>,
}

impl<'a> Holders<'a> {
    fn add(&mut self, device: DeviceRef, who: Container<'a>) {
        let held = self.held.entry((device.key, who)).or_default();
        if let Some(replica) = device.replica {
            let replicas = held.get_or_insert_with(Vec::new);
            if !replicas.contains(&replica) {
                replicas.push(replica);
            }
        }
    }

    fn into_labels(self) -> BTreeMap<DeviceKey, Vec<PodLabels>> {
        let mut by_device: BTreeMap<DeviceKey, Vec<PodLabels>> = BTreeMap::new();
        for ((key, (namespace, pod, container)), replicas) in self.held {
            let vgpu = replicas.map(|mut replicas| {
                replicas.sort_by(|a, b| natural(a).cmp(&natural(b)).then_with(|| a.cmp(b)));
                replicas.join(",")
            });
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
        by_device
    }
}

/// Sort key that orders numeric replica ids numerically.
fn natural(s: &str) -> (u64, usize) {
    (s.parse().unwrap_or(u64::MAX), s.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inventory::model::{Gpu, MigDevice, Pci, Placement};
    use crate::inventory::test_support;
    use crate::proto::podresources::{
        ClaimResource, ContainerDevices, ContainerResources, DynamicResource, PodResources,
    };

    /// A GPU whose minor number is its index + 10; its 1g.10gb MIG devices (GI profile 19)
    /// are placed at their GPU-instance id.
    fn gpu(index: u32, uuid: &str, migs: &[(u32, &str, u32)]) -> Gpu {
        let base = test_support::gpu(index, uuid, "NVIDIA A100-SXM4-80GB", 81920);
        let devices = migs
            .iter()
            .map(|&(mig_index, uuid, gi)| MigDevice {
                placement: Some(Placement { start: gi, size: 1 }),
                gpu_instance_profile_id: Some(19),
                ..test_support::mig(mig_index, uuid, gi, 0)
            })
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
        test_support::snapshot(vec![
            gpu(0, "GPU-aaaa", &[]),
            gpu(1, "GPU-bbbb", &[(0, "MIG-b-1", 1), (1, "MIG-b-8", 8)]),
        ])
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
                ..ResourceFilter::default()
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

    /// One container per holder, each holding the named devices of one claim:
    /// (namespace, pod, container, claim, [(driver, pool, device)]).
    type ClaimHolder<'a> = (
        &'a str,
        &'a str,
        &'a str,
        &'a str,
        &'a [(&'a str, &'a str, &'a str)],
    );

    fn claims(holders: &[ClaimHolder<'_>]) -> ListPodResourcesResponse {
        ListPodResourcesResponse {
            pod_resources: holders
                .iter()
                .map(|(ns, pod, container, claim, devices)| PodResources {
                    name: (*pod).into(),
                    namespace: (*ns).into(),
                    containers: vec![ContainerResources {
                        name: (*container).into(),
                        dynamic_resources: vec![DynamicResource {
                            claim_name: (*claim).into(),
                            claim_namespace: (*ns).into(),
                            claim_resources: devices
                                .iter()
                                .map(|(driver, pool, device)| ClaimResource {
                                    cdi_devices: Vec::new(),
                                    driver_name: (*driver).into(),
                                    pool_name: (*pool).into(),
                                    device_name: (*device).into(),
                                    share_id: None,
                                })
                                .collect(),
                        }],
                        ..Default::default()
                    }],
                    ..Default::default()
                })
                .collect(),
        }
    }

    #[test]
    fn dra_devices_of_the_gpu_driver_and_this_pool_resolve_by_name() {
        let mut answer = claims(&[
            // One claim shared by two pods: each gets the series.
            (
                "ml",
                "a",
                "main",
                "shared",
                &[("gpu.nvidia.com", "n", "gpu-10")],
            ),
            (
                "ml",
                "b",
                "main",
                "shared",
                &[("gpu.nvidia.com", "n", "gpu-10")],
            ),
            (
                "web",
                "infer",
                "srv",
                "small",
                &[
                    ("gpu.nvidia.com", "n", "gpu-11-mig-1g10gb-19-8"),
                    // Another node's pool and another driver: not this node's GPUs.
                    ("gpu.nvidia.com", "m", "gpu-11-mig-1g10gb-19-1"),
                    ("other.example.com", "n", "gpu-11-mig-1g10gb-19-1"),
                    // A MIG-enabled GPU is no DRA device; and a name nothing has.
                    ("gpu.nvidia.com", "n", "gpu-11"),
                    ("gpu.nvidia.com", "n", "gpu-99"),
                ],
            ),
        ]);
        // A device-plugin allocation in the same answer, on the same GPU as the claim.
        answer.pod_resources.extend(
            super::tests::answer(&[("ml", "dp", "c", "nvidia.com/gpu", &["GPU-aaaa"])])
                .pod_resources,
        );
        let a = attribute(&answer, &ResourceFilter::default(), &node());
        assert_eq!(
            a.for_device(whole(0)).cloned().collect::<Vec<_>>(),
            [
                labels("ml", "a", "main", None),
                labels("ml", "b", "main", None),
                labels("ml", "dp", "c", None),
            ]
        );
        assert_eq!(
            a.for_device(instance(1, 8)).cloned().collect::<Vec<_>>(),
            [labels("web", "infer", "srv", None)]
        );
        assert_eq!(a.for_device(instance(1, 1)).count(), 0);
        assert_eq!(a.devices(), 2);
        assert_eq!(
            a.unresolved().iter().collect::<Vec<_>>(),
            ["gpu-11", "gpu-99"]
        );
    }

    #[test]
    fn the_dra_driver_name_is_configurable() {
        let answer = claims(&[(
            "ml",
            "p",
            "c",
            "claim",
            &[
                ("gpu.nvidia.com", "n", "gpu-10"),
                ("gpu.example.com", "n", "gpu-11-mig-1g10gb-19-1"),
            ],
        )]);
        let filter = ResourceFilter {
            dra_driver: "gpu.example.com".into(),
            ..ResourceFilter::default()
        };
        let a = attribute(&answer, &filter, &node());
        assert_eq!(a.for_device(whole(0)).count(), 0);
        assert_eq!(
            a.for_device(instance(1, 1)).cloned().collect::<Vec<_>>(),
            [labels("ml", "p", "c", None)]
        );
        assert!(a.unresolved().is_empty());
    }
}
