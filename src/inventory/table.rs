//! The human-readable rendering of a snapshot: a `nvidia-smi -L`-like device list followed by
//! a `nvidia-smi topo -m`-like connection matrix.

use std::fmt::Write as _;

use super::health::HealthState;
use super::model::{Gpu, Snapshot};
use super::remediation::Phase;

/// Renders the snapshot as text for people.
pub fn render(snapshot: &Snapshot) -> String {
    let mut out = String::new();
    render_node(&mut out, snapshot);
    render_devices(&mut out, snapshot);
    if snapshot.gpus.len() > 1 {
        out.push('\n');
        render_matrix(&mut out, snapshot);
    }
    out
}

fn render_node(out: &mut String, snapshot: &Snapshot) {
    let node = &snapshot.node;
    let _ = writeln!(out, "Node:    {}", node.hostname);
    let _ = writeln!(
        out,
        "Machine: {}",
        node.machine_type.as_deref().unwrap_or("unknown")
    );
    let _ = writeln!(
        out,
        "Driver:  {}   CUDA: {}   NVML: {}",
        node.driver_version,
        node.cuda_driver_version.as_deref().unwrap_or("unknown"),
        node.nvml_version.as_deref().unwrap_or("unknown"),
    );
    let _ = writeln!(out, "GPUs:    {}", snapshot.gpus.len());
    out.push('\n');
}

fn render_devices(out: &mut String, snapshot: &Snapshot) {
    for gpu in &snapshot.gpus {
        let name = if gpu.name.is_empty() {
            "<unknown>"
        } else {
            &gpu.name
        };
        let uuid = if gpu.uuid.is_empty() {
            "<unknown>"
        } else {
            &gpu.uuid
        };
        let _ = write!(out, "GPU {}: {name} (UUID: {uuid})", gpu.index);
        push_health(out, gpu.health.state, gpu.health.reason.as_deref());
        out.push('\n');
        if let Some(r) = gpu
            .remediation
            .as_ref()
            .filter(|r| r.phase != Phase::Healthy)
        {
            let _ = writeln!(
                out,
                "  Remediation: {} since {}: {}",
                r.phase, r.since, r.reason
            );
        }
        if gpu.mig.enabled != gpu.mig.pending_enabled {
            let next = if gpu.mig.pending_enabled {
                "enabled"
            } else {
                "disabled"
            };
            let _ = writeln!(
                out,
                "  MIG mode change pending: {next} after the next GPU reset"
            );
        }
        for mig in &gpu.mig.devices {
            let _ = write!(
                out,
                "  MIG {:<12} Device {:>2}: (UUID: {})",
                mig.profile, mig.index, mig.uuid
            );
            if mig.health.state != gpu.health.state {
                push_health(out, mig.health.state, mig.health.reason.as_deref());
            }
            out.push('\n');
        }
    }
}

fn push_health(out: &mut String, state: HealthState, reason: Option<&str>) {
    let word = match state {
        HealthState::Healthy => return,
        HealthState::Degraded => "degraded",
        HealthState::Unhealthy => "unhealthy",
    };
    let _ = write!(out, " [{word}: {}]", reason.unwrap_or("no reason given"));
}

/// The connection matrix: `NV<n>` where GPUs share NVLinks, else the PCIe level.
fn render_matrix(out: &mut String, snapshot: &Snapshot) {
    const CELL: usize = 7;
    let _ = write!(out, "{:CELL$}", "");
    for gpu in &snapshot.gpus {
        let _ = write!(out, "{:<CELL$}", format!("GPU{}", gpu.index));
    }
    out.push_str("NUMA Affinity\n");
    for row in &snapshot.gpus {
        let _ = write!(out, "{:<CELL$}", format!("GPU{}", row.index));
        for col in &snapshot.gpus {
            let _ = write!(out, "{:<CELL$}", cell(snapshot, row, col));
        }
        let numa = row
            .numa_node
            .map_or_else(|| "N/A".to_owned(), |n| n.to_string());
        let _ = writeln!(out, "{numa}");
    }
    out.push_str(
        "\nLegend:\n\
         \x20 X    = Self\n\
         \x20 SYS  = Connection traversing PCIe and the interconnect between NUMA nodes\n\
         \x20 NODE = Connection traversing PCIe and host bridges within a NUMA node\n\
         \x20 PHB  = Connection traversing PCIe and a PCIe host bridge\n\
         \x20 PXB  = Connection traversing multiple PCIe switches (no host bridge)\n\
         \x20 PIX  = Connection traversing a single PCIe switch\n\
         \x20 PSB  = Connection on the same board\n\
         \x20 NV#  = Connection traversing a bonded set of # NVLinks\n\
         \x20 ?    = Unknown (a GPU that does not answer)\n",
    );
}

fn cell(snapshot: &Snapshot, row: &Gpu, col: &Gpu) -> String {
    if row.index == col.index {
        return "X".to_owned();
    }
    match snapshot.link_between(row.index, col.index) {
        Some(link) if link.nvlinks > 0 => format!("NV{}", link.nvlinks),
        Some(link) => link.pcie.abbreviation().to_owned(),
        None => "?".to_owned(),
    }
}
