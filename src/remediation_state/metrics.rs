//! What the remediation subsystem counts for the exporter of the same process: actions by
//! result (`gpud_remediation_total`) and how long a GPU was out of service, from the fault to
//! its return (`gpud_remediation_duration_seconds`).
//!
//! The subsystem writes a few times per fault; the renderer reads a [`Reading`] once per body,
//! so a mutex is enough.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

/// Upper bounds of the out-of-service histogram, in seconds: an idle GPU with a fast reset is
/// back in seconds, a drain waits for jobs for up to the drain timeout (10 minutes by default).
pub const DURATION_BUCKETS: [f64; 9] = [1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 300.0, 600.0, 1800.0];

/// A copy of the counters at one moment.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Reading {
    /// Actions by `(action, result)`, e.g. `("reset", "success")`.
    pub totals: BTreeMap<(&'static str, &'static str), u64>,
    /// GPUs back in service per duration bucket, cumulative as Prometheus' `le` buckets.
    pub buckets: [u64; DURATION_BUCKETS.len()],
    /// GPUs back in service.
    pub returned: u64,
    /// Total seconds out of service of those GPUs.
    pub seconds: f64,
}

/// The shared counters; clones share them.
#[derive(Debug, Clone, Default)]
pub struct Metrics(Arc<Mutex<Reading>>);

impl Metrics {
    fn with(&self, change: impl FnOnce(&mut Reading)) {
        change(&mut self.0.lock().unwrap_or_else(PoisonError::into_inner));
    }

    /// Counts one `action` that ended with `result`.
    pub fn count(&self, action: &'static str, result: &'static str) {
        self.with(|r| *r.totals.entry((action, result)).or_default() += 1);
    }

    /// Counts one GPU back in service after `took` out of it.
    pub fn returned(&self, took: Duration) {
        let seconds = took.as_secs_f64();
        self.with(|r| {
            r.returned += 1;
            r.seconds += seconds;
            for (bound, count) in DURATION_BUCKETS.iter().zip(&mut r.buckets) {
                if seconds <= *bound {
                    *count += 1;
                }
            }
        });
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
    fn counts_by_action_and_result_and_buckets_cumulatively() {
        let metrics = Metrics::default();
        metrics.count("reset", "success");
        metrics.count("reset", "success");
        metrics.count("reset", "failed");
        metrics.returned(Duration::from_millis(1500));
        let reading = metrics.read();
        assert_eq!(reading.totals[&("reset", "success")], 2);
        assert_eq!(reading.totals[&("reset", "failed")], 1);
        assert_eq!(reading.returned, 1);
        assert_eq!(reading.buckets, [0, 1, 1, 1, 1, 1, 1, 1, 1]);
    }
}
