//! NVSwitch systems: CUDA reports "system not yet initialized" until the fabric is up. On
//! HGX/DGX boards the fabric manager daemon brings it up; on GB200 NVL compute trays there is
//! no daemon on the node and NVML's fabric registration tells.

use super::joined;
use crate::doctor::env::Env;
use crate::doctor_report::Verdict;
use crate::inventory::model::{FabricState, NvLinkRemote};

/// The fabric manager's process name.
const FABRIC_MANAGER: &str = "nv-fabricmanager";

/// `fabric.state`
pub fn state(env: &Env) -> Verdict {
    let Some(snapshot) = env.snapshot() else {
        return env.no_nvml();
    };
    let registered: Vec<_> = snapshot
        .gpus
        .iter()
        .filter_map(|g| g.fabric.as_ref().map(|f| (g.index, f)))
        .collect();
    if !registered.is_empty() {
        let problems: Vec<String> = registered
            .iter()
            .filter(|(_, f)| !f.is_attached())
            .map(|(index, f)| {
                let state = match f.state {
                    FabricState::NotStarted => "not started",
                    FabricState::InProgress => "in progress",
                    FabricState::Completed => "completed",
                };
                format!(
                    "GPU {index}: fabric registration {state}, status {}",
                    f.status
                )
            })
            .collect();
        return if problems.is_empty() {
            Verdict::ok(format!(
                "all {} GPUs registered with NVLink fabric {}",
                registered.len(),
                registered[0].1.cluster_uuid
            ))
        } else {
            Verdict::fail(
                joined(&problems),
                "check the rack's NVLink switch trays and their fabric manager (NMX); CUDA jobs fail with 'system not yet initialized' until registration completes",
            )
        };
    }
    let switched = snapshot.gpus.iter().any(|g| {
        g.nvlinks
            .iter()
            .any(|l| matches!(l.remote, Some(NvLinkRemote::Switch { .. })))
    });
    if !switched {
        return Verdict::skip("no NVSwitch: GPUs are not linked through a switch fabric");
    }
    if env.host.process_running(FABRIC_MANAGER) {
        Verdict::ok("NVSwitch system; nv-fabricmanager is running")
    } else {
        Verdict::fail(
            "NVSwitch system but nv-fabricmanager is not running: CUDA fails with 'system not yet initialized'",
            "start it: systemctl enable --now nvidia-fabricmanager (the same version as the driver)",
        )
    }
}
