//! What a running subsystem gets from the supervisor.

use std::sync::Arc;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::helpers::{Helpers, Outcome};
use super::readiness::{Readiness, State};
use crate::handover::Board;

/// A subsystem's handle on the daemon. `S` is the part of the reloadable configuration the
/// subsystem reads (`()` for subsystems that keep their start-up settings).
#[derive(Debug)]
pub struct Context<S> {
    cancel: CancellationToken,
    ready: ReadyLatch,
    settings: watch::Receiver<Arc<S>>,
    board: Board,
}

impl<S> Context<S> {
    pub(super) fn new(
        cancel: CancellationToken,
        ready: ReadyLatch,
        settings: watch::Receiver<Arc<S>>,
        board: Board,
    ) -> Self {
        Context {
            cancel,
            ready,
            settings,
            board,
        }
    }

    /// The piece of state `key` the gpud this one took over from handed over (see
    /// [`crate::handover`]); `None` after a cold start. Taken once.
    pub fn inherited(&self, key: &str) -> Option<serde_json::Value> {
        self.board.take(key)
    }

    /// Offers the piece of state `key` to the gpud that takes over from this one: `provide`
    /// is called at the moment of the offer.
    pub fn hand_on(
        &self,
        key: &str,
        provide: impl Fn() -> serde_json::Value + Send + Sync + 'static,
    ) {
        self.board.provide(key, provide);
    }

    /// `true` once the gpud this one took over from (if any) has finished: until then both
    /// serve, and state both would write must wait (see [`crate::handover`]).
    pub fn predecessor_gone(&self) -> watch::Receiver<bool> {
        self.board.predecessor_gone()
    }

    /// Changes every time a new gpud abandons its takeover of this one (it went away after
    /// the offer without saying `stop`): what the subsystem publishes outside the process
    /// (a kubelet registration, a file) may have been replaced by the newcomer's, and is to be
    /// published again in full. A receiver of its own.
    pub fn takeover_abandoned(&self) -> watch::Receiver<u64> {
        self.board.abandoned()
    }

    /// Whether this process is stopping because a new gpud took over: what it would clean up
    /// on the way out (daemons, files it handed on) is the new one's now.
    pub fn handed_over(&self) -> bool {
        self.board.handed_over()
    }

    /// The stop signal, to hand to code that waits on it.
    pub fn cancel_token(&self) -> CancellationToken {
        self.cancel.clone()
    }

    /// Resolves when the daemon stops.
    pub async fn cancelled(&self) {
        self.cancel.cancelled().await;
    }

    /// Marks the subsystem ready (idempotent).
    pub fn set_ready(&self) {
        self.ready.set();
    }

    /// The readiness latch, for code that becomes ready deeper down.
    pub fn ready_latch(&self) -> ReadyLatch {
        self.ready.clone()
    }

    /// Spawns a helper task of this subsystem, `name`d in logs and on `/readyz`, that runs
    /// until the daemon stops; see [`Helpers`] for what its end means.
    pub fn spawn_helper<F>(&self, name: impl Into<String>, task: F) -> tokio::task::JoinHandle<()>
    where
        F: std::future::Future + Send + 'static,
        F::Output: Outcome,
    {
        self.helpers().spawn(name, task)
    }

    /// The spawner of this subsystem's helper tasks, for code deeper down that starts them.
    pub fn helpers(&self) -> Helpers {
        self.ready.helpers(self.cancel.clone())
    }

    /// The settings now and every reload after this (a receiver of its own).
    pub fn settings(&self) -> watch::Receiver<Arc<S>> {
        self.settings.clone()
    }

    /// The settings now.
    pub fn current_settings(&self) -> Arc<S> {
        self.settings.borrow().clone()
    }
}

/// Marks one subsystem ready on the daemon's [`Readiness`] board.
#[derive(Debug, Clone)]
pub struct ReadyLatch {
    board: Readiness,
    slot: usize,
}

impl ReadyLatch {
    pub(super) fn new(board: Readiness, slot: usize) -> Self {
        ReadyLatch { board, slot }
    }

    /// A latch that belongs to no board: for running a subsystem outside a daemon (tests).
    pub fn detached() -> Self {
        ReadyLatch {
            board: Readiness::default(),
            slot: usize::MAX,
        }
    }

    /// The subsystem is ready (again); later calls change nothing.
    pub fn set(&self) {
        self.board.mark(self.slot, State::Ready);
    }

    /// The subsystem is ready and busy with `what` (shown on `/readyz`); `None` is plain
    /// ready again.
    pub fn busy(&self, what: Option<String>) {
        self.board
            .mark(self.slot, what.map_or(State::Ready, State::Busy));
    }

    /// The subsystem is not doing its job for now, for `reason` (a sentence naming what is
    /// missing and what brings it back); [`ReadyLatch::set`] ends it.
    pub fn unset(&self, reason: impl Into<String>) {
        self.board.mark(self.slot, State::NotReady(reason.into()));
    }

    /// The subsystem lost part of its job for good (a thread it cannot restart ended), for
    /// `reason`: `/readyz` says it failed until gpud restarts, whatever it marks later.
    pub fn fail(&self, reason: impl Into<String>) {
        self.board.mark(self.slot, State::Failed(reason.into()));
    }

    /// The spawner of the subsystem's helpers, expected to run until `stop` fires.
    fn helpers(&self, stop: CancellationToken) -> Helpers {
        Helpers::new(self.board.clone(), self.slot, stop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_helper_spawned_through_the_context_that_fails_clears_readiness_with_its_reason() {
        let board = Readiness::default();
        let latch = ReadyLatch::new(board.clone(), board.register("device-plugin"));
        let (_settings, rx) = watch::channel(Arc::new(()));
        let ctx = Context::new(CancellationToken::new(), latch, rx, Board::default());
        ctx.set_ready();
        assert!(board.all_ready());
        ctx.spawn_helper("gRPC server for nvidia.com/gpu", async {
            Err::<(), _>("accept: too many open files")
        })
        .await
        .unwrap();
        let (ready, body) = board.report();
        assert!(!ready);
        assert_eq!(
            body,
            "not ready\ndevice-plugin failed: gRPC server for nvidia.com/gpu: accept: too many \
             open files\n"
        );
        // The subsystem's own loop saying ready again does not hide the lost helper.
        ctx.set_ready();
        assert!(!board.all_ready());
    }
}
