//! The sampling thread: reads NVML every collect interval, off the scrape path.
//!
//! NVML calls block (a GPU falling off the bus can stall one for seconds), so sampling runs on
//! its own thread, `gpud-sampler`, never on an async worker. Each cycle reads the devices the
//! inventory currently lists, derives the NVLink throughput from the counters of the previous
//! cycle, and publishes the result through a `watch` channel; the renderer turns it into the
//! exposition body. A scrape never waits for a cycle.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use super::usage::cgroup::Owner;
use super::usage::owners::ProcessOwners;
use crate::inventory::{Inventory, Snapshot};
use crate::nvml::sampling::{
    GpuTarget, InstanceTarget, NodeTelemetry, Reading, SampleStatus, TelemetryPlan,
};
use crate::nvml::{Nvml, NvmlError};

/// One finished cycle.
#[derive(Debug, Clone, PartialEq)]
pub struct Sampled {
    /// The readings.
    pub telemetry: NodeTelemetry,
    /// NVLink throughput per GPU since the previous cycle, MB/s.
    pub nvlink_rates: Vec<(u32, f64)>,
    /// Cycles completed, this one included.
    pub cycles: u64,
    /// Wall time of this cycle.
    pub duration: Duration,
    /// When this cycle finished: a sample that gets old means an NVML call hangs.
    pub at: Instant,
    /// The pod and container of each process in the sample (with per-pod usage on).
    pub owners: HashMap<u32, Option<Owner>>,
}

/// The running thread; dropping it stops the thread after its current cycle.
#[derive(Debug)]
pub struct SamplerThread {
    stop: Option<mpsc::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Drop for SamplerThread {
    fn drop(&mut self) {
        // Dropping the sender wakes the thread's wait with `Disconnected`.
        self.stop.take();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Starts sampling every `interval`, the first cycle at once.
pub fn start(
    nvml: Nvml,
    inventory: Inventory,
    plan: TelemetryPlan,
    interval: Duration,
    owners: Option<ProcessOwners>,
    tx: watch::Sender<Option<Arc<Sampled>>>,
) -> Result<SamplerThread, NvmlError> {
    let (stop, stopped) = mpsc::channel();
    let thread = crate::logging::spawn_thread("gpud-sampler", move || {
        run(&nvml, &inventory, &plan, interval, owners, &tx, &stopped)
    })
    .map_err(|source| NvmlError::Thread {
        what: "sampler",
        source,
    })?;
    Ok(SamplerThread {
        stop: Some(stop),
        thread: Some(thread),
    })
}

fn run(
    nvml: &Nvml,
    inventory: &Inventory,
    plan: &TelemetryPlan,
    interval: Duration,
    mut owners: Option<ProcessOwners>,
    tx: &watch::Sender<Option<Arc<Sampled>>>,
    stopped: &mpsc::Receiver<()>,
) {
    let mut sampler = nvml.sampler();
    let mut nvlink = NvLinkCounters::default();
    let mut cycles = 0u64;
    let mut next = Instant::now();
    loop {
        let targets = targets(&inventory.current());
        let started = Instant::now();
        let read_at = owners.as_ref().and_then(ProcessOwners::now);
        let telemetry = sampler.sample(plan, &targets);
        // Owners are read right after NVML, off the scrape path like NVML itself.
        let owners = owners.as_mut().map_or_else(HashMap::new, |owners| {
            let pids: Vec<u32> = telemetry
                .gpus
                .iter()
                .flat_map(|g| g.processes.iter().flatten().map(|p| p.pid))
                .collect();
            owners.resolve(&pids, read_at)
        });
        let duration = started.elapsed();
        cycles += 1;
        let nvlink_rates = nvlink.rates(&telemetry, started);
        let sampled = Sampled {
            telemetry,
            nvlink_rates,
            cycles,
            duration,
            at: Instant::now(),
            owners,
        };
        if tx.send(Some(Arc::new(sampled))).is_err() {
            return; // nobody renders any more
        }
        // Fixed-rate schedule; a cycle that overran starts the next one at once instead of
        // trying to catch up with a burst.
        next += interval;
        let now = Instant::now();
        if next < now {
            next = now;
        }
        match stopped.recv_timeout(next - now) {
            Err(RecvTimeoutError::Timeout) => {}
            Ok(()) | Err(RecvTimeoutError::Disconnected) => return,
        }
    }
}

/// What to sample, from the inventory: every GPU, and one MIG device per GPU instance of a
/// MIG-enabled GPU (the instance's memory is read through it). The instances of a GPU the MIG
/// applier is repartitioning are left out until it is done: they are being destroyed and
/// created under the sampler.
pub fn targets(snapshot: &Snapshot) -> Vec<GpuTarget> {
    snapshot
        .gpus
        .iter()
        .map(|gpu| {
            let mut instances: Vec<InstanceTarget> = Vec::new();
            if gpu.mig.enabled && !gpu.mig.reconfiguring {
                for mig in &gpu.mig.devices {
                    if !instances
                        .iter()
                        .any(|i| i.gpu_instance_id == mig.gpu_instance_id)
                    {
                        instances.push(InstanceTarget {
                            gpu_instance_id: mig.gpu_instance_id,
                            mig_device_index: mig.index,
                        });
                    }
                }
                instances.sort_by_key(|i| i.gpu_instance_id);
            }
            GpuTarget {
                index: gpu.index,
                nvlinks: gpu.nvlinks.iter().map(|l| l.link).collect(),
                instances,
            }
        })
        .collect()
}

/// The NVLink data counters of the previous cycle, to turn counters into throughput.
#[derive(Debug, Default)]
struct NvLinkCounters {
    last: HashMap<u32, (u64, Instant)>,
}

impl NvLinkCounters {
    fn rates(&mut self, telemetry: &NodeTelemetry, at: Instant) -> Vec<(u32, f64)> {
        let mut rates = Vec::new();
        for gpu in &telemetry.gpus {
            let counter = (gpu.status == SampleStatus::Ok)
                .then(|| gpu.value(Reading::NvLinkDataKib))
                .flatten();
            let Some(kib) = counter else {
                self.last.remove(&gpu.index);
                continue;
            };
            if let Some((before, then)) = self.last.insert(gpu.index, (kib, at))
                && let Some(rate) = throughput_mb_per_s(before, kib, at.duration_since(then))
            {
                rates.push((gpu.index, rate));
            }
        }
        rates
    }
}

/// MB/s (10^6 bytes) moved between two readings of a KiB counter `elapsed` apart; `None` when
/// the counter went backwards (driver reload, GPU reset). Readings taken at the same instant
/// move nothing.
pub fn throughput_mb_per_s(before_kib: u64, after_kib: u64, elapsed: Duration) -> Option<f64> {
    let delta = after_kib.checked_sub(before_kib)?;
    if elapsed.is_zero() || delta == 0 {
        return Some(0.0);
    }
    Some(delta as f64 * 1024.0 / 1e6 / elapsed.as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instances_of_a_gpu_being_repartitioned_are_not_sampled() {
        use crate::inventory::model::Node;
        use crate::inventory::test_support::{gpu, mig, with_migs};
        let a100 = |i: u32, uuid: &str| gpu(i, uuid, "NVIDIA A100-SXM4-80GB", 81920);
        let mut snapshot = Snapshot {
            node: Node {
                hostname: "node-a".into(),
                driver_version: "570.133.20".into(),
                cuda_driver_version: None,
                nvml_version: None,
                machine_type: None,
            },
            gpus: vec![
                with_migs(a100(0, "GPU-0"), vec![mig(0, "MIG-0", 1, 0)]),
                with_migs(a100(1, "GPU-1"), vec![mig(0, "MIG-1", 2, 0)]),
            ],
            topology: Vec::new(),
        };
        snapshot.set_reconfiguring(&[1]);
        let sampled: Vec<(u32, usize)> = targets(&snapshot)
            .iter()
            .map(|t| (t.index, t.instances.len()))
            .collect();
        assert_eq!(sampled, [(0, 1), (1, 0)]);
    }

    #[test]
    fn throughput_from_counters() {
        let s = Duration::from_secs(2);
        assert_eq!(throughput_mb_per_s(1000, 1000, s), Some(0.0));
        assert_eq!(throughput_mb_per_s(0, 1_000_000, s), Some(512.0));
        assert_eq!(throughput_mb_per_s(10, 5, s), None, "reset");
        assert_eq!(throughput_mb_per_s(0, 10, Duration::ZERO), Some(0.0));
    }
}
