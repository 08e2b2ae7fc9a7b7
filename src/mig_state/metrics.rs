//! What the reconciler counts for the exporter of the same process (`gpud run`): applies by
//! result, their duration, and the last state it saw or wrote on the Node.
//!
//! The reconciler writes, the exporter's renderer reads a [`Reading`] once per body; a mutex
//! is enough for a handful of writes per apply.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use super::State;

/// Upper bounds of the apply duration histogram, in seconds: a repartition without a mode
/// change takes seconds, a mode change with a GPU reset up to minutes.
pub const DURATION_BUCKETS: [f64; 8] = [1.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0];

/// Every state, in the order the exporter lists them.
pub const STATES: [State; 4] = [
    State::Pending,
    State::Success,
    State::Failed,
    State::Rebooting,
];

/// A copy of the counters at one moment.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Reading {
    /// Applies that reached the requested layout.
    pub succeeded: u64,
    /// Applies that did not (refused, failed, a reset or a reboot still needed).
    pub failed: u64,
    /// Applies per duration bucket, cumulative as Prometheus' `le` buckets; `+Inf` is
    /// `succeeded + failed`.
    pub buckets: [u64; DURATION_BUCKETS.len()],
    /// Total seconds of every apply.
    pub seconds: f64,
    /// The last `nvidia.com/mig.config.state` written or confirmed; `None` before the first.
    pub state: Option<State>,
}

impl Reading {
    /// Applies counted.
    pub fn applies(&self) -> u64 {
        self.succeeded + self.failed
    }
}

/// The shared counters; clones share them.
#[derive(Debug, Clone, Default)]
pub struct Metrics(Arc<Mutex<Reading>>);

impl Metrics {
    fn with(&self, change: impl FnOnce(&mut Reading)) {
        change(&mut self.0.lock().unwrap_or_else(PoisonError::into_inner));
    }

    /// Counts one apply that took `took`.
    pub fn applied(&self, succeeded: bool, took: Duration) {
        let seconds = took.as_secs_f64();
        self.with(|r| {
            if succeeded {
                r.succeeded += 1;
            } else {
                r.failed += 1;
            }
            r.seconds += seconds;
            for (bound, count) in DURATION_BUCKETS.iter().zip(&mut r.buckets) {
                if seconds <= *bound {
                    *count += 1;
                }
            }
        });
    }

    /// Records the state the Node now says.
    pub fn state(&self, state: State) {
        self.with(|r| r.state = Some(state));
    }

    /// The counters now.
    pub fn read(&self) -> Reading {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn applies_fill_cumulative_buckets() {
        let metrics = Metrics::default();
        metrics.applied(true, Duration::from_millis(500));
        metrics.applied(false, Duration::from_secs(45));
        metrics.state(State::Failed);
        let reading = metrics.clone().read();
        assert_eq!((reading.succeeded, reading.failed), (1, 1));
        assert_eq!(reading.buckets, [1, 1, 1, 1, 2, 2, 2, 2]);
        assert_eq!(reading.seconds, 45.5);
        assert_eq!(reading.state, Some(State::Failed));
    }
}
