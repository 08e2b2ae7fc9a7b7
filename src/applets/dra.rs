//! `gpud dra`: the DRA kubelet plugin on its own, with the health watcher and the rescanner
//! in-process, so a standalone container taints sick devices and republishes after MIG
//! changes by itself.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;

use crate::cli::{self, AdminArgs, ApiArgs, CommonArgs, NodeArgs, RescanArgs};
use crate::daemon::{Daemon, Error};
use crate::dra::{Dra, DraArgs, DraConfig};
use crate::health::args::HealthArgs;
use crate::health::service::HealthWatcher;
use crate::holdings;
use crate::holdings::layout::{self, Owner, TakeError};
use crate::mps::MpsArgs;
use crate::nvml::Rescanner;
use crate::nvml::mig_admin::MigGpu;

/// Be the kubelet's Dynamic Resource Allocation plugin for the node's GPUs and MIG devices
/// (driver gpu.nvidia.com, as NVIDIA's DRA driver names them): publish ResourceSlices,
/// prepare and unprepare claims with CDI specs (and an MPS control daemon per claim whose
/// GpuConfig asks for MPS), taint sick devices and clear the taints on recovery.
///
/// Needs the node name (NODE_NAME) and API access: get on resourceclaims; update/patch on
/// resourceclaims/status (and from 1.36 associated-node:update/patch on resourceclaims/driver);
/// list/watch on devicetaintrules;
/// get/list/watch/create/update/delete on resourceslices; create on events.
#[derive(Debug, Parser)]
#[command(name = "gpud dra", version)]
struct Args {
    #[command(flatten)]
    common: CommonArgs,

    #[command(flatten)]
    node: NodeArgs,

    #[command(flatten)]
    api: ApiArgs,

    #[command(flatten)]
    dra: DraArgs,

    /// The control binary, shm mount and probe interval of claims' MPS control daemons.
    #[command(flatten)]
    mps: MpsArgs,

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
    super::set_pace(&args.api.client);
    let (health, _) = args.health.resolve("dra")?;
    let node =
        super::node_status::node_name(args.node.name.node_name.as_deref(), "the DRA plugin")?;
    let mut config = args
        .dra
        .config(
            node,
            args.api.client.kubeconfig.clone(),
            args.api.api_unready_after,
            args.mps.launch(),
        )?
        .with_state_dir(&args.health.state.state_dir);
    let nvml = args.common.start()?;
    if config.dynamic_mig {
        let gpus = nvml.mig_admin().gpus()?;
        take_layouts(&args.health.state.state_dir, &mut config, &gpus)?;
    }
    let rescanner = Rescanner::new(nvml.clone(), args.node.facts(), args.rescan.interval());
    let inventory = rescanner.discover()?;
    let mut daemon = Daemon::fixed("dra");
    daemon.add_support(rescanner.clone());
    daemon.add_support(HealthWatcher::optional(nvml.clone(), health));
    let (held, _) = holdings::channel();
    daemon.add_fixed(Dra::new(config, held, nvml).with_rescanner(rescanner));
    daemon.serve_admin(&args.admin.address(super::admin_port("dra")));
    daemon.hand_over(&args.health.state.state_dir);
    daemon.run(inventory)
}

/// Takes the MIG-capable GPUs of `gpus` as DRA dynamic MIG's in the layout owners' record of
/// `state_dir` (refused, exit 64, while the MIG manager runs with one of them), with the
/// checkpoint whose claims are their layout; the plugin then locks its changes there.
pub(super) fn take_layouts(
    state_dir: &str,
    config: &mut DraConfig,
    gpus: &[MigGpu],
) -> Result<(), Error> {
    if !config.dynamic_mig || state_dir.is_empty() {
        return Ok(());
    }
    let dir = PathBuf::from(state_dir);
    let checkpoint = config.checkpoint();
    layout::take(
        &dir,
        Owner::DraDynamicMig,
        &layout::mig_capable(gpus),
        Some(&checkpoint),
    )
    .map_err(TakeError::into_error)?;
    config.layout_dir = Some(dir);
    Ok(())
}
