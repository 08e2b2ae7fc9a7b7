//! What the two Kubernetes API sinks share: the client connection, the error type and the
//! retry backoff.
//!
//! The Node sink ([`super::node`]) labels the Node itself; the NodeFeature sink
//! ([`super::node_feature`]) hands the labels to nfd-master in a NodeFeature object;
//! [`super::sink::ApiSink`] is the one handle the run loop pushes labels through.

use std::path::Path;
use std::time::Duration;

/// Field manager recorded by the API server for the labeller's writes.
pub const FIELD_MANAGER: &str = "gpud-labeller";

/// Failures of an API sink.
#[derive(Debug, thiserror::Error)]
pub enum ApiSinkError {
    /// No kubeconfig and not in a cluster, or a kubeconfig that does not load.
    #[error("cannot configure the Kubernetes client: {0}")]
    Config(String),
    /// The API server did not answer in time.
    #[error("{target}: no answer from the API server within {after:?}")]
    Timeout { target: String, after: Duration },
    /// A request failed.
    #[error("{target}: {source}")]
    Api {
        target: String,
        #[source]
        source: kube::Error,
    },
    /// A request failed in a way that has a likely cause worth naming.
    #[error("{target}: {source} ({hint})")]
    Hinted {
        target: String,
        hint: &'static str,
        #[source]
        source: kube::Error,
    },
}

/// Connects with `kubeconfig` when given, else as kube's inference does (`KUBECONFIG`,
/// `~/.kube/config`, then the in-cluster service account).
pub async fn connect(kubeconfig: Option<&Path>) -> Result<kube::Client, ApiSinkError> {
    let config = match kubeconfig {
        Some(path) => {
            let file = kube::config::Kubeconfig::read_from(path)
                .map_err(|e| ApiSinkError::Config(format!("{}: {e}", path.display())))?;
            kube::Config::from_custom_kubeconfig(file, &kube::config::KubeConfigOptions::default())
                .await
                .map_err(|e| ApiSinkError::Config(format!("{}: {e}", path.display())))?
        }
        None => kube::Config::infer()
            .await
            .map_err(|e| ApiSinkError::Config(e.to_string()))?,
    };
    kube::Client::try_from(config).map_err(|e| ApiSinkError::Config(e.to_string()))
}

/// A per-node number that spreads the retries of many nodes apart.
pub fn node_seed(node: &str) -> u64 {
    node.bytes()
        .fold(0u64, |h, b| h.wrapping_mul(31).wrapping_add(u64::from(b)))
}

/// Exponential backoff with jitter for retrying the API server: 500 ms doubling to 30 s.
#[derive(Debug, Clone)]
pub struct Backoff {
    next: Duration,
    max: Duration,
    seed: u64,
}

/// First retry delay.
pub const BACKOFF_START: Duration = Duration::from_millis(500);
/// Longest retry delay.
pub const BACKOFF_MAX: Duration = Duration::from_secs(30);

impl Backoff {
    /// A fresh backoff; `seed` spreads the retries of many nodes apart.
    pub fn new(seed: u64) -> Self {
        Backoff::capped(seed, BACKOFF_MAX)
    }

    /// A fresh backoff whose delay grows to `max` (plus jitter) at most.
    pub fn capped(seed: u64, max: Duration) -> Self {
        Backoff {
            next: BACKOFF_START.min(max),
            max,
            seed: seed | 1,
        }
    }

    /// The delay before the next attempt: the current step plus up to 25 % jitter.
    pub fn next_delay(&mut self) -> Duration {
        // xorshift: cheap, deterministic per seed, good enough to de-synchronise nodes.
        self.seed ^= self.seed << 13;
        self.seed ^= self.seed >> 7;
        self.seed ^= self.seed << 17;
        let step = self.next;
        let jitter = step.mul_f64((self.seed % 1000) as f64 / 4000.0);
        self.next = (self.next * 2).min(self.max);
        step + jitter
    }

    /// Back to the first step after a success.
    pub fn reset(&mut self) {
        self.next = BACKOFF_START.min(self.max);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_to_the_cap_with_bounded_jitter() {
        let mut backoff = Backoff::new(42);
        let delays: Vec<Duration> = (0..10).map(|_| backoff.next_delay()).collect();
        let mut step = BACKOFF_START;
        for delay in &delays {
            assert!(
                *delay >= step && *delay <= step.mul_f64(1.25),
                "{delay:?} vs {step:?}"
            );
            step = (step * 2).min(BACKOFF_MAX);
        }
        backoff.reset();
        assert!(backoff.next_delay() < Duration::from_millis(700));
    }
}
