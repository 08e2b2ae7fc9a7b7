//! `gpud labeller`: GFD's labels for this node, written as an NFD features file, printed,
//! patched onto the Node object, or handed to nfd-master in a NodeFeature object; drop-in for
//! gpu-feature-discovery's flags, environment and config file.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, ValueEnum};
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use crate::cli;
use crate::exit;
use crate::inventory::Inventory;
use crate::labeller::{self, ApiSink, NodeFeatureSink, NodeSink, Settings};
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

    /// Where labels go [default: node-feature when useNodeFeatureAPI is set to true by flag,
    /// environment or config file; else file].
    #[arg(long, value_enum, env = "GPUD_LABELLER_SINK")]
    sink: Option<Sink>,

    /// Node to label (the Kubernetes node name).
    #[arg(long, value_name = "NAME", env = "NODE_NAME")]
    node_name: Option<String>,

    /// Namespace of the NodeFeature object (and of the labeller's pod).
    #[arg(
        long,
        value_name = "NAMESPACE",
        env = "NAMESPACE",
        default_value = "default"
    )]
    namespace: String,

    /// The labeller's own pod: its DaemonSet and the pod own the NodeFeature object, so it is
    /// deleted with the DaemonSet.
    #[arg(long, value_name = "NAME", env = "POD_NAME")]
    pod_name: Option<String>,

    /// kubeconfig for the API sinks; without it the in-cluster service account is used.
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
    /// The features file and the Node.
    Both,
    /// NFD's NodeFeature object (GFD's useNodeFeatureAPI), through the Kubernetes API.
    NodeFeature,
}

impl Sink {
    /// The sink used when `--sink` is not given: the NodeFeature object only when
    /// `useNodeFeatureAPI` was asked for, since GFD's default of true would otherwise make
    /// every plain run need API access; the features file needs none.
    fn chosen(given: Option<Sink>, flags: &nvidia_config::Flags) -> Sink {
        given.unwrap_or(
            if flags.use_node_feature_api && flags.use_node_feature_api_explicit {
                Sink::NodeFeature
            } else {
                Sink::File
            },
        )
    }

    fn writes_file(self) -> bool {
        matches!(self, Sink::File | Sink::Both)
    }

    fn name(self) -> &'static str {
        match self {
            Sink::File => "file",
            Sink::Node => "node",
            Sink::Both => "both",
            Sink::NodeFeature => "node-feature",
        }
    }
}

impl Args {
    /// Reads the config file and resolves every setting (called at start and on SIGHUP).
    fn config(&self) -> Result<nvidia_config::Config, NvidiaConfigError> {
        let path = nvidia_config::config_file(
            self.config_file.as_deref(),
            &ProcessEnv,
            Component::FeatureDiscovery,
        );
        nvidia_config::load_and_resolve(
            path.as_deref(),
            GivenFlags {
                shared: Some(&self.shared),
                plugin: None,
                gfd: Some(&self.gfd),
            },
            &ProcessEnv,
            Component::FeatureDiscovery,
        )
    }

    /// The labeller's settings for `config` writing to `sink`.
    fn settings(&self, config: &nvidia_config::Config, sink: Sink) -> Settings {
        Settings::from_config(
            config,
            sink.writes_file(),
            self.sysfs_root.clone(),
            self.health_labels,
        )
    }

    /// What selected `sink`, for messages.
    fn sink_source(&self, sink: Sink) -> String {
        match self.sink {
            Some(_) => format!("--sink {}", sink.name()),
            None => "useNodeFeatureAPI (the node-feature sink)".to_owned(),
        }
    }

    /// The usage error for a sink that lacks what it needs, if any.
    fn missing_for(&self, sink: Sink) -> Option<String> {
        if sink == Sink::File {
            return None;
        }
        if self.node_name.as_deref().is_none_or(str::is_empty) {
            return Some(format!(
                "{} needs the node name (--node-name or NODE_NAME)",
                self.sink_source(sink)
            ));
        }
        if sink == Sink::NodeFeature && self.namespace.is_empty() {
            return Some(format!(
                "{} needs the namespace (--namespace or NAMESPACE)",
                self.sink_source(sink)
            ));
        }
        None
    }
}

/// Entry point.
pub fn main(argv: Vec<OsString>) -> ExitCode {
    let args: Args = match cli::parse(argv) {
        Ok(args) => args,
        Err(code) => return code,
    };
    telemetry::init(args.log_format);
    let config = match args.config() {
        Ok(config) => config,
        Err(err) => {
            eprintln!("gpud: {err}");
            return ExitCode::from(exit::DATA);
        }
    };
    for warning in &config.warnings {
        warn!("{warning}");
    }
    let sink = Sink::chosen(args.sink, &config.flags);
    if let Some(missing) = args.missing_for(sink) {
        eprintln!("gpud: {missing}");
        return ExitCode::from(exit::USAGE);
    }
    if config.flags.use_node_feature_api && sink != Sink::NodeFeature {
        if config.flags.use_node_feature_api_explicit {
            info!(
                sink = sink.name(),
                "useNodeFeatureAPI is set, but --sink decides"
            );
        } else {
            debug!(
                "useNodeFeatureAPI is true by GFD's default only; writing the features file \
                 (set it explicitly, or --sink node-feature, for the NodeFeature object)"
            );
        }
    }
    let settings = args.settings(&config, sink);
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
    runtime.block_on(serve(args, sink, inventory, settings))
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

/// Connects the API sink `sink` needs, if any.
async fn api_sink(args: &Args, sink: Sink) -> Result<Option<ApiSink>, labeller::ApiSinkError> {
    if sink == Sink::File {
        return Ok(None);
    }
    let client = labeller::api::connect(args.kubeconfig.as_deref()).await?;
    let node = args.node_name.clone().unwrap_or_default();
    Ok(Some(if sink == Sink::NodeFeature {
        ApiSink::NodeFeature(Box::new(NodeFeatureSink::new(
            client,
            args.namespace.clone(),
            node,
            args.pod_name.clone(),
        )))
    } else {
        ApiSink::Node(Box::new(NodeSink::new(client, node)))
    }))
}

async fn serve(
    args: Args,
    sink: Sink,
    inventory: Option<Inventory>,
    settings: Settings,
) -> ExitCode {
    let api_sink = match api_sink(&args, sink).await {
        Ok(api_sink) => api_sink,
        Err(err) => {
            eprintln!("gpud: {err}");
            return ExitCode::from(exit::FAILURE);
        }
    };
    let cancel = CancellationToken::new();
    let (reload_tx, reload_rx) = mpsc::channel(4);
    let oneshot = settings.oneshot;
    let rescanner = (!oneshot)
        .then(|| inventory.clone())
        .flatten()
        .map(|inventory| {
            tokio::spawn(rescan_every(
                inventory,
                args.rescan_interval,
                cancel.clone(),
            ))
        });
    let mut task = tokio::spawn(labeller::run(
        cancel.clone(),
        inventory,
        settings,
        api_sink,
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
                match args.config() {
                    Ok(config) => {
                        for warning in &config.warnings {
                            warn!("{warning}");
                        }
                        let now = Sink::chosen(args.sink, &config.flags);
                        if now != sink {
                            warn!(keeping = sink.name(), wanted = now.name(),
                                  "useNodeFeatureAPI changed; the sink changes on restart");
                        }
                        info!("SIGHUP: configuration read");
                        let _ = reload_tx.send(args.settings(&config, sink)).await;
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

/// Rescans the inventory on an interval so MIG changes and lost GPUs relabel promptly.
async fn rescan_every(inventory: Inventory, every: Duration, cancel: CancellationToken) {
    let mut ticks = tokio::time::interval(every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticks.tick().await;
    loop {
        tokio::select! {
            () = cancel.cancelled() => return,
            _ = ticks.tick() => {
                if let Err(err) = inventory.rescan().await {
                    warn!(error = %err, "Rescan failed");
                }
            }
        }
    }
}
