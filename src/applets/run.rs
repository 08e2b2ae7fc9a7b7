//! `gpud run`: every subsystem in one process over one inventory — for systemd on bare metal
//! and single-container deployments.
//!
//! With MPS sharing in NVIDIA's config, the MPS control daemons run here too.
//!
//! One discovery, one health watcher and one rescanner feed the device plugin, the labeller
//! and the exporter: an XID withdraws the GPU from the kubelet, flips the health labels and
//! shows in `/metrics` from the same event. Each subsystem keeps its standalone applet's flags
//! and environment, so a DaemonSet's arguments carry over; the supervisor is the same one every
//! applet uses, with every subsystem added.

use std::ffi::OsString;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{Parser, ValueEnum};

use crate::cli::{self, AdminArgs, ApiArgs, CommonArgs, RescanArgs};
use crate::daemon::{Daemon, Error};
use crate::device_plugin::service::DevicePlugin;
use crate::device_plugin::settings_source::{self, KubeletArgs, PluginArgs};
use crate::doctor::service::{self as doctor_service, PeriodicDoctor};
use crate::doctor_report::LatestReport;
use crate::dra::{Dra, DraArgs, DraConfig};
use crate::exporter::args::ExporterArgs;
use crate::health::args::HealthArgs;
use crate::health::service::HealthWatcher;
use crate::holdings::layout;
use crate::holdings::{self, HeldSource};
use crate::labeller::Settings as LabellerSettings;
use crate::labeller::args::{LabellerArgs, Sink};
use crate::mig::reconcile::args::ReconcileArgs;
use crate::mig::reconcile::service::Reconciler;
use crate::mps::{self, MpsArgs, MpsControl};
use crate::node_status::{NodeStatus, NodeStatusArgs};
use crate::nvml::{NodeFacts, Nvml, Rescanner};
use crate::remediation::{Remediation, RemediationArgs};
use crate::resources::extended::{self, Owner};
use crate::resources::settings::Settings as PluginSettings;

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
    /// label, the node status, DRA, the MIG reconciler).
    #[command(flatten)]
    node: cli::NodeNameArgs,

    /// Subsystems not to start (comma-separated); the health watcher always runs.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        value_name = "SUBSYSTEMS",
        env = "GPUD_DISABLE"
    )]
    disable: Vec<Optional>,

    #[command(flatten)]
    rescan: RescanArgs,

    /// API access for the labeller's API sinks, the node status, the DRA plugin, the MPS
    /// daemons' Node events and the MIG reconciler.
    #[command(flatten)]
    api: ApiArgs,

    #[command(flatten)]
    health: HealthArgs,

    /// How often `gpud doctor`'s checks run inside the daemon (latest report at /doctor on
    /// the admin endpoint); 0 turns them off.
    #[arg(long, value_name = "DURATION", env = "GPUD_DOCTOR_INTERVAL", default_value = "5m",
          value_parser = humantime::parse_duration)]
    doctor_interval: Duration,

    /// Where the host's root is mounted, for the doctor's checks.
    #[command(flatten)]
    host: cli::HostRootArgs,

    #[command(flatten)]
    plugin: PluginArgs,

    #[command(flatten)]
    kubelet: KubeletArgs,

    /// The MPS control daemons, started when NVIDIA's config shares with MPS.
    #[command(flatten)]
    mps: MpsArgs,

    #[command(flatten)]
    labeller: LabellerArgs,

    #[command(flatten)]
    exporter: ExporterArgs,

    /// The MIG reconciler, off unless --mig-config-file is given.
    #[command(flatten)]
    mig: ReconcileArgs,
    /// Keep the GPUs' health and the doctor's verdict on this node's Node object (conditions,
    /// events, optional taints; see `gpud node-status --help`). Needs the node name and API
    /// access (--kubeconfig or the in-cluster service account).
    #[arg(long, env = "GPUD_NODE_STATUS")]
    node_status: bool,

    #[command(flatten)]
    status: NodeStatusArgs,

    /// Also be the kubelet's DRA plugin for the GPUs (see `gpud dra --help`); the device
    /// plugin then withdraws every GPU a claim holds. Needs the node name and API access.
    #[arg(long, env = "GPUD_DRA")]
    dra: bool,

    #[command(flatten)]
    dra_args: DraArgs,

    /// With --dra and the device plugin both on: which path offers the extended resources both
    /// could (nvidia.com/gpu, nvidia.com/mig-<profile>, which gpud's DeviceClasses serve
    /// through DRA as extendedResourceName). `device-plugin`: it keeps advertising them, DRA
    /// serves ResourceClaims only; `dra`: the device plugin leaves them out and pods asking
    /// for them are served through DRA. Unset, a name both would offer is a usage error.
    #[arg(
        long,
        value_enum,
        value_name = "PATH",
        env = "GPUD_EXTENDED_RESOURCE_OWNER"
    )]
    extended_resource_owner: Option<Owner>,

    /// Self-healing GPUs: drain, reset, verify and give back a GPU that needs a reset, or
    /// escalate on the Node (see docs/remediation.md). Off unless asked for.
    #[command(flatten)]
    remediation: RemediationArgs,

    /// Where /healthz and /readyz are served when the exporter is disabled (with it they are
    /// on the metrics port).
    #[command(flatten)]
    admin: AdminArgs,
}

/// The subsystems `--disable` can leave out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Optional {
    /// The kubelet device plugin.
    DevicePlugin,
    /// The node labeller.
    Labeller,
    /// The Prometheus exporter.
    Exporter,
}

/// What SIGHUP re-reads: NVIDIA's config file, as the device plugin and as GFD see it.
#[derive(Debug)]
struct Reloadable {
    plugin: Arc<PluginSettings>,
    labeller: Arc<LabellerSettings>,
}

/// Gives each GPU's MIG layout its one owner: a MIG config and dynamic MIG that would both own
/// a GPU are a usage error (64) naming it; otherwise each takes its GPUs in the layout owners'
/// record (refused the same way while another process owns one of them).
fn take_layouts(
    args: &Args,
    reconciler: Option<&mut Reconciler>,
    dra: Option<&mut DraConfig>,
    nvml: &Nvml,
) -> Result<(), Error> {
    let dra = dra.filter(|d| d.dynamic_mig);
    if reconciler.is_none() && dra.is_none() {
        return Ok(());
    }
    let gpus = nvml.mig_admin().gpus()?;
    let state_dir = &args.health.state.state_dir;
    if let (Some(config_file), Some(_)) = (&args.mig.config.mig_config_file, &dra) {
        let spec = crate::mig_config::load(config_file).map_err(Error::config)?;
        let covered = crate::mig_config::select::covered(&spec, &gpus);
        layout::check_flags(&covered, &layout::mig_capable(&gpus))
            .map_err(|conflict| Error::Usage(conflict.to_string()))?;
    }
    if let (Some(reconciler), Some(config_file)) = (reconciler, &args.mig.config.mig_config_file) {
        reconciler.layout_dir = super::mig::take_layouts(state_dir, config_file, &gpus)?;
    }
    if let Some(dra) = dra {
        super::dra::take_layouts(state_dir, dra, &gpus)?;
    }
    Ok(())
}

/// A node offers each extended resource one way only: with the DRA plugin and the device
/// plugin both on and no `--extended-resource-owner`, a name the device plugin would advertise
/// that a DeviceClass serves through DRA is a usage error (64) naming it and both paths.
/// Returns whether the device plugin leaves such names to DRA — also when nobody said and none
/// clashes now, so one a later MIG layout brings is never offered both ways either.
fn one_path_per_name(
    args: &Args,
    dra: bool,
    plugin: &PluginSettings,
    snapshot: &crate::inventory::Snapshot,
) -> Result<bool, Error> {
    if !dra || args.disable.contains(&Optional::DevicePlugin) {
        return Ok(false);
    }
    match args.extended_resource_owner {
        Some(owner) => Ok(owner == Owner::Dra),
        None => {
            // A node the settings cannot express offers nothing (the device plugin says why).
            let offered = crate::resources::resources(snapshot, plugin).unwrap_or_default();
            extended::both_ways(offered.iter().map(|r| r.name.as_str()))
                .map_err(|clash| Error::Usage(clash.to_string()))?;
            Ok(true)
        }
    }
}

/// Entry point.
pub fn main(argv: Vec<OsString>) -> Result<ExitCode, Error> {
    let args: Args = cli::parse(argv)?;
    super::set_pace(&args.api.client);
    let enabled = |subsystem| !args.disable.contains(&subsystem);
    // Everything that reads a file or a flag is checked before NVML is opened, so a bad
    // config exits with its reason and nothing half-started.
    let (health, _) = args.health.resolve("run")?;
    let plugin = settings_source::load_at_start(&args.plugin)?;
    let config_file = args.plugin.config_file.as_deref();
    let (gfd, sink, labeller) = if enabled(Optional::Labeller) {
        args.labeller.resolve_at_start(
            config_file,
            &args.plugin.shared,
            args.node.node_name.as_deref(),
        )?
    } else {
        let config = args
            .labeller
            .config(config_file, &args.plugin.shared)
            .map_err(Error::config)?;
        let sink = Sink::File;
        let settings = args.labeller.settings(&config, sink);
        (config, sink, settings)
    };
    let node_status = args
        .node_status
        .then(|| super::node_status::node_name(args.node.node_name.as_deref(), "--node-status"))
        .transpose()?;
    let mut dra = match args.dra {
        true => {
            let node = super::node_status::node_name(args.node.node_name.as_deref(), "--dra")?;
            let kubeconfig = args.api.client.kubeconfig.clone();
            let unready_after = args.api.api_unready_after;
            Some(
                args.dra_args
                    .config(node, kubeconfig, unready_after, args.mps.launch())?
                    .with_state_dir(&args.health.state.state_dir),
            )
        }
        false => None,
    };
    let counters = args.exporter.counters()?;
    let usage = args.exporter.usage(
        args.node.node_name.as_deref(),
        args.api.client.kubeconfig.clone(),
    )?;
    args.mig.validate(args.node.node_name.as_deref())?;
    let remediation = args.remediation.resolve(
        args.node.node_name.as_deref(),
        args.api.client.kubeconfig(),
        &args.health.state.state_dir,
    )?;
    let nvml = args.common.start()?;
    let mut exporter = args.exporter.config(&counters, &nvml)?;
    exporter.usage = usage;
    // One process, one driver name: the exporter attributes the claims this plugin prepares.
    if let (Some(dra), Some(pods)) = (&dra, exporter.kubernetes.as_mut()) {
        pods.resources.dra_driver = dra.driver.clone();
    }
    let facts = NodeFacts {
        node_name: args.node.node_name.clone(),
        machine_type_file: gfd.flags.gfd.machine_type_file.clone(),
    };
    let rescanner = Rescanner::new(nvml.clone(), facts, args.rescan.interval());
    let inventory = rescanner.discover()?;
    mps::check_at_start(&plugin, &inventory.current())?;
    let left_to_dra = one_path_per_name(&args, dra.is_some(), &plugin, &inventory.current())?;
    let mps_events = node_status
        .clone()
        .map(|node| (node, args.api.client.kubeconfig.clone()));
    // A damaged kept-verdicts file is said on the Node when gpud run has one.
    let health_events = mps_events.clone();
    let mps = plugin
        .mps_root
        .is_some()
        .then(|| MpsControl::new(nvml.clone(), args.mps.options(mps_events)));
    let mut reconciler = args.mig.reconciler(
        args.node.node_name.as_deref(),
        args.api.client.kubeconfig(),
        args.api.api_unready_after,
        &args.health.state,
        &nvml,
        rescanner.clone(),
    )?;
    take_layouts(&args, reconciler.as_mut(), dra.as_mut(), &nvml)?;
    // The exporter reports the reconciler's applies and state, and the remediation's.
    exporter.mig = reconciler.as_ref().map(|r| r.metrics.clone());
    let remediation = remediation.map(|mut settings| {
        // One process, one driver name: the claims this plugin prepares hold GPUs.
        if let Some(dra) = &dra {
            settings.dra_driver = dra.driver.clone();
        }
        Remediation::new(settings, nvml.clone()).with_rescanner(rescanner.clone())
    });
    exporter.remediation = remediation.as_ref().map(Remediation::metrics);

    let initial = Reloadable {
        plugin: Arc::new(plugin),
        labeller: Arc::new(labeller),
    };
    let (plugin_args, labeller_args) = (args.plugin.clone(), args.labeller.clone());
    let mut daemon = Daemon::new("run", initial, move || {
        let config_file = plugin_args.config_file.as_deref();
        Ok(Reloadable {
            plugin: Arc::new(settings_source::reload(&plugin_args)?),
            labeller: Arc::new(labeller_args.reload(config_file, &plugin_args.shared, sink)?),
        })
    });
    daemon.reload_on_change(args.admin.watched(&[args.plugin.config_file.as_deref()]));
    daemon.add_support(rescanner.clone());
    let mut status = node_status.map(|node| {
        NodeStatus::new(
            node,
            args.api.client.kubeconfig.clone(),
            args.status.settings(),
        )
        .with_unready_after(args.api.api_unready_after)
    });
    if !args.doctor_interval.is_zero() {
        let latest = LatestReport::default();
        status = status.map(|s| s.with_doctor(latest.clone()));
        daemon.add_admin_routes(doctor_service::routes(&latest));
        let options = crate::doctor::Options {
            host_root: args.host.host_root.clone(),
            kmsg: args
                .health
                .kmsg
                .as_deref()
                .filter(|k| !k.is_empty())
                .map(Into::into),
            gpud_config: args.health.gpud_config.config.clone(),
            nvidia_config: args.plugin.config_file.clone(),
            mig_config: args.mig.config.mig_config_file.clone(),
            mig_state_dir: args.mig.state_dir(&args.health.state),
            ..crate::doctor::Options::default()
        };
        daemon.add_support(PeriodicDoctor::new(
            nvml.clone(),
            options,
            args.doctor_interval,
            latest,
        ));
    }
    if enabled(Optional::Exporter) {
        let (watcher, exporter) =
            super::exporter::with_health(nvml.clone(), health, exporter, daemon.admin_routes());
        daemon.add_support(watcher.with_node_events(health_events));
        daemon.add_fixed(exporter);
    } else {
        daemon.add_support(
            HealthWatcher::optional(nvml.clone(), health).with_node_events(health_events),
        );
        daemon.serve_admin(&args.admin.address(super::admin_port("run")));
    }
    if let Some(mps) = mps {
        daemon.add(mps, |config: &Arc<Reloadable>| Arc::clone(&config.plugin));
    }
    let (held, claimed) = holdings::channel();
    if enabled(Optional::DevicePlugin) {
        let mut manager = args.kubelet.manager_config();
        if dra.is_some() {
            manager.held = Some(HeldSource::Shared(claimed));
        }
        manager.left_to_dra = left_to_dra;
        daemon.add(DevicePlugin::new(manager), |config: &Arc<Reloadable>| {
            Arc::clone(&config.plugin)
        });
    }
    if enabled(Optional::Labeller) {
        daemon.add(
            args.labeller.subsystem(
                sink,
                args.node.node_name.clone(),
                args.api.client.kubeconfig.clone(),
            ),
            |config: &Arc<Reloadable>| Arc::clone(&config.labeller),
        );
    }
    if let Some(reconciler) = reconciler {
        daemon.add_fixed(reconciler);
    }
    if let Some(status) = status {
        daemon.add_fixed(status);
    }
    if let Some(config) = dra {
        daemon.add_fixed(Dra::new(config, held, nvml.clone()).with_rescanner(rescanner));
    }
    if let Some(remediation) = remediation {
        daemon.add_fixed(remediation);
    }
    daemon.hand_over(&args.health.state.state_dir);
    daemon.run(inventory)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_takes_the_shared_node_name_and_keeps_mig_state_under_its_state_dir() {
        let args = Args::try_parse_from([
            "gpud run",
            "--node-name",
            "n1",
            "--state-dir",
            "/srv/gpud",
            "--host-root",
            "/host",
        ])
        .unwrap();
        assert_eq!(args.node.get(), Some("n1"));
        assert_eq!(
            args.mig.state_dir(&args.health.state),
            std::path::Path::new("/srv/gpud/mig")
        );
        assert_eq!(args.host.host_root, std::path::Path::new("/host"));
    }
}
