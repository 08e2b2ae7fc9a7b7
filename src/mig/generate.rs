//! `generate-config`: the `all-*` layouts of NVIDIA's default set for the GPUs present, from
//! their own profile tables: `all-disabled`, `all-enabled`, and one `all-<profile>` per
//! GPU-instance profile filling the GPU with as many instances as it holds (`+` in a profile
//! name written `.` in the label). Entries are chosen by PCI device id, one per GPU model, so
//! the file also fits other nodes with the same models.

use std::collections::BTreeMap;

use super::spec::{DeviceFilter, Devices, Entry, Spec};
use crate::nvml::mig_admin::MigGpu;

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
        for profile in gpu.profiles.iter().filter(|p| p.max > 0) {
            let label = format!("all-{}", profile.name.replace('+', "."));
            configs.entry(label).or_default().push(Entry {
                device_filter: Some(DeviceFilter::One(format!("0x{device_id:08X}"))),
                devices: Devices::All,
                mig_enabled: true,
                mig_devices: Some(BTreeMap::from([(profile.name.clone(), profile.max)])),
            });
        }
    }
    Spec {
        version: "v1".into(),
        mig_configs: configs,
    }
}
