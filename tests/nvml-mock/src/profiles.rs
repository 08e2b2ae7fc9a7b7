//! MIG profile tables of the real GPUs and the geometry rules that go with them: which GPU
//! instance (GI) profiles exist, where they may be placed, which GI id the driver assigns to a
//! placement, and which compute instance (CI) profiles a GI offers.
//!
//! The numbers are what `nvidia-smi mig -lgip` / `-lgipp` report on the real boards (profile
//! ids 19/20/15/14/9/5/0, memory in MiB, SM and engine counts). Memory is carved into 8 slices
//! and compute into 7; a placement is a `(start, size)` pair in memory slices.

use nvml_wrapper_sys::bindings as b;

/// One GPU instance profile of one GPU model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GiProfile {
    /// The `NVML_GPU_INSTANCE_PROFILE_*` enum value callers pass to the profile-info calls.
    pub index: u32,
    /// The device-unique profile id NVML returns in `info.id` and takes everywhere else.
    pub id: u32,
    /// Short name as in `nvidia-smi` without the `MIG ` prefix, e.g. `3g.40gb`.
    pub name: &'static str,
    /// Compute slices (the `G` of `Ng`).
    pub slices: u32,
    /// Memory slices occupied; also the size of every placement.
    pub memory_slices: u32,
    /// How many instances of this profile fit on an empty GPU.
    pub instances: u32,
    pub sm: u32,
    pub copy_engines: u32,
    pub decoders: u32,
    pub encoders: u32,
    pub jpegs: u32,
    pub ofas: u32,
    pub memory_mib: u64,
    /// Allowed placement starts, in memory slices.
    pub starts: &'static [u32],
}

/// The MIG geometry of one GPU model.
#[derive(Debug, PartialEq, Eq)]
pub struct MigTable {
    /// The name fixtures use to select this table, e.g. `a100-80gb`.
    pub key: &'static str,
    /// SMs in one compute slice of a CI that is smaller than its GI.
    pub sm_per_slice: u32,
    pub profiles: &'static [GiProfile],
}

/// Memory slices on every MIG-capable GPU modelled here.
pub const MEMORY_SLICES: u32 = 8;
/// Compute slices on every MIG-capable GPU modelled here.
pub const COMPUTE_SLICES: u32 = 7;
/// `nvmlDeviceGetMaxMigDeviceCount` on these GPUs.
pub const MAX_MIG_DEVICES: u32 = 7;

const ONE_SLICE_STARTS: &[u32] = &[0, 1, 2, 3, 4, 5, 6];
const TWO_SLICE_STARTS: &[u32] = &[0, 2, 4];
const DOUBLE_MEMORY_STARTS: &[u32] = &[0, 2, 4, 6];
const HALF_STARTS: &[u32] = &[0, 4];
const WHOLE_STARTS: &[u32] = &[0];

#[allow(clippy::too_many_arguments)]
const fn gi(
    index: u32,
    id: u32,
    name: &'static str,
    shape: (u32, u32, u32),
    sm: u32,
    engines: (u32, u32, u32, u32, u32),
    memory_mib: u64,
    starts: &'static [u32],
) -> GiProfile {
    GiProfile {
        index,
        id,
        name,
        slices: shape.0,
        memory_slices: shape.1,
        instances: shape.2,
        sm,
        copy_engines: engines.0,
        decoders: engines.1,
        encoders: engines.2,
        jpegs: engines.3,
        ofas: engines.4,
        memory_mib,
        starts,
    }
}

const P1: u32 = b::NVML_GPU_INSTANCE_PROFILE_1_SLICE;
const P1_ME: u32 = b::NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1;
const P1_DM: u32 = b::NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2;
const P2: u32 = b::NVML_GPU_INSTANCE_PROFILE_2_SLICE;
const P3: u32 = b::NVML_GPU_INSTANCE_PROFILE_3_SLICE;
const P4: u32 = b::NVML_GPU_INSTANCE_PROFILE_4_SLICE;
const P7: u32 = b::NVML_GPU_INSTANCE_PROFILE_7_SLICE;

/// A100-SXM4-40GB (and A100 40GB PCIe). Engines are (CE, DEC, ENC, JPEG, OFA).
pub static A100_40GB: MigTable = MigTable {
    key: "a100-40gb",
    sm_per_slice: 14,
    profiles: &[
        gi(
            P1,
            19,
            "1g.5gb",
            (1, 1, 7),
            14,
            (1, 0, 0, 0, 0),
            4864,
            ONE_SLICE_STARTS,
        ),
        gi(
            P1_ME,
            20,
            "1g.5gb+me",
            (1, 1, 1),
            14,
            (1, 1, 0, 1, 1),
            4864,
            ONE_SLICE_STARTS,
        ),
        gi(
            P1_DM,
            15,
            "1g.10gb",
            (1, 2, 4),
            14,
            (1, 1, 0, 0, 0),
            9856,
            DOUBLE_MEMORY_STARTS,
        ),
        gi(
            P2,
            14,
            "2g.10gb",
            (2, 2, 3),
            28,
            (2, 1, 0, 0, 0),
            9856,
            TWO_SLICE_STARTS,
        ),
        gi(
            P3,
            9,
            "3g.20gb",
            (3, 4, 2),
            42,
            (3, 2, 0, 0, 0),
            19968,
            HALF_STARTS,
        ),
        gi(
            P4,
            5,
            "4g.20gb",
            (4, 4, 1),
            56,
            (4, 2, 0, 0, 0),
            19968,
            WHOLE_STARTS,
        ),
        gi(
            P7,
            0,
            "7g.40gb",
            (7, 8, 1),
            98,
            (7, 5, 0, 1, 1),
            40192,
            WHOLE_STARTS,
        ),
    ],
};

/// A100-SXM4-80GB (and A100 80GB PCIe).
pub static A100_80GB: MigTable = MigTable {
    key: "a100-80gb",
    sm_per_slice: 14,
    profiles: &[
        gi(
            P1,
            19,
            "1g.10gb",
            (1, 1, 7),
            14,
            (1, 0, 0, 0, 0),
            9728,
            ONE_SLICE_STARTS,
        ),
        gi(
            P1_ME,
            20,
            "1g.10gb+me",
            (1, 1, 1),
            14,
            (1, 1, 0, 1, 1),
            9728,
            ONE_SLICE_STARTS,
        ),
        gi(
            P1_DM,
            15,
            "1g.20gb",
            (1, 2, 4),
            14,
            (1, 1, 0, 0, 0),
            19968,
            DOUBLE_MEMORY_STARTS,
        ),
        gi(
            P2,
            14,
            "2g.20gb",
            (2, 2, 3),
            28,
            (2, 1, 0, 0, 0),
            19968,
            TWO_SLICE_STARTS,
        ),
        gi(
            P3,
            9,
            "3g.40gb",
            (3, 4, 2),
            42,
            (3, 2, 0, 0, 0),
            40192,
            HALF_STARTS,
        ),
        gi(
            P4,
            5,
            "4g.40gb",
            (4, 4, 1),
            56,
            (4, 2, 0, 0, 0),
            40192,
            WHOLE_STARTS,
        ),
        gi(
            P7,
            0,
            "7g.80gb",
            (7, 8, 1),
            98,
            (7, 5, 0, 1, 1),
            80896,
            WHOLE_STARTS,
        ),
    ],
};

/// H100 80GB HBM3 (SXM5).
pub static H100_80GB: MigTable = MigTable {
    key: "h100-80gb",
    sm_per_slice: 16,
    profiles: &[
        gi(
            P1,
            19,
            "1g.10gb",
            (1, 1, 7),
            16,
            (1, 1, 0, 1, 0),
            9984,
            ONE_SLICE_STARTS,
        ),
        gi(
            P1_ME,
            20,
            "1g.10gb+me",
            (1, 1, 1),
            16,
            (1, 1, 0, 1, 1),
            9984,
            ONE_SLICE_STARTS,
        ),
        gi(
            P1_DM,
            15,
            "1g.20gb",
            (1, 2, 4),
            26,
            (1, 1, 0, 1, 0),
            20096,
            DOUBLE_MEMORY_STARTS,
        ),
        gi(
            P2,
            14,
            "2g.20gb",
            (2, 2, 3),
            32,
            (2, 2, 0, 2, 0),
            20096,
            TWO_SLICE_STARTS,
        ),
        gi(
            P3,
            9,
            "3g.40gb",
            (3, 4, 2),
            60,
            (3, 3, 0, 3, 0),
            40448,
            HALF_STARTS,
        ),
        gi(
            P4,
            5,
            "4g.40gb",
            (4, 4, 1),
            64,
            (4, 4, 0, 4, 0),
            40448,
            WHOLE_STARTS,
        ),
        gi(
            P7,
            0,
            "7g.80gb",
            (7, 8, 1),
            132,
            (8, 7, 0, 7, 1),
            81152,
            WHOLE_STARTS,
        ),
    ],
};

/// Every table a fixture may name.
pub static TABLES: &[&MigTable] = &[&A100_40GB, &A100_80GB, &H100_80GB];

/// Looks up a table by the key fixtures use.
pub fn table(key: &str) -> Option<&'static MigTable> {
    TABLES.iter().copied().find(|t| t.key == key)
}

impl MigTable {
    /// The profile behind an `NVML_GPU_INSTANCE_PROFILE_*` enum value.
    pub fn by_index(&self, index: u32) -> Option<&GiProfile> {
        self.profiles.iter().find(|p| p.index == index)
    }

    /// The profile behind a profile id (`info.id`).
    pub fn by_id(&self, id: u32) -> Option<&GiProfile> {
        self.profiles.iter().find(|p| p.id == id)
    }

    /// The profile with this short name (`3g.40gb`), as fixtures spell it.
    pub fn by_name(&self, name: &str) -> Option<&GiProfile> {
        self.profiles.iter().find(|p| p.name == name)
    }
}

/// Number of `NVML_GPU_INSTANCE_PROFILE_*` enum values callers may probe; values beyond the
/// ones a table defines but below this bound are "not supported", not "invalid".
pub const GI_PROFILE_ENUM_COUNT: u32 = 0x12;
/// Same for `NVML_COMPUTE_INSTANCE_PROFILE_*`.
pub const CI_PROFILE_ENUM_COUNT: u32 = 0x9;

/// The GI id the driver hands out for a profile placed at `start`.
///
/// Observed on A100: 7g@0 → 0; 4g@0 → 1; 3g@4 → 1 and 3g@0 → 2; 2g@0/2/4 → 3/4/5;
/// 1g@k → 7+k. The double-memory 1g profile shares the 2g slots (it occupies the same memory
/// slices) and takes 6 at start 6, the one id otherwise unused. 4g@0 and 3g@4 can coexist and
/// both prefer id 1; whichever is created second falls back to the lowest free id.
pub fn preferred_gi_id(profile: &GiProfile, start: u32) -> u32 {
    match (profile.slices, profile.memory_slices) {
        (7, _) => 0,
        (4, _) => 1,
        (3, _) => {
            if start >= 4 {
                1
            } else {
                2
            }
        }
        (_, 2) => 3 + start / 2,
        _ => 7 + start,
    }
}

/// A compute instance profile offered inside a GI of a given profile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CiProfile {
    /// The `NVML_COMPUTE_INSTANCE_PROFILE_*` enum value, which is also the profile id.
    pub id: u32,
    /// Compute slices (the `C` of `Nc`).
    pub slices: u32,
    /// How many fit in an empty GI.
    pub instances: u32,
    pub sm: u32,
    /// Name without `MIG `: `1c.3g.40gb`, or the GI's own name for a full-size CI.
    pub name: String,
    /// Allowed placement starts, in compute slices of the GI.
    pub starts: Vec<u32>,
}

/// Compute slices of each `NVML_COMPUTE_INSTANCE_PROFILE_*` value the mock supports. The
/// `1_SLICE_REV1`, 6- and 8-slice values are reported as not supported.
fn ci_slices(ci_index: u32) -> Option<u32> {
    match ci_index {
        b::NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE => Some(1),
        b::NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE => Some(2),
        b::NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE => Some(3),
        b::NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE => Some(4),
        b::NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE => Some(7),
        _ => None,
    }
}

/// The CI profile `ci_index` inside a GI of profile `gi`, if that GI offers it.
///
/// A GI of `G` slices offers `C`-slice CIs for `C == G`, and for `C < G` unless `2C > G + 1`
/// (no 3c on a 4g). Counts are `G / C`; placements start at multiples of `C` rounded up to a
/// power of two (so a 7g holds 3c at 0 and 4). A smaller CI gets `sm_per_slice` SMs per slice,
/// a full one all of the GI's SMs.
pub fn ci_profile(table: &MigTable, gi: &GiProfile, ci_index: u32) -> Option<CiProfile> {
    let c = ci_slices(ci_index)?;
    let g = gi.slices;
    if c > g || (c < g && 2 * c > g + 1) {
        return None;
    }
    let step = c.next_power_of_two();
    let starts = (0..=g - c).step_by(step as usize).collect();
    let (sm, name) = if c == g {
        (gi.sm, gi.name.to_owned())
    } else {
        (
            (table.sm_per_slice * c).min(gi.sm),
            format!("{c}c.{}", gi.name),
        )
    };
    Some(CiProfile {
        id: ci_index,
        slices: c,
        instances: g / c,
        sm,
        name,
        starts,
    })
}

/// Every CI profile a GI of profile `gi` offers, smallest first.
pub fn ci_profiles(table: &MigTable, gi: &GiProfile) -> Vec<CiProfile> {
    (0..CI_PROFILE_ENUM_COUNT)
        .filter_map(|index| ci_profile(table, gi, index))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_are_internally_consistent() {
        for table in TABLES {
            for p in table.profiles {
                assert!(
                    p.starts
                        .iter()
                        .all(|s| s + p.memory_slices <= MEMORY_SLICES)
                );
                assert!(p.instances as usize <= p.starts.len(), "{}", p.name);
                assert!(p.slices <= COMPUTE_SLICES);
                assert_eq!(table.by_id(p.id), Some(p));
            }
        }
    }

    #[test]
    fn gi_ids_follow_the_driver() {
        let t = &A100_80GB;
        let id = |name: &str, start| preferred_gi_id(t.by_name(name).unwrap(), start);
        assert_eq!(id("7g.80gb", 0), 0);
        assert_eq!(id("4g.40gb", 0), 1);
        assert_eq!(id("3g.40gb", 4), 1);
        assert_eq!(id("3g.40gb", 0), 2);
        assert_eq!(id("2g.20gb", 0), 3);
        assert_eq!(id("2g.20gb", 4), 5);
        assert_eq!(id("1g.10gb", 0), 7);
        assert_eq!(id("1g.10gb", 6), 13);
        assert_eq!(id("1g.20gb", 6), 6);
    }

    #[test]
    fn compute_profiles_match_lcip() {
        let t = &A100_40GB;
        let g3 = t.by_name("3g.20gb").unwrap();
        let names: Vec<_> = ci_profiles(t, g3).into_iter().map(|c| c.name).collect();
        assert_eq!(names, ["1c.3g.20gb", "2c.3g.20gb", "3g.20gb"]);
        let c1 = ci_profile(t, g3, 0).unwrap();
        assert_eq!(
            (c1.instances, c1.sm, c1.starts.clone()),
            (3, 14, vec![0, 1, 2])
        );
        let g4 = t.by_name("4g.20gb").unwrap();
        assert!(ci_profile(t, g4, b::NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE).is_none());
        let g7 = t.by_name("7g.40gb").unwrap();
        let c3 = ci_profile(t, g7, b::NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE).unwrap();
        assert_eq!((c3.instances, c3.starts), (2, vec![0, 4]));
        let c7 = ci_profile(t, g7, b::NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE).unwrap();
        assert_eq!((c7.sm, c7.name.as_str()), (98, "7g.40gb"));
        let h = &H100_80GB;
        let c = ci_profile(h, h.by_name("3g.40gb").unwrap(), 0).unwrap();
        assert_eq!((c.sm, c.name.as_str()), (16, "1c.3g.40gb"));
    }
}
