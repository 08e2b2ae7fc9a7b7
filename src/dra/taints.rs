//! Device taints from the health the inventory carries, in the keys NVIDIA's driver uses, so
//! tolerations written for it work here:
//!
//! | health | taint | effect |
//! |---|---|---|
//! | an XID, unhealthy | `<driver>/xid=<xid>` | `NoSchedule` |
//! | an XID, degraded | `<driver>/xid=<xid>` | `None` |
//! | GPU lost | `<driver>/gpu-lost` | `NoSchedule` |
//! | unhealthy for another reason (ECC, row remapping, …) | `<driver>/unhealthy=<first word of the reason>` | `NoSchedule` |
//!
//! The effect follows the health watcher's verdict and nothing else: which XIDs count as the
//! application's fault is its XID policy (`DP_DISABLE_HEALTHCHECKS`, `DP_ENABLE_HEALTHCHECKS`,
//! gpud's config file), the same one the device plugin withdraws GPUs by. An XID the policy
//! ignores leaves the device healthy and untainted; one it makes fatal
//! (`DP_ENABLE_HEALTHCHECKS=13`) forbids scheduling here as it withdraws the GPU from the
//! device plugin.
//!
//! A MIG device carries its GPU's taints and its own. Unlike NVIDIA's driver, whose taints
//! stay until the plugin restarts, these follow the health watcher: when it says the device
//! recovered, the next slice has no taint.

use crate::inventory::health::{Health, HealthState, LOST_REASON};

use super::objects::Taint;
use crate::dra_names::DraDevice;

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
        // A second list of "harmless" XIDs here would disagree with the policy the verdict
        // was made by, and a GPU the device plugin withdraws would stay schedulable.
        let effect = match health.state {
            HealthState::Unhealthy => NO_SCHEDULE,
            HealthState::Degraded | HealthState::Healthy => NONE,
        };
        return vec![Taint {
            key: format!("{driver}/xid"),
            value: Some(xid.to_string()),
            effect: effect.to_owned(),
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
    fn the_xid_taints_effect_is_the_verdicts() {
        let g = with_health(sick(HealthState::Unhealthy, Some(79), "XID 79"));
        assert_eq!(
            taints("gpu.nvidia.com", &DraDevice::Gpu(&g)),
            [taint("gpu.nvidia.com/xid", Some("79"), "NoSchedule")]
        );
        // An application XID the policy made fatal (DP_ENABLE_HEALTHCHECKS=13): the device
        // plugin withdraws the GPU, so DRA must not schedule onto it either.
        for xid in [13, 31, 43, 45, 68, 109] {
            let g = with_health(sick(HealthState::Unhealthy, Some(xid), "XID"));
            assert_eq!(
                taints("gpu.nvidia.com", &DraDevice::Gpu(&g)),
                [taint(
                    "gpu.nvidia.com/xid",
                    Some(&xid.to_string()),
                    "NoSchedule"
                )],
                "XID {xid}"
            );
        }
        // The same XID judged degraded only informs.
        let g = with_health(sick(HealthState::Degraded, Some(13), "XID 13"));
        assert_eq!(
            taints("gpu.nvidia.com", &DraDevice::Gpu(&g)),
            [taint("gpu.nvidia.com/xid", Some("13"), "None")]
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
