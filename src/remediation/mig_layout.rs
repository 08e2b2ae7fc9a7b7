//! The MIG layout a reset takes with it: a GPU keeps its MIG mode across a reset but loses its
//! GPU and compute instances. The layout is read before the reset and made again after it,
//! each GPU instance at the placement it had, through the same NVML administration calls the
//! MIG manager uses — so the kubelet gets the same MIG devices back.

use crate::logging;
use crate::nvml::Nvml;
use crate::nvml::mig_admin::GpuInstance;

/// The GPU instances of GPU `index` now, when it is in MIG mode and has some.
pub async fn read(nvml: &Nvml, index: u32) -> Option<Vec<GpuInstance>> {
    let nvml = nvml.clone();
    tokio::task::spawn_blocking(move || {
        let gpu = nvml.mig_admin().gpu(index).ok()?;
        let on = gpu.mode.is_some_and(|m| m.current);
        (on && !gpu.instances.is_empty()).then_some(gpu.instances)
    })
    .await
    .ok()
    .flatten()
}

/// Makes `layout` again on GPU `index` if the reset took it; how many GPU instances it made
/// (0: the instances were still there). An error names what failed.
pub async fn restore(nvml: &Nvml, index: u32, layout: Vec<GpuInstance>) -> Result<usize, String> {
    let nvml = nvml.clone();
    tokio::task::spawn_blocking(move || restore_blocking(&nvml, index, layout))
        .await
        .map_err(|e| e.to_string())?
}

fn restore_blocking(
    nvml: &Nvml,
    index: u32,
    mut layout: Vec<GpuInstance>,
) -> Result<usize, String> {
    let admin = nvml.mig_admin();
    let why = |e: crate::nvml::NvmlError| logging::error_chain(&e);
    let now = admin.gpu(index).map_err(why)?;
    if !now.mode.is_some_and(|m| m.current) {
        return Err("MIG mode is off after the reset".to_owned());
    }
    if !now.instances.is_empty() {
        return Ok(0);
    }
    layout.sort_by_key(|gi| gi.start);
    for gi in &layout {
        let made = admin
            .create_gpu_instance(index, gi.profile_id, gi.start, gi.size)
            .map_err(why)?;
        for ci in &gi.compute {
            admin
                .create_compute_instance(index, made, ci.slices)
                .map_err(why)?;
        }
    }
    Ok(layout.len())
}
