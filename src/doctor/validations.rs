//! `--write-validations DIR`: the GPU Operator validator's status files, so the operator's
//! components that wait for them (the toolkit for `driver-ready`; the device plugin, GFD, DCGM
//! and the MIG manager for `toolkit-ready`) keep working when gpud replaces the validator.
//!
//! As the validator does, each file is removed first and written only when its checks passed
//! (no check of its set failed); `driver-ready` carries the driver's variables.

use std::path::Path;

use super::env::Driver;
use crate::doctor_report::{Report, Status};

/// The operator's default status directory.
pub const DEFAULT_DIR: &str = "/run/nvidia/validations";

/// Where the GPU Operator's driver container installs the driver.
const CONTAINER_DRIVER_ROOT: &str = "/run/nvidia/driver";

/// Each status file and the checks that must not fail for it (a check that did not run counts
/// as failed: a file is never written on the strength of a check that was skipped by --skip).
const FILES: [(&str, &[&str]); 4] = [
    (
        "driver-ready",
        &[
            "driver.nvml",
            "driver.version",
            "driver.modules",
            "devices.control",
            "devices.gpus",
        ],
    ),
    (
        "toolkit-ready",
        &[
            "driver.nvml",
            "driver.version",
            "driver.modules",
            "devices.control",
            "devices.gpus",
            "runtime.containerd",
            "runtime.crio",
            "runtime.cdi-spec",
        ],
    ),
    ("plugin-ready", &["kubelet.sockets", "kubelet.plugin"]),
    ("nvidia-peermem-ready", &["gpudirect.rdma"]),
];

/// What [`write`] did, for the applet to print.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Outcome {
    pub written: Vec<&'static str>,
    pub removed: Vec<&'static str>,
}

/// The `driver-ready` variables: where the driver is on the host and in this container.
pub fn driver_variables(driver: &Driver, host_root: &Path) -> String {
    let in_container =
        matches!(driver, Driver::Loaded { path, .. } if path.starts_with(CONTAINER_DRIVER_ROOT));
    let root = if in_container {
        CONTAINER_DRIVER_ROOT
    } else {
        "/"
    };
    let ctr = host_root.join(root.trim_start_matches('/'));
    let ctr = ctr.display().to_string();
    let ctr = if ctr.len() > 1 {
        ctr.trim_end_matches('/').to_owned()
    } else {
        ctr
    };
    format!(
        "IS_HOST_DRIVER={}\nNVIDIA_DRIVER_ROOT={root}\nDRIVER_ROOT_CTR_PATH={ctr}\nNVIDIA_DEV_ROOT={root}\nDEV_ROOT_CTR_PATH={ctr}\n",
        !in_container
    )
}

/// Whether every check of `ids` ran and did not fail; `nvidia-peermem-ready` also needs the
/// module itself loaded.
fn passed(report: &Report, file: &str, ids: &[&str], peermem: bool) -> bool {
    let ran_clean = ids
        .iter()
        .all(|id| report.check(id).is_some_and(|c| c.status != Status::Fail));
    let applies = ids.iter().any(|id| {
        report
            .check(id)
            .is_some_and(|c| matches!(c.status, Status::Ok | Status::Warn))
    });
    ran_clean && applies && (file != "nvidia-peermem-ready" || peermem)
}

/// Removes every status file, then writes those whose checks passed.
pub fn write(
    dir: &Path,
    report: &Report,
    driver_variables: &str,
    peermem_loaded: bool,
) -> std::io::Result<Outcome> {
    std::fs::create_dir_all(dir)?;
    let mut outcome = Outcome::default();
    for (file, ids) in FILES {
        let path = dir.join(file);
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
            Err(err) => return Err(err),
        }
        if passed(report, file, ids, peermem_loaded) {
            let contents = if file == "driver-ready" {
                driver_variables
            } else {
                ""
            };
            crate::files::write_atomic(&path, contents.as_bytes(), 0o644)
                .map_err(|err| std::io::Error::other(err.to_string()))?;
            outcome.written.push(file);
        } else {
            outcome.removed.push(file);
        }
    }
    Ok(outcome)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    #[test]
    fn driver_variables_for_host_and_container_drivers() {
        let host = Driver::Loaded {
            path: PathBuf::from("/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"),
            snapshot: Err(String::new()),
            preflight: Err(String::new()),
            mig: Err(String::new()),
            unlisted: Default::default(),
        };
        assert_eq!(
            driver_variables(&host, Path::new("/host")),
            "IS_HOST_DRIVER=true\nNVIDIA_DRIVER_ROOT=/\nDRIVER_ROOT_CTR_PATH=/host\nNVIDIA_DEV_ROOT=/\nDEV_ROOT_CTR_PATH=/host\n"
        );
        let ctr = Driver::Loaded {
            path: PathBuf::from("/run/nvidia/driver/usr/lib64/libnvidia-ml.so.1"),
            snapshot: Err(String::new()),
            preflight: Err(String::new()),
            mig: Err(String::new()),
            unlisted: Default::default(),
        };
        assert_eq!(
            driver_variables(&ctr, Path::new("/")),
            "IS_HOST_DRIVER=false\nNVIDIA_DRIVER_ROOT=/run/nvidia/driver\nDRIVER_ROOT_CTR_PATH=/run/nvidia/driver\nNVIDIA_DEV_ROOT=/run/nvidia/driver\nDEV_ROOT_CTR_PATH=/run/nvidia/driver\n"
        );
    }
}
