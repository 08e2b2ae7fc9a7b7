//! GPUs shared by capacity (`--dra-shared-capacity`; consumable capacity, KEP-5075): each
//! whole GPU is published with `allowMultipleAllocations: true` and a request policy on its
//! `memory`, so the scheduler may give one GPU to several claims, each taking the memory it
//! asks for (`capacity.requests.memory`) and never more than the GPU has in all.
//!
//! The policy: a claim takes whole GiB (`validRange` from 1Gi in steps of 1Gi; the scheduler
//! rounds a request up), and a claim that names no amount takes the GPU's memory rounded down
//! to whole GiB (`default`) — nearly all of it, so a claim written for an exclusive GPU still
//! gets one, and sharing is what a claim asks for. MIG devices are not shared: their memory
//! is fixed by the partition.
//!
//! At prepare a shared allocation carries a `shareID` and `consumedCapacity.memory`. gpud does
//! not take the scheduler's word that the shares fit: the shares prepared on a GPU, this
//! claim's included, must add up to at most its memory, else the claim is refused, naming the
//! device, the shares and the total. Shares are kept in the checkpoint, so a restart keeps the
//! accounting; unprepare frees the share with the claim.
//!
//! What the workload sees: `GPUD_GPU_MEMORY_SHARES=<GPU UUID>=<quantity>[,…]` on every shared
//! device of the claim (for time-slicing, where nothing enforces it, the application reads its
//! budget there), and under MPS the client limits of its share: a pinned-memory limit of the
//! share (`CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=<MiB>M`) and the share of memory as the
//! percentage of threads (`CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`, rounded down so shares that
//! fit the memory never ask for more than 100 %, at least 1). Claims sharing a GPU under MPS
//! use one control daemon over that GPU (its folder named after the GPU), started by the first
//! and stopped with the last.

use serde::{Deserialize, Serialize};

use super::claim_mps::ClaimMps;
use super::objects::{AllocationResult, Attribute, Device, RequestPolicy, ValidRange};
use super::opaque::MpsSettings;
use super::quantity;
use super::slices::binary_quantity;

const MIB: u64 = 1024 * 1024;
const GIB: u64 = 1024 * MIB;
/// The smallest share, and the step between shares.
pub const STEP: u64 = GIB;
/// The environment variable naming the claim's shares.
pub const SHARES_ENV: &str = "GPUD_GPU_MEMORY_SHARES";

/// Makes every whole GPU of `devices` shareable by memory.
pub fn offer(devices: &mut [Device]) {
    for device in devices {
        if device.attributes.get("type") != Some(&Attribute::String("gpu".into())) {
            continue;
        }
        let Some(memory) = device.capacity.get_mut("memory") else {
            continue;
        };
        let Some(bytes) = quantity::bytes(&memory.value).filter(|b| *b >= STEP) else {
            continue;
        };
        memory.request_policy = Some(policy(bytes));
        device.allow_multiple_allocations = Some(true);
    }
}

/// The request policy of a GPU with `bytes` of memory.
pub fn policy(bytes: u64) -> RequestPolicy {
    RequestPolicy {
        default: Some(binary_quantity(bytes / STEP * STEP)),
        valid_values: Vec::new(),
        valid_range: Some(ValidRange {
            min: binary_quantity(STEP),
            max: None,
            step: Some(binary_quantity(STEP)),
        }),
    }
}

/// A claim's share of a GPU, as the checkpoint keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Share {
    /// The allocation's `shareID`.
    pub id: String,
    /// The memory it takes, in bytes.
    pub memory: u64,
}

/// The share an allocation result takes; `None` for an exclusive allocation.
pub fn of_result(result: &AllocationResult) -> Result<Option<Share>, String> {
    if result.share_id.is_none() && result.consumed_capacity.is_empty() {
        return Ok(None);
    }
    let device = &result.device;
    let id = result.share_id.clone().ok_or_else(|| {
        format!("device {device}: the allocation has consumedCapacity but no shareID; refused")
    })?;
    let memory = result.consumed_capacity.get("memory").ok_or_else(|| {
        format!(
            "device {device}: the allocation has shareID {id} but no consumedCapacity.memory \
             (gpud shares GPUs by memory); refused"
        )
    })?;
    let memory = quantity::bytes(memory).ok_or_else(|| {
        format!("device {device}: consumedCapacity.memory {memory:?} is not a quantity (e.g. 20Gi)")
    })?;
    Ok(Some(Share { id, memory }))
}

/// Checks that `asked` more bytes fit a device of `total` bytes beside `held` (what each
/// other holder — `namespace/name` — takes); the error names the device, the shares and the
/// total.
pub fn check_fits(
    device: &str,
    total: u64,
    held: &[(String, u64)],
    asked: u64,
) -> Result<(), String> {
    let sum = held.iter().map(|(_, b)| *b).sum::<u64>() + asked;
    if sum <= total {
        return Ok(());
    }
    let others: Vec<String> = held
        .iter()
        .map(|(holder, bytes)| format!("{} for {holder}", binary_quantity(*bytes)))
        .collect();
    Err(format!(
        "device {device}: this claim's share of {} and the shares prepared on it ({}) add up to \
         {}, over its memory of {}; refused (the scheduler should not have allocated it)",
        binary_quantity(asked),
        if others.is_empty() {
            "none".to_owned()
        } else {
            others.join(", ")
        },
        binary_quantity(sum),
        binary_quantity(total)
    ))
}

/// The environment of a claim's shared devices: its shares by GPU UUID, and under MPS the
/// client limits of its one shared GPU (`mps_total`: that GPU's memory in bytes).
pub fn env(shares: &[(String, u64)], mps_total: Option<u64>) -> Vec<String> {
    if shares.is_empty() {
        return Vec::new();
    }
    let listed: Vec<String> = shares
        .iter()
        .map(|(uuid, bytes)| format!("{uuid}={}", binary_quantity(*bytes)))
        .collect();
    let mut out = vec![format!("{SHARES_ENV}={}", listed.join(","))];
    if let (Some(total), [(_, bytes)]) = (mps_total, shares) {
        out.push(format!(
            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0={}M",
            bytes / MIB
        ));
        out.push(format!(
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={}",
            thread_percentage(*bytes, total)
        ));
    }
    out
}

/// The share of `total` that `bytes` is, in whole percent rounded down, from 1 to 100.
pub fn thread_percentage(bytes: u64, total: u64) -> u64 {
    let percent = u128::from(bytes) * 100 / u128::from(total.max(1));
    u64::try_from(percent).unwrap_or(100).clamp(1, 100)
}

/// The MPS daemon of a claim sharing GPU `gpu_uuid` by capacity: one per GPU, shared by the
/// claims on it, without daemon-wide limits (each client has its share's). Limits in the
/// claim's `mpsConfig` would be the daemon's, over every claim on the GPU: refused.
pub fn shared_mps(gpu_uuid: &str, settings: &MpsSettings) -> Result<ClaimMps, String> {
    if *settings != MpsSettings::default() {
        return Err(
            "the claim shares its GPU by capacity: its MPS limits come from its share \
             (capacity.requests.memory), so leave the limits out of sharing.mpsConfig"
                .to_owned(),
        );
    }
    Ok(ClaimMps {
        gpus: vec![gpu_uuid.to_owned()],
        limits: Vec::new(),
        daemon: Some(format!("shared-{gpu_uuid}")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dra::objects::Capacity;

    #[test]
    fn whole_gpus_are_offered_with_their_memory_policy_and_mig_devices_are_not() {
        let gpu = |kind: &str| Device {
            name: format!("{kind}-0"),
            attributes: [("type".into(), Attribute::String(kind.into()))].into(),
            capacity: [("memory".into(), Capacity::of("81559Mi".into()))].into(),
            ..Device::default()
        };
        let mut devices = vec![gpu("gpu"), gpu("mig")];
        offer(&mut devices);
        assert_eq!(
            serde_json::to_value(&devices[0]).unwrap(),
            serde_json::json!({"name": "gpu-0", "attributes": {"type": {"string": "gpu"}},
                "allowMultipleAllocations": true,
                "capacity": {"memory": {"value": "81559Mi", "requestPolicy": {
                    "default": "79Gi", "validRange": {"min": "1Gi", "step": "1Gi"}}}}})
        );
        assert_eq!(devices[1], gpu("mig"), "MIG devices are not shared");
    }

    #[test]
    fn shares_add_up_to_at_most_the_memory_and_set_the_mps_client_limits() {
        let total = 81559 * MIB;
        let held = [("ns/a".to_owned(), 20 * GIB), ("ns/b".to_owned(), 40 * GIB)];
        assert_eq!(check_fits("gpu-0", total, &held, 19 * GIB), Ok(()));
        assert_eq!(
            check_fits("gpu-0", total, &held, 20 * GIB).unwrap_err(),
            "device gpu-0: this claim's share of 20Gi and the shares prepared on it (20Gi for \
             ns/a, 40Gi for ns/b) add up to 80Gi, over its memory of 81559Mi; refused (the \
             scheduler should not have allocated it)"
        );
        assert_eq!(
            env(&[("GPU-a".into(), 20 * GIB)], Some(total)),
            [
                "GPUD_GPU_MEMORY_SHARES=GPU-a=20Gi",
                "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=20480M",
                "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25",
            ]
        );
        assert_eq!(
            env(&[("GPU-a".into(), GIB), ("GPU-b".into(), 2 * GIB)], None),
            ["GPUD_GPU_MEMORY_SHARES=GPU-a=1Gi,GPU-b=2Gi"]
        );
        assert_eq!(thread_percentage(1, total), 1);
        assert_eq!(thread_percentage(total, total), 100);
    }
}
