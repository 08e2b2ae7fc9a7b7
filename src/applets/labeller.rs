//! `gpud labeller`: GFD's labels for this node, written as an NFD features file, printed,
//! patched onto the Node object, or handed to nfd-master in a NodeFeature object; drop-in for
//! gpu-feature-discovery's flags, environment and config file.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use tracing::warn;

use crate::cli::{self, AdminArgs, ApiArgs, CommonArgs, RescanArgs};
use crate::daemon::{Daemon, Error};
use crate::health::args::HealthArgs;
use crate::health::service::HealthWatcher;
use crate::inventory::Inventory;
use crate::labeller::args::LabellerArgs;
use crate::nvidia_config::SharedFlags;
use crate::nvml::{NodeFacts, Nvml, Rescanner};

/// Label the node with GPU features (GFD-compatible): model, memory, count, MIG, sharing,
/// driver and CUDA versions, plus gpud's health summary.
///
/// Precedence for every GFD setting: flag, then environment (GFD_*), then the config file
/// (--config-file, GFD_CONFIG_FILE, CONFIG_FILE), then GFD's default. SIGHUP reloads the
/// config file; a bad one is reported and the previous settings stay.
///
/// A looping labeller rescans the GPUs every --rescan-interval, relabelling as soon as
/// something changed (MIG layout, a GPU lost or back). GPUD_LABELLER_RESCAN_INTERVAL, the
/// labeller's former variable for it, is still read when neither the flag nor
/// GPUD_RESCAN_INTERVAL is given.
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

    /// The Node to label.
    #[command(flatten)]
    node: cli::NodeNameArgs,

    #[command(flatten)]
    labeller: LabellerArgs,

    #[command(flatten)]
    rescan: RescanArgs,

    /// API access for the node and node-feature sinks.
    #[command(flatten)]
    api: ApiArgs,

    #[command(flatten)]
    health: HealthArgs,

    #[command(flatten)]
    admin: AdminArgs,
}

/// Entry point.
pub fn main(argv: Vec<OsString>) -> Result<ExitCode, Error> {
    let args: Args = cli::parse(argv)?;
    super::set_pace(&args.api.client);
    crate::logging::init(args.common.log_format);
    let (health, _) = args.health.resolve("labeller")?;
    let rescan_interval = rescan_interval(&args.rescan)?;
    let (config, sink, settings) = args.labeller.resolve_at_start(
        args.config_file.as_deref(),
        &args.shared,
        args.node.node_name.as_deref(),
    )?;
    args.common.stop_if_checking()?;
    let facts = NodeFacts {
        node_name: args.node.node_name.clone(),
        machine_type_file: config.flags.gfd.machine_type_file.clone(),
    };
    // With failOnInitError false a node without a driver gets the timestamp label only, as
    // GFD does.
    let nvml = match Nvml::open(args.common.nvml_lib.as_deref()) {
        Ok(nvml) => Some(nvml),
        Err(err) if !config.flags.fail_on_init_error => {
            warn!(error = %crate::logging::error_chain(&err), "NVML unavailable; labelling without GPUs (failOnInitError is false)");
            None
        }
        Err(err) => return Err(err.into()),
    };
    let inventory = match &nvml {
        Some(nvml) => nvml.inventory(&facts)?,
        None => Inventory::new(crate::inventory::Snapshot::default()),
    };

    let oneshot = settings.oneshot;
    let health_labels = settings.health_labels;
    let (labeller, config_file, shared) = (
        args.labeller.clone(),
        args.config_file.clone(),
        args.shared.clone(),
    );
    let mut daemon = Daemon::new("labeller", settings, move || {
        labeller.reload(config_file.as_deref(), &shared, sink)
    });
    daemon.reload_on_change(args.admin.watched(&[args.config_file.as_deref()]));
    // A looping labeller keeps the inventory current itself: rescans for MIG changes and lost
    // GPUs, and the health watcher for the gpud.io/gpu.* health labels. A oneshot labels what
    // discovery saw.
    if let Some(nvml) = nvml.filter(|_| !oneshot) {
        daemon.add_support(Rescanner::new(nvml.clone(), facts, rescan_interval));
        if health_labels {
            daemon.add_support(HealthWatcher::optional(nvml, health));
        }
    }
    daemon.add(
        args.labeller.subsystem(
            sink,
            args.node.node_name.clone(),
            args.api.client.kubeconfig.clone(),
        ),
        Arc::clone,
    );
    if !oneshot {
        daemon.serve_admin(&args.admin.address(super::admin_port("labeller")));
    }
    daemon.hand_over(&args.health.state.state_dir);
    daemon.run(inventory)
}

/// The labeller's own variable for the rescan interval from before every daemon shared
/// `GPUD_RESCAN_INTERVAL`. DaemonSets that set it keep their interval.
const LEGACY_RESCAN_ENV: &str = "GPUD_LABELLER_RESCAN_INTERVAL";

/// The rescan interval: the flag or `GPUD_RESCAN_INTERVAL`, else the legacy variable, else the
/// default every daemon shares. A bad legacy value is a usage error, as a bad flag is.
#[allow(clippy::disallowed_methods)] // configuration is resolved here, before NVML is opened
fn rescan_interval(given: &RescanArgs) -> Result<Duration, Error> {
    if let Some(interval) = given.rescan_interval {
        return Ok(interval);
    }
    match std::env::var(LEGACY_RESCAN_ENV) {
        Ok(text) => cli::positive_duration(&text).map_err(|why| {
            Error::Usage(format!(
                "invalid value '{text}' for {LEGACY_RESCAN_ENV}: {why}"
            ))
        }),
        Err(_) => Ok(given.interval()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_node_name_is_the_shared_flag() {
        let args = Args::try_parse_from(["gpud labeller", "--node-name", "n1"]).unwrap();
        assert_eq!(args.node.get(), Some("n1"));
    }
}
