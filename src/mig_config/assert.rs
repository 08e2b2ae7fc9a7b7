//! `assert`: whether the selected config is what the GPUs are now, by mig-parted's rules —
//! current (not pending) mode, and for MIG GPUs the exact profile counts, placements ignored.
//! Every MIG-capable GPU must be matched by an entry; GPUs that cannot do MIG need not be, and
//! an entry for `devices: all` passes over them (mig-parted's apply does the same).

use super::live;
use super::select::Target;
use crate::nvml::mig_admin::MigGpu;

/// What to check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// The MIG mode of every matched GPU.
    Mode,
    /// Mode, instances, and that every GPU is matched by some entry.
    Full,
}

/// `Ok` when applied; otherwise the first difference found, naming the GPU.
pub fn check(gpus: &[MigGpu], targets: &[Option<Target>], scope: Scope) -> Result<(), String> {
    for (gpu, target) in gpus.iter().zip(targets) {
        let Some(target) = target else {
            // GPUs that cannot do MIG have nothing to match.
            if scope == Scope::Full && gpu.mode.is_some() {
                return Err(format!(
                    "not all GPUs match the specified config: GPU {} ({}) matches no entry",
                    gpu.index, gpu.name
                ));
            }
            continue;
        };
        let Some(mode) = gpu.mode else {
            if target.mig_enabled && !target.all {
                return Err(format!(
                    "GPU {} ({}) is not MIG capable",
                    gpu.index, gpu.name
                ));
            }
            continue;
        };
        if mode.current != target.mig_enabled {
            return Err(format!(
                "GPU {}: MIG mode is {}, the config wants it {}",
                gpu.index,
                word(mode.current),
                word(target.mig_enabled)
            ));
        }
        if scope == Scope::Full && target.mig_enabled {
            let now = live::devices(gpu);
            if now != target.devices {
                return Err(format!(
                    "GPU {}: MIG devices are {}, the config wants {}",
                    gpu.index,
                    counts(&now),
                    counts(&target.devices)
                ));
            }
        }
    }
    Ok(())
}

fn word(on: bool) -> &'static str {
    if on { "enabled" } else { "disabled" }
}

fn counts(map: &std::collections::BTreeMap<String, u32>) -> String {
    if map.is_empty() {
        return "{}".into();
    }
    let parts: Vec<String> = map.iter().map(|(k, v)| format!("{k}: {v}")).collect();
    format!("{{{}}}", parts.join(", "))
}
