//! The DRA plugin's readiness, from the causes that can each hold it back at once: the kubelet
//! refusing its registration, a socket that cannot be served again, the node's ResourceSlices
//! that the API server does not take. Each cause sets and clears only its own part, so that
//! one clearing never hides another still there; `/readyz` names every cause present.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

use crate::daemon::ReadyLatch;

/// What can hold the plugin back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Cause {
    /// The kubelet refused the plugin's registration.
    Registration,
    /// A socket removed under the plugin cannot be served again.
    Sockets,
    /// The node's ResourceSlices cannot be published.
    Slices,
}

/// How much a cause holds the plugin back.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Weight {
    /// Not ready: the plugin is not doing its job.
    NotReady(String),
    /// Ready, with a problem `/readyz` names (one that may pass by itself).
    Degraded(String),
}

/// The plugin's readiness latch, shared by the parts that can hold it back.
#[derive(Debug, Clone)]
pub struct DraReadiness {
    latch: ReadyLatch,
    causes: Arc<Mutex<BTreeMap<Cause, Weight>>>,
}

impl DraReadiness {
    /// Readiness through `latch`, with no cause present.
    pub fn new(latch: ReadyLatch) -> Self {
        DraReadiness {
            latch,
            causes: Arc::default(),
        }
    }

    /// `cause` keeps the plugin from its job: not ready, for `reason` (a sentence naming what
    /// is wrong and what brings it back).
    pub fn not_ready(&self, cause: Cause, reason: String) {
        self.put(cause, Some(Weight::NotReady(reason)));
    }

    /// `cause` is a problem the plugin still serves through: ready, `/readyz` saying `reason`.
    pub fn degraded(&self, cause: Cause, reason: String) {
        self.put(cause, Some(Weight::Degraded(reason)));
    }

    /// `cause` is gone. Ready again once no other cause is present.
    pub fn clear(&self, cause: Cause) {
        self.put(cause, None);
    }

    /// Whether `cause` is present.
    pub fn holds(&self, cause: Cause) -> bool {
        self.lock().contains_key(&cause)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<Cause, Weight>> {
        self.causes.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn put(&self, cause: Cause, weight: Option<Weight>) {
        let mut causes = self.lock();
        let changed = match weight {
            Some(weight) => causes.insert(cause, weight.clone()) != Some(weight),
            None => causes.remove(&cause).is_some(),
        };
        if !changed {
            return;
        }
        // Marked under the lock, so that two causes changing at once leave the latch as the
        // last of them saw the whole.
        let said = |pick: fn(&Weight) -> Option<&String>| -> Vec<&str> {
            causes
                .values()
                .filter_map(pick)
                .map(String::as_str)
                .collect()
        };
        let not_ready = said(|w| match w {
            Weight::NotReady(why) => Some(why),
            Weight::Degraded(_) => None,
        });
        let degraded = said(|w| match w {
            Weight::Degraded(why) => Some(why),
            Weight::NotReady(_) => None,
        });
        if !not_ready.is_empty() {
            let mut all = not_ready;
            all.extend(degraded);
            self.latch.unset(all.join("; and "));
        } else if !degraded.is_empty() {
            self.latch.busy(Some(degraded.join("; and ")));
        } else {
            self.latch.set();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_cause_clearing_leaves_the_others_in_place() {
        let ready = DraReadiness::new(ReadyLatch::detached());
        ready.not_ready(Cause::Registration, "refused".into());
        ready.degraded(Cause::Slices, "429".into());
        assert!(ready.holds(Cause::Registration) && ready.holds(Cause::Slices));
        ready.clear(Cause::Slices);
        assert!(ready.holds(Cause::Registration));
        assert!(!ready.holds(Cause::Slices));
        ready.clear(Cause::Registration);
        assert!(!ready.holds(Cause::Registration));
    }
}
