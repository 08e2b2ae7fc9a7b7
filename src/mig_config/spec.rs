//! mig-parted's config file, `version: v1`: the schema and its validation rules.
//!
//! ```yaml
//! version: v1
//! mig-configs:
//!   <label>:
//!     - device-filter: "0x20B210DE" | ["0x20B210DE", ...]   # optional
//!       devices: all | [0, 1]
//!       mig-enabled: true
//!       mig-devices: {"1g.10gb": 7}                         # {} or absent when disabled
//! ```
//!
//! Unknown fields anywhere are refused, as mig-parted refuses them; every error names the
//! file, the config label, the entry and the value.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::profile::ProfileName;
use crate::files;

/// A whole config file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Spec {
    pub version: String,
    #[serde(rename = "mig-configs")]
    pub mig_configs: BTreeMap<String, Vec<Entry>>,
}

/// One entry of a config: which GPUs, and what they should be.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Entry {
    #[serde(
        rename = "device-filter",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub device_filter: Option<DeviceFilter>,
    pub devices: Devices,
    #[serde(rename = "mig-enabled")]
    pub mig_enabled: bool,
    #[serde(
        rename = "mig-devices",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub mig_devices: Option<BTreeMap<String, u32>>,
}

/// `device-filter`: one PCI id or a list of them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum DeviceFilter {
    One(String),
    Many(Vec<String>),
}

impl DeviceFilter {
    /// The ids in the filter.
    pub fn ids(&self) -> Vec<&str> {
        match self {
            DeviceFilter::One(id) => vec![id.as_str()],
            DeviceFilter::Many(ids) => ids.iter().map(String::as_str).collect(),
        }
    }
}

/// `devices`: `all` or GPU indices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Devices {
    All,
    Indices(Vec<u32>),
}

impl Serialize for Devices {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Devices::All => s.serialize_str("all"),
            Devices::Indices(list) => list.serialize(s),
        }
    }
}

impl<'de> Deserialize<'de> for Devices {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Word(String),
            List(Vec<u32>),
        }
        match Raw::deserialize(d)? {
            Raw::Word(w) if w == "all" => Ok(Devices::All),
            Raw::Word(w) => Err(serde::de::Error::custom(format!(
                "devices: {w:?} is neither \"all\" nor a list of GPU indices"
            ))),
            Raw::List(list) => Ok(Devices::Indices(list)),
        }
    }
}

/// A parsed PCI id filter: `0xDDDDVVVV`, optionally `:0xSSSSVVVV` for the subsystem.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PciFilter {
    pub device: u32,
    pub subsystem: Option<u32>,
}

impl PciFilter {
    /// Parses one filter id.
    pub fn parse(text: &str) -> Option<PciFilter> {
        let hex = |t: &str| {
            let digits = t.strip_prefix("0x").or_else(|| t.strip_prefix("0X"))?;
            (digits.len() == 8).then(|| u32::from_str_radix(digits, 16).ok())?
        };
        match text.split_once(':') {
            None => Some(PciFilter {
                device: hex(text)?,
                subsystem: None,
            }),
            Some((device, subsystem)) => Some(PciFilter {
                device: hex(device)?,
                subsystem: Some(hex(subsystem)?),
            }),
        }
    }

    /// Whether a GPU with these ids matches.
    pub fn matches(&self, device: u32, subsystem: u32) -> bool {
        self.device == device && self.subsystem.is_none_or(|s| s == subsystem)
    }
}

/// A config file that does not validate.
#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    #[error(transparent)]
    Read(#[from] files::ReadError),
    #[error("{source_name}: {message}")]
    Invalid {
        source_name: String,
        message: String,
    },
}

/// Where a config came from, for messages.
#[derive(Debug, Clone)]
pub enum Source {
    File(PathBuf),
    Stdin,
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::File(path) => write!(f, "{}", path.display()),
            Source::Stdin => f.write_str("<stdin>"),
        }
    }
}

impl Spec {
    /// Reads and validates a config file through the shared size and nesting limits.
    pub fn load(path: &Path) -> Result<Spec, SpecError> {
        let text = files::read_yaml(path)?;
        Spec::parse(&text, &Source::File(path.to_path_buf()))
    }

    /// Parses and validates config text.
    pub fn parse(text: &str, source: &Source) -> Result<Spec, SpecError> {
        let invalid = |message: String| SpecError::Invalid {
            source_name: source.to_string(),
            message,
        };
        let spec: Spec = serde_yaml_ng::from_str(text)
            .map_err(|err| invalid(format!("not a mig-parted v1 config: {err}")))?;
        spec.validate().map_err(invalid)?;
        Ok(spec)
    }

    /// mig-parted's validation rules.
    fn validate(&self) -> Result<(), String> {
        if self.version != "v1" {
            return Err(format!(
                "version: unknown version {:?} (only \"v1\" exists)",
                self.version
            ));
        }
        if self.mig_configs.is_empty() {
            return Err("mig-configs: no config labels (at least one is needed)".into());
        }
        for (label, entries) in &self.mig_configs {
            if entries.is_empty() {
                return Err(format!(
                    "mig-configs.{label}: no entries (at least one is needed)"
                ));
            }
            for (i, entry) in entries.iter().enumerate() {
                entry
                    .validate()
                    .map_err(|why| format!("mig-configs.{label}[{i}].{why}"))?;
            }
        }
        Ok(())
    }

    /// The entries of `label`, or the only label when `label` is `None`.
    pub fn select(&self, label: Option<&str>) -> Result<(&str, &[Entry]), String> {
        match label {
            Some(label) => self
                .mig_configs
                .get_key_value(label)
                .map(|(k, v)| (k.as_str(), v.as_slice()))
                .ok_or_else(|| {
                    format!(
                        "selected config {label:?} not present in the file (it has: {})",
                        self.labels()
                    )
                }),
            None if self.mig_configs.len() == 1 => self
                .mig_configs
                .iter()
                .next()
                .map(|(k, v)| (k.as_str(), v.as_slice()))
                .ok_or_else(|| "no config labels".to_string()),
            None => Err(format!(
                "the file has {} configs ({}): name one with -c/--selected-config",
                self.mig_configs.len(),
                self.labels()
            )),
        }
    }

    fn labels(&self) -> String {
        let labels: Vec<&str> = self.mig_configs.keys().map(String::as_str).collect();
        labels.join(", ")
    }
}

impl Entry {
    fn validate(&self) -> Result<(), String> {
        if let Some(filter) = &self.device_filter {
            for id in filter.ids() {
                if PciFilter::parse(id).is_none() {
                    return Err(format!(
                        "device-filter: {id:?} is not a PCI id like \"0x20B210DE\" (device id, \
                         then vendor id) or \"0x20B210DE:0x147E10DE\" (with the subsystem)"
                    ));
                }
            }
        }
        match (&self.mig_devices, self.mig_enabled) {
            (Some(devices), false) if !devices.is_empty() => {
                return Err(
                    "mig-devices: must be empty or absent when mig-enabled is false".into(),
                );
            }
            (None, true) => {
                return Err("mig-devices: required when mig-enabled is true ({} for none)".into());
            }
            _ => {}
        }
        if let Some(devices) = &self.mig_devices {
            for name in devices.keys() {
                ProfileName::parse(name).map_err(|why| format!("mig-devices: {why}"))?;
            }
            if !devices.is_empty() && devices.values().all(|&n| n == 0) {
                return Err("mig-devices: every count is 0 (use {} for no devices)".into());
            }
        }
        Ok(())
    }

    /// The MIG devices this entry asks for, without zero counts.
    pub fn wanted(&self) -> BTreeMap<String, u32> {
        self.mig_devices
            .iter()
            .flatten()
            .filter(|(_, n)| **n > 0)
            .map(|(k, &n)| (k.clone(), n))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Spec, String> {
        Spec::parse(text, &Source::Stdin).map_err(|e| e.to_string())
    }

    #[test]
    fn accepts_mig_parted_shapes() {
        let spec = parse(
            "version: v1\nmig-configs:\n  a:\n    - devices: all\n      mig-enabled: false\n  \
             b:\n    - device-filter: [\"0x20B210DE\", \"0x233010DE:0x16C110DE\"]\n      \
             devices: [0, 1]\n      mig-enabled: true\n      mig-devices: {\"1g.10gb\": 7}\n  \
             c:\n    - device-filter: \"0x20B710DE\"\n      devices: all\n      mig-enabled: true\n      \
             mig-devices: {}\n",
        )
        .unwrap();
        let (label, entries) = spec.select(Some("b")).unwrap();
        assert_eq!(label, "b");
        assert_eq!(entries[0].devices, Devices::Indices(vec![0, 1]));
        assert_eq!(spec.mig_configs["c"][0].wanted(), BTreeMap::new());
    }

    #[test]
    fn refuses_what_mig_parted_refuses() {
        let cases = [
            (
                "version: v2\nmig-configs: {a: [{devices: all, mig-enabled: false}]}",
                "<stdin>: version: unknown version \"v2\" (only \"v1\" exists)",
            ),
            (
                "version: v1\nmig-configs: {}",
                "<stdin>: mig-configs: no config labels (at least one is needed)",
            ),
            (
                "version: v1\nmig-configs: {a: []}",
                "<stdin>: mig-configs.a: no entries (at least one is needed)",
            ),
            (
                "version: v1\nmig-configs: {a: [{devices: all, mig-enabled: false, mig-devices: {1g.10gb: 1}}]}",
                "<stdin>: mig-configs.a[0].mig-devices: must be empty or absent when mig-enabled is false",
            ),
            (
                "version: v1\nmig-configs: {a: [{devices: all, mig-enabled: true}]}",
                "<stdin>: mig-configs.a[0].mig-devices: required when mig-enabled is true ({} for none)",
            ),
            (
                "version: v1\nmig-configs: {a: [{devices: all, mig-enabled: true, mig-devices: {1g.10gb: 0}}]}",
                "<stdin>: mig-configs.a[0].mig-devices: every count is 0 (use {} for no devices)",
            ),
            (
                "version: v1\nmig-configs: {a: [{device-filter: \"0x20B2\", devices: all, mig-enabled: false}]}",
                "<stdin>: mig-configs.a[0].device-filter: \"0x20B2\" is not a PCI id like \"0x20B210DE\" (device id, then vendor id) or \"0x20B210DE:0x147E10DE\" (with the subsystem)",
            ),
        ];
        for (text, want) in cases {
            assert_eq!(parse(text).unwrap_err(), want, "{text}");
        }
        let unknown =
            parse("version: v1\nmig-configs: {a: [{devices: all, mig-enabled: false, extra: 1}]}")
                .unwrap_err();
        assert!(unknown.contains("unknown field `extra`"), "{unknown}");
        let bad_devices =
            parse("version: v1\nmig-configs: {a: [{devices: some, mig-enabled: false}]}")
                .unwrap_err();
        assert!(
            bad_devices.starts_with("<stdin>: not a mig-parted v1 config:"),
            "{bad_devices}"
        );
        let bad_profile = parse(
            "version: v1\nmig-configs: {a: [{devices: all, mig-enabled: true, mig-devices: {1x.10gb: 1}}]}",
        )
        .unwrap_err();
        assert!(
            bad_profile.starts_with("<stdin>: mig-configs.a[0].mig-devices: \"1x.10gb\""),
            "{bad_profile}"
        );
    }

    #[test]
    fn selection_rules() {
        let one = parse("version: v1\nmig-configs: {only: [{devices: all, mig-enabled: false}]}")
            .unwrap();
        assert_eq!(one.select(None).unwrap().0, "only");
        let two = parse(
            "version: v1\nmig-configs: {a: [{devices: all, mig-enabled: false}], b: [{devices: all, mig-enabled: false}]}",
        )
        .unwrap();
        assert_eq!(
            two.select(None).unwrap_err(),
            "the file has 2 configs (a, b): name one with -c/--selected-config"
        );
        assert_eq!(
            two.select(Some("c")).unwrap_err(),
            "selected config \"c\" not present in the file (it has: a, b)"
        );
    }

    #[test]
    fn pci_filters() {
        let f = PciFilter::parse("0x20B210DE").unwrap();
        assert!(f.matches(0x20B2_10DE, 0x1234_10DE));
        let s = PciFilter::parse("0x20B210DE:0x147E10DE").unwrap();
        assert!(s.matches(0x20B2_10DE, 0x147E_10DE));
        assert!(!s.matches(0x20B2_10DE, 0x1234_10DE));
        assert!(PciFilter::parse("20B210DE").is_none());
    }
}
