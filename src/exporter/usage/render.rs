//! The `gpud_container_gpu_*` families: one series per device and container, labelled as the
//! exporter's other gpud families (no `modelName`) plus `namespace`, `pod` and `container`.

use std::collections::BTreeMap;

use super::totals::Totals;
use crate::exporter::fields::Value;
use crate::exporter::pods::{DeviceKey, PodLabels};
use crate::exporter::render::{Frame, Model, gpu_instance_profile, header, identity, sample_line};

/// One family: its name, help, and the value it takes from a container's totals.
struct Family {
    name: &'static str,
    help: &'static str,
    value: fn(&Totals) -> Option<Value>,
}

fn ratio(percent_sum: Option<u64>) -> Option<Value> {
    percent_sum.map(|p| Value::Float((p as f64 / 100.0).min(1.0)))
}

const FAMILIES: [Family; 6] = [
    Family {
        name: "gpud_container_gpu_processes",
        help: "Processes of the container on the device (host processes under pod=\"\").",
        value: |t| Some(Value::Int(t.processes)),
    },
    Family {
        name: "gpud_container_gpu_memory_used_bytes",
        help: "GPU memory the container's processes hold on the device, in bytes.",
        value: |t| Some(Value::Int(t.memory_bytes)),
    },
    Family {
        name: "gpud_container_gpu_sm_utilization_ratio",
        help: "The container's share of the device's SM time in NVML's latest per-process sample (0-1).",
        value: |t| ratio(t.sm),
    },
    Family {
        name: "gpud_container_gpu_mem_copy_utilization_ratio",
        help: "The container's share of the device's memory-copy time in NVML's latest per-process sample (0-1).",
        value: |t| ratio(t.mem_copy),
    },
    Family {
        name: "gpud_container_gpu_encoder_utilization_ratio",
        help: "The container's share of the device's encoder time in NVML's latest per-process sample (0-1).",
        value: |t| ratio(t.encoder),
    },
    Family {
        name: "gpud_container_gpu_decoder_utilization_ratio",
        help: "The container's share of the device's decoder time in NVML's latest per-process sample (0-1).",
        value: |t| ratio(t.decoder),
    },
];

/// Writes the families for `totals`; a family no container has a value for is left out.
pub fn render(
    frame: &Frame<'_>,
    totals: &BTreeMap<(DeviceKey, PodLabels), Totals>,
    out: &mut String,
) {
    // Each device's labels once.
    let mut prefixes: BTreeMap<DeviceKey, String> = BTreeMap::new();
    for (key, _) in totals.keys() {
        if prefixes.contains_key(key) {
            continue;
        }
        let Some(gpu) = frame.snapshot.gpu(key.gpu) else {
            continue;
        };
        let instance = key.gpu_instance.map(|gi| {
            let profile = gpu
                .mig
                .devices
                .iter()
                .find(|m| m.gpu_instance_id == gi)
                .map_or("", gpu_instance_profile);
            (profile, gi)
        });
        prefixes.insert(*key, identity(frame, gpu, instance, Model::Omit));
    }
    for family in &FAMILIES {
        let start = out.len();
        header(out, family.name, family.help, "gauge");
        let after_header = out.len();
        for ((key, holder), sum) in totals {
            if let (Some(prefix), Some(value)) = (prefixes.get(key), (family.value)(sum)) {
                sample_line(out, family.name, prefix, Some(holder), &[], value);
            }
        }
        if out.len() == after_header {
            out.truncate(start);
        }
    }
}
