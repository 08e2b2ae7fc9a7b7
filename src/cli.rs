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

    #[command(flatten)]
    pub check: CheckArgs,
}

/// `--check-config`, for every applet: the NVML ones through [`CommonArgs`], the others (the
/// container runtime's tools) on their own.
#[derive(Debug, Clone, Default, Args)]
pub struct CheckArgs {
    /// Check the command line, the environment and the config files it names, then exit: 0
    /// when they are valid, 64 or 65 with the reason otherwise. Loads no NVML, binds and
    /// writes nothing.
    #[arg(long)]
    pub check_config: bool,
}

impl CheckArgs {
    /// With `--check-config`, ends the applet here with exit 0, saying `what` is valid.
    pub fn stop_if_checking(&self, what: &str) -> Result<(), Error> {
        if self.check_config {
            eprintln!("gpud: {what} valid");
            return Err(Error::Reported(0));
        }
        Ok(())
    }
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
        self.check
            .stop_if_checking("the command line, environment and config files are")
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

impl StateArgs {
    /// The MIG reconciler's directory when `--mig-state-dir` is not given: `<state-dir>/mig`,
    /// which is [`crate::mig_state::DEFAULT_STATE_DIR`] with the default state directory. With
    /// `--state-dir ""` (keep nothing) it stays at that default all the same: the reboot-once
    /// marker in it is what stops a node that needs a reboot for a MIG mode from rebooting in
    /// a loop.
    pub fn mig_state_dir(&self) -> PathBuf {
        if self.state_dir.is_empty() {
            PathBuf::from(crate::mig_state::DEFAULT_STATE_DIR)
        } else {
            Path::new(&self.state_dir).join("mig")
        }
    }
}

/// The MIG reconciler's state directory, for the reconciler (`gpud mig reconcile`, `gpud run`)
/// and the doctor, which reads the reconciler's last state from it.
#[derive(Debug, Clone, Default, Args)]
pub struct MigStateArgs {
    /// Directory of the MIG reconciler's on-disk state (the reboot-once marker and its last
    /// state, which `gpud doctor` reads); must survive a reboot [default: <state-dir>/mig].
    #[arg(long, value_name = "PATH", env = "GPUD_MIG_STATE_DIR")]
    pub mig_state_dir: Option<PathBuf>,
}

impl MigStateArgs {
    /// The directory given, else the one `state` implies ([`StateArgs::mig_state_dir`]).
    pub fn resolve(&self, state: &StateArgs) -> PathBuf {
        self.mig_state_dir
            .clone()
            .unwrap_or_else(|| state.mig_state_dir())
    }
}

/// gpud's own config file, for the applets that run the health watcher (its `health`
/// section) and for `gpud doctor`, which validates it.
#[derive(Debug, Clone, Default, Args)]
pub struct GpudConfigArgs {
    /// gpud's config file (YAML or JSON): its `health` section applies to the health
    /// watcher; `gpud doctor` checks that it loads.
    #[arg(long, value_name = "PATH", env = crate::config::CONFIG_ENV)]
    pub config: Option<PathBuf>,
}

/// The mig-parted config file the node's GPUs follow, for the MIG reconciler (`gpud mig
/// reconcile`, `gpud run`) and for `gpud doctor`, which checks that its config is in effect.
#[derive(Debug, Clone, Default, Args)]
pub struct MigConfigArgs {
    /// mig-parted config file with the configs the Node's nvidia.com/mig.config label may
    /// name: the MIG reconciler re-reads it at every attempt (in `gpud run` it turns the
    /// reconciler on), and `gpud doctor`'s mig.config checks that the selected one is in
    /// effect.
    #[arg(long, value_name = "PATH", env = "GPUD_MIG_CONFIG_FILE")]
    pub mig_config_file: Option<PathBuf>,
}

/// Where the host's root is seen, for the applets that read the host's files from inside a
/// container.
#[derive(Debug, Clone, Args)]
pub struct HostRootArgs {
    /// Where the host's root is mounted (inside a container, e.g. /host); every host path
    /// read (/dev, /proc, /sys, /etc, /var/lib/kubelet, /run) is taken under it.
    #[arg(long, value_name = "PATH", env = "GPUD_HOST_ROOT", default_value = "/")]
    pub host_root: PathBuf,
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

/// A client of the Kubernetes API server: where to find it and how fast to talk to it, for
/// every applet that reads or writes API objects.
#[derive(Debug, Clone, Default, Args)]
pub struct KubeClientArgs {
    /// kubeconfig for the API server; without it the in-cluster service account is used.
    #[arg(long, value_name = "PATH", env = "KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,

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

impl KubeClientArgs {
    /// The kubeconfig given (`None`: the in-cluster service account).
    pub fn kubeconfig(&self) -> Option<&Path> {
        self.kubeconfig.as_deref()
    }
}

/// Access to the Kubernetes API server for a subsystem whose readiness depends on it: the
/// client's flags, and how long the API server may fail it before it is not ready.
#[derive(Debug, Clone, Default, Args)]
pub struct ApiArgs {
    #[command(flatten)]
    pub client: KubeClientArgs,

    /// How long the API server may leave calls unanswered before a subsystem that needs it is
    /// not ready (/readyz says why); until its first answer it is not ready either.
    #[arg(long, value_name = "DURATION", env = "GPUD_API_UNREADY_AFTER", default_value = "2m",
          value_parser = crate::values::positive_duration)]
    pub api_unready_after: std::time::Duration,
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

/// The Kubernetes node name, for every applet that reports it, labels or follows its Node, or
/// publishes for it (declared here once, so `NODE_NAME` means the same in each of them).
#[derive(Debug, Clone, Default, Args)]
pub struct NodeNameArgs {
    /// The Kubernetes node name: the Node this gpud labels, reports on, follows or publishes
    /// for, and the host name it reports (the kernel host name when unset, where an applet can
    /// do without it).
    #[arg(long, value_name = "NAME", env = "NODE_NAME")]
    pub node_name: Option<String>,
}

impl NodeNameArgs {
    /// The node name given, if any.
    pub fn get(&self) -> Option<&str> {
        self.node_name.as_deref()
    }
}

/// Where node facts outside NVML come from (shared by applets that discover the node).
#[derive(Debug, Clone, Args)]
pub struct NodeArgs {
    #[command(flatten)]
    pub name: NodeNameArgs,

    /// File holding the machine type (DMI product name).
    #[arg(long, value_name = "PATH", env = "GFD_MACHINE_TYPE_FILE",
          default_value = nvml::DEFAULT_MACHINE_TYPE_FILE)]
    pub machine_type_file: PathBuf,
}

impl NodeArgs {
    /// The facts discovery needs.
    pub fn facts(&self) -> nvml::NodeFacts {
        nvml::NodeFacts {
            node_name: self.name.node_name.clone(),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn state(dir: &str) -> StateArgs {
        StateArgs {
            state_dir: dir.to_owned(),
        }
    }

    #[test]
    fn the_mig_state_dir_follows_the_state_dir() {
        let none = MigStateArgs::default();
        assert_eq!(
            none.resolve(&state(DEFAULT_STATE_DIR)),
            PathBuf::from(crate::mig_state::DEFAULT_STATE_DIR),
            "existing nodes keep their reboot marker where it was"
        );
        assert_eq!(
            none.resolve(&state("/srv/gpud")),
            Path::new("/srv/gpud/mig")
        );
        assert_eq!(
            none.resolve(&state("")),
            PathBuf::from(crate::mig_state::DEFAULT_STATE_DIR),
            "the reboot-once marker is kept even when nothing else is"
        );
        let given = MigStateArgs {
            mig_state_dir: Some(PathBuf::from("/mnt/mig")),
        };
        assert_eq!(given.resolve(&state("/srv/gpud")), Path::new("/mnt/mig"));
    }
}
