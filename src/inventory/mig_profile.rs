//! MIG profile names in NVIDIA's notation (`1g.10gb`, `1c.3g.40gb`, `1g.10gb+me`).
//!
//! The name is computed from the instance's shape the way NVIDIA's go-nvlib does, so resource
//! names (`nvidia.com/mig-1g.10gb`) and labels match the device plugin and GFD exactly. The
//! memory figure is not the instance's MiB rounded: it is the instance's share of the GPU in
//! eighths, times the GPU's memory in whole GiB — which is why a 9728 MiB slice of an 80 GB
//! A100 is called `10gb`, and its 80896 MiB `7g` instance `80gb`.

/// NVML GPU-instance profile enum values that carry an attribute suffix.
mod gi_enum {
    pub const ONE_SLICE_REV1: u32 = 0x7;
    pub const TWO_SLICE_REV1: u32 = 0x8;
    pub const ONE_SLICE_GFX: u32 = 0xA;
    pub const TWO_SLICE_GFX: u32 = 0xB;
    pub const FOUR_SLICE_GFX: u32 = 0xC;
    pub const ONE_SLICE_NO_ME: u32 = 0xD;
    pub const TWO_SLICE_NO_ME: u32 = 0xE;
    pub const ONE_SLICE_ALL_ME: u32 = 0xF;
    pub const TWO_SLICE_ALL_ME: u32 = 0x10;
    pub const THREE_SLICE_GFX: u32 = 0x11;
}

/// The attribute suffix of a GPU-instance profile, by its NVML enum value.
pub fn attribute_suffix(gi_profile_enum: u32) -> &'static str {
    use gi_enum::*;
    match gi_profile_enum {
        ONE_SLICE_REV1 | TWO_SLICE_REV1 => "+me",
        ONE_SLICE_ALL_ME | TWO_SLICE_ALL_ME => "+me.all",
        ONE_SLICE_NO_ME | TWO_SLICE_NO_ME => "-me",
        ONE_SLICE_GFX | TWO_SLICE_GFX | FOUR_SLICE_GFX | THREE_SLICE_GFX => "+gfx",
        _ => "",
    }
}

/// The nominal size in GB NVIDIA puts in a profile name.
///
/// `round(ceil(share · 8) / 8 · ceil(total GiB))`, where `share` is the instance's fraction
/// of the GPU's memory.
pub fn nominal_gb(instance_mib: u64, gpu_total_bytes: u64) -> u64 {
    if gpu_total_bytes == 0 {
        return 0;
    }
    const GIB: f64 = (1u64 << 30) as f64;
    let instance_bytes = (instance_mib as f64) * f64::from(1u32 << 20);
    let total = gpu_total_bytes as f64;
    let eighths = (instance_bytes / total * 8.0).ceil();
    (eighths / 8.0 * (total / GIB).ceil()).round() as u64
}

/// The profile name of a MIG device.
///
/// `gpu_slices` and `compute_slices` are the G and C of the name; the `c` part is omitted when
/// the compute instance spans the whole GPU instance.
pub fn profile_name(
    gpu_slices: u32,
    compute_slices: u32,
    instance_mib: u64,
    gpu_total_bytes: u64,
    gi_profile_enum: u32,
) -> String {
    let gb = nominal_gb(instance_mib, gpu_total_bytes);
    let suffix = attribute_suffix(gi_profile_enum);
    if compute_slices == gpu_slices || compute_slices == 0 {
        format!("{gpu_slices}g.{gb}gb{suffix}")
    } else {
        format!("{compute_slices}c.{gpu_slices}g.{gb}gb{suffix}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn a100_80gb_profiles() {
        let total = 81920 * MIB;
        assert_eq!(profile_name(1, 1, 9728, total, 0), "1g.10gb");
        assert_eq!(profile_name(1, 1, 9728, total, 7), "1g.10gb+me");
        assert_eq!(profile_name(1, 1, 19968, total, 9), "1g.20gb");
        assert_eq!(profile_name(2, 2, 19968, total, 1), "2g.20gb");
        assert_eq!(profile_name(3, 3, 40192, total, 2), "3g.40gb");
        assert_eq!(profile_name(4, 4, 40192, total, 3), "4g.40gb");
        assert_eq!(profile_name(7, 7, 80896, total, 4), "7g.80gb");
        assert_eq!(profile_name(3, 1, 40192, total, 2), "1c.3g.40gb");
    }

    #[test]
    fn a100_40gb_profiles() {
        let total = 40960 * MIB;
        assert_eq!(profile_name(1, 1, 4864, total, 0), "1g.5gb");
        assert_eq!(profile_name(2, 2, 9856, total, 1), "2g.10gb");
        assert_eq!(profile_name(3, 3, 19968, total, 2), "3g.20gb");
        assert_eq!(profile_name(7, 7, 40192, total, 4), "7g.40gb");
    }

    #[test]
    fn h100_profiles() {
        let total = 81559 * MIB;
        assert_eq!(profile_name(1, 1, 9984, total, 0), "1g.10gb");
        assert_eq!(profile_name(1, 1, 20096, total, 9), "1g.20gb");
        assert_eq!(profile_name(3, 3, 40448, total, 2), "3g.40gb");
        assert_eq!(profile_name(7, 7, 81152, total, 4), "7g.80gb");
        assert_eq!(profile_name(4, 2, 40448, total, 3), "2c.4g.40gb");
    }

    #[test]
    fn suffixes() {
        assert_eq!(attribute_suffix(0xD), "-me");
        assert_eq!(attribute_suffix(0xF), "+me.all");
        assert_eq!(attribute_suffix(0xA), "+gfx");
        assert_eq!(attribute_suffix(4), "");
    }
}
