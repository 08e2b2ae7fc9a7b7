//! What an unhealthy GPU needs, decided from what the driver says first and the health
//! verdict's suggested action second. Pure.
//!
//! NVML's recovery action (field 230, R550+) is the driver's own word after a fault: 1 reset,
//! 2 reboot, 3 drain peer-to-peer traffic, 4 drain and reset. Without it (older drivers, or a
//! verdict that is not an XID) the verdict's action decides: the XID catalog's "drain and reset
//! the GPU" for fatal XIDs, and the same for uncorrectable ECC errors and pending row remaps or
//! page retirements; a lost GPU and the catalog's reboot XIDs need a reboot; a failed row remap
//! needs the board replaced.

use crate::inventory::Health;
use crate::inventory::health::LOST_ACTION;
use crate::xid::catalog::Action;

/// What a GPU needs to be fit for work again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// A GPU reset (after a drain).
    Reset,
    /// A node reboot: escalated (or the reboot command, when one is set).
    Reboot,
    /// Hardware work: escalated.
    Hardware,
    /// Nothing gpud can do: the condition clears on its own (a critical XID's quiet period, a
    /// hot GPU cooling down) or is not a fault of the GPU's.
    Wait,
}

/// What NVML's recovery action asks for, when it asks for anything.
pub fn from_recovery_action(action: Option<u64>) -> Option<Need> {
    match action? {
        // Drain peer-to-peer traffic: the GPU is drained before any reset, which does that.
        1 | 3 | 4 => Some(Need::Reset),
        2 => Some(Need::Reboot),
        _ => None,
    }
}

/// What an unhealthy GPU with `health` needs, given NVML's recovery action.
pub fn need(health: &Health, recovery_action: Option<u64>) -> Need {
    if let Some(need) = from_recovery_action(recovery_action) {
        return need;
    }
    let action = health.action.as_deref().unwrap_or_default();
    if action == Action::ResetGpu.phrase() {
        Need::Reset
    } else if action == Action::RebootNode.phrase() || action == LOST_ACTION {
        Need::Reboot
    } else if action == Action::InspectHardware.phrase() || action.starts_with("replace the GPU") {
        Need::Hardware
    } else {
        Need::Wait
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inventory::HealthState;

    fn unhealthy(action: &str) -> Health {
        Health {
            state: HealthState::Unhealthy,
            reason: Some("r".into()),
            xid: None,
            action: Some(action.into()),
            since: None,
            source: None,
        }
    }

    #[test]
    fn the_drivers_recovery_action_comes_first() {
        let reset = unhealthy(Action::ResetGpu.phrase());
        assert_eq!(need(&reset, Some(2)), Need::Reboot);
        assert_eq!(need(&unhealthy("check cooling"), Some(4)), Need::Reset);
        assert_eq!(need(&unhealthy("check cooling"), Some(1)), Need::Reset);
        assert_eq!(
            need(&reset, Some(0)),
            Need::Reset,
            "none: the verdict decides"
        );
        assert_eq!(need(&reset, None), Need::Reset);
    }

    #[test]
    fn without_it_the_verdicts_action_decides() {
        assert_eq!(need(&unhealthy(LOST_ACTION), None), Need::Reboot);
        assert_eq!(
            need(&unhealthy(Action::RebootNode.phrase()), None),
            Need::Reboot
        );
        assert_eq!(
            need(&unhealthy("replace the GPU (inspect the hardware)"), None),
            Need::Hardware
        );
        assert_eq!(
            need(&unhealthy(Action::RestartWorkload.phrase()), None),
            Need::Wait
        );
    }
}
