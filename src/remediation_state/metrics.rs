//! What the remediation subsystem counts for the exporter of the same process: actions by
//! result (`gpud_remediation_total`) and how long a GPU was out of service, from the fault to
//! its return (`gpud_remediation_duration_seconds`).
//!
//! The subsystem writes a few times per fault; the renderer reads a [`Reading`] once per body,
//! so a mutex is enough. The counters are kept in the remediation record too ([`Saved`]): a
//! restarted gpud counts on from them, and the exporter of another container reads them.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Upper bounds of the out-of-service histogram, in seconds: an idle GPU with a fast reset is
/// back in seconds, a drain waits for jobs for up to the drain timeout (10 minutes by default).
pub const DURATION_BUCKETS: [f64; 9] = [1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 300.0, 600.0, 1800.0];

/// A copy of the counters at one moment.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Reading {
    /// Actions by `(action, result)`, e.g. `("reset", "success")`.
    pub totals: BTreeMap<(String, String), u64>,
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
        self.with(|r| {
            *r.totals
                .entry((action.to_owned(), result.to_owned()))
                .or_default() += 1;
        });
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

    /// Counts on from `earlier` (what a previous gpud of this boot counted).
    pub fn restore(&self, earlier: Reading) {
        self.with(|r| *r = earlier);
    }
}

/// The counters as the record keeps them (JSON has no tuple keys).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Saved {
    pub totals: Vec<SavedTotal>,
    pub buckets: Vec<u64>,
    pub returned: u64,
    pub seconds: f64,
}

/// One `(action, result)` count.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SavedTotal {
    pub action: String,
    pub result: String,
    pub count: u64,
}

impl From<&Reading> for Saved {
    fn from(reading: &Reading) -> Self {
        Saved {
            totals: reading
                .totals
                .iter()
                .map(|((action, result), &count)| SavedTotal {
                    action: action.clone(),
                    result: result.clone(),
                    count,
                })
                .collect(),
            buckets: reading.buckets.to_vec(),
            returned: reading.returned,
            seconds: reading.seconds,
        }
    }
}

impl From<Saved> for Reading {
    fn from(saved: Saved) -> Self {
        let mut buckets = [0; DURATION_BUCKETS.len()];
        for (slot, count) in buckets.iter_mut().zip(saved.buckets) {
            *slot = count;
        }
        Reading {
            totals: saved
                .totals
                .into_iter()
                .map(|t| ((t.action, t.result), t.count))
                .collect(),
            buckets,
            returned: saved.returned,
            seconds: saved.seconds,
        }
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
        let total =
            |action: &str, result: &str| reading.totals[&(action.to_owned(), result.to_owned())];
        assert_eq!(total("reset", "success"), 2);
        assert_eq!(total("reset", "failed"), 1);
        assert_eq!(reading.returned, 1);
        assert_eq!(reading.buckets, [0, 1, 1, 1, 1, 1, 1, 1, 1]);
        // Kept and read back as it was.
        let text = serde_json::to_string(&Saved::from(&reading)).unwrap();
        let back: Saved = serde_json::from_str(&text).unwrap();
        assert_eq!(Reading::from(back), reading);
    }
}
