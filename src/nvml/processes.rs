//! Per-process GPU use: which processes run on a GPU, the memory each holds, and each one's
//! share of the GPU's SM, memory-copy, encoder and decoder time since the last read.
//!
//! A few calls per GPU and cycle, whatever the number of processes: the running compute,
//! graphics and MPS-client processes (with their memory and, on a MIG-enabled GPU, their GPU
//! instance) and the per-process utilisation samples newer than the last one seen on that GPU. NVML keeps a
//! short ring of samples per GPU, so utilisation is the latest sample of each process within
//! the window since the previous read; a process with no sample in it was idle. A driver (or
//! a MIG-enabled GPU) that has no per-process utilisation still reports memory.

use std::collections::HashMap;

use nvml_wrapper::Device;
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError as E;

/// One process on a GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessUsage {
    /// The host PID.
    pub pid: u32,
    /// The GPU instance it runs in, on a MIG-enabled GPU.
    pub gpu_instance: Option<u32>,
    /// GPU memory it holds, in bytes (unknown on some platforms).
    pub memory_bytes: Option<u64>,
    /// Its utilisation, percent, when the driver samples processes.
    pub utilization: Option<ProcessUtilization>,
}

/// One process's share of the GPU's engines in the latest sample, percent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProcessUtilization {
    pub sm: u32,
    pub mem_copy: u32,
    pub encoder: u32,
    pub decoder: u32,
}

/// How a GPU's processes could be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProcessesRead {
    /// The processes, in NVML's order.
    Read(Vec<ProcessUsage>),
    /// The GPU is lost.
    Lost,
    /// The process list is not available (the call is missing or refused).
    Unavailable(String),
}

/// Reads the processes on `device`. `last_seen` is the timestamp of the newest utilisation
/// sample already read on this GPU (0 at first), moved on to the newest read now.
pub fn read(device: &Device<'_>, last_seen: &mut u64) -> ProcessesRead {
    let mut listed = match device.running_compute_processes() {
        Ok(listed) => listed,
        Err(E::GpuLost) => return ProcessesRead::Lost,
        Err(err) => {
            return ProcessesRead::Unavailable(format!(
                "nvmlDeviceGetComputeRunningProcesses: {err}"
            ));
        }
    };
    // Graphics processes, and the clients of an MPS server (the compute list shows the
    // server itself): a process in two lists counts once. Optional: a driver or GPU without
    // them leaves them out.
    for more in [
        device.running_graphics_processes(),
        device.mps_running_compute_processes(),
    ] {
        match more {
            Ok(more) => {
                for process in more {
                    if !listed.iter().any(|p| p.pid == process.pid) {
                        listed.push(process);
                    }
                }
            }
            Err(E::GpuLost) => return ProcessesRead::Lost,
            Err(_) => {}
        }
    }
    let samples = if listed.is_empty() {
        HashMap::new()
    } else {
        match device.process_utilization_stats(*last_seen) {
            Ok(samples) => latest_per_process(samples, last_seen),
            Err(E::GpuLost) => return ProcessesRead::Lost,
            // No sample newer than `last_seen`: every process was idle.
            Err(E::NotFound) => HashMap::new(),
            // Not sampled on this GPU (MIG mode, an old driver): memory only.
            Err(_) => {
                return ProcessesRead::Read(usages(listed, None));
            }
        }
    };
    ProcessesRead::Read(usages(listed, Some(&samples)))
}

impl super::Nvml {
    /// The processes on GPU `index` now, those in its MIG instances included (what a reset
    /// would kill). Blocks on the driver.
    pub fn processes_on(&self, index: u32) -> ProcessesRead {
        match self.lib.device_by_index(index) {
            Ok(device) => read(&device, &mut 0),
            Err(E::GpuLost) => ProcessesRead::Lost,
            Err(err) => ProcessesRead::Unavailable(format!("nvmlDeviceGetHandleByIndex: {err}")),
        }
    }
}

fn usages(
    listed: Vec<nvml_wrapper::struct_wrappers::device::ProcessInfo>,
    samples: Option<&HashMap<u32, ProcessUtilization>>,
) -> Vec<ProcessUsage> {
    listed
        .into_iter()
        .map(|p| ProcessUsage {
            pid: p.pid,
            gpu_instance: p.gpu_instance_id,
            memory_bytes: match p.used_gpu_memory {
                UsedGpuMemory::Used(bytes) => Some(bytes),
                UsedGpuMemory::Unavailable => None,
            },
            utilization: samples.map(|s| s.get(&p.pid).copied().unwrap_or_default()),
        })
        .collect()
}

/// The newest sample of each process, and the newest timestamp into `last_seen`.
fn latest_per_process(
    samples: Vec<nvml_wrapper::struct_wrappers::device::ProcessUtilizationSample>,
    last_seen: &mut u64,
) -> HashMap<u32, ProcessUtilization> {
    let mut newest: HashMap<u32, (u64, ProcessUtilization)> = HashMap::new();
    for s in samples {
        *last_seen = (*last_seen).max(s.timestamp);
        let value = ProcessUtilization {
            sm: s.sm_util.min(100),
            mem_copy: s.mem_util.min(100),
            encoder: s.enc_util.min(100),
            decoder: s.dec_util.min(100),
        };
        let entry = newest.entry(s.pid).or_insert((s.timestamp, value));
        if s.timestamp >= entry.0 {
            *entry = (s.timestamp, value);
        }
    }
    newest.into_iter().map(|(pid, (_, v))| (pid, v)).collect()
}
