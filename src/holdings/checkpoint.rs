//! The DRA checkpoint as the device plugin reads it: only what claims hold. The DRA plugin
//! writes the whole file (its own format, `dra::checkpoint`); this is the part of that format
//! both sides agree on, so a device plugin in another container needs nothing of the DRA
//! plugin's code.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use tokio::sync::watch;
use tracing::warn;

use super::{Held, held_by};

/// The checkpoint's file name in the DRA plugin's folder.
pub const FILE_NAME: &str = "checkpoint.json";
/// The format version written and read.
pub const VERSION: u32 = 1;
/// The largest checkpoint read: thousands of claims fit; a larger file is not one gpud wrote.
pub const MAX_BYTES: u64 = 16 * 1024 * 1024;
/// How often a device plugin in another container looks at the DRA checkpoint.
pub const FOLLOW_INTERVAL: Duration = Duration::from_millis(500);

#[derive(Deserialize)]
struct View {
    version: u32,
    #[serde(default)]
    claims: BTreeMap<String, ClaimView>,
}

#[derive(Deserialize)]
struct ClaimView {
    #[serde(default)]
    devices: Vec<DeviceView>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct DeviceView {
    #[serde(default)]
    device: String,
    uuid: String,
    gpu_uuid: String,
    #[serde(default)]
    admin_access: bool,
}

/// The UUIDs held by the claims of a checkpoint's text.
pub fn held(text: &str) -> Result<BTreeSet<String>, String> {
    let view: View = serde_json::from_str(text).map_err(|e| e.to_string())?;
    if view.version != VERSION {
        return Err(format!(
            "version {} (this gpud reads version {VERSION})",
            view.version
        ));
    }
    Ok(held_by(view.claims.values().flat_map(|c| &c.devices).map(
        |d| (d.uuid.as_str(), d.gpu_uuid.as_str(), d.admin_access),
    )))
}

/// The DRA names of the devices prepared claims hold on GPU `gpu_uuid`, from a checkpoint's
/// text: under DRA dynamic MIG, its MIG devices are that GPU's layout.
pub fn devices_on(text: &str, gpu_uuid: &str) -> Result<BTreeSet<String>, String> {
    let view: View = serde_json::from_str(text).map_err(|e| e.to_string())?;
    if view.version != VERSION {
        return Err(format!(
            "version {} (this gpud reads version {VERSION})",
            view.version
        ));
    }
    Ok(view
        .claims
        .values()
        .flat_map(|c| &c.devices)
        .filter(|d| d.gpu_uuid == gpu_uuid)
        .map(|d| d.device.clone())
        .collect())
}

/// Follows the DRA checkpoint at `path` (written by a DRA plugin in another process) and
/// publishes the UUIDs it holds. A missing file holds nothing; one that does not parse keeps
/// the last set (the writer replaces files atomically, so that is a corrupt file, which the
/// DRA plugin moves aside itself).
pub fn follow(path: PathBuf) -> watch::Receiver<Held> {
    let mut last: Option<Vec<u8>> = None;
    let mut warned = false;
    let mut read = move || {
        let bytes = match crate::files::read_bytes(&path, MAX_BYTES) {
            Ok(bytes) => bytes,
            Err(err) if err.is_not_found() => Vec::new(),
            Err(err) => {
                if !warned {
                    warn!(error = %err, "Cannot read the DRA checkpoint; keeping the devices it held withdrawn");
                    warned = true;
                }
                return None;
            }
        };
        // Parsed only when the bytes changed: the file is read twice a second.
        if last.as_ref() == Some(&bytes) {
            return None;
        }
        let parsed = if bytes.is_empty() {
            Ok(BTreeSet::new())
        } else {
            held(&String::from_utf8_lossy(&bytes))
        };
        last = Some(bytes);
        match parsed {
            Ok(uuids) => {
                warned = false;
                Some(Arc::new(uuids))
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
