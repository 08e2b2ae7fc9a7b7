//! The state that survives a takeover besides the sockets: named pieces, each provided by the
//! part of gpud that keeps it (the XID ledger, the MPS daemons) and read back by the same part
//! in the next process.
//!
//! A piece is read when the new process asks for it, not pushed on every change: the provider
//! is a function called at the moment of the offer. A piece the new process cannot read is
//! that part starting fresh, said once in the log, never a failed start.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use serde_json::Value;

type Provider = Box<dyn Fn() -> Value + Send + Sync>;

/// The process's handover state; clones share it.
#[derive(Clone, Default)]
pub struct Board {
    shared: Arc<Shared>,
}

struct Shared {
    inherited: Mutex<BTreeMap<String, Value>>,
    providers: Mutex<BTreeMap<String, Provider>>,
    handed_over: AtomicBool,
    /// The host (pod) of the process this one took over from.
    taken_from: Mutex<Option<String>>,
    /// Whether no process this one took over from is still finishing.
    predecessor_gone: tokio::sync::watch::Sender<bool>,
    /// How many takeovers of this process were abandoned (see [`Board::mark_abandoned`]).
    abandoned: tokio::sync::watch::Sender<u64>,
}

impl Default for Shared {
    fn default() -> Self {
        Shared {
            inherited: Mutex::default(),
            providers: Mutex::default(),
            handed_over: AtomicBool::default(),
            taken_from: Mutex::default(),
            predecessor_gone: tokio::sync::watch::Sender::new(true),
            abandoned: tokio::sync::watch::Sender::new(0),
        }
    }
}

impl std::fmt::Debug for Board {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Board")
            .field("inherited", &lock(&self.shared.inherited).keys())
            .field("provided", &lock(&self.shared.providers).keys())
            .field("handed_over", &self.handed_over())
            .finish()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Board {
    /// Keeps the pieces the process taken over from handed over.
    pub fn inherit(&self, pieces: BTreeMap<String, Value>) {
        lock(&self.shared.inherited).extend(pieces);
    }

    /// The piece `key` the process taken over from handed over (taken once).
    pub fn take(&self, key: &str) -> Option<Value> {
        lock(&self.shared.inherited).remove(key)
    }

    /// Offers `key` to the next process: `provide` is called at the moment of the offer.
    pub fn provide(&self, key: &str, provide: impl Fn() -> Value + Send + Sync + 'static) {
        lock(&self.shared.providers).insert(key.to_owned(), Box::new(provide));
    }

    /// Every provided piece, as of now.
    pub fn collect(&self) -> BTreeMap<String, Value> {
        lock(&self.shared.providers)
            .iter()
            .map(|(key, provide)| (key.clone(), provide()))
            .collect()
    }

    /// The next process serves now: what this one leaves behind (daemons, files, sockets) is
    /// the next one's.
    pub fn mark_handed_over(&self) {
        self.shared.handed_over.store(true, Ordering::SeqCst);
    }

    /// Records the host (pod) of the process this one took over from, which now finishes
    /// beside this one until [`Board::mark_predecessor_gone`].
    pub fn set_taken_from(&self, host: Option<String>) {
        *lock(&self.shared.taken_from) = host;
        self.shared.predecessor_gone.send_replace(false);
    }

    /// The process taken over from has finished (or cannot be waited for any longer).
    pub fn mark_predecessor_gone(&self) {
        self.shared.predecessor_gone.send_replace(true);
    }

    /// `true` once no process taken over from is still finishing: state that both would
    /// write (the DRA checkpoint) is this process's alone from then on.
    pub fn predecessor_gone(&self) -> tokio::sync::watch::Receiver<bool> {
        self.shared.predecessor_gone.subscribe()
    }

    /// The host (pod) of the process this one took over from, if it took over.
    pub fn taken_from(&self) -> Option<String> {
        lock(&self.shared.taken_from).clone()
    }

    /// A new gpud that was offered this process's sockets went away without saying `stop`:
    /// it may have registered with the kubelet (which then reaches nobody), rewritten what
    /// this process publishes, or removed its sockets. Whoever publishes something does so
    /// again in full ([`Board::abandoned`]).
    pub fn mark_abandoned(&self) {
        self.shared.abandoned.send_modify(|count| *count += 1);
    }

    /// Changes every time a takeover of this process is abandoned ([`Board::mark_abandoned`]).
    pub fn abandoned(&self) -> tokio::sync::watch::Receiver<u64> {
        self.shared.abandoned.subscribe()
    }

    /// Whether this process handed over to a new one and is only finishing.
    pub fn handed_over(&self) -> bool {
        self.shared.handed_over.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_are_collected_when_offered_and_taken_once() {
        let board = Board::default();
        let counter = Arc::new(std::sync::atomic::AtomicU64::new(1));
        let seen = Arc::clone(&counter);
        board.provide("xid", move || Value::from(seen.load(Ordering::SeqCst)));
        counter.store(7, Ordering::SeqCst);
        assert_eq!(board.collect()["xid"], Value::from(7));

        let next = Board::default();
        next.inherit(board.collect());
        assert_eq!(next.take("xid"), Some(Value::from(7)));
        assert_eq!(next.take("xid"), None);
        assert!(!next.handed_over());
    }

    #[test]
    fn every_abandoned_takeover_is_news_to_each_subscriber() {
        let board = Board::default();
        let mut early = board.abandoned();
        assert!(!early.has_changed().unwrap());
        board.mark_abandoned();
        let mut late = board.clone().abandoned();
        assert!(early.has_changed().unwrap());
        assert_eq!(*early.borrow_and_update(), 1);
        board.mark_abandoned();
        assert!(late.has_changed().unwrap());
        assert_eq!(*late.borrow_and_update(), 2);
    }
}
