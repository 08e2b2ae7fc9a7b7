//! MPS for a claim, as NVIDIA's DRA driver runs it: one control daemon per claim, over the
//! claim's GPUs only, in its own folders `<plugins>/<driver>/mps/<claim UID>/{pipe,shm,log}`,
//! started through the same sequence as the device plugin's daemons
//! ([`crate::cuda_mps::server`]): compute mode EXCLUSIVE_PROCESS, `-d` with
//! `CUDA_VISIBLE_DEVICES` = the claim's GPU UUIDs, a bounded wait for its answer, the limits.
//!
//! The workload's CDI edits point it at that daemon: `CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps`
//! with the pipe folder bound there, and the shm folder bound on `/dev/shm`.
//!
//! Claims sharing a GPU by capacity share one daemon over it instead, in a folder named after
//! the GPU ([`ClaimMps::daemon`], [`super::shares`]); the functions here take the folder's
//! name ([`ClaimMps::key`]) where they say `uid`.
//!
//! What a claim's daemon is (GPUs, limit commands) is recorded in the checkpoint, so a repeated
//! prepare, or one after a gpud restart, probes the daemon it started instead of starting a
//! second, and starts it again if it died. Every call blocks; callers use blocking threads.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::opaque::MpsSettings;
use crate::cdi::spec::{ContainerEdits, Mount};
use crate::cuda_mps::server::{self, Launch, Server};
use crate::cuda_mps::shm;
use crate::nvml::Nvml;
use crate::nvml::compute_mode::ComputeMode;

/// Where the workload finds the daemon's pipes.
pub const CONTAINER_PIPE: &str = "/tmp/nvidia-mps";
/// Where the workload's shared memory goes.
pub const CONTAINER_SHM: &str = "/dev/shm";
/// The bind mounts' options, NVIDIA's.
const MOUNT_OPTIONS: [&str; 4] = ["rw", "nosuid", "nodev", "bind"];

/// A claim's control daemon, as the checkpoint records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClaimMps {
    /// GPU UUIDs in `CUDA_VISIBLE_DEVICES` order (NVML index order).
    pub gpus: Vec<String>,
    /// The limit commands sent once it answers.
    pub limits: Vec<String>,
    /// The folder of a daemon shared by the claims sharing its GPU by capacity
    /// ([`super::shares`]); none: the claim's own, named after its UID.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub daemon: Option<String>,
}

impl ClaimMps {
    /// The name of the daemon's folder: the shared daemon's, else claim `uid`'s.
    pub fn key<'a>(&'a self, uid: &'a str) -> &'a str {
        self.daemon.as_deref().unwrap_or(uid)
    }
}

/// `<plugins>/<driver>/mps/<uid>`: the claim's daemon folders.
pub fn root(plugin_dir: &Path, uid: &str) -> PathBuf {
    plugin_dir.join("mps").join(uid)
}

/// The daemon over `gpus` (UUIDs in NVML index order) with `settings`' limits: each GPU's
/// pinned limit (its own by UUID or position, else the default) by the daemon's ordinal, then
/// the thread percentage. A per-device key naming no GPU of the claim is the claim's error.
pub fn plan(gpus: Vec<String>, settings: &MpsSettings) -> Result<ClaimMps, String> {
    for key in settings.pinned_per_device_mib.keys() {
        let known =
            gpus.iter().any(|g| g == key) || key.parse::<usize>().is_ok_and(|i| i < gpus.len());
        if !known {
            return Err(format!(
                "sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit[{key:?}] names no GPU of \
                 the claim (use a GPU UUID, or an index from 0 to {})",
                gpus.len().saturating_sub(1)
            ));
        }
    }
    let mut limits = Vec::new();
    for (ordinal, uuid) in gpus.iter().enumerate() {
        let per_device = &settings.pinned_per_device_mib;
        let limit = per_device
            .get(uuid)
            .or_else(|| per_device.get(&ordinal.to_string()))
            .or(settings.pinned_default_mib.as_ref());
        if let Some(mib) = limit {
            limits.push(format!(
                "set_default_device_pinned_mem_limit {ordinal} {mib}M"
            ));
        }
    }
    if let Some(percentage) = settings.active_thread_percentage {
        limits.push(format!("set_default_active_thread_percentage {percentage}"));
    }
    Ok(ClaimMps {
        gpus,
        limits,
        daemon: None,
    })
}

/// The claim's daemon.
pub fn server(launch: &Launch, plugin_dir: &Path, uid: &str, mps: &ClaimMps) -> Server {
    let root = root(plugin_dir, uid);
    Server::new(
        &launch.binary,
        mps.gpus.clone(),
        root.join("pipe"),
        root.join("log"),
        mps.limits.clone(),
    )
}

/// Refuses a new claim's MPS on a GPU whose compute mode is not DEFAULT: another MPS daemon
/// (the device plugin's `sharing.mps`) or an administrator set it, and the claim's daemon
/// would take the GPU from under it, then set it to DEFAULT on unprepare. A mode NVML cannot
/// read is left to the start, which sets it. Blocks on the driver.
pub fn check_modes(nvml: &Nvml, mps: &ClaimMps) -> Result<(), String> {
    for gpu in &mps.gpus {
        match nvml.compute_mode(gpu) {
            Ok(ComputeMode::Default) | Err(_) => {}
            Ok(mode) => {
                return Err(format!(
                    "GPU {gpu} is in compute mode {mode}, not DEFAULT: another MPS control \
                     daemon (the device plugin's sharing.mps) or an administrator set it, and \
                     this claim's daemon would take the GPU from under it; give the claim other \
                     GPUs, or set this one back to DEFAULT"
                ));
            }
        }
    }
    Ok(())
}

/// Makes sure the claim's daemon runs: one that answers is left alone (`Ok(false)`), else the
/// shm folder is prepared and the daemon started (`Ok(true)`). The error is the claim's.
pub fn ensure(
    launch: &Launch,
    nvml: &Nvml,
    plugin_dir: &Path,
    uid: &str,
    mps: &ClaimMps,
) -> Result<bool, String> {
    let server = server(launch, plugin_dir, uid, mps);
    if server.probe().is_ok() {
        return Ok(false);
    }
    let started = shm::prepare(&root(plugin_dir, uid).join("shm"), launch.skip_shm_mount)
        .map_err(|e| crate::logging::error_chain(&e))
        .and_then(|()| {
            server
                .start(nvml)
                .map_err(|e| crate::logging::error_chain(&e))
        });
    started.map(|()| true).map_err(|why| {
        format!(
            "cannot start the claim's MPS control daemon over {}: {why}",
            mps.gpus.join(",")
        )
    })
}

/// Stops the claim's daemon: `quit`, compute mode DEFAULT on its GPUs except those in
/// `still_mps` (kept in MPS by another prepared claim), the shm tmpfs unmounted and the
/// folders removed. Failures are logged: stopping goes on with the next step.
pub fn stop(
    launch: &Launch,
    nvml: &Nvml,
    plugin_dir: &Path,
    uid: &str,
    mps: &ClaimMps,
    still_mps: &[String],
) {
    let server = server(launch, plugin_dir, uid, mps);
    server.quit();
    let back: Vec<String> = mps
        .gpus
        .iter()
        .filter(|g| !still_mps.contains(g))
        .cloned()
        .collect();
    if let Err(err) = server::set_mode(nvml, &back, ComputeMode::Default) {
        tracing::error!(claim = %uid, error = %crate::logging::error_chain(&err),
            "Cannot set the claim's GPUs back to compute mode DEFAULT; `gpud doctor` reports it");
    }
    let root = root(plugin_dir, uid);
    shm::release(&root.join("shm"));
    if let Err(err) = std::fs::remove_dir_all(&root)
        && err.kind() != std::io::ErrorKind::NotFound
    {
        tracing::warn!(path = %root.display(), error = %err, "Cannot remove the claim's MPS folders");
    }
}

/// The workload's CDI edits for the claim's daemon.
pub fn edits(plugin_dir: &Path, uid: &str) -> ContainerEdits {
    let root = root(plugin_dir, uid);
    let bind = |host: PathBuf, container: &str| Mount {
        host_path: host.to_string_lossy().into_owned(),
        container_path: container.to_owned(),
        options: MOUNT_OPTIONS.map(str::to_owned).to_vec(),
        mount_type: None,
    };
    ContainerEdits {
        env: vec![format!("CUDA_MPS_PIPE_DIRECTORY={CONTAINER_PIPE}")],
        mounts: vec![
            bind(root.join("shm"), CONTAINER_SHM),
            bind(root.join("pipe"), CONTAINER_PIPE),
        ],
        ..ContainerEdits::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_device_limits_override_the_default_by_uuid_or_position() {
        let settings = MpsSettings {
            active_thread_percentage: Some(25),
            pinned_default_mib: Some(1024),
            pinned_per_device_mib: [("1".to_owned(), 512), ("GPU-c".to_owned(), 256)]
                .into_iter()
                .collect(),
        };
        let gpus = vec!["GPU-a".to_owned(), "GPU-b".into(), "GPU-c".into()];
        assert_eq!(
            plan(gpus.clone(), &settings).unwrap().limits,
            [
                "set_default_device_pinned_mem_limit 0 1024M",
                "set_default_device_pinned_mem_limit 1 512M",
                "set_default_device_pinned_mem_limit 2 256M",
                "set_default_active_thread_percentage 25",
            ]
        );
        let stray = MpsSettings {
            pinned_per_device_mib: [("3".to_owned(), 1)].into_iter().collect(),
            ..MpsSettings::default()
        };
        assert_eq!(
            plan(gpus, &stray).unwrap_err(),
            "sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit[\"3\"] names no GPU of the \
             claim (use a GPU UUID, or an index from 0 to 2)"
        );
        assert_eq!(
            plan(vec!["GPU-a".into()], &MpsSettings::default())
                .unwrap()
                .limits,
            Vec::<String>::new()
        );
    }
}
