//! `gpud device-plugin`: the kubelet device plugin, with the health watcher in-process so a
//! standalone container withdraws sick GPUs by itself.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::cli::{self, CommonArgs, HealthArgs, NodeArgs};
use crate::device_plugin::manager::{self, ManagerConfig};
use crate::device_plugin::settings::Settings;
use crate::device_plugin::settings_source::{self, PluginArgs};
use crate::exit;
use crate::health::watcher::{self, WatcherConfig};
use crate::inventory::Inventory;

/// Advertise the node's GPUs to the kubelet (Device Plugin API v1beta1), as NVIDIA's
/// k8s-device-plugin does, with the same config file, flags and environment.
#[derive(Debug, Parser)]
#[command(name = "gpud device-plugin", version)]
struct Args {
    #[command(flatten)]
    common: CommonArgs,

    #[command(flatten)]
    node: NodeArgs,

    #[command(flatten)]
    plugin: PluginArgs,

    #[command(flatten)]
    kubelet: KubeletArgs,

    /// How often the node is rescanned for GPUs and MIG devices that appeared or vanished.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = cli::positive_duration)]
    rescan_interval: Duration,

    #[command(flatten)]
    health: HealthArgs,
}

/// Where the kubelet is, shared with `gpud run`.
#[derive(Debug, Clone, clap::Args)]
pub(super) struct KubeletArgs {
    /// The kubelet's registration socket; "" serves without registering.
    #[arg(
        long,
        value_name = "PATH",
        env = "KUBELET_SOCKET",
        default_value = "/var/lib/kubelet/device-plugins/kubelet.sock"
    )]
    kubelet_socket: String,

    /// The procfs holding the driver's MIG capability tree (for MIG device nodes).
    #[arg(long, value_name = "PATH", default_value = "/proc")]
    proc_root: PathBuf,
}

impl KubeletArgs {
    /// The plugin manager's paths.
    pub(super) fn manager_config(&self) -> ManagerConfig {
        ManagerConfig {
            kubelet_socket: (!self.kubelet_socket.is_empty())
                .then(|| PathBuf::from(&self.kubelet_socket)),
            plugin_dir: PathBuf::from("/var/lib/kubelet/device-plugins"),
            proc_root: self.proc_root.clone(),
        }
    }
}

/// The device plugin's settings at start: warnings printed once, a bad config file reported
/// and mapped to exit 65.
pub(super) fn plugin_settings(args: &PluginArgs) -> Result<Settings, ExitCode> {
    match settings_source::load(args) {
        Ok((settings, warnings)) => {
            for warning in warnings {
                eprintln!("gpud: {warning}");
            }
            Ok(settings)
        }
        Err(err) => {
            eprintln!("gpud: {err}");
            Err(ExitCode::from(exit::DATA))
        }
    }
}

/// Entry point.
pub fn main(argv: Vec<OsString>) -> ExitCode {
    let args: Args = match cli::parse(argv) {
        Ok(args) => args,
        Err(code) => return code,
    };
    let (health, _) = match args.health.resolve() {
        Ok(resolved) => resolved,
        Err(code) => return code,
    };
    let settings = match plugin_settings(&args.plugin) {
        Ok(settings) => settings,
        Err(code) => return code,
    };
    let nvml = match args.common.start() {
        Ok(nvml) => nvml,
        Err(code) => return code,
    };
    let inventory = match Inventory::discover(nvml.clone(), args.node.facts()) {
        Ok(inventory) => inventory,
        Err(err) => return cli::fail_nvml(&err),
    };
    match cli::runtime(2) {
        Ok(runtime) => runtime.block_on(serve(args, settings, health, nvml, inventory)),
        Err(code) => code,
    }
}

async fn serve(
    args: Args,
    settings: Settings,
    health: WatcherConfig,
    nvml: crate::nvml::Nvml,
    inventory: Inventory,
) -> ExitCode {
    let cancel = CancellationToken::new();
    let (settings_tx, settings_rx) = watch::channel(Arc::new(settings));

    let watcher = tokio::spawn(watcher::run(
        cancel.clone(),
        nvml,
        inventory.clone(),
        health,
    ));

    let rescanner = inventory.clone();
    let rescan_cancel = cancel.clone();
    let rescan_every = args.rescan_interval;
    tokio::spawn(async move {
        rescanner
            .rescan_periodically(rescan_cancel, rescan_every)
            .await;
    });

    let config = args.kubelet.manager_config();
    let mut plugins = tokio::spawn(manager::run(cancel.clone(), inventory, settings_rx, config));

    let Ok(mut hangup) = signal(SignalKind::hangup()) else {
        error!("Cannot install the SIGHUP handler");
        return ExitCode::from(exit::FAILURE);
    };
    let stop = crate::signals::shutdown();
    tokio::pin!(stop);
    let code = loop {
        tokio::select! {
            () = &mut stop => break ExitCode::SUCCESS,
            _ = hangup.recv() => match settings_source::load(&args.plugin) {
                Ok((next, warnings)) => {
                    for warning in warnings {
                        warn!("{warning}");
                    }
                    info!("Configuration reloaded");
                    settings_tx.send_replace(Arc::new(next));
                }
                Err(err) => warn!(error = %err, "Configuration not reloaded; keeping the running one"),
            },
            finished = &mut plugins => {
                match finished {
                    Ok(Err(err)) => {
                        eprintln!("gpud: {err}");
                        break ExitCode::from(exit::FAILURE);
                    }
                    _ => break ExitCode::SUCCESS,
                }
            }
        }
    };
    cancel.cancel();
    let _ = watcher.await;
    if !plugins.is_finished() {
        let _ = tokio::time::timeout(Duration::from_secs(5), plugins).await;
    }
    code
}
