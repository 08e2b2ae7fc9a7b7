//! MIG state as data, below the MIG manager, the doctor and the exporter: the states the
//! reconciler reports on the Node, its last outcome on disk ([`record`]) and its counters
//! ([`metrics`]). The reconciler writes all three; the doctor and the exporter only read.

pub mod metrics;
pub mod record;

/// Where the reconciler keeps its state (`last-state.json`).
pub const DEFAULT_STATE_DIR: &str = "/var/lib/gpud/mig";

/// The states the reconciler writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    Pending,
    Rebooting,
    Success,
    Failed,
}

impl State {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            State::Pending => "pending",
            State::Rebooting => "rebooting",
            State::Success => "success",
            State::Failed => "failed",
        }
    }
}
