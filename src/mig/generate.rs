//! `generate-config`: the `all-*` layouts of NVIDIA's default set for the GPUs present, from
//! their own profile tables: `all-disabled`, `all-enabled`, `all-balanced` (as mig-manager's
//! builder makes it: two 1g, one 2g and one 3g instance on a 7-slice GPU, two 1g and one 2g on
//! a 4-slice one, base profiles only), and one `all-<profile>` per GPU-instance profile
//! filling the GPU with as many instances as it holds (`+` in a profile name written `.` in
//! the label). Entries are chosen by PCI device id, one per GPU model, so the file also fits
//! other nodes with the same models.

use std::collections::BTreeMap;

use crate::mig_config::spec::{DeviceFilter, Devices, Entry, Spec};
use crate::nvml::mig_admin::{GiProfile, MigGpu};

/// The config set for `gpus`.
pub fn generate(gpus: &[MigGpu]) -> Spec {
    let mut configs: BTreeMap<String, Vec<Entry>> = BTreeMap::new();
    let whole = |enabled: bool| Entry {
        device_filter: None,
        devices: Devices::All,
        mig_enabled: enabled,
        mig_devices: enabled.then(BTreeMap::new),
    };
    configs.insert("all-disabled".into(), vec![whole(false)]);
    configs.insert("all-enabled".into(), vec![whole(true)]);
    // One representative per model: GPUs of one device id have one profile table.
    let mut models: BTreeMap<u32, &MigGpu> = BTreeMap::new();
    for gpu in gpus.iter().filter(|g| g.mode.is_some()) {
        models.entry(gpu.pci_device_id).or_insert(gpu);
    }
    for (device_id, gpu) in models {
        let entry = |devices: BTreeMap<String, u32>| Entry {
            device_filter: Some(DeviceFilter::One(format!("0x{device_id:08X}"))),
            devices: Devices::All,
            mig_enabled: true,
            mig_devices: Some(devices),
        };
        for profile in gpu.profiles.iter().filter(|p| p.max > 0) {
            let label = format!("all-{}", profile.name.replace('+', "."));
            let devices = BTreeMap::from([(profile.name.clone(), profile.max)]);
            configs.entry(label).or_default().push(entry(devices));
        }
        if let Some(devices) = balanced(&gpu.profiles) {
            configs
                .entry("all-balanced".into())
                .or_default()
                .push(entry(devices));
        }
    }
    Spec {
        version: "v1".into(),
        mig_configs: configs,
    }
}

/// mig-manager's balanced layout for a GPU with these profiles: by the GPU's compute slices
/// (its largest profile), counts of base profiles (no `+` media extensions; the smallest
/// memory of each size). `None` for a GPU of another size or one missing a base profile.
fn balanced(profiles: &[GiProfile]) -> Option<BTreeMap<String, u32>> {
    let slices = profiles.iter().map(|p| p.slices).max()?;
    let counts: &[(u32, u32)] = match slices {
        7 => &[(1, 2), (2, 1), (3, 1)],
        4 => &[(1, 2), (2, 1)],
        _ => return None,
    };
    counts
        .iter()
        .map(|&(size, count)| {
            profiles
                .iter()
                .filter(|p| p.slices == size && !p.name.contains('+') && p.max > 0)
                .min_by_key(|p| p.memory_mib)
                .map(|p| (p.name.clone(), count))
        })
        .collect()
}
