//! The health watcher's options, shared by every applet that runs it (`health`,
//! `device-plugin`, `exporter`, `run`, …): flags over gpud's config file over the defaults.

use std::path::PathBuf;

use super::watcher::{WatcherConfig, WatcherOverrides};
use crate::daemon::Error;
use crate::values::positive_duration;

/// The health watcher's options, shared by every applet that runs it (`health`,
/// `device-plugin`, `exporter`, `run`): flags over gpud's config file over the defaults.
#[derive(Debug, Clone, clap::Args)]
pub struct HealthArgs {
    #[command(flatten)]
    pub gpud_config: crate::cli::GpudConfigArgs,

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

    #[command(flatten)]
    pub state: crate::cli::StateArgs,
}

impl HealthArgs {
    /// Loads gpud's config file (exit 65 when it is bad) and resolves the watcher's settings
    /// for `applet` (whose kept verdicts are its own), printing the warnings about malformed
    /// XID lists once. Also returns the config file for the applet's other sections.
    pub fn resolve(&self, applet: &str) -> Result<(WatcherConfig, crate::config::Config), Error> {
        let file = crate::config::load_optional(self.gpud_config.config.as_deref())
            .map_err(Error::config)?;
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
        let state_dir =
            (!self.state.state_dir.is_empty()).then(|| PathBuf::from(&self.state.state_dir));
        let watcher = WatcherConfig {
            kept_file: state_dir
                .as_deref()
                .map(|dir| crate::health::kept::file_of(dir, applet)),
            remediation_record: state_dir
                .as_deref()
                .map(crate::remediation_state::record::file_of),
            ..watcher
        };
        Ok((watcher, file))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Flags {
        #[command(flatten)]
        health: HealthArgs,
    }

    #[test]
    fn the_state_dir_names_the_applets_file_and_empty_keeps_nothing() {
        let flags = Flags::try_parse_from(["gpud", "--state-dir", "/s", "--kmsg", ""]).unwrap();
        let (watcher, _) = flags.health.resolve("run").unwrap();
        assert_eq!(watcher.kept_file, Some(PathBuf::from("/s/health/run.json")));
        assert_eq!(
            watcher.remediation_record,
            Some(PathBuf::from("/s/remediation.json"))
        );
        let flags = Flags::try_parse_from(["gpud", "--state-dir", "", "--kmsg", ""]).unwrap();
        assert_eq!(flags.health.resolve("run").unwrap().0.kept_file, None);
    }
}
