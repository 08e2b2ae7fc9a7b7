//! The table of open connections: admission at the cap, and the choice of which connection
//! makes room for a new one.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::time::Instant;

use super::activity::Activity;
use super::stats::Stats;

/// Open connections and the cap on them.
#[derive(Debug)]
pub struct Table {
    epoch: Instant,
    cap: usize,
    open: Mutex<Vec<Arc<Activity>>>,
    stats: Arc<Stats>,
}

/// A connection's place in the table; dropping it frees the place.
#[derive(Debug)]
pub struct Admitted {
    /// The connection's phase, shared with the table.
    pub activity: Arc<Activity>,
    /// Whether another connection was evicted to make room for this one.
    pub made_room: bool,
    table: Arc<Table>,
}

impl Table {
    /// An empty table for at most `cap` connections.
    pub fn new(cap: usize, stats: Arc<Stats>) -> Arc<Table> {
        stats.set_max(cap);
        Arc::new(Table {
            epoch: Instant::now(),
            cap,
            open: Mutex::new(Vec::with_capacity(cap.min(1024))),
            stats,
        })
    }

    fn lock(&self) -> MutexGuard<'_, Vec<Arc<Activity>>> {
        // The table stays consistent whatever a panicking holder did: every change is one push
        // or one swap_remove.
        self.open.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A place for a connection accepted now. At the cap, the connection that has waited
    /// longest without a request in progress is evicted for it; `None` (refused) when there is
    /// none, or when evicted connections have not closed yet — the table never holds more than
    /// `cap` plus those.
    pub fn admit(self: &Arc<Self>) -> Option<Admitted> {
        let mut open = self.lock();
        let mut made_room = false;
        if open.len() >= self.cap {
            let closing = open.len() - self.cap;
            if closing >= MAX_CLOSING || !evict_oldest(&open) {
                self.stats.refused();
                return None;
            }
            self.stats.evicted();
            made_room = true;
        }
        let activity = Arc::new(Activity::new(self.epoch));
        open.push(Arc::clone(&activity));
        self.stats.set_open(open.len());
        Some(Admitted {
            activity,
            made_room,
            table: Arc::clone(self),
        })
    }

    /// Evicts the connection that has waited longest without a request in progress, when there
    /// is one (when descriptors run out).
    pub fn evict_oldest(&self) -> bool {
        let evicted = evict_oldest(&self.lock());
        if evicted {
            self.stats.evicted();
        }
        evicted
    }
}

/// Evicted connections that may still be closing before new ones are refused: the table
/// exceeds the cap by at most this many. Descriptors for them come out of
/// [`super::fd_limit::RESERVED_FDS`].
pub const MAX_CLOSING: usize = 32;

fn evict_oldest(open: &[Arc<Activity>]) -> bool {
    open.iter()
        .filter(|activity| activity.evictable())
        .min_by_key(|activity| activity.phase().1)
        .is_some_and(|activity| activity.evict())
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let mut open = self.table.lock();
        if let Some(at) = open.iter().position(|a| Arc::ptr_eq(a, &self.activity)) {
            open.swap_remove(at);
        }
        self.table.stats.set_open(open.len());
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::http::activity::Phase;

    #[test]
    fn at_the_cap_the_longest_waiting_connection_makes_room() {
        let stats = Arc::new(Stats::default());
        let table = Table::new(3, Arc::clone(&stats));
        let t = Instant::now();
        let at = |n: u64| t + Duration::from_secs(n);
        let mut admitted: Vec<Admitted> = (0..3).map(|_| table.admit().unwrap()).collect();
        assert!(admitted.iter().all(|a| !a.made_room));
        // The first is answering a request; the second has been idle since t+2, the third has
        // waited for its head since t+1: the third waited longest.
        admitted[0].activity.enter_at(Phase::Busy, at(0));
        admitted[1].activity.enter_at(Phase::Idle, at(2));
        admitted[2].activity.enter_at(Phase::Head, at(1));
        let fourth = table.admit().unwrap();
        fourth.activity.enter_at(Phase::Head, at(3));
        assert!(fourth.made_room);
        assert!(!admitted[0].activity.evictable() && admitted[1].activity.evictable());
        assert!(!admitted[2].activity.evictable(), "chosen");
        assert_eq!(stats.snapshot().evicted, 1);
        assert_eq!(stats.snapshot().open, 4, "until the evicted one closes");

        drop(admitted.remove(2));
        assert_eq!(stats.snapshot().open, 3);
        let fifth = table.admit().unwrap();
        assert!(fifth.made_room);
        assert!(!admitted[1].activity.evictable(), "the idle one went next");
        assert!(fourth.activity.evictable());
        assert_eq!(stats.snapshot().max, 3);
    }

    #[test]
    fn with_every_connection_busy_new_ones_are_refused() {
        let stats = Arc::new(Stats::default());
        let table = Table::new(2, Arc::clone(&stats));
        let busy: Vec<Admitted> = (0..2).map(|_| table.admit().unwrap()).collect();
        for admitted in &busy {
            admitted.activity.enter(Phase::Busy);
        }
        assert!(table.admit().is_none());
        assert!(!table.evict_oldest());
        assert_eq!(
            stats.snapshot(),
            crate::http::StatsSnapshot {
                open: 2,
                max: 2,
                refused: 1,
                ..Default::default()
            }
        );
    }

    #[test]
    fn evicted_connections_that_have_not_closed_yet_are_bounded() {
        let stats = Arc::new(Stats::default());
        let table = Table::new(1, Arc::clone(&stats));
        // None of these close: each new one evicts the last, until MAX_CLOSING are closing.
        let held: Vec<Admitted> = (0..=MAX_CLOSING).map_while(|_| table.admit()).collect();
        assert_eq!(held.len(), MAX_CLOSING + 1);
        assert!(table.admit().is_none());
        let snapshot = stats.snapshot();
        assert_eq!(
            (snapshot.open, snapshot.evicted, snapshot.refused),
            (MAX_CLOSING as u64 + 1, MAX_CLOSING as u64, 1)
        );
    }
}
