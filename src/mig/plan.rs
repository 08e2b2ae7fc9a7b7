//! What applying a config would do to each GPU, worked out from the live state alone: the mode
//! change, the GPU instances kept, destroyed and created (with their placements), whether a
//! reset is needed, and which processes hold the GPU. Planning touches nothing; apply executes
//! a plan, and an infeasible plan stops apply before its first change.

use serde::Serialize;

use super::placement::{self, Placed, Shape};
use crate::mig_config::live;
use crate::mig_config::select::Target;
use crate::nvml::mig_admin::{GpuInstance, MigGpu};

/// An existing GPU instance in a plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Existing {
    pub gpu_instance: u32,
    pub profile: String,
    pub start: u32,
    pub size: u32,
    /// Profile names of its compute instances.
    pub devices: Vec<String>,
}

/// A GPU instance to create.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Creation {
    pub profile: String,
    pub profile_id: u32,
    pub start: u32,
    pub size: u32,
    /// Compute slices of each compute instance to create in it.
    pub compute: Vec<u32>,
    /// Profile names of those compute instances.
    pub devices: Vec<String>,
}

/// The plan for one GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GpuPlan {
    pub index: u32,
    pub uuid: String,
    pub name: String,
    /// Index of the config entry that applies; `None`: no entry matches this GPU.
    pub entry: Option<usize>,
    pub mig_capable: bool,
    /// MIG mode now and wanted (`None` when not MIG capable or not matched).
    pub mode_now: Option<bool>,
    pub mode_wanted: Option<bool>,
    /// The mode must change (or a requested change is still pending).
    pub mode_change: bool,
    /// A GPU reset is needed for the mode change to take effect.
    pub reset_needed: bool,
    pub keep: Vec<Existing>,
    pub destroy: Vec<Existing>,
    pub create: Vec<Creation>,
    /// PIDs of compute processes using the GPU.
    pub processes: Vec<u32>,
}

impl GpuPlan {
    /// Whether the plan changes anything.
    pub fn changes(&self) -> bool {
        self.mode_change || !self.destroy.is_empty() || !self.create.is_empty()
    }
}

fn existing(gpu: &MigGpu, gi: &GpuInstance) -> Existing {
    Existing {
        gpu_instance: gi.id,
        profile: gpu
            .profile(gi.profile_id)
            .map_or_else(|| format!("profile {}", gi.profile_id), |p| p.name.clone()),
        start: gi.start,
        size: gi.size,
        devices: live::instance_devices(gpu, gi),
    }
}

fn shape_of(gi: &GpuInstance) -> Shape {
    let mut compute: Vec<u32> = gi.compute.iter().map(|ci| ci.slices).collect();
    compute.sort_unstable_by(|a, b| b.cmp(a));
    Shape {
        profile_id: gi.profile_id,
        compute,
    }
}

/// Plans one GPU. An error says why the target cannot be reached, naming the GPU.
pub fn plan_gpu(gpu: &MigGpu, target: Option<&Target>) -> Result<GpuPlan, String> {
    let mut plan = GpuPlan {
        index: gpu.index,
        uuid: gpu.uuid.clone(),
        name: gpu.name.clone(),
        entry: target.map(|t| t.entry),
        mig_capable: gpu.mode.is_some(),
        mode_now: gpu.mode.map(|m| m.current),
        mode_wanted: None,
        mode_change: false,
        reset_needed: false,
        keep: Vec::new(),
        destroy: Vec::new(),
        create: Vec::new(),
        processes: gpu.processes.clone(),
    };
    let Some(target) = target else {
        return Ok(plan);
    };
    let Some(mode) = gpu.mode else {
        if target.mig_enabled && !target.all {
            return Err(format!(
                "GPU {} ({}) is not MIG capable but the config enables MIG on it",
                gpu.index, gpu.name
            ));
        }
        return Ok(plan);
    };
    plan.mode_wanted = Some(target.mig_enabled);
    plan.mode_change = mode.current != target.mig_enabled;
    plan.reset_needed = plan.mode_change;
    let instances: &[GpuInstance] = if mode.current { &gpu.instances } else { &[] };
    if !target.mig_enabled {
        plan.destroy = instances.iter().map(|gi| existing(gpu, gi)).collect();
        return Ok(plan);
    }
    let mut wanted = placement::shapes(gpu, &target.devices)
        .map_err(|why| format!("GPU {} ({}): {why}", gpu.index, gpu.name))?;
    // Keep every instance that is already one of the wanted shapes, if the rest fits around
    // them; otherwise start from an empty GPU.
    let mut kept = Vec::new();
    let mut rest = Vec::new();
    for gi in instances {
        match wanted.iter().position(|s| *s == shape_of(gi)) {
            Some(i) => {
                wanted.remove(i);
                kept.push(gi);
            }
            None => rest.push(gi),
        }
    }
    let fixed: Vec<Placed> = kept
        .iter()
        .map(|gi| Placed {
            profile_id: gi.profile_id,
            start: gi.start,
            size: gi.size,
        })
        .collect();
    let ids = |shapes: &[Shape]| shapes.iter().map(|s| s.profile_id).collect::<Vec<_>>();
    let (placed, to_create) = match placement::solve(gpu, &fixed, &ids(&wanted)) {
        Some(placed) => (placed, wanted),
        None => {
            let all = placement::shapes(gpu, &target.devices)
                .map_err(|why| format!("GPU {} ({}): {why}", gpu.index, gpu.name))?;
            let placed = placement::solve(gpu, &[], &ids(&all)).ok_or_else(|| {
                let names: Vec<String> = target
                    .devices
                    .iter()
                    .map(|(name, n)| format!("{n}x {name}"))
                    .collect();
                format!(
                    "GPU {} ({}): {} cannot be placed: no arrangement of these GPU instances \
                     fits the GPU's placement table (checked exhaustively); nothing was changed",
                    gpu.index,
                    gpu.name,
                    names.join(", ")
                )
            })?;
            rest.append(&mut kept);
            rest.sort_by_key(|gi| gi.id);
            (placed, all)
        }
    };
    plan.keep = kept.iter().map(|gi| existing(gpu, gi)).collect();
    plan.destroy = rest.iter().map(|gi| existing(gpu, gi)).collect();
    plan.create = assign(gpu, &placed, to_create);
    Ok(plan)
}

/// Pairs each placement with a shape of its profile.
fn assign(gpu: &MigGpu, placed: &[Placed], mut shapes: Vec<Shape>) -> Vec<Creation> {
    let mut out: Vec<Creation> = placed
        .iter()
        .filter_map(|p| {
            let i = shapes.iter().position(|s| s.profile_id == p.profile_id)?;
            let shape = shapes.remove(i);
            let profile = gpu.profile(p.profile_id)?;
            Some(Creation {
                profile: profile.name.clone(),
                profile_id: p.profile_id,
                start: p.start,
                size: p.size,
                devices: shape
                    .compute
                    .iter()
                    .map(|&c| {
                        crate::mig_config::profile::device_name(&profile.name, profile.slices, c)
                    })
                    .collect(),
                compute: shape.compute,
            })
        })
        .collect();
    out.sort_by_key(|c| c.start);
    out
}

/// Renders plans for people.
pub fn render(plans: &[GpuPlan]) -> String {
    let mut out = String::new();
    for p in plans {
        out.push_str(&format!("GPU {} {} ({})\n", p.index, p.uuid, p.name));
        if !p.mig_capable {
            out.push_str("  not MIG capable: nothing to do\n");
            continue;
        }
        if p.entry.is_none() {
            out.push_str("  not matched by the config: left as it is\n");
            continue;
        }
        let word = |on: bool| if on { "enabled" } else { "disabled" };
        match (p.mode_now, p.mode_wanted) {
            (Some(now), Some(wanted)) if p.mode_change => out.push_str(&format!(
                "  mode: {} -> {} (GPU reset needed; a reboot where the GPU cannot be reset)\n",
                word(now),
                word(wanted)
            )),
            (Some(now), _) => out.push_str(&format!("  mode: {} (unchanged)\n", word(now))),
            _ => {}
        }
        for (verb, existing) in [("keep   ", &p.keep), ("destroy", &p.destroy)] {
            for e in existing {
                out.push_str(&format!(
                    "  {verb} GI {:>2} {:<11} slices {}-{}  [{}]\n",
                    e.gpu_instance,
                    e.profile,
                    e.start,
                    e.start + e.size - 1,
                    e.devices.join(", ")
                ));
            }
        }
        for c in &p.create {
            out.push_str(&format!(
                "  create  {:<14} slices {}-{}  [{}]\n",
                c.profile,
                c.start,
                c.start + c.size - 1,
                c.devices.join(", ")
            ));
        }
        if !p.changes() {
            out.push_str("  no change: already as configured\n");
        }
        if p.processes.is_empty() {
            out.push_str("  processes: none\n");
        } else {
            let pids: Vec<String> = p.processes.iter().map(u32::to_string).collect();
            out.push_str(&format!("  processes: {}\n", pids.join(", ")));
        }
    }
    out
}
