//! Sums of per-process use per device and container. Pure: the sample, the owners of its
//! PIDs and the pod directory in, sorted totals out.

use std::collections::{BTreeMap, HashMap};

use super::cgroup::Owner;
use crate::exporter::pods::{DeviceKey, PodLabels};
use crate::inventory::Snapshot;
use crate::nvml::sampling::{NodeTelemetry, SampleStatus};
use crate::pod_directory::PodDirectory;

/// One container's use of one device (a GPU, or a GPU instance of a MIG-enabled GPU).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Totals {
    pub processes: u64,
    pub memory_bytes: u64,
    /// Sums of the processes' percentages; `None` where the driver samples no process.
    pub sm: Option<u64>,
    pub mem_copy: Option<u64>,
    pub encoder: Option<u64>,
    pub decoder: Option<u64>,
}

fn add(sum: &mut Option<u64>, value: u32) {
    *sum = Some(sum.unwrap_or(0) + u64::from(value));
}

/// Every device's use per container, in device and label order. A process's device is its
/// GPU instance where the GPU has MIG on and NVML names one, else its GPU.
pub fn totals(
    snapshot: &Snapshot,
    telemetry: &NodeTelemetry,
    owners: &HashMap<u32, Option<Owner>>,
    directory: &PodDirectory,
) -> BTreeMap<(DeviceKey, PodLabels), Totals> {
    let mut out: BTreeMap<(DeviceKey, PodLabels), Totals> = BTreeMap::new();
    for gpu in telemetry
        .gpus
        .iter()
        .filter(|g| g.status == SampleStatus::Ok)
    {
        let Some(processes) = &gpu.processes else {
            continue;
        };
        let mig = snapshot.gpu(gpu.index).is_some_and(|g| g.mig.enabled);
        for process in processes {
            let key = DeviceKey {
                gpu: gpu.index,
                gpu_instance: process.gpu_instance.filter(|_| mig),
            };
            let holder = holder(owners.get(&process.pid).and_then(Option::as_ref), directory);
            let sum = out.entry((key, holder)).or_default();
            sum.processes += 1;
            sum.memory_bytes += process.memory_bytes.unwrap_or(0);
            if let Some(u) = process.utilization {
                add(&mut sum.sm, u.sm);
                add(&mut sum.mem_copy, u.mem_copy);
                add(&mut sum.encoder, u.encoder);
                add(&mut sum.decoder, u.decoder);
            }
        }
    }
    out
}

/// The labels of a process's container: names from the directory, or all empty for a process
/// of no pod known here.
fn holder(owner: Option<&Owner>, directory: &PodDirectory) -> PodLabels {
    let named = owner.and_then(|o| {
        let pod = directory.pod(&o.pod_uid)?;
        let container = o
            .container_id
            .as_ref()
            .and_then(|id| pod.containers.get(id))
            .cloned()
            .unwrap_or_default();
        Some(PodLabels {
            namespace: pod.namespace.clone(),
            pod: pod.name.clone(),
            container,
            vgpu: None,
        })
    });
    named.unwrap_or(PodLabels {
        namespace: String::new(),
        pod: String::new(),
        container: String::new(),
        vgpu: None,
    })
}
