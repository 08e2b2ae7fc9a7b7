//! What gpud says of each prepared device in its claim's `status.devices[]` (KEP-4817): one
//! entry per allocation result, keyed as the API keys the list (driver, pool, device, and
//! `shareID` for a share of a GPU), with two conditions and the device's data.
//!
//! | condition | status | from |
//! |---|---|---|
//! | `Ready` | `True`, reason `Prepared` | the claim is in the checkpoint: its CDI spec is written and its config applied |
//! | `Healthy` | `True` / `False` (reason `Healthy` / `Unhealthy`), `Unknown` (reason `DeviceGone`) when the device is no longer on the node | the inventory's verdict, the one the health stream and the slices' taints follow ([`super::health_stream::states`]) |
//!
//! `data` holds what a workload or an operator wants to know without asking the node: the
//! device's UUID and its GPU's, the MIG profile and placement, the share of a GPU shared by
//! capacity and its MPS client limits, and the NVLink domain. The API keeps at most 10 KiB of
//! it; the MPS limits (the one part that grows with the claim) are left out of an entry that
//! would be larger, and `truncated` says so.

use serde_json::{Map, Value, json};

use super::checkpoint::{PreparedClaim, PreparedDevice};
use super::health_stream::DeviceState;
use super::topology::{NVLINK_DOMAIN, Topology};
use crate::dra_names::{self, DraDevice};
use crate::inventory::Snapshot;

/// The most bytes of `data` the API server keeps per device.
pub const MAX_DATA: usize = 10 * 1024;
/// The condition saying the device is configured.
pub const READY: &str = "Ready";
/// The condition following the inventory's health verdict.
pub const HEALTHY: &str = "Healthy";

/// The `status.devices[]` entries of `claim`'s devices for `driver`, in the checkpoint's
/// order. `health` is the health stream's view of the node, `prepared_at` when the claim was
/// prepared (RFC 3339): `Ready`'s transition time.
pub fn entries(
    driver: &str,
    claim: &PreparedClaim,
    snapshot: &Snapshot,
    (health, topology): (&[DeviceState], &Topology),
    prepared_at: &str,
) -> Vec<Value> {
    claim
        .devices
        .iter()
        .map(|device| {
            let mut entry = json!({
                "driver": driver,
                "pool": device.pool,
                "device": device.device,
                "conditions": [
                    condition(READY, "True", "Prepared",
                        "the device is configured and its CDI spec written", prepared_at),
                    health_condition(device, health, prepared_at),
                ],
                "data": data(claim, device, snapshot, topology),
            });
            if let Some(share) = &device.share {
                entry["shareID"] = Value::String(share.id.clone());
            }
            entry
        })
        .collect()
}

fn condition(kind: &str, status: &str, reason: &str, message: &str, since: &str) -> Value {
    json!({"type": kind, "status": status, "reason": reason, "message": message,
           "lastTransitionTime": since})
}

/// `Healthy` from the verdict on the device (a MIG device: the worse of it and its GPU).
fn health_condition(device: &PreparedDevice, health: &[DeviceState], prepared_at: &str) -> Value {
    let Some(state) = health.iter().find(|s| s.device == device.device) else {
        return condition(
            HEALTHY,
            "Unknown",
            "DeviceGone",
            "the device is no longer on the node (lost, or reconfigured)",
            prepared_at,
        );
    };
    // The verdict's own time, so a rewrite for another reason keeps the transition's.
    let since = u64::try_from(state.since)
        .ok()
        .filter(|s| *s > 0)
        .map(|s| {
            humantime::format_rfc3339_seconds(
                std::time::UNIX_EPOCH + std::time::Duration::from_secs(s),
            )
            .to_string()
        })
        .unwrap_or_else(|| prepared_at.to_owned());
    if state.healthy {
        condition(HEALTHY, "True", "Healthy", "", &since)
    } else {
        condition(HEALTHY, "False", "Unhealthy", &state.message, &since)
    }
}

/// The device's data, within [`MAX_DATA`].
fn data(
    claim: &PreparedClaim,
    device: &PreparedDevice,
    snapshot: &Snapshot,
    topology: &Topology,
) -> Value {
    let mut out = Map::new();
    out.insert("uuid".into(), device.uuid.clone().into());
    out.insert("gpuUUID".into(), device.gpu_uuid.clone().into());
    if let Some(DraDevice::Mig(gpu, mig)) = dra_names::find(snapshot, &device.device) {
        let mut about = json!({"profile": mig.profile});
        if let Some(placement) = &mig.placement {
            about["placement"] = json!({"start": placement.start, "size": placement.size});
        }
        out.insert("mig".into(), about);
        nvlink_domain(&mut out, topology, gpu.index);
    } else if let Some(gpu) = snapshot.gpus.iter().find(|g| g.uuid == device.gpu_uuid) {
        nvlink_domain(&mut out, topology, gpu.index);
    }
    if let Some(share) = &device.share {
        out.insert("share".into(), json!({"memoryBytes": share.memory}));
    }
    if let Some(mps) = claim
        .mps
        .as_ref()
        .filter(|m| m.gpus.contains(&device.gpu_uuid))
    {
        out.insert("mps".into(), json!({"limits": mps.limits}));
    }
    if let Some(time_slice) = &device.time_slice {
        out.insert("timeSlice".into(), time_slice.clone().into());
    }
    let mut value = Value::Object(out);
    if serde_json::to_vec(&value).map_or(0, |b| b.len()) > MAX_DATA {
        value["mps"] = json!({"limits": []});
        value["truncated"] = true.into();
    }
    value
}

fn nvlink_domain(out: &mut Map<String, Value>, topology: &Topology, index: u32) {
    if let Some((_, super::objects::Attribute::String(domain))) =
        topology.of(index).find(|(k, _)| *k == NVLINK_DOMAIN)
    {
        out.insert("nvlinkDomain".into(), domain.clone().into());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dra::checkpoint::PreparedDevice;
    use crate::dra::claim_mps::ClaimMps;
    use crate::dra::shares::Share;
    use crate::inventory::test_support::gpu;

    fn prepared(device: &str, uuid: &str) -> PreparedDevice {
        PreparedDevice {
            request_names: vec!["gpu".into()],
            pool: "node-a".into(),
            device: device.into(),
            uuid: uuid.into(),
            gpu_uuid: uuid.into(),
            cdi_device_ids: Vec::new(),
            time_slice: None,
            admin_access: false,
            share: None,
        }
    }

    fn claim(devices: Vec<PreparedDevice>, mps: Option<ClaimMps>) -> PreparedClaim {
        PreparedClaim {
            namespace: "ns".into(),
            name: "c".into(),
            devices,
            mps,
        }
    }

    fn state(device: &str, healthy: bool, message: &str) -> DeviceState {
        DeviceState {
            device: device.into(),
            healthy,
            since: 1_800_000_000,
            message: message.into(),
        }
    }

    #[test]
    fn an_entry_per_device_keyed_as_the_api_keys_them() {
        let mut snapshot = Snapshot::default();
        snapshot
            .gpus
            .push(gpu(0, "GPU-a", "NVIDIA H100 80GB HBM3", 81559));
        let mut topology = Topology::default();
        topology.insert_for_test(0, NVLINK_DOMAIN, "GPU-a");
        let mut shared = prepared("gpu-0", "GPU-a");
        shared.share = Some(Share {
            id: "4b1c0f4e-0000-4000-8000-000000000001".into(),
            memory: 8 << 30,
        });
        let mps = ClaimMps {
            gpus: vec!["GPU-a".into()],
            limits: vec!["set_default_active_thread_percentage 50".into()],
            daemon: None,
        };
        let claim = claim(vec![shared], Some(mps));
        let health = [state("gpu-0", true, "")];
        let got = entries(
            "gpu.nvidia.com",
            &claim,
            &snapshot,
            (&health, &topology),
            "2027-01-01T00:00:00Z",
        );
        assert_eq!(
            got,
            [json!({
                "driver": "gpu.nvidia.com", "pool": "node-a", "device": "gpu-0",
                "shareID": "4b1c0f4e-0000-4000-8000-000000000001",
                "conditions": [
                    {"type": "Ready", "status": "True", "reason": "Prepared",
                     "message": "the device is configured and its CDI spec written",
                     "lastTransitionTime": "2027-01-01T00:00:00Z"},
                    {"type": "Healthy", "status": "True", "reason": "Healthy", "message": "",
                     "lastTransitionTime": "2027-01-15T08:00:00Z"}
                ],
                "data": {"uuid": "GPU-a", "gpuUUID": "GPU-a", "nvlinkDomain": "GPU-a",
                         "share": {"memoryBytes": 8u64 << 30},
                         "mps": {"limits": ["set_default_active_thread_percentage 50"]}}
            })]
        );
    }

    #[test]
    fn health_follows_the_verdict_and_a_gone_device_is_unknown() {
        let snapshot = Snapshot::default();
        let claim = claim(vec![prepared("gpu-1", "GPU-b")], None);
        let sick = [state("gpu-1", false, "XID 79: GPU has fallen off the bus")];
        let got = entries("d", &claim, &snapshot, (&sick, &Topology::default()), "T");
        assert_eq!(
            got[0]["conditions"][1],
            json!({"type": "Healthy", "status": "False", "reason": "Unhealthy",
                   "message": "XID 79: GPU has fallen off the bus",
                   "lastTransitionTime": "2027-01-15T08:00:00Z"})
        );
        let got = entries("d", &claim, &snapshot, (&[], &Topology::default()), "T");
        assert_eq!(got[0]["conditions"][1]["status"], "Unknown");
        assert_eq!(got[0]["conditions"][1]["reason"], "DeviceGone");
        assert_eq!(got[0].get("shareID"), None);
    }

    #[test]
    fn data_stays_within_the_apis_limit() {
        let mps = ClaimMps {
            gpus: vec!["GPU-a".into()],
            limits: vec!["x".repeat(200); 80],
            daemon: None,
        };
        let claim = claim(vec![prepared("gpu-0", "GPU-a")], Some(mps));
        let got = entries(
            "d",
            &claim,
            &Snapshot::default(),
            (&[], &Topology::default()),
            "T",
        );
        let data = &got[0]["data"];
        assert!(serde_json::to_vec(data).unwrap().len() <= MAX_DATA);
        assert_eq!(data["truncated"], true);
        assert_eq!(data["mps"], json!({"limits": []}));
    }
}
