//! `--only` and `--skip`: which checks run, by check id (`gpu.ecc`) or group (`gpu`), and the
//! checks the selected ones depend on.
//!
//! Every check that reads NVML depends on [`NVML_CHECK`]: when NVML fails or hangs, that check
//! is the one that fails, and the others skip ("needs NVML"). `--only gpu` alone would report
//! nothing but skips and exit 0 on a node whose driver hangs, so it runs `driver.nvml` too,
//! unless `--skip` names it.

use super::checks::{CATALOG, Check};

/// The check that says whether NVML works.
pub const NVML_CHECK: &str = "driver.nvml";

/// The checks asked for: all of them, less `skip`, limited to `only` when it is not empty.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selection {
    only: Vec<String>,
    skip: Vec<String>,
}

impl Selection {
    /// Checks every name against the catalog; an unknown one is an error naming it and the
    /// groups that exist.
    pub fn new(only: Vec<String>, skip: Vec<String>) -> Result<Self, String> {
        for name in only.iter().chain(&skip) {
            let known = CATALOG
                .iter()
                .any(|check| check.id == name || check.group() == name);
            if !known {
                return Err(format!(
                    "unknown check or group {name:?} (groups: {}; `gpud doctor --list` shows every check)",
                    groups().join(", ")
                ));
            }
        }
        Ok(Selection { only, skip })
    }

    /// Whether check `id` was asked for.
    pub fn includes(&self, id: &str) -> bool {
        (self.only.is_empty() || named(&self.only, id)) && !named(&self.skip, id)
    }

    /// The checks that run: those asked for, and [`NVML_CHECK`] when one of them reads NVML
    /// (unless it is skipped by name or group), in catalog order.
    pub fn checks(&self) -> impl Iterator<Item = &'static Check> + '_ {
        let nvml_needed = CATALOG.iter().any(|c| c.needs_nvml && self.includes(c.id));
        CATALOG.iter().filter(move |check| {
            self.includes(check.id)
                || (check.id == NVML_CHECK && nvml_needed && !named(&self.skip, check.id))
        })
    }
}

/// Whether `list` names check `id` or its group.
fn named(list: &[String], id: &str) -> bool {
    let group = id.split('.').next().unwrap_or(id);
    list.iter().any(|n| n == id || n == group)
}

/// The check groups, in catalog order.
pub fn groups() -> Vec<&'static str> {
    let mut groups: Vec<&'static str> = Vec::new();
    for check in CATALOG {
        if !groups.contains(&check.group()) {
            groups.push(check.group());
        }
    }
    groups
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_and_skip_by_id_or_group() {
        let all = Selection::default();
        assert!(all.includes("gpu.ecc"));
        let gpu = Selection::new(vec!["gpu".into()], vec!["gpu.ecc".into()]).unwrap();
        assert!(gpu.includes("gpu.pcie"));
        assert!(!gpu.includes("gpu.ecc"));
        assert!(!gpu.includes("driver.nvml"));
        let ids = |s: &Selection| s.checks().map(|c| c.id).collect::<Vec<_>>();
        // `driver.nvml` comes along with the NVML checks it stands for, first, as in the catalog.
        let pulled = ids(&gpu);
        assert_eq!(pulled.first(), Some(&NVML_CHECK), "{pulled:?}");
        assert!(pulled.contains(&"gpu.pcie") && !pulled.contains(&"gpu.ecc"));
        let skipped = Selection::new(vec!["gpu".into()], vec!["driver.nvml".into()]).unwrap();
        assert!(!ids(&skipped).contains(&NVML_CHECK));
        let no_nvml = Selection::new(vec!["devices.control".into()], vec![]).unwrap();
        assert_eq!(ids(&no_nvml), ["devices.control"]);
        let err = Selection::new(vec!["gpus".into()], vec![]).unwrap_err();
        assert!(
            err.starts_with("unknown check or group \"gpus\" (groups: driver, "),
            "{err}"
        );
    }
}
