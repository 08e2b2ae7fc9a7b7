//! `gpud labeller`: GFD's labels for this node, written as an NFD features file, printed, or
//! patched onto the Node object; drop-in for gpu-feature-discovery's flags, environment and
//! config file.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, ValueEnum};
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::cli;
use crate::exit;
use crate::inventory::Inventory;
use crate::labeller::{self, NodeSink, Settings};
use crate::nvidia_config::{
    self, Component, GfdFlags, GivenFlags, NvidiaConfigError, ProcessEnv, SharedFlags,
};
use crate::nvml::{self, NodeFacts, Nvml};
use crate::telemetry::{self, LogFormat};

/// Label the node with GPU features (GFD-compatible): model, memory, count, MIG, sharing,
/// driver and CUDA versions, plus gpud's health summary.
///
/// Precedence for every GFD setting: flag, then environment (GFD_*), then the config file
/// (--config-file, GFD_CONFIG_FILE, CONFIG_FILE), then GFD's default. SIGHUP reloads the
/// config file; a bad one is reported and the previous settings stay.
#[derive(Debug, Parser)]
#[command(name = "gpud labeller", version)]
struct Args {
    /// NVML library to load instead of searching the usual places.
    #[arg(long, value_name = "PATH", env = nvml::LIB_ENV)]
    nvml_lib: Option<PathBuf>,

    /// Log line format on stderr (the level filter is taken from GPUD_LOG).
    #[arg(long, value_enum, default_value_t = LogFormat::Text, env = "GPUD_LOG_FORMAT")]
    log_format: LogFormat,

    /// NVIDIA's config file (YAML or JSON) [env: GFD_CONFIG_FILE, CONFIG_FILE].
    #[arg(long, value_name = "PATH")]
    config_file: Option<PathBuf>,

    #[command(flatten)]
    shared: SharedFlags,

    #[command(flatten)]
    gfd: GfdFlags,

    /// Where labels go: the features file (or stdout), the Node object, or both.
    #[arg(long, value_enum, default_value_t = Sink::File, env = "GPUD_LABELLER_SINK")]
    sink: Sink,

    /// Node to label (the Kubernetes node name).
    #[arg(long, value_name = "NAME", env = "NODE_NAME")]
    node_name: Option<String>,

    /// kubeconfig for the Node sink; without it the in-cluster service account is used.
    #[arg(long, value_name = "PATH", env = "KUBECONFIG")]
    kubeconfig: Option<PathBuf>,

    /// Where sysfs is mounted (PCI classes for nvidia.com/gpu.mode).
    #[arg(long, value_name = "PATH", env = "GPUD_SYSFS_ROOT",
          default_value = labeller::pci::DEFAULT_SYSFS_ROOT)]
    sysfs_root: PathBuf,

    /// Rescan the GPUs this often, relabelling as soon as something changed (MIG layout,
    /// a GPU lost or back).
    #[arg(long, value_name = "DURATION", env = "GPUD_LABELLER_RESCAN_INTERVAL",
          default_value = "10s", value_parser = cli::positive_duration)]
    rescan_interval: Duration,

    /// Add gpud's health-summary labels (gpud.io/gpu.health …).
    #[arg(long, value_name = "BOOL", env = "GPUD_HEALTH_LABELS", default_value = "true",
          value_parser = nvidia_config::parse_bool)]
    health_labels: bool,
}

/// Where labels are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Sink {
    /// The NFD features file (--output-file), or stdout.
    File,
    /// The Node object's labels, through the Kubernetes API.
    Node,
    /// Both.
    Both,
}

impl Args {
    /// Reads the config file and resolves every setting (called at start and on SIGHUP).
    fn settings(&self) -> Result<(nvidia_config::Config, Settings), NvidiaConfigError> {
        let path = nvidia_config::config_file(
            self.config_file.as_deref(),
            &ProcessEnv,
            Component::FeatureDiscovery,
        );
        let config = nvidia_config::load_and_resolve(
            path.as_deref(),
            GivenFlags {
                shared: Some(&self.shared),
                plugin: None,
                gfd: Some(&self.gfd),
            },
            &ProcessEnv,
            Component::FeatureDiscovery,
        )?;
        let settings = Settings::from_config(
            &config,
            self.sink != Sink::Node,
            self.sysfs_root.clone(),
            self.health_labels,
        );
        Ok((config, settings))
    }
}

/// Entry point.
pub fn main(argv: Vec<OsString>) -> ExitCode {
    let args: Args = match cli::parse(argv) {
        Ok(args) => args,
        Err(code) => return code,
    };
    telemetry::init(args.log_format);
    let (config, settings) = match args.settings() {
        Ok(resolved) => resolved,
        Err(err) => {
            eprintln!("gpud: {err}");
            return ExitCode::from(exit::DATA);
        }
    };
    for warning in &config.warnings {
        warn!("{warning}");
    }
    if config.flags.use_node_feature_api {
        // GFD's default since v0.19; gpud's sinks are the features file and the Node itself.
        tracing::debug!(
            "useNodeFeatureAPI is set; gpud writes the features file and/or the Node instead"
        );
    }
    if args.sink != Sink::File && args.node_name.as_deref().is_none_or(str::is_empty) {
        eprintln!(
            "gpud: --sink {:?} needs the node name (--node-name or NODE_NAME)",
            args.sink
        );
        return ExitCode::from(exit::USAGE);
    }
    let inventory = match open_inventory(&args, &config) {
        Ok(inventory) => inventory,
        Err(code) => return code,
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("gpud: cannot start the runtime: {err}");
            return ExitCode::from(exit::FAILURE);
        }
    };
    runtime.block_on(serve(args, inventory, settings))
}

/// Opens NVML and discovers the node; with `failOnInitError: false` a failure means running
/// without GPUs (timestamp label only), as GFD does.
fn open_inventory(
    args: &Args,
    config: &nvidia_config::Config,
) -> Result<Option<Inventory>, ExitCode> {
    let facts = NodeFacts {
        node_name: args.node_name.clone(),
        machine_type_file: config.flags.gfd.machine_type_file.clone(),
    };
    let result =
        Nvml::open(args.nvml_lib.as_deref()).and_then(|nvml| Inventory::discover(nvml, facts));
    match result {
        Ok(inventory) => Ok(Some(inventory)),
        Err(err) if !config.flags.fail_on_init_error => {
            warn!(error = %err, "NVML unavailable; labelling without GPUs (failOnInitError is false)");
            Ok(None)
        }
        Err(err) => Err(cli::fail_nvml(&err)),
    }
}

async fn serve(args: Args, inventory: Option<Inventory>, settings: Settings) -> ExitCode {
    let node_sink = if args.sink == Sink::File {
        None
    } else {
        let name = args.node_name.clone().unwrap_or_default();
        match NodeSink::connect(args.kubeconfig.as_deref(), name).await {
            Ok(sink) => Some(sink),
            Err(err) => {
                eprintln!("gpud: {err}");
                return ExitCode::from(exit::FAILURE);
            }
        }
    };
    let cancel = CancellationToken::new();
    let (reload_tx, reload_rx) = mpsc::channel(4);
    let oneshot = settings.oneshot;
    let rescanner = (!oneshot)
        .then(|| inventory.clone())
        .flatten()
        .map(|inventory| {
            let (cancel, every) = (cancel.clone(), args.rescan_interval);
            tokio::spawn(async move { inventory.rescan_periodically(cancel, every).await })
        });
    let mut task = tokio::spawn(labeller::run(
        cancel.clone(),
        inventory,
        settings,
        node_sink,
        reload_rx,
    ));
    let mut hangup = signal(SignalKind::hangup()).ok();
    let stop = crate::signals::shutdown();
    tokio::pin!(stop);
    let result = loop {
        tokio::select! {
            result = &mut task => break result,
            () = &mut stop => {
                cancel.cancel();
                break (&mut task).await;
            }
            Some(()) = async { match &mut hangup { Some(h) => h.recv().await, None => std::future::pending().await } } => {
                match args.settings() {
                    Ok((config, settings)) => {
                        for warning in &config.warnings {
                            warn!("{warning}");
                        }
                        info!("SIGHUP: configuration read");
                        let _ = reload_tx.send(settings).await;
                    }
                    Err(err) => error!(error = %err, "Config reload failed; keeping the previous configuration"),
                }
            }
        }
    };
    cancel.cancel();
    if let Some(rescanner) = rescanner {
        let _ = rescanner.await;
    }
    match result {
        Ok(Ok(())) => ExitCode::SUCCESS,
        Ok(Err(err)) => {
            eprintln!("gpud: {err}");
            ExitCode::from(exit::FAILURE)
        }
        Err(join) => {
            eprintln!("gpud: the labeller stopped: {join}");
            ExitCode::from(exit::FAILURE)
        }
    }
}
