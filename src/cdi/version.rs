//! Which `cdiVersion` a spec declares: the oldest schema version that has every feature the
//! spec uses, so that the oldest runtimes that can read it accept it.
//!
//! The rule, feature by feature (the schema's own minimum-version checks):
//!
//! | the spec uses | needs |
//! |---|---|
//! | nothing below | `0.3.0` |
//! | a mount with a `type` | `0.4.0` |
//! | a device name that does not start with a letter (`0`, `0:1`), or a device node with a `hostPath` | `0.5.0` |
//! | a `.` in the class of `kind` (`nvidia.com/gpu.coherent`) | `0.6.0` |
//!
//! gpud's default spec names devices by index, so it declares `0.5.0`, as `nvidia-ctk` does;
//! a spec named by UUID only, under `/`, declares `0.3.0`.

use std::fmt;

use super::spec::{ContainerEdits, Spec};

/// A CDI schema version gpud may declare.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum CdiVersion {
    /// The base gpud never goes below.
    V030,
    /// Mount `type`.
    V040,
    /// Device names starting with a digit; device node `hostPath`.
    V050,
    /// Dots in the class.
    V060,
}

impl CdiVersion {
    /// The version as written in `cdiVersion`.
    pub fn as_str(self) -> &'static str {
        match self {
            CdiVersion::V030 => "0.3.0",
            CdiVersion::V040 => "0.4.0",
            CdiVersion::V050 => "0.5.0",
            CdiVersion::V060 => "0.6.0",
        }
    }
}

impl fmt::Display for CdiVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The oldest version that can express `spec` (its `cdiVersion` field is ignored).
pub fn minimum(spec: &Spec) -> CdiVersion {
    let class_has_dot = spec
        .kind
        .split_once('/')
        .is_some_and(|(_, class)| class.contains('.'));
    if class_has_dot {
        return CdiVersion::V060;
    }
    let edits = || {
        spec.devices
            .iter()
            .map(|device| &device.container_edits)
            .chain(std::iter::once(&spec.container_edits))
    };
    let name_not_letter = spec.devices.iter().any(|device| {
        device
            .name
            .chars()
            .next()
            .is_some_and(|c| !c.is_ascii_alphabetic())
    });
    if name_not_letter || edits().any(has_host_path) {
        return CdiVersion::V050;
    }
    if edits().any(|e| e.mounts.iter().any(|m| m.mount_type.is_some())) {
        return CdiVersion::V040;
    }
    CdiVersion::V030
}

fn has_host_path(edits: &ContainerEdits) -> bool {
    edits
        .device_nodes
        .iter()
        .any(|node| node.host_path.is_some())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cdi::spec::{Device, DeviceNode, Mount};

    fn spec(kind: &str, names: &[&str]) -> Spec {
        Spec {
            cdi_version: String::new(),
            kind: kind.into(),
            devices: names
                .iter()
                .map(|name| Device {
                    name: (*name).into(),
                    container_edits: ContainerEdits {
                        device_nodes: vec![DeviceNode::from_host("/dev/nvidia0".into(), None)],
                        ..ContainerEdits::default()
                    },
                })
                .collect(),
            container_edits: ContainerEdits::default(),
        }
    }

    #[test]
    fn letters_only_need_the_base_version() {
        let s = spec("nvidia.com/gpu", &["GPU-1a2b", "gpu0", "mig0:1", "all"]);
        assert_eq!(minimum(&s), CdiVersion::V030);
    }

    #[test]
    fn index_names_need_0_5_0() {
        assert_eq!(
            minimum(&spec("nvidia.com/gpu", &["0", "all"])),
            CdiVersion::V050
        );
        assert_eq!(minimum(&spec("nvidia.com/gpu", &["0:1"])), CdiVersion::V050);
    }

    #[test]
    fn host_path_needs_0_5_0_in_common_or_device_edits() {
        let mut s = spec("nvidia.com/gpu", &["all"]);
        s.container_edits.device_nodes.push(DeviceNode::from_host(
            "/dev/nvidiactl".into(),
            Some("/run/nvidia/driver/dev/nvidiactl".into()),
        ));
        assert_eq!(minimum(&s), CdiVersion::V050);

        let mut s = spec("nvidia.com/gpu", &["all"]);
        s.devices[0].container_edits.device_nodes[0].host_path = Some("/x/dev/nvidia0".into());
        assert_eq!(minimum(&s), CdiVersion::V050);
    }

    #[test]
    fn mount_type_needs_0_4_0() {
        let mut s = spec("nvidia.com/gpu", &["all"]);
        s.container_edits.mounts.push(Mount {
            host_path: "/a".into(),
            container_path: "/a".into(),
            options: vec![],
            mount_type: Some("bind".into()),
        });
        assert_eq!(minimum(&s), CdiVersion::V040);
    }

    #[test]
    fn dotted_class_needs_0_6_0_but_dotted_vendor_does_not() {
        assert_eq!(
            minimum(&spec("nvidia.com/gpu.coherent", &["all"])),
            CdiVersion::V060
        );
        assert_eq!(
            minimum(&spec("k8s.device-plugin.nvidia.com/gpu", &["GPU-1"])),
            CdiVersion::V030
        );
    }
}
