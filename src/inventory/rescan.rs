//! Merging a fresh discovery into the previous snapshot.
//!
//! Discovery sees only what NVML says now. Two things must survive a rescan:
//! - **identity of a lost GPU**: once a GPU falls off the bus NVML refuses even its handle, but
//!   operators and the device plugin still need to know *which* GPU (UUID, bus id) is gone;
//! - **health owned by others**: the health watcher's verdicts (an XID, an ECC error) are not
//!   visible to enumeration and must not be cleared by it. Discovery only clears what
//!   discovery set (a GPU that was lost and answers again).
//!
//! A state that has not changed keeps its original `since`, so a rescan of an unchanged node
//! produces an identical snapshot and wakes no subscriber.

use super::health::Health;
use super::model::{Gpu, MigDevice, PcieLevel, Snapshot};

/// The snapshot to publish after a rescan that produced `fresh`.
pub fn merge(previous: &Snapshot, mut fresh: Snapshot) -> Snapshot {
    let mut carried = Vec::new();
    for gpu in &mut fresh.gpus {
        let Some(before) = previous.gpu(gpu.index) else {
            continue;
        };
        // A GPU that went lost during the scan answered only part of it; what it answered
        // before is the better picture.
        let lost_now = gpu.health.set_by_discovery() && !gpu.health.is_healthy();
        let same_device = gpu.uuid.is_empty() || gpu.uuid == before.uuid;
        if lost_now && same_device && !before.uuid.is_empty() {
            carry_identity(gpu, before);
            carried.push(gpu.index);
        }
        if gpu.uuid == before.uuid {
            gpu.health = merge_health(&before.health, &gpu.health);
            // Only the MIG applier sets and clears its mark; a rescan during the change
            // keeps the GPU withdrawn.
            gpu.mig.reconfiguring = before.mig.reconfiguring;
            // Only the remediation subsystem sets it.
            gpu.remediation = before.remediation.clone();
            // Only the DRA plugin's rule watcher sets them.
            gpu.device_taints = before.device_taints.clone();
            merge_mig_health(&mut gpu.mig.devices, &before.mig.devices);
        }
    }
    for pair in &mut fresh.topology {
        // What a lost GPU could not answer is remembered from before.
        let unknown_now = carried.contains(&pair.a)
            || carried.contains(&pair.b)
            || pair.pcie == PcieLevel::Unknown;
        if let Some(before) = previous
            .link_between(pair.a, pair.b)
            .filter(|_| unknown_now)
        {
            *pair = before.clone();
        }
    }
    fresh
}

/// Copies what was known of a GPU that can no longer be read, keeping its new health.
fn carry_identity(gpu: &mut Gpu, before: &Gpu) {
    let health = std::mem::take(&mut gpu.health);
    *gpu = before.clone();
    for mig in &mut gpu.mig.devices {
        mig.health = health.clone();
    }
    gpu.health = health;
}

/// The health to publish given what the last snapshot said and what discovery sees now.
fn merge_health(before: &Health, now: &Health) -> Health {
    if same_condition(before, now) {
        // Unchanged: keep the original `since`.
        return before.clone();
    }
    if now.is_healthy() && !before.is_healthy() && !before.set_by_discovery() {
        // Discovery cannot see XIDs or ECC errors; the watcher clears its own verdicts.
        return before.clone();
    }
    now.clone()
}

fn merge_mig_health(devices: &mut [MigDevice], before: &[MigDevice]) {
    for mig in devices {
        if let Some(old) = before.iter().find(|old| old.uuid == mig.uuid) {
            mig.health = merge_health(&old.health, &mig.health);
        }
    }
}

fn same_condition(a: &Health, b: &Health) -> bool {
    a.state == b.state && a.reason == b.reason && a.xid == b.xid
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use super::*;
    use crate::inventory::health::{HealthSource, HealthState};

    fn watcher_unhealthy() -> Health {
        Health {
            state: HealthState::Unhealthy,
            reason: Some("XID 79".into()),
            xid: Some(79),
            action: Some("reboot the node".into()),
            remedy: Some(crate::inventory::Remedy::RebootNode),
            since: Some(UNIX_EPOCH + Duration::from_secs(5)),
            source: Some(HealthSource::Watcher),
        }
    }

    #[test]
    fn unchanged_condition_keeps_since() {
        let first = Health::lost(UNIX_EPOCH + Duration::from_secs(1));
        let again = Health::lost(UNIX_EPOCH + Duration::from_secs(9));
        assert_eq!(merge_health(&first, &again), first);
    }

    #[test]
    fn discovery_clears_only_its_own_verdicts() {
        let lost = Health::lost(UNIX_EPOCH);
        assert_eq!(merge_health(&lost, &Health::healthy()), Health::healthy());
        let xid = watcher_unhealthy();
        assert_eq!(merge_health(&xid, &Health::healthy()), xid);
    }

    #[test]
    fn a_rescan_keeps_the_mig_appliers_mark() {
        use crate::inventory::model::Node;
        use crate::inventory::test_support::gpu;
        let node = Node {
            hostname: "n".into(),
            driver_version: "570.133.20".into(),
            cuda_driver_version: None,
            nvml_version: None,
            machine_type: None,
        };
        let gpus = vec![
            gpu(0, "GPU-0", "A100", 81920),
            gpu(1, "GPU-1", "A100", 81920),
        ];
        let fresh = Snapshot {
            node,
            gpus,
            topology: Vec::new(),
        };
        let mut before = fresh.clone();
        before.set_reconfiguring(&[1]);
        let merged = merge(&before, fresh);
        let marks: Vec<bool> = merged.gpus.iter().map(|g| g.mig.reconfiguring).collect();
        assert_eq!(marks, [false, true]);
    }

    #[test]
    fn loss_overrides_a_watcher_verdict() {
        let lost = Health::lost(UNIX_EPOCH);
        assert_eq!(merge_health(&watcher_unhealthy(), &lost), lost);
    }
}
