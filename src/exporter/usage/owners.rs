//! Process IDs to pods, through the host's `/proc`, remembered while each process lives.
//!
//! NVML reports host PIDs. For each one this reads `<proc-root>/<pid>/stat` for the process's
//! start time, and `<proc-root>/<pid>/cgroup` (see [`super::cgroup`]) only when the PID is new
//! or its start time changed (the PID was reused). A process that started after the NVML read
//! is not the one NVML reported (that one ended and its PID was taken): it is attributed to no
//! pod rather than to the wrong one. A process gone by the time its files are read, or whose
//! files cannot be read, is attributed to no pod. Only the PIDs of the latest cycle are
//! remembered, so memory follows the processes on the GPUs, not the PIDs ever seen.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use super::cgroup::{self, Owner};

/// Owners of the PIDs seen in the latest cycle.
#[derive(Debug)]
pub struct ProcessOwners {
    root: PathBuf,
    /// Clock ticks per second of `/proc`'s times.
    ticks_per_second: u64,
    /// PID → (start time in clock ticks after boot, owner).
    known: HashMap<u32, (u64, Option<Owner>)>,
}

impl ProcessOwners {
    /// Owners read from the `/proc` tree at `root` (the host's `/proc` in a container that
    /// mounts it elsewhere).
    pub fn new(root: PathBuf) -> Self {
        let ticks_per_second = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
            .ok()
            .flatten()
            .and_then(|t| u64::try_from(t).ok())
            .filter(|t| *t > 0)
            .unwrap_or(100);
        ProcessOwners {
            root,
            ticks_per_second,
            known: HashMap::new(),
        }
    }

    /// The time since boot, in clock ticks, now: taken just before NVML is read, so a
    /// process that started later is known not to be the one NVML reported.
    pub fn now(&self) -> Option<u64> {
        let text = std::fs::read_to_string(self.root.join("uptime")).ok()?;
        let seconds: f64 = text.split_whitespace().next()?.parse().ok()?;
        Some((seconds * self.ticks_per_second as f64) as u64)
    }

    /// The owner of each of `pids`, as of `read_at` (from [`ProcessOwners::now`] before the
    /// NVML read; `None`: unknown, no start-time check). Forgets every other PID.
    pub fn resolve(&mut self, pids: &[u32], read_at: Option<u64>) -> HashMap<u32, Option<Owner>> {
        let mut resolved = HashMap::with_capacity(pids.len());
        let mut known = HashMap::with_capacity(pids.len());
        for &pid in pids {
            if resolved.contains_key(&pid) {
                continue;
            }
            let dir = self.root.join(pid.to_string());
            let Some(started) = start_time(&dir) else {
                resolved.insert(pid, None); // ended since the NVML read
                continue;
            };
            // Allow a tick of rounding between /proc/uptime and the start time.
            if read_at.is_some_and(|at| started > at + 1) {
                resolved.insert(pid, None);
                continue;
            }
            let owner = match self.known.remove(&pid) {
                Some((then, owner)) if then == started => owner,
                _ => std::fs::read_to_string(dir.join("cgroup"))
                    .ok()
                    .and_then(|text| cgroup::owner(&text)),
            };
            known.insert(pid, (started, owner.clone()));
            resolved.insert(pid, owner);
        }
        self.known = known;
        resolved
    }

    /// PIDs remembered (those of the latest cycle).
    pub fn remembered(&self) -> usize {
        self.known.len()
    }
}

/// A process's start time after boot, in clock ticks: field 22 of `stat`, counted after the
/// command name, which is in parentheses and may itself hold spaces and parentheses.
fn start_time(dir: &Path) -> Option<u64> {
    let stat = std::fs::read_to_string(dir.join("stat")).ok()?;
    let after_name = &stat[stat.rfind(')')? + 1..];
    // Fields 3.. follow the name; the start time is field 22.
    after_name.split_whitespace().nth(19)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const UID_A: &str = "aaaaaaaa-0000-4000-8000-000000000001";
    const UID_B: &str = "bbbbbbbb-0000-4000-8000-000000000002";
    const ID: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    fn process(root: &Path, pid: u32, started: u64, cgroup: &str) {
        let dir = root.join(pid.to_string());
        std::fs::create_dir_all(&dir).unwrap();
        let fields: Vec<String> = (3..=21).map(|_| "0".to_owned()).collect();
        std::fs::write(
            dir.join("stat"),
            format!("{pid} (python3 (a) b) {} {started} 0 0\n", fields.join(" ")),
        )
        .unwrap();
        std::fs::write(dir.join("cgroup"), cgroup).unwrap();
    }

    fn in_pod(uid: &str) -> String {
        format!("0::/kubepods/besteffort/pod{uid}/{ID}\n")
    }

    #[test]
    fn pids_map_to_pods_and_a_reused_pid_is_read_again() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::write(root.join("uptime"), "1000.50 2000.00\n").unwrap();
        process(root, 10, 500, &in_pod(UID_A));
        process(root, 11, 600, "0::/system.slice/sshd.service\n");
        let mut owners = ProcessOwners::new(root.to_path_buf());
        owners.ticks_per_second = 100;
        let at = owners.now();
        assert_eq!(at, Some(100_050));
        let found = owners.resolve(&[10, 11, 12], at);
        assert_eq!(found[&10].as_ref().unwrap().pod_uid, UID_A);
        assert_eq!(
            found[&10].as_ref().unwrap().container_id.as_deref(),
            Some(ID)
        );
        assert_eq!(found[&11], None, "a host process");
        assert_eq!(found[&12], None, "gone before its files were read");
        assert_eq!(owners.remembered(), 2);

        // The cgroup file is not read again for the same process...
        std::fs::write(root.join("10/cgroup"), in_pod(UID_B)).unwrap();
        assert_eq!(
            owners.resolve(&[10], at)[&10].as_ref().unwrap().pod_uid,
            UID_A
        );
        assert_eq!(owners.remembered(), 1, "PIDs not seen again are forgotten");
        // ...but is for another process with the same PID.
        process(root, 10, 700, &in_pod(UID_B));
        assert_eq!(
            owners.resolve(&[10], at)[&10].as_ref().unwrap().pod_uid,
            UID_B
        );
    }

    #[test]
    fn a_process_younger_than_the_nvml_read_is_not_the_one_it_reported() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::write(root.join("uptime"), "10.00 0\n").unwrap();
        process(root, 42, 5_000, &in_pod(UID_B));
        let mut owners = ProcessOwners::new(root.to_path_buf());
        owners.ticks_per_second = 100;
        let at = owners.now();
        assert_eq!(owners.resolve(&[42], at)[&42], None);
        // Without a read time there is no check.
        assert!(owners.resolve(&[42], None)[&42].is_some());
    }
}
