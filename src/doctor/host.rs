//! Reading the host's files under `--host-root`: inside a container the host is mounted at
//! some path (`/host`), and every path a check reads is the host's path under it.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The host's root directory (`/` when the doctor runs on the host itself).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostRoot(PathBuf);

impl HostRoot {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        HostRoot(root.into())
    }

    /// The root itself.
    pub fn root(&self) -> &Path {
        &self.0
    }

    /// Where the host's absolute path `host_path` is in this process's view.
    pub fn path(&self, host_path: &str) -> PathBuf {
        self.0.join(host_path.trim_start_matches('/'))
    }

    /// Whether the host path exists (a dangling link counts: it is there).
    pub fn exists(&self, host_path: &str) -> bool {
        self.path(host_path).symlink_metadata().is_ok()
    }

    /// The file's text, `None` when it cannot be read.
    pub fn read(&self, host_path: &str) -> Option<String> {
        std::fs::read_to_string(self.path(host_path)).ok()
    }

    /// The names in a host directory, sorted; empty when it cannot be read.
    pub fn list(&self, host_dir: &str) -> Vec<String> {
        let Ok(entries) = std::fs::read_dir(self.path(host_dir)) else {
            return Vec::new();
        };
        let mut names: Vec<String> = entries
            .filter_map(Result::ok)
            .filter_map(|e| e.file_name().into_string().ok())
            .collect();
        names.sort();
        names
    }

    /// Loaded kernel modules, from `/proc/modules` (`None` when it cannot be read).
    pub fn modules(&self) -> Option<BTreeSet<String>> {
        let text = self.read("/proc/modules")?;
        Some(
            text.lines()
                .filter_map(|line| line.split_whitespace().next())
                .map(str::to_owned)
                .collect(),
        )
    }

    /// The major number of a character device driver, from `/proc/devices`.
    pub fn char_major(&self, driver: &str) -> Option<u32> {
        let text = self.read("/proc/devices")?;
        let mut in_char = false;
        for line in text.lines() {
            match line.trim() {
                "Character devices:" => in_char = true,
                "Block devices:" => in_char = false,
                entry if in_char => {
                    let mut words = entry.split_whitespace();
                    let major = words.next().and_then(|m| m.parse().ok());
                    if words.next() == Some(driver) {
                        return major;
                    }
                }
                _ => {}
            }
        }
        None
    }

    /// Whether a process with this command name (`/proc/<pid>/comm`) runs on the host.
    pub fn process_running(&self, comm: &str) -> bool {
        !self.processes(comm).is_empty()
    }

    /// The processes with this command name on the host: pid and real UID (from
    /// `/proc/<pid>/status`; `None` when unreadable), by pid.
    pub fn processes(&self, comm: &str) -> Vec<(u32, Option<u32>)> {
        let mut out: Vec<(u32, Option<u32>)> = self
            .list("/proc")
            .iter()
            .filter_map(|name| name.parse::<u32>().ok())
            .filter(|pid| {
                self.read(&format!("/proc/{pid}/comm"))
                    .is_some_and(|text| text.trim() == comm)
            })
            .map(|pid| {
                let uid = self
                    .read(&format!("/proc/{pid}/status"))
                    .and_then(|status| {
                        status
                            .lines()
                            .find_map(|l| l.strip_prefix("Uid:"))
                            .and_then(|ids| ids.split_whitespace().next()?.parse().ok())
                    });
                (pid, uid)
            })
            .collect();
        out.sort_unstable();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_prefixed_and_devices_parsed() {
        let dir = tempfile::tempdir().unwrap();
        let host = HostRoot::new(dir.path());
        assert_eq!(host.path("/proc/devices"), dir.path().join("proc/devices"));
        std::fs::create_dir_all(dir.path().join("proc")).unwrap();
        std::fs::write(
            dir.path().join("proc/devices"),
            "Character devices:\n  1 mem\n195 nvidia-frontend\n195 nvidia\n508 nvidia-uvm\n\nBlock devices:\n  8 nvidia\n",
        )
        .unwrap();
        assert_eq!(host.char_major("nvidia"), Some(195));
        assert_eq!(host.char_major("nvidia-uvm"), Some(508));
        assert_eq!(host.char_major("nvidia-caps"), None);
        std::fs::write(
            dir.path().join("proc/modules"),
            "nvidia_uvm 1 0 - Live 0x0\nnvidia 2 1 nvidia_uvm, Live 0x0\n",
        )
        .unwrap();
        let modules = host.modules().unwrap();
        assert!(modules.contains("nvidia") && modules.contains("nvidia_uvm"));
        assert_eq!(modules.len(), 2);
    }
}
