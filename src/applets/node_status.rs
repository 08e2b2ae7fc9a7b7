//! `gpud node-status`: the health watcher and the node status on their own — the GPUs' health
//! as conditions, events and optional taints on this node's Node object.

use std::ffi::OsString;
use std::process::ExitCode;

use clap::Parser;

use crate::cli::DEFAULT_RESCAN_INTERVAL;
use crate::cli::{self, AdminArgs, ApiArgs, CommonArgs, NodeArgs};
use crate::daemon::{Daemon, Error};
use crate::health::args::HealthArgs;
use crate::health::service::HealthWatcher;
use crate::node_status::{NodeStatus, NodeStatusArgs};
use crate::nvml::Rescanner;
use crate::remediation::{Remediation, RemediationArgs};

/// Keep the GPUs' health on this node's Node object: the GPUHealthy condition, an event per
/// health transition, and (when configured) taints that are removed when the GPUs recover.
///
/// Needs the node name (NODE_NAME) and API access: get on nodes, patch on nodes/status,
/// create on events, and patch on nodes only when a taint is configured. The doctor's
/// GPUStackValidated condition comes from `gpud run --node-status`, where the doctor runs.
#[derive(Debug, Parser)]
#[command(name = "gpud node-status", version)]
struct Args {
    #[command(flatten)]
    common: CommonArgs,

    #[command(flatten)]
    node: NodeArgs,

    #[command(flatten)]
    api: ApiArgs,

    #[command(flatten)]
    status: NodeStatusArgs,

    #[command(flatten)]
    health: HealthArgs,

    /// Self-healing GPUs (see docs/remediation.md): in a DaemonSet, this container is the one
    /// remediation of the node.
    #[command(flatten)]
    remediation: RemediationArgs,

    #[command(flatten)]
    admin: AdminArgs,
}

/// The node name the node status needs, or the usage error naming where it comes from.
pub fn node_name(name: Option<&str>, what: &str) -> Result<String, Error> {
    name.filter(|n| !n.is_empty())
        .map(str::to_owned)
        .ok_or_else(|| {
            Error::Usage(format!(
                "{what} needs the node name (--node-name or NODE_NAME)"
            ))
        })
}

/// Entry point.
pub fn main(argv: Vec<OsString>) -> Result<ExitCode, Error> {
    let args: Args = cli::parse(argv)?;
    super::set_pace(&args.api.client);
    let (health, _) = args.health.resolve("node-status")?;
    let node = node_name(args.node.name.node_name.as_deref(), "the node status")?;
    let remediation = args.remediation.resolve(
        Some(&node),
        args.api.client.kubeconfig(),
        &args.health.state.state_dir,
    )?;
    let nvml = args.common.start()?;
    let inventory = nvml.inventory(&args.node.facts())?;
    let mut daemon = Daemon::fixed("node-status");
    if let Some(settings) = remediation {
        // No periodic rescans here: one after a GPU's MIG layout is made again.
        let rescanner = Rescanner::new(nvml.clone(), args.node.facts(), DEFAULT_RESCAN_INTERVAL);
        daemon.add_fixed(Remediation::new(settings, nvml.clone()).with_rescanner(rescanner));
    }
    daemon.add_support(HealthWatcher::required(nvml, health));
    daemon.add_fixed(
        NodeStatus::new(
            node,
            args.api.client.kubeconfig.clone(),
            args.status.settings(),
        )
        .with_unready_after(args.api.api_unready_after),
    );
    daemon.serve_admin(&args.admin.address(super::admin_port("node-status")));
    daemon.hand_over(&args.health.state.state_dir);
    daemon.run(inventory)
}
