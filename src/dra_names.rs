//! Device names in a ResourceSlice, as NVIDIA's `gpu.nvidia.com` driver spells them, so that
//! claims, DeviceClasses and dashboards written for that driver find the same devices here.
//!
//! | device | name |
//! |---|---|
//! | full GPU | `gpu-<minor>` |
//! | MIG device | `gpu-<parent minor>-mig-<profile>-<GI profile id>-<placement start>` |
//! | counter set of a GPU (dynamic MIG) | `gpu-<minor>-counter-set` |
//!
//! The profile is NVIDIA's (`1g.10gb`) without its dots and with any other character a DNS
//! label cannot hold turned into `-` (`1g10gb`, `1g10gb-me`). Minor numbers, not UUIDs: the
//! name must be stable and short (a device name is a DNS label of at most 63 characters). A GPU
//! whose minor number NVML did not report is named by its index, which is the minor on every
//! driver seen.

use crate::inventory::model::{Gpu, MigDevice, Snapshot};

/// The DRA driver name gpud publishes under unless configured (NVIDIA's).
pub const DEFAULT_DRIVER: &str = "gpu.nvidia.com";

/// One device of the node under its DRA name.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum DraDevice<'a> {
    /// A whole GPU (MIG off).
    Gpu(&'a Gpu),
    /// A MIG device and the GPU it lives on.
    Mig(&'a Gpu, &'a MigDevice),
}

impl<'a> DraDevice<'a> {
    /// The GPU the device is, or lives on.
    pub fn gpu(&self) -> &'a Gpu {
        match self {
            DraDevice::Gpu(gpu) | DraDevice::Mig(gpu, _) => gpu,
        }
    }

    /// The device's own UUID (`GPU-…` or `MIG-…`).
    pub fn uuid(&self) -> &'a str {
        match self {
            DraDevice::Gpu(gpu) => &gpu.uuid,
            DraDevice::Mig(_, mig) => &mig.uuid,
        }
    }
}

/// `gpu-<minor>`.
pub fn gpu_name(gpu: &Gpu) -> String {
    format!("gpu-{}", gpu_minor(gpu))
}

/// The DRA name of a MIG device; `None` when NVML did not say where its GPU instance sits or
/// which profile it has (such a device cannot be named stably, so it is not published).
pub fn mig_name(parent: &Gpu, mig: &MigDevice) -> Option<String> {
    let placement = mig.placement?;
    let profile_id = mig.gpu_instance_profile_id?;
    Some(placement_name(
        parent,
        &mig.profile,
        profile_id,
        placement.start,
    ))
}

/// The DRA name of a MIG device of `profile` (GPU-instance profile `profile_id`) at memory
/// slice `start` of `parent`, whether or not it exists: a dynamic-MIG placement is published
/// under the name the instance has once created.
pub fn placement_name(parent: &Gpu, profile: &str, profile_id: u32, start: u32) -> String {
    format!(
        "gpu-{}-mig-{}-{profile_id}-{start}",
        gpu_minor(parent),
        dns_label(profile)
    )
}

/// The GPU-instance profile id and placement start a MIG device's name says
/// (`gpu-0-mig-1g10gb-19-3` → `(19, 3)`); `None` for any other name.
pub fn placement_of(name: &str) -> Option<(u32, u32)> {
    let rest = name.strip_prefix("gpu-")?;
    let (_, mig) = rest.split_once("-mig-")?;
    let mut parts = mig.rsplitn(3, '-');
    let start = parts.next()?.parse().ok()?;
    let profile_id = parts.next()?.parse().ok()?;
    parts.next().filter(|profile| !profile.is_empty())?;
    Some((profile_id, start))
}

/// The name of GPU `gpu`'s counter set (its memory and memory slices), as NVIDIA's driver
/// names it.
pub fn counter_set_name(gpu: &Gpu) -> String {
    format!("gpu-{}-counter-set", gpu_minor(gpu))
}

/// Every device of the snapshot with its name: a GPU with MIG on contributes its MIG devices,
/// one without contributes itself. MIG devices that cannot be named are left out.
pub fn devices(snapshot: &Snapshot) -> impl Iterator<Item = (String, DraDevice<'_>)> {
    snapshot.gpus.iter().flat_map(|gpu| {
        let whole = (!gpu.mig.enabled).then(|| (gpu_name(gpu), DraDevice::Gpu(gpu)));
        let migs = gpu
            .mig
            .devices
            .iter()
            .filter(move |_| gpu.mig.enabled)
            .filter_map(move |mig| mig_name(gpu, mig).map(|name| (name, DraDevice::Mig(gpu, mig))));
        whole.into_iter().chain(migs)
    })
}

/// The device called `name`, if the node has it.
pub fn find<'a>(snapshot: &'a Snapshot, name: &str) -> Option<DraDevice<'a>> {
    devices(snapshot).find_map(|(candidate, device)| (candidate == name).then_some(device))
}

/// The GPU a device name says it is or lives on (`gpu-<minor>…`), whether or not the node
/// still has the device itself (a MIG device destroyed since, a GPU whose MIG mode changed).
pub fn gpu_named<'a>(snapshot: &'a Snapshot, name: &str) -> Option<&'a Gpu> {
    let rest = name.strip_prefix("gpu-")?;
    let minor = rest.split('-').next()?.parse::<u32>().ok()?;
    snapshot.gpus.iter().find(|gpu| gpu_minor(gpu) == minor)
}

fn gpu_minor(gpu: &Gpu) -> u32 {
    gpu.minor_number.unwrap_or(gpu.index)
}

/// `1g.10gb+me` → `1g10gb-me`: dots dropped, letters lowered, anything else a DNS label cannot
/// hold turned into `-`.
fn dns_label(profile: &str) -> String {
    profile
        .chars()
        .filter(|c| *c != '.')
        .map(|c| {
            let c = c.to_ascii_lowercase();
            if c.is_ascii_alphanumeric() { c } else { '-' }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inventory::model::{Node, Placement};
    use crate::inventory::test_support::{gpu, mig, with_migs};

    #[test]
    fn a_mig_devices_name_says_its_profile_id_and_placement() {
        assert_eq!(placement_of("gpu-0-mig-1g10gb-19-3"), Some((19, 3)));
        assert_eq!(placement_of("gpu-12-mig-1g10gb-me-20-6"), Some((20, 6)));
        assert_eq!(placement_of("gpu-0"), None);
        assert_eq!(placement_of("gpu-0-counter-set"), None);
        assert_eq!(placement_of("gpu-0-mig-19-3"), None);
    }

    fn mig_at(index: u32, uuid: &str, profile: &str, profile_id: u32, start: u32) -> MigDevice {
        MigDevice {
            profile: profile.to_owned(),
            placement: Some(Placement { start, size: 1 }),
            gpu_instance_profile_id: Some(profile_id),
            ..mig(index, uuid, 1, 0)
        }
    }

    #[test]
    fn whole_gpus_are_named_by_minor_number() {
        let mut g = gpu(0, "GPU-a", "NVIDIA A100-SXM4-80GB", 81920);
        g.minor_number = Some(3);
        assert_eq!(gpu_name(&g), "gpu-3");
        g.minor_number = None;
        assert_eq!(gpu_name(&g), "gpu-0");
    }

    #[test]
    fn mig_devices_carry_profile_profile_id_and_placement() {
        let mut g = gpu(1, "GPU-b", "NVIDIA A100-SXM4-80GB", 81920);
        g.minor_number = Some(1);
        assert_eq!(
            mig_name(&g, &mig_at(0, "MIG-x", "1g.10gb", 19, 6)).as_deref(),
            Some("gpu-1-mig-1g10gb-19-6")
        );
        assert_eq!(
            mig_name(&g, &mig_at(0, "MIG-y", "1g.10gb+me", 20, 0)).as_deref(),
            Some("gpu-1-mig-1g10gb-me-20-0")
        );
        let unplaced = MigDevice {
            placement: None,
            ..mig_at(0, "MIG-z", "1g.10gb", 19, 0)
        };
        assert_eq!(mig_name(&g, &unplaced), None);
    }

    #[test]
    fn a_mig_enabled_gpu_lists_its_instances_not_itself() {
        let plain = gpu(0, "GPU-a", "NVIDIA A100-SXM4-80GB", 81920);
        let parted = with_migs(
            gpu(1, "GPU-b", "NVIDIA A100-SXM4-80GB", 81920),
            vec![
                mig_at(0, "MIG-1", "3g.40gb", 9, 0),
                mig_at(1, "MIG-2", "3g.40gb", 9, 4),
            ],
        );
        let snapshot = Snapshot {
            node: Node {
                hostname: "node-a".into(),
                driver_version: "570.133.20".into(),
                cuda_driver_version: None,
                nvml_version: None,
                machine_type: None,
            },
            gpus: vec![plain, parted],
            topology: Vec::new(),
        };
        let names: Vec<String> = devices(&snapshot).map(|(name, _)| name).collect();
        assert!(
            names.iter().all(|n| crate::dns_name::is_label(n)),
            "{names:?}"
        );
        assert_eq!(
            names,
            ["gpu-0", "gpu-1-mig-3g40gb-9-0", "gpu-1-mig-3g40gb-9-4"]
        );
        assert_eq!(
            find(&snapshot, "gpu-1-mig-3g40gb-9-4").map(|d| d.uuid()),
            Some("MIG-2")
        );
        assert_eq!(find(&snapshot, "gpu-1"), None);
        // The GPU a name says, even for a device the node no longer has.
        let uuid = |name: &str| gpu_named(&snapshot, name).map(|g| g.uuid.as_str());
        assert_eq!(uuid("gpu-1"), Some("GPU-b"));
        assert_eq!(uuid("gpu-1-mig-1g10gb-19-6"), Some("GPU-b"));
        assert_eq!(uuid("gpu-0"), Some("GPU-a"));
        assert_eq!(uuid("gpu-2"), None);
        assert_eq!(uuid("gpu-x"), None);
        assert_eq!(uuid("mig-1"), None);
    }
}
