//! Which extended resources the node offers and which devices each one lists — a pure
//! function of the inventory snapshot and the settings, following NVIDIA's device plugin:
//!
//! - `migStrategy: none`: every GPU is `nvidia.com/gpu`, a MIG-enabled GPU as a whole GPU;
//! - `single`: the MIG devices of MIG-enabled GPUs are `nvidia.com/gpu`; the node must be all
//!   MIG-enabled, every such GPU must have MIG devices, and all of one profile;
//! - `mixed`: GPUs without MIG are `nvidia.com/gpu`, each MIG device is
//!   `nvidia.com/mig-<profile>` with `+` written as `.`; profiles whose compute instance is
//!   smaller than its GPU instance (`1c.3g.40gb`) have no resource name and are an error;
//! - time-slicing: each device of a shared resource becomes `replicas` devices `<id>::<n>`,
//!   advertised under `rename` when set.
//!
//! A seam below the subsystems: the device plugin serves these resources, and the MPS subsystem
//! runs one control daemon per MPS-shared one, so both agree on names and devices.

use std::collections::BTreeMap;

pub mod extended;
pub mod settings;

use crate::inventory::model::{Gpu, MigDevice, Snapshot};
use settings::{IdStrategy, MigStrategy, Settings};

/// The resource name of whole GPUs.
pub const GPU_RESOURCE: &str = "nvidia.com/gpu";

/// A MIG device's place, for device nodes and CDI names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigPlace {
    pub gpu_instance_id: u32,
    pub compute_instance_id: u32,
    /// MIG device index within the parent GPU.
    pub index: u32,
}

/// One device as the kubelet sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginDevice {
    /// The advertised ID: the base ID, plus `::<n>` for a replica.
    pub id: String,
    /// The ID without the replica suffix (a UUID or an index ID, per `deviceIDStrategy`).
    pub base_id: String,
    /// GPU or MIG device UUID.
    pub uuid: String,
    /// `0`, or `0:1` for MIG device 1 of GPU 0.
    pub index_id: String,
    /// NVML index of the (parent) GPU.
    pub gpu: u32,
    /// Kernel minor of the (parent) GPU.
    pub minor: Option<u32>,
    /// Set for MIG devices.
    pub mig: Option<MigPlace>,
    /// Whether the kubelet may schedule onto it.
    pub healthy: bool,
    /// NUMA node of the (parent) GPU.
    pub numa: Option<u32>,
    /// Replica number for shared devices.
    pub replica: Option<u32>,
}

/// One extended resource and its devices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resource {
    /// Full name, e.g. `nvidia.com/gpu` or `nvidia.com/mig-1g.10gb`.
    pub name: String,
    /// Replicas per device when the resource is time-sliced.
    pub replicas: Option<u32>,
    /// The devices, in advertisement order.
    pub devices: Vec<PluginDevice>,
}

impl Resource {
    /// File name of the plugin's socket in the kubelet's device-plugins directory, e.g.
    /// `nvidia-gpu.sock`, `nvidia-mig-1g.10gb.sock`, `nvidia-gpu.shared.sock`.
    pub fn socket_name(&self) -> String {
        let short = self.name.strip_prefix("nvidia.com/").unwrap_or(&self.name);
        format!("nvidia-{}.sock", short.replace('/', "-"))
    }

    /// The device with this advertised ID.
    pub fn device(&self, id: &str) -> Option<&PluginDevice> {
        self.devices.iter().find(|d| d.id == id)
    }
}

/// Why the node's devices cannot be offered as configured.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResourceError {
    #[error(
        "migStrategy single: all devices on the node must be configured with the same migEnabled value"
    )]
    MixedMigModes,
    #[error("migStrategy single: MIG is enabled on GPU {0} but it has no MIG devices")]
    EmptyMigGpu(u32),
    #[error("migStrategy single: more than one MIG device type present on node: {0}")]
    SeveralProfiles(String),
    #[error(
        "migStrategy mixed: MIG profile {profile} on GPU {gpu} does not match any resource patterns"
    )]
    UnnamedProfile { gpu: u32, profile: String },
}

/// The resources to advertise, ordered by name.
pub fn resources(snapshot: &Snapshot, settings: &Settings) -> Result<Vec<Resource>, ResourceError> {
    let mut by_name: BTreeMap<String, Vec<PluginDevice>> = BTreeMap::new();
    match settings.mig_strategy {
        MigStrategy::None => {
            for gpu in &snapshot.gpus {
                by_name
                    .entry(GPU_RESOURCE.to_owned())
                    .or_default()
                    .push(full_gpu(gpu, settings));
            }
        }
        MigStrategy::Single => {
            let enabled = snapshot.gpus.iter().filter(|g| g.mig.enabled).count();
            if enabled == 0 {
                for gpu in &snapshot.gpus {
                    by_name
                        .entry(GPU_RESOURCE.to_owned())
                        .or_default()
                        .push(full_gpu(gpu, settings));
                }
            } else {
                if enabled != snapshot.gpus.len() {
                    return Err(ResourceError::MixedMigModes);
                }
                let mut profiles: Vec<&str> = Vec::new();
                for gpu in &snapshot.gpus {
                    if gpu.mig.devices.is_empty() {
                        return Err(ResourceError::EmptyMigGpu(gpu.index));
                    }
                    for mig in &gpu.mig.devices {
                        if !profiles.contains(&mig.profile.as_str()) {
                            profiles.push(&mig.profile);
                        }
                        by_name
                            .entry(GPU_RESOURCE.to_owned())
                            .or_default()
                            .push(mig_device(gpu, mig, settings));
                    }
                }
                if profiles.len() > 1 {
                    profiles.sort_unstable();
                    return Err(ResourceError::SeveralProfiles(profiles.join(", ")));
                }
            }
        }
        MigStrategy::Mixed => {
            for gpu in &snapshot.gpus {
                if !gpu.mig.enabled {
                    by_name
                        .entry(GPU_RESOURCE.to_owned())
                        .or_default()
                        .push(full_gpu(gpu, settings));
                    continue;
                }
                for mig in &gpu.mig.devices {
                    if mig.compute_slices != mig.gpu_slices {
                        return Err(ResourceError::UnnamedProfile {
                            gpu: gpu.index,
                            profile: mig.profile.clone(),
                        });
                    }
                    let name = extended::mig_resource(&mig.profile);
                    by_name
                        .entry(name)
                        .or_default()
                        .push(mig_device(gpu, mig, settings));
                }
            }
        }
    }
    let mut out: Vec<Resource> = by_name
        .into_iter()
        .map(|(name, devices)| share(name, devices, settings))
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

fn full_gpu(gpu: &Gpu, settings: &Settings) -> PluginDevice {
    let index_id = gpu.index.to_string();
    PluginDevice {
        id: String::new(),
        base_id: pick(settings.id_strategy, &gpu.uuid, &index_id),
        uuid: gpu.uuid.clone(),
        index_id,
        gpu: gpu.index,
        minor: gpu.minor_number,
        mig: None,
        healthy: !gpu.mig.reconfiguring
            && !matches!(gpu.health.state, crate::inventory::HealthState::Unhealthy),
        numa: gpu.numa_node,
        replica: None,
    }
    .with_id()
}

fn mig_device(gpu: &Gpu, mig: &MigDevice, settings: &Settings) -> PluginDevice {
    let index_id = format!("{}:{}", gpu.index, mig.index);
    PluginDevice {
        id: String::new(),
        base_id: pick(settings.id_strategy, &mig.uuid, &index_id),
        uuid: mig.uuid.clone(),
        index_id,
        gpu: gpu.index,
        minor: gpu.minor_number,
        mig: Some(MigPlace {
            gpu_instance_id: mig.gpu_instance_id,
            compute_instance_id: mig.compute_instance_id,
            index: mig.index,
        }),
        // A GPU being repartitioned is withdrawn with all its MIG devices.
        healthy: !gpu.mig.reconfiguring
            && !matches!(mig.health.state, crate::inventory::HealthState::Unhealthy),
        numa: gpu.numa_node,
        replica: None,
    }
    .with_id()
}

impl PluginDevice {
    fn with_id(mut self) -> Self {
        self.id = match self.replica {
            Some(n) => format!("{}::{n}", self.base_id),
            None => self.base_id.clone(),
        };
        self
    }
}

fn pick(strategy: IdStrategy, uuid: &str, index_id: &str) -> String {
    match strategy {
        IdStrategy::Uuid => uuid.to_owned(),
        IdStrategy::Index => index_id.to_owned(),
    }
}

/// Applies time-slicing to one resource: replicas and the advertised name.
fn share(name: String, devices: Vec<PluginDevice>, settings: &Settings) -> Resource {
    let Some(sharing) = settings.sharing.iter().find(|s| s.name == name) else {
        return Resource {
            name,
            replicas: None,
            devices,
        };
    };
    let replicated = devices
        .iter()
        .flat_map(|device| {
            (0..sharing.replicas).map(move |n| {
                PluginDevice {
                    replica: Some(n),
                    ..device.clone()
                }
                .with_id()
            })
        })
        .collect();
    Resource {
        name: sharing.rename.clone().unwrap_or(name),
        replicas: Some(sharing.replicas),
        devices: replicated,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inventory::model::Pci;
    use crate::inventory::test_support::{self, snapshot};
    use crate::resources::settings::Sharing;

    fn gpu(index: u32, migs: &[(&str, u32, u32)]) -> Gpu {
        let base = test_support::gpu(
            index,
            &format!("GPU-{index}"),
            "NVIDIA A100-SXM4-80GB",
            81920,
        );
        let devices = migs
            .iter()
            .zip(0u32..)
            .map(|(&(profile, g, c), i)| MigDevice {
                profile: profile.into(),
                gpu_slices: g,
                compute_slices: c,
                ..test_support::mig(i, &format!("MIG-{index}-{i}"), i + 1, 0)
            })
            .collect();
        test_support::with_migs(
            Gpu {
                device_node: Some(format!("/dev/nvidia{index}")),
                pci: Pci {
                    bus_id: format!("00000000:0{index}:00.0").into(),
                    device_id: "0x20B210DE".into(),
                    subsystem_id: None,
                },
                numa_node: Some(index / 2),
                ..base
            },
            devices,
        )
    }

    fn ids(resource: &Resource) -> Vec<&str> {
        resource.devices.iter().map(|d| d.id.as_str()).collect()
    }

    #[test]
    fn none_strategy_offers_whole_gpus_even_with_mig_on() {
        let snap = snapshot(vec![gpu(0, &[]), gpu(1, &[("1g.10gb", 1, 1)])]);
        let out = resources(&snap, &Settings::default()).unwrap();
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].name, "nvidia.com/gpu");
        assert_eq!(ids(&out[0]), ["GPU-0", "GPU-1"]);
        assert_eq!(out[0].socket_name(), "nvidia-gpu.sock");
        assert_eq!(out[0].devices[1].numa, Some(0));
    }

    #[test]
    fn index_ids() {
        let snap = snapshot(vec![gpu(0, &[("1g.10gb", 1, 1), ("1g.10gb", 1, 1)])]);
        let settings = Settings {
            mig_strategy: MigStrategy::Single,
            id_strategy: IdStrategy::Index,
            ..Settings::default()
        };
        let out = resources(&snap, &settings).unwrap();
        assert_eq!(ids(&out[0]), ["0:0", "0:1"]);
    }

    #[test]
    fn single_strategy_errors_as_nvidia() {
        let settings = Settings {
            mig_strategy: MigStrategy::Single,
            ..Settings::default()
        };
        let mixed_modes = snapshot(vec![gpu(0, &[]), gpu(1, &[("1g.10gb", 1, 1)])]);
        assert_eq!(
            resources(&mixed_modes, &settings),
            Err(ResourceError::MixedMigModes)
        );
        let profiles = snapshot(vec![gpu(0, &[("1g.10gb", 1, 1), ("2g.20gb", 2, 2)])]);
        assert_eq!(
            resources(&profiles, &settings),
            Err(ResourceError::SeveralProfiles("1g.10gb, 2g.20gb".into()))
        );
        let all = snapshot(vec![
            gpu(0, &[("1g.10gb", 1, 1)]),
            gpu(1, &[("1g.10gb", 1, 1)]),
        ]);
        let out = resources(&all, &settings).unwrap();
        assert_eq!(
            (out[0].name.as_str(), ids(&out[0])),
            ("nvidia.com/gpu", vec!["MIG-0-0", "MIG-1-0"])
        );
    }

    #[test]
    fn a_gpu_being_repartitioned_is_withdrawn_with_its_mig_devices() {
        let settings = Settings {
            mig_strategy: MigStrategy::Mixed,
            ..Settings::default()
        };
        let mut snap = snapshot(vec![gpu(0, &[]), gpu(1, &[("3g.40gb", 3, 3)]), gpu(2, &[])]);
        snap.set_reconfiguring(&[1, 2]);
        let health: Vec<(String, Vec<(String, bool)>)> = resources(&snap, &settings)
            .unwrap()
            .iter()
            .map(|r| {
                let devices = r.devices.iter().map(|d| (d.id.clone(), d.healthy));
                (r.name.clone(), devices.collect())
            })
            .collect();
        assert_eq!(
            health,
            [
                (
                    "nvidia.com/gpu".to_owned(),
                    vec![("GPU-0".to_owned(), true), ("GPU-2".to_owned(), false)]
                ),
                (
                    "nvidia.com/mig-3g.40gb".to_owned(),
                    vec![("MIG-1-0".to_owned(), false)]
                )
            ]
        );
    }

    #[test]
    fn mixed_strategy_names_profiles() {
        let settings = Settings {
            mig_strategy: MigStrategy::Mixed,
            ..Settings::default()
        };
        let snap = snapshot(vec![
            gpu(0, &[]),
            gpu(1, &[("1g.10gb+me", 1, 1), ("3g.40gb", 3, 3)]),
        ]);
        let out = resources(&snap, &settings).unwrap();
        let names: Vec<&str> = out.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "nvidia.com/gpu",
                "nvidia.com/mig-1g.10gb.me",
                "nvidia.com/mig-3g.40gb"
            ]
        );
        assert_eq!(out[1].socket_name(), "nvidia-mig-1g.10gb.me.sock");
        let bad = snapshot(vec![gpu(0, &[("1c.3g.40gb", 3, 1)])]);
        assert_eq!(
            resources(&bad, &settings),
            Err(ResourceError::UnnamedProfile {
                gpu: 0,
                profile: "1c.3g.40gb".into()
            })
        );
    }

    #[test]
    fn time_slicing_replicas_and_rename() {
        let snap = snapshot(vec![gpu(0, &[]), gpu(1, &[])]);
        let mut settings = Settings {
            sharing: vec![Sharing {
                name: "nvidia.com/gpu".into(),
                replicas: 2,
                rename: None,
            }],
            ..Settings::default()
        };
        let out = resources(&snap, &settings).unwrap();
        assert_eq!(out[0].name, "nvidia.com/gpu");
        assert_eq!(
            ids(&out[0]),
            ["GPU-0::0", "GPU-0::1", "GPU-1::0", "GPU-1::1"]
        );
        assert_eq!(out[0].replicas, Some(2));
        settings.sharing[0].rename = Some("nvidia.com/gpu.shared".into());
        let out = resources(&snap, &settings).unwrap();
        assert_eq!(out[0].name, "nvidia.com/gpu.shared");
        assert_eq!(out[0].socket_name(), "nvidia-gpu.shared.sock");
    }
}
