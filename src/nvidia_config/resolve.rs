//! Precedence: one value per setting from an explicit flag, else the environment, else the
//! config file, else the built-in default — NVIDIA's `updateFromCLIFlag` order.
//!
//! The environment is read through [`Env`] so tests pass a map instead of mutating the
//! process environment. Which variables apply depends on the [`Component`]: GFD reads
//! `GFD_MIG_STRATEGY` before `MIG_STRATEGY`, the device plugin only `MIG_STRATEGY`. An empty
//! variable counts as unset, except `GFD_OUTPUT_FILE` where `""` means stdout.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use super::duration::SleepInterval;
use super::error::{NvidiaConfigError, Origin};
use super::file::{FileConfig, Imex, Resources};
use super::flags::{
    GfdFlags, PluginFlags, SharedFlags, parse_bool, parse_channel_ids, parse_device_list,
};
use super::sharing::Sharing;
use super::types::{
    AllocationPolicy, DeviceDiscoveryStrategy, DeviceIdStrategy, DeviceListStrategy, MigStrategy,
    SharingStrategy,
};

/// Which of NVIDIA's programs a setting is resolved for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Component {
    /// The device plugin.
    DevicePlugin,
    /// GPU feature discovery (gpud's labeller).
    FeatureDiscovery,
}

/// Read access to environment variables.
pub trait Env {
    /// The variable's value, `None` when unset.
    fn var(&self, name: &str) -> Option<String>;
}

/// The process environment.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProcessEnv;

impl Env for ProcessEnv {
    // Where NVIDIA's variables are resolved: one of the few places gpud reads its environment.
    #[allow(clippy::disallowed_methods)]
    fn var(&self, name: &str) -> Option<String> {
        std::env::var(name).ok()
    }
}

impl Env for HashMap<String, String> {
    fn var(&self, name: &str) -> Option<String> {
        self.get(name).cloned()
    }
}

/// Default of `flags.gfd.outputFile`.
pub const DEFAULT_OUTPUT_FILE: &str = "/etc/kubernetes/node-feature-discovery/features.d/gfd";
/// Default of `flags.gfd.machineTypeFile`.
pub const DEFAULT_MACHINE_TYPE_FILE: &str = "/sys/class/dmi/id/product_name";
/// Default of `flags.gfd.sleepInterval`.
pub const DEFAULT_SLEEP_INTERVAL: std::time::Duration = std::time::Duration::from_secs(60);

/// The environment variables naming the config file, in lookup order.
pub fn config_file_env(component: Component) -> &'static [&'static str] {
    match component {
        Component::DevicePlugin => &["CONFIG_FILE"],
        Component::FeatureDiscovery => &["GFD_CONFIG_FILE", "CONFIG_FILE"],
    }
}

/// The config file to read: the flag, else the first non-empty variable of
/// [`config_file_env`]; `None` when there is none.
pub fn config_file(flag: Option<&Path>, env: &dyn Env, component: Component) -> Option<PathBuf> {
    flag.map(Path::to_path_buf)
        .filter(|p| !p.as_os_str().is_empty())
        .or_else(|| {
            config_file_env(component)
                .iter()
                .find_map(|name| env.var(name).filter(|v| !v.is_empty()))
                .map(PathBuf::from)
        })
}

/// Where the labels go: a file or stdout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OutputTarget {
    /// Standard output (`outputFile: ""` or `-`).
    Stdout,
    /// A features file, written atomically.
    File(PathBuf),
}

impl OutputTarget {
    fn from_text(text: &str) -> Self {
        if text.is_empty() || text == "-" {
            OutputTarget::Stdout
        } else {
            OutputTarget::File(PathBuf::from(text))
        }
    }
}

/// The effective configuration of one component.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Every `flags` value, resolved.
    pub flags: Flags,
    /// `resources` (always empty: NVIDIA ignores custom resources).
    pub resources: Resources,
    /// `sharing`.
    pub sharing: Sharing,
    /// `imex`.
    pub imex: Imex,
    /// Warnings about settings read but ignored, to be logged once.
    pub warnings: Vec<String>,
}

/// Resolved `flags`.
#[derive(Debug, Clone, PartialEq)]
pub struct Flags {
    pub mig_strategy: MigStrategy,
    pub fail_on_init_error: bool,
    pub nvidia_driver_root: PathBuf,
    pub nvidia_dev_root: PathBuf,
    pub mps_root: Option<PathBuf>,
    pub gdrcopy_enabled: bool,
    pub gds_enabled: bool,
    pub mofed_enabled: bool,
    pub use_node_feature_api: bool,
    /// Whether `useNodeFeatureAPI` was given (flag, environment or file) rather than left to
    /// the component's default: gpud's labeller follows only an explicit request, since the
    /// NodeFeature API needs cluster access the default features file does not.
    pub use_node_feature_api_explicit: bool,
    pub device_discovery_strategy: DeviceDiscoveryStrategy,
    /// `flags.plugin`.
    pub plugin: PluginSettings,
    /// `flags.gfd`.
    pub gfd: GfdSettings,
}

/// Resolved `flags.plugin`.
#[derive(Debug, Clone, PartialEq)]
pub struct PluginSettings {
    pub pass_device_specs: bool,
    pub device_list_strategy: Vec<DeviceListStrategy>,
    pub device_id_strategy: DeviceIdStrategy,
    pub cdi_annotation_prefix: String,
    pub nvidia_ctk_path: PathBuf,
    pub container_driver_root: PathBuf,
    pub shared_devices_allocation_policy: AllocationPolicy,
}

/// Resolved `flags.gfd`.
#[derive(Debug, Clone, PartialEq)]
pub struct GfdSettings {
    pub oneshot: bool,
    pub no_timestamp: bool,
    pub sleep_interval: SleepInterval,
    pub output: OutputTarget,
    /// `None` when set to `""` (the machine type is then `unknown`).
    pub machine_type_file: Option<PathBuf>,
}

/// The explicitly given flags of an applet; groups it does not declare stay default (unset).
#[derive(Debug, Clone, Copy, Default)]
pub struct GivenFlags<'a> {
    pub shared: Option<&'a SharedFlags>,
    pub plugin: Option<&'a PluginFlags>,
    pub gfd: Option<&'a GfdFlags>,
}

/// Merges flags over the environment over the file over defaults, then checks the rules that
/// span fields. `file` is the parsed config file (with its path, for messages), if any.
pub fn resolve(
    file: Option<(&Path, &FileConfig)>,
    given: GivenFlags<'_>,
    env: &dyn Env,
    component: Component,
) -> Result<Config, NvidiaConfigError> {
    let empty = FileConfig::default();
    let (origin, file) = match file {
        Some((path, config)) => (Origin::File(path.to_path_buf()), config),
        None => (Origin::Merged, &empty),
    };
    let shared = given.shared.cloned().unwrap_or_default();
    let plugin = given.plugin.cloned().unwrap_or_default();
    let gfd = given.gfd.cloned().unwrap_or_default();
    let gfd_component = component == Component::FeatureDiscovery;
    let reader = EnvReader { env };

    let (mig_env, fail_env, nfa_env): (&[&str], &[&str], &[&str]) = if gfd_component {
        (
            &["GFD_MIG_STRATEGY", "MIG_STRATEGY"],
            &["GFD_FAIL_ON_INIT_ERROR", "FAIL_ON_INIT_ERROR"],
            &["GFD_USE_NODE_FEATURE_API", "USE_NODE_FEATURE_API"],
        )
    } else {
        (
            &["MIG_STRATEGY"],
            &["FAIL_ON_INIT_ERROR"],
            &["USE_NODE_FEATURE_API"],
        )
    };
    let ff = &file.flags;
    let nvidia_driver_root = shared
        .nvidia_driver_root
        .or(reader.path(&["NVIDIA_DRIVER_ROOT"]))
        .or(ff.nvidia_driver_root.clone())
        .unwrap_or_else(|| PathBuf::from("/"));
    let nvidia_dev_root = shared
        .nvidia_dev_root
        .or(reader.path(&["NVIDIA_DEV_ROOT"]))
        .or(ff.nvidia_dev_root.clone())
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or_else(|| nvidia_driver_root.clone());
    let fp = &ff.plugin;
    let fg = &ff.gfd;
    let use_node_feature_api = shared
        .use_node_feature_api
        .or(reader.typed(nfa_env, "flags.useNodeFeatureAPI", parse_bool)?)
        .or(ff.use_node_feature_api);
    let output = match gfd.output_file {
        Some(text) => OutputTarget::from_text(&text),
        None => match env.var("GFD_OUTPUT_FILE") {
            Some(text) => OutputTarget::from_text(&text),
            None => {
                OutputTarget::from_text(fg.output_file.as_deref().unwrap_or(DEFAULT_OUTPUT_FILE))
            }
        },
    };
    let imex_ids = match plugin.imex_channel_ids {
        Some(ids) => Some(ids),
        None => reader.typed(&["IMEX_CHANNEL_IDS"], "imex.channelIDs", parse_channel_ids)?,
    };
    let imex = Imex {
        channel_ids: imex_ids.unwrap_or_else(|| file.imex.channel_ids.clone()),
        required: plugin
            .imex_required
            .or(reader.typed(&["IMEX_REQUIRED"], "imex.required", parse_bool)?)
            .unwrap_or(file.imex.required),
    };

    let config = Config {
        flags: Flags {
            mig_strategy: shared
                .mig_strategy
                .or(reader.typed(mig_env, "flags.migStrategy", str::parse)?)
                .or(ff.mig_strategy)
                .unwrap_or(MigStrategy::None),
            fail_on_init_error: shared
                .fail_on_init_error
                .or(reader.typed(fail_env, "flags.failOnInitError", parse_bool)?)
                .or(ff.fail_on_init_error)
                .unwrap_or(true),
            nvidia_driver_root,
            nvidia_dev_root,
            mps_root: shared
                .mps_root
                .or(reader.path(&["MPS_ROOT"]))
                .or(ff.mps_root.clone())
                .filter(|p| !p.as_os_str().is_empty()),
            gdrcopy_enabled: shared
                .gdrcopy_enabled
                .or(reader.typed(&["GDRCOPY_ENABLED"], "flags.gdrcopyEnabled", parse_bool)?)
                .or(ff.gdrcopy_enabled)
                .unwrap_or(false),
            gds_enabled: shared
                .gds_enabled
                .or(reader.typed(&["GDS_ENABLED"], "flags.gdsEnabled", parse_bool)?)
                .or(ff.gds_enabled)
                .unwrap_or(false),
            mofed_enabled: shared
                .mofed_enabled
                .or(reader.typed(&["MOFED_ENABLED"], "flags.mofedEnabled", parse_bool)?)
                .or(ff.mofed_enabled)
                .unwrap_or(false),
            use_node_feature_api: use_node_feature_api.unwrap_or(gfd_component),
            use_node_feature_api_explicit: use_node_feature_api.is_some(),
            device_discovery_strategy: shared
                .device_discovery_strategy
                .or(reader.typed(
                    &["DEVICE_DISCOVERY_STRATEGY"],
                    "flags.deviceDiscoveryStrategy",
                    str::parse,
                )?)
                .or(ff.device_discovery_strategy)
                .unwrap_or(DeviceDiscoveryStrategy::Auto),
            plugin: PluginSettings {
                pass_device_specs: plugin
                    .pass_device_specs
                    .or(reader.typed(
                        &["PASS_DEVICE_SPECS"],
                        "flags.plugin.passDeviceSpecs",
                        parse_bool,
                    )?)
                    .or(fp.pass_device_specs)
                    .unwrap_or(false),
                device_list_strategy: plugin
                    .device_list_strategy
                    .filter(|list| !list.is_empty())
                    .or(reader.typed(
                        &["DEVICE_LIST_STRATEGY"],
                        "flags.plugin.deviceListStrategy",
                        parse_device_list,
                    )?)
                    .or(fp.device_list_strategy.clone())
                    .unwrap_or_else(|| vec![DeviceListStrategy::Envvar]),
                device_id_strategy: plugin
                    .device_id_strategy
                    .or(reader.typed(
                        &["DEVICE_ID_STRATEGY"],
                        "flags.plugin.deviceIDStrategy",
                        str::parse,
                    )?)
                    .or(fp.device_id_strategy)
                    .unwrap_or(DeviceIdStrategy::Uuid),
                cdi_annotation_prefix: plugin
                    .cdi_annotation_prefix
                    .or(reader.string(&["CDI_ANNOTATION_PREFIX"]))
                    .or(fp.cdi_annotation_prefix.clone())
                    .unwrap_or_else(|| "cdi.k8s.io/".to_owned()),
                nvidia_ctk_path: plugin
                    .nvidia_ctk_path
                    .or(reader.path(&["NVIDIA_CDI_HOOK_PATH", "NVIDIA_CTK_PATH"]))
                    .or(fp.nvidia_ctk_path.clone())
                    .unwrap_or_else(|| PathBuf::from("/usr/bin/nvidia-ctk")),
                container_driver_root: plugin
                    .container_driver_root
                    .or(reader.path(&["DRIVER_ROOT_CTR_PATH", "CONTAINER_DRIVER_ROOT"]))
                    .or(fp.container_driver_root.clone())
                    .unwrap_or_else(|| PathBuf::from("/driver-root")),
                shared_devices_allocation_policy: plugin
                    .shared_devices_allocation_policy
                    .or(reader.typed(
                        &["SHARED_DEVICES_ALLOCATION_POLICY"],
                        "flags.plugin.sharedDevicesAllocationPolicy",
                        str::parse,
                    )?)
                    .or(fp.shared_devices_allocation_policy)
                    .unwrap_or(AllocationPolicy::Distributed),
            },
            gfd: GfdSettings {
                oneshot: gfd
                    .oneshot
                    .or(reader.typed(&["GFD_ONESHOT"], "flags.gfd.oneshot", parse_bool)?)
                    .or(fg.oneshot)
                    .unwrap_or(false),
                no_timestamp: gfd
                    .no_timestamp
                    .or(reader.typed(&["GFD_NO_TIMESTAMP"], "flags.gfd.noTimestamp", parse_bool)?)
                    .or(fg.no_timestamp)
                    .unwrap_or(false),
                sleep_interval: gfd
                    .sleep_interval
                    .or(reader.typed(
                        &["GFD_SLEEP_INTERVAL"],
                        "flags.gfd.sleepInterval",
                        SleepInterval::parse,
                    )?)
                    .or(fg.sleep_interval)
                    .unwrap_or(SleepInterval::Every(DEFAULT_SLEEP_INTERVAL)),
                output,
                machine_type_file: Some(
                    gfd.machine_type_file
                        .or(reader.raw_path(&["GFD_MACHINE_TYPE_FILE"]))
                        .or(fg.machine_type_file.clone())
                        .unwrap_or_else(|| PathBuf::from(DEFAULT_MACHINE_TYPE_FILE)),
                )
                .filter(|p| !p.as_os_str().is_empty()),
            },
        },
        resources: Resources::default(),
        sharing: file.sharing.clone(),
        imex,
        warnings: file.warnings.clone(),
    };
    validate(&config, &origin, component)?;
    Ok(config)
}

/// The rules NVIDIA checks after merging (`validateFlags`).
fn validate(
    config: &Config,
    origin: &Origin,
    component: Component,
) -> Result<(), NvidiaConfigError> {
    let flags = &config.flags;
    if !(config.imex.channel_ids.is_empty() || config.imex.channel_ids == [0]) {
        let shown = format!("{:?}", config.imex.channel_ids);
        return Err(NvidiaConfigError::invalid(
            origin,
            "imex.channelIDs",
            shown,
            "only [] or [0] is supported",
        ));
    }
    if component == Component::DevicePlugin {
        if flags.device_discovery_strategy == DeviceDiscoveryStrategy::Vfio {
            return Err(NvidiaConfigError::invalid(
                origin,
                "flags.deviceDiscoveryStrategy",
                "vfio",
                "must be one of auto, nvml, tegra for the device plugin",
            ));
        }
        if config.sharing.strategy() == SharingStrategy::Mps {
            if flags.mig_strategy == MigStrategy::Mixed {
                return Err(NvidiaConfigError::invalid(
                    origin,
                    "flags.migStrategy",
                    "mixed",
                    "sharing with MPS cannot be combined with the mixed MIG strategy",
                ));
            }
            if flags.mps_root.is_none() {
                return Err(NvidiaConfigError::invalid(
                    origin,
                    "flags.mpsRoot",
                    "",
                    "sharing with MPS needs mpsRoot (--mps-root, MPS_ROOT)",
                ));
            }
        }
    }
    Ok(())
}

/// Reads the first set variable of a list and parses it, naming the variable on failure.
struct EnvReader<'a> {
    env: &'a dyn Env,
}

impl EnvReader<'_> {
    /// The first non-empty variable among `names`, with its name.
    fn first(&self, names: &[&str]) -> Option<(String, String)> {
        names.iter().find_map(|name| {
            self.env
                .var(name)
                .filter(|v| !v.is_empty())
                .map(|v| ((*name).to_owned(), v))
        })
    }

    fn typed<T>(
        &self,
        names: &[&str],
        field: &str,
        parse: impl Fn(&str) -> Result<T, String>,
    ) -> Result<Option<T>, NvidiaConfigError> {
        self.first(names)
            .map(|(name, value)| {
                parse(&value).map_err(|why| {
                    NvidiaConfigError::invalid(&Origin::Env(name), field, &value, why)
                })
            })
            .transpose()
    }

    fn string(&self, names: &[&str]) -> Option<String> {
        self.first(names).map(|(_, v)| v)
    }

    fn path(&self, names: &[&str]) -> Option<PathBuf> {
        self.string(names).map(PathBuf::from)
    }

    /// A path variable where an empty value is meaningful (it disables the file).
    fn raw_path(&self, names: &[&str]) -> Option<PathBuf> {
        names
            .iter()
            .find_map(|name| self.env.var(name))
            .map(PathBuf::from)
    }
}

#[cfg(test)]
mod tests {
    //! Table tests of resolving NVIDIA's config: the repository's example configs, precedence of
    //! flags, environment, file and defaults, and the rules checked after merging.

    use std::collections::HashMap;
    use std::path::{Path, PathBuf};
    use std::time::Duration;

    use super::*;
    use crate::nvidia_config::*;

    const PATH: &str = "/config/config.yaml";

    fn file(text: &str) -> Result<FileConfig, NvidiaConfigError> {
        parse(Path::new(PATH), text)
    }

    fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn resolve_text(text: &str, component: Component) -> Result<Config, NvidiaConfigError> {
        let parsed = file(text)?;
        resolve(
            Some((Path::new(PATH), &parsed)),
            GivenFlags::default(),
            &env(&[]),
            component,
        )
    }

    #[test]
    fn defaults_without_a_file() {
        let config = resolve(
            None,
            GivenFlags::default(),
            &env(&[]),
            Component::FeatureDiscovery,
        )
        .unwrap();
        let flags = &config.flags;
        assert_eq!(flags.mig_strategy, MigStrategy::None);
        assert!(flags.fail_on_init_error);
        assert_eq!(flags.nvidia_driver_root, PathBuf::from("/"));
        assert_eq!(flags.nvidia_dev_root, PathBuf::from("/"));
        assert_eq!(flags.mps_root, None);
        assert!(!flags.gdrcopy_enabled && !flags.gds_enabled && !flags.mofed_enabled);
        assert!(
            flags.use_node_feature_api,
            "GFD defaults to the NodeFeature API"
        );
        assert_eq!(
            flags.device_discovery_strategy,
            DeviceDiscoveryStrategy::Auto
        );
        assert_eq!(
            flags.plugin.device_list_strategy,
            vec![DeviceListStrategy::Envvar]
        );
        assert_eq!(flags.plugin.device_id_strategy, DeviceIdStrategy::Uuid);
        assert_eq!(flags.plugin.cdi_annotation_prefix, "cdi.k8s.io/");
        assert_eq!(
            flags.plugin.nvidia_ctk_path,
            PathBuf::from("/usr/bin/nvidia-ctk")
        );
        assert_eq!(
            flags.plugin.container_driver_root,
            PathBuf::from("/driver-root")
        );
        assert_eq!(
            flags.plugin.shared_devices_allocation_policy,
            AllocationPolicy::Distributed
        );
        assert!(!flags.gfd.oneshot && !flags.gfd.no_timestamp);
        assert_eq!(
            flags.gfd.sleep_interval,
            SleepInterval::Every(Duration::from_secs(60))
        );
        assert_eq!(
            flags.gfd.output,
            OutputTarget::File(PathBuf::from(DEFAULT_OUTPUT_FILE))
        );
        assert_eq!(
            flags.gfd.machine_type_file,
            Some(PathBuf::from(DEFAULT_MACHINE_TYPE_FILE))
        );
        assert_eq!(config.sharing.strategy(), SharingStrategy::None);
        assert!(config.warnings.is_empty());

        let dp = resolve(
            None,
            GivenFlags::default(),
            &env(&[]),
            Component::DevicePlugin,
        )
        .unwrap();
        assert!(!dp.flags.use_node_feature_api);
    }

    #[test]
    fn nvidia_example_config0_and_config1() {
        let config0 = "version: v1\nflags:\n  migStrategy: \"none\"\n  failOnInitError: true\n  nvidiaDriverRoot: \"/\"\n  plugin:\n    passDeviceSpecs: false\n    deviceListStrategy: envvar\n    deviceIDStrategy: uuid\n";
        let config = resolve_text(config0, Component::DevicePlugin).unwrap();
        assert_eq!(config.flags.mig_strategy, MigStrategy::None);
        assert!(config.flags.fail_on_init_error);
        assert!(!config.flags.plugin.pass_device_specs);
        assert_eq!(
            config.flags.plugin.device_list_strategy,
            vec![DeviceListStrategy::Envvar]
        );
        assert_eq!(
            config.flags.plugin.device_id_strategy,
            DeviceIdStrategy::Uuid
        );

        let config1 = config0.replace("\"none\"", "\"mixed\"");
        let config = resolve_text(&config1, Component::DevicePlugin).unwrap();
        assert_eq!(config.flags.mig_strategy, MigStrategy::Mixed);
    }

    #[test]
    fn nvidia_time_slicing_examples() {
        let plain = "version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 10\n";
        let config = resolve_text(plain, Component::DevicePlugin).unwrap();
        assert_eq!(config.sharing.strategy(), SharingStrategy::TimeSlicing);
        let gpu = config.sharing.resource("nvidia.com/gpu").unwrap();
        assert_eq!(gpu.replicas, 10);
        assert_eq!(gpu.rename, None);
        assert_eq!(gpu.devices, ReplicatedDevices::All);
        assert!(!config.sharing.time_slicing.fail_requests_greater_than_one);

        let renamed = plain.replace(
            "timeSlicing:\n",
            "timeSlicing:\n    renameByDefault: true\n",
        );
        let config = resolve_text(&renamed, Component::DevicePlugin).unwrap();
        let gpu = config.sharing.resource("nvidia.com/gpu").unwrap();
        assert_eq!(gpu.rename.as_deref(), Some("nvidia.com/gpu.shared"));
    }

    #[test]
    fn json_is_accepted() {
        let config = resolve_text(
        r#"{"version": "v1", "flags": {"migStrategy": "single", "gfd": {"sleepInterval": "30s", "outputFile": ""}}}"#,
        Component::FeatureDiscovery,
    )
    .unwrap();
        assert_eq!(config.flags.mig_strategy, MigStrategy::Single);
        assert_eq!(
            config.flags.gfd.sleep_interval,
            SleepInterval::Every(Duration::from_secs(30))
        );
        assert_eq!(config.flags.gfd.output, OutputTarget::Stdout);
    }

    #[test]
    fn every_key_of_flags() {
        let text = "\
flags:
  migStrategy: single
  failOnInitError: false
  nvidiaDriverRoot: /run/nvidia/driver
  nvidiaDevRoot: /
  mpsRoot: /run/nvidia/mps
  gdrcopyEnabled: true
  gdsEnabled: true
  mofedEnabled: true
  useNodeFeatureAPI: false
  deviceDiscoveryStrategy: nvml
  plugin:
    passDeviceSpecs: true
    deviceListStrategy: volume-mounts
    deviceIDStrategy: index
    cdiAnnotationPrefix: cdi.example.com/
    nvidiaCTKPath: /usr/local/bin/nvidia-ctk
    containerDriverRoot: /host-driver
    sharedDevicesAllocationPolicy: packed
  gfd:
    oneshot: true
    noTimestamp: true
    sleepInterval: infinite
    outputFile: /tmp/gfd
    machineTypeFile: /tmp/product
imex:
  channelIDs: [0]
  required: true
";
        let config = resolve_text(text, Component::FeatureDiscovery).unwrap();
        let f = &config.flags;
        assert_eq!(f.mig_strategy, MigStrategy::Single);
        assert!(!f.fail_on_init_error);
        assert_eq!(f.nvidia_driver_root, PathBuf::from("/run/nvidia/driver"));
        assert_eq!(f.nvidia_dev_root, PathBuf::from("/"));
        assert_eq!(f.mps_root, Some(PathBuf::from("/run/nvidia/mps")));
        assert!(f.gdrcopy_enabled && f.gds_enabled && f.mofed_enabled);
        assert!(!f.use_node_feature_api);
        assert_eq!(f.device_discovery_strategy, DeviceDiscoveryStrategy::Nvml);
        assert!(f.plugin.pass_device_specs);
        assert_eq!(
            f.plugin.device_list_strategy,
            vec![DeviceListStrategy::VolumeMounts]
        );
        assert_eq!(f.plugin.device_id_strategy, DeviceIdStrategy::Index);
        assert_eq!(f.plugin.cdi_annotation_prefix, "cdi.example.com/");
        assert_eq!(
            f.plugin.nvidia_ctk_path,
            PathBuf::from("/usr/local/bin/nvidia-ctk")
        );
        assert_eq!(
            f.plugin.container_driver_root,
            PathBuf::from("/host-driver")
        );
        assert_eq!(
            f.plugin.shared_devices_allocation_policy,
            AllocationPolicy::Packed
        );
        assert!(f.gfd.oneshot && f.gfd.no_timestamp);
        assert_eq!(f.gfd.sleep_interval, SleepInterval::Infinite);
        assert_eq!(f.gfd.output, OutputTarget::File(PathBuf::from("/tmp/gfd")));
        assert_eq!(f.gfd.machine_type_file, Some(PathBuf::from("/tmp/product")));
        assert_eq!(config.imex.channel_ids, vec![0]);
        assert!(config.imex.required);
    }

    #[test]
    fn dev_root_follows_driver_root() {
        let config = resolve_text(
            "flags:\n  nvidiaDriverRoot: /run/nvidia/driver\n",
            Component::DevicePlugin,
        )
        .unwrap();
        assert_eq!(
            config.flags.nvidia_dev_root,
            PathBuf::from("/run/nvidia/driver")
        );
    }

    #[test]
    fn mps_fails_multi_replica_requests_by_default() {
        let mps = "sharing:\n  mps:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 4\nflags:\n  mpsRoot: /run/nvidia/mps\n";
        let config = resolve_text(mps, Component::DevicePlugin).unwrap();
        assert_eq!(config.sharing.strategy(), SharingStrategy::Mps);
        assert!(config.sharing.mps.fail_requests_greater_than_one);
        let relaxed = mps.replace(
            "  mps:\n",
            "  mps:\n    failRequestsGreaterThanOne: false\n",
        );
        let config = resolve_text(&relaxed, Component::DevicePlugin).unwrap();
        assert!(!config.sharing.mps.fail_requests_greater_than_one);
    }

    #[test]
    fn resources_and_custom_renames_are_read_then_ignored_with_nvidia_warnings() {
        let text = "\
resources:
  gpus:
  - pattern: \"A100-SXM4-40GB\"
    name: a100
sharing:
  timeSlicing:
    resources:
    - name: gpu
      replicas: 2
      rename: my-gpu
      devices: [0, \"1\", \"0:1\", GPU-b1028956-cfa2-0990-bf4a-5da9abb51763]
";
        let config = resolve_text(text, Component::DevicePlugin).unwrap();
        assert_eq!(config.resources, Resources::default());
        let gpu = config.sharing.resource("nvidia.com/gpu").unwrap();
        assert_eq!(gpu.rename, None);
        assert_eq!(gpu.devices, ReplicatedDevices::All);
        assert_eq!(
        config.warnings,
        vec![
            RESOURCES_IGNORED.to_owned(),
            "Setting the 'rename' field in sharing.timeSlicing.resources is not yet supported in the config. Ignoring...".to_owned(),
            "Customizing the 'devices' field in sharing.timeSlicing.resources is not yet supported in the config. Ignoring...".to_owned(),
        ]
    );
        // The file model keeps what was written.
        let parsed = file(text).unwrap();
        assert_eq!(parsed.resources.gpus[0].name, "nvidia.com/a100");
    }

    #[test]
    fn precedence_flag_over_env_over_file_over_default() {
        let parsed =
            file("flags:\n  migStrategy: single\n  gfd:\n    sleepInterval: 30s\n").unwrap();
        let path = Path::new(PATH);
        let resolved = |flags: &SharedFlags, gfd: &GfdFlags, vars: &[(&str, &str)]| {
            resolve(
                Some((path, &parsed)),
                GivenFlags {
                    shared: Some(flags),
                    plugin: None,
                    gfd: Some(gfd),
                },
                &env(vars),
                Component::FeatureDiscovery,
            )
            .unwrap()
        };
        let none = SharedFlags::default();
        let no_gfd = GfdFlags::default();
        // file over default
        assert_eq!(
            resolved(&none, &no_gfd, &[]).flags.mig_strategy,
            MigStrategy::Single
        );
        // env over file; GFD_ names first
        assert_eq!(
            resolved(&none, &no_gfd, &[("MIG_STRATEGY", "mixed")])
                .flags
                .mig_strategy,
            MigStrategy::Mixed
        );
        assert_eq!(
            resolved(
                &none,
                &no_gfd,
                &[("MIG_STRATEGY", "mixed"), ("GFD_MIG_STRATEGY", "none")]
            )
            .flags
            .mig_strategy,
            MigStrategy::None
        );
        // flag over env
        let flag = SharedFlags {
            mig_strategy: Some(MigStrategy::None),
            ..SharedFlags::default()
        };
        assert_eq!(
            resolved(&flag, &no_gfd, &[("GFD_MIG_STRATEGY", "mixed")])
                .flags
                .mig_strategy,
            MigStrategy::None
        );
        // an empty variable is unset
        assert_eq!(
            resolved(&none, &no_gfd, &[("GFD_MIG_STRATEGY", "")])
                .flags
                .mig_strategy,
            MigStrategy::Single
        );
        // sleep interval through each layer
        assert_eq!(
            resolved(&none, &no_gfd, &[]).flags.gfd.sleep_interval,
            SleepInterval::Every(Duration::from_secs(30))
        );
        assert_eq!(
            resolved(&none, &no_gfd, &[("GFD_SLEEP_INTERVAL", "infinite")])
                .flags
                .gfd
                .sleep_interval,
            SleepInterval::Infinite
        );
        // GFD_OUTPUT_FILE="" means stdout, unlike other empty variables
        assert_eq!(
            resolved(&none, &no_gfd, &[("GFD_OUTPUT_FILE", "")])
                .flags
                .gfd
                .output,
            OutputTarget::Stdout
        );
        let out = GfdFlags {
            output_file: Some("-".into()),
            ..GfdFlags::default()
        };
        assert_eq!(
            resolved(&none, &out, &[]).flags.gfd.output,
            OutputTarget::Stdout
        );
    }

    /// The labeller tells GFD's default `useNodeFeatureAPI: true` from one that was asked for.
    #[test]
    fn use_node_feature_api_records_whether_it_was_given() {
        let resolved = |text: Option<&str>, flag: Option<bool>, vars: &[(&str, &str)]| {
            let parsed = text.map(|t| file(t).unwrap());
            let shared = SharedFlags {
                use_node_feature_api: flag,
                ..SharedFlags::default()
            };
            let flags = resolve(
                parsed.as_ref().map(|p| (Path::new(PATH), p)),
                GivenFlags {
                    shared: Some(&shared),
                    plugin: None,
                    gfd: None,
                },
                &env(vars),
                Component::FeatureDiscovery,
            )
            .unwrap()
            .flags;
            (
                flags.use_node_feature_api,
                flags.use_node_feature_api_explicit,
            )
        };
        // GFD's default, and an empty variable, are not a request.
        assert_eq!(resolved(None, None, &[]), (true, false));
        assert_eq!(
            resolved(None, None, &[("GFD_USE_NODE_FEATURE_API", "")]),
            (true, false)
        );
        assert_eq!(
            resolved(Some("flags:\n  migStrategy: none\n"), None, &[]),
            (true, false)
        );
        // The file, either variable, or the flag is.
        let on = Some("flags:\n  useNodeFeatureAPI: true\n");
        let off = Some("flags:\n  useNodeFeatureAPI: false\n");
        assert_eq!(resolved(on, None, &[]), (true, true));
        assert_eq!(resolved(off, None, &[]), (false, true));
        assert_eq!(
            resolved(None, None, &[("USE_NODE_FEATURE_API", "true")]),
            (true, true)
        );
        assert_eq!(
            resolved(off, None, &[("GFD_USE_NODE_FEATURE_API", "1")]),
            (true, true)
        );
        assert_eq!(resolved(on, Some(false), &[]), (false, true));
        assert_eq!(resolved(None, Some(true), &[]), (true, true));
        // The device plugin's default is false and not given either.
        let dp = resolve(
            None,
            GivenFlags::default(),
            &env(&[]),
            Component::DevicePlugin,
        )
        .unwrap();
        assert!(!dp.flags.use_node_feature_api && !dp.flags.use_node_feature_api_explicit);
    }

    #[test]
    fn device_plugin_ignores_gfd_env_names() {
        let config = resolve(
            None,
            GivenFlags::default(),
            &env(&[("GFD_MIG_STRATEGY", "mixed")]),
            Component::DevicePlugin,
        )
        .unwrap();
        assert_eq!(config.flags.mig_strategy, MigStrategy::None);
    }

    #[test]
    fn config_file_lookup() {
        let vars = env(&[("CONFIG_FILE", "/b"), ("GFD_CONFIG_FILE", "/a")]);
        assert_eq!(
            config_file(None, &vars, Component::FeatureDiscovery),
            Some(PathBuf::from("/a"))
        );
        assert_eq!(
            config_file(None, &vars, Component::DevicePlugin),
            Some(PathBuf::from("/b"))
        );
        assert_eq!(
            config_file(Some(Path::new("/c")), &vars, Component::DevicePlugin),
            Some(PathBuf::from("/c"))
        );
        assert_eq!(config_file(None, &env(&[]), Component::DevicePlugin), None);
    }

    #[test]
    fn bad_environment_names_the_variable() {
        let err = resolve(
            None,
            GivenFlags::default(),
            &env(&[("MIG_STRATEGY", "maybe")]),
            Component::FeatureDiscovery,
        )
        .unwrap_err()
        .to_string();
        assert_eq!(
            err,
            "environment variable MIG_STRATEGY: field flags.migStrategy: invalid value \"maybe\": must be one of none, single, mixed"
        );
        let err = resolve(
            None,
            GivenFlags::default(),
            &env(&[("GFD_ONESHOT", "yes")]),
            Component::FeatureDiscovery,
        )
        .unwrap_err()
        .to_string();
        assert_eq!(
            err,
            "environment variable GFD_ONESHOT: field flags.gfd.oneshot: invalid value \"yes\": must be true or false"
        );
    }

    #[test]
    fn device_plugin_rules_after_merging() {
        let mps_mixed = "flags:\n  migStrategy: mixed\n  mpsRoot: /run/nvidia/mps\nsharing:\n  mps:\n    resources:\n    - {name: gpu, replicas: 2}\n";
        let err = resolve_text(mps_mixed, Component::DevicePlugin)
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "/config/config.yaml: field flags.migStrategy: invalid value \"mixed\": sharing with MPS cannot be combined with the mixed MIG strategy"
        );
        // GFD reads the same file without the device plugin's rules.
        assert!(resolve_text(mps_mixed, Component::FeatureDiscovery).is_ok());

        let no_root = "sharing:\n  mps:\n    resources:\n    - {name: gpu, replicas: 2}\n";
        let err = resolve_text(no_root, Component::DevicePlugin)
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "/config/config.yaml: field flags.mpsRoot: invalid value \"\": sharing with MPS needs mpsRoot (--mps-root, MPS_ROOT)"
        );
        // The flag layer can supply what the file lacks.
        let parsed = file(no_root).unwrap();
        let flags = SharedFlags {
            mps_root: Some(PathBuf::from("/run/nvidia/mps")),
            ..SharedFlags::default()
        };
        assert!(
            resolve(
                Some((Path::new(PATH), &parsed)),
                GivenFlags {
                    shared: Some(&flags),
                    ..GivenFlags::default()
                },
                &env(&[]),
                Component::DevicePlugin
            )
            .is_ok()
        );

        let err = resolve_text(
            "flags:\n  deviceDiscoveryStrategy: vfio\n",
            Component::DevicePlugin,
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("field flags.deviceDiscoveryStrategy: invalid value \"vfio\""),
            "{err}"
        );
        assert!(
            resolve_text(
                "flags:\n  deviceDiscoveryStrategy: vfio\n",
                Component::FeatureDiscovery
            )
            .is_ok()
        );
    }
}
