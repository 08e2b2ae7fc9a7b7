//! gpud's own configuration file (`--config`, `GPUD_CONFIG`): YAML or JSON, strict.
//!
//! Unknown keys are errors (a typo must not silently fall back to a default), and every
//! message names the file, the field and the value. Precedence, for every setting that also
//! has a flag: flag > environment > this file > built-in default.
//!
//! ```yaml
//! version: v1
//! health:
//!   pollInterval: 5s        # how often counters, temperature, links are polled
//!   xidQuietPeriod: 10m     # a non-fatal XID condition clears after this long without repeats
//!   kmsgPath: /dev/kmsg     # "" disables the kernel-log source
//!   xid:
//!     ignore: [94]          # like DP_DISABLE_HEALTHCHECKS=94
//!     enable: [13]          # like DP_ENABLE_HEALTHCHECKS=13
//!     disableAll: false     # like DP_DISABLE_HEALTHCHECKS=all
//! ```

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

/// Environment variable naming the config file (same as `--config`).
pub const CONFIG_ENV: &str = "GPUD_CONFIG";

/// A config file that could not be used: the same errors, worded the same way, as NVIDIA's
/// config file (file, field and value named).
pub use crate::nvidia_config::NvidiaConfigError as ConfigError;
use crate::nvidia_config::Origin;

/// The XID section of gpud's configuration file (the health watcher's XID policy reads it).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct XidPolicyConfig {
    /// Extra XIDs to ignore, like entries of `DP_DISABLE_HEALTHCHECKS`.
    pub ignore: Vec<u32>,
    /// XIDs to always check, like entries of `DP_ENABLE_HEALTHCHECKS`.
    pub enable: Vec<u32>,
    /// Disable XID health checks, like `DP_DISABLE_HEALTHCHECKS=all`.
    pub disable_all: bool,
}

/// The file as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawConfig {
    version: Option<String>,
    #[serde(default)]
    health: RawHealth,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawHealth {
    poll_interval: Option<String>,
    xid_quiet_period: Option<String>,
    kmsg_path: Option<String>,
    #[serde(default)]
    xid: RawXid,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawXid {
    #[serde(default)]
    ignore: Vec<u32>,
    #[serde(default)]
    enable: Vec<u32>,
    #[serde(default)]
    disable_all: bool,
}

/// The validated configuration. Every field is optional: unset means "use the default".
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Config {
    /// The `health` section.
    pub health: HealthSection,
}

/// The `health` section.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HealthSection {
    pub poll_interval: Option<Duration>,
    pub xid_quiet_period: Option<Duration>,
    /// `Some(None)` when the file disables the kernel-log source with `""`.
    pub kmsg_path: Option<Option<PathBuf>>,
    pub xid: XidPolicyConfig,
}

/// The only config version this build reads.
pub const VERSION: &str = "v1";

/// Reads and validates a config file.
pub fn load(path: &Path) -> Result<Config, ConfigError> {
    let text = crate::files::read_text(path)?;
    parse(path, &text)
}

/// The config file at `path`, or the defaults when none is named.
pub fn load_optional(path: Option<&Path>) -> Result<Config, ConfigError> {
    Ok(path.map(load).transpose()?.unwrap_or_default())
}

/// Validates config text; `path` is only used in messages.
pub fn parse(path: &Path, text: &str) -> Result<Config, ConfigError> {
    let raw: RawConfig = if text.trim().is_empty() {
        RawConfig::default()
    } else {
        // Bounded before the parser, whose time grows with the square of the nesting.
        crate::files::check_nesting(path, text)?;
        serde_yaml_ng::from_str(text).map_err(|err| ConfigError::Parse {
            path: path.to_path_buf(),
            message: err.to_string(),
        })?
    };
    let origin = Origin::File(path.to_path_buf());
    let invalid = |field: &'static str, value: &str, why: String| ConfigError::Invalid {
        origin: origin.clone(),
        field: field.to_owned(),
        value: value.to_owned(),
        why,
    };
    if let Some(version) = raw.version.as_deref().filter(|v| *v != VERSION) {
        return Err(invalid(
            "version",
            version,
            format!("this gpud reads version {VERSION}"),
        ));
    }
    let duration = |field: &'static str,
                    value: &Option<String>|
     -> Result<Option<Duration>, ConfigError> {
        value
            .as_deref()
            .map(|text| crate::values::positive_duration(text).map_err(|e| invalid(field, text, e)))
            .transpose()
    };
    for code in raw.health.xid.ignore.iter().chain(&raw.health.xid.enable) {
        if *code == 0 {
            return Err(invalid("health.xid", "0", "XID 0 does not exist".into()));
        }
    }
    Ok(Config {
        health: HealthSection {
            poll_interval: duration("health.pollInterval", &raw.health.poll_interval)?,
            xid_quiet_period: duration("health.xidQuietPeriod", &raw.health.xid_quiet_period)?,
            kmsg_path: raw
                .health
                .kmsg_path
                .map(|p| (!p.is_empty()).then(|| PathBuf::from(p))),
            xid: XidPolicyConfig {
                ignore: raw.health.xid.ignore,
                enable: raw.health.xid.enable,
                disable_all: raw.health.xid.disable_all,
            },
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_str(text: &str) -> Result<Config, ConfigError> {
        parse(Path::new("/etc/gpud/config.yaml"), text)
    }

    #[test]
    fn full_health_section() {
        let config = parse_str(
            "version: v1\nhealth:\n  pollInterval: 2s\n  xidQuietPeriod: 5m\n  kmsgPath: \"\"\n  xid:\n    ignore: [94]\n    enable: [13]\n",
        )
        .unwrap();
        assert_eq!(config.health.poll_interval, Some(Duration::from_secs(2)));
        assert_eq!(
            config.health.xid_quiet_period,
            Some(Duration::from_secs(300))
        );
        assert_eq!(config.health.kmsg_path, Some(None));
        assert_eq!(config.health.xid.ignore, vec![94]);
        assert_eq!(config.health.xid.enable, vec![13]);
    }

    #[test]
    fn json_is_accepted_too() {
        let config = parse_str(r#"{"health": {"pollInterval": "1s"}}"#).unwrap();
        assert_eq!(config.health.poll_interval, Some(Duration::from_secs(1)));
    }

    #[test]
    fn errors_name_file_field_and_value() {
        let err = parse_str("health:\n  pollInterval: soon\n")
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with(
                "/etc/gpud/config.yaml: field health.pollInterval: invalid value \"soon\": "
            ),
            "{err}"
        );
        let err = parse_str("health:\n  polInterval: 1s\n")
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("/etc/gpud/config.yaml: health: unknown field `polInterval`"),
            "{err}"
        );
        let err = parse_str("version: v2\n").unwrap_err().to_string();
        assert_eq!(
            err,
            "/etc/gpud/config.yaml: field version: invalid value \"v2\": this gpud reads version v1"
        );
        let err = parse_str("health:\n  xid:\n    ignore: [0]\n")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("field health.xid: invalid value \"0\""),
            "{err}"
        );
    }
}
