//! `gpud labeller`: GFD's labels for this node, written as an NFD features file, printed,
//! patched onto the Node object, or handed to nfd-master in a NodeFeature object; drop-in for
//! gpu-feature-discovery's flags, environment and config file.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, ValueEnum};
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use crate::cli::{self, CommonArgs, HealthArgs};
use crate::exit;
use crate::health::watcher::{self, WatcherConfig};
use crate::inventory::Inventory;
use crate::labeller::{self, ApiSink, NodeFeatureSink, NodeSink, Settings};
use crate::nvidia_config::{
    self, Component, GfdFlags, GivenFlags, NvidiaConfigError, ProcessEnv, SharedFlags,
};
use crate::nvml::{NodeFacts, Nvml};
use crate::telemetry;

/// Label the node with GPU features (GFD-compatible): model, memory, count, MIG, sharing,
/// driver and CUDA versions, plus gpud's health summary.
///
/// Precedence for every GFD setting: flag, then environment (GFD_*), then the config file
/// (--config-file, GFD_CONFIG_FILE, CONFIG_FILE), then GFD's default. SIGHUP reloads the
/// config file; a bad one is reported and the previous settings stay.
#[derive(Debug, Parser)]
#[command(name = "gpud labeller", version)]
struct Args {
    #[command(flatten)]
    common: CommonArgs,

    /// NVIDIA's config file (YAML or JSON) [env: GFD_CONFIG_FILE, CONFIG_FILE].
    #[arg(long, value_name = "PATH")]
    config_file: Option<PathBuf>,

    #[command(flatten)]
    shared: SharedFlags,

    /// Node to label (the Kubernetes node name).
    #[arg(long, value_name = "NAME", env = "NODE_NAME")]
    node_name: Option<String>,

    #[command(flatten)]
    labeller: LabellerArgs,

    /// Rescan the GPUs this often, relabelling as soon as something changed (MIG layout,
    /// a GPU lost or back).
    #[arg(long, value_name = "DURATION", env = "GPUD_LABELLER_RESCAN_INTERVAL",
          default_value = "10s", value_parser = cli::positive_duration)]
    rescan_interval: Duration,

    #[command(flatten)]
    health: HealthArgs,
}

/// The labeller's own options (GFD's `flags.gfd` and gpud's sinks), shared with `gpud run`.
#[derive(Debug, Clone, clap::Args)]
pub(super) struct LabellerArgs {
    #[command(flatten)]
    gfd: GfdFlags,

    /// Where labels go [default: node-feature when useNodeFeatureAPI is set to true by flag,
    /// environment or config file; else file].
    #[arg(long, value_enum, env = "GPUD_LABELLER_SINK")]
    sink: Option<Sink>,

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

    /// Add gpud's health-summary labels (gpud.io/gpu.health …).
    #[arg(long, value_name = "BOOL", env = "GPUD_HEALTH_LABELS", default_value = "true",
          value_parser = nvidia_config::parse_bool)]
    health_labels: bool,
}

/// Where labels are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(super) enum Sink {
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

impl LabellerArgs {
    /// Reads NVIDIA's config file and resolves GFD's view of it (at start and on SIGHUP).
    pub(super) fn config(
        &self,
        config_file: Option<&Path>,
        shared: &SharedFlags,
    ) -> Result<nvidia_config::Config, NvidiaConfigError> {
        let path =
            nvidia_config::config_file(config_file, &ProcessEnv, Component::FeatureDiscovery);
        nvidia_config::load_and_resolve(
            path.as_deref(),
            GivenFlags {
                shared: Some(shared),
                plugin: None,
                gfd: Some(&self.gfd),
            },
            &ProcessEnv,
            Component::FeatureDiscovery,
        )
    }

    /// The sink `config` and `--sink` select.
    pub(super) fn sink(&self, config: &nvidia_config::Config) -> Sink {
        Sink::chosen(self.sink, &config.flags)
    }

    /// The labeller's settings for `config` writing to `sink`.
    pub(super) fn settings(&self, config: &nvidia_config::Config, sink: Sink) -> Settings {
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

    /// Checks that `sink` has what it needs and says how it was chosen; the usage error
    /// otherwise.
    pub(super) fn check(
        &self,
        config: &nvidia_config::Config,
        sink: Sink,
        node_name: Option<&str>,
    ) -> Result<(), String> {
        if sink != Sink::File && node_name.is_none_or(str::is_empty) {
            return Err(format!(
                "{} needs the node name (--node-name or NODE_NAME)",
                self.sink_source(sink)
            ));
        }
        if sink == Sink::NodeFeature && self.namespace.is_empty() {
            return Err(format!(
                "{} needs the namespace (--namespace or NAMESPACE)",
                self.sink_source(sink)
            ));
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
        Ok(())
    }

    /// Connects the API sink `sink` needs, if any.
    pub(super) async fn api_sink(
        &self,
        sink: Sink,
        node_name: Option<&str>,
    ) -> Result<Option<ApiSink>, labeller::ApiSinkError> {
        if sink == Sink::File {
            return Ok(None);
        }
        let client = labeller::api::connect(self.kubeconfig.as_deref()).await?;
        let node = node_name.unwrap_or_default().to_owned();
        Ok(Some(if sink == Sink::NodeFeature {
            ApiSink::NodeFeature(Box::new(NodeFeatureSink::new(
                client,
                self.namespace.clone(),
                node,
                self.pod_name.clone(),
            )))
        } else {
            ApiSink::Node(Box::new(NodeSink::new(client, node)))
        }))
    }

    /// SIGHUP: the new settings for the running `sink`, or `None` (logged) when the config
    /// file is bad and the running settings stay.
    pub(super) fn reload(
        &self,
        config_file: Option<&Path>,
        shared: &SharedFlags,
        sink: Sink,
    ) -> Option<Settings> {
        match self.config(config_file, shared) {
            Ok(config) => {
                for warning in &config.warnings {
                    warn!("{warning}");
                }
                let now = self.sink(&config);
                if now != sink {
                    warn!(
                        keeping = sink.name(),
                        wanted = now.name(),
                        "useNodeFeatureAPI changed; the sink changes on restart"
                    );
                }
                info!("SIGHUP: configuration read");
                Some(self.settings(&config, sink))
            }
            Err(err) => {
                error!(error = %err, "Config reload failed; keeping the previous configuration");
                None
            }
        }
    }
}

/// Entry point.
pub fn main(argv: Vec<OsString>) -> ExitCode {
    let args: Args = match cli::parse(argv) {
        Ok(args) => args,
        Err(code) => return code,
    };
    telemetry::init(args.common.log_format);
    let (health, _) = match args.health.resolve() {
        Ok(resolved) => resolved,
        Err(code) => return code,
    };
    let config = match args
        .labeller
        .config(args.config_file.as_deref(), &args.shared)
    {
        Ok(config) => config,
        Err(err) => {
            eprintln!("gpud: {err}");
            return ExitCode::from(exit::DATA);
        }
    };
    for warning in &config.warnings {
        warn!("{warning}");
    }
    let sink = args.labeller.sink(&config);
    if let Err(usage) = args
        .labeller
        .check(&config, sink, args.node_name.as_deref())
    {
        eprintln!("gpud: {usage}");
        return ExitCode::from(exit::USAGE);
    }
    let settings = args.labeller.settings(&config, sink);
    let opened = match open_inventory(&args, &config) {
        Ok(opened) => opened,
        Err(code) => return code,
    };
    match cli::runtime(1) {
        Ok(runtime) => runtime.block_on(serve(args, sink, opened, settings, health)),
        Err(code) => code,
    }
}

/// Opens NVML and discovers the node; with `failOnInitError: false` a failure means running
/// without GPUs (timestamp label only), as GFD does.
fn open_inventory(
    args: &Args,
    config: &nvidia_config::Config,
) -> Result<Option<(Nvml, Inventory)>, ExitCode> {
    let facts = NodeFacts {
        node_name: args.node_name.clone(),
        machine_type_file: config.flags.gfd.machine_type_file.clone(),
    };
    let result = Nvml::open(args.common.nvml_lib.as_deref()).and_then(|nvml| {
        let inventory = Inventory::discover(nvml.clone(), facts)?;
        Ok((nvml, inventory))
    });
    match result {
        Ok(opened) => Ok(Some(opened)),
        Err(err) if !config.flags.fail_on_init_error => {
            warn!(error = %err, "NVML unavailable; labelling without GPUs (failOnInitError is false)");
            Ok(None)
        }
        Err(err) => Err(cli::fail_nvml(&err)),
    }
}

async fn serve(
    args: Args,
    sink: Sink,
    opened: Option<(Nvml, Inventory)>,
    settings: Settings,
    health: WatcherConfig,
) -> ExitCode {
    let api_sink = match args
        .labeller
        .api_sink(sink, args.node_name.as_deref())
        .await
    {
        Ok(api_sink) => api_sink,
        Err(err) => {
            eprintln!("gpud: {err}");
            return ExitCode::from(exit::FAILURE);
        }
    };
    let cancel = CancellationToken::new();
    let (reload_tx, reload_rx) = mpsc::channel(4);
    let mut helpers = Vec::new();
    // A looping labeller keeps the inventory current itself: rescans for MIG changes and
    // lost GPUs, and the health watcher for the gpud.io/gpu.* health labels. A oneshot
    // labels what discovery saw.
    if let Some((nvml, inventory)) = opened.as_ref().filter(|_| !settings.oneshot) {
        let (rescanner, stop, every) = (inventory.clone(), cancel.clone(), args.rescan_interval);
        helpers.push(tokio::spawn(async move {
            rescanner.rescan_periodically(stop, every).await;
        }));
        if settings.health_labels {
            let watch = watcher::run(cancel.clone(), nvml.clone(), inventory.clone(), health);
            helpers.push(tokio::spawn(async move {
                if let Err(err) = watch.await {
                    warn!(error = %err, "Health watching is off: health labels show discovery's view");
                }
            }));
        }
    }
    let inventory = opened.map(|(_, inventory)| inventory);
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
                if let Some(next) = args.labeller.reload(args.config_file.as_deref(), &args.shared, sink) {
                    let _ = reload_tx.send(next).await;
                }
            }
        }
    };
    cancel.cancel();
    for helper in helpers {
        let _ = helper.await;
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
