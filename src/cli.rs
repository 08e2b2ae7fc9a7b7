//! Command-line pieces shared by every applet: common options, parsing with gpud's exit codes,
//! and the one-line fatal error.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, ValueEnum};

use crate::exit;
use crate::health::watcher::{WatcherConfig, WatcherOverrides};
use crate::nvml::{self, Nvml, NvmlError};
use crate::telemetry::{self, LogFormat};

/// Options every applet that talks to NVML accepts.
#[derive(Debug, Clone, Args)]
pub struct CommonArgs {
    /// NVML library to load instead of searching the usual places.
    #[arg(long, value_name = "PATH", env = nvml::LIB_ENV)]
    pub nvml_lib: Option<PathBuf>,

    /// Log line format on stderr (the level filter is taken from GPUD_LOG, e.g. "debug").
    #[arg(long, value_enum, default_value_t = LogFormat::Text, env = "GPUD_LOG_FORMAT")]
    pub log_format: LogFormat,
}

impl CommonArgs {
    /// Starts logging and opens NVML, printing the one-line reason and returning the exit code
    /// when the driver is unavailable.
    pub fn start(&self) -> Result<Nvml, ExitCode> {
        telemetry::init(self.log_format);
        Nvml::open(self.nvml_lib.as_deref()).map_err(|err| fail_nvml(&err))
    }
}

/// Where node facts outside NVML come from (shared by applets that discover the node).
#[derive(Debug, Clone, Args)]
pub struct NodeArgs {
    /// Node name to report (the Kubernetes node name); the kernel host name when unset.
    #[arg(long, value_name = "NAME", env = "NODE_NAME")]
    pub node_name: Option<String>,

    /// File holding the machine type (DMI product name).
    #[arg(long, value_name = "PATH", env = "GFD_MACHINE_TYPE_FILE",
          default_value = nvml::DEFAULT_MACHINE_TYPE_FILE)]
    pub machine_type_file: PathBuf,
}

impl NodeArgs {
    /// The facts discovery needs.
    pub fn facts(&self) -> nvml::NodeFacts {
        nvml::NodeFacts {
            node_name: self.node_name.clone(),
            machine_type_file: Some(self.machine_type_file.clone()),
        }
    }
}

/// The health watcher's options, shared by every applet that runs it (`health`,
/// `device-plugin`, `exporter`, `run`): flags over gpud's config file over the defaults.
#[derive(Debug, Clone, Args)]
pub struct HealthArgs {
    /// gpud config file (YAML or JSON); its `health` section applies.
    #[arg(long, value_name = "PATH", env = crate::config::CONFIG_ENV)]
    pub config: Option<PathBuf>,

    /// How often counters, temperatures, NVLinks and reachability are polled [default: 5s].
    #[arg(long = "health-poll-interval", visible_alias = "poll-interval", value_name = "DURATION",
          env = "GPUD_HEALTH_POLL_INTERVAL", value_parser = positive_duration)]
    pub poll_interval: Option<std::time::Duration>,

    /// How long a non-fatal XID condition must stay quiet before it clears [default: 10m].
    #[arg(long, value_name = "DURATION", env = "GPUD_XID_QUIET_PERIOD", value_parser = positive_duration)]
    pub xid_quiet_period: Option<std::time::Duration>,

    /// Kernel log to follow for NVRM XID lines; "" disables it [default: /dev/kmsg].
    #[arg(long, value_name = "PATH", env = "GPUD_KMSG_PATH")]
    pub kmsg: Option<String>,
}

impl HealthArgs {
    /// Loads gpud's config file (exit 65 when it is bad) and resolves the watcher's settings,
    /// printing the warnings about malformed XID lists once. Also returns the config file for
    /// the applet's other sections.
    pub fn resolve(&self) -> Result<(WatcherConfig, crate::config::Config), ExitCode> {
        let file = load_config(self.config.as_deref())?;
        let (watcher, warnings) = WatcherConfig::resolve(
            WatcherOverrides {
                poll_interval: self.poll_interval,
                xid_quiet_period: self.xid_quiet_period,
                kmsg: self.kmsg.as_deref(),
            },
            &file.health,
        );
        for warning in warnings {
            eprintln!("gpud: {warning}");
        }
        Ok((watcher, file))
    }
}

/// Parses an applet's arguments; `--help` and `--version` print and exit 0, usage errors print
/// clap's message and exit 64.
pub fn parse<T: Parser>(args: Vec<OsString>) -> Result<T, ExitCode> {
    T::try_parse_from(args).map_err(|err| {
        let code = if err.use_stderr() { exit::USAGE } else { 0 };
        let _ = err.print();
        ExitCode::from(code)
    })
}

/// Reports an NVML failure in one line and gives the exit code.
pub fn fail_nvml(err: &NvmlError) -> ExitCode {
    eprintln!("gpud: {err}");
    ExitCode::from(match err {
        NvmlError::Unavailable { .. } => exit::UNAVAILABLE,
        NvmlError::Call { .. } | NvmlError::Thread { .. } => exit::FAILURE,
    })
}

/// The async runtime of a long-running applet, with `workers` worker threads (NVML calls run
/// on the blocking pool, not on these). Failing to build one is reported and mapped to exit 1.
pub fn runtime(workers: usize) -> Result<tokio::runtime::Runtime, ExitCode> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
        .map_err(|err| {
            eprintln!("gpud: cannot start the runtime: {err}");
            ExitCode::from(exit::FAILURE)
        })
}

/// A clap value parser for durations that must be longer than zero ("5s", "500ms", "10m").
pub fn positive_duration(text: &str) -> Result<std::time::Duration, String> {
    match humantime::parse_duration(text) {
        Ok(d) if !d.is_zero() => Ok(d),
        Ok(_) => Err("must be longer than zero".into()),
        Err(err) => Err(err.to_string()),
    }
}

/// Loads gpud's own config file when one is named; a bad one is reported in one line and
/// mapped to exit 65.
pub fn load_config(path: Option<&std::path::Path>) -> Result<crate::config::Config, ExitCode> {
    match path.map(crate::config::load).transpose() {
        Ok(file) => Ok(file.unwrap_or_default()),
        Err(err) => {
            eprintln!("gpud: {err}");
            Err(ExitCode::from(exit::DATA))
        }
    }
}

/// How an applet prints a document.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OutputFormat {
    /// Stable JSON for machines.
    Json,
    /// Aligned text for people.
    Table,
}
