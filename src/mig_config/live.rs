//! A GPU's live MIG layout in config terms: profile name → count, as mig-parted compares it.

use std::collections::BTreeMap;

use super::profile::device_name;
use crate::nvml::mig_admin::{GpuInstance, MigGpu};

/// The profile name of every compute instance of `gi`.
pub fn instance_devices(gpu: &MigGpu, gi: &GpuInstance) -> Vec<String> {
    let Some(profile) = gpu.profile(gi.profile_id) else {
        return Vec::new();
    };
    gi.compute
        .iter()
        .map(|ci| device_name(&profile.name, profile.slices, ci.slices))
        .collect()
}

/// Profile name → count over the whole GPU (empty when MIG is off).
pub fn devices(gpu: &MigGpu) -> BTreeMap<String, u32> {
    let mut counts = BTreeMap::new();
    for gi in &gpu.instances {
        for name in instance_devices(gpu, gi) {
            *counts.entry(name).or_insert(0) += 1;
        }
    }
    counts
}

/// Whether MIG is currently on (not pending).
pub fn enabled(gpu: &MigGpu) -> bool {
    gpu.mode.is_some_and(|m| m.current)
}
