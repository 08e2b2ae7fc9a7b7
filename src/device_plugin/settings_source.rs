//! Where the device plugin's settings come from: NVIDIA's flags, environment variables and
//! config file, merged with NVIDIA's precedence (flag > environment > file > default) by
//! `crate::nvidia_config`, then narrowed to what the device plugin uses.

use std::path::PathBuf;

use clap::Args;

use super::manager::ManagerConfig;
use crate::nvidia_config::{
    self, Component, Config, GivenFlags, NvidiaConfigError, PluginFlags, ProcessEnv, SharedFlags,
    SharingStrategy,
};
use crate::resources::settings::{Settings, Sharing};

/// NVIDIA's device-plugin flags.
#[derive(Debug, Clone, Args)]
pub struct PluginArgs {
    /// NVIDIA config file (YAML or JSON, `version: v1`); also CONFIG_FILE.
    #[arg(long, value_name = "PATH")]
    pub config_file: Option<PathBuf>,

    #[command(flatten)]
    pub shared: SharedFlags,

    #[command(flatten)]
    pub plugin: PluginFlags,
}

/// The kubelet's device-plugin folder.
const DEFAULT_PLUGIN_DIR: &str = "/var/lib/kubelet/device-plugins";

/// Where the kubelet is (the device plugin's side of NVIDIA's flags that are not settings).
#[derive(Debug, Clone, Args)]
pub struct KubeletArgs {
    /// The kubelet's registration socket; "" serves without registering (sockets in
    /// --plugin-dir).
    #[arg(
        long,
        value_name = "PATH",
        env = "KUBELET_SOCKET",
        default_value = "/var/lib/kubelet/device-plugins/kubelet.sock"
    )]
    pub kubelet_socket: String,

    /// Folder for the plugin sockets when --kubelet-socket is "" (registering, they go beside
    /// the kubelet's socket, where the kubelet looks for them).
    #[arg(long, value_name = "DIR", env = "GPUD_PLUGIN_DIR",
          default_value = DEFAULT_PLUGIN_DIR)]
    pub plugin_dir: PathBuf,

    /// The procfs holding the driver's MIG capability tree (for MIG device nodes).
    #[arg(long, value_name = "PATH", default_value = "/proc")]
    pub proc_root: PathBuf,

    /// The checkpoint of a `gpud dra` running in another container
    /// (<plugins>/gpu.nvidia.com/checkpoint.json): GPUs it prepared for claims are withdrawn
    /// from the kubelet until the claim ends. Unset: no DRA plugin beside (`gpud run --dra`
    /// shares this in memory).
    #[arg(long, value_name = "PATH", env = "GPUD_DRA_CHECKPOINT")]
    pub dra_checkpoint: Option<PathBuf>,
}

impl KubeletArgs {
    /// The plugin manager's paths.
    pub fn manager_config(&self) -> ManagerConfig {
        ManagerConfig {
            kubelet_socket: (!self.kubelet_socket.is_empty())
                .then(|| PathBuf::from(&self.kubelet_socket)),
            plugin_dir: self.plugin_dir.clone(),
            proc_root: self.proc_root.clone(),
            held: self
                .dra_checkpoint
                .clone()
                .map(crate::holdings::HeldSource::Checkpoint),
            left_to_dra: false,
        }
    }
}

/// The settings at start: warnings printed once on stderr, a bad config file an error
/// (exit 65) naming the file, the field and the value.
pub fn load_at_start(args: &PluginArgs) -> Result<Settings, crate::daemon::Error> {
    let (settings, warnings) = load(args).map_err(crate::daemon::Error::config)?;
    for warning in warnings {
        eprintln!("gpud: {warning}");
    }
    Ok(settings)
}

/// The settings on SIGHUP: warnings logged; an error keeps the running settings.
pub fn reload(args: &PluginArgs) -> Result<Settings, crate::daemon::Error> {
    let (settings, warnings) = load(args).map_err(crate::daemon::Error::config)?;
    for warning in warnings {
        tracing::warn!("{warning}");
    }
    Ok(settings)
}

/// Reads the config file (if any) and resolves the settings, with the warnings to log once.
pub fn load(args: &PluginArgs) -> Result<(Settings, Vec<String>), NvidiaConfigError> {
    let path = nvidia_config::config_file(
        args.config_file.as_deref(),
        &ProcessEnv,
        Component::DevicePlugin,
    );
    let given = GivenFlags {
        shared: Some(&args.shared),
        plugin: Some(&args.plugin),
        gfd: None,
    };
    let config = nvidia_config::load_and_resolve(
        path.as_deref(),
        given,
        &ProcessEnv,
        Component::DevicePlugin,
    )?;
    let settings = from_config(&config);
    Ok((settings, config.warnings))
}

/// The device plugin's view of a resolved NVIDIA config.
pub fn from_config(config: &Config) -> Settings {
    let plugin = &config.flags.plugin;
    let replicated = config.sharing.replicated();
    let mut list_strategies = Vec::new();
    for strategy in &plugin.device_list_strategy {
        if !list_strategies.contains(strategy) {
            list_strategies.push(*strategy);
        }
    }
    Settings {
        mig_strategy: config.flags.mig_strategy,
        list_strategies,
        id_strategy: plugin.device_id_strategy,
        pass_device_specs: plugin.pass_device_specs,
        dev_root: config.flags.nvidia_dev_root.clone(),
        cdi_annotation_prefix: plugin.cdi_annotation_prefix.clone(),
        shared_policy: plugin.shared_devices_allocation_policy,
        sharing: replicated
            .resources
            .iter()
            .filter(|r| r.replicas > 1)
            .map(|r| Sharing {
                name: r.name.clone(),
                replicas: r.replicas,
                rename: r.rename.clone(),
            })
            .collect(),
        fail_requests_greater_than_one: replicated.fail_requests_greater_than_one,
        mps_root: (config.sharing.strategy() == SharingStrategy::Mps)
            .then(|| config.flags.mps_root.clone())
            .flatten(),
    }
}
