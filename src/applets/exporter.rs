//! `gpud exporter`: dcgm-exporter-compatible Prometheus metrics, with pod attribution and
//! live GPU health.
//!
//! Flags and environment variables are dcgm-exporter's where it has them, so a DaemonSet can
//! switch images without changing its arguments. The health watcher runs in the same process:
//! `gpud_gpu_health` is live and XIDs are counted from the same events and kernel-log lines.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use clap::builder::FalseyValueParser;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::cli::{self, CommonArgs, HealthArgs, NodeArgs};
use crate::exit;
use crate::exporter::counters::{self, DEFAULT_COUNTERS, DEFAULT_COUNTERS_NAME};
use crate::exporter::podresources::{DEFAULT_SOCKET, PodResourcesConfig};
use crate::exporter::pods::ResourceFilter;
use crate::exporter::render::LabelOptions;
use crate::exporter::{self, ExporterConfig, fields};
use crate::health::watcher::{self, WatcherConfig};
use crate::inventory::Inventory;
use crate::nvml::Nvml;

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

    /// How often the node is rescanned for GPUs and MIG instances that appeared or vanished.
    #[arg(long, value_name = "DURATION", env = "GPUD_RESCAN_INTERVAL", default_value = "30s",
          value_parser = cli::positive_duration)]
    rescan_interval: Duration,

    #[command(flatten)]
    health: HealthArgs,
}

/// The exporter's own options (dcgm-exporter's flags and environment), shared with `gpud run`.
#[derive(Debug, Clone, clap::Args)]
pub(super) struct ExporterArgs {
    /// Address to listen on, [HOST]:PORT.
    #[arg(short = 'a', long, value_name = "ADDRESS", env = "DCGM_EXPORTER_LISTEN",
          default_value = exporter::DEFAULT_ADDRESS)]
    address: String,

    /// Counters file in dcgm-exporter's CSV format [default: dcgm-exporter's default counters].
    #[arg(
        short = 'f',
        long,
        value_name = "FILE",
        env = "DCGM_EXPORTER_COLLECTORS"
    )]
    collectors: Option<PathBuf>,

    /// Milliseconds between two NVML samples (at least 100).
    #[arg(
        short = 'c',
        long,
        value_name = "MS",
        env = "DCGM_EXPORTER_INTERVAL",
        default_value_t = 30_000
    )]
    collect_interval: u64,

    /// Attribute GPUs to pods through the kubelet's pod-resources API.
    #[arg(short = 'k', long, env = "DCGM_EXPORTER_KUBERNETES", value_parser = FalseyValueParser::new())]
    kubernetes: bool,

    /// The kubelet's pod-resources socket.
    #[arg(long, value_name = "PATH", env = "DCGM_POD_RESOURCES_KUBELET_SOCKET",
          default_value = DEFAULT_SOCKET)]
    pod_resources_kubelet_socket: PathBuf,

    /// More resource names that are GPUs (comma-separated), e.g. nvidia.com/gpu.shared.
    #[arg(
        long,
        value_name = "NAMES",
        env = "NVIDIA_RESOURCE_NAMES",
        value_delimiter = ','
    )]
    nvidia_resource_names: Vec<String>,

    /// How device IDs are spelled (uid or device-name). Accepted for compatibility: gpud
    /// understands both forms without being told.
    #[arg(long, value_name = "TYPE", env = "DCGM_EXPORTER_KUBERNETES_GPU_ID_TYPE",
          value_parser = ["uid", "device-name"], default_value = "uid")]
    kubernetes_gpu_id_type: String,

    /// Time between two pod-resources List calls.
    #[arg(long, value_name = "DURATION", env = "GPUD_POD_RESOURCES_POLL_INTERVAL",
          default_value = "5s", value_parser = cli::positive_duration)]
    pod_resources_poll_interval: Duration,

    /// Leave out the host label.
    #[arg(short = 'n', long, env = "DCGM_EXPORTER_NO_HOSTNAME", value_parser = FalseyValueParser::new())]
    no_hostname: bool,

    /// Name of the host label: Hostname (dcgm-exporter up to 4.5) or hostname (later).
    #[arg(long, value_name = "NAME", env = "GPUD_HOSTNAME_LABEL",
          value_parser = ["Hostname", "hostname"], default_value = "Hostname")]
    hostname_label: String,

    /// Replace spaces in the modelName label with dashes.
    #[arg(long, env = "DCGM_EXPORTER_REPLACE_BLANKS_IN_MODEL_NAME", value_parser = FalseyValueParser::new())]
    replace_blanks_in_model_name: bool,

    /// Milliseconds of XID history DCGM_EXP_XID_ERRORS_COUNT counts.
    #[arg(
        short = 'x',
        long,
        value_name = "MS",
        env = "DCGM_EXPORTER_XID_COUNT_WINDOW_SIZE",
        default_value_t = 300_000
    )]
    xid_count_window_size: u64,

    #[command(flatten)]
    http: crate::http::HttpArgs,
}

/// The counters file, read and checked before NVML is opened.
pub(super) struct Counters {
    source: PathBuf,
    rows: Vec<counters::CounterRow>,
}

impl ExporterArgs {
    /// Reads the counters file and checks the listen address: what can fail before NVML is
    /// opened (exit 65 for a bad file, 64 for a bad address).
    pub(super) fn counters(&self) -> Result<Counters, ExitCode> {
        let source = self
            .collectors
            .clone()
            .unwrap_or_else(|| PathBuf::from(DEFAULT_COUNTERS_NAME));
        let rows = match &self.collectors {
            Some(path) => counters::load(path),
            None => counters::parse(Path::new(DEFAULT_COUNTERS_NAME), DEFAULT_COUNTERS),
        }
        .map_err(|err| {
            eprintln!("gpud: {err}");
            ExitCode::from(exit::DATA)
        })?;
        if let Err(err) = crate::http::parse_address(&self.address) {
            eprintln!("gpud: {err}");
            return Err(ExitCode::from(exit::USAGE));
        }
        Ok(Counters { source, rows })
    }

    /// The exporter's configuration once NVML says which fields it can give (GPM or not);
    /// the fields it cannot are logged once.
    pub(super) fn config(
        &self,
        counters: &Counters,
        nvml: &Nvml,
    ) -> Result<ExporterConfig, ExitCode> {
        let gpm_available = nvml.gpm_support().iter().any(|(_, supported)| *supported);
        let selection =
            fields::select(&counters.source, &counters.rows, gpm_available).map_err(|err| {
                eprintln!("gpud: {err}");
                ExitCode::from(exit::DATA)
            })?;
        for skipped in &selection.skipped {
            info!(
                line = skipped.line,
                "Skipping {}: {}", skipped.field, skipped.reason
            );
        }
        Ok(self.with_selection(selection))
    }
}

/// Entry point.
pub fn main(argv: Vec<OsString>) -> ExitCode {
    let args: Args = match cli::parse(argv) {
        Ok(args) => args,
        Err(code) => return code,
    };
    let (watcher, _) = match args.health.resolve() {
        Ok(resolved) => resolved,
        Err(code) => return code,
    };
    let counters = match args.exporter.counters() {
        Ok(counters) => counters,
        Err(code) => return code,
    };
    let nvml = match args.common.start() {
        Ok(nvml) => nvml,
        Err(code) => return code,
    };
    let config = match args.exporter.config(&counters, &nvml) {
        Ok(config) => config,
        Err(code) => return code,
    };
    let inventory = match Inventory::discover(nvml.clone(), args.node.facts()) {
        Ok(inventory) => inventory,
        Err(err) => return cli::fail_nvml(&err),
    };
    match cli::runtime(2) {
        Ok(runtime) => runtime.block_on(serve(
            nvml,
            inventory,
            config,
            watcher,
            args.rescan_interval,
        )),
        Err(code) => code,
    }
}

impl ExporterArgs {
    /// The configuration for a field selection; a collect interval below the minimum is
    /// raised to it with a warning (dcgm-exporter's unit is milliseconds, easy to get wrong).
    fn with_selection(&self, selection: fields::Selection) -> ExporterConfig {
        let mut interval = Duration::from_millis(self.collect_interval);
        if interval < exporter::MIN_COLLECT_INTERVAL {
            warn!(
                requested_ms = self.collect_interval,
                "The collect interval is in milliseconds; {} ms is below the minimum, using {} ms",
                self.collect_interval,
                exporter::MIN_COLLECT_INTERVAL.as_millis()
            );
            interval = exporter::MIN_COLLECT_INTERVAL;
        }
        ExporterConfig {
            address: self.address.clone(),
            selection,
            collect_interval: interval,
            labels: LabelOptions {
                hostname_label: (!self.no_hostname).then(|| self.hostname_label.clone()),
                replace_blanks_in_model_name: self.replace_blanks_in_model_name,
            },
            kubernetes: self.kubernetes.then(|| PodResourcesConfig {
                socket: self.pod_resources_kubelet_socket.clone(),
                resources: ResourceFilter {
                    extra: self
                        .nvidia_resource_names
                        .iter()
                        .map(|s| s.trim().to_owned())
                        .filter(|s| !s.is_empty())
                        .collect(),
                },
                poll_interval: self.pod_resources_poll_interval,
            }),
            xid_window: Duration::from_millis(self.xid_count_window_size),
            http: self.http.limits(),
        }
    }
}

/// Queue between the health watcher and the exporter's XID record.
const XID_QUEUE: usize = 1024;

async fn serve(
    nvml: crate::nvml::Nvml,
    inventory: Inventory,
    config: ExporterConfig,
    watcher_config: WatcherConfig,
    rescan_every: Duration,
) -> ExitCode {
    let cancel = CancellationToken::new();
    // New GPUs and MIG instances get series, vanished ones lose theirs: the sampler reads the
    // devices the inventory lists on every cycle and the renderer redraws on every change.
    let rescanner = tokio::spawn({
        let cancel = cancel.clone();
        let inventory = inventory.clone();
        async move { inventory.rescan_periodically(cancel, rescan_every).await }
    });
    let (xid_tx, xid_rx) = mpsc::channel(XID_QUEUE);
    let health = tokio::spawn({
        let cancel = cancel.clone();
        let nvml = nvml.clone();
        let inventory = inventory.clone();
        async move {
            if let Err(err) =
                watcher::run_with_xids(cancel, nvml, inventory, watcher_config, Some(xid_tx)).await
            {
                warn!(error = %err, "Health watching is off: gpud_gpu_health shows discovery's view only");
            }
        }
    });
    let (probes, on_ready) = crate::http::probes::probes();
    let exporter = tokio::spawn(exporter::run(
        cancel.clone(),
        nvml,
        inventory,
        config,
        Some(xid_rx),
        probes,
        on_ready,
    ));
    let stop = crate::signals::shutdown();
    tokio::pin!(stop);
    let code = tokio::select! {
        () = &mut stop => ExitCode::SUCCESS,
        result = exporter => match result {
            Ok(Ok(())) => ExitCode::SUCCESS,
            Ok(Err(err)) => {
                eprintln!("gpud: {err}");
                ExitCode::from(exit::FAILURE)
            }
            Err(err) => {
                eprintln!("gpud: exporter task failed: {err}");
                ExitCode::from(exit::FAILURE)
            }
        },
    };
    cancel.cancel();
    let _ = health.await;
    let _ = rescanner.await;
    info!("Exporter stopped");
    code
}
