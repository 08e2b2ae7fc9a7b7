//! Reading NVIDIA's v1 config file into [`FileConfig`]: what the file says, validated, with
//! every field still optional (unset means "not said here", so flags and environment can fill
//! it in with the right precedence).
//!
//! Parsing happens in two steps. serde reads the raw shape strictly (unknown keys and wrong
//! types fail with the field path and line); then each value is checked and typed here, so a
//! bad value fails with `file: field <path>: invalid value "<v>": <why>`.

use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_yaml_ng::Value;

use super::duration::{self, SleepInterval};
use super::error::{NvidiaConfigError, Origin};
use super::sharing::{
    ReplicatedDevices, ReplicatedResource, ReplicatedResources, Sharing, is_device_ref,
    resource_name,
};
use super::types::{
    AllocationPolicy, DeviceDiscoveryStrategy, DeviceIdStrategy, DeviceListStrategy, MigStrategy,
};

/// The only version; an absent or empty `version` means this one.
pub const VERSION: &str = "v1";

/// NVIDIA's warning when `resources` is set: custom resource names are not supported.
pub const RESOURCES_IGNORED: &str =
    "Customizing the 'resources' field is not yet supported in the config. Ignoring...";

/// What a config file sets, validated and typed.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FileConfig {
    /// `flags`: every field `None` unless the file sets it.
    pub flags: FileFlags,
    /// `resources`, as written (NVIDIA ignores it; see [`RESOURCES_IGNORED`]).
    pub resources: Resources,
    /// `sharing`, normalised as NVIDIA does.
    pub sharing: Sharing,
    /// `imex`.
    pub imex: Imex,
    /// Warnings to log, in NVIDIA's words, about settings that are read but ignored.
    pub warnings: Vec<String>,
}

/// `flags` as written in a file; `None` = not set there.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FileFlags {
    pub mig_strategy: Option<MigStrategy>,
    pub fail_on_init_error: Option<bool>,
    pub nvidia_driver_root: Option<PathBuf>,
    pub nvidia_dev_root: Option<PathBuf>,
    pub mps_root: Option<PathBuf>,
    pub gdrcopy_enabled: Option<bool>,
    pub gds_enabled: Option<bool>,
    pub mofed_enabled: Option<bool>,
    pub use_node_feature_api: Option<bool>,
    pub device_discovery_strategy: Option<DeviceDiscoveryStrategy>,
    /// `flags.plugin`.
    pub plugin: FilePluginFlags,
    /// `flags.gfd`.
    pub gfd: FileGfdFlags,
}

/// `flags.plugin` as written in a file.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FilePluginFlags {
    pub pass_device_specs: Option<bool>,
    pub device_list_strategy: Option<Vec<DeviceListStrategy>>,
    pub device_id_strategy: Option<DeviceIdStrategy>,
    pub cdi_annotation_prefix: Option<String>,
    pub nvidia_ctk_path: Option<PathBuf>,
    pub container_driver_root: Option<PathBuf>,
    pub shared_devices_allocation_policy: Option<AllocationPolicy>,
}

/// `flags.gfd` as written in a file.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FileGfdFlags {
    pub oneshot: Option<bool>,
    pub no_timestamp: Option<bool>,
    pub sleep_interval: Option<SleepInterval>,
    /// `""` (stdout) is kept as an empty string.
    pub output_file: Option<String>,
    pub machine_type_file: Option<PathBuf>,
}

/// `resources`: name patterns, parsed and checked but not used (as NVIDIA does).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Resources {
    pub gpus: Vec<NamedPattern>,
    pub mig: Vec<NamedPattern>,
}

/// One `resources` entry.
#[derive(Debug, Clone, PartialEq)]
pub struct NamedPattern {
    /// Wildcard pattern (`*` = anything), anchored at both ends.
    pub pattern: String,
    /// Fully-qualified resource name.
    pub name: String,
}

/// `imex`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Imex {
    /// IMEX channels to inject: empty or `[0]`.
    pub channel_ids: Vec<u32>,
    /// Whether a missing IMEX channel is an error.
    pub required: bool,
}

// === raw shape, exactly the keys NVIDIA reads ===

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawConfig {
    version: Option<String>,
    flags: Option<RawFlags>,
    resources: Option<RawResources>,
    sharing: Option<RawSharing>,
    imex: Option<RawImex>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawFlags {
    mig_strategy: Option<String>,
    fail_on_init_error: Option<bool>,
    nvidia_driver_root: Option<String>,
    nvidia_dev_root: Option<String>,
    mps_root: Option<String>,
    gdrcopy_enabled: Option<bool>,
    gds_enabled: Option<bool>,
    mofed_enabled: Option<bool>,
    #[serde(rename = "useNodeFeatureAPI")]
    use_node_feature_api: Option<bool>,
    device_discovery_strategy: Option<String>,
    plugin: Option<RawPlugin>,
    gfd: Option<RawGfd>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawPlugin {
    pass_device_specs: Option<bool>,
    device_list_strategy: Option<Value>,
    #[serde(rename = "deviceIDStrategy")]
    device_id_strategy: Option<String>,
    cdi_annotation_prefix: Option<String>,
    #[serde(rename = "nvidiaCTKPath")]
    nvidia_ctk_path: Option<String>,
    container_driver_root: Option<String>,
    shared_devices_allocation_policy: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawGfd {
    oneshot: Option<bool>,
    no_timestamp: Option<bool>,
    sleep_interval: Option<Value>,
    output_file: Option<String>,
    machine_type_file: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawResources {
    gpus: Option<Vec<RawNamedPattern>>,
    mig: Option<Vec<RawNamedPattern>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawNamedPattern {
    pattern: Option<String>,
    name: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawSharing {
    time_slicing: Option<RawReplicated>,
    mps: Option<RawReplicated>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawReplicated {
    rename_by_default: Option<bool>,
    fail_requests_greater_than_one: Option<bool>,
    resources: Option<Vec<RawReplica>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawReplica {
    name: Option<String>,
    replicas: Option<i64>,
    rename: Option<String>,
    devices: Option<Value>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawImex {
    #[serde(rename = "channelIDs")]
    channel_ids: Option<Vec<i64>>,
    required: Option<bool>,
}

// === reading ===

/// Reads and validates a config file.
pub fn load(path: &Path) -> Result<FileConfig, NvidiaConfigError> {
    let text = crate::files::read_text(path)?;
    parse(path, &text)
}

/// Validates config text (YAML or JSON); `path` is only used in messages.
pub fn parse(path: &Path, text: &str) -> Result<FileConfig, NvidiaConfigError> {
    let raw: RawConfig = if text.trim().is_empty() {
        RawConfig::default()
    } else {
        // Bounded before the parser, whose time grows with the square of the nesting.
        crate::files::check_nesting(path, text)?;
        serde_yaml_ng::from_str(text).map_err(|err| NvidiaConfigError::Parse {
            path: path.to_path_buf(),
            message: err.to_string(),
        })?
    };
    let origin = Origin::File(path.to_path_buf());
    let mut reader = Reader {
        origin: &origin,
        warnings: Vec::new(),
    };
    reader.convert(raw)
}

/// Converts the raw shape, collecting warnings.
struct Reader<'a> {
    origin: &'a Origin,
    warnings: Vec<String>,
}

impl Reader<'_> {
    fn invalid(
        &self,
        field: &str,
        value: impl Into<String>,
        why: impl Into<String>,
    ) -> NvidiaConfigError {
        NvidiaConfigError::invalid(self.origin, field, value, why)
    }

    /// Parses an optional spelled value with `FromStr`, naming the field on failure.
    fn typed<T: std::str::FromStr<Err = String>>(
        &self,
        field: &str,
        value: Option<String>,
    ) -> Result<Option<T>, NvidiaConfigError> {
        value
            .map(|text| text.parse().map_err(|why| self.invalid(field, &text, why)))
            .transpose()
    }

    fn convert(&mut self, raw: RawConfig) -> Result<FileConfig, NvidiaConfigError> {
        if let Some(version) = raw
            .version
            .as_deref()
            .filter(|v| !v.is_empty() && *v != VERSION)
        {
            return Err(self.invalid(
                "version",
                version,
                format!("unknown version; only {VERSION} exists"),
            ));
        }
        let flags = self.flags(raw.flags.unwrap_or_default())?;
        let resources = self.resources(raw.resources)?;
        let sharing = self.sharing(raw.sharing.unwrap_or_default())?;
        let imex = self.imex(raw.imex.unwrap_or_default())?;
        Ok(FileConfig {
            flags,
            resources,
            sharing,
            imex,
            warnings: std::mem::take(&mut self.warnings),
        })
    }

    fn flags(&self, raw: RawFlags) -> Result<FileFlags, NvidiaConfigError> {
        let plugin = raw.plugin.unwrap_or_default();
        let gfd = raw.gfd.unwrap_or_default();
        Ok(FileFlags {
            mig_strategy: self.typed("flags.migStrategy", raw.mig_strategy)?,
            fail_on_init_error: raw.fail_on_init_error,
            nvidia_driver_root: raw.nvidia_driver_root.map(PathBuf::from),
            nvidia_dev_root: raw.nvidia_dev_root.map(PathBuf::from),
            mps_root: raw.mps_root.map(PathBuf::from),
            gdrcopy_enabled: raw.gdrcopy_enabled,
            gds_enabled: raw.gds_enabled,
            mofed_enabled: raw.mofed_enabled,
            use_node_feature_api: raw.use_node_feature_api,
            device_discovery_strategy: self.typed(
                "flags.deviceDiscoveryStrategy",
                raw.device_discovery_strategy,
            )?,
            plugin: FilePluginFlags {
                pass_device_specs: plugin.pass_device_specs,
                device_list_strategy: plugin
                    .device_list_strategy
                    .map(|value| self.device_list_strategy(&value))
                    .transpose()?,
                device_id_strategy: self
                    .typed("flags.plugin.deviceIDStrategy", plugin.device_id_strategy)?,
                cdi_annotation_prefix: plugin.cdi_annotation_prefix,
                nvidia_ctk_path: plugin.nvidia_ctk_path.map(PathBuf::from),
                container_driver_root: plugin.container_driver_root.map(PathBuf::from),
                shared_devices_allocation_policy: self.typed(
                    "flags.plugin.sharedDevicesAllocationPolicy",
                    plugin.shared_devices_allocation_policy,
                )?,
            },
            gfd: FileGfdFlags {
                oneshot: gfd.oneshot,
                no_timestamp: gfd.no_timestamp,
                sleep_interval: gfd
                    .sleep_interval
                    .map(|value| self.sleep_interval(&value))
                    .transpose()?,
                output_file: gfd.output_file,
                machine_type_file: gfd.machine_type_file.map(PathBuf::from),
            },
        })
    }

    /// `deviceListStrategy`: one string or a list of strings.
    fn device_list_strategy(
        &self,
        value: &Value,
    ) -> Result<Vec<DeviceListStrategy>, NvidiaConfigError> {
        const FIELD: &str = "flags.plugin.deviceListStrategy";
        let items: Vec<(String, &Value)> = match value {
            Value::Sequence(list) => list
                .iter()
                .enumerate()
                .map(|(i, item)| (format!("{FIELD}[{i}]"), item))
                .collect(),
            single => vec![(FIELD.to_owned(), single)],
        };
        if items.is_empty() {
            return Err(self.invalid(FIELD, "[]", "must name at least one strategy"));
        }
        items
            .into_iter()
            .map(|(field, item)| match item {
                Value::String(text) => text.parse().map_err(|why| self.invalid(&field, text, why)),
                other => Err(self.invalid(&field, render(other), "must be a string")),
            })
            .collect()
    }

    /// `sleepInterval`: a Go duration string, `infinite`, or a number of nanoseconds.
    fn sleep_interval(&self, value: &Value) -> Result<SleepInterval, NvidiaConfigError> {
        const FIELD: &str = "flags.gfd.sleepInterval";
        match value {
            Value::String(text) => {
                SleepInterval::parse(text).map_err(|why| self.invalid(FIELD, text, why))
            }
            Value::Number(n) => {
                // A bare number is nanoseconds, as Go's encoding of time.Duration.
                let nanos = n
                    .as_i64()
                    .map(i128::from)
                    .or_else(|| n.as_f64().map(|f| f as i128));
                match nanos {
                    Some(nanos) => duration::positive(nanos)
                        .map_err(|why| self.invalid(FIELD, n.to_string(), why)),
                    None => Err(self.invalid(FIELD, n.to_string(), "not a duration")),
                }
            }
            other => Err(self.invalid(
                FIELD,
                render(other),
                "must be a duration such as 60s, or infinite",
            )),
        }
    }

    fn resources(&mut self, raw: Option<RawResources>) -> Result<Resources, NvidiaConfigError> {
        let Some(raw) = raw else {
            return Ok(Resources::default());
        };
        let list = |field: &str, entries: Option<Vec<RawNamedPattern>>| {
            entries
                .unwrap_or_default()
                .into_iter()
                .enumerate()
                .map(|(i, entry)| {
                    let at = format!("resources.{field}[{i}]");
                    let pattern = entry
                        .pattern
                        .filter(|p| !p.is_empty())
                        .ok_or_else(|| self.invalid(&format!("{at}.pattern"), "", "is required"))?;
                    let name = entry
                        .name
                        .ok_or_else(|| self.invalid(&format!("{at}.name"), "", "is required"))?;
                    let name = resource_name(&name)
                        .map_err(|why| self.invalid(&format!("{at}.name"), &name, why))?;
                    Ok(NamedPattern { pattern, name })
                })
                .collect::<Result<Vec<_>, NvidiaConfigError>>()
        };
        let resources = Resources {
            gpus: list("gpus", raw.gpus)?,
            mig: list("mig", raw.mig)?,
        };
        if !resources.gpus.is_empty() || !resources.mig.is_empty() {
            self.warnings.push(RESOURCES_IGNORED.to_owned());
        }
        Ok(resources)
    }

    fn sharing(&mut self, raw: RawSharing) -> Result<Sharing, NvidiaConfigError> {
        let time_slicing = raw
            .time_slicing
            .map(|r| self.replicated("timeSlicing", r, false))
            .transpose()?
            .unwrap_or_default();
        // MPS refuses multi-replica requests unless the file explicitly allows them.
        let mps = raw
            .mps
            .map(|r| self.replicated("mps", r, true))
            .transpose()?
            .unwrap_or_default();
        if !time_slicing.resources.is_empty() && !mps.resources.is_empty() {
            return Err(self.invalid(
                "sharing",
                "timeSlicing and mps",
                "time-slicing and MPS cannot be configured together",
            ));
        }
        Ok(Sharing { time_slicing, mps })
    }

    fn replicated(
        &mut self,
        section: &str,
        raw: RawReplicated,
        fail_default: bool,
    ) -> Result<ReplicatedResources, NvidiaConfigError> {
        let at = format!("sharing.{section}");
        let rename_by_default = raw.rename_by_default.unwrap_or(false);
        let entries = raw.resources.unwrap_or_default();
        if entries.is_empty() {
            return Err(self.invalid(
                &format!("{at}.resources"),
                "",
                "must list at least one resource",
            ));
        }
        let mut resources = Vec::with_capacity(entries.len());
        let (mut dropped_rename, mut dropped_devices) = (false, false);
        for (i, entry) in entries.into_iter().enumerate() {
            let field = |key: &str| format!("{at}.resources[{i}].{key}");
            let name = entry
                .name
                .ok_or_else(|| self.invalid(&field("name"), "", "is required"))?;
            let name =
                resource_name(&name).map_err(|why| self.invalid(&field("name"), &name, why))?;
            let replicas = entry
                .replicas
                .ok_or_else(|| self.invalid(&field("replicas"), "", "is required"))?;
            let replicas = u32::try_from(replicas)
                .ok()
                .filter(|r| *r >= 2)
                .ok_or_else(|| {
                    self.invalid(
                        &field("replicas"),
                        replicas.to_string(),
                        "must be at least 2",
                    )
                })?;
            let rename = entry
                .rename
                .filter(|r| !r.is_empty())
                .map(|r| resource_name(&r).map_err(|why| self.invalid(&field("rename"), &r, why)))
                .transpose()?;
            let devices = entry
                .devices
                .map(|value| self.devices(&field("devices"), &value))
                .transpose()?
                .unwrap_or(ReplicatedDevices::All);
            // NVIDIA's forcing: the default rename or none, and all devices.
            let default_rename = rename_by_default.then(|| format!("{name}.shared"));
            if rename.is_some() && rename != default_rename {
                dropped_rename = true;
            }
            if devices != ReplicatedDevices::All {
                dropped_devices = true;
            }
            resources.push(ReplicatedResource {
                name,
                replicas,
                rename: default_rename,
                devices: ReplicatedDevices::All,
            });
        }
        if dropped_rename {
            self.warnings.push(format!(
                "Setting the 'rename' field in sharing.{section}.resources is not yet supported in the config. Ignoring..."
            ));
        }
        if dropped_devices {
            self.warnings.push(format!(
                "Customizing the 'devices' field in sharing.{section}.resources is not yet supported in the config. Ignoring..."
            ));
        }
        Ok(ReplicatedResources {
            rename_by_default,
            fail_requests_greater_than_one: raw
                .fail_requests_greater_than_one
                .unwrap_or(fail_default),
            resources,
        })
    }

    /// `devices`: `all`, a positive count, or a list of indices and UUIDs.
    fn devices(&self, field: &str, value: &Value) -> Result<ReplicatedDevices, NvidiaConfigError> {
        match value {
            Value::String(text) if text == "all" => Ok(ReplicatedDevices::All),
            Value::String(text) => {
                Err(self.invalid(field, text, "the only string accepted is \"all\""))
            }
            Value::Number(n) => n
                .as_u64()
                .and_then(|c| u32::try_from(c).ok())
                .filter(|c| *c > 0)
                .map(ReplicatedDevices::Count)
                .ok_or_else(|| {
                    self.invalid(
                        field,
                        n.to_string(),
                        "a count of devices must be greater than 0",
                    )
                }),
            Value::Sequence(items) => items
                .iter()
                .enumerate()
                .map(|(i, item)| {
                    let text = match item {
                        Value::Number(n) if n.as_u64().is_some() => n.to_string(),
                        Value::String(s) => s.clone(),
                        other => render(other),
                    };
                    if is_device_ref(&text) {
                        Ok(text)
                    } else {
                        Err(self.invalid(
                            &format!("{field}[{i}]"),
                            &text,
                            "must be a GPU index (0), a MIG index (0:1) or a GPU-/MIG- UUID",
                        ))
                    }
                })
                .collect::<Result<Vec<_>, _>>()
                .map(ReplicatedDevices::List),
            other => Err(self.invalid(field, render(other), "must be \"all\", a count or a list")),
        }
    }

    fn imex(&self, raw: RawImex) -> Result<Imex, NvidiaConfigError> {
        let ids = raw.channel_ids.unwrap_or_default();
        if !(ids.is_empty() || ids == [0]) {
            let shown = format!(
                "[{}]",
                ids.iter()
                    .map(i64::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            return Err(self.invalid("imex.channelIDs", shown, "only [] or [0] is supported"));
        }
        Ok(Imex {
            channel_ids: if ids.is_empty() { Vec::new() } else { vec![0] },
            required: raw.required.unwrap_or(false),
        })
    }
}

/// A YAML value in one line, for messages.
fn render(value: &Value) -> String {
    serde_yaml_ng::to_string(value)
        .map(|s| s.trim_end().to_owned())
        .unwrap_or_else(|_| format!("{value:?}"))
}

#[cfg(test)]
mod tests {
    //! Parsing NVIDIA's config file: the spellings it accepts, and bad files with the exact
    //! message each one produces.

    use std::path::Path;

    use super::*;
    use crate::nvidia_config::DeviceListStrategy;

    const PATH: &str = "/config/config.yaml";

    fn file(text: &str) -> Result<FileConfig, NvidiaConfigError> {
        parse(Path::new(PATH), text)
    }

    #[test]
    fn empty_version_and_empty_file_mean_v1() {
        assert!(file("version: \"\"\n").is_ok());
        assert_eq!(file("").unwrap(), FileConfig::default());
        assert_eq!(file("# only a comment\n").unwrap(), FileConfig::default());
    }

    #[test]
    fn device_list_strategy_string_or_list() {
        let one = file("flags:\n  plugin:\n    deviceListStrategy: cdi-cri\n").unwrap();
        assert_eq!(
            one.flags.plugin.device_list_strategy,
            Some(vec![DeviceListStrategy::CdiCri])
        );
        let many =
            file("flags:\n  plugin:\n    deviceListStrategy: [envvar, cdi-annotations]\n").unwrap();
        assert_eq!(
            many.flags.plugin.device_list_strategy,
            Some(vec![
                DeviceListStrategy::Envvar,
                DeviceListStrategy::CdiAnnotations
            ])
        );
    }

    /// Bad configs and the exact message each produces.
    #[test]
    fn bad_configs_name_file_field_and_value() {
        let cases: &[(&str, &str)] = &[
            (
                "version: v2\n",
                "/config/config.yaml: field version: invalid value \"v2\": unknown version; only v1 exists",
            ),
            (
                "flags:\n  migStrategy: both\n",
                "/config/config.yaml: field flags.migStrategy: invalid value \"both\": must be one of none, single, mixed",
            ),
            (
                "flags:\n  plugin:\n    deviceListStrategy: [envvar, cdi]\n",
                "/config/config.yaml: field flags.plugin.deviceListStrategy[1]: invalid value \"cdi\": must be one of envvar, volume-mounts, cdi-annotations, cdi-cri",
            ),
            (
                "flags:\n  plugin:\n    deviceIDStrategy: serial\n",
                "/config/config.yaml: field flags.plugin.deviceIDStrategy: invalid value \"serial\": must be one of uuid, index",
            ),
            (
                "flags:\n  plugin:\n    sharedDevicesAllocationPolicy: spread\n",
                "/config/config.yaml: field flags.plugin.sharedDevicesAllocationPolicy: invalid value \"spread\": must be one of distributed, packed",
            ),
            (
                "flags:\n  deviceDiscoveryStrategy: pci\n",
                "/config/config.yaml: field flags.deviceDiscoveryStrategy: invalid value \"pci\": must be one of auto, nvml, tegra, vfio",
            ),
            (
                "flags:\n  gfd:\n    sleepInterval: soon\n",
                "/config/config.yaml: field flags.gfd.sleepInterval: invalid value \"soon\": not a duration (examples: 60s, 1m30s, 500ms, infinite)",
            ),
            (
                "flags:\n  gfd:\n    sleepInterval: 0s\n",
                "/config/config.yaml: field flags.gfd.sleepInterval: invalid value \"0s\": must be longer than zero (or \"infinite\")",
            ),
            (
                "sharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 1\n",
                "/config/config.yaml: field sharing.timeSlicing.resources[0].replicas: invalid value \"1\": must be at least 2",
            ),
            (
                "sharing:\n  mps:\n    resources:\n    - name: nvidia.com/gpu\n",
                "/config/config.yaml: field sharing.mps.resources[0].replicas: invalid value \"\": is required",
            ),
            (
                "sharing:\n  timeSlicing:\n    resources:\n    - replicas: 4\n",
                "/config/config.yaml: field sharing.timeSlicing.resources[0].name: invalid value \"\": is required",
            ),
            (
                "sharing:\n  timeSlicing:\n    resources: []\n",
                "/config/config.yaml: field sharing.timeSlicing.resources: invalid value \"\": must list at least one resource",
            ),
            (
                "sharing:\n  timeSlicing:\n    resources:\n    - name: GPU\n      replicas: 2\n",
                "/config/config.yaml: field sharing.timeSlicing.resources[0].name: invalid value \"GPU\": the name after nvidia.com/ must be a DNS subdomain: lower-case letters, digits, '-' and '.', starting and ending with a letter or digit",
            ),
            (
                "sharing:\n  timeSlicing:\n    resources:\n    - name: gpu\n      replicas: 2\n      devices: some\n",
                "/config/config.yaml: field sharing.timeSlicing.resources[0].devices: invalid value \"some\": the only string accepted is \"all\"",
            ),
            (
                "sharing:\n  timeSlicing:\n    resources:\n    - name: gpu\n      replicas: 2\n      devices: 0\n",
                "/config/config.yaml: field sharing.timeSlicing.resources[0].devices: invalid value \"0\": a count of devices must be greater than 0",
            ),
            (
                "sharing:\n  timeSlicing:\n    resources:\n    - name: gpu\n      replicas: 2\n      devices: [\"GPU-1\"]\n",
                "/config/config.yaml: field sharing.timeSlicing.resources[0].devices[0]: invalid value \"GPU-1\": must be a GPU index (0), a MIG index (0:1) or a GPU-/MIG- UUID",
            ),
            (
                "sharing:\n  timeSlicing:\n    resources:\n    - {name: gpu, replicas: 2}\n  mps:\n    resources:\n    - {name: gpu, replicas: 2}\n",
                "/config/config.yaml: field sharing: invalid value \"timeSlicing and mps\": time-slicing and MPS cannot be configured together",
            ),
            (
                "imex:\n  channelIDs: [1]\n",
                "/config/config.yaml: field imex.channelIDs: invalid value \"[1]\": only [] or [0] is supported",
            ),
            (
                "resources:\n  gpus:\n  - name: gpu\n",
                "/config/config.yaml: field resources.gpus[0].pattern: invalid value \"\": is required",
            ),
        ];
        for (text, want) in cases {
            let err = file(text).unwrap_err().to_string();
            assert_eq!(&err, want, "for {text:?}");
        }
    }

    #[test]
    fn unknown_keys_and_wrong_types_name_the_path() {
        let err = file("flags:\n  gfd:\n    sleepIntervall: 10s\n")
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("/config/config.yaml: flags.gfd: unknown field `sleepIntervall`"),
            "{err}"
        );
        let err = file(
            "sharing:\n  timeSlicing:\n    resources:\n    - name: gpu\n      replicas: ten\n",
        )
        .unwrap_err()
        .to_string();
        assert!(
        err.starts_with("/config/config.yaml: sharing.timeSlicing.resources[0].replicas: invalid type: string \"ten\""),
        "{err}"
    );
        let err = file("migStrategy: mixed\n").unwrap_err().to_string();
        assert!(
            err.starts_with("/config/config.yaml: unknown field `migStrategy`"),
            "{err}"
        );
    }

    #[test]
    fn unreadable_file_names_the_path() {
        let err = load(Path::new("/nonexistent/gpud/config.yaml"))
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("/nonexistent/gpud/config.yaml: cannot read: "),
            "{err}"
        );
    }
}
