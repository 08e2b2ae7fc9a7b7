//! `gpud device-plugin`: the kubelet device plugin, with the health watcher in-process so a
//! standalone container withdraws sick GPUs by itself.

use std::ffi::OsString;
use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser;

use crate::cli::{self, AdminArgs, CommonArgs, NodeArgs, RescanArgs};
use crate::daemon::{Daemon, Error};
use crate::device_plugin::service::DevicePlugin;
use crate::device_plugin::settings_source::{self, KubeletArgs, PluginArgs};
use crate::health::args::HealthArgs;
use crate::health::service::HealthWatcher;
use crate::nvml::Rescanner;

/// Advertise the node's GPUs to the kubelet (Device Plugin API v1beta1), as NVIDIA's
/// k8s-device-plugin does, with the same config file, flags and environment. SIGHUP re-reads
/// the config file; a bad one keeps the running settings.
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

    #[command(flatten)]
    rescan: RescanArgs,

    #[command(flatten)]
    health: HealthArgs,

    #[command(flatten)]
    admin: AdminArgs,
}

/// Entry point.
pub fn main(argv: Vec<OsString>) -> Result<ExitCode, Error> {
    let args: Args = cli::parse(argv)?;
    let (health, _) = args.health.resolve("device-plugin")?;
    let settings = settings_source::load_at_start(&args.plugin)?;
    let nvml = args.common.start()?;
    let rescanner = Rescanner::new(nvml.clone(), args.node.facts(), args.rescan.interval());
    let inventory = rescanner.discover()?;
    crate::mps::check_at_start(&settings, &inventory.current())?;

    let plugin = args.plugin.clone();
    let mut daemon = Daemon::new("device-plugin", settings, move || {
        settings_source::reload(&plugin)
    });
    daemon.reload_on_change(args.admin.watched(&[args.plugin.config_file.as_deref()]));
    daemon.add_support(rescanner);
    daemon.add_support(HealthWatcher::optional(nvml, health));
    daemon.add(DevicePlugin::new(args.kubelet.manager_config()), Arc::clone);
    daemon.serve_admin(&args.admin.address(super::admin_port("device-plugin")));
    daemon.hand_over(&args.health.state.state_dir);
    daemon.run(inventory)
}
