//! Coexistence with the device plugin: one GPU is never handed out by both.
//!
//! - **DRA → device plugin.** The UUIDs held by prepared claims (each device's and its GPU's)
//!   are published as a [`Held`] set. In `gpud run` the device plugin subscribes to it in
//!   memory; as separate containers it follows the DRA checkpoint file
//!   ([`follow_checkpoint`]). Either way it withdraws those devices from ListAndWatch, and
//!   they come back when the claim is unprepared.
//! - **Device plugin → DRA.** What the device plugin gave to running pods is the kubelet's
//!   record, read through the pod-resources API ([`device_plugin_holders`]); a claim asking for
//!   such a GPU gets a per-claim error naming the pod.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tonic::transport::Endpoint;
use tracing::warn;

use super::checkpoint::Checkpoint;
use crate::inventory::Snapshot;
use crate::proto::podresources::ListPodResourcesRequest;
use crate::proto::podresources::pod_resources_lister_client::PodResourcesListerClient;

/// UUIDs (`GPU-…`, `MIG-…`) held by DRA claims.
pub type Held = Arc<BTreeSet<String>>;

/// How often a device plugin in another container looks at the DRA checkpoint.
pub const FOLLOW_INTERVAL: Duration = Duration::from_millis(500);
/// How long one pod-resources call may take.
const LIST_TIMEOUT: Duration = Duration::from_secs(5);

/// The resource-name prefix of the device plugin's resources.
pub const RESOURCE_PREFIX: &str = "nvidia.com/";

/// A channel of held UUIDs for `gpud run`: the DRA plugin sends, the device plugin receives.
pub fn channel() -> (watch::Sender<Held>, watch::Receiver<Held>) {
    watch::channel(Held::default())
}

/// Where a device plugin learns what DRA claims hold.
#[derive(Debug, Clone)]
pub enum HeldSource {
    /// The DRA plugin of the same process (`gpud run --dra`).
    Shared(watch::Receiver<Held>),
    /// The checkpoint of a DRA plugin in another process.
    Checkpoint(PathBuf),
}

impl HeldSource {
    /// The held set and its changes; must be called within the runtime.
    pub fn subscribe(self) -> watch::Receiver<Held> {
        match self {
            HeldSource::Shared(rx) => rx,
            HeldSource::Checkpoint(path) => follow_checkpoint(path),
        }
    }
}

/// Follows the DRA checkpoint at `path` (written by a DRA plugin in another process) and
/// publishes the UUIDs it holds. A missing file holds nothing; one that does not parse keeps
/// the last set (the writer replaces files atomically, so that is a corrupt file, which the
/// DRA plugin moves aside itself).
pub fn follow_checkpoint(path: PathBuf) -> watch::Receiver<Held> {
    let mut last: Option<Vec<u8>> = None;
    let mut warned = false;
    let mut read = move || {
        let bytes = match std::fs::read(&path) {
            Ok(bytes) => bytes,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(_) => return None,
        };
        // Parsed only when the bytes changed: the file is read twice a second.
        if last.as_ref() == Some(&bytes) {
            return None;
        }
        let parsed = if bytes.is_empty() {
            Ok(Checkpoint::default())
        } else {
            Checkpoint::parse(&String::from_utf8_lossy(&bytes))
        };
        last = Some(bytes);
        match parsed {
            Ok(checkpoint) => {
                warned = false;
                Some(Arc::new(checkpoint.held()))
            }
            Err(why) => {
                if !warned {
                    warn!(path = %path.display(), error = %why, "Cannot read the DRA checkpoint; keeping the devices it held withdrawn");
                    warned = true;
                }
                None
            }
        }
    };
    // Read once now: a device plugin starting beside prepared claims must not offer their
    // GPUs until the first poll.
    let initial = read().unwrap_or_default();
    crate::daemon::poll::follow(initial, FOLLOW_INTERVAL, read)
}

/// A device held by someone: its UUID, its GPU's UUID (the same for a whole GPU) and who.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holding {
    pub uuid: String,
    pub gpu_uuid: String,
    pub owner: String,
}

impl Holding {
    /// Whether this holding and a device (`uuid` on GPU `gpu_uuid`) cannot both be handed
    /// out: the same device, or a whole GPU and a MIG device on it. Two MIG devices of one
    /// GPU do not clash.
    pub fn clashes(&self, uuid: &str, gpu_uuid: &str) -> bool {
        self.uuid == uuid || self.uuid == gpu_uuid || self.gpu_uuid == uuid
    }
}

/// The GPUs and MIG devices the device plugin has given to running pods, each with the pod
/// (`namespace/name`) that has it, from the kubelet's pod-resources `List`.
///
/// Device IDs are UUIDs, UUIDs with a replica suffix (`GPU-…::1`, time-slicing) or NVML
/// indices (`3`, MIG `3:1`, with `deviceIDStrategy: index`); all three are mapped to UUIDs. A
/// MIG device also counts as holding its GPU.
pub async fn device_plugin_holders(
    socket: &Path,
    snapshot: &Snapshot,
) -> Result<Vec<Holding>, String> {
    let what = |e: &dyn std::fmt::Display| {
        format!(
            "cannot ask the kubelet's pod-resources API at {}: {e}",
            socket.display()
        )
    };
    let endpoint = Endpoint::from_shared(format!("unix:{}", socket.display()))
        .map_err(|e| what(&e))?
        .connect_timeout(Duration::from_secs(1));
    let channel = endpoint.connect().await.map_err(|e| what(&e))?;
    let mut client = PodResourcesListerClient::new(channel);
    let answer = tokio::time::timeout(LIST_TIMEOUT, client.list(ListPodResourcesRequest {}))
        .await
        .map_err(|_| what(&"no answer within 5s"))?
        .map_err(|e| what(&e))?
        .into_inner();
    let mut out = Vec::new();
    for pod in answer.pod_resources {
        let owner = format!("{}/{}", pod.namespace, pod.name);
        let ids = pod
            .containers
            .iter()
            .flat_map(|c| &c.devices)
            .filter(|d| d.resource_name.starts_with(RESOURCE_PREFIX))
            .flat_map(|d| &d.device_ids);
        for id in ids {
            let (uuid, gpu_uuid) = uuids_of(id, snapshot);
            out.push(Holding {
                uuid,
                gpu_uuid,
                owner: owner.clone(),
            });
        }
    }
    Ok(out)
}

/// The UUID a device-plugin device ID stands for, and its GPU's.
fn uuids_of(id: &str, snapshot: &Snapshot) -> (String, String) {
    let base = id.split("::").next().unwrap_or(id);
    for gpu in &snapshot.gpus {
        if gpu.uuid == base || gpu.index.to_string() == base {
            return (gpu.uuid.clone(), gpu.uuid.clone());
        }
        for mig in &gpu.mig.devices {
            if mig.uuid == base || format!("{}:{}", gpu.index, mig.index) == base {
                return (mig.uuid.clone(), gpu.uuid.clone());
            }
        }
    }
    (base.to_owned(), base.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inventory::model::{MigDevice, Node};
    use crate::inventory::test_support::{gpu, mig, with_migs};

    #[test]
    fn device_plugin_ids_map_to_uuids_in_every_spelling() {
        let migged: MigDevice = mig(1, "MIG-b1", 1, 0);
        let snapshot = Snapshot {
            node: Node {
                hostname: "n".into(),
                driver_version: "570.133.20".into(),
                cuda_driver_version: None,
                nvml_version: None,
                machine_type: None,
            },
            gpus: vec![
                gpu(0, "GPU-a", "A100", 81920),
                with_migs(gpu(1, "GPU-b", "A100", 81920), vec![migged]),
            ],
            topology: Vec::new(),
        };
        let pair = |a: &str, b: &str| (a.to_owned(), b.to_owned());
        assert_eq!(uuids_of("GPU-a", &snapshot), pair("GPU-a", "GPU-a"));
        assert_eq!(uuids_of("GPU-a::3", &snapshot), pair("GPU-a", "GPU-a"));
        assert_eq!(uuids_of("0", &snapshot), pair("GPU-a", "GPU-a"));
        assert_eq!(uuids_of("MIG-b1", &snapshot), pair("MIG-b1", "GPU-b"));
        assert_eq!(uuids_of("1:1", &snapshot), pair("MIG-b1", "GPU-b"));
        let whole = Holding {
            uuid: "GPU-b".into(),
            gpu_uuid: "GPU-b".into(),
            owner: "p".into(),
        };
        assert!(whole.clashes("MIG-b1", "GPU-b"));
        let part = Holding {
            uuid: "MIG-b1".into(),
            gpu_uuid: "GPU-b".into(),
            owner: "p".into(),
        };
        assert!(part.clashes("GPU-b", "GPU-b"));
        assert!(!part.clashes("MIG-b2", "GPU-b"));
    }
}
