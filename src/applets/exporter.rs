//! `gpud exporter`: dcgm-exporter-compatible Prometheus metrics, with pod attribution and
//! live GPU health.
//!
//! Flags and environment variables are dcgm-exporter's where it has them, so a DaemonSet can
//! switch images without changing its arguments. The health watcher runs in the same process:
//! `gpud_gpu_health` is live and XIDs are counted from the same events and kernel-log lines.

use std::ffi::OsString;
use std::process::ExitCode;

use clap::Parser;

use crate::cli::{self, CommonArgs, KubeClientArgs, NodeArgs, RescanArgs};
use crate::daemon::{Daemon, Error};
use crate::exporter::ExporterConfig;
use crate::exporter::args::ExporterArgs;
use crate::exporter::service::Exporter;
use crate::health::args::HealthArgs;
use crate::health::service::HealthWatcher;
use crate::health::watcher::WatcherConfig;
use crate::nvml::Rescanner;
use crate::xid::ledger::XidLedger;

/// Serve dcgm-exporter-compatible GPU metrics for Prometheus.
///
/// NVML is sampled every collect interval on a background thread and the exposition body is
/// rendered once per sample; /metrics returns the last body without touching the driver or the
/// kubelet. Also serves /health (as dcgm-exporter), /healthz and /readyz.
#[derive(Debug, Parser)]
#[command(name = "gpud exporter", version)]
struct Args {
    #[command(flatten)]
    common: CommonArgs,

    #[command(flatten)]
    node: NodeArgs,

    #[command(flatten)]
    exporter: ExporterArgs,

    /// API access, where --pod-usage reads this node's pods: the same kubeconfig and pace as
    /// every other applet's.
    #[command(flatten)]
    api: KubeClientArgs,

    #[command(flatten)]
    rescan: RescanArgs,

    #[command(flatten)]
    health: HealthArgs,
}

/// Entry point.
pub fn main(argv: Vec<OsString>) -> Result<ExitCode, Error> {
    let args: Args = cli::parse(argv)?;
    super::set_pace(&args.api);
    let (watcher, _) = args.health.resolve("exporter")?;
    let counters = args.exporter.counters()?;
    let usage = args.exporter.usage(
        args.node.name.node_name.as_deref(),
        args.api.kubeconfig.clone(),
    )?;
    let nvml = args.common.start()?;
    let mut config = args.exporter.config(&counters, &nvml)?;
    config.usage = usage;
    config.remediation_record = watcher.remediation_record.clone();
    let rescanner = Rescanner::new(nvml.clone(), args.node.facts(), args.rescan.interval());
    let inventory = rescanner.discover()?;

    let mut daemon = Daemon::fixed("exporter");
    daemon.add_support(rescanner);
    let (watcher, exporter) = with_health(nvml, watcher, config, daemon.admin_routes());
    daemon.add_support(watcher);
    daemon.add_fixed(exporter);
    daemon.hand_over(&args.health.state.state_dir);
    daemon.run(inventory)
}

/// The exporter and the health watcher that feeds its XID counters and `gpud_gpu_health`,
/// wired through the XID ledger (a seam neither owns). The watcher is optional: without NVML
/// events the metrics still flow.
pub(super) fn with_health(
    nvml: crate::nvml::Nvml,
    watcher: WatcherConfig,
    config: ExporterConfig,
    admin: axum::Router,
) -> (HealthWatcher, Exporter) {
    let xids = XidLedger::new(config.xid_window);
    (
        HealthWatcher::optional(nvml.clone(), watcher).with_xids(xids.clone()),
        Exporter::new(nvml, config, xids, admin),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exporter_takes_the_shared_node_name_kubeconfig_and_api_pace() {
        let args = Args::try_parse_from([
            "gpud exporter",
            "--node-name",
            "n1",
            "--kubeconfig",
            "/etc/kubeconfig",
            "--api-qps",
            "2",
            "--api-burst",
            "3",
        ])
        .unwrap();
        assert_eq!(args.node.name.get(), Some("n1"));
        assert_eq!(
            args.api.kubeconfig(),
            Some(std::path::Path::new("/etc/kubeconfig"))
        );
        assert_eq!((args.api.api_qps, args.api.api_burst), (2.0, 3));
    }
}
