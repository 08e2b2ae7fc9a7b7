//! Command-line pieces shared by every applet: common options, parsing with gpud's exit codes,
//! and the one-line fatal error.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, ValueEnum};

use crate::exit;
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
