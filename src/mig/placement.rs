//! The placement solver: where every GPU instance of a layout goes, decided before the GPU is
//! touched.
//!
//! The driver places an instance created without a placement greedily (the highest free
//! slot), which is why some orders fail where others succeed; mig-parted retries orders
//! against the driver. Here the search runs on the GPU's own placement table instead: an exact
//! backtracking search over the 8 memory slices, so a layout is either placed completely, with
//! every instance's start slice known, or proven not to fit before anything is destroyed.

use std::collections::BTreeMap;

use crate::mig_config::profile::ProfileName;
use crate::nvml::mig_admin::{GiProfile, MigGpu, ci_enum, ci_fits};

/// A GPU instance as a layout wants it: its profile and its compute instances' slices.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Shape {
    pub profile_id: u32,
    /// Compute slices of each compute instance, largest first.
    pub compute: Vec<u32>,
}

/// One GPU instance with its place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placed {
    pub profile_id: u32,
    pub start: u32,
    pub size: u32,
}

/// Turns a config's profile counts into GPU instances for `gpu`: a full-size device is one
/// GPU instance; smaller compute instances of the same GPU-instance profile share GPU
/// instances, packed largest first.
pub fn shapes(gpu: &MigGpu, wanted: &BTreeMap<String, u32>) -> Result<Vec<Shape>, String> {
    let mut shapes = Vec::new();
    let mut partial: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    for (name, &count) in wanted {
        let parsed = ProfileName::parse(name)?;
        let profile = find_profile(gpu, &parsed)?;
        let c = parsed.compute_slices();
        if !ci_fits(c, profile.slices) || ci_enum(c).is_none() {
            return Err(format!(
                "{name}: a {c}-slice compute instance does not fit a {}-slice GPU instance",
                profile.slices
            ));
        }
        if c == profile.slices {
            shapes.extend((0..count).map(|_| Shape {
                profile_id: profile.id,
                compute: vec![c],
            }));
        } else {
            partial
                .entry(profile.id)
                .or_default()
                .extend(std::iter::repeat_n(c, count as usize));
        }
    }
    for (profile_id, mut slices) in partial {
        let capacity = gpu.profile(profile_id).map_or(0, |p| p.slices);
        slices.sort_unstable_by(|a, b| b.cmp(a));
        let mut bins: Vec<Vec<u32>> = Vec::new();
        for c in slices {
            match bins
                .iter_mut()
                .find(|bin| bin.iter().sum::<u32>() + c <= capacity)
            {
                Some(bin) => bin.push(c),
                None => bins.push(vec![c]),
            }
        }
        shapes.extend(bins.into_iter().map(|compute| Shape {
            profile_id,
            compute,
        }));
    }
    shapes.sort();
    Ok(shapes)
}

fn find_profile<'a>(gpu: &'a MigGpu, name: &ProfileName) -> Result<&'a GiProfile, String> {
    let gi_name = name.gpu_instance();
    gpu.profiles
        .iter()
        .find(|p| p.name == gi_name)
        .ok_or_else(|| {
            let offered: Vec<&str> = gpu.profiles.iter().map(|p| p.name.as_str()).collect();
            format!(
                "{name}: GPU {} ({}) has no {gi_name} profile (it offers {})",
                gpu.index,
                gpu.name,
                offered.join(", ")
            )
        })
}

/// Compute slices of the whole GPU (7 on every MIG GPU so far).
fn compute_capacity(gpu: &MigGpu) -> u32 {
    gpu.profiles.iter().map(|p| p.slices).max().unwrap_or(0)
}

fn mask(start: u32, size: u32) -> u32 {
    ((1u32 << size) - 1) << start
}

/// Places `wanted` (GPU-instance profile ids) next to the instances in `fixed`, or `None` when
/// no arrangement exists. Exact: every combination of placements is considered.
pub fn solve(gpu: &MigGpu, fixed: &[Placed], wanted: &[u32]) -> Option<Vec<Placed>> {
    let mut items: Vec<&GiProfile> = wanted
        .iter()
        .map(|&id| gpu.profile(id))
        .collect::<Option<_>>()?;
    // Most constrained first: large instances, then those with few places.
    items.sort_by_key(|p| (std::cmp::Reverse(p.memory_slices), p.placements.len(), p.id));
    let mut counts: BTreeMap<u32, u32> = BTreeMap::new();
    for f in fixed {
        *counts.entry(f.profile_id).or_insert(0) += 1;
    }
    for p in &items {
        let n = counts.entry(p.id).or_insert(0);
        *n += 1;
        if *n > p.max {
            return None;
        }
    }
    let used_compute: u32 = fixed
        .iter()
        .filter_map(|f| gpu.profile(f.profile_id))
        .map(|p| p.slices)
        .sum::<u32>()
        + items.iter().map(|p| p.slices).sum::<u32>();
    if used_compute > compute_capacity(gpu) {
        return None;
    }
    let occupied = fixed.iter().fold(0, |m, f| m | mask(f.start, f.size));
    let mut out = Vec::with_capacity(items.len());
    search(&items, occupied, &mut out).then_some(out)
}

fn search(items: &[&GiProfile], occupied: u32, out: &mut Vec<Placed>) -> bool {
    let Some((first, rest)) = items.split_first() else {
        return true;
    };
    // Instances of one profile are interchangeable: place them in increasing start order.
    let floor = out
        .iter()
        .rev()
        .find(|p| p.profile_id == first.id)
        .map_or(0, |p| p.start + 1);
    for &start in first.placements.iter().filter(|&&s| s >= floor) {
        let m = mask(start, first.memory_slices);
        if occupied & m != 0 {
            continue;
        }
        out.push(Placed {
            profile_id: first.id,
            start,
            size: first.memory_slices,
        });
        if search(rest, occupied | m, out) {
            return true;
        }
        out.pop();
    }
    false
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::nvml::mig_admin::MigMode;

    fn profile(
        enum_value: u32,
        id: u32,
        name: &str,
        slices: u32,
        mem: u32,
        max: u32,
        placements: &[u32],
    ) -> GiProfile {
        GiProfile {
            enum_value,
            id,
            name: name.into(),
            slices,
            memory_slices: mem,
            max,
            memory_mib: 0,
            placements: placements.to_vec(),
        }
    }

    /// An A100-SXM4-40GB as NVML describes it.
    pub(crate) fn a100_40gb() -> MigGpu {
        MigGpu {
            index: 0,
            uuid: "GPU-0".into(),
            name: "NVIDIA A100-SXM4-40GB".into(),
            pci_bus_id: "00000000:07:00.0".into(),
            pci_device_id: 0x20B0_10DE,
            pci_subsystem_id: 0x134F_10DE,
            mode: Some(MigMode {
                current: true,
                pending: true,
            }),
            profiles: vec![
                profile(0, 19, "1g.5gb", 1, 1, 7, &[0, 1, 2, 3, 4, 5, 6]),
                profile(1, 14, "2g.10gb", 2, 2, 3, &[0, 2, 4]),
                profile(2, 9, "3g.20gb", 3, 4, 2, &[0, 4]),
                profile(3, 5, "4g.20gb", 4, 4, 1, &[0]),
                profile(4, 0, "7g.40gb", 7, 8, 1, &[0]),
                profile(7, 20, "1g.5gb+me", 1, 1, 1, &[0, 1, 2, 3, 4, 5, 6]),
                profile(9, 15, "1g.10gb", 1, 2, 4, &[0, 2, 4, 6]),
            ],
            instances: Vec::new(),
            processes: Vec::new(),
        }
    }

    #[test]
    fn the_order_the_driver_gets_wrong_is_placed() {
        // nvidia-smi mig -cgi 19,19,14,9 fails on a real A100; any order places here.
        let gpu = a100_40gb();
        let placed = solve(&gpu, &[], &[19, 19, 14, 9]).unwrap();
        let starts: Vec<(u32, u32)> = placed.iter().map(|p| (p.profile_id, p.start)).collect();
        assert_eq!(starts, vec![(9, 4), (14, 0), (19, 2), (19, 3)]);
        let occupied = placed.iter().fold(0, |m, p| {
            assert_eq!(m & mask(p.start, p.size), 0, "overlap");
            m | mask(p.start, p.size)
        });
        assert_eq!(occupied, 0b1111_1111);
    }

    #[test]
    fn infeasible_layouts_are_proven_so() {
        let gpu = a100_40gb();
        // Two 3g and a 1g: 7 compute slices but 9 memory slices.
        assert_eq!(solve(&gpu, &[], &[9, 9, 19]), None);
        // Two 4g: over the per-profile maximum.
        assert_eq!(solve(&gpu, &[], &[5, 5]), None);
        // 7 x 1g plus a 2g: over 7 compute slices.
        assert_eq!(solve(&gpu, &[], &[19, 19, 19, 19, 19, 19, 19, 14]), None);
        // 4g + 3g fills the GPU.
        assert!(solve(&gpu, &[], &[5, 9]).is_some());
        // Next to a 3g at 0, a 4g (only at 0) cannot go.
        let fixed = [Placed {
            profile_id: 9,
            start: 0,
            size: 4,
        }];
        assert_eq!(solve(&gpu, &fixed, &[5]), None);
        assert_eq!(
            solve(&gpu, &fixed, &[9]),
            Some(vec![Placed {
                profile_id: 9,
                start: 4,
                size: 4
            }])
        );
    }

    #[test]
    fn shapes_pack_compute_instances() {
        let gpu = a100_40gb();
        let wanted: BTreeMap<String, u32> =
            [("1c.3g.20gb".to_string(), 4), ("2g.10gb".to_string(), 1)]
                .into_iter()
                .collect();
        assert_eq!(
            shapes(&gpu, &wanted).unwrap(),
            vec![
                Shape {
                    profile_id: 9,
                    compute: vec![1]
                },
                Shape {
                    profile_id: 9,
                    compute: vec![1, 1, 1]
                },
                Shape {
                    profile_id: 14,
                    compute: vec![2]
                },
            ]
        );
        let bad: BTreeMap<String, u32> = [("1g.10gb+me".to_string(), 1)].into_iter().collect();
        assert_eq!(
            shapes(&gpu, &bad).unwrap_err(),
            "1g.10gb+me: GPU 0 (NVIDIA A100-SXM4-40GB) has no 1g.10gb+me profile (it offers \
             1g.5gb, 2g.10gb, 3g.20gb, 4g.20gb, 7g.40gb, 1g.5gb+me, 1g.10gb)"
        );
    }
}
