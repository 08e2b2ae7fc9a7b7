//! MPS on the device plugin's side: what Allocate adds for an MPS-shared resource, and which
//! resources' daemons are up (their `.started` markers in NVIDIA's host layout,
//! [`crate::cuda_mps::layout`]).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use tokio::sync::watch;

use crate::cuda_mps::layout::{
    CONTAINER_ROOT, CONTAINER_SHM, PIPE_ENV, pipe_dir, shm_dir, watch_started,
};
use crate::proto::deviceplugin::{ContainerAllocateResponse, Mount};

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
    pub fn follow(&mut self, settings: &crate::resources::settings::Settings) {
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
