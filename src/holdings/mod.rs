//! The holdings seam: who holds which GPU, so that one GPU is never handed out by both the
//! DRA plugin and the device plugin. Owned by neither:
//!
//! - **DRA → device plugin.** The UUIDs held by prepared claims (each device's and its GPU's)
//!   are published as a [`Held`] set. In `gpud run` the DRA plugin sends it over a [`channel`];
//!   as separate containers the device plugin follows the DRA checkpoint file
//!   ([`checkpoint::follow`]). Either way it withdraws those devices from ListAndWatch, and
//!   they come back when the claim is unprepared.
//! - **Device plugin → DRA.** What the device plugin gave to running pods is the kubelet's
//!   record, read through the pod-resources API ([`pod_resources::device_plugin_holders`]); a
//!   claim asking for such a GPU gets a per-claim error naming the pod.
//! - **Pods → remediation.** Every pod that holds a GPU, by either path (device plugin or DRA
//!   claim, the GPU or one of its MIG devices), from the same `List`
//!   ([`pod_resources::gpu_holders`]): the pods to evict before the GPU is reset.
//! - **MIG layouts.** Who owns each GPU's MIG layout, the MIG manager or DRA dynamic MIG
//!   ([`layout`]), and the one lock every layout change holds ([`layout_lock`]), so that
//!   remediation remakes only what the owner recorded and no two writers change a layout at
//!   once.

pub mod checkpoint;
pub mod layout;
pub mod layout_lock;
pub mod pod_resources;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;

use tokio::sync::watch;

/// UUIDs (`GPU-…`, `MIG-…`) held by DRA claims.
pub type Held = Arc<BTreeSet<String>>;

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
            HeldSource::Checkpoint(path) => checkpoint::follow(path),
        }
    }
}

/// The UUIDs a set of prepared devices holds, given as `(uuid, gpu uuid, admin access)`: each
/// device's own and its GPU's (a GPU one of whose MIG devices is in a claim cannot be handed
/// out whole); a device allocated with admin access (monitoring beside its user) holds nothing.
pub fn held_by<'a>(
    devices: impl IntoIterator<Item = (&'a str, &'a str, bool)>,
) -> BTreeSet<String> {
    devices
        .into_iter()
        .filter(|(_, _, admin)| !admin)
        .flat_map(|(uuid, gpu_uuid, _)| [uuid.to_owned(), gpu_uuid.to_owned()])
        .collect()
}
