//! What one connection is doing and since when, shared between the connection's task (which
//! moves it from phase to phase) and the connection table (which picks the connection to evict
//! at the cap): the phase that decides which timeout runs, and the request to close.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use tokio::sync::Notify;
use tokio::sync::futures::Notified;
use tokio::time::Instant;

use super::Limits;

/// Where a connection is in its request cycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Waiting for a request head to complete: since accept, or since the first byte of the
    /// next request on a keep-alive connection.
    Head,
    /// Answering a request.
    Busy,
    /// Between two requests.
    Idle,
}

impl Phase {
    fn code(self) -> u64 {
        match self {
            Phase::Head => 0,
            Phase::Busy => 1,
            Phase::Idle => 2,
        }
    }

    fn from_code(code: u64) -> Phase {
        match code {
            0 => Phase::Head,
            1 => Phase::Busy,
            _ => Phase::Idle,
        }
    }
}

/// Bits of the packed state that hold the phase; the rest hold nanoseconds since the epoch.
const PHASE_BITS: u32 = 2;

/// One connection's phase and the request to evict it.
#[derive(Debug)]
pub struct Activity {
    /// What the times below count from (the server's start).
    epoch: Instant,
    /// The phase and when it began, packed so that a reader never sees one without the other:
    /// `nanos_since_epoch << PHASE_BITS | phase`. 2^62 ns is 146 years.
    state: AtomicU64,
    /// Set once the table chose this connection to close; it is not chosen twice.
    evicting: AtomicBool,
    evict: Notify,
}

impl Activity {
    /// A connection accepted now: waiting for its first request head.
    pub fn new(epoch: Instant) -> Self {
        Self::accepted_at(epoch, Instant::now())
    }

    fn accepted_at(epoch: Instant, at: Instant) -> Self {
        let activity = Activity {
            epoch,
            state: AtomicU64::new(0),
            evicting: AtomicBool::new(false),
            evict: Notify::new(),
        };
        activity.enter_at(Phase::Head, at);
        activity
    }

    /// The phase and when it began.
    pub fn phase(&self) -> (Phase, Instant) {
        let state = self.state.load(Ordering::Acquire);
        let since = self.epoch + std::time::Duration::from_nanos(state >> PHASE_BITS);
        (Phase::from_code(state & ((1 << PHASE_BITS) - 1)), since)
    }

    /// Moves to `phase`, starting now.
    pub fn enter(&self, phase: Phase) {
        self.enter_at(phase, Instant::now());
    }

    pub(super) fn enter_at(&self, phase: Phase, at: Instant) {
        let nanos = u64::try_from(at.saturating_duration_since(self.epoch).as_nanos())
            .unwrap_or(u64::MAX >> PHASE_BITS);
        self.state
            .store((nanos << PHASE_BITS) | phase.code(), Ordering::Release);
    }

    /// Bytes arrived: on an idle connection they start a request head, whose timeout runs from
    /// now. In the head phase nothing changes: a trickle of bytes does not buy more time.
    pub fn bytes_read(&self) {
        self.bytes_read_at(Instant::now());
    }

    fn bytes_read_at(&self, at: Instant) {
        if self.phase().0 == Phase::Idle {
            self.enter_at(Phase::Head, at);
        }
    }

    /// When the current phase runs out, and which phase that is; `None` while busy.
    pub fn deadline(&self, limits: &Limits) -> Option<(Instant, Phase)> {
        let (phase, since) = self.phase();
        match phase {
            Phase::Head => Some((since + limits.header_read_timeout, phase)),
            Phase::Idle => Some((since + limits.idle_timeout, phase)),
            Phase::Busy => None,
        }
    }

    /// Whether the table may close this connection to make room: no request in progress and
    /// not chosen already.
    pub fn evictable(&self) -> bool {
        self.phase().0 != Phase::Busy && !self.evicting.load(Ordering::Acquire)
    }

    /// Asks the connection's task to close it. False when it was asked already.
    pub fn evict(&self) -> bool {
        if self.evicting.swap(true, Ordering::AcqRel) {
            return false;
        }
        // Stores a permit when the task is not waiting right now; it sees it on its next wait.
        self.evict.notify_one();
        true
    }

    /// Completes once [`Activity::evict`] was called.
    pub fn evicted(&self) -> Notified<'_> {
        self.evict.notified()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn limits() -> Limits {
        Limits {
            header_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            max_connections: 4,
        }
    }

    fn secs(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    #[test]
    fn a_new_connection_has_the_header_timeout_from_accept() {
        let epoch = Instant::now();
        let activity = Activity::accepted_at(epoch, epoch + secs(3));
        assert_eq!(
            activity.deadline(&limits()),
            Some((epoch + secs(13), Phase::Head))
        );
    }

    #[test]
    fn bytes_do_not_extend_a_head_but_start_one_after_idle() {
        let epoch = Instant::now();
        let activity = Activity::accepted_at(epoch, epoch);
        activity.bytes_read_at(epoch + secs(4));
        assert_eq!(
            activity.phase(),
            (Phase::Head, epoch),
            "slowloris gains nothing"
        );

        activity.enter_at(Phase::Busy, epoch + secs(5));
        assert_eq!(
            activity.deadline(&limits()),
            None,
            "a request in progress is not timed"
        );
        activity.enter_at(Phase::Idle, epoch + secs(6));
        assert_eq!(
            activity.deadline(&limits()),
            Some((epoch + secs(66), Phase::Idle))
        );
        activity.bytes_read_at(epoch + secs(36));
        assert_eq!(
            activity.deadline(&limits()),
            Some((epoch + secs(46), Phase::Head)),
            "the next request's head is timed from its first byte"
        );
    }

    #[test]
    fn times_before_the_epoch_count_as_the_epoch() {
        let epoch = Instant::now() + secs(100);
        let activity = Activity::new(epoch);
        assert_eq!(activity.phase(), (Phase::Head, epoch));
    }

    #[tokio::test]
    async fn eviction_is_asked_once_and_seen_by_a_later_wait() {
        let activity = Activity::new(Instant::now());
        assert!(activity.evictable());
        assert!(activity.evict());
        assert!(!activity.evict(), "already chosen");
        assert!(!activity.evictable());
        // The permit was stored: a wait that starts after the request still completes.
        tokio::time::timeout(secs(1), activity.evicted())
            .await
            .unwrap();
    }

    #[test]
    fn busy_connections_are_not_evictable() {
        let activity = Activity::new(Instant::now());
        activity.enter(Phase::Busy);
        assert!(!activity.evictable());
        activity.enter(Phase::Idle);
        assert!(activity.evictable());
    }
}
