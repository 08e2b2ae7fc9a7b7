//! The exporter's command line: dcgm-exporter's flags and environment, checked before NVML is
//! opened and turned into an [`ExporterConfig`] once NVML says which fields it can give.

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::ArgAction;
use clap::builder::FalseyValueParser;
use tracing::{info, warn};

use super::counters::{self, DEFAULT_COUNTERS, DEFAULT_COUNTERS_NAME};
use super::podresources::{DEFAULT_SOCKET, PodResourcesConfig};
use super::pods::ResourceFilter;
use super::render::LabelOptions;
use super::{ExporterConfig, fields};
use crate::daemon::Error;
use crate::nvml::Nvml;

/// The exporter's own options (dcgm-exporter's flags and environment), shared with `gpud run`.
#[derive(Debug, Clone, clap::Args)]
pub struct ExporterArgs {
    /// Address to listen on, [HOST]:PORT.
    #[arg(short = 'a', long, value_name = "ADDRESS", env = "DCGM_EXPORTER_LISTEN",
          default_value = super::DEFAULT_ADDRESS)]
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
    #[arg(short = 'k', long, env = "DCGM_EXPORTER_KUBERNETES", value_name = "BOOL",
          default_value = "false", action = ArgAction::Set, num_args = 0..=1, require_equals = true,
          default_missing_value = "true", value_parser = FalseyValueParser::new())]
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

    /// The DRA driver whose claimed devices (in the pod-resources answer's dynamic resources,
    /// pool = this node) are GPUs and MIG devices. `gpud run --dra` uses --dra-driver-name.
    #[arg(long, value_name = "NAME", env = "GPUD_KUBERNETES_DRA_DRIVER_NAME",
          default_value = super::pods::DRA_DRIVER)]
    kubernetes_dra_driver_name: String,

    /// How device IDs are spelled (uid or device-name). Accepted for compatibility: gpud
    /// understands both forms without being told.
    #[arg(long, value_name = "TYPE", env = "DCGM_EXPORTER_KUBERNETES_GPU_ID_TYPE",
          value_parser = ["uid", "device-name"], default_value = "uid")]
    kubernetes_gpu_id_type: String,

    /// Time between two pod-resources List calls.
    #[arg(long, value_name = "DURATION", env = "GPUD_POD_RESOURCES_POLL_INTERVAL",
          default_value = "5s", value_parser = crate::values::positive_duration)]
    pod_resources_poll_interval: Duration,

    /// Leave out the host label.
    #[arg(short = 'n', long, env = "DCGM_EXPORTER_NO_HOSTNAME", value_name = "BOOL",
          default_value = "false", action = ArgAction::Set, num_args = 0..=1, require_equals = true,
          default_missing_value = "true", value_parser = FalseyValueParser::new())]
    no_hostname: bool,

    /// Name of the host label: Hostname (dcgm-exporter up to 4.5) or hostname (later).
    #[arg(long, value_name = "NAME", env = "GPUD_HOSTNAME_LABEL",
          value_parser = ["Hostname", "hostname"], default_value = "Hostname")]
    hostname_label: String,

    /// Replace spaces in the modelName label with dashes.
    #[arg(long, env = "DCGM_EXPORTER_REPLACE_BLANKS_IN_MODEL_NAME", value_name = "BOOL",
          default_value = "false", action = ArgAction::Set, num_args = 0..=1, require_equals = true,
          default_missing_value = "true", value_parser = FalseyValueParser::new())]
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

    /// Per-pod GPU usage (gpud_container_gpu_*): each container's own GPU memory and share of
    /// the GPU's engines, from NVML's per-process data. Needs the host's /proc
    /// (--pod-usage-proc-root) and this node's pods: the node name and API access to list and
    /// watch them, or the container runtime's socket (--pod-usage-cri-socket).
    #[arg(long, env = "GPUD_POD_USAGE", value_name = "BOOL",
          default_value = "false", action = ArgAction::Set, num_args = 0..=1, require_equals = true,
          default_missing_value = "true", value_parser = FalseyValueParser::new())]
    pod_usage: bool,

    /// The host's /proc, where the process IDs NVML reports are found (in a container a
    /// read-only hostPath of /proc, or hostPID).
    #[arg(
        long,
        value_name = "PATH",
        env = "GPUD_POD_USAGE_PROC_ROOT",
        default_value = "/proc"
    )]
    pod_usage_proc_root: PathBuf,

    /// The container runtime's CRI socket (e.g. /run/containerd/containerd.sock): --pod-usage
    /// names containers from the runtime's pod sandbox and container lists, asked every 5s,
    /// instead of watching this node's pods on the API server.
    #[arg(long, value_name = "PATH", env = "GPUD_POD_USAGE_CRI_SOCKET")]
    pod_usage_cri_socket: Option<PathBuf>,

    #[command(flatten)]
    http: crate::http::HttpArgs,
}

/// The counters file, read and checked before NVML is opened.
#[derive(Debug)]
pub struct Counters {
    source: PathBuf,
    rows: Vec<counters::CounterRow>,
}

impl ExporterArgs {
    /// Reads the counters file and checks the listen address: what can fail before NVML is
    /// opened (exit 65 for a bad file, 64 for a bad address).
    pub fn counters(&self) -> Result<Counters, Error> {
        let source = self
            .collectors
            .clone()
            .unwrap_or_else(|| PathBuf::from(DEFAULT_COUNTERS_NAME));
        let rows = match &self.collectors {
            Some(path) => counters::load(path),
            None => counters::parse(Path::new(DEFAULT_COUNTERS_NAME), DEFAULT_COUNTERS),
        }
        .map_err(Error::config)?;
        // Resolved now as at start (duplicates, unknown names, type mismatches), so
        // `--check-config` refuses what the exporter would refuse; whether the node has GPM
        // only decides what is skipped, never what is an error.
        fields::select(&source, &rows, true).map_err(Error::config)?;
        crate::http::parse_address(&self.address).map_err(|err| Error::Usage(err.to_string()))?;
        Ok(Counters { source, rows })
    }

    /// The exporter's configuration once NVML says which fields it can give (GPM or not);
    /// the fields it cannot are logged once.
    pub fn config(&self, counters: &Counters, nvml: &Nvml) -> Result<ExporterConfig, Error> {
        let gpm_available = nvml.gpm_support().iter().any(|(_, supported)| *supported);
        let selection = fields::select(&counters.source, &counters.rows, gpm_available)
            .map_err(Error::config)?;
        for skipped in &selection.skipped {
            info!(
                line = skipped.line,
                "Skipping {}: {}", skipped.field, skipped.reason
            );
        }
        Ok(self.with_selection(selection))
    }
}

impl ExporterArgs {
    /// Where per-pod usage comes from, when `--pod-usage` asks for it: the host's `/proc`, and
    /// this node's pods from the container runtime's CRI socket when one is given, else from
    /// the API server (`node`, through `kubeconfig` or the in-cluster account).
    pub fn usage(
        &self,
        node: Option<&str>,
        kubeconfig: Option<PathBuf>,
    ) -> Result<Option<super::usage::UsageConfig>, Error> {
        if !self.pod_usage {
            return Ok(None);
        }
        let proc_root = self.pod_usage_proc_root.clone();
        if let Some(socket) = &self.pod_usage_cri_socket {
            return Ok(Some(super::usage::UsageConfig {
                proc_root,
                names: super::usage::PodNames::Runtime {
                    socket: socket.clone(),
                    interval: super::usage::RUNTIME_INTERVAL,
                },
            }));
        }
        let node = node.filter(|n| !n.is_empty()).ok_or_else(|| {
            Error::Usage(
                "--pod-usage names containers from this node's pods: give the node name \
                 (--node-name or NODE_NAME), or the container runtime's socket \
                 (--pod-usage-cri-socket)"
                    .into(),
            )
        })?;
        Ok(Some(super::usage::UsageConfig {
            proc_root,
            names: super::usage::PodNames::Api {
                node: node.to_owned(),
                kubeconfig,
            },
        }))
    }

    /// The configuration for a field selection; a collect interval below the minimum is
    /// raised to it with a warning (dcgm-exporter's unit is milliseconds, easy to get wrong).
    fn with_selection(&self, selection: fields::Selection) -> ExporterConfig {
        let mut interval = Duration::from_millis(self.collect_interval);
        if interval < super::MIN_COLLECT_INTERVAL {
            warn!(
                requested_ms = self.collect_interval,
                "The collect interval is in milliseconds; {} ms is below the minimum, using {} ms",
                self.collect_interval,
                super::MIN_COLLECT_INTERVAL.as_millis()
            );
            interval = super::MIN_COLLECT_INTERVAL;
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
                    dra_driver: self.kubernetes_dra_driver_name.trim().to_owned(),
                },
                poll_interval: self.pod_resources_poll_interval,
            }),
            xid_window: Duration::from_millis(self.xid_count_window_size),
            http: self.http.limits(),
            mig: None,
            remediation: None,
            remediation_record: None,
            usage: None,
        }
    }
}
