//! The readiness board: each subsystem's state, what `/readyz` reports and what the supervisor
//! waits on before it tells systemd the daemon is ready.

use std::fmt::Write as _;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::watch;

/// Where a subsystem is in its life.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum State {
    /// Started, not ready yet.
    Starting,
    /// Doing its job.
    Ready,
    /// Doing its job, and saying what it is busy with (a GPU being reset): counts as ready.
    Busy(String),
    /// Finished its work and stopped cleanly (a oneshot labeller); counts as ready.
    Done,
    /// Not doing its job for this reason, for now: it was ready, or started, and lost
    /// something it serves from (a folder removed under it); ready again once that is back.
    NotReady(String),
    /// Stopped with this error, or lost a helper task it needs (see [`super::Helpers`]):
    /// final.
    Failed(String),
}

impl State {
    fn counts_as_ready(&self) -> bool {
        matches!(self, State::Ready | State::Busy(_) | State::Done)
    }

    fn word(&self) -> &str {
        match self {
            State::Starting => "starting",
            State::Ready | State::Busy(_) => "ready",
            State::Done => "done",
            State::NotReady(_) => "not ready",
            State::Failed(_) => "failed",
        }
    }
}

/// Every subsystem's state, shared by the supervisor, the latches and the admin endpoint.
#[derive(Debug, Clone, Default)]
pub struct Readiness {
    inner: Arc<Board>,
}

#[derive(Debug, Default)]
struct Board {
    entries: Mutex<Vec<(&'static str, State)>>,
    changed: watch::Sender<u64>,
}

impl Readiness {
    /// Adds a subsystem in state `Starting`; returns its slot.
    pub(super) fn register(&self, name: &'static str) -> usize {
        let mut entries = self.entries();
        entries.push((name, State::Starting));
        entries.len() - 1
    }

    /// Moves a subsystem to `state`. A failure is final, and `Ready` or `NotReady` never goes
    /// back to `Starting`.
    pub(super) fn mark(&self, slot: usize, state: State) {
        let changed = {
            let mut entries = self.entries();
            let Some((_, current)) = entries.get_mut(slot) else {
                return;
            };
            let now_ready = state == State::Ready && !current.counts_as_ready();
            let backwards = state == State::Starting && *current != State::Starting;
            if *current == state || backwards || matches!(current, State::Failed(_) | State::Done) {
                None
            } else {
                *current = state;
                Some(now_ready)
            }
        };
        if let Some(now_ready) = changed {
            if now_ready {
                // Logged where the subsystem marks itself, so the line carries its span.
                tracing::info!("Ready");
            }
            self.inner.changed.send_modify(|version| *version += 1);
        }
    }

    /// Whether every subsystem is ready (or done). A daemon without subsystems is not.
    pub fn all_ready(&self) -> bool {
        let entries = self.entries();
        !entries.is_empty() && entries.iter().all(|(_, state)| state.counts_as_ready())
    }

    /// Each subsystem and its state, in start order.
    pub fn states(&self) -> Vec<(&'static str, State)> {
        self.entries().clone()
    }

    /// The `/readyz` body: a verdict line, then one line per subsystem.
    pub fn report(&self) -> (bool, String) {
        let ready = self.all_ready();
        let mut text = String::from(if ready { "ready\n" } else { "not ready\n" });
        for (name, state) in self.states() {
            let _ = match &state {
                State::Failed(why) | State::NotReady(why) | State::Busy(why) => {
                    writeln!(text, "{name} {}: {why}", state.word())
                }
                other => writeln!(text, "{name} {}", other.word()),
            };
        }
        (ready, text)
    }

    /// A receiver woken on every state change.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.inner.changed.subscribe()
    }

    fn entries(&self) -> std::sync::MutexGuard<'_, Vec<(&'static str, State)>> {
        // A panic while holding this lock leaves plain data behind; keep serving it.
        self.inner
            .entries
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_only_when_every_subsystem_is() {
        let board = Readiness::default();
        assert!(!board.all_ready(), "no subsystem is not ready");
        let a = board.register("exporter");
        let b = board.register("labeller");
        board.mark(a, State::Ready);
        assert!(!board.all_ready());
        assert_eq!(
            board.report(),
            (
                false,
                "not ready\nexporter ready\nlabeller starting\n".to_owned()
            )
        );
        board.mark(b, State::Done);
        assert_eq!(
            board.report(),
            (true, "ready\nexporter ready\nlabeller done\n".to_owned())
        );
    }

    #[test]
    fn failure_is_final_and_reported() {
        let board = Readiness::default();
        let a = board.register("exporter");
        board.mark(a, State::Failed("cannot listen on :9400".into()));
        board.mark(a, State::Ready);
        assert_eq!(
            board.report(),
            (
                false,
                "not ready\nexporter failed: cannot listen on :9400\n".to_owned()
            )
        );
    }

    #[test]
    fn not_ready_names_the_reason_and_ready_comes_back() {
        let board = Readiness::default();
        let a = board.register("device-plugin");
        board.mark(a, State::Ready);
        board.mark(a, State::NotReady("its folder was removed".into()));
        assert_eq!(
            board.report(),
            (
                false,
                "not ready\ndevice-plugin not ready: its folder was removed\n".to_owned()
            )
        );
        board.mark(a, State::Starting);
        assert_eq!(board.states()[0].1.word(), "not ready");
        board.mark(a, State::Ready);
        assert!(board.all_ready());
    }

    #[test]
    fn changes_wake_subscribers_once_per_change() {
        let board = Readiness::default();
        let a = board.register("health");
        let mut rx = board.subscribe();
        board.mark(a, State::Ready);
        board.mark(a, State::Ready);
        assert!(rx.has_changed().unwrap());
        assert_eq!(*rx.borrow_and_update(), 1);
    }
}
