//! The MIG state of one GPU (mode, GPU instances, compute instances) and the rules for changing
//! it: placement, capacity and id assignment as the driver enforces them.
//!
//! This is pure data plus logic, with no handles or locking, so it is shared by the fixture
//! loader (initial instances), the state file (persistence) and the write-side exports.

use serde::{Deserialize, Serialize};

use crate::ffi::{Res, rc};
use crate::profiles::{self, COMPUTE_SLICES, CiProfile, GiProfile, MigTable};
use nvml_wrapper_sys::bindings::{NVML_DEVICE_MIG_DISABLE, NVML_DEVICE_MIG_ENABLE};

/// A `(start, size)` pair: memory slices for a GI, compute slices of the GI for a CI.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Placement {
    pub start: u32,
    pub size: u32,
}

impl Placement {
    fn overlaps(&self, other: &Placement) -> bool {
        self.start < other.start + other.size && other.start < self.start + self.size
    }
}

/// A compute instance inside a GPU instance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ComputeInstance {
    pub id: u32,
    /// The CI profile id (equal to its `NVML_COMPUTE_INSTANCE_PROFILE_*` value).
    pub profile_id: u32,
    pub placement: Placement,
}

/// A GPU instance and its compute instances.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuInstance {
    pub id: u32,
    /// The GI profile id (`info.id`, e.g. 9 for 3g).
    pub profile_id: u32,
    pub placement: Placement,
    #[serde(default)]
    pub compute_instances: Vec<ComputeInstance>,
}

/// Everything MIG-related that can change at run time on one GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MigState {
    /// `NVML_DEVICE_MIG_ENABLE` or `NVML_DEVICE_MIG_DISABLE`.
    pub current: u32,
    /// The mode that takes effect at the next GPU reset.
    pub pending: u32,
    #[serde(default)]
    pub gpu_instances: Vec<GpuInstance>,
}

impl Default for MigState {
    fn default() -> Self {
        MigState {
            current: NVML_DEVICE_MIG_DISABLE,
            pending: NVML_DEVICE_MIG_DISABLE,
            gpu_instances: Vec::new(),
        }
    }
}

/// The GI profile behind a profile id, or `INVALID_ARGUMENT` for ids the GPU does not have.
fn gi_profile(table: &MigTable, profile_id: u32) -> Res<&GiProfile> {
    table.by_id(profile_id).ok_or(rc::INVALID_ARGUMENT)
}

/// The CI profile `ci_profile_id` inside a GI of profile `gi`: out-of-range values are invalid,
/// values the GI does not offer are not supported (how NVML distinguishes the two).
pub fn ci_profile_in(table: &MigTable, gi: &GiProfile, ci_profile_id: u32) -> Res<CiProfile> {
    if ci_profile_id >= profiles::CI_PROFILE_ENUM_COUNT {
        return Err(rc::INVALID_ARGUMENT);
    }
    profiles::ci_profile(table, gi, ci_profile_id).ok_or(rc::NOT_SUPPORTED)
}

impl MigState {
    /// Whether MIG is currently on.
    pub fn enabled(&self) -> bool {
        self.current == NVML_DEVICE_MIG_ENABLE
    }

    pub fn gi(&self, id: u32) -> Option<&GpuInstance> {
        self.gpu_instances.iter().find(|g| g.id == id)
    }

    fn gi_mut(&mut self, id: u32) -> Option<&mut GpuInstance> {
        self.gpu_instances.iter_mut().find(|g| g.id == id)
    }

    pub fn ci(&self, gi: u32, ci: u32) -> Option<&ComputeInstance> {
        self.gi(gi)?.compute_instances.iter().find(|c| c.id == ci)
    }

    /// The MIG devices (one per CI) in NVML's enumeration order: by GI id, then CI id.
    pub fn mig_devices(&self) -> Vec<(u32, u32)> {
        let mut out: Vec<(u32, u32)> = self
            .gpu_instances
            .iter()
            .flat_map(|g| g.compute_instances.iter().map(move |c| (g.id, c.id)))
            .collect();
        out.sort_unstable();
        out
    }

    /// Creates a GI. Without a placement the driver takes the highest free one, which is why
    /// `-cgi 19,19,14,9` fails on a real A100 while `-cgi 9,19,14,19` succeeds.
    pub fn create_gi(&mut self, table: &MigTable, profile_id: u32, start: Option<u32>) -> Res<u32> {
        if !self.enabled() {
            return Err(rc::NOT_SUPPORTED);
        }
        let profile = gi_profile(table, profile_id)?;
        if let Some(s) = start
            && !profile.starts.contains(&s)
        {
            return Err(rc::INVALID_ARGUMENT);
        }
        let same = self
            .gpu_instances
            .iter()
            .filter(|g| g.profile_id == profile_id)
            .count();
        let used: u32 = self
            .gpu_instances
            .iter()
            .filter_map(|g| table.by_id(g.profile_id))
            .map(|p| p.slices)
            .sum();
        if same as u32 >= profile.instances || used + profile.slices > COMPUTE_SLICES {
            return Err(rc::INSUFFICIENT_RESOURCES);
        }
        let free = |s: u32| {
            let want = Placement {
                start: s,
                size: profile.memory_slices,
            };
            !self
                .gpu_instances
                .iter()
                .any(|g| g.placement.overlaps(&want))
        };
        let start = match start {
            Some(s) if free(s) => s,
            Some(_) => return Err(rc::INSUFFICIENT_RESOURCES),
            None => profile
                .starts
                .iter()
                .rev()
                .copied()
                .find(|s| free(*s))
                .ok_or(rc::INSUFFICIENT_RESOURCES)?,
        };
        let preferred = profiles::preferred_gi_id(profile, start);
        let id = if self.gi(preferred).is_none() {
            preferred
        } else {
            (1..).find(|i| self.gi(*i).is_none()).unwrap_or(preferred)
        };
        self.gpu_instances.push(GpuInstance {
            id,
            profile_id,
            placement: Placement {
                start,
                size: profile.memory_slices,
            },
            compute_instances: Vec::new(),
        });
        self.gpu_instances.sort_by_key(|g| g.id);
        Ok(id)
    }

    /// Destroys a GI; the driver refuses while it still has compute instances.
    pub fn destroy_gi(&mut self, id: u32) -> Res {
        let gi = self.gi(id).ok_or(rc::INVALID_ARGUMENT)?;
        if !gi.compute_instances.is_empty() {
            return Err(rc::IN_USE);
        }
        self.gpu_instances.retain(|g| g.id != id);
        Ok(())
    }

    /// How many more GIs of a profile could be created now.
    pub fn remaining_gi(&self, table: &MigTable, profile_id: u32) -> Res<u32> {
        gi_profile(table, profile_id)?;
        if !self.enabled() {
            return Err(rc::NOT_SUPPORTED);
        }
        let mut probe = self.clone();
        let mut n = 0;
        while probe.create_gi(table, profile_id, None).is_ok() {
            n += 1;
        }
        Ok(n)
    }

    /// Creates a CI inside GI `gi_id`; without a placement the lowest free one is taken.
    /// CI ids count from 0 within each GI.
    pub fn create_ci(
        &mut self,
        table: &MigTable,
        gi_id: u32,
        ci_profile_id: u32,
        start: Option<u32>,
    ) -> Res<u32> {
        let gi = self.gi_mut(gi_id).ok_or(rc::INVALID_ARGUMENT)?;
        let gi_prof = gi_profile(table, gi.profile_id)?;
        let ci = ci_profile_in(table, gi_prof, ci_profile_id)?;
        if let Some(s) = start
            && !ci.starts.contains(&s)
        {
            return Err(rc::INVALID_ARGUMENT);
        }
        let same = gi
            .compute_instances
            .iter()
            .filter(|c| c.profile_id == ci.id)
            .count();
        if same as u32 >= ci.instances {
            return Err(rc::INSUFFICIENT_RESOURCES);
        }
        let free = |s: u32| {
            let want = Placement {
                start: s,
                size: ci.slices,
            };
            !gi.compute_instances
                .iter()
                .any(|c| c.placement.overlaps(&want))
        };
        let start = match start {
            Some(s) if free(s) => s,
            Some(_) => return Err(rc::INSUFFICIENT_RESOURCES),
            None => ci
                .starts
                .iter()
                .copied()
                .find(|s| free(*s))
                .ok_or(rc::INSUFFICIENT_RESOURCES)?,
        };
        let id = (0..)
            .find(|i| !gi.compute_instances.iter().any(|c| c.id == *i))
            .unwrap_or(0);
        gi.compute_instances.push(ComputeInstance {
            id,
            profile_id: ci.id,
            placement: Placement {
                start,
                size: ci.slices,
            },
        });
        gi.compute_instances.sort_by_key(|c| c.id);
        Ok(id)
    }

    pub fn destroy_ci(&mut self, gi_id: u32, ci_id: u32) -> Res {
        let gi = self.gi_mut(gi_id).ok_or(rc::INVALID_ARGUMENT)?;
        let before = gi.compute_instances.len();
        gi.compute_instances.retain(|c| c.id != ci_id);
        if gi.compute_instances.len() == before {
            return Err(rc::INVALID_ARGUMENT);
        }
        Ok(())
    }

    /// How many more CIs of a profile fit into GI `gi_id` now.
    pub fn remaining_ci(&self, table: &MigTable, gi_id: u32, ci_profile_id: u32) -> Res<u32> {
        let gi = self.gi(gi_id).ok_or(rc::INVALID_ARGUMENT)?;
        ci_profile_in(table, gi_profile(table, gi.profile_id)?, ci_profile_id)?;
        let mut probe = self.clone();
        let mut n = 0;
        while probe.create_ci(table, gi_id, ci_profile_id, None).is_ok() {
            n += 1;
        }
        Ok(n)
    }

    /// Checks a state that came from outside (state file) against the GPU's geometry by
    /// replaying it with explicit placements; returns what is wrong.
    pub fn check(&self, table: &MigTable) -> Result<(), String> {
        let known = |m: u32| m == NVML_DEVICE_MIG_ENABLE || m == NVML_DEVICE_MIG_DISABLE;
        if !known(self.current) || !known(self.pending) {
            return Err("MIG modes must be 0 or 1".into());
        }
        if !self.enabled() && !self.gpu_instances.is_empty() {
            return Err("GPU instances exist while MIG is disabled".into());
        }
        let mut replay = MigState {
            gpu_instances: Vec::new(),
            ..self.clone()
        };
        for gi in &self.gpu_instances {
            let what = format!("GPU instance {}", gi.id);
            if replay.gi(gi.id).is_some() {
                return Err(format!("{what}: duplicate id"));
            }
            let placed = replay
                .create_gi(table, gi.profile_id, Some(gi.placement.start))
                .map_err(|_| format!("{what}: profile/placement does not fit"))?;
            if let Some(g) = replay.gi_mut(placed) {
                g.id = gi.id;
            }
            for ci in &gi.compute_instances {
                let what = format!("{what}, compute instance {}", ci.id);
                if replay.ci(gi.id, ci.id).is_some() {
                    return Err(format!("{what}: duplicate id"));
                }
                let made = replay
                    .create_ci(table, gi.id, ci.profile_id, Some(ci.placement.start))
                    .map_err(|_| format!("{what}: profile/placement does not fit"))?;
                if let Some(c) = replay
                    .gi_mut(gi.id)
                    .and_then(|g| g.compute_instances.iter_mut().find(|c| c.id == made))
                {
                    c.id = ci.id;
                }
            }
        }
        Ok(())
    }
}

/// The UUID of the MIG device for `(gi, ci)` on the GPU with `parent_uuid`: `MIG-` plus a
/// UUID derived deterministically from the three, so every process names it the same way.
pub fn mig_uuid(parent_uuid: &str, gi: u32, ci: u32) -> String {
    // Two FNV-1a passes with different bases give the 128 bits.
    let fnv = |basis: u64| {
        let mut h = basis;
        for byte in parent_uuid
            .bytes()
            .chain(gi.to_le_bytes())
            .chain(ci.to_le_bytes())
        {
            h ^= byte as u64;
            h = h.wrapping_mul(0x0000_0100_0000_01B3);
        }
        h
    };
    let (hi, lo) = (fnv(0xCBF2_9CE4_8422_2325), fnv(0x84222325CBF29CE4));
    format!(
        "MIG-{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
        hi >> 32,
        (hi >> 16) & 0xffff,
        hi & 0xffff,
        lo >> 48,
        lo & 0xffff_ffff_ffff
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profiles::{A100_40GB, A100_80GB};

    fn enabled() -> MigState {
        MigState {
            current: NVML_DEVICE_MIG_ENABLE,
            pending: NVML_DEVICE_MIG_ENABLE,
            gpu_instances: Vec::new(),
        }
    }

    #[test]
    fn greedy_placement_reproduces_the_mig_guide() {
        let t = &A100_40GB;
        let mut s = enabled();
        for p in [19, 19, 14] {
            s.create_gi(t, p, None).unwrap();
        }
        assert_eq!(s.create_gi(t, 9, None), Err(rc::INSUFFICIENT_RESOURCES));
        let mut s = enabled();
        for p in [9, 19, 14, 19] {
            s.create_gi(t, p, None).unwrap();
        }
        assert_eq!(s.gpu_instances.len(), 4);
    }

    #[test]
    fn ids_follow_placements() {
        let t = &A100_80GB;
        let mut s = enabled();
        assert_eq!(s.create_gi(t, 9, None), Ok(1)); // 3g at 4
        assert_eq!(s.create_gi(t, 9, None), Ok(2)); // 3g at 0
        assert_eq!(s.remaining_gi(t, 19), Ok(0));
        s.destroy_gi(2).unwrap();
        assert_eq!(s.create_gi(t, 14, None), Ok(4)); // 2g at 2
        assert_eq!(s.create_gi(t, 19, None), Ok(8)); // 1g at 1
        assert_eq!(s.create_gi(t, 19, Some(0)), Ok(7));
        assert_eq!(s.create_gi(t, 19, Some(0)), Err(rc::INSUFFICIENT_RESOURCES));
        assert_eq!(s.create_gi(t, 19, Some(7)), Err(rc::INVALID_ARGUMENT));
        let mut s = enabled();
        assert_eq!(s.create_gi(t, 5, None), Ok(1)); // 4g at 0
        assert_eq!(s.create_gi(t, 9, None), Ok(2)); // 3g at 4 falls back
    }

    #[test]
    fn compute_instances_count_from_zero_and_block_destroy() {
        let t = &A100_80GB;
        let mut s = enabled();
        let gi = s.create_gi(t, 9, None).unwrap();
        assert_eq!(s.remaining_ci(t, gi, 0), Ok(3));
        assert_eq!(s.create_ci(t, gi, 0, None), Ok(0));
        assert_eq!(s.create_ci(t, gi, 1, None), Err(rc::INSUFFICIENT_RESOURCES));
        assert_eq!(s.create_ci(t, gi, 0, None), Ok(1));
        assert_eq!(
            s.ci(gi, 1).unwrap().placement,
            Placement { start: 1, size: 1 }
        );
        assert_eq!(s.destroy_gi(gi), Err(rc::IN_USE));
        s.destroy_ci(gi, 0).unwrap();
        assert_eq!(s.create_ci(t, gi, 0, None), Ok(0));
        assert!(s.check(t).is_ok());
        s.destroy_ci(gi, 0).unwrap();
        s.destroy_ci(gi, 1).unwrap();
        s.destroy_gi(gi).unwrap();
    }

    #[test]
    fn mig_uuids_are_stable_and_distinct() {
        let a = mig_uuid("GPU-1", 1, 0);
        assert_eq!(a, mig_uuid("GPU-1", 1, 0));
        assert_ne!(a, mig_uuid("GPU-1", 2, 0));
        assert_ne!(a, mig_uuid("GPU-2", 1, 0));
        assert_eq!(a.len(), "MIG-".len() + 36);
    }

    #[test]
    fn disabled_mig_refuses_instances() {
        let mut s = MigState::default();
        assert_eq!(s.create_gi(&A100_80GB, 19, None), Err(rc::NOT_SUPPORTED));
    }

    #[test]
    fn check_rejects_overlaps() {
        let t = &A100_80GB;
        let mut s = enabled();
        s.create_gi(t, 9, Some(0)).unwrap();
        let mut bad = s.clone();
        bad.gpu_instances.push(GpuInstance {
            id: 9,
            profile_id: 19,
            placement: Placement { start: 1, size: 1 },
            compute_instances: vec![],
        });
        assert!(bad.check(t).is_err());
        assert!(s.check(t).is_ok());
    }
}
