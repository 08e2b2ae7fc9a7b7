//! `gpud run`: every subsystem in one process over one inventory — for systemd on bare metal
//! and single-container deployments.
//!
//! One discovery, one health watcher and one rescan loop feed the device plugin, the labeller
//! and the exporter: an XID withdraws the GPU from the kubelet, flips the health labels and
//! shows in `/metrics` from the same event. Each subsystem keeps its standalone applet's flags
//! and environment, so a DaemonSet's arguments carry over.
//!
//! Supervision is fail-fast: a subsystem that stops with an error (a port in use, a socket
//! directory that vanished) stops the whole process with a non-zero exit, so systemd or the
//! kubelet restarts it cleanly instead of leaving a half-working daemon. SIGHUP re-reads
//! NVIDIA's config file for the device plugin and the labeller; a bad file keeps the running
//! settings.

use std::ffi::OsString;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{Parser, ValueEnum};
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use super::device_plugin::{KubeletArgs, plugin_settings};
use super::exporter::ExporterArgs;
use super::labeller::{LabellerArgs, Sink};
use crate::cli::{self, CommonArgs, HealthArgs};
use crate::device_plugin::manager;
use crate::device_plugin::settings_source::{self, PluginArgs};
use crate::exit;
use crate::health::watcher;
use crate::inventory::Inventory;
use crate::labeller;
use crate::nvml::NodeFacts;

/// Run the device plugin, the labeller, the exporter and the health watcher in one process,
/// over one view of the node's GPUs.
///
/// Each subsystem takes the flags and environment of its standalone applet (see `gpud
/// device-plugin --help`, `gpud labeller --help`, `gpud exporter --help`); NVIDIA's config
/// file serves the device plugin and the labeller. SIGHUP reloads it.
#[derive(Debug, Parser)]
#[command(name = "gpud run", version)]
struct Args {
    #[command(flatten)]
    common: CommonArgs,

    /// The Kubernetes node name (labels, the Node and NodeFeature sinks, the Hostname
    /// label); the kernel host name when unset.
    #[arg(long, value_name = "NAME", env = "NODE_NAME")]
    node_name: Option<String>,

    /// Subsystems not to start (comma-separated); the health watcher always runs.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        value_name = "SUBSYSTEMS",
        env = "GPUD_DISABLE"
    )]
    disable: Vec<Subsystem>,

    /// How often the node is rescanned for GPUs and MIG devices that appeared or vanished.
    #[arg(long, value_name = "DURATION", env = "GPUD_RESCAN_INTERVAL", default_value = "30s",
          value_parser = cli::positive_duration)]
    rescan_interval: Duration,

    #[command(flatten)]
    health: HealthArgs,

    #[command(flatten)]
    plugin: PluginArgs,

    #[command(flatten)]
    kubelet: KubeletArgs,

    #[command(flatten)]
    labeller: LabellerArgs,

    #[command(flatten)]
    exporter: ExporterArgs,
}

/// The subsystems `--disable` can leave out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Subsystem {
    /// The kubelet device plugin.
    DevicePlugin,
    /// The node labeller.
    Labeller,
    /// The Prometheus exporter.
    Exporter,
}

impl Args {
    fn enabled(&self, subsystem: Subsystem) -> bool {
        !self.disable.contains(&subsystem)
    }
}

/// Queue between the health watcher and the exporter's XID record.
const XID_QUEUE: usize = 1024;

/// How long subsystems get to finish after the stop signal before the process exits anyway.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// Entry point.
pub fn main(argv: Vec<OsString>) -> ExitCode {
    let args: Args = match cli::parse(argv) {
        Ok(args) => args,
        Err(code) => return code,
    };
    // Everything that reads a file or a flag is checked before NVML is opened, so a bad
    // config exits with its reason and nothing half-started.
    let (health, _) = match args.health.resolve() {
        Ok(resolved) => resolved,
        Err(code) => return code,
    };
    let plugin_settings = match plugin_settings(&args.plugin) {
        Ok(settings) => settings,
        Err(code) => return code,
    };
    let gfd_config = match args
        .labeller
        .config(args.plugin.config_file.as_deref(), &args.plugin.shared)
    {
        Ok(config) => config,
        Err(err) => {
            eprintln!("gpud: {err}");
            return ExitCode::from(exit::DATA);
        }
    };
    let sink = args.labeller.sink(&gfd_config);
    if args.enabled(Subsystem::Labeller)
        && let Err(usage) = args
            .labeller
            .check(&gfd_config, sink, args.node_name.as_deref())
    {
        eprintln!("gpud: {usage}");
        return ExitCode::from(exit::USAGE);
    }
    let labeller_settings = args.labeller.settings(&gfd_config, sink);
    let counters = match args.exporter.counters() {
        Ok(counters) => counters,
        Err(code) => return code,
    };
    let nvml = match args.common.start() {
        Ok(nvml) => nvml,
        Err(code) => return code,
    };
    let exporter_config = match args.exporter.config(&counters, &nvml) {
        Ok(config) => config,
        Err(code) => return code,
    };
    let facts = NodeFacts {
        node_name: args.node_name.clone(),
        machine_type_file: gfd_config.flags.gfd.machine_type_file.clone(),
    };
    let inventory = match Inventory::discover(nvml.clone(), facts) {
        Ok(inventory) => inventory,
        Err(err) => return cli::fail_nvml(&err),
    };
    let runtime = match cli::runtime(2) {
        Ok(runtime) => runtime,
        Err(code) => return code,
    };
    runtime.block_on(async move {
        let cancel = CancellationToken::new();
        let mut tasks = JoinSet::new();

        let (xid_tx, xid_rx) = if args.enabled(Subsystem::Exporter) {
            let (tx, rx) = mpsc::channel(XID_QUEUE);
            (Some(tx), Some(rx))
        } else {
            (None, None)
        };
        // Health is a view, not a service: if it cannot watch, the others still run and the
        // device states stay what discovery saw.
        let health_task = tokio::spawn({
            let (cancel, nvml, inventory) = (cancel.clone(), nvml.clone(), inventory.clone());
            async move {
                if let Err(err) =
                    watcher::run_with_xids(cancel, nvml, inventory, health, xid_tx).await
                {
                    warn!(error = %err, "Health watching is off: devices keep discovery's state");
                }
            }
        });
        let rescan_task = tokio::spawn({
            let (cancel, inventory) = (cancel.clone(), inventory.clone());
            let every = args.rescan_interval;
            async move { inventory.rescan_periodically(cancel, every).await }
        });

        let (plugin_tx, plugin_rx) = watch::channel(Arc::new(plugin_settings));
        if args.enabled(Subsystem::DevicePlugin) {
            let run = manager::run(
                cancel.clone(),
                inventory.clone(),
                plugin_rx,
                args.kubelet.manager_config(),
            );
            tasks.spawn(async move { ("device plugin", run.await.map_err(|e| e.to_string())) });
        }
        let (labeller_tx, labeller_rx) = mpsc::channel(4);
        if args.enabled(Subsystem::Labeller) {
            let api_sink = match args
                .labeller
                .api_sink(sink, args.node_name.as_deref())
                .await
            {
                Ok(api_sink) => api_sink,
                Err(err) => {
                    eprintln!("gpud: labeller: {err}");
                    cancel.cancel();
                    return ExitCode::from(exit::FAILURE);
                }
            };
            let run = labeller::run(
                cancel.clone(),
                Some(inventory.clone()),
                labeller_settings,
                api_sink,
                labeller_rx,
            );
            tasks.spawn(async move { ("labeller", run.await.map_err(|e| e.to_string())) });
        }
        if args.enabled(Subsystem::Exporter) {
            let (probes, on_ready) = crate::http::probes::probes();
            let run = crate::exporter::run(
                cancel.clone(),
                nvml.clone(),
                inventory.clone(),
                exporter_config,
                xid_rx,
                probes,
                on_ready,
            );
            tasks.spawn(async move { ("exporter", run.await.map_err(|e| e.to_string())) });
        }
        info!(
            gpus = inventory.current().gpus.len(),
            device_plugin = args.enabled(Subsystem::DevicePlugin),
            labeller = args.enabled(Subsystem::Labeller),
            exporter = args.enabled(Subsystem::Exporter),
            "gpud running"
        );

        let reloads = Reloads {
            plugin: plugin_tx,
            labeller: labeller_tx,
            sink,
        };
        let code = supervise(&args, &mut tasks, &reloads).await;
        cancel.cancel();
        let drained = tokio::time::timeout(SHUTDOWN_GRACE, async {
            while tasks.join_next().await.is_some() {}
            let _ = health_task.await;
            let _ = rescan_task.await;
        })
        .await;
        if drained.is_err() {
            warn!("Some subsystems did not stop in time");
        }
        code
    })
}

/// Waits for a stop signal or for a subsystem to end, reloading settings on SIGHUP.
async fn supervise(
    args: &Args,
    tasks: &mut JoinSet<(&'static str, Result<(), String>)>,
    reloads: &Reloads,
) -> ExitCode {
    let Ok(mut hangup) = signal(SignalKind::hangup()) else {
        error!("Cannot install the SIGHUP handler");
        return ExitCode::from(exit::FAILURE);
    };
    let stop = crate::signals::shutdown();
    tokio::pin!(stop);
    loop {
        tokio::select! {
            () = &mut stop => return ExitCode::SUCCESS,
            _ = hangup.recv() => reload(args, reloads).await,
            Some(ended) = tasks.join_next() => match ended {
                Ok((name, Ok(()))) => info!(subsystem = name, "Subsystem finished"),
                Ok((name, Err(err))) => {
                    eprintln!("gpud: {name}: {err}");
                    return ExitCode::from(exit::FAILURE);
                }
                Err(err) => {
                    eprintln!("gpud: a subsystem stopped: {err}");
                    return ExitCode::from(exit::FAILURE);
                }
            },
        }
    }
}

/// Where SIGHUP's new settings go.
struct Reloads {
    plugin: watch::Sender<Arc<crate::device_plugin::settings::Settings>>,
    labeller: mpsc::Sender<labeller::Settings>,
    /// The labeller's sink, fixed for the life of the process.
    sink: Sink,
}

/// Re-reads NVIDIA's config file for the device plugin and the labeller; a bad one is
/// reported and the running settings stay.
async fn reload(args: &Args, reloads: &Reloads) {
    match settings_source::load(&args.plugin) {
        Ok((next, warnings)) => {
            for warning in warnings {
                warn!("{warning}");
            }
            info!("Configuration reloaded");
            reloads.plugin.send_replace(Arc::new(next));
        }
        Err(err) => warn!(error = %err, "Configuration not reloaded; keeping the running one"),
    }
    if !args.enabled(Subsystem::Labeller) {
        return;
    }
    let labeller_settings = args.labeller.reload(
        args.plugin.config_file.as_deref(),
        &args.plugin.shared,
        reloads.sink,
    );
    if let Some(next) = labeller_settings {
        // A oneshot labeller that has finished no longer listens; nothing to tell it.
        let _ = reloads.labeller.send(next).await;
    }
}
