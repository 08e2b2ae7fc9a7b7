//! Builders of inventory values for unit tests: a plain healthy GPU and MIG device that each
//! test adjusts with struct-update syntax, instead of every module spelling out every field.

use super::Snapshot;
use super::health::Health;
use super::model::{Gpu, Mig, MigDevice, MigEngines, Node, Pci};

/// A healthy, MIG-capable GPU with no MIG devices, no topology and no optional facts; its PCI
/// bus id is derived from the index so GPUs of one test differ.
pub fn gpu(index: u32, uuid: &str, name: &str, memory_mib: u64) -> Gpu {
    Gpu {
        index,
        minor_number: Some(index),
        device_node: None,
        uuid: uuid.into(),
        serial: None,
        name: name.into(),
        brand: None,
        architecture: None,
        family: None,
        compute_capability: None,
        memory_mib,
        pci: Pci {
            bus_id: format!("00000000:{:02X}:00.0", index).into(),
            device_id: String::new(),
            subsystem_id: None,
        },
        numa_node: None,
        power_limit_watts: None,
        mig: Mig {
            capable: true,
            enabled: false,
            pending_enabled: false,
            reconfiguring: false,
            devices: Vec::new(),
        },
        nvlinks: Vec::new(),
        fabric: None,
        health: Health::healthy(),
        remediation: None,
        device_taints: Vec::new(),
    }
}

/// `gpu` with MIG enabled (when `devices` is not empty) and these devices.
pub fn with_migs(gpu: Gpu, devices: Vec<MigDevice>) -> Gpu {
    let enabled = !devices.is_empty();
    Gpu {
        mig: Mig {
            capable: true,
            enabled,
            pending_enabled: enabled,
            reconfiguring: false,
            devices,
        },
        ..gpu
    }
}

/// A healthy one-slice MIG device (A100 `1g.10gb` sizes) with one copy engine.
pub fn mig(index: u32, uuid: &str, gpu_instance_id: u32, compute_instance_id: u32) -> MigDevice {
    MigDevice {
        index,
        uuid: uuid.into(),
        gpu_instance_id,
        compute_instance_id,
        profile: "1g.10gb".into(),
        memory_mib: 9728,
        multiprocessors: 14,
        gpu_slices: 1,
        compute_slices: 1,
        engines: MigEngines {
            copy: 1,
            decoder: 0,
            encoder: 0,
            jpeg: 0,
            ofa: 0,
        },
        placement: None,
        gpu_instance_profile_id: None,
        health: Health::healthy(),
    }
}

/// A snapshot of node `n` (driver 570.133.20) with `gpus` and no topology.
pub fn snapshot(gpus: Vec<Gpu>) -> Snapshot {
    Snapshot {
        node: Node {
            hostname: "n".into(),
            driver_version: "570.133.20".into(),
            cuda_driver_version: None,
            nvml_version: None,
            machine_type: None,
        },
        gpus,
        topology: Vec::new(),
    }
}
