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

use crate::cli::{self, CommonArgs, NodeArgs};
use crate::device_plugin::manager::{self, ManagerConfig};
use crate::device_plugin::settings::Settings;
use crate::device_plugin::settings_source::{self, PluginArgs};
use crate::exit;
use crate::health::watcher::{self, WatcherConfig, WatcherOverrides};
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

    /// The kubelet's registration socket; "" serves without registering.
    #[arg(
        long,
        value_name = "PATH",
        env = "KUBELET_SOCKET",
        default_value = "/var/lib/kubelet/device-plugins/kubelet.sock"
    )]
    kubelet_socket: String,

    /// How often the node is rescanned for GPUs and MIG devices that appeared or vanished.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = cli::positive_duration)]
    rescan_interval: Duration,

    /// The procfs holding the driver's MIG capability tree (for MIG device nodes).
    #[arg(long, value_name = "PATH", default_value = "/proc")]
    proc_root: PathBuf,

    /// Kernel log the health watcher follows; "" disables it.
    #[arg(
        long,
        value_name = "PATH",
        env = "GPUD_KMSG_PATH",
        default_value = "/dev/kmsg"
    )]
    kmsg: String,

    /// How often the health watcher polls counters, temperatures and links.
    #[arg(long, value_name = "DURATION", env = "GPUD_HEALTH_POLL_INTERVAL", default_value = "5s",
          value_parser = humantime::parse_duration)]
    health_poll_interval: Duration,
}

/// Entry point.
pub fn main(argv: Vec<OsString>) -> ExitCode {
    let args: Args = match cli::parse(argv) {
        Ok(args) => args,
        Err(code) => return code,
    };
    let settings = match settings_source::load(&args.plugin) {
        Ok((settings, warnings)) => {
            for warning in warnings {
                eprintln!("gpud: {warning}");
            }
            settings
        }
        Err(err) => {
            eprintln!("gpud: {err}");
            return ExitCode::from(exit::DATA);
        }
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
        Ok(runtime) => runtime.block_on(serve(args, settings, nvml, inventory)),
        Err(code) => code,
    }
}

async fn serve(
    args: Args,
    settings: Settings,
    nvml: crate::nvml::Nvml,
    inventory: Inventory,
) -> ExitCode {
    let cancel = CancellationToken::new();
    let (settings_tx, settings_rx) = watch::channel(Arc::new(settings));

    let (health, warnings) = WatcherConfig::resolve(
        WatcherOverrides {
            poll_interval: Some(args.health_poll_interval),
            kmsg: Some(&args.kmsg),
            ..WatcherOverrides::default()
        },
        &crate::config::HealthSection::default(),
    );
    for warning in warnings {
        warn!("{warning}");
    }
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

    let config = ManagerConfig {
        kubelet_socket: (!args.kubelet_socket.is_empty())
            .then(|| PathBuf::from(&args.kubelet_socket)),
        plugin_dir: PathBuf::from("/var/lib/kubelet/device-plugins"),
        proc_root: args.proc_root.clone(),
    };
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
