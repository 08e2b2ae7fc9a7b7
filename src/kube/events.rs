//! Kubernetes Events about the Node (GPU health transitions, the doctor's verdict, restarted
//! MPS daemons): de-duplicated and rate-limited, and held in a small outbox until the API
//! server takes them.
//!
//! - De-duplication: the same reason and message within [`DEDUP_WINDOW`] is one event (a
//!   flapping GPU gives one failure and one recovery event per window, not one per flap).
//! - Rate limit: a token bucket of [`BURST`] events refilled one per [`REFILL`]; what it
//!   refuses is counted and logged, never queued.
//! - Each event's name is fixed when it is queued, so a retry after an answer that was lost
//!   (the API server created it, the reply never came) is refused as `AlreadyExists` instead of
//!   creating a duplicate.
//! - The outbox keeps at most [`OUTBOX`] events; while the API server is away the oldest are
//!   dropped first: the conditions carry the current state, events are history.

use std::collections::{HashMap, VecDeque};
use std::hash::{Hash, Hasher};
use std::time::{Duration, Instant, SystemTime};

use tracing::debug;

/// The component named in the events gpud creates (and the field manager they are created
/// under).
pub const COMPONENT: &str = "gpud";

/// Identical events within this window are sent once.
pub const DEDUP_WINDOW: Duration = Duration::from_secs(600);
/// Events that may be sent at once.
pub const BURST: u32 = 25;
/// One more event may be sent after this long.
pub const REFILL: Duration = Duration::from_secs(12);
/// Most events waiting for the API server.
pub const OUTBOX: usize = 64;

/// `Normal` or `Warning`, as Kubernetes spells event types.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Normal,
    Warning,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Normal => "Normal",
            Kind::Warning => "Warning",
        }
    }
}

/// One event about the Node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeEvent {
    pub kind: Kind,
    pub reason: &'static str,
    pub message: String,
    /// When it happened.
    pub at: SystemTime,
}

impl NodeEvent {
    /// The event's object name: the node's name and a hash of what and when, stable across
    /// retries.
    pub fn name(&self, node: &str) -> String {
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        (self.reason, &self.message).hash(&mut hasher);
        self.at
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos()
            .hash(&mut hasher);
        format!("{node}.gpud-{:016x}", hasher.finish())
    }
}

/// Events waiting to be sent, after de-duplication and the rate limit.
#[derive(Debug)]
pub struct Outbox {
    pending: VecDeque<NodeEvent>,
    recent: HashMap<(&'static str, String), Instant>,
    tokens: u32,
    refilled_at: Instant,
    /// Events refused by the rate limit or pushed out of a full outbox.
    pub dropped: u64,
}

impl Outbox {
    pub fn new(now: Instant) -> Self {
        Outbox {
            pending: VecDeque::new(),
            recent: HashMap::new(),
            tokens: BURST,
            refilled_at: now,
            dropped: 0,
        }
    }

    /// Queues `event` unless it repeats one from the window or the rate limit refuses it;
    /// returns whether it was queued.
    pub fn push(&mut self, event: NodeEvent, now: Instant) -> bool {
        self.recent
            .retain(|_, at| now.saturating_duration_since(*at) < DEDUP_WINDOW);
        let key = (event.reason, event.message.clone());
        if self.recent.contains_key(&key) {
            return false;
        }
        self.refill(now);
        if self.tokens == 0 {
            self.dropped += 1;
            return false;
        }
        self.tokens -= 1;
        self.recent.insert(key, now);
        if self.pending.len() == OUTBOX {
            self.pending.pop_front();
            self.dropped += 1;
        }
        // While the API server is away, this line is the only trace of an event until it is
        // sent.
        debug!(
            reason = event.reason,
            "Node event queued: {}", event.message
        );
        self.pending.push_back(event);
        true
    }

    fn refill(&mut self, now: Instant) {
        let earned = now.saturating_duration_since(self.refilled_at).as_secs() / REFILL.as_secs();
        if earned > 0 {
            self.tokens = BURST.min(
                self.tokens
                    .saturating_add(u32::try_from(earned).unwrap_or(BURST)),
            );
            self.refilled_at += REFILL * u32::try_from(earned).unwrap_or(u32::MAX);
        }
    }

    /// The oldest event waiting.
    pub fn front(&self) -> Option<&NodeEvent> {
        self.pending.front()
    }

    /// The oldest event was sent (or the API server already has it).
    pub fn sent(&mut self) {
        self.pending.pop_front();
    }

    /// Events waiting.
    pub fn len(&self) -> usize {
        self.pending.len()
    }

    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(message: &str) -> NodeEvent {
        NodeEvent {
            kind: Kind::Warning,
            reason: "GPUUnhealthy",
            message: message.into(),
            at: SystemTime::UNIX_EPOCH,
        }
    }

    #[test]
    fn repeats_within_the_window_are_one_event() {
        let t = Instant::now();
        let mut outbox = Outbox::new(t);
        assert!(outbox.push(event("GPU 3 healthy -> unhealthy"), t));
        assert!(!outbox.push(
            event("GPU 3 healthy -> unhealthy"),
            t + Duration::from_secs(60)
        ));
        assert!(outbox.push(event("GPU 4 healthy -> unhealthy"), t));
        assert!(outbox.push(event("GPU 3 healthy -> unhealthy"), t + DEDUP_WINDOW));
        let mut sent = 0;
        while outbox.front().is_some() {
            outbox.sent();
            sent += 1;
        }
        assert_eq!(sent, 3);
    }

    #[test]
    fn the_rate_limit_refuses_a_storm_and_refills() {
        let t = Instant::now();
        let mut outbox = Outbox::new(t);
        let queued = (0..100)
            .filter(|i| outbox.push(event(&format!("GPU {i}")), t))
            .count();
        assert_eq!(
            (queued, outbox.dropped),
            (BURST as usize, 100 - u64::from(BURST))
        );
        assert!(!outbox.push(event("late"), t + REFILL / 2));
        assert!(outbox.push(event("later"), t + REFILL));
    }

    #[test]
    fn names_are_stable_and_distinct() {
        let a = event("GPU 3");
        assert_eq!(a.name("n1"), a.clone().name("n1"));
        assert_ne!(a.name("n1"), event("GPU 4").name("n1"));
        assert!(a.name("n1").starts_with("n1.gpud-"));
    }
}
