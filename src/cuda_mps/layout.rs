//! NVIDIA's MPS host layout under `mpsRoot`, the contract between whoever runs the control
//! daemons and whoever hands their clients out: `<root>/<resource>/pipe` (the daemon's
//! `CUDA_MPS_PIPE_DIRECTORY`), `<root>/<resource>/log`, `<root>/<resource>/.started` (written
//! once the daemon answers and its limits are set), the global `<root>/.ready`, and
//! `<root>/shm`, a tmpfs the containers get as `/dev/shm`. The layout is NVIDIA's, so a node can
//! switch between NVIDIA's daemon and gpud's.
//!
//! The `.started` marker is the contract: the MPS subsystem writes it after a daemon's start
//! sequence and removes it while the daemon is down; the device plugin serves an MPS resource
//! only while it exists, whether both run in one process or in two containers.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::sync::watch;

/// Where containers see the MPS root (NVIDIA's `mps.ContainerRoot`).
pub const CONTAINER_ROOT: &str = "/mps";
/// Where containers get the MPS shared memory.
pub const CONTAINER_SHM: &str = "/dev/shm";
/// The environment variable clients find their daemon by.
pub const PIPE_ENV: &str = "CUDA_MPS_PIPE_DIRECTORY";
/// How often the device plugin looks at the `.started` markers.
pub const MARKER_POLL: Duration = Duration::from_millis(250);

/// The folder of one resource's daemon: `<root>/<resource>` (e.g. `<root>/nvidia.com/gpu`).
pub fn resource_dir(root: &Path, resource: &str) -> PathBuf {
    root.join(resource)
}

/// The daemon's pipe directory.
pub fn pipe_dir(root: &Path, resource: &str) -> PathBuf {
    resource_dir(root, resource).join("pipe")
}

/// The daemon's log directory.
pub fn log_dir(root: &Path, resource: &str) -> PathBuf {
    resource_dir(root, resource).join("log")
}

/// The marker that says the daemon of `resource` is up and configured.
pub fn started_marker(root: &Path, resource: &str) -> PathBuf {
    resource_dir(root, resource).join(".started")
}

/// The marker that says every daemon of the node was started.
pub fn ready_marker(root: &Path) -> PathBuf {
    root.join(".ready")
}

/// The shared-memory tmpfs.
pub fn shm_dir(root: &Path) -> PathBuf {
    root.join("shm")
}

/// The resources (of `names`) whose `.started` marker exists under `root`.
pub fn started(root: &Path, names: &[String]) -> BTreeSet<String> {
    names
        .iter()
        .filter(|name| started_marker(root, name).exists())
        .cloned()
        .collect()
}

/// Follows the `.started` markers of `names` under `root`: the receiver holds the resources
/// whose daemon is up, updated within [`MARKER_POLL`] of a change, until it is dropped.
pub fn watch_started(root: PathBuf, names: Vec<String>) -> watch::Receiver<BTreeSet<String>> {
    let initial = started(&root, &names);
    crate::daemon::poll::follow(initial, MARKER_POLL, move || Some(started(&root, &names)))
}
