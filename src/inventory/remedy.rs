//! What a device needs to be fit for work again, typed: the XID catalog's actions, NVML's
//! verdicts (ECC, row remapping, a lost or unreadable GPU) and the health watcher's own
//! conditions each name one. Programs decide on this (gpud's remediation resets, escalates or
//! waits by it); the action's text beside it in a verdict is for people and may be reworded
//! freely.

use serde::{Deserialize, Serialize};

/// What a device needs, in the `remedy` field of a verdict (snake case in JSON).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Remedy {
    /// Nothing: informational, or the condition clears by itself (or by gpud's own doing).
    None,
    /// Restart the workload that hit the fault; the GPU is fine.
    RestartWorkload,
    /// Drain the GPU and reset it.
    ResetGpu,
    /// Drain the node and reboot it.
    RebootNode,
    /// Have the hardware (board, cables, NVLink, power) inspected.
    InspectHardware,
    /// Replace the GPU: its memory can no longer be repaired.
    ReplaceGpu,
    /// No catalog guidance applies; read NVIDIA's XID documentation.
    ConsultDocs,
    /// Check the driver and the kernel log: NVML answers the GPU with an unexpected error.
    CheckDriver,
    /// Check cooling and airflow: the GPU runs at its slowdown temperature.
    CheckCooling,
    /// Check the NVLinks and the NVSwitch fabric: a link went down.
    CheckNvlinks,
}

impl Remedy {
    /// A short imperative phrase, for people: summaries, `gpud doctor`, the XID catalog's
    /// verdicts.
    pub const fn phrase(self) -> &'static str {
        match self {
            Self::None => "no action needed",
            Self::RestartWorkload => "restart the affected workload",
            Self::ResetGpu => "drain and reset the GPU",
            Self::RebootNode => "drain and reboot the node",
            Self::InspectHardware => "inspect the hardware",
            Self::ReplaceGpu => "replace the GPU (inspect the hardware)",
            Self::ConsultDocs => "consult the XID documentation",
            Self::CheckDriver => "check the driver and the kernel log (dmesg) for this GPU",
            Self::CheckCooling => "check cooling and airflow",
            Self::CheckNvlinks => {
                "check the NVLink and NVSwitch fabric; reset the GPU if it stays down"
            }
        }
    }

    /// The remedy a verdict written before verdicts carried one meant by its action's text.
    /// This is the only place the text is read for a decision, and only for such old input
    /// (JSON of an earlier gpud without the `remedy` field): every verdict gpud makes carries
    /// its remedy. Unknown text means nothing gpud can act on.
    pub fn from_legacy_phrase(text: &str) -> Remedy {
        // A lost GPU's action (`health::LOST_ACTION`, which this file must not import: the
        // health module imports this one).
        const LOST: &str = "drain and reboot the node; if it persists, inspect the hardware";
        match text {
            "drain and reset the GPU" => Remedy::ResetGpu,
            "drain and reboot the node" | "reboot the node" | LOST => Remedy::RebootNode,
            "inspect the hardware" => Remedy::InspectHardware,
            "replace the GPU (inspect the hardware)" => Remedy::ReplaceGpu,
            "restart the affected workload" => Remedy::RestartWorkload,
            "consult the XID documentation" => Remedy::ConsultDocs,
            "check the driver and the kernel log (dmesg) for this GPU" => Remedy::CheckDriver,
            "check cooling and airflow" => Remedy::CheckCooling,
            "check the NVLink and NVSwitch fabric; reset the GPU if it stays down" => {
                Remedy::CheckNvlinks
            }
            _ => Remedy::None,
        }
    }
}

/// NVML's recovery action (field 230, R550+): what the driver itself asks for after a fault,
/// read from its number once, here. gpud's remediation decides by [`RecoveryAction::remedy`];
/// the doctor shows [`RecoveryAction::phrase`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecoveryAction {
    /// 1: reset the GPU.
    Reset,
    /// 2: reboot the node.
    Reboot,
    /// 3: drain peer-to-peer traffic (the GPU is usable once its peers stop sending).
    DrainPeerToPeer,
    /// 4: drain the GPU and reset it.
    DrainAndReset,
    /// A number this gpud does not know (a newer driver).
    Unknown(u64),
}

impl RecoveryAction {
    /// The driver's number, `None` for 0 (no action).
    pub const fn from_nvml(code: u64) -> Option<Self> {
        match code {
            0 => None,
            1 => Some(Self::Reset),
            2 => Some(Self::Reboot),
            3 => Some(Self::DrainPeerToPeer),
            4 => Some(Self::DrainAndReset),
            other => Some(Self::Unknown(other)),
        }
    }

    /// What the device needs for it. Draining peer-to-peer traffic is met by the drain before
    /// a reset, so it asks for a reset too; an unknown number asks for nothing gpud can do.
    pub const fn remedy(self) -> Remedy {
        match self {
            Self::Reset | Self::DrainPeerToPeer | Self::DrainAndReset => Remedy::ResetGpu,
            Self::Reboot => Remedy::RebootNode,
            Self::Unknown(_) => Remedy::ConsultDocs,
        }
    }

    /// What the driver asks for, for people.
    pub const fn phrase(self) -> &'static str {
        match self {
            Self::Reset => "a GPU reset",
            Self::Reboot => "a node reboot",
            Self::DrainPeerToPeer => "draining peer-to-peer traffic",
            Self::DrainAndReset => "a drain and GPU reset",
            Self::Unknown(_) => "an action this gpud does not know",
        }
    }
}

impl std::fmt::Display for Remedy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.phrase())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: [Remedy; 10] = [
        Remedy::None,
        Remedy::RestartWorkload,
        Remedy::ResetGpu,
        Remedy::RebootNode,
        Remedy::InspectHardware,
        Remedy::ReplaceGpu,
        Remedy::ConsultDocs,
        Remedy::CheckDriver,
        Remedy::CheckCooling,
        Remedy::CheckNvlinks,
    ];

    #[test]
    fn every_phrase_reads_back_as_its_remedy_and_serialises_in_snake_case() {
        for remedy in ALL {
            assert_eq!(Remedy::from_legacy_phrase(remedy.phrase()), remedy);
        }
        assert_eq!(
            serde_json::to_value(Remedy::ResetGpu).unwrap(),
            serde_json::json!("reset_gpu")
        );
        assert_eq!(
            serde_json::from_value::<Remedy>(serde_json::json!("reboot_node")).unwrap(),
            Remedy::RebootNode
        );
        assert_eq!(Remedy::from_legacy_phrase("something new"), Remedy::None);
    }

    #[test]
    fn nvmls_recovery_action_is_read_from_its_number_once() {
        let read = |code| RecoveryAction::from_nvml(code).map(RecoveryAction::remedy);
        assert_eq!(read(0), None);
        assert_eq!(read(1), Some(Remedy::ResetGpu));
        assert_eq!(read(2), Some(Remedy::RebootNode));
        assert_eq!(read(3), Some(Remedy::ResetGpu));
        assert_eq!(read(4), Some(Remedy::ResetGpu));
        assert_eq!(read(9), Some(Remedy::ConsultDocs));
        assert_eq!(
            RecoveryAction::from_nvml(3).map(RecoveryAction::phrase),
            Some("draining peer-to-peer traffic")
        );
    }
}
