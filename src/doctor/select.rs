//! `--only` and `--skip`: which checks run, by check id (`gpu.ecc`) or group (`gpu`).

use super::checks::CATALOG;

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

    /// Whether check `id` runs.
    pub fn includes(&self, id: &str) -> bool {
        let group = id.split('.').next().unwrap_or(id);
        let named = |list: &[String]| list.iter().any(|n| n == id || n == group);
        (self.only.is_empty() || named(&self.only)) && !named(&self.skip)
    }
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
        let err = Selection::new(vec!["gpus".into()], vec![]).unwrap_err();
        assert!(
            err.starts_with("unknown check or group \"gpus\" (groups: driver, "),
            "{err}"
        );
    }
}
