//! Allocate: the container edits for a set of device IDs, as NVIDIA's device plugin makes
//! them, for every `deviceListStrategy`, with MPS's pipe directory and shm when shared by MPS. Pure: the CDI annotation key's random part and the
//! device nodes that exist on the host are inputs.

use std::collections::HashMap;
use std::path::Path;

use super::mps;
use crate::proto::deviceplugin::{CdiDevice, ContainerAllocateResponse, DeviceSpec, Mount};
use crate::resources::settings::{CDI_KIND, ListStrategy, Settings};
use crate::resources::{PluginDevice, Resource};

/// Where the volume-mounts strategy lists devices inside the container.
pub const VOLUME_MOUNTS_ROOT: &str = "/var/run/nvidia-container-devices";

/// Control device nodes passed with `passDeviceSpecs` when they exist on the host.
pub const CONTROL_NODES: &[&str] = &[
    "/dev/nvidiactl",
    "/dev/nvidia-uvm",
    "/dev/nvidia-uvm-tools",
    "/dev/nvidia-modeset",
];

/// Why a request is refused; the message names the offending ID.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AllocateError {
    #[error("invalid request: unknown device: {0}")]
    Unknown(String),
    #[error("invalid request: device {0} is unhealthy")]
    Unhealthy(String),
    #[error("invalid request: maximum request size for shared resources is 1; found {0}")]
    TooManyShared(usize),
}

/// Host facts the response depends on.
#[derive(Debug, Clone, Default)]
pub struct HostView<'a> {
    /// Which control nodes exist under the dev root (checked by the caller).
    pub control_nodes: &'a [&'a str],
    /// `/dev/nvidia-caps/nvidia-cap<N>` paths per MIG device UUID, when known.
    pub mig_caps: Option<&'a HashMap<String, Vec<String>>>,
}

/// The edits for one container requesting `ids` from `resource`.
pub fn allocate(
    resource: &Resource,
    settings: &Settings,
    ids: &[String],
    annotation_suffix: &str,
    host: &HostView<'_>,
) -> Result<ContainerAllocateResponse, AllocateError> {
    let mut devices: Vec<&PluginDevice> = Vec::with_capacity(ids.len());
    for id in ids {
        let device = resource
            .device(id)
            .ok_or_else(|| AllocateError::Unknown(id.clone()))?;
        if !device.healthy {
            return Err(AllocateError::Unhealthy(id.clone()));
        }
        devices.push(device);
    }
    if resource.replicas.is_some() && settings.fail_requests_greater_than_one && ids.len() > 1 {
        return Err(AllocateError::TooManyShared(ids.len()));
    }
    // Replicas of one GPU are one device to the container: strip `::n`, keep first-seen order.
    let mut unique: Vec<&PluginDevice> = Vec::with_capacity(devices.len());
    for device in devices {
        if !unique.iter().any(|d| d.base_id == device.base_id) {
            unique.push(device);
        }
    }
    let visible: Vec<&str> = unique.iter().map(|d| d.base_id.as_str()).collect();

    let mut response = ContainerAllocateResponse::default();
    let strategies = &settings.list_strategies;
    if strategies.iter().any(|s| s.is_cdi()) {
        let names: Vec<String> = visible
            .iter()
            .map(|id| format!("{CDI_KIND}={id}"))
            .collect();
        if strategies.contains(&ListStrategy::CdiAnnotations) {
            let key = format!(
                "{}nvidia-device-plugin_{annotation_suffix}",
                settings.cdi_annotation_prefix
            );
            response.annotations.insert(key, names.join(","));
        }
        if strategies.contains(&ListStrategy::CdiCri) {
            response.cdi_devices = names.into_iter().map(|name| CdiDevice { name }).collect();
        }
    }
    // MPS clients find their daemon through the pipe directory and share memory through the
    // daemon's tmpfs; NVIDIA adds both before deciding whether CDI alone answers.
    if let (Some(root), Some(_)) = (&settings.mps_root, resource.replicas) {
        mps::edit_response(&mut response, root, &resource.name);
    }
    if strategies.iter().all(|s| s.is_cdi()) {
        return Ok(response);
    }
    if strategies.contains(&ListStrategy::Envvar) {
        response
            .envs
            .insert("NVIDIA_VISIBLE_DEVICES".into(), visible.join(","));
    }
    if strategies.contains(&ListStrategy::VolumeMounts) {
        response
            .envs
            .insert("NVIDIA_VISIBLE_DEVICES".into(), VOLUME_MOUNTS_ROOT.into());
        response.mounts.extend(visible.iter().map(|id| Mount {
            container_path: format!("{VOLUME_MOUNTS_ROOT}/{id}"),
            host_path: "/dev/null".into(),
            read_only: false,
        }));
    }
    if settings.pass_device_specs {
        response.devices = device_specs(&unique, settings, host);
    }
    Ok(response)
}

/// Device nodes for `passDeviceSpecs`: the control nodes that exist, each GPU's node once, and
/// for MIG devices their capability nodes.
fn device_specs(
    devices: &[&PluginDevice],
    settings: &Settings,
    host: &HostView<'_>,
) -> Vec<DeviceSpec> {
    let mut paths: Vec<String> = host.control_nodes.iter().map(|p| (*p).to_owned()).collect();
    for device in devices {
        if let Some(minor) = device.minor {
            let node = format!("/dev/nvidia{minor}");
            if !paths.contains(&node) {
                paths.push(node);
            }
        }
        if device.mig.is_some()
            && let Some(caps) = host.mig_caps.and_then(|caps| caps.get(&device.uuid))
        {
            for cap in caps {
                if !paths.contains(cap) {
                    paths.push(cap.clone());
                }
            }
        }
    }
    paths
        .into_iter()
        .map(|path| DeviceSpec {
            host_path: host_path(&settings.dev_root, &path),
            container_path: path,
            permissions: "rw".into(),
        })
        .collect()
}

fn host_path(root: &Path, path: &str) -> String {
    root.join(path.trim_start_matches('/'))
        .to_string_lossy()
        .into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::MigPlace;

    fn device(id: &str, base: &str, gpu: u32, replica: Option<u32>) -> PluginDevice {
        PluginDevice {
            id: id.into(),
            base_id: base.into(),
            uuid: base.into(),
            index_id: gpu.to_string(),
            gpu,
            minor: Some(gpu),
            mig: None,
            healthy: true,
            numa: None,
            replica,
        }
    }

    fn gpus() -> Resource {
        Resource {
            name: "nvidia.com/gpu".into(),
            replicas: None,
            devices: vec![device("foo", "foo", 0, None), device("bar", "bar", 1, None)],
        }
    }

    fn ids(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn envvar_dedups_in_first_seen_order() {
        let shared = Resource {
            name: "nvidia.com/gpu".into(),
            replicas: Some(2),
            devices: vec![
                device("foo::0", "foo", 0, Some(0)),
                device("foo::1", "foo", 0, Some(1)),
                device("bar::0", "bar", 1, Some(0)),
            ],
        };
        let out = allocate(
            &shared,
            &Settings::default(),
            &ids(&["foo::0", "bar::0", "foo::1"]),
            "x",
            &HostView::default(),
        )
        .unwrap();
        assert_eq!(
            out.envs.get("NVIDIA_VISIBLE_DEVICES").map(String::as_str),
            Some("foo,bar")
        );
        assert!(out.mounts.is_empty() && out.devices.is_empty() && out.annotations.is_empty());
    }

    #[test]
    fn volume_mounts() {
        let settings = Settings {
            list_strategies: vec![ListStrategy::VolumeMounts],
            ..Settings::default()
        };
        let out = allocate(
            &gpus(),
            &settings,
            &ids(&["bar", "foo"]),
            "x",
            &HostView::default(),
        )
        .unwrap();
        assert_eq!(
            out.envs.get("NVIDIA_VISIBLE_DEVICES").map(String::as_str),
            Some(VOLUME_MOUNTS_ROOT)
        );
        assert_eq!(
            out.mounts,
            vec![
                Mount {
                    container_path: "/var/run/nvidia-container-devices/bar".into(),
                    host_path: "/dev/null".into(),
                    read_only: false
                },
                Mount {
                    container_path: "/var/run/nvidia-container-devices/foo".into(),
                    host_path: "/dev/null".into(),
                    read_only: false
                },
            ]
        );
    }

    #[test]
    fn cdi_strategies_only() {
        let settings = Settings {
            list_strategies: vec![ListStrategy::CdiAnnotations, ListStrategy::CdiCri],
            ..Settings::default()
        };
        let out = allocate(
            &gpus(),
            &settings,
            &ids(&["foo", "bar"]),
            "4a1b",
            &HostView::default(),
        )
        .unwrap();
        assert!(out.envs.is_empty());
        assert_eq!(
            out.annotations
                .get("cdi.k8s.io/nvidia-device-plugin_4a1b")
                .map(String::as_str),
            Some("k8s.device-plugin.nvidia.com/gpu=foo,k8s.device-plugin.nvidia.com/gpu=bar")
        );
        let names: Vec<&str> = out.cdi_devices.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "k8s.device-plugin.nvidia.com/gpu=foo",
                "k8s.device-plugin.nvidia.com/gpu=bar"
            ]
        );
    }

    /// Under MPS every strategy keeps the pipe directory and shm edits: CDI alone answers with
    /// them, and volume-mounts adds its mounts after them.
    #[test]
    fn mps_edits_with_cdi_and_volume_mounts() {
        let shared = Resource {
            name: "nvidia.com/gpu".into(),
            replicas: Some(2),
            devices: vec![
                device("foo::0", "foo", 0, Some(0)),
                device("foo::1", "foo", 0, Some(1)),
            ],
        };
        let mps_mounts = vec![
            Mount {
                container_path: "/mps/nvidia.com/gpu/pipe".into(),
                host_path: "/run/nvidia/mps/nvidia.com/gpu/pipe".into(),
                read_only: false,
            },
            Mount {
                container_path: "/dev/shm".into(),
                host_path: "/run/nvidia/mps/shm".into(),
                read_only: false,
            },
        ];
        let pipe_env: HashMap<String, String> = [(
            "CUDA_MPS_PIPE_DIRECTORY".to_owned(),
            "/mps/nvidia.com/gpu/pipe".to_owned(),
        )]
        .into();
        let cdi = Settings {
            list_strategies: vec![ListStrategy::CdiCri],
            mps_root: Some("/run/nvidia/mps".into()),
            ..Settings::default()
        };
        let out = allocate(&shared, &cdi, &ids(&["foo::1"]), "x", &HostView::default()).unwrap();
        assert_eq!(
            out,
            ContainerAllocateResponse {
                envs: pipe_env.clone(),
                mounts: mps_mounts.clone(),
                cdi_devices: vec![CdiDevice {
                    name: "k8s.device-plugin.nvidia.com/gpu=foo".into()
                }],
                ..ContainerAllocateResponse::default()
            }
        );
        let volumes = Settings {
            list_strategies: vec![ListStrategy::VolumeMounts],
            ..cdi
        };
        let out = allocate(
            &shared,
            &volumes,
            &ids(&["foo::0"]),
            "x",
            &HostView::default(),
        )
        .unwrap();
        let mut envs = pipe_env;
        envs.insert("NVIDIA_VISIBLE_DEVICES".into(), VOLUME_MOUNTS_ROOT.into());
        let mut mounts = mps_mounts;
        mounts.push(Mount {
            container_path: "/var/run/nvidia-container-devices/foo".into(),
            host_path: "/dev/null".into(),
            read_only: false,
        });
        assert_eq!(
            out,
            ContainerAllocateResponse {
                envs,
                mounts,
                ..ContainerAllocateResponse::default()
            }
        );
    }

    #[test]
    fn pass_device_specs_under_dev_root() {
        let settings = Settings {
            pass_device_specs: true,
            dev_root: "/run/nvidia/driver".into(),
            ..Settings::default()
        };
        let mut resource = gpus();
        resource.devices[1].mig = Some(MigPlace {
            gpu_instance_id: 1,
            compute_instance_id: 0,
            index: 0,
        });
        let caps: HashMap<String, Vec<String>> = [(
            "bar".to_owned(),
            vec![
                "/dev/nvidia-caps/nvidia-cap12".to_owned(),
                "/dev/nvidia-caps/nvidia-cap13".to_owned(),
            ],
        )]
        .into();
        let host = HostView {
            control_nodes: &["/dev/nvidiactl"],
            mig_caps: Some(&caps),
        };
        let out = allocate(&resource, &settings, &ids(&["bar"]), "x", &host).unwrap();
        let specs: Vec<(&str, &str, &str)> = out
            .devices
            .iter()
            .map(|d| {
                (
                    d.container_path.as_str(),
                    d.host_path.as_str(),
                    d.permissions.as_str(),
                )
            })
            .collect();
        assert_eq!(
            specs,
            [
                ("/dev/nvidiactl", "/run/nvidia/driver/dev/nvidiactl", "rw"),
                ("/dev/nvidia1", "/run/nvidia/driver/dev/nvidia1", "rw"),
                (
                    "/dev/nvidia-caps/nvidia-cap12",
                    "/run/nvidia/driver/dev/nvidia-caps/nvidia-cap12",
                    "rw"
                ),
                (
                    "/dev/nvidia-caps/nvidia-cap13",
                    "/run/nvidia/driver/dev/nvidia-caps/nvidia-cap13",
                    "rw"
                ),
            ]
        );
    }

    #[test]
    fn refusals_name_the_id() {
        let mut resource = gpus();
        let err = allocate(
            &resource,
            &Settings::default(),
            &ids(&["baz"]),
            "x",
            &HostView::default(),
        )
        .unwrap_err();
        assert_eq!(err.to_string(), "invalid request: unknown device: baz");
        resource.devices[0].healthy = false;
        let err = allocate(
            &resource,
            &Settings::default(),
            &ids(&["foo"]),
            "x",
            &HostView::default(),
        )
        .unwrap_err();
        assert_eq!(err.to_string(), "invalid request: device foo is unhealthy");
        let shared = Resource {
            replicas: Some(4),
            ..gpus()
        };
        let settings = Settings {
            fail_requests_greater_than_one: true,
            ..Settings::default()
        };
        let err = allocate(
            &shared,
            &settings,
            &ids(&["foo", "bar"]),
            "x",
            &HostView::default(),
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid request: maximum request size for shared resources is 1; found 2"
        );
    }
}
