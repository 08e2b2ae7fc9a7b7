//! `apply`: brings the GPUs to the selected config, in mig-parted's order (hooks, mode, then
//! instances), from whatever state they are in.
//!
//! Every run re-reads the GPUs and re-plans, and every step is one NVML change whose result
//! the next read sees, so a run killed or failing at any step is completed by the next one.
//! All plans are made, and proven placeable, before the first change: an infeasible config or
//! a GPU with running processes (without `force`) stops the run with nothing changed.

use std::time::{Duration, Instant};

use tracing::info;

use super::hooks::Hooks;
use super::plan::{self, GpuPlan};
use crate::mig_config::assert::{self, Scope};
use crate::mig_config::select::{self, Target};
use crate::mig_config::spec::Entry;
use crate::nvml::mig_admin::{MigAdmin, MigGpu, ModeActivation};

/// How to apply.
#[derive(Debug, Clone)]
pub struct Options {
    /// Leave a pending mode change for the caller to reset.
    pub skip_reset: bool,
    /// Stop after the mode.
    pub mode_only: bool,
    /// Change GPUs even while processes use them.
    pub force: bool,
    /// Program and arguments that reset GPUs; the comma-separated PCI bus ids are appended.
    pub reset_command: Vec<String>,
    /// How long to wait for a reset to bring the pending mode into effect.
    pub reset_wait: Duration,
    /// `MIG_PARTED_*` flag environment for hooks.
    pub hook_env: Vec<(String, String)>,
}

/// How an apply ended when it did not fail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Everything was already as configured.
    AlreadyApplied,
    /// Changes were made and the config is in effect.
    Applied,
    /// The mode change waits for a GPU reset that was skipped (`--skip-reset`).
    ResetPending(Vec<u32>),
}

/// Why an apply stopped.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    /// Refused before any change.
    #[error("{0}")]
    Refused(String),
    /// NVML cannot apply the mode without a reboot; these GPUs wait for one.
    #[error("MIG mode change on GPU {} needs a reboot: the driver reports the GPU cannot be reset here", list(.0))]
    RebootRequired(Vec<u32>),
    /// A step failed; a later apply resumes from where it stopped.
    #[error("{0}")]
    Failed(String),
}

fn list(indices: &[u32]) -> String {
    let words: Vec<String> = indices.iter().map(u32::to_string).collect();
    words.join(", ")
}

fn failed(what: String) -> impl FnOnce(crate::nvml::NvmlError) -> ApplyError {
    move |err| ApplyError::Failed(format!("{what}: {err}"))
}

fn read(admin: &MigAdmin) -> Result<Vec<MigGpu>, ApplyError> {
    admin.gpus().map_err(failed("reading the GPUs".into()))
}

/// Plans every GPU; the first GPU that cannot reach its target refuses the whole apply.
pub fn plans(gpus: &[MigGpu], targets: &[Option<Target>]) -> Result<Vec<GpuPlan>, String> {
    gpus.iter()
        .zip(targets)
        .map(|(gpu, target)| plan::plan_gpu(gpu, target.as_ref()))
        .collect()
}

/// Applies `entries` with `hooks`. `apply-exit` runs on every path after `apply-start` ran.
pub fn apply(
    admin: &MigAdmin,
    entries: &[Entry],
    hooks: &Hooks,
    opts: &Options,
) -> Result<Outcome, ApplyError> {
    hooks
        .run("apply-start", &opts.hook_env)
        .map_err(ApplyError::Failed)?;
    let outcome = apply_phases(admin, entries, hooks, opts);
    let exit = hooks.run("apply-exit", &opts.hook_env);
    match (outcome, exit) {
        (Err(err), _) => Err(err),
        (Ok(_), Err(why)) => Err(ApplyError::Failed(why)),
        (Ok(outcome), Ok(())) => Ok(outcome),
    }
}

fn apply_phases(
    admin: &MigAdmin,
    entries: &[Entry],
    hooks: &Hooks,
    opts: &Options,
) -> Result<Outcome, ApplyError> {
    let gpus = read(admin)?;
    let targets = select::targets(entries, &gpus);
    let first = plans(&gpus, &targets).map_err(ApplyError::Refused)?;
    if !opts.force {
        let busy: Vec<String> = first
            .iter()
            .filter(|p| p.changes() && !p.processes.is_empty())
            .map(|p| format!("GPU {} (PIDs {})", p.index, list(&p.processes)))
            .collect();
        if !busy.is_empty() {
            return Err(ApplyError::Refused(format!(
                "refusing to change GPUs in use: {}; stop those processes or pass --force",
                busy.join(", ")
            )));
        }
    }
    let mut changed = false;
    if assert::check(&gpus, &targets, Scope::Mode).is_err() {
        hooks
            .run("pre-apply-mode", &opts.hook_env)
            .map_err(ApplyError::Failed)?;
        changed = true;
        let pending = apply_modes(admin, &gpus, &first)?;
        if !pending.is_empty() {
            if opts.skip_reset {
                return Ok(Outcome::ResetPending(pending));
            }
            reset(admin, &gpus, &pending, opts)?;
        }
    }
    if opts.mode_only {
        return Ok(if changed {
            Outcome::Applied
        } else {
            Outcome::AlreadyApplied
        });
    }
    let gpus = read(admin)?;
    let targets = select::targets(entries, &gpus);
    if assert::check(&gpus, &targets, Scope::Full).is_ok() {
        return Ok(if changed {
            Outcome::Applied
        } else {
            Outcome::AlreadyApplied
        });
    }
    let second = plans(&gpus, &targets).map_err(ApplyError::Refused)?;
    if let Some(p) = second.iter().find(|p| p.mode_change) {
        return Err(ApplyError::Failed(format!(
            "GPU {}: MIG mode change has not taken effect yet",
            p.index
        )));
    }
    hooks
        .run("pre-apply-config", &opts.hook_env)
        .map_err(ApplyError::Failed)?;
    for (gpu, plan) in gpus.iter().zip(&second) {
        apply_instances(admin, gpu, plan)?;
    }
    Ok(Outcome::Applied)
}

/// Destroys every instance of `gpu`'s GPU instance `gi` and then the GPU instance.
fn destroy_gpu_instance(admin: &MigAdmin, gpu: &MigGpu, gi: u32) -> Result<(), ApplyError> {
    let index = gpu.index;
    if let Some(instance) = gpu.instances.iter().find(|g| g.id == gi) {
        for ci in &instance.compute {
            info!(gpu = index, gi, ci = ci.id, "destroying compute instance");
            admin
                .destroy_compute_instance(index, gi, ci.id)
                .map_err(failed(format!(
                    "GPU {index}: destroying compute instance {gi}/{}",
                    ci.id
                )))?;
        }
    }
    info!(gpu = index, gi, "destroying GPU instance");
    admin
        .destroy_gpu_instance(index, gi)
        .map_err(failed(format!("GPU {index}: destroying GPU instance {gi}")))
}

/// Sets the mode of every GPU whose plan changes it; returns those left pending a reset.
fn apply_modes(
    admin: &MigAdmin,
    gpus: &[MigGpu],
    plans: &[GpuPlan],
) -> Result<Vec<u32>, ApplyError> {
    let mut pending = Vec::new();
    let mut reboot = Vec::new();
    for (gpu, plan) in gpus.iter().zip(plans) {
        let Some(wanted) = plan.mode_wanted.filter(|_| plan.mode_change) else {
            continue;
        };
        for gi in &gpu.instances {
            destroy_gpu_instance(admin, gpu, gi.id)?;
        }
        info!(gpu = gpu.index, enabled = wanted, "setting MIG mode");
        let activation = admin
            .set_mode(gpu.index, wanted)
            .map_err(failed(format!("GPU {}: setting MIG mode", gpu.index)))?;
        match activation {
            ModeActivation::Active => {}
            ModeActivation::ResetPending => pending.push(gpu.index),
            ModeActivation::RebootRequired => reboot.push(gpu.index),
        }
    }
    if !reboot.is_empty() {
        return Err(ApplyError::RebootRequired(reboot));
    }
    Ok(pending)
}

/// Resets the pending GPUs with the reset command and waits for their mode to take effect.
fn reset(
    admin: &MigAdmin,
    gpus: &[MigGpu],
    pending: &[u32],
    opts: &Options,
) -> Result<(), ApplyError> {
    let buses: Vec<&str> = gpus
        .iter()
        .filter(|g| pending.contains(&g.index))
        .map(|g| g.pci_bus_id.as_str())
        .collect();
    let Some((program, args)) = opts.reset_command.split_first() else {
        return Err(ApplyError::Failed("no GPU reset command configured".into()));
    };
    info!(gpus = %list(pending), command = %program, "resetting GPUs for the MIG mode change");
    let mut command = std::process::Command::new(program);
    command.args(args).arg(buses.join(","));
    let status = crate::daemon::signals::with_default_mask(|| command.status()).map_err(|e| {
        ApplyError::Failed(format!("cannot run the GPU reset command {program:?}: {e}"))
    })?;
    if !status.success() {
        return Err(ApplyError::Failed(format!(
            "GPU reset ({program:?} for {}) failed ({status}); a process may hold the GPU \
             (nvidia_drm, nvidia-persistenced, fabric manager, DCGM)",
            buses.join(",")
        )));
    }
    let deadline = Instant::now() + opts.reset_wait;
    loop {
        let mut waiting = Vec::new();
        // A GPU in the middle of its reset may refuse a query (its mode already changed, its
        // instances not yet readable): that is still waiting, and the error counts only if it
        // lasts until the deadline.
        let mut refused = None;
        for &index in pending {
            match admin.gpu(index) {
                Ok(gpu) if gpu.mode.is_some_and(|m| m.current != m.pending) => waiting.push(index),
                Ok(_) => {}
                Err(err) => {
                    waiting.push(index);
                    refused = Some((index, err));
                }
            }
        }
        if waiting.is_empty() {
            return Ok(());
        }
        if Instant::now() >= deadline
            && let Some((index, err)) = refused
        {
            return Err(failed(format!("GPU {index}: reading the MIG mode"))(err));
        }
        if Instant::now() >= deadline {
            return Err(ApplyError::Failed(format!(
                "GPU {}: MIG mode still pending {:?} after the reset",
                list(&waiting),
                opts.reset_wait
            )));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Destroys what the plan destroys and creates what it creates, at the planned placements.
fn apply_instances(admin: &MigAdmin, gpu: &MigGpu, plan: &GpuPlan) -> Result<(), ApplyError> {
    let index = gpu.index;
    for e in &plan.destroy {
        destroy_gpu_instance(admin, gpu, e.gpu_instance)?;
    }
    for c in &plan.create {
        info!(gpu = index, profile = %c.profile, start = c.start, "creating GPU instance");
        let gi = admin
            .create_gpu_instance(index, c.profile_id, c.start, c.size)
            .map_err(failed(format!(
                "GPU {index}: creating GPU instance {} at slice {}",
                c.profile, c.start
            )))?;
        for &slices in &c.compute {
            admin
                .create_compute_instance(index, gi, slices)
                .map_err(failed(format!(
                    "GPU {index}: creating a {slices}-slice compute instance in GPU instance {gi}"
                )))?;
        }
    }
    Ok(())
}
