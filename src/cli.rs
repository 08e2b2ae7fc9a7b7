//! Command-line pieces shared by every applet: common options and parsing, with failures as
//! the daemon's [`Error`] so each maps to its exit code in one place.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Args, Parser, ValueEnum};

use crate::daemon::Error;
use crate::logging::{self, LogFormat};
use crate::nvml::{self, Nvml};

/// Options every applet that talks to NVML accepts.
#[derive(Debug, Clone, Args)]
pub struct CommonArgs {
    /// NVML library to load instead of searching the usual places.
    #[arg(long, value_name = "PATH", env = nvml::LIB_ENV)]
    pub nvml_lib: Option<PathBuf>,

    /// Log line format on stderr (the level filter is taken from GPUD_LOG, e.g. "debug").
    #[arg(long, value_enum, default_value_t = LogFormat::Text, env = "GPUD_LOG_FORMAT")]
    pub log_format: LogFormat,

    /// Check the command line, the environment and the config files it names, then exit: 0
    /// when they are valid, 64 or 65 with the reason otherwise. Loads no NVML, binds nothing.
    #[arg(long)]
    pub check_config: bool,
}

impl CommonArgs {
    /// Starts logging and opens NVML (exit 69 with every path tried when the driver is
    /// unavailable).
    pub fn start(&self) -> Result<Nvml, Error> {
        self.stop_if_checking()?;
        logging::init(self.log_format);
        Ok(Nvml::open(self.nvml_lib.as_deref())?)
    }

    /// With `--check-config`, ends the applet here with exit 0. Every applet resolves its flags,
    /// environment and config files before it opens NVML, so reaching this point means they
    /// are valid, and nothing has been bound, written or loaded yet.
    pub fn stop_if_checking(&self) -> Result<(), Error> {
        if self.check_config {
            eprintln!("gpud: the command line, environment and config files are valid");
            return Err(Error::Reported(0));
        }
        Ok(())
    }
}

// The options long-running applets share are declared once each, in the small structs below
// (and the health watcher's in `health::args::HealthArgs`); an applet flattens the ones it
// uses, so one flag has one environment variable and one default in every applet that takes
// it. docs/cli.md lists which applets take which; tests/docs.rs checks that it stays so.

/// Where gpud keeps what must survive a restart, by default.
pub const DEFAULT_STATE_DIR: &str = "/var/lib/gpud";

/// The state directory, for every daemon that keeps state or hands over to a new gpud.
#[derive(Debug, Clone, Args)]
pub struct StateArgs {
    /// Where gpud keeps what must survive a restart: health verdicts only an XID proves
    /// (`<dir>/health/<applet>.json`, until the GPU is seen reset or the node reboots), each
    /// GPU's remediation (`<dir>/remediation.json`), and the socket a new gpud takes over
    /// through (`<dir>/handover/<applet>.sock`); "" keeps nothing and always starts cold.
    #[arg(long, value_name = "DIR", env = "GPUD_STATE_DIR", default_value = DEFAULT_STATE_DIR)]
    pub state_dir: String,
}

/// The rescan interval when none is given (`--rescan-interval`, `GPUD_RESCAN_INTERVAL`).
pub const DEFAULT_RESCAN_INTERVAL: Duration = Duration::from_secs(30);

/// How often a daemon re-reads the node, for every applet that keeps an inventory current by
/// rescanning (not the health watcher alone, which sees lost GPUs and their return by itself).
#[derive(Debug, Clone, Args)]
pub struct RescanArgs {
    /// How often the node is rescanned for GPUs and MIG devices that appeared or vanished
    /// (500ms, 1m; zero is a usage error) [default: 30s].
    #[arg(long, value_name = "DURATION", env = "GPUD_RESCAN_INTERVAL",
          value_parser = positive_duration)]
    pub rescan_interval: Option<Duration>,
}

impl RescanArgs {
    /// The interval given, or [`DEFAULT_RESCAN_INTERVAL`].
    pub fn interval(&self) -> Duration {
        self.rescan_interval.unwrap_or(DEFAULT_RESCAN_INTERVAL)
    }
}

/// Access to the Kubernetes API server, for every applet that reads or writes API objects.
#[derive(Debug, Clone, Default, Args)]
pub struct ApiArgs {
    /// kubeconfig for the API server; without it the in-cluster service account is used.
    #[arg(long, value_name = "PATH", env = "KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,

    /// How long the API server may leave calls unanswered before a subsystem that needs it is
    /// not ready (/readyz says why); until its first answer it is not ready either.
    #[arg(long, value_name = "DURATION", env = "GPUD_API_UNREADY_AFTER", default_value = "2m",
          value_parser = crate::values::positive_duration)]
    pub api_unready_after: std::time::Duration,

    /// Requests per second this gpud sends the API server at most, all its parts together (a
    /// client-side token bucket); past it requests wait their turn, none is dropped.
    #[arg(long, value_name = "QPS", env = "GPUD_API_QPS", default_value = "5",
          value_parser = crate::values::positive_rate)]
    pub api_qps: f64,

    /// Requests this gpud may send at once after a quiet spell, above --api-qps.
    #[arg(long, value_name = "N", env = "GPUD_API_BURST", default_value = "10",
          value_parser = clap::value_parser!(u32).range(1..))]
    pub api_burst: u32,
}

impl ApiArgs {
    /// The kubeconfig given (`None`: the in-cluster service account).
    pub fn kubeconfig(&self) -> Option<&Path> {
        self.kubeconfig.as_deref()
    }
}

/// Where a daemon answers `/healthz` and `/readyz` when it runs no exporter.
#[derive(Debug, Clone, Args)]
pub struct AdminArgs {
    /// Address of /healthz and /readyz, [HOST]:PORT; "" turns them off [default: 127.0.0.1 and
    /// the applet's own port]. With the exporter they are served on its port instead.
    #[arg(long, value_name = "ADDRESS", env = "GPUD_HEALTH_ADDRESS")]
    pub health_address: Option<String>,

    /// Reload, as on SIGHUP, when the contents of the config file change (for a ConfigMap
    /// mounted into a container, where nothing can send SIGHUP; not with subPath mounts)
    #[arg(long, value_name = "BOOL", env = "GPUD_WATCH_CONFIG", default_value = "false",
          action = clap::ArgAction::Set, num_args = 0..=1, require_equals = true,
          default_missing_value = "true", value_parser = crate::nvidia_config::parse_bool)]
    pub watch_config: bool,
}

impl AdminArgs {
    /// The address to serve on: the flag, or loopback on `default_port`.
    pub fn address(&self, default_port: u16) -> String {
        self.health_address
            .clone()
            .unwrap_or_else(|| format!("127.0.0.1:{default_port}"))
    }

    /// The files to watch for [`AdminArgs::watch_config`]: `files`, or none when it is off.
    pub fn watched(&self, files: &[Option<&std::path::Path>]) -> Vec<std::path::PathBuf> {
        if !self.watch_config {
            return Vec::new();
        }
        files.iter().flatten().map(|p| p.to_path_buf()).collect()
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

/// Parses an applet's arguments; `--help` and `--version` print and exit 0, usage errors print
/// clap's message and exit 64.
pub fn parse<T: Parser>(args: Vec<OsString>) -> Result<T, Error> {
    T::try_parse_from(args).map_err(|err| {
        let code = if err.use_stderr() {
            crate::exit::USAGE
        } else {
            0
        };
        let _ = err.print();
        Error::Reported(code)
    })
}

pub use crate::values::positive_duration;

/// Loads gpud's own config file when one is named (exit 65 naming the field when it is bad).
pub fn load_config(path: Option<&std::path::Path>) -> Result<crate::config::Config, Error> {
    crate::config::load_optional(path).map_err(Error::config)
}

/// How an applet prints a document.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OutputFormat {
    /// Stable JSON for machines.
    Json,
    /// Aligned text for people.
    Table,
}

/// Writes a command's output to stdout; a closed stdout (`gpud inventory | head`) ends the
/// command quietly, any other failure names `what` could not be written.
pub fn print_stdout(text: &str, what: &str) -> Result<(), Error> {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Ok(()) => Ok(()),
        Err(err) if err.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        Err(err) => Err(Error::Failure(format!(
            "cannot write {what} to stdout: {err}"
        ))),
    }
}
