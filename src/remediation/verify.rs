//! What a reset GPU must show before it goes back to work: it answers NVML, nothing a reset
//! should have cleared is still there (a pending row remap or page retirement, uncorrected
//! ECC errors since the reset, a recovery action still asked for), its memory can still be
//! repaired, and the user's verify command, if any, passes. Each failure in words, for the
//! escalation's message.

use crate::nvml::GpuSignals;

/// Why a reset GPU is not fit for work, or `None` when NVML's side of it is.
pub fn signals_fault(signals: Option<&GpuSignals>) -> Option<String> {
    let Some(s) = signals else {
        return Some("NVML does not list the GPU after its reset".to_owned());
    };
    if s.lost {
        return Some("the GPU is lost after its reset (NVML_ERROR_GPU_IS_LOST)".to_owned());
    }
    if s.remap_failure == Some(true) {
        return Some("row remapping failed: the memory can no longer be repaired".to_owned());
    }
    if s.remap_pending == Some(true) {
        return Some("a row remap is still pending after the reset".to_owned());
    }
    if s.retired_pages_pending == Some(true) {
        return Some("a page retirement is still pending after the reset".to_owned());
    }
    if let Some(n) = s.volatile_dbe.filter(|&n| n > 0) {
        return Some(format!("{n} uncorrected ECC errors since the reset"));
    }
    if let Some(action) = s.recovery_action.filter(|&a| a != 0) {
        return Some(format!(
            "NVML still asks for recovery action {action} after the reset"
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn clean() -> GpuSignals {
        GpuSignals {
            gpu: 1,
            volatile_dbe: Some(0),
            remap_pending: Some(false),
            remap_failure: Some(false),
            retired_pages_pending: Some(false),
            recovery_action: Some(0),
            ..GpuSignals::default()
        }
    }

    #[test]
    fn a_clean_gpu_passes_and_each_leftover_is_named() {
        assert_eq!(signals_fault(Some(&clean())), None);
        assert_eq!(
            signals_fault(Some(&GpuSignals {
                gpu: 1,
                ..GpuSignals::default()
            })),
            None,
            "a driver that reports none of it passes"
        );
        assert!(signals_fault(None).is_some());
        let lost = GpuSignals {
            lost: true,
            ..clean()
        };
        assert!(signals_fault(Some(&lost)).unwrap().contains("lost"));
        let pending = GpuSignals {
            remap_pending: Some(true),
            ..clean()
        };
        assert_eq!(
            signals_fault(Some(&pending)).unwrap(),
            "a row remap is still pending after the reset"
        );
        let dbe = GpuSignals {
            volatile_dbe: Some(2),
            ..clean()
        };
        assert_eq!(
            signals_fault(Some(&dbe)).unwrap(),
            "2 uncorrected ECC errors since the reset"
        );
        let asks = GpuSignals {
            recovery_action: Some(2),
            ..clean()
        };
        assert!(
            signals_fault(Some(&asks))
                .unwrap()
                .contains("recovery action 2")
        );
    }
}
