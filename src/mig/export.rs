//! `export`: the live layout as a mig-parted config, one entry per distinct GPU state, under
//! one label (`current` unless told otherwise).

use std::collections::BTreeMap;

use crate::mig_config::live;
use crate::mig_config::spec::{DeviceFilter, Devices, Entry, Spec};
use crate::nvml::mig_admin::MigGpu;

/// Builds the config that describes `gpus` as they are now.
pub fn export(gpus: &[MigGpu], label: &str) -> Spec {
    let mut entries: Vec<Entry> = Vec::new();
    for gpu in gpus {
        let enabled = live::enabled(gpu);
        let entry = Entry {
            device_filter: Some(DeviceFilter::Many(vec![format!(
                "0x{:08X}",
                gpu.pci_device_id
            )])),
            devices: Devices::Indices(vec![gpu.index]),
            mig_enabled: enabled,
            mig_devices: enabled.then(|| live::devices(gpu)),
        };
        let same = entries.iter_mut().find(|e| {
            e.device_filter == entry.device_filter
                && e.mig_enabled == entry.mig_enabled
                && e.mig_devices == entry.mig_devices
        });
        match same {
            Some(e) => {
                if let Devices::Indices(list) = &mut e.devices {
                    list.push(gpu.index);
                }
            }
            None => entries.push(entry),
        }
    }
    if let [only] = entries.as_mut_slice()
        && matches!(&only.devices, Devices::Indices(list) if list.len() == gpus.len())
    {
        only.devices = Devices::All;
    }
    Spec {
        version: "v1".into(),
        mig_configs: BTreeMap::from([(label.to_owned(), entries)]),
    }
}
