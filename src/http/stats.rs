//! What the server counts about its connections, for the exporter's `gpud_http_*` families.

use std::sync::atomic::{AtomicU64, Ordering};

use super::activity::Phase;

/// Live counters of one server, shared with whoever renders them.
#[derive(Debug, Default)]
pub struct Stats {
    open: AtomicU64,
    max: AtomicU64,
    refused: AtomicU64,
    evicted: AtomicU64,
    header_timeouts: AtomicU64,
    idle_timeouts: AtomicU64,
}

/// The counters at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StatsSnapshot {
    /// Connections open now.
    pub open: u64,
    /// The connection cap in force (the configured maximum, or lower for the fd limit).
    pub max: u64,
    /// Connections closed at once because the cap was reached and none could be evicted.
    pub refused: u64,
    /// Connections without a request in progress closed to make room for a new one.
    pub evicted: u64,
    /// Connections closed because a request head did not complete in time.
    pub header_timeouts: u64,
    /// Keep-alive connections closed after waiting too long for their next request.
    pub idle_timeouts: u64,
}

impl Stats {
    /// The counters now.
    pub fn snapshot(&self) -> StatsSnapshot {
        let get = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        StatsSnapshot {
            open: get(&self.open),
            max: get(&self.max),
            refused: get(&self.refused),
            evicted: get(&self.evicted),
            header_timeouts: get(&self.header_timeouts),
            idle_timeouts: get(&self.idle_timeouts),
        }
    }

    pub(super) fn set_open(&self, open: usize) {
        self.open.store(open as u64, Ordering::Relaxed);
    }

    pub(super) fn set_max(&self, max: usize) {
        self.max.store(max as u64, Ordering::Relaxed);
    }

    pub(super) fn refused(&self) {
        self.refused.fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn evicted(&self) {
        self.evicted.fetch_add(1, Ordering::Relaxed);
    }

    /// A connection timed out in `phase` (head or idle; a busy one never does).
    pub(super) fn timed_out(&self, phase: Phase) {
        let counter = match phase {
            Phase::Idle => &self.idle_timeouts,
            Phase::Head | Phase::Busy => &self.header_timeouts,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
}
