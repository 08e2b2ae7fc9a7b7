//! `sharing.timeSlicing` / `sharing.mps`: replicated resources, and the resource-name rules
//! they share with `resources`.
//!
//! NVIDIA parses per-resource `rename` and `devices` but then forces them (`rename` to empty or
//! `<name>.shared`, `devices` to `all`) with a warning, because per-GPU subsets are not
//! implemented. gpud does exactly the same so that a config behaves identically under both.

use super::types::SharingStrategy;
use crate::dns_name;

/// Prefix every resource name carries.
pub const RESOURCE_PREFIX: &str = "nvidia.com/";
/// Longest fully-qualified resource name Kubernetes accepts.
pub const MAX_RESOURCE_NAME: usize = 63;

/// The `sharing` section, validated.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Sharing {
    /// `sharing.timeSlicing`.
    pub time_slicing: ReplicatedResources,
    /// `sharing.mps`.
    pub mps: ReplicatedResources,
}

/// A replication section (`timeSlicing` or `mps`), validated and normalised.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ReplicatedResources {
    /// `renameByDefault`.
    pub rename_by_default: bool,
    /// `failRequestsGreaterThanOne`: reject requests for more than one replica.
    pub fail_requests_greater_than_one: bool,
    /// The replicated resources.
    pub resources: Vec<ReplicatedResource>,
}

/// One replicated resource.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplicatedResource {
    /// Fully-qualified resource name, e.g. `nvidia.com/gpu`.
    pub name: String,
    /// Replicas per device (at least 2).
    pub replicas: u32,
    /// The name the replicas are advertised under instead of `name`: `None`, or
    /// `<name>.shared` with `renameByDefault` (NVIDIA ignores other values).
    pub rename: Option<String>,
    /// Which devices are replicated; always [`ReplicatedDevices::All`] once normalised.
    pub devices: ReplicatedDevices,
}

/// `devices` of a replicated resource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplicatedDevices {
    /// Every device of the resource.
    All,
    /// The first N devices.
    Count(u32),
    /// Devices by index (`0`, `0:1`) or UUID (`GPU-…`, `MIG-…`).
    List(Vec<String>),
}

impl Sharing {
    /// The sharing in force: MPS if it replicates anything, else time-slicing if it does,
    /// else none.
    pub fn strategy(&self) -> SharingStrategy {
        let replicates = |r: &ReplicatedResources| r.resources.iter().any(|res| res.replicas > 1);
        if replicates(&self.mps) {
            SharingStrategy::Mps
        } else if replicates(&self.time_slicing) {
            SharingStrategy::TimeSlicing
        } else {
            SharingStrategy::None
        }
    }

    /// The section that is in force (MPS when the strategy is MPS, else time-slicing).
    pub fn replicated(&self) -> &ReplicatedResources {
        match self.strategy() {
            SharingStrategy::Mps => &self.mps,
            _ => &self.time_slicing,
        }
    }

    /// The replication settings for one resource name, if it is replicated.
    pub fn resource(&self, name: &str) -> Option<&ReplicatedResource> {
        self.replicated().resources.iter().find(|r| r.name == name)
    }
}

/// Normalises a resource name: adds `nvidia.com/` when missing, then checks that the whole
/// name fits Kubernetes' limits.
pub fn resource_name(text: &str) -> Result<String, String> {
    let full = if text.starts_with(RESOURCE_PREFIX) {
        text.to_owned()
    } else {
        format!("{RESOURCE_PREFIX}{text}")
    };
    if full.len() > MAX_RESOURCE_NAME {
        return Err(format!(
            "the fully-qualified resource name {full} is longer than {MAX_RESOURCE_NAME} characters"
        ));
    }
    let name = &full[RESOURCE_PREFIX.len()..];
    if !dns_name::is_subdomain(name) {
        return Err(
            "the name after nvidia.com/ must be a DNS subdomain: lower-case letters, \
                    digits, '-' and '.', starting and ending with a letter or digit"
                .into(),
        );
    }
    Ok(full)
}

/// Whether a `devices` list entry is one NVIDIA accepts: a GPU index (`0`), a MIG index
/// (`0:1`), a GPU UUID (`GPU-<uuid>`) or a MIG UUID (`MIG-<uuid>` or
/// `MIG-GPU-<uuid>/<gi>/<ci>`).
pub fn is_device_ref(text: &str) -> bool {
    let is_uint = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if is_uint(text) {
        return true;
    }
    if let Some((gpu, mig)) = text.split_once(':') {
        return is_uint(gpu) && is_uint(mig);
    }
    if let Some(uuid) = text.strip_prefix("GPU-") {
        return is_uuid(uuid);
    }
    if let Some(rest) = text.strip_prefix("MIG-") {
        if is_uuid(rest) {
            return true;
        }
        let mut parts = rest.splitn(3, '/');
        return matches!(
            (parts.next(), parts.next(), parts.next()),
            (Some(gpu), Some(gi), Some(ci))
                if gpu.strip_prefix("GPU-").is_some_and(is_uuid) && is_uint(gi) && is_uint(ci)
        );
    }
    false
}

/// A textual UUID, `8-4-4-4-12` hexadecimal digits.
fn is_uuid(text: &str) -> bool {
    let groups: Vec<&str> = text.split('-').collect();
    groups.len() == 5
        && groups
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(g, len)| g.len() == len && g.bytes().all(|b| b.is_ascii_hexdigit()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resource_names() {
        assert_eq!(resource_name("gpu").unwrap(), "nvidia.com/gpu");
        assert_eq!(resource_name("nvidia.com/gpu").unwrap(), "nvidia.com/gpu");
        assert_eq!(
            resource_name("mig-1g.10gb").unwrap(),
            "nvidia.com/mig-1g.10gb"
        );
        assert!(resource_name("GPU").is_err());
        assert!(resource_name("gpu_shared").is_err());
        assert!(resource_name("-gpu").is_err());
        assert!(resource_name(&"a".repeat(60)).is_err());
    }

    #[test]
    fn device_refs() {
        for ok in [
            "0",
            "12",
            "0:1",
            "GPU-b1028956-cfa2-0990-bf4a-5da9abb51763",
            "MIG-b1028956-cfa2-0990-bf4a-5da9abb51763",
            "MIG-GPU-b1028956-cfa2-0990-bf4a-5da9abb51763/3/0",
        ] {
            assert!(is_device_ref(ok), "{ok}");
        }
        for bad in [
            "",
            "-1",
            "0:",
            "a:1",
            "GPU-123",
            "MIG-GPU-b1028956-cfa2-0990-bf4a-5da9abb51763/3",
            "all",
        ] {
            assert!(!is_device_ref(bad), "{bad}");
        }
    }

    fn replicated(name: &str, replicas: u32) -> ReplicatedResources {
        ReplicatedResources {
            resources: vec![ReplicatedResource {
                name: name.into(),
                replicas,
                rename: None,
                devices: ReplicatedDevices::All,
            }],
            ..ReplicatedResources::default()
        }
    }

    #[test]
    fn strategy_prefers_mps() {
        let mut sharing = Sharing::default();
        assert_eq!(sharing.strategy(), SharingStrategy::None);
        sharing.time_slicing = replicated("nvidia.com/gpu", 4);
        assert_eq!(sharing.strategy(), SharingStrategy::TimeSlicing);
        assert_eq!(sharing.resource("nvidia.com/gpu").unwrap().replicas, 4);
        sharing.mps = replicated("nvidia.com/gpu", 2);
        assert_eq!(sharing.strategy(), SharingStrategy::Mps);
        assert_eq!(sharing.resource("nvidia.com/gpu").unwrap().replicas, 2);
        assert!(sharing.resource("nvidia.com/mig-1g.10gb").is_none());
    }
}
