//! The remediation's flags, shared by the applets that run it (`run`, `health`,
//! `node-status`), and the settings they resolve to.

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::ValueEnum;

use crate::daemon::Error;
use crate::values::positive_duration;

/// Where the kubelet serves pod-resources (the pods that hold a GPU, for eviction).
pub const DEFAULT_POD_RESOURCES_SOCKET: &str = crate::holdings::pod_resources::DEFAULT_SOCKET;

/// What gpud does about a GPU that needs a reset.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Mode {
    /// Nothing beyond quarantine (withdrawn and tainted), as before.
    Off,
    /// Decides and reports what it would do (phases, metrics, events, the escalation
    /// condition) but never evicts, resets or reboots.
    Report,
    /// Drains, resets, verifies and gives the GPU back; escalates what a reset cannot fix.
    Reset,
}

/// Self-healing GPUs: drain one GPU, reset it, verify it, give it back.
#[derive(Debug, Clone, clap::Args)]
pub struct RemediationArgs {
    /// What to do about a GPU that needs a reset: off, report (everything but act) or reset.
    #[arg(
        long = "remediation",
        value_enum,
        value_name = "MODE",
        env = "GPUD_REMEDIATION",
        default_value = "off"
    )]
    pub remediation: Mode,

    /// Also evict the pods that hold the GPU (Eviction API, PodDisruptionBudgets respected);
    /// without it gpud waits for their processes to end.
    #[arg(long = "remediation-evict", env = "GPUD_REMEDIATION_EVICT")]
    pub remediation_evict: bool,

    /// How long a GPU may wait for its processes to end before the wait escalates (never a
    /// reset under a running process).
    #[arg(long = "remediation-drain-timeout", value_name = "DURATION",
          env = "GPUD_REMEDIATION_DRAIN_TIMEOUT", default_value = "10m",
          value_parser = positive_duration)]
    pub remediation_drain_timeout: Duration,

    /// The reset command; `-i <PCI bus id>` is appended. Split on white space.
    #[arg(
        long = "remediation-reset-command",
        value_name = "COMMAND",
        env = "GPUD_REMEDIATION_RESET_COMMAND",
        default_value = "nvidia-smi -r"
    )]
    pub remediation_reset_command: String,

    /// How long the reset command may run; past it, it is killed and the GPU escalated.
    #[arg(long = "remediation-reset-timeout", value_name = "DURATION",
          env = "GPUD_REMEDIATION_RESET_TIMEOUT", default_value = "2m",
          value_parser = positive_duration)]
    pub remediation_reset_timeout: Duration,

    /// A command that must exit 0 before a reset GPU goes back to work (e.g. a short DCGM
    /// diagnostic); it gets GPUD_GPU_UUID, GPUD_GPU_BUS_ID and GPUD_GPU_INDEX. Split on white
    /// space.
    #[arg(
        long = "remediation-verify-command",
        value_name = "COMMAND",
        env = "GPUD_REMEDIATION_VERIFY_COMMAND"
    )]
    pub remediation_verify_command: Option<String>,

    /// How long the verify command may run.
    #[arg(long = "remediation-verify-timeout", value_name = "DURATION",
          env = "GPUD_REMEDIATION_VERIFY_TIMEOUT", default_value = "10m",
          value_parser = positive_duration)]
    pub remediation_verify_timeout: Duration,

    /// A command that reboots the node when a GPU needs a reboot; unset, gpud never reboots
    /// and only escalates. Split on white space.
    #[arg(
        long = "remediation-reboot-command",
        value_name = "COMMAND",
        env = "GPUD_REMEDIATION_REBOOT_COMMAND"
    )]
    pub remediation_reboot_command: Option<String>,

    /// Resets of one GPU within --remediation-reset-window after which it escalates as
    /// suspected hardware instead of being reset again.
    #[arg(
        long = "remediation-max-resets",
        value_name = "N",
        env = "GPUD_REMEDIATION_MAX_RESETS",
        default_value_t = 3
    )]
    pub remediation_max_resets: u32,

    /// The window --remediation-max-resets counts in.
    #[arg(long = "remediation-reset-window", value_name = "DURATION",
          env = "GPUD_REMEDIATION_RESET_WINDOW", default_value = "24h",
          value_parser = positive_duration)]
    pub remediation_reset_window: Duration,

    /// Nodes that may reset GPUs at the same time, cluster-wide (one coordination.k8s.io
    /// Lease per slot in --remediation-namespace); 0: no cluster budget (bare metal).
    #[arg(
        long = "remediation-max-concurrent",
        value_name = "N",
        env = "GPUD_REMEDIATION_MAX_CONCURRENT",
        default_value_t = 1
    )]
    pub remediation_max_concurrent: u32,

    /// How long a slot's Lease lives without renewal: a node that dies holding one frees it
    /// after this.
    #[arg(long = "remediation-lease-duration", value_name = "DURATION",
          env = "GPUD_REMEDIATION_LEASE_DURATION", default_value = "30s",
          value_parser = positive_duration)]
    pub remediation_lease_duration: Duration,

    /// The namespace of the budget's Leases (gpud's own).
    #[arg(
        long = "remediation-namespace",
        value_name = "NAMESPACE",
        env = "GPUD_REMEDIATION_NAMESPACE",
        default_value = "gpud"
    )]
    pub remediation_namespace: String,

    /// The kubelet's pod-resources socket (the pods holding a GPU, for eviction).
    #[arg(long = "remediation-pod-resources-socket", value_name = "PATH",
          env = "GPUD_REMEDIATION_POD_RESOURCES_SOCKET",
          default_value = DEFAULT_POD_RESOURCES_SOCKET)]
    pub remediation_pod_resources_socket: PathBuf,
}

/// A command line: the program and its arguments.
pub type CommandLine = Vec<String>;

/// What the remediation runs with, checked at start.
#[derive(Debug, Clone)]
pub struct Settings {
    pub mode: Mode,
    pub evict: bool,
    pub drain_timeout: Duration,
    pub reset_command: CommandLine,
    pub reset_timeout: Duration,
    pub verify_command: Option<CommandLine>,
    pub verify_timeout: Duration,
    pub reboot_command: Option<CommandLine>,
    pub max_resets: u32,
    pub reset_window: Duration,
    pub max_concurrent: u32,
    pub lease_duration: Duration,
    pub namespace: String,
    pub pod_resources_socket: PathBuf,
    /// The DRA driver whose claims hold GPUs (`gpu.nvidia.com` unless `gpud run --dra` names
    /// another).
    pub dra_driver: String,
    /// The Node (conditions, events, Leases' holder); `None` without Kubernetes.
    pub node: Option<String>,
    pub kubeconfig: Option<PathBuf>,
    /// Where each GPU's phase is kept across restarts; `None` keeps nothing.
    pub state_file: Option<PathBuf>,
    /// The state directory holding the MIG layout owners' record and lock
    /// ([`crate::holdings::layout`]); `None`: no owner is known, no layout is made again.
    pub layout_dir: Option<PathBuf>,
    /// This gpud binary, whose doctor checks a reset GPU (`None` when the kernel cannot say
    /// where it is: the doctor's checks are then left out, said once).
    pub gpud_binary: Option<PathBuf>,
}

impl RemediationArgs {
    /// The settings, or `None` when remediation is off. Refuses (exit 64) what cannot work:
    /// a reset command that is not there, an empty command, a cluster budget without a node
    /// name to hold Leases as.
    pub fn resolve(
        &self,
        node: Option<&str>,
        kubeconfig: Option<&Path>,
        state_dir: &str,
    ) -> Result<Option<Settings>, Error> {
        if self.remediation == Mode::Off {
            return Ok(None);
        }
        let reset_command = command_line(
            "--remediation-reset-command",
            &self.remediation_reset_command,
        )?;
        if self.remediation == Mode::Reset {
            find_program("--remediation-reset-command", &reset_command[0])?;
        }
        let optional = |flag, text: &Option<String>| {
            text.as_deref().map(|t| command_line(flag, t)).transpose()
        };
        let node = node.filter(|n| !n.is_empty()).map(str::to_owned);
        if self.remediation_max_concurrent > 0 && node.is_none() {
            return Err(Error::Usage(format!(
                "--remediation {} with --remediation-max-concurrent {} needs the node name \
                 (--node-name or NODE_NAME) and API access to hold a Lease; on a node without \
                 Kubernetes set --remediation-max-concurrent 0",
                self.mode_word(),
                self.remediation_max_concurrent
            )));
        }
        if self.remediation_max_resets == 0 {
            return Err(Error::Usage(
                "--remediation-max-resets 0 would never reset: use --remediation report instead"
                    .to_owned(),
            ));
        }
        Ok(Some(Settings {
            mode: self.remediation,
            evict: self.remediation_evict,
            drain_timeout: self.remediation_drain_timeout,
            reset_command,
            reset_timeout: self.remediation_reset_timeout,
            verify_command: optional(
                "--remediation-verify-command",
                &self.remediation_verify_command,
            )?,
            verify_timeout: self.remediation_verify_timeout,
            reboot_command: optional(
                "--remediation-reboot-command",
                &self.remediation_reboot_command,
            )?,
            max_resets: self.remediation_max_resets,
            reset_window: self.remediation_reset_window,
            max_concurrent: self.remediation_max_concurrent,
            lease_duration: self.remediation_lease_duration,
            namespace: self.remediation_namespace.clone(),
            pod_resources_socket: self.remediation_pod_resources_socket.clone(),
            dra_driver: crate::dra_names::DEFAULT_DRIVER.to_owned(),
            node,
            kubeconfig: kubeconfig.map(Path::to_path_buf),
            state_file: (!state_dir.is_empty())
                .then(|| crate::remediation_state::record::file_of(Path::new(state_dir))),
            layout_dir: (!state_dir.is_empty()).then(|| PathBuf::from(state_dir)),
            gpud_binary: std::env::current_exe().ok(),
        }))
    }

    fn mode_word(&self) -> &'static str {
        match self.remediation {
            Mode::Off => "off",
            Mode::Report => "report",
            Mode::Reset => "reset",
        }
    }
}

/// `text` split on white space; an empty one is a usage error naming `flag`.
fn command_line(flag: &str, text: &str) -> Result<CommandLine, Error> {
    let words: CommandLine = text.split_whitespace().map(str::to_owned).collect();
    if words.is_empty() {
        return Err(Error::Usage(format!(
            "{flag} is empty: give the command to run"
        )));
    }
    Ok(words)
}

/// Checks that `program` (a path, or a name looked up on `PATH`) is an executable file.
fn find_program(flag: &str, program: &str) -> Result<(), Error> {
    use std::os::unix::fs::PermissionsExt;
    let executable = |path: &Path| {
        path.metadata()
            .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    let found = if program.contains('/') {
        executable(Path::new(program))
    } else {
        #[allow(clippy::disallowed_methods)] // PATH is where the program is looked up.
        let path = std::env::var_os("PATH").unwrap_or_default();
        std::env::split_paths(&path).any(|dir| executable(&dir.join(program)))
    };
    if found {
        Ok(())
    } else {
        Err(Error::Usage(format!(
            "{flag}: {program:?} is not an executable file{}; install it or point the flag at \
             the reset command, or run --remediation report",
            if program.contains('/') {
                ""
            } else {
                " on PATH"
            }
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Flags {
        #[command(flatten)]
        remediation: RemediationArgs,
    }

    fn parse(args: &[&str]) -> RemediationArgs {
        let mut argv = vec!["gpud"];
        argv.extend_from_slice(args);
        Flags::try_parse_from(argv).unwrap().remediation
    }

    #[test]
    fn off_by_default_and_off_resolves_to_nothing() {
        let args = parse(&[]);
        assert_eq!(args.remediation, Mode::Off);
        assert!(args.resolve(None, None, "").unwrap().is_none());
    }

    #[test]
    fn a_missing_reset_command_is_refused_at_start_naming_the_flag() {
        let args = parse(&[
            "--remediation",
            "reset",
            "--remediation-reset-command",
            "/nonexistent/reset -x",
            "--remediation-max-concurrent",
            "0",
        ]);
        let err = args.resolve(None, None, "").unwrap_err().to_string();
        assert_eq!(
            err,
            "--remediation-reset-command: \"/nonexistent/reset\" is not an executable file; \
             install it or point the flag at the reset command, or run --remediation report"
        );
        // Report mode never runs it.
        let args = parse(&[
            "--remediation",
            "report",
            "--remediation-reset-command",
            "/nonexistent/reset",
            "--remediation-max-concurrent",
            "0",
        ]);
        assert!(args.resolve(None, None, "").unwrap().is_some());
    }

    #[test]
    fn a_cluster_budget_needs_a_node_name() {
        let args = parse(&["--remediation", "report"]);
        let err = args.resolve(None, None, "/s").unwrap_err().to_string();
        assert!(err.contains("needs the node name"), "{err}");
        let settings = args.resolve(Some("n1"), None, "/s").unwrap().unwrap();
        assert_eq!(settings.node.as_deref(), Some("n1"));
        assert_eq!(
            settings.state_file,
            Some(PathBuf::from("/s/remediation.json"))
        );
        assert_eq!(settings.reset_command, ["nvidia-smi", "-r"]);
    }
}
