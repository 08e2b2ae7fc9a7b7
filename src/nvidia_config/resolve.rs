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
