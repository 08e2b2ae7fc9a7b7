//! Telling the runtime to read its new config: `systemctl restart <unit>`, SIGHUP to the
//! daemon where it reloads its config on that signal, or nothing.
//!
//! dockerd reloads daemon.json on SIGHUP (`runtimes`, `default-runtime` among what it reloads)
//! and CRI-O re-reads its config files; containerd has no reload (SIGHUP is not one of the
//! signals it handles), so `signal` is refused for it before anything is written. The kubelet
//! is never restarted: it follows the runtime's socket by itself.
//!
//! From a container whose view of the host is a mount (`--host-root /host`), `systemd` enters
//! the host's root first (chroot), so the host's own `systemctl` talks to the host's systemd
//! through its socket under `/run/systemd`: a scratch image carries no systemctl and no D-Bus
//! client. This is the last thing the command does, so nothing after it needs the image's
//! files.

use std::path::Path;
use std::process::Command;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use super::Runtime;

/// How the runtime is told.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum RestartMode {
    /// `systemctl restart <unit>`.
    Systemd,
    /// SIGHUP to the daemon (dockerd, crio); refused for containerd.
    Signal,
    /// Leave it to the operator.
    None,
}

/// Why the runtime could not be told.
#[derive(Debug, thiserror::Error)]
pub enum RestartError {
    /// The combination cannot work; nothing has been written.
    #[error("{0}")]
    Refused(String),
    /// The restart or signal failed after the file was written.
    #[error("{0}")]
    Failed(String),
}

/// The systemd unit of each runtime.
pub fn default_unit(runtime: Runtime) -> &'static str {
    match runtime {
        Runtime::Containerd => "containerd",
        Runtime::Crio => "crio",
        Runtime::Docker => "docker",
    }
}

/// The daemon's process name (`/proc/<pid>/comm`), for `signal`.
fn daemon(runtime: Runtime) -> &'static str {
    match runtime {
        Runtime::Containerd => "containerd",
        Runtime::Crio => "crio",
        Runtime::Docker => "dockerd",
    }
}

/// Refuses what cannot work, before anything is written.
pub fn check(runtime: Runtime, mode: RestartMode, unit: &str) -> Result<(), RestartError> {
    if mode == RestartMode::Signal && runtime == Runtime::Containerd {
        return Err(RestartError::Refused(
            "containerd does not reload its config on a signal; use --restart-mode=systemd (or none and restart it yourself)".to_owned(),
        ));
    }
    let name = unit.trim_end_matches(".service");
    if mode == RestartMode::Systemd && name == "kubelet" {
        return Err(RestartError::Refused(
            "gpud never restarts the kubelet; name the container runtime's unit with --restart-unit".to_owned(),
        ));
    }
    Ok(())
}

/// The PATH `systemctl` is looked up in inside the host's root: the container's own PATH
/// names the image's folders.
const HOST_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Where the runtime lives, as this process sees it.
#[derive(Debug, Clone, Copy)]
pub struct Host<'a> {
    /// The host's `/` (not `/`: a container's mount of it; `systemd` enters it).
    pub root: &'a Path,
    /// The procfs `signal` looks for the daemon in.
    pub proc_root: &'a Path,
}

/// Tells `runtime` in `mode`; a line saying what was done.
pub fn restart(
    runtime: Runtime,
    mode: RestartMode,
    unit: &str,
    host: Host<'_>,
) -> Result<Option<String>, RestartError> {
    check(runtime, mode, unit)?;
    let proc_root = host.proc_root;
    match mode {
        RestartMode::None => Ok(None),
        RestartMode::Systemd => {
            let mut systemctl = Command::new("systemctl");
            if host.root != Path::new("/") {
                enter(host.root)?;
                systemctl.env("PATH", HOST_PATH);
            }
            let status = systemctl.args(["restart", unit]).status().map_err(|err| {
                RestartError::Failed(format!("cannot run systemctl restart {unit}: {err}"))
            })?;
            if !status.success() {
                return Err(RestartError::Failed(format!(
                    "systemctl restart {unit} failed ({status}); see journalctl -u {unit}"
                )));
            }
            Ok(Some(format!("restarted {unit} (systemctl restart {unit})")))
        }
        RestartMode::Signal => {
            let name = daemon(runtime);
            let pids = find(proc_root, name);
            if pids.is_empty() {
                return Err(RestartError::Failed(format!(
                    "no {name} process found under {}; restart {name} yourself",
                    proc_root.display()
                )));
            }
            for pid in &pids {
                kill(Pid::from_raw(*pid), Signal::SIGHUP).map_err(|err| {
                    RestartError::Failed(format!("cannot send SIGHUP to {name} ({pid}): {err}"))
                })?;
            }
            Ok(Some(format!("sent SIGHUP to {name} (pid {pids:?})")))
        }
    }
}

/// Makes `root` this process's `/`.
fn enter(root: &Path) -> Result<(), RestartError> {
    nix::unistd::chroot(root)
        .map_err(std::io::Error::from)
        .and_then(|()| std::env::set_current_dir("/"))
        .map_err(|err| {
            RestartError::Failed(format!(
                "cannot enter the host's root {} to run its systemctl: {err} (the container \
                 needs to be privileged, or to have CAP_SYS_CHROOT)",
                root.display()
            ))
        })
}

/// The pids whose `comm` is `name` under `proc_root`.
fn find(proc_root: &Path, name: &str) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir(proc_root) else {
        return Vec::new();
    };
    let mut pids: Vec<i32> = entries
        .flatten()
        .filter_map(|entry| {
            let pid: i32 = entry.file_name().to_str()?.parse().ok()?;
            let comm = std::fs::read_to_string(entry.path().join("comm")).ok()?;
            (comm.trim_end() == name).then_some(pid)
        })
        .collect();
    pids.sort_unstable();
    pids
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signal_is_refused_for_containerd_and_the_kubelet_is_never_restarted() {
        let err = check(Runtime::Containerd, RestartMode::Signal, "containerd").unwrap_err();
        assert!(err.to_string().contains("--restart-mode=systemd"), "{err}");
        assert!(check(Runtime::Docker, RestartMode::Systemd, "kubelet.service").is_err());
        assert!(check(Runtime::Docker, RestartMode::Signal, "docker").is_ok());
    }

    #[test]
    fn the_daemon_is_found_by_its_process_name() {
        let dir = tempfile::tempdir().unwrap();
        for (pid, comm) in [
            ("10", "dockerd\n"),
            ("11", "containerd\n"),
            ("12", "dockerd\n"),
        ] {
            std::fs::create_dir(dir.path().join(pid)).unwrap();
            std::fs::write(dir.path().join(pid).join("comm"), comm).unwrap();
        }
        std::fs::create_dir(dir.path().join("self")).unwrap();
        assert_eq!(find(dir.path(), "dockerd"), [10, 12]);
        assert!(find(dir.path(), "crio").is_empty());
        let err = restart(
            Runtime::Crio,
            RestartMode::Signal,
            "crio",
            Host {
                root: Path::new("/"),
                proc_root: dir.path(),
            },
        )
        .unwrap_err();
        assert!(
            err.to_string().starts_with("no crio process found"),
            "{err}"
        );
    }
}
