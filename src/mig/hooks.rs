//! mig-parted's hooks file: commands run at `apply-start`, `pre-apply-mode`,
//! `pre-apply-config` and `apply-exit`.
//!
//! As mig-parted does, a hook's environment is its own `envs` plus every `MIG_PARTED_*` flag
//! value of this run, and nothing inherited from gpud's environment; hooks of one point run in
//! order and the first failure stops the apply.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde::Deserialize;

use crate::files;

/// The points at which hooks run.
pub const POINTS: [&str; 4] = [
    "apply-start",
    "pre-apply-mode",
    "pre-apply-config",
    "apply-exit",
];

/// A hooks file.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Hooks {
    pub version: String,
    #[serde(default)]
    pub hooks: BTreeMap<String, Vec<Hook>>,
}

/// One command.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Hook {
    pub command: String,
    #[serde(default)]
    pub args: Vec<String>,
    #[serde(default)]
    pub envs: BTreeMap<String, String>,
    #[serde(default)]
    pub workdir: Option<PathBuf>,
}

/// The `MIG_PARTED_*` flag values of one apply, the environment mig-parted gives its hooks.
#[derive(Debug, Clone)]
pub struct FlagEnv<'a> {
    pub config_file: &'a Path,
    pub selected_config: &'a str,
    pub hooks_file: Option<&'a Path>,
    pub skip_reset: bool,
    pub mode_only: bool,
    pub debug: bool,
}

impl FlagEnv<'_> {
    /// The variables, by name.
    pub fn vars(&self) -> Vec<(String, String)> {
        let path = |p: &Path| p.display().to_string();
        vec![
            ("MIG_PARTED_CONFIG_FILE".into(), path(self.config_file)),
            (
                "MIG_PARTED_SELECTED_CONFIG".into(),
                self.selected_config.to_owned(),
            ),
            (
                "MIG_PARTED_HOOKS_FILE".into(),
                self.hooks_file.map(path).unwrap_or_default(),
            ),
            ("MIG_PARTED_SKIP_RESET".into(), self.skip_reset.to_string()),
            (
                "MIG_PARTED_MODE_CHANGE_ONLY".into(),
                self.mode_only.to_string(),
            ),
            ("MIG_PARTED_DEBUG".into(), self.debug.to_string()),
        ]
    }
}

impl Hooks {
    /// Reads and checks a hooks file.
    pub fn load(path: &Path) -> Result<Hooks, String> {
        let text = files::read_yaml(path).map_err(|e| e.to_string())?;
        let hooks: Hooks = serde_yaml_ng::from_str(&text)
            .map_err(|e| format!("{}: not a mig-parted v1 hooks file: {e}", path.display()))?;
        if hooks.version != "v1" {
            return Err(format!(
                "{}: version: unknown version {:?} (only \"v1\" exists)",
                path.display(),
                hooks.version
            ));
        }
        if let Some(point) = hooks.hooks.keys().find(|k| !POINTS.contains(&k.as_str())) {
            return Err(format!(
                "{}: hooks.{point}: not a hook point (they are {})",
                path.display(),
                POINTS.join(", ")
            ));
        }
        Ok(hooks)
    }

    /// Runs the hooks of `point` with the flag environment `flags`.
    pub fn run(&self, point: &str, flags: &[(String, String)]) -> Result<(), String> {
        for hook in self.hooks.get(point).into_iter().flatten() {
            let mut cmd = Command::new(&hook.command);
            cmd.args(&hook.args)
                .env_clear()
                .envs(flags.iter().map(|(k, v)| (k, v)))
                .envs(&hook.envs);
            if let Some(dir) = &hook.workdir {
                cmd.current_dir(dir);
            }
            let status = crate::daemon::signals::with_default_mask(|| cmd.status())
                .map_err(|e| format!("hook {point}: cannot run {:?}: {e}", hook.command))?;
            if !status.success() {
                return Err(format!(
                    "hook {point}: {:?} {:?} failed ({status})",
                    hook.command, hook.args
                ));
            }
        }
        Ok(())
    }
}
