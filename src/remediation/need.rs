//! What an unhealthy GPU needs, decided from what the driver says first and the health
//! verdict's typed remedy second. Pure.
//!
//! NVML's recovery action (field 230, R550+) is the driver's own word after a fault: 1 reset,
//! 2 reboot, 3 drain peer-to-peer traffic, 4 drain and reset. Without it (older drivers, or a
//! verdict that is not an XID) the verdict's remedy decides: the XID catalog's reset for fatal
//! XIDs, and the same for uncorrectable ECC errors and pending row remaps or page retirements;
//! a lost GPU and the catalog's reboot XIDs need a reboot; a failed row remap needs the board
//! replaced. The verdict's action text is for people and never read here: rewording it cannot
//! turn a reset into a wait.

use crate::inventory::{Health, RecoveryAction, Remedy};

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

/// What NVML's recovery action asks for, when it asks for anything gpud can do.
pub fn from_recovery_action(action: Option<u64>) -> Option<Need> {
    match RecoveryAction::from_nvml(action?)?.remedy() {
        Remedy::ResetGpu => Some(Need::Reset),
        Remedy::RebootNode => Some(Need::Reboot),
        // An action this gpud does not know: the verdict decides.
        _ => None,
    }
}

/// What an unhealthy GPU with `health` needs, given NVML's recovery action.
pub fn need(health: &Health, recovery_action: Option<u64>) -> Need {
    if let Some(need) = from_recovery_action(recovery_action) {
        return need;
    }
    // Every remedy named: a new one must be decided here, not fall into waiting unseen.
    match health.remedy {
        Some(Remedy::ResetGpu) => Need::Reset,
        Some(Remedy::RebootNode) => Need::Reboot,
        Some(Remedy::InspectHardware | Remedy::ReplaceGpu) => Need::Hardware,
        Some(
            Remedy::None
            | Remedy::RestartWorkload
            | Remedy::ConsultDocs
            | Remedy::CheckDriver
            | Remedy::CheckCooling
            | Remedy::CheckNvlinks,
        )
        | None => Need::Wait,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inventory::HealthState;

    fn unhealthy(remedy: Remedy) -> Health {
        Health {
            state: HealthState::Unhealthy,
            reason: Some("r".into()),
            xid: None,
            action: Some(remedy.phrase().into()),
            remedy: Some(remedy),
            since: None,
            source: None,
        }
    }

    #[test]
    fn the_drivers_recovery_action_comes_first() {
        let reset = unhealthy(Remedy::ResetGpu);
        assert_eq!(need(&reset, Some(2)), Need::Reboot);
        let cooling = unhealthy(Remedy::CheckCooling);
        assert_eq!(need(&cooling, Some(4)), Need::Reset);
        assert_eq!(need(&cooling, Some(1)), Need::Reset);
        assert_eq!(
            need(&reset, Some(0)),
            Need::Reset,
            "none: the verdict decides"
        );
        assert_eq!(need(&reset, None), Need::Reset);
    }

    #[test]
    fn without_it_the_verdicts_remedy_decides() {
        let cases = [
            (Remedy::ResetGpu, Need::Reset),
            (Remedy::RebootNode, Need::Reboot),
            (Remedy::InspectHardware, Need::Hardware),
            (Remedy::ReplaceGpu, Need::Hardware),
            (Remedy::RestartWorkload, Need::Wait),
            (Remedy::None, Need::Wait),
            (Remedy::ConsultDocs, Need::Wait),
            (Remedy::CheckDriver, Need::Wait),
            (Remedy::CheckCooling, Need::Wait),
            (Remedy::CheckNvlinks, Need::Wait),
        ];
        for (remedy, wanted) in cases {
            assert_eq!(need(&unhealthy(remedy), None), wanted, "{remedy:?}");
        }
        let lost = Health::lost(std::time::SystemTime::UNIX_EPOCH);
        assert_eq!(need(&lost, None), Need::Reboot, "a lost GPU");
        assert_eq!(need(&Health::healthy(), None), Need::Wait, "no remedy");
    }

    #[test]
    fn the_action_text_never_decides() {
        // Reworded, emptied or contradicting: only the remedy counts.
        for text in ["", "reset it when convenient", "drain and reboot the node"] {
            let reset = Health {
                action: Some(text.into()),
                ..unhealthy(Remedy::ResetGpu)
            };
            assert_eq!(need(&reset, None), Need::Reset, "{text:?}");
        }
        let waits = Health {
            action: Some(Remedy::ResetGpu.phrase().into()),
            ..unhealthy(Remedy::RestartWorkload)
        };
        assert_eq!(need(&waits, None), Need::Wait);
        let untyped = Health {
            remedy: None,
            ..unhealthy(Remedy::ResetGpu)
        };
        assert_eq!(need(&untyped, None), Need::Wait, "no remedy, text ignored");
    }
}
