//! `gpud mps-control-daemon`: the MPS control daemons alone, for a node that runs the device
//! plugin as its own applet (`gpud run` includes them whenever the config asks for MPS).

use std::ffi::OsString;
use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser;

use crate::cli::{self, AdminArgs, ApiArgs, CommonArgs, NodeArgs, RescanArgs};
use crate::daemon::{Daemon, Error};
use crate::device_plugin::settings_source::{self, PluginArgs};
use crate::mps::{self, MpsArgs, MpsControl};
use crate::nvml::Rescanner;

/// Run one MPS control daemon per MPS-shared resource of NVIDIA's config (`sharing.mps`, with
/// `mpsRoot`), as NVIDIA's mps-control-daemon does: compute mode EXCLUSIVE_PROCESS, the
/// `mpsRoot` layout, the default limits, restarts of a daemon that dies, and the GPUs given
/// back (`quit`, compute mode DEFAULT) on stop. SIGHUP re-reads the config file.
#[derive(Debug, Parser)]
#[command(name = "gpud mps-control-daemon", version)]
struct Args {
    #[command(flatten)]
    common: CommonArgs,

    #[command(flatten)]
    node: NodeArgs,

    #[command(flatten)]
    plugin: PluginArgs,

    #[command(flatten)]
    mps: MpsArgs,

    /// Record daemon restarts as events on this node's Node object (needs the node name and
    /// API access: --kubeconfig or the in-cluster service account).
    #[arg(long, env = "GPUD_MPS_NODE_EVENTS")]
    node_events: bool,

    /// API access for the Node events.
    #[command(flatten)]
    api: ApiArgs,

    #[command(flatten)]
    rescan: RescanArgs,

    #[command(flatten)]
    admin: AdminArgs,

    #[command(flatten)]
    state: cli::StateArgs,
}

/// Entry point.
pub fn main(argv: Vec<OsString>) -> Result<ExitCode, Error> {
    let args: Args = cli::parse(argv)?;
    super::set_pace(&args.api.client);
    let settings = settings_source::load_at_start(&args.plugin)?;
    if settings.mps_root.is_none() {
        return Err(Error::config(
            "the config asks for no MPS sharing (sharing.mps with replicas > 1); nothing to run",
        ));
    }
    let events = args
        .node_events
        .then(|| {
            super::node_status::node_name(args.node.name.node_name.as_deref(), "--node-events")
        })
        .transpose()?
        .map(|node| (node, args.api.client.kubeconfig.clone()));
    let nvml = args.common.start()?;
    let rescanner = Rescanner::new(nvml.clone(), args.node.facts(), args.rescan.interval());
    let inventory = rescanner.discover()?;
    mps::check_at_start(&settings, &inventory.current())?;

    let plugin = args.plugin.clone();
    let mut daemon = Daemon::new("mps-control-daemon", settings, move || {
        settings_source::reload(&plugin)
    });
    daemon.reload_on_change(args.admin.watched(&[args.plugin.config_file.as_deref()]));
    daemon.add_support(rescanner);
    daemon.add(MpsControl::new(nvml, args.mps.options(events)), Arc::clone);
    daemon.serve_admin(&args.admin.address(super::admin_port("mps-control-daemon")));
    daemon.hand_over(&args.state.state_dir);
    daemon.run(inventory)
}
