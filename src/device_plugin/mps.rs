//! MPS on the device plugin's side: the host layout the MPS control daemons keep under
//! `mpsRoot`, what Allocate adds for an MPS-shared resource, and which resources' daemons are
//! up.
//!
//! The layout is NVIDIA's, so a node can switch between NVIDIA's daemon and gpud's:
//! `<root>/<resource>/pipe` (the daemon's `CUDA_MPS_PIPE_DIRECTORY`), `<root>/<resource>/log`,
//! `<root>/<resource>/.started` (written once the daemon answers and its limits are set), the
//! global `<root>/.ready`, and `<root>/shm`, a tmpfs the containers get as `/dev/shm`.
//!
//! The `.started` marker is the contract between the two sides: the control daemon writes it
//! after its start sequence and removes it while its daemon is down, and the device plugin
//! serves an MPS resource only while it exists. It works the same whether both run in one
//! `gpud run` or as separate applets in separate containers.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::sync::watch;

use crate::proto::deviceplugin::{ContainerAllocateResponse, Mount};

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

/// Adds NVIDIA's MPS edits to an Allocate response: the pipe directory in the environment,
/// and the resource's pipe directory and the shm tmpfs mounted from the host.
pub fn edit_response(response: &mut ContainerAllocateResponse, host_root: &Path, resource: &str) {
    let container_pipe = pipe_dir(Path::new(CONTAINER_ROOT), resource)
        .to_string_lossy()
        .into_owned();
    response
        .envs
        .insert(PIPE_ENV.to_owned(), container_pipe.clone());
    response.mounts.push(Mount {
        container_path: container_pipe,
        host_path: pipe_dir(host_root, resource).to_string_lossy().into_owned(),
        read_only: false,
    });
    response.mounts.push(Mount {
        container_path: CONTAINER_SHM.to_owned(),
        host_path: shm_dir(host_root).to_string_lossy().into_owned(),
        read_only: false,
    });
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

/// The `.started` markers the device plugin follows: those of the MPS-shared resources of the
/// settings in force, re-watched when the settings change which they are.
#[derive(Debug, Default)]
pub struct Markers {
    watched: Option<(PathBuf, Vec<String>)>,
    /// Dropping it (the settings changed) ends the old watch.
    started: Option<watch::Receiver<BTreeSet<String>>>,
}

impl Markers {
    /// Follows the markers `settings` call for (none without MPS).
    pub fn follow(&mut self, settings: &super::settings::Settings) {
        let wanted = settings.mps_root.as_ref().map(|root| {
            let names = settings
                .sharing
                .iter()
                .map(|s| s.rename.clone().unwrap_or_else(|| s.name.clone()))
                .collect::<Vec<_>>();
            (root.clone(), names)
        });
        if wanted == self.watched {
            return;
        }
        self.started = wanted
            .clone()
            .map(|(root, names)| watch_started(root, names));
        self.watched = wanted;
    }

    /// The MPS resources whose daemon is up now.
    pub fn current(&mut self) -> BTreeSet<String> {
        self.started
            .as_mut()
            .map(|rx| rx.borrow_and_update().clone())
            .unwrap_or_default()
    }

    /// Resolves when a marker appears or vanishes (never without MPS).
    pub async fn changed(&mut self) {
        match self.started.as_mut() {
            Some(rx) => {
                if rx.changed().await.is_err() {
                    std::future::pending::<()>().await;
                }
            }
            None => std::future::pending().await,
        }
    }
}
