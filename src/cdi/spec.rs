//! The CDI spec document as container runtimes read it: plain serde types whose field names
//! and optional-field rules follow the CDI schema (`cdiVersion`, `kind`, `devices`,
//! `containerEdits`, camelCase throughout).
//!
//! Optional fields that are empty are left out of the output, as the schema's own encoder
//! does; `devices` and each device's `containerEdits` are required by the schema and always
//! written. The types also deserialise, so tests and `gpud doctor` can read a spec back;
//! unknown fields written by other generators are ignored there, not rejected.

use serde::{Deserialize, Serialize};

/// A whole CDI spec file: one vendor/class and the devices it names.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Spec {
    /// The schema version the file needs, e.g. `0.5.0` (see [`super::version`]).
    pub cdi_version: String,
    /// `vendor/class`, e.g. `nvidia.com/gpu`.
    pub kind: String,
    /// The devices, referenced by runtimes as `<kind>=<name>`.
    #[serde(default)]
    pub devices: Vec<Device>,
    /// Edits applied once for any device of this spec (control nodes, driver files, hooks).
    #[serde(default, skip_serializing_if = "ContainerEdits::is_empty")]
    pub container_edits: ContainerEdits,
}

/// One device a container can ask for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Device {
    /// The name after `=` in a qualified device name (`0`, `GPU-…`, `all`).
    pub name: String,
    /// What selecting the device does to the container.
    #[serde(default)]
    pub container_edits: ContainerEdits,
}

/// Changes a runtime makes to a container's OCI spec.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerEdits {
    /// `NAME=value` environment entries.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    /// Device nodes to create in the container.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub device_nodes: Vec<DeviceNode>,
    /// OCI hooks to run.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hooks: Vec<Hook>,
    /// Bind mounts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mounts: Vec<Mount>,
}

impl ContainerEdits {
    /// Whether there is nothing to apply (the schema rejects a device with no edits).
    pub fn is_empty(&self) -> bool {
        self.env.is_empty()
            && self.device_nodes.is_empty()
            && self.hooks.is_empty()
            && self.mounts.is_empty()
    }
}

/// A device node in the container, taken from the host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceNode {
    /// Path inside the container, e.g. `/dev/nvidia0`.
    pub path: String,
    /// Path on the host when it differs from `path` (a device root other than `/`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_path: Option<String>,
    /// Node type (`c` for the character devices gpud writes); taken from the host when absent.
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub node_type: Option<String>,
    /// Major number; taken from the host when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub major: Option<i64>,
    /// Minor number; taken from the host when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub minor: Option<i64>,
    /// Cgroup permissions, a subset of `rwm`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub permissions: Option<String>,
}

impl DeviceNode {
    /// A node the runtime copies from the host: only the path (and the host path when the
    /// host's `/dev` is elsewhere).
    pub fn from_host(path: String, host_path: Option<String>) -> Self {
        DeviceNode {
            path,
            host_path,
            node_type: None,
            major: None,
            minor: None,
            permissions: None,
        }
    }
}

/// An OCI hook.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Hook {
    /// OCI hook point, e.g. `createContainer`.
    pub hook_name: String,
    /// Executable on the host.
    pub path: String,
    /// Full argv, argv[0] included.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// `NAME=value` environment of the hook.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    /// Seconds the runtime lets the hook run before it kills it and fails the start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<u32>,
}

/// A bind mount from the host into the container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Mount {
    /// Source on the host.
    pub host_path: String,
    /// Target in the container.
    pub container_path: String,
    /// Mount options, e.g. `ro`, `nosuid`, `rbind`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<String>,
    /// Filesystem type; needs spec version 0.4.0.
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub mount_type: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_optional_fields_are_left_out_and_names_are_camel_case() {
        let spec = Spec {
            cdi_version: "0.5.0".into(),
            kind: "nvidia.com/gpu".into(),
            devices: vec![Device {
                name: "0".into(),
                container_edits: ContainerEdits {
                    device_nodes: vec![DeviceNode::from_host("/dev/nvidia0".into(), None)],
                    ..ContainerEdits::default()
                },
            }],
            container_edits: ContainerEdits {
                mounts: vec![Mount {
                    host_path: "/r/usr/bin/nvidia-smi".into(),
                    container_path: "/usr/bin/nvidia-smi".into(),
                    options: vec!["ro".into()],
                    mount_type: None,
                }],
                ..ContainerEdits::default()
            },
        };
        let json = serde_json::to_string(&spec).unwrap();
        assert_eq!(
            json,
            r#"{"cdiVersion":"0.5.0","kind":"nvidia.com/gpu","devices":[{"name":"0","containerEdits":{"deviceNodes":[{"path":"/dev/nvidia0"}]}}],"containerEdits":{"mounts":[{"hostPath":"/r/usr/bin/nvidia-smi","containerPath":"/usr/bin/nvidia-smi","options":["ro"]}]}}"#
        );
        let back: Spec = serde_json::from_str(&json).unwrap();
        assert_eq!(back, spec);
    }

    #[test]
    fn spec_without_common_edits_omits_the_key_but_keeps_devices() {
        let spec = Spec {
            cdi_version: "0.3.0".into(),
            kind: "nvidia.com/gpu".into(),
            devices: vec![],
            container_edits: ContainerEdits::default(),
        };
        assert_eq!(
            serde_json::to_string(&spec).unwrap(),
            r#"{"cdiVersion":"0.3.0","kind":"nvidia.com/gpu","devices":[]}"#
        );
    }

    #[test]
    fn reads_specs_with_fields_gpud_does_not_write() {
        let text = r#"{"cdiVersion":"0.6.0","kind":"nvidia.com/gpu",
            "annotations":{"a":"b"},
            "devices":[{"name":"all","containerEdits":{"deviceNodes":[
                {"path":"/dev/nvidia0","type":"c","major":195,"minor":0,"fileMode":8630}]}}]}"#;
        let spec: Spec = serde_json::from_str(text).unwrap();
        let node = &spec.devices[0].container_edits.device_nodes[0];
        assert_eq!(node.node_type.as_deref(), Some("c"));
        assert_eq!((node.major, node.minor), (Some(195), Some(0)));
    }
}
