//! MIG: a mode change waiting for a reset, and `nvidia_drm`, which holds the GPUs open and so
//! blocks the reset a MIG change needs.

use super::{gpu_list, joined};
use crate::doctor::env::Env;
use crate::doctor::report::Verdict;

/// `mig.mode`
pub fn mode(env: &Env) -> Verdict {
    let Some(snapshot) = env.snapshot() else {
        return env.no_nvml();
    };
    let capable: Vec<_> = snapshot.gpus.iter().filter(|g| g.mig.capable).collect();
    if capable.is_empty() {
        return Verdict::skip("no MIG-capable GPU");
    }
    let pending: Vec<String> = capable
        .iter()
        .filter(|g| g.mig.enabled != g.mig.pending_enabled)
        .map(|g| {
            let word = |on| if on { "enabled" } else { "disabled" };
            format!(
                "GPU {}: MIG {} now, {} after the next GPU reset",
                g.index,
                word(g.mig.enabled),
                word(g.mig.pending_enabled)
            )
        })
        .collect();
    if pending.is_empty() {
        let enabled: Vec<u32> = capable
            .iter()
            .filter(|g| g.mig.enabled)
            .map(|g| g.index)
            .collect();
        if enabled.is_empty() {
            Verdict::ok("MIG disabled on every GPU, nothing pending")
        } else {
            Verdict::ok(format!(
                "MIG enabled on GPU {}, nothing pending",
                gpu_list(&enabled)
            ))
        }
    } else {
        Verdict::warn(
            joined(&pending),
            "stop the GPU's workloads and reset it (nvidia-smi -r -i <index>), or reboot the node",
        )
    }
}

/// `mig.nvidia-drm`
pub fn nvidia_drm(env: &Env) -> Verdict {
    let Some(snapshot) = env.snapshot() else {
        return env.no_nvml();
    };
    let mig: Vec<u32> = snapshot
        .gpus
        .iter()
        .filter(|g| g.mig.enabled || g.mig.pending_enabled)
        .map(|g| g.index)
        .collect();
    if mig.is_empty() {
        return Verdict::skip("no GPU has MIG enabled or pending");
    }
    let Some(modules) = env.host.modules() else {
        return Verdict::skip("cannot read /proc/modules");
    };
    if modules.contains("nvidia_drm") {
        Verdict::warn(
            format!(
                "nvidia_drm is loaded on a MIG node (MIG on GPU {})",
                gpu_list(&mig)
            ),
            "unload it (modprobe -r nvidia_drm) and blacklist it: it holds the GPUs open and blocks the reset a MIG change needs",
        )
    } else {
        Verdict::ok("nvidia_drm not loaded")
    }
}
