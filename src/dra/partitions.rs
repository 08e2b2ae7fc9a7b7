//! Dynamic MIG in the slices (partitionable devices, KEP-4815): each GPU gpud partitions on
//! demand is a counter set and devices consuming it, with NVIDIA's names so that tools reading
//! the counters (Kueue) see what they see with NVIDIA's driver:
//!
//! | what | name | counters |
//! |---|---|---|
//! | counter set | `gpu-<minor>-counter-set` | `memory` (the GPU's), `memory-slice-<i>` = 1 for each memory slice |
//! | whole GPU | `gpu-<minor>` | all of them |
//! | a placement of a MIG profile | `gpu-<minor>-mig-<profile>-<GI profile id>-<start>` | the profile's `memory`, `memory-slice-<i>` for the slices it covers |
//!
//! The scheduler never lets devices together consume more than a counter holds, so it never
//! gives two overlapping placements, nor the whole GPU beside a MIG device. A placement whose
//! instance exists (prepared for a claim) carries its UUID and its own health; the others
//! carry the GPU's attributes with `type`=`mig`, its `profile` and `parentUUID`. Every device
//! of a counter set carries its GPU's taints ([`super::taints`]): a sick GPU takes all of them
//! out of scheduling, a sick instance only itself.
//!
//! Where counter sets go depends on the API server ([`ServedFields`]): in the slice of their
//! devices before Kubernetes 1.35 (one GPU per slice), in slices of their own from 1.35. An API
//! server without partitionable devices gets each such GPU as a whole GPU only: placements
//! without counters would let the scheduler give overlapping ones.

use std::collections::BTreeMap;

use super::api_version::ServedFields;
use super::objects::{Attribute, Capacity, Counter, CounterConsumption, CounterSet, Device};
use super::objects::{Pool, SliceSpec};
use super::slices::{self, MAX_DEVICES_WITH_TAINTS, binary_quantity};
use super::topology::Topology;
use crate::dra_names::{self, DraDevice};
use crate::inventory::Snapshot;
use crate::inventory::model::Gpu;
use crate::nvml::mig_admin::GiProfile;

/// Most counter sets in one slice.
pub const MAX_COUNTER_SETS: usize = 8;
/// Most counters, all sets together, in one slice.
pub const MAX_COUNTERS: usize = 32;

const MIB: u64 = 1024 * 1024;

/// The GPUs partitioned on demand, by UUID, with the GPU-instance profiles each offers.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DynamicGpus {
    pub profiles: BTreeMap<String, Vec<GiProfile>>,
}

impl DynamicGpus {
    /// Whether GPU `uuid` is partitioned on demand.
    pub fn contains(&self, uuid: &str) -> bool {
        self.profiles.contains_key(uuid)
    }

    /// The placement device `name` on `gpu`: its profile and first memory slice.
    pub fn placement<'a>(&'a self, gpu: &Gpu, name: &str) -> Option<(&'a GiProfile, u32)> {
        let profiles = self.profiles.get(&gpu.uuid)?;
        profiles.iter().find_map(|profile| {
            profile
                .placements
                .iter()
                .find(|&&start| {
                    dra_names::placement_name(gpu, &profile.name, profile.id, start) == name
                })
                .map(|&start| (profile, start))
        })
    }
}

/// One partitioned GPU in the slices: its counter set and its devices.
#[derive(Debug, Clone, PartialEq)]
pub struct Group {
    pub counter_set: CounterSet,
    pub devices: Vec<Device>,
}

/// The node's devices: those of GPUs published as before, and one group per partitioned GPU
/// (none when the server keeps no counters: those GPUs are then whole GPUs among the others).
pub fn layout(
    snapshot: &Snapshot,
    driver: &str,
    topology: &Topology,
    dynamic: &DynamicGpus,
    served: ServedFields,
) -> (Vec<Device>, Vec<Group>) {
    let mut plain = Vec::new();
    let mut groups = Vec::new();
    for (name, found) in dra_names::devices(snapshot) {
        if !dynamic.contains(&found.gpu().uuid) {
            plain.push(slices::device(snapshot, driver, topology, name, &found));
        }
    }
    for gpu in snapshot.gpus.iter().filter(|g| dynamic.contains(&g.uuid)) {
        let whole = slices::device(
            snapshot,
            driver,
            topology,
            dra_names::gpu_name(gpu),
            &DraDevice::Gpu(gpu),
        );
        if !served.counters {
            plain.push(whole);
            continue;
        }
        let profiles = dynamic
            .profiles
            .get(&gpu.uuid)
            .map_or(&[][..], Vec::as_slice);
        groups.push(group(snapshot, driver, topology, gpu, profiles, whole));
    }
    (plain, groups)
}

fn group(
    snapshot: &Snapshot,
    driver: &str,
    topology: &Topology,
    gpu: &Gpu,
    profiles: &[GiProfile],
    mut whole: Device,
) -> Group {
    let set = dra_names::counter_set_name(gpu);
    let memory_slices = profiles
        .iter()
        .flat_map(|p| p.placements.iter().map(move |s| s + p.memory_slices))
        .max()
        .unwrap_or(0);
    let all = counters(gpu.memory_mib, 0..memory_slices);
    whole.consumes_counters = vec![CounterConsumption {
        counter_set: set.clone(),
        counters: all.clone(),
    }];
    let mut devices = vec![whole.clone()];
    let mut ordered: Vec<&GiProfile> = profiles.iter().collect();
    ordered.sort_by_key(|p| (p.memory_slices, p.slices, p.id));
    for profile in ordered {
        for &start in &profile.placements {
            let name = dra_names::placement_name(gpu, &profile.name, profile.id, start);
            let made = gpu.mig.devices.iter().find(|mig| {
                gpu.mig.enabled && dra_names::mig_name(gpu, mig).as_deref() == Some(&name)
            });
            let mut device = match made {
                Some(mig) => {
                    slices::device(snapshot, driver, topology, name, &DraDevice::Mig(gpu, mig))
                }
                None => unmade(&whole, name, gpu, profile, start),
            };
            device.consumes_counters = vec![CounterConsumption {
                counter_set: set.clone(),
                counters: counters(profile.memory_mib, start..start + profile.memory_slices),
            }];
            devices.push(device);
        }
    }
    if devices.len() > MAX_DEVICES_WITH_TAINTS {
        tracing::warn!(gpu = %gpu.uuid, placements = devices.len() - 1, "More MIG placements than a slice holds; publishing the first ones");
        devices.truncate(MAX_DEVICES_WITH_TAINTS);
    }
    Group {
        counter_set: CounterSet {
            name: set,
            counters: all,
        },
        devices,
    }
}

/// `memory` of `memory_mib` and one `memory-slice-<i>` per slice of `slices`.
fn counters(memory_mib: u64, slices: std::ops::Range<u32>) -> BTreeMap<String, Counter> {
    let mut out = BTreeMap::new();
    out.insert(
        "memory".to_owned(),
        Counter {
            value: binary_quantity(memory_mib * MIB),
        },
    );
    for slice in slices {
        out.insert(
            format!("memory-slice-{slice}"),
            Counter { value: "1".into() },
        );
    }
    out
}

/// A placement not made yet: its GPU's attributes, as a MIG device of `profile`.
fn unmade(whole: &Device, name: String, gpu: &Gpu, profile: &GiProfile, start: u32) -> Device {
    let mut attributes = whole.attributes.clone();
    attributes.remove("uuid");
    attributes.insert("type".into(), Attribute::String("mig".into()));
    attributes.insert("parentUUID".into(), Attribute::String(gpu.uuid.clone()));
    attributes.insert("profile".into(), Attribute::String(profile.name.clone()));
    let mut capacity = BTreeMap::new();
    capacity.insert(
        "memory".to_owned(),
        Capacity::of(binary_quantity(profile.memory_mib * MIB)),
    );
    for slice in start..start + profile.memory_slices {
        capacity.insert(format!("memorySlice{slice}"), Capacity::of("1".into()));
    }
    Device {
        name,
        attributes,
        capacity,
        taints: whole.taints.clone(),
        ..Device::default()
    }
}

/// The slice specs of pool `node` at `generation`: the plain devices as [`slices::specs`]
/// splits them, then the groups in the shape `served` asks for.
pub fn specs(
    driver: &str,
    node: &str,
    plain: Vec<Device>,
    groups: Vec<Group>,
    generation: i64,
    served: ServedFields,
) -> Vec<SliceSpec> {
    if groups.is_empty() {
        return slices::specs(driver, node, plain, generation);
    }
    let mut out = if plain.is_empty() {
        Vec::new()
    } else {
        slices::specs(driver, node, plain, generation)
    };
    let spec = |devices: Vec<Device>, shared_counters: Vec<CounterSet>| SliceSpec {
        driver: driver.to_owned(),
        pool: Pool {
            name: node.to_owned(),
            generation,
            resource_slice_count: 0,
        },
        node_name: node.to_owned(),
        devices,
        shared_counters,
    };
    if served.counters_in_own_slices {
        let mut sets: Vec<Vec<CounterSet>> = Vec::new();
        let mut devices: Vec<Vec<Device>> = Vec::new();
        for group in groups {
            let fits = sets.last().is_some_and(|last| {
                last.len() < MAX_COUNTER_SETS
                    && last.iter().map(|s| s.counters.len()).sum::<usize>()
                        + group.counter_set.counters.len()
                        <= MAX_COUNTERS
            });
            match sets.last_mut() {
                Some(last) if fits => last.push(group.counter_set),
                _ => sets.push(vec![group.counter_set]),
            }
            match devices.last_mut() {
                Some(last) if last.len() + group.devices.len() <= MAX_DEVICES_WITH_TAINTS => {
                    last.extend(group.devices);
                }
                _ => devices.push(group.devices),
            }
        }
        out.extend(sets.into_iter().map(|s| spec(Vec::new(), s)));
        out.extend(devices.into_iter().map(|d| spec(d, Vec::new())));
    } else {
        out.extend(
            groups
                .into_iter()
                .map(|g| spec(g.devices, vec![g.counter_set])),
        );
    }
    let count = i64::try_from(out.len()).unwrap_or(i64::MAX);
    for slice in &mut out {
        slice.pool.resource_slice_count = count;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inventory::test_support::{gpu, snapshot};

    fn profile(name: &str, id: u32, memory_slices: u32, mib: u64, starts: &[u32]) -> GiProfile {
        GiProfile {
            enum_value: 0,
            id,
            name: name.into(),
            slices: memory_slices.min(7),
            memory_slices,
            max: u32::try_from(starts.len()).unwrap(),
            memory_mib: mib,
            placements: starts.to_vec(),
        }
    }

    fn node(gpus: usize) -> (Snapshot, DynamicGpus) {
        let snapshot = snapshot(
            (0..gpus)
                .map(|i| gpu(i as u32, &format!("GPU-{i}"), "NVIDIA H100", 81920))
                .collect(),
        );
        let profiles = vec![
            profile("7g.80gb", 0, 8, 80896, &[0]),
            profile("3g.40gb", 9, 4, 40448, &[0, 4]),
            profile("1g.10gb", 19, 1, 9856, &[0, 1, 2, 3, 4, 5, 6]),
        ];
        let dynamic = DynamicGpus {
            profiles: snapshot
                .gpus
                .iter()
                .skip(1)
                .map(|g| (g.uuid.clone(), profiles.clone()))
                .collect(),
        };
        (snapshot, dynamic)
    }

    #[test]
    fn a_partitioned_gpu_is_a_counter_set_its_whole_self_and_every_placement() {
        let (snapshot, dynamic) = node(2);
        let (plain, groups) = layout(
            &snapshot,
            "d",
            &Topology::default(),
            &dynamic,
            ServedFields::ALL,
        );
        assert_eq!(plain.len(), 1);
        assert_eq!(plain[0].name, "gpu-0");
        assert!(plain[0].consumes_counters.is_empty());
        let group = &groups[0];
        assert_eq!(group.counter_set.name, "gpu-1-counter-set");
        assert_eq!(group.counter_set.counters.len(), 9);
        assert_eq!(group.counter_set.counters["memory"].value, "80Gi");
        let names: Vec<&str> = group.devices.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(
            names[..3],
            ["gpu-1", "gpu-1-mig-1g10gb-19-0", "gpu-1-mig-1g10gb-19-1"]
        );
        assert_eq!(names.len(), 1 + 7 + 2 + 1);
        assert_eq!(
            names[8..],
            [
                "gpu-1-mig-3g40gb-9-0",
                "gpu-1-mig-3g40gb-9-4",
                "gpu-1-mig-7g80gb-0-0"
            ]
        );
        assert_eq!(
            group.devices[0].consumes_counters[0].counters,
            group.counter_set.counters
        );
        let upper = &group.devices[9];
        let used: Vec<&str> = upper.consumes_counters[0]
            .counters
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(
            used,
            [
                "memory",
                "memory-slice-4",
                "memory-slice-5",
                "memory-slice-6",
                "memory-slice-7"
            ]
        );
        assert_eq!(upper.attributes["type"], Attribute::String("mig".into()));
        assert_eq!(
            upper.attributes["profile"],
            Attribute::String("3g.40gb".into())
        );
        assert!(!upper.attributes.contains_key("uuid"));
        assert_eq!(
            dynamic
                .placement(&snapshot.gpus[1], "gpu-1-mig-3g40gb-9-4")
                .map(|(p, s)| (p.id, s)),
            Some((9, 4))
        );
        assert_eq!(
            dynamic.placement(&snapshot.gpus[1], "gpu-1-mig-3g40gb-9-2"),
            None
        );
    }

    #[test]
    fn counter_sets_go_with_their_devices_before_1_35_and_apart_after() {
        let (snapshot, dynamic) = node(5);
        let built = |served| {
            let (plain, groups) = layout(&snapshot, "d", &Topology::default(), &dynamic, served);
            specs("d", "n", plain, groups, 3, served)
        };
        let shape = |slices: &[SliceSpec]| -> Vec<(usize, usize)> {
            slices
                .iter()
                .map(|s| (s.devices.len(), s.shared_counters.len()))
                .collect()
        };
        let old = ServedFields {
            counters_in_own_slices: false,
            ..ServedFields::ALL
        };
        let same = built(old);
        assert_eq!(shape(&same), [(1, 0), (11, 1), (11, 1), (11, 1), (11, 1)]);
        let apart = built(ServedFields::ALL);
        // 9 counters a set: three sets fit 32 counters.
        assert_eq!(shape(&apart), [(1, 0), (0, 3), (0, 1), (44, 0)]);
        assert!(
            apart
                .iter()
                .all(|s| s.pool.resource_slice_count == 4 && s.pool.generation == 3)
        );
        let none = ServedFields::NONE;
        let whole = built(none);
        assert_eq!(shape(&whole), [(5, 0)]);
        assert!(
            whole[0]
                .devices
                .iter()
                .all(|d| d.consumes_counters.is_empty())
        );
    }
}
