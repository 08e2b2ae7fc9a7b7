//! One CDI spec per prepared claim, built with the same builder as `gpud cdi generate`:
//! kind `k8s.gpu.nvidia.com/claim`, devices named `<claim UID>-<DRA device name>`, in a file
//! `k8s.gpu.nvidia.com-claim_<claim UID>.yaml` under the CDI root, removed on unprepare.
//!
//! The claim UID in every device name keeps a runtime's cache from ever matching a spec of
//! an earlier claim for the same GPU. The spec holds only the claim's devices: it is built
//! from the snapshot narrowed to them, so a MIG device elsewhere on the node whose
//! capability files cannot be read does not fail an unrelated claim.

use std::path::{Path, PathBuf};

use crate::cdi::discover::{self, HostPaths};
use crate::cdi::spec::ContainerEdits;
use crate::cdi::{self, Format, Kind, NameStrategy, Options};
use crate::inventory::Snapshot;

/// The CDI vendor of claim specs, as NVIDIA's driver writes them.
pub const VENDOR: &str = "k8s.gpu.nvidia.com";
/// The CDI class of claim specs.
pub const CLASS: &str = "claim";

/// A device of the claim: its DRA name and its UUID (`GPU-…` or `MIG-…`).
#[derive(Debug, Clone)]
pub struct ClaimDevice {
    pub name: String,
    pub uuid: String,
    /// Whether it is served by the claim's MPS daemon (it gets the daemon's edits).
    pub mps: bool,
    /// Environment of its share, for a GPU shared by capacity ([`super::shares::env`]).
    pub env: Vec<String>,
}

/// Where the spec of claim `uid` lives.
pub fn spec_path(cdi_root: &Path, uid: &str) -> PathBuf {
    cdi_root.join(format!("{VENDOR}-{CLASS}_{uid}.yaml"))
}

/// The qualified CDI name of `device` in claim `uid`.
pub fn cdi_id(uid: &str, device: &str) -> String {
    format!("{VENDOR}/{CLASS}={uid}-{device}")
}

/// Builds and writes the spec of claim `uid`, the devices served by its MPS daemon with
/// `mps_edits` added; the error is the claim's.
pub fn write(
    snapshot: &Snapshot,
    host: &HostPaths,
    cdi_root: &Path,
    uid: &str,
    devices: &[ClaimDevice],
    mps_edits: Option<&ContainerEdits>,
) -> Result<PathBuf, String> {
    let files = discover::discover(host, &snapshot.node.driver_version)
        .map_err(|e| format!("cannot read the host's driver files: {e}"))?;
    let narrowed = narrow(snapshot, devices);
    let options = Options {
        kind: Kind::new(VENDOR, CLASS).map_err(|e| e.to_string())?,
        name_strategies: vec![NameStrategy::Uuid],
        all_device: false,
        ..Options::default()
    };
    let mut generated = cdi::build(&narrowed, &files, &options)
        .map_err(|e| format!("cannot build the claim's CDI spec: {e}"))?;
    let mut renamed = Vec::new();
    for device in devices {
        let mut found = generated
            .spec
            .devices
            .iter()
            .find(|d| d.name == device.uuid)
            .cloned()
            .ok_or_else(|| {
                format!(
                    "device {} ({}) has no CDI entry (lost?)",
                    device.name, device.uuid
                )
            })?;
        found.name = format!("{uid}-{}", device.name);
        found.container_edits.env.extend(device.env.iter().cloned());
        if let Some(extra) = mps_edits.filter(|_| device.mps) {
            let edits = &mut found.container_edits;
            edits.env.extend(extra.env.iter().cloned());
            edits.mounts.extend(extra.mounts.iter().cloned());
        }
        renamed.push(found);
    }
    generated.spec.devices = renamed;
    let text = cdi::render::render(&generated.spec, Format::Yaml).map_err(|e| e.to_string())?;
    let path = spec_path(cdi_root, uid);
    cdi::write::write_atomic(&path, &text).map_err(|e| e.to_string())?;
    Ok(path)
}

/// Removes the spec of claim `uid`; one that is not there is fine.
pub fn remove(cdi_root: &Path, uid: &str) -> Result<(), String> {
    let path = spec_path(cdi_root, uid);
    match std::fs::remove_file(&path) {
        Err(err) if err.kind() != std::io::ErrorKind::NotFound => {
            Err(format!("{}: cannot remove: {err}", path.display()))
        }
        _ => Ok(()),
    }
}

/// The snapshot with only the GPUs of `devices`, each with only the claim's MIG devices.
fn narrow(snapshot: &Snapshot, devices: &[ClaimDevice]) -> Snapshot {
    let wanted = |uuid: &str| devices.iter().any(|d| d.uuid == uuid);
    let mut out = snapshot.clone();
    out.gpus
        .retain(|gpu| wanted(&gpu.uuid) || gpu.mig.devices.iter().any(|m| wanted(&m.uuid)));
    for gpu in &mut out.gpus {
        gpu.mig.devices.retain(|m| wanted(&m.uuid));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_nvidias_driver() {
        assert_eq!(
            spec_path(Path::new("/var/run/cdi"), "u-1"),
            Path::new("/var/run/cdi/k8s.gpu.nvidia.com-claim_u-1.yaml")
        );
        assert_eq!(cdi_id("u-1", "gpu-3"), "k8s.gpu.nvidia.com/claim=u-1-gpu-3");
    }
}
