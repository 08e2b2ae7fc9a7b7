//! Device taints from the health the inventory carries, in the keys NVIDIA's driver uses, so
//! tolerations written for it work here:
//!
//! | health | taint | effect |
//! |---|---|---|
//! | an XID | `<driver>/xid=<xid>` | `NoSchedule`; `None` for the XIDs NVIDIA treats as the application's fault (13, 31, 43, 45, 68, 109) and for a degraded device |
//! | GPU lost | `<driver>/gpu-lost` | `NoSchedule` |
//! | unhealthy for another reason (ECC, row remapping, …) | `<driver>/unhealthy=<first word of the reason>` | `NoSchedule` |
//!
//! A MIG device carries its GPU's taints and its own. Unlike NVIDIA's driver, whose taints
//! stay until the plugin restarts, these follow the health watcher: when it says the device
//! recovered, the next slice has no taint.

use crate::inventory::health::{Health, HealthState, LOST_REASON};

use super::objects::Taint;
use crate::dra_names::DraDevice;

/// XIDs that NVIDIA's DRA driver and device plugin count as application errors, not a sick
/// GPU: their taint is information only.
pub const NON_FATAL_XIDS: [u32; 6] = [13, 31, 43, 45, 68, 109];

/// `NoSchedule`: no new allocation.
pub const NO_SCHEDULE: &str = "NoSchedule";
/// `None`: information only.
pub const NONE: &str = "None";

/// The taints of one device, sorted and without duplicates.
pub fn taints(driver: &str, device: &DraDevice<'_>) -> Vec<Taint> {
    let mut out = health_taints(driver, &device.gpu().health);
    if let DraDevice::Mig(_, mig) = device {
        out.extend(health_taints(driver, &mig.health));
    }
    out.sort();
    out.dedup();
    out
}

fn health_taints(driver: &str, health: &Health) -> Vec<Taint> {
    if health.state == HealthState::Healthy {
        return Vec::new();
    }
    if let Some(xid) = health.xid {
        let fatal = health.state == HealthState::Unhealthy && !NON_FATAL_XIDS.contains(&xid);
        return vec![Taint {
            key: format!("{driver}/xid"),
            value: Some(xid.to_string()),
            effect: if fatal { NO_SCHEDULE } else { NONE }.to_owned(),
        }];
    }
    if health.state != HealthState::Unhealthy {
        return Vec::new();
    }
    if health.reason.as_deref() == Some(LOST_REASON) {
        return vec![Taint {
            key: format!("{driver}/gpu-lost"),
            value: None,
            effect: NO_SCHEDULE.to_owned(),
        }];
    }
    vec![Taint {
        key: format!("{driver}/unhealthy"),
        value: health.reason.as_deref().map(taint_value),
        effect: NO_SCHEDULE.to_owned(),
    }]
}

/// A taint value is a label value: at most 63 characters of `[A-Za-z0-9_.-]`, starting and
/// ending alphanumeric. The reason's first word (`ECC`, `row`, …) is enough to tell causes
/// apart; the whole reason is in the inventory and the health stream.
fn taint_value(reason: &str) -> String {
    let word: String = reason
        .split(|c: char| !c.is_ascii_alphanumeric())
        .find(|w| !w.is_empty())
        .unwrap_or("unknown")
        .chars()
        .take(63)
        .collect();
    word
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inventory::test_support::gpu;

    fn with_health(health: Health) -> crate::inventory::model::Gpu {
        let mut g = gpu(0, "GPU-a", "NVIDIA H100 80GB HBM3", 81559);
        g.health = health;
        g
    }

    fn sick(state: HealthState, xid: Option<u32>, reason: &str) -> Health {
        Health {
            state,
            xid,
            reason: Some(reason.to_owned()),
            ..Health::healthy()
        }
    }

    fn taint(key: &str, value: Option<&str>, effect: &str) -> Taint {
        Taint {
            key: key.into(),
            value: value.map(Into::into),
            effect: effect.into(),
        }
    }

    #[test]
    fn fatal_xids_forbid_scheduling_and_application_xids_only_inform() {
        let g = with_health(sick(HealthState::Unhealthy, Some(79), "XID 79"));
        assert_eq!(
            taints("gpu.nvidia.com", &DraDevice::Gpu(&g)),
            [taint("gpu.nvidia.com/xid", Some("79"), "NoSchedule")]
        );
        let g = with_health(sick(HealthState::Unhealthy, Some(43), "XID 43"));
        assert_eq!(
            taints("gpu.nvidia.com", &DraDevice::Gpu(&g)),
            [taint("gpu.nvidia.com/xid", Some("43"), "None")]
        );
        let g = with_health(sick(HealthState::Degraded, Some(94), "XID 94"));
        assert_eq!(
            taints("gpu.nvidia.com", &DraDevice::Gpu(&g)),
            [taint("gpu.nvidia.com/xid", Some("94"), "None")]
        );
    }

    #[test]
    fn lost_and_other_sickness_and_recovery() {
        let g = with_health(Health::lost(std::time::SystemTime::UNIX_EPOCH));
        assert_eq!(
            taints("gpu.nvidia.com", &DraDevice::Gpu(&g)),
            [taint("gpu.nvidia.com/gpu-lost", None, "NoSchedule")]
        );
        let g = with_health(sick(
            HealthState::Unhealthy,
            None,
            "ECC: uncorrectable errors",
        ));
        assert_eq!(
            taints("gpu.nvidia.com", &DraDevice::Gpu(&g)),
            [taint("gpu.nvidia.com/unhealthy", Some("ECC"), "NoSchedule")]
        );
        let g = with_health(sick(HealthState::Degraded, None, "warm"));
        assert!(taints("gpu.nvidia.com", &DraDevice::Gpu(&g)).is_empty());
        let g = with_health(Health::healthy());
        assert!(taints("gpu.nvidia.com", &DraDevice::Gpu(&g)).is_empty());
    }
}
