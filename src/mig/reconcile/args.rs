//! The reconciler's flags, shared by `gpud mig reconcile` and `gpud run` (where
//! `--mig-config-file` turns it on). All are `--mig-*` so they sit beside every other
//! subsystem's flags in `gpud run`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;

use super::attempt::Job;
use super::marker::Marker;
use super::service::Reconciler;
use crate::daemon::Error;
use crate::nvml::{Nvml, Rescanner};

use crate::cli::{MigConfigArgs, MigStateArgs, StateArgs};

/// The reconciler's flags.
#[derive(Debug, Clone, Args)]
pub struct ReconcileArgs {
    #[command(flatten)]
    pub config: MigConfigArgs,

    /// mig-parted hooks file run around every apply.
    #[arg(long, value_name = "PATH", env = "GPUD_MIG_HOOKS_FILE")]
    pub mig_hooks_file: Option<PathBuf>,

    /// Repartition GPUs even while compute processes use them (by default such a GPU fails
    /// the config, with the PIDs in the reason, and is retried).
    #[arg(long, env = "GPUD_MIG_FORCE")]
    pub mig_force: bool,

    /// Command that resets GPUs for a mode change; the comma-separated PCI bus ids are
    /// appended.
    #[arg(
        long,
        value_name = "COMMAND",
        default_value = "nvidia-smi -r -i",
        env = "GPUD_MIG_RESET_COMMAND"
    )]
    pub mig_reset_command: String,

    /// How long a reset may take to bring a pending mode into effect.
    #[arg(long, value_name = "DURATION", default_value = "60s",
          value_parser = crate::values::positive_duration, env = "GPUD_MIG_RESET_WAIT")]
    pub mig_reset_wait: Duration,

    /// Command that reboots the node when a mode change needs a reboot (at most once per
    /// requested config). Empty: the state is set to `rebooting` and the reboot is left to
    /// the operator.
    #[arg(
        long,
        value_name = "COMMAND",
        default_value = "",
        env = "GPUD_MIG_REBOOT_COMMAND"
    )]
    pub mig_reboot_command: String,

    #[command(flatten)]
    pub state: MigStateArgs,

    /// First delay before a failed config is retried; it doubles on every failure, up to
    /// 10 minutes.
    #[arg(long, value_name = "DURATION", default_value = "30s",
          value_parser = crate::values::positive_duration, env = "GPUD_MIG_RETRY_INTERVAL")]
    pub mig_retry_interval: Duration,
}

fn words(command: &str) -> Vec<String> {
    command.split_whitespace().map(str::to_owned).collect()
}

impl ReconcileArgs {
    /// The reconciler's state directory: `--mig-state-dir`, else `<state-dir>/mig`.
    pub fn state_dir(&self, state: &StateArgs) -> PathBuf {
        self.state.resolve(state)
    }

    /// Whether the reconciler is asked for.
    pub fn enabled(&self) -> bool {
        self.config.mig_config_file.is_some()
    }

    /// The reconciler, checked at start: a node name is needed (64) and the config file and
    /// hooks file must load (65). `None` without `--mig-config-file`.
    /// Checks the node name, the config file and the hooks file without touching NVML (so
    /// `--check-config` covers them); `None` when the reconciler is off.
    pub fn validate<'a>(
        &'a self,
        node_name: Option<&'a str>,
    ) -> Result<Option<(&'a PathBuf, &'a str)>, Error> {
        let Some(config_file) = &self.config.mig_config_file else {
            return Ok(None);
        };
        let node = node_name.filter(|n| !n.is_empty()).ok_or_else(|| {
            Error::Usage("the MIG reconciler needs the node name (--node-name or NODE_NAME)".into())
        })?;
        crate::mig_config::load(config_file).map_err(Error::config)?;
        if let Some(hooks) = &self.mig_hooks_file {
            crate::mig::hooks::Hooks::load(hooks).map_err(Error::Config)?;
        }
        Ok(Some((config_file, node)))
    }

    pub fn reconciler(
        &self,
        node_name: Option<&str>,
        kubeconfig: Option<&Path>,
        unready_after: Duration,
        state: &StateArgs,
        nvml: &Nvml,
        rescanner: Rescanner,
    ) -> Result<Option<Reconciler>, Error> {
        let Some((config_file, node)) = self.validate(node_name)? else {
            return Ok(None);
        };
        let state_dir = self.state_dir(state);
        Ok(Some(Reconciler {
            job: Job {
                config_file: config_file.clone(),
                hooks_file: self.mig_hooks_file.clone(),
                force: self.mig_force,
                reset_command: words(&self.mig_reset_command),
                reset_wait: self.mig_reset_wait,
            },
            node: node.to_owned(),
            kubeconfig: kubeconfig.map(Path::to_path_buf),
            marker: Marker::new(&state_dir),
            state_dir,
            reboot_command: words(&self.mig_reboot_command),
            retry: self.mig_retry_interval,
            admin: nvml.mig_admin(),
            rescanner,
            metrics: Default::default(),
            unready_after,
            layout_dir: None,
        }))
    }
}
