//! One reconcile attempt's blocking part: re-read the config file (so an edited file counts
//! at the next attempt without a restart), check whether the label's config is in effect, and
//! apply it with the apply code `gpud mig apply` uses.

use std::path::PathBuf;
use std::time::Duration;

use crate::mig::apply::{self, ApplyError, Options, Outcome};
use crate::mig::hooks::{FlagEnv, Hooks};
use crate::mig_config::assert::{self, Scope};
use crate::mig_config::select;
use crate::mig_config::spec::Entry;
use crate::nvml::mig_admin::MigAdmin;

/// What every attempt applies with.
#[derive(Debug, Clone)]
pub struct Job {
    /// mig-parted config file holding the labels the Node may name.
    pub config_file: PathBuf,
    /// mig-parted hooks file.
    pub hooks_file: Option<PathBuf>,
    /// Change GPUs even while compute processes use them.
    pub force: bool,
    /// Program and arguments that reset GPUs (bus ids appended).
    pub reset_command: Vec<String>,
    /// How long a reset may take to bring the pending mode into effect.
    pub reset_wait: Duration,
}

impl Job {
    /// The entries of `label` and the hooks, both read now.
    fn load(&self, label: &str) -> Result<(Vec<Entry>, Hooks), String> {
        let spec = crate::mig_config::load(&self.config_file).map_err(|e| e.to_string())?;
        let (_, entries) = spec
            .select(Some(label))
            .map_err(|why| format!("{}: {why}", self.config_file.display()))?;
        let hooks = match &self.hooks_file {
            Some(path) => Hooks::load(path)?,
            None => Hooks::default(),
        };
        Ok((entries.to_vec(), hooks))
    }

    /// The indices of the GPUs that `label`'s config would change (empty: it is in effect);
    /// `Err` when it cannot be told (a config that does not load, a label not in it, a driver
    /// that does not answer).
    pub fn check(&self, admin: &MigAdmin, label: &str) -> Result<Vec<u32>, String> {
        let (entries, _) = self.load(label)?;
        let gpus = admin
            .gpus()
            .map_err(|e| format!("reading the GPUs: {}", crate::logging::error_chain(&e)))?;
        let targets = select::targets(&entries, &gpus);
        Ok(gpus
            .iter()
            .zip(&targets)
            .filter(|(gpu, target)| {
                let (one, wanted) = (std::slice::from_ref(*gpu), std::slice::from_ref(*target));
                assert::check(one, wanted, Scope::Full).is_err()
            })
            .map(|(gpu, _)| gpu.index)
            .collect())
    }

    /// Applies `label`'s config, resetting GPUs for a mode change.
    pub fn apply(&self, admin: &MigAdmin, label: &str) -> Result<Outcome, ApplyError> {
        let (entries, hooks) = self.load(label).map_err(ApplyError::Refused)?;
        let opts = Options {
            skip_reset: false,
            mode_only: false,
            force: self.force,
            reset_command: self.reset_command.clone(),
            reset_wait: self.reset_wait,
            hook_env: FlagEnv {
                config_file: &self.config_file,
                selected_config: label,
                hooks_file: self.hooks_file.as_deref(),
                skip_reset: false,
                mode_only: false,
                debug: false,
            }
            .vars(),
        };
        apply::apply(admin, &entries, &hooks, &opts)
    }
}
