//! MPS leftovers and mismatches: a GPU left in EXCLUSIVE_PROCESS with no MPS control daemon
//! (a daemon that died, or was stopped without giving the GPU back, lets only one process use
//! it), and an MPS server running under a UID other than the workloads' (MPS starts one server
//! per UID; a client of another UID waits until the current server's clients finish).

use super::{gpu_list, joined};
use crate::doctor::env::Env;
use crate::doctor_report::Verdict;
use crate::nvml::compute_mode::ComputeMode;

/// The control daemon's command name.
pub const CONTROL: &str = "nvidia-cuda-mps-control";
/// The server's command name.
pub const SERVER: &str = "nvidia-cuda-mps-server";

/// `mps.compute-mode`
pub fn compute_mode(env: &Env) -> Verdict {
    let Some(all) = env.preflight() else {
        return env.no_nvml();
    };
    let exclusive: Vec<u32> = all
        .iter()
        .filter(|g| g.compute_mode == Some(ComputeMode::ExclusiveProcess))
        .map(|g| g.signals.gpu)
        .collect();
    if exclusive.is_empty() {
        return Verdict::ok("no GPU is in compute mode EXCLUSIVE_PROCESS");
    }
    let daemons = env.host.processes(CONTROL);
    if !daemons.is_empty() {
        return Verdict::ok(format!(
            "GPUs {} are in EXCLUSIVE_PROCESS, served by {} MPS control daemon(s)",
            gpu_list(&exclusive),
            daemons.len()
        ));
    }
    Verdict::fail(
        format!(
            "GPUs {} are in compute mode EXCLUSIVE_PROCESS but no {CONTROL} runs: only one \
             process at a time can use them (left behind by an MPS daemon that died or was \
             stopped without restoring the mode)",
            gpu_list(&exclusive)
        ),
        "start the MPS control daemon (gpud mps-control-daemon, or gpud run with sharing.mps \
         in the config), or give the GPUs back: nvidia-smi -i <GPU> -c DEFAULT",
    )
}

/// `mps.uid`
pub fn uid(env: &Env) -> Verdict {
    let servers = env.host.processes(SERVER);
    let controls = env.host.processes(CONTROL);
    if servers.is_empty() && controls.is_empty() {
        return Verdict::skip("no MPS daemon runs");
    }
    let Some(expected) = env.options.mps_workload_uid else {
        return Verdict::skip(
            "the workloads' UID is not given (--mps-workload-uid, GPUD_MPS_WORKLOAD_UID)",
        );
    };
    let mut wrong: Vec<String> = Vec::new();
    for (pid, uid) in &servers {
        if *uid != Some(expected) {
            wrong.push(format!("{SERVER} pid {pid} runs as UID {}", shown(*uid)));
        }
    }
    // The control daemon starts servers for other UIDs only as root.
    for (pid, uid) in &controls {
        if *uid != Some(expected) && *uid != Some(0) {
            wrong.push(format!("{CONTROL} pid {pid} runs as UID {}", shown(*uid)));
        }
    }
    if wrong.is_empty() {
        return Verdict::ok(format!(
            "{} MPS server(s) and {} control daemon(s) run as UID {expected} or root",
            servers.len(),
            controls.len()
        ));
    }
    Verdict::fail(
        format!(
            "{}; workloads run as UID {expected}, so their MPS clients wait until that \
             server's clients finish",
            joined(&wrong)
        ),
        format!(
            "run every MPS workload as UID {expected} (securityContext.runAsUser), or stop \
             the stray MPS server; the control daemon runs as root"
        ),
    )
}

fn shown(uid: Option<u32>) -> String {
    uid.map_or_else(|| "unknown".to_owned(), |u| u.to_string())
}
