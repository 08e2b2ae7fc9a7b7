//! What NVML shows of a GPU that a reset clears, read before gpud's reset and kept in the
//! record: after a restart that finds a reset started but not known to have ended, the marks
//! going away is the only evidence gpud accepts that the reset happened. NVML keeps no reset
//! counter, so a GPU whose fault left no mark in NVML (an XID alone) gives no such evidence.

use serde::{Deserialize, Serialize};

use crate::nvml::GpuSignals;

/// The signals of one GPU that a reset clears, as NVML answered them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResetMarks {
    /// The GPU answered `NVML_ERROR_GPU_IS_LOST`.
    #[serde(default)]
    pub lost: bool,
    #[serde(default)]
    pub recovery_action: Option<u64>,
    #[serde(default)]
    pub volatile_dbe: Option<u64>,
    #[serde(default)]
    pub remap_pending: Option<bool>,
    #[serde(default)]
    pub retired_pages_pending: Option<bool>,
}

impl ResetMarks {
    /// The marks in one poll of the GPU's signals (none when NVML did not list it).
    pub fn of(signals: Option<&GpuSignals>) -> Self {
        signals.map_or_else(ResetMarks::default, |s| ResetMarks {
            lost: s.lost,
            recovery_action: s.recovery_action,
            volatile_dbe: s.volatile_dbe,
            remap_pending: s.remap_pending,
            retired_pages_pending: s.retired_pages_pending,
        })
    }

    /// Whether NVML showed anything a reset clears.
    pub fn any(&self) -> bool {
        self.lost
            || self.recovery_action.is_some_and(|a| a != 0)
            || self.volatile_dbe.is_some_and(|n| n > 0)
            || self.remap_pending == Some(true)
            || self.retired_pages_pending == Some(true)
    }

    /// What in `now` shows that the GPU was reset since these marks were read: every mark is
    /// gone and the GPU answers. `None` when nothing shows it (no mark to begin with, or one
    /// still there).
    pub fn cleared_in(&self, now: Option<&GpuSignals>) -> Option<String> {
        let now = now?;
        if !self.any() || now.lost || ResetMarks::of(Some(now)).any() {
            return None;
        }
        let mut gone = Vec::new();
        if self.lost {
            gone.push("the lost GPU answers again");
        }
        if self.recovery_action.is_some_and(|a| a != 0) {
            gone.push("NVML's recovery action is back to none");
        }
        if self.volatile_dbe.is_some_and(|n| n > 0) {
            gone.push("the volatile uncorrectable-ECC counter is back to 0");
        }
        if self.remap_pending == Some(true) {
            gone.push("the pending row remap was applied");
        }
        if self.retired_pages_pending == Some(true) {
            gone.push("the pending page retirement was applied");
        }
        Some(gone.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn signals(recovery_action: u64, volatile_dbe: u64) -> GpuSignals {
        GpuSignals {
            gpu: 0,
            recovery_action: Some(recovery_action),
            volatile_dbe: Some(volatile_dbe),
            remap_pending: Some(false),
            retired_pages_pending: Some(false),
            ..GpuSignals::default()
        }
    }

    #[test]
    fn a_reset_shows_only_when_every_mark_it_clears_is_gone() {
        let before = ResetMarks::of(Some(&signals(1, 2)));
        assert!(before.any());
        assert_eq!(before.cleared_in(Some(&signals(1, 2))), None);
        assert_eq!(
            before.cleared_in(Some(&signals(0, 2))),
            None,
            "one mark is left"
        );
        assert_eq!(
            before.cleared_in(Some(&signals(0, 0))).as_deref(),
            Some(
                "NVML's recovery action is back to none, the volatile uncorrectable-ECC counter is back to 0"
            )
        );
        assert_eq!(before.cleared_in(None), None, "NVML does not list it");
        let lost = GpuSignals {
            lost: true,
            ..signals(0, 0)
        };
        assert_eq!(before.cleared_in(Some(&lost)), None);
    }

    #[test]
    fn a_gpu_without_marks_gives_no_evidence_of_a_reset() {
        let clean = ResetMarks::of(Some(&signals(0, 0)));
        assert!(!clean.any());
        assert_eq!(clean.cleared_in(Some(&signals(0, 0))), None);
        assert!(!ResetMarks::of(None).any());
    }
}
