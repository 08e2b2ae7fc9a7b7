//! MIG: a mode change waiting for a reset, `nvidia_drm`, which holds the GPUs open and so
//! blocks the reset a MIG change needs, and whether the selected mig-parted config is in
//! effect (with the reconciler's reason when it failed).

use super::{gpu_list, joined};
use crate::doctor::env::Env;
use crate::doctor_report::Verdict;

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

const APPLY: &str = "apply it (gpud mig apply -f <file> -c <config>), or let the reconciler do it: see its log and gpud_mig_config_state";

/// `mig.config`
pub fn config(env: &Env) -> Verdict {
    use crate::mig_state::record;
    let Some(path) = &env.options.mig_config else {
        return Verdict::skip("no MIG config file given (--mig-config-file)");
    };
    let spec = match crate::mig_config::load(path) {
        Ok(spec) => spec,
        Err(err) => {
            return Verdict::fail(
                err.to_string(),
                "correct the field named above: the reconciler refuses this file",
            );
        }
    };
    let last = match record::read(&env.options.mig_state_dir) {
        Ok(last) => last,
        Err(why) => {
            return Verdict::fail(
                format!("cannot read the reconciler's last state: {why}"),
                "remove the file; the reconciler writes it again at its next attempt",
            );
        }
    };
    let wanted = env
        .options
        .mig_selected
        .clone()
        .or_else(|| last.as_ref().map(|r| r.config.clone()));
    let (label, entries) = match spec.select(wanted.as_deref()) {
        Ok(selected) => selected,
        Err(why) => {
            return Verdict::fail(
                format!("{}: {why}", path.display()),
                "select a config of the file (--mig-selected-config or MIG_PARTED_SELECTED_CONFIG)",
            );
        }
    };
    let gpus = match env.mig_gpus() {
        Ok(gpus) => gpus,
        Err(why) => return Verdict::skip(format!("needs NVML's MIG layout, which failed: {why}")),
    };
    let targets = crate::mig_config::select::targets(entries, gpus);
    let differs =
        crate::mig_config::assert::check(gpus, &targets, crate::mig_config::assert::Scope::Full);
    let last = last.filter(|r| r.config == label);
    match (differs, last) {
        (Ok(()), _) => Verdict::ok(format!("config {label} of {} is in effect", path.display())),
        (Err(diff), Some(r)) if r.state == "pending" => Verdict::warn(
            format!("config {label} is being applied: {diff}"),
            "wait for nvidia.com/mig.config.state=success",
        ),
        (Err(diff), Some(r)) if r.reason.is_some() => Verdict::fail(
            format!(
                "config {label} is not in effect: {diff}; the reconciler reported {}: {}",
                r.state,
                r.reason.as_deref().unwrap_or_default()
            ),
            APPLY,
        ),
        (Err(diff), _) => Verdict::fail(format!("config {label} is not in effect: {diff}"), APPLY),
    }
}
