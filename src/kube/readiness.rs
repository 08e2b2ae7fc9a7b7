//! Readiness of a subsystem that needs the API server: it is not ready until its first call
//! is answered (a subsystem that cannot reach the API server is not doing its job, whatever
//! it logs), and not ready again, with the reason on `/readyz`, once calls have gone
//! unanswered for a configurable time (`--api-unready-after`). One failed call after a
//! success does not flip it: API servers restart and refuse for a moment.

use std::fmt::Display;
use std::time::{Duration, Instant};

use crate::daemon::ReadyLatch;

/// Follows a subsystem's API calls onto its readiness.
#[derive(Debug)]
pub struct ApiReadiness {
    latch: ReadyLatch,
    limit: Duration,
    /// The last answered call; `None` before the first.
    last_answer: Option<Instant>,
    /// Whether readiness is set now.
    ready: bool,
}

impl ApiReadiness {
    /// Not ready until [`ApiReadiness::answered`]; unready after `limit` without an answer.
    pub fn new(latch: ReadyLatch, limit: Duration) -> Self {
        ApiReadiness {
            latch,
            limit,
            last_answer: None,
            ready: false,
        }
    }

    /// A call was answered.
    pub fn answered(&mut self) {
        self.answered_at(Instant::now());
    }

    /// A call failed with `error`.
    pub fn failed(&mut self, error: &dyn Display) {
        self.failed_at(error, Instant::now());
    }

    fn answered_at(&mut self, now: Instant) {
        self.last_answer = Some(now);
        if !self.ready {
            self.latch.set();
            self.ready = true;
        }
    }

    fn failed_at(&mut self, error: &dyn Display, now: Instant) {
        let reason = match self.last_answer {
            None => format!("no successful call to the API server yet: {error}"),
            Some(at) if now.saturating_duration_since(at) >= self.limit => format!(
                "no successful call to the API server for {}: {error}",
                humantime::format_duration(Duration::from_secs(
                    now.saturating_duration_since(at).as_secs()
                ))
            ),
            Some(_) => return,
        };
        // The reason is refreshed on every failure, so /readyz says what the API server
        // answers now.
        self.latch.unset(reason);
        self.ready = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_on_the_first_answer_and_unready_only_after_the_limit() {
        let latch = ReadyLatch::detached();
        let mut api = ApiReadiness::new(latch, Duration::from_secs(60));
        let t = Instant::now();
        api.failed_at(&"connection refused", t);
        assert!(!api.ready);
        api.answered_at(t + Duration::from_secs(1));
        assert!(api.ready);
        api.failed_at(&"503", t + Duration::from_secs(30));
        assert!(api.ready, "one failure within the limit does not flip it");
        api.failed_at(&"503", t + Duration::from_secs(61));
        assert!(!api.ready);
        api.answered_at(t + Duration::from_secs(62));
        assert!(api.ready);
    }
}
