//! Collecting the answers of one GPU's NVML queries.
//!
//! A GPU that fails one query usually fails them all for the same reason, so queries are made
//! through a [`Probe`] that remembers whether the GPU said it is lost and which required facts
//! it refused, and turns that into a health state at the end.

use std::time::SystemTime;

use nvml_wrapper::error::NvmlError as E;

use crate::inventory::health::Health;

/// Collects per-GPU query results, remembering whether the GPU said it is lost and which
/// required facts it would not give.
#[derive(Debug, Default)]
pub(super) struct Probe {
    /// Some call answered `NVML_ERROR_GPU_IS_LOST`.
    pub lost: bool,
    /// Required facts that failed other than by loss.
    pub failed: Vec<(&'static str, E)>,
}

impl Probe {
    /// An optional fact: any error leaves it unknown.
    pub fn optional<T>(&mut self, result: Result<T, E>) -> Option<T> {
        match result {
            Ok(value) => Some(value),
            Err(E::GpuLost) => {
                self.lost = true;
                None
            }
            Err(_) => None,
        }
    }

    /// A fact every GPU has: failing to read it other than by loss is itself a health finding.
    pub fn required<T: Default>(&mut self, what: &'static str, result: Result<T, E>) -> T {
        match result {
            Ok(value) => value,
            Err(E::GpuLost) => {
                self.lost = true;
                T::default()
            }
            Err(err) => {
                self.failed.push((what, err));
                T::default()
            }
        }
    }

    pub fn health(&self, now: SystemTime) -> Health {
        if self.lost {
            return Health::lost(now);
        }
        match self.failed.first() {
            Some((what, err)) => {
                Health::unreadable(format!("NVML cannot read its {what}: {err}"), now)
            }
            None => Health::healthy(),
        }
    }
}
