//! Which config entry applies to which GPU: device filters by PCI id and `devices` lists,
//! walked in file order as mig-parted walks them (a later matching entry wins).

use std::collections::BTreeMap;

use super::spec::{Devices, Entry, PciFilter};
use crate::nvml::mig_admin::MigGpu;

/// What one GPU should be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// Index of the entry in the selected config.
    pub entry: usize,
    pub mig_enabled: bool,
    /// The entry says `devices: all`: GPUs that cannot do MIG are passed over, not refused.
    pub all: bool,
    /// Profile name → count, zero counts left out.
    pub devices: BTreeMap<String, u32>,
}

/// The MIG-capable GPUs of `gpus` (index, UUID) that some config of `spec` applies to: the
/// GPUs whose layout a MIG manager following the file may change, whichever config the Node
/// asks for.
pub fn covered(spec: &super::spec::Spec, gpus: &[MigGpu]) -> Vec<(u32, String)> {
    gpus.iter()
        .filter(|gpu| gpu.mode.is_some())
        .filter(|gpu| {
            spec.mig_configs
                .values()
                .flatten()
                .any(|entry| matches(entry, gpu))
        })
        .map(|gpu| (gpu.index, gpu.uuid.clone()))
        .collect()
}

/// Whether `entry` applies to `gpu`.
pub fn matches(entry: &Entry, gpu: &MigGpu) -> bool {
    let by_filter = entry.device_filter.as_ref().is_none_or(|filter| {
        filter
            .ids()
            .iter()
            .filter_map(|id| PciFilter::parse(id))
            .any(|f| f.matches(gpu.pci_device_id, gpu.pci_subsystem_id))
    });
    let by_index = match &entry.devices {
        Devices::All => true,
        Devices::Indices(list) => list.contains(&gpu.index),
    };
    by_filter && by_index
}

/// The target of every GPU, `None` for GPUs no entry matches.
pub fn targets(entries: &[Entry], gpus: &[MigGpu]) -> Vec<Option<Target>> {
    gpus.iter()
        .map(|gpu| {
            entries
                .iter()
                .enumerate()
                .rfind(|(_, entry)| matches(entry, gpu))
                .map(|(i, entry)| Target {
                    entry: i,
                    mig_enabled: entry.mig_enabled,
                    all: entry.devices == Devices::All,
                    devices: entry.wanted(),
                })
        })
        .collect()
}
