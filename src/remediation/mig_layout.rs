//! The MIG layout a reset takes with it: a GPU keeps its MIG mode across a reset but loses its
//! GPU and compute instances. After the reset the layout the GPU's owner recorded
//! ([`crate::holdings::layout`]) is made again, each GPU instance at its placement, through
//! the same NVML administration calls the MIG manager uses — so the kubelet gets the same MIG
//! devices back:
//!
//! - **MIG manager:** the layout it recorded when it last brought the GPU to its config.
//! - **DRA dynamic MIG:** the MIG devices of the claims prepared on the GPU, at their
//!   placements, from the DRA checkpoint.
//! - **No owner:** nothing; a layout nobody recorded cannot be told from one half made.
//!
//! A record or checkpoint that cannot be read fails closed: nothing is made, and the error
//! names the file. The restore holds the node's MIG layout lock.

use std::path::Path;

use crate::holdings::layout::{self, Instance, Owner};
use crate::holdings::{checkpoint, layout_lock};
use crate::logging;
use crate::nvml::Nvml;

/// What the owner of a GPU wants back after its reset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wanted {
    pub owner: Owner,
    pub layout: Vec<Instance>,
}

/// The layout GPU `index` (`uuid`) had by its owner's record in state directory `dir`;
/// `Ok(None)` when nobody owns it (or gpud keeps no state).
pub async fn wanted(
    nvml: &Nvml,
    dir: Option<&Path>,
    index: u32,
    uuid: &str,
) -> Result<Option<Wanted>, String> {
    let Some(dir) = dir else { return Ok(None) };
    let Some(entry) = layout::owner_of(dir, uuid)? else {
        return Ok(None);
    };
    let layout = match entry.owner {
        Owner::MigManager => entry.layout.unwrap_or_default(),
        Owner::DraDynamicMig => {
            let Some(path) = entry.checkpoint else {
                return Ok(Some(Wanted {
                    owner: entry.owner,
                    layout: Vec::new(),
                }));
            };
            let nvml = nvml.clone();
            let uuid = uuid.to_owned();
            tokio::task::spawn_blocking(move || claims_layout(&nvml, index, &uuid, &path))
                .await
                .map_err(|e| e.to_string())??
        }
    };
    Ok(Some(Wanted {
        owner: entry.owner,
        layout,
    }))
}

/// The MIG devices the claims in the DRA checkpoint at `path` hold on GPU `index`, as a
/// layout: each a GPU instance of its profile at its placement with one compute instance
/// spanning it, as dynamic MIG makes them.
fn claims_layout(
    nvml: &Nvml,
    index: u32,
    uuid: &str,
    path: &Path,
) -> Result<Vec<Instance>, String> {
    let text = match crate::files::read_bytes(path, checkpoint::MAX_BYTES) {
        Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
        Err(err) if err.is_not_found() => return Ok(Vec::new()),
        Err(err) => return Err(err.to_string()),
    };
    let names = checkpoint::devices_on(&text, uuid).map_err(|why| {
        format!(
            "{}: {why}; the claims' MIG devices cannot be told, so none is made",
            path.display()
        )
    })?;
    let placements: Vec<(String, (u32, u32))> = names
        .into_iter()
        .filter_map(|name| crate::dra_names::placement_of(&name).map(|p| (name, p)))
        .collect();
    if placements.is_empty() {
        return Ok(Vec::new());
    }
    let gpu = nvml
        .mig_admin()
        .gpu(index)
        .map_err(|e| logging::error_chain(&e))?;
    let mut layout = Vec::new();
    for (name, (profile_id, start)) in placements {
        let profile = gpu
            .profiles
            .iter()
            .find(|p| p.id == profile_id)
            .ok_or_else(|| {
                format!("device {name}: GPU {index} has no GPU-instance profile {profile_id}")
            })?;
        layout.push(Instance {
            profile_id,
            start,
            size: profile.memory_slices,
            compute_slices: vec![profile.slices],
        });
    }
    layout.sort_by_key(|i| i.start);
    Ok(layout)
}

/// Makes `layout` again on GPU `index` if the reset took it, holding the node's MIG layout
/// lock (in `dir`); how many GPU instances it made (0: the instances were still there, or the
/// layout is empty). An error names what failed.
pub async fn restore(
    nvml: &Nvml,
    dir: Option<&Path>,
    index: u32,
    layout: Vec<Instance>,
) -> Result<usize, String> {
    if layout.is_empty() {
        return Ok(0);
    }
    let _lock = layout_lock::lock(dir, "remediation's restore after a reset").await?;
    let nvml = nvml.clone();
    tokio::task::spawn_blocking(move || restore_blocking(&nvml, index, layout))
        .await
        .map_err(|e| e.to_string())?
}

fn restore_blocking(nvml: &Nvml, index: u32, layout: Vec<Instance>) -> Result<usize, String> {
    let admin = nvml.mig_admin();
    let why = |e: crate::nvml::NvmlError| logging::error_chain(&e);
    let now = admin.gpu(index).map_err(why)?;
    if !now.mode.is_some_and(|m| m.current) {
        return Err("MIG mode is off after the reset".to_owned());
    }
    if !now.instances.is_empty() {
        return Ok(0);
    }
    for gi in &layout {
        let made = admin
            .create_gpu_instance(index, gi.profile_id, gi.start, gi.size)
            .map_err(why)?;
        for slices in &gi.compute_slices {
            admin
                .create_compute_instance(index, made, *slices)
                .map_err(why)?;
        }
    }
    Ok(layout.len())
}
