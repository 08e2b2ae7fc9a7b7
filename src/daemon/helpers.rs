//! Helper tasks a subsystem starts beside its own loop (a gRPC server, a watch, a renderer),
//! supervised so that one that stops is not only a log line while `/readyz` says 200.
//!
//! A subsystem spawns them through its [`super::Context`] (`ctx.spawn_helper("…", fut)`) or
//! hands a [`Helpers`] to the code deeper down that starts them. Each helper runs in the
//! subsystem's tracing span and is expected to run until its stop signal fires: the daemon's,
//! or a narrower one the subsystem cancels itself ([`Helpers::until`]: one plugin of several,
//! replaced or withdrawn).
//!
//! **A helper that ends before its stop signal** — with an error, with `Ok`, or by panicking —
//! marks its subsystem failed on the readiness board, with the helper's name and the reason,
//! and logs it once: `/readyz` answers 503 with `device-plugin failed: gRPC server for
//! nvidia.com/gpu: …`. The daemon and the subsystem go on running. This is chosen over
//! failing the subsystem (which stops the daemon, as the supervisor does not restart
//! subsystems) because the rest keeps the node serving: the other plugins' sockets, the
//! devices already allocated, the metrics and the labels; a readiness probe or an operator
//! sees the fault, and restarting the pod (or a liveness probe on `/readyz`) brings the helper
//! back. The mark is final: nothing restarts the helper, so nothing may say ready again.
//!
//! An `Ok` end counts as a fault because every helper here is long-running: a server whose
//! accept loop ended, or a loop whose input channel closed, has stopped doing its job as
//! surely as one that returned an error. Work that has an end (a registration that succeeds,
//! a one-off report) is not a helper in this sense and is spawned with
//! [`crate::logging::spawn`]. After the stop signal, any end is expected; an error then is
//! only logged.

use std::fmt::Display;
use std::future::Future;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, warn};

use super::readiness::{Readiness, State};

/// What a helper's future returns: `()` for a loop that cannot fail, or a `Result` whose
/// error says what failed.
pub trait Outcome: Send + 'static {
    /// The error, spelled for a log line and `/readyz`.
    fn failure(self) -> Option<String>;
}

impl Outcome for () {
    fn failure(self) -> Option<String> {
        None
    }
}

impl<E: Display + Send + 'static> Outcome for Result<(), E> {
    fn failure(self) -> Option<String> {
        self.err().map(|err| format!("{err:#}"))
    }
}

/// Spawns one subsystem's helper tasks and marks the subsystem failed when one stops before
/// its stop signal (see the module documentation).
#[derive(Debug, Clone)]
pub struct Helpers {
    board: Readiness,
    slot: usize,
    stop: CancellationToken,
}

impl Helpers {
    /// Helpers of the subsystem in `slot` of `board`, expected to run until `stop` fires.
    pub(super) fn new(board: Readiness, slot: usize, stop: CancellationToken) -> Self {
        Helpers { board, slot, stop }
    }

    /// Helpers that belong to a part the subsystem stops itself: their end is expected once
    /// `stop` fires (pass a child of the subsystem's stop token, so the daemon's stop covers
    /// it too).
    pub fn until(&self, stop: CancellationToken) -> Helpers {
        Helpers {
            board: self.board.clone(),
            slot: self.slot,
            stop,
        }
    }

    /// Spawns `task` as the helper `name` (how `/readyz` and the log name it: "gRPC server
    /// for nvidia.com/gpu"). The handle resolves once the helper has ended and its end has
    /// been judged; dropping it leaves the helper running.
    pub fn spawn<F>(&self, name: impl Into<String>, task: F) -> JoinHandle<()>
    where
        F: Future + Send + 'static,
        F::Output: Outcome,
    {
        let name = name.into();
        let board = self.board.clone();
        let slot = self.slot;
        let stop = self.stop.clone();
        // The task runs on its own so that a panic ends it, not the judge below.
        let running = crate::logging::spawn(task);
        crate::logging::spawn(async move {
            if let Some(reason) = judge(running, &name, &stop).await {
                // Final: nothing restarts the helper, so nothing may say ready again.
                board.mark(slot, State::Failed(reason));
            }
        })
    }
}

/// Spawns `task`, a helper of the daemon itself rather than of a subsystem (the handover
/// socket's server), judged as [`Helpers::spawn`] judges its helpers: an end before `stop`
/// fires puts `entry` on `board` as failed, with `name` and the reason. Nothing is on the
/// board while it runs: `/readyz` names it only once it stopped.
pub(super) fn spawn_unowned<F>(
    board: &Readiness,
    entry: &'static str,
    stop: CancellationToken,
    name: impl Into<String>,
    task: F,
) -> JoinHandle<()>
where
    F: Future + Send + 'static,
    F::Output: Outcome,
{
    let name = name.into();
    let board = board.clone();
    let running = crate::logging::spawn(task);
    crate::logging::spawn(async move {
        if let Some(reason) = judge(running, &name, &stop).await {
            let slot = board.register(entry);
            board.mark(slot, State::Failed(reason));
        }
    })
}

/// Waits for the helper `name` to end and judges its end: the reason to mark its owner failed
/// with, or `None` when it ended after its stop signal (then any end is expected).
async fn judge<T: Outcome>(
    running: JoinHandle<T>,
    name: &str,
    stop: &CancellationToken,
) -> Option<String> {
    let failure = match running.await {
        Ok(outcome) => outcome.failure(),
        Err(join) => Some(format!("panicked: {join}")),
    };
    if stop.is_cancelled() {
        match failure {
            Some(why) => warn!(helper = %name, error = %why, "Helper failed while stopping"),
            None => debug!(helper = %name, "Helper stopped"),
        }
        return None;
    }
    let reason = match failure {
        Some(why) => format!("{name}: {why}"),
        None => format!(
            "{name} stopped on its own; the subsystem is not doing its job until gpud restarts"
        ),
    };
    error!(helper = %name, reason = %reason, "Helper task stopped; /readyz reports the subsystem failed, the rest keeps serving");
    Some(reason)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn helpers(board: &Readiness, stop: &CancellationToken) -> Helpers {
        let slot = board.register("dra");
        board.mark(slot, State::Ready);
        Helpers::new(board.clone(), slot, stop.clone())
    }

    #[tokio::test]
    async fn a_helper_that_fails_marks_its_subsystem_failed_with_the_reason() {
        let board = Readiness::default();
        let stop = CancellationToken::new();
        let helpers = helpers(&board, &stop);
        helpers
            .spawn("gRPC server for the DRA plugin", async {
                Err::<(), _>(anyhow::anyhow!("accept failed: too many open files"))
            })
            .await
            .unwrap();
        assert_eq!(
            board.report(),
            (
                false,
                "not ready\ndra failed: gRPC server for the DRA plugin: accept failed: too \
                 many open files\n"
                    .to_owned()
            )
        );
        // Final: the subsystem's later marks do not hide it.
        board.mark(0, State::Ready);
        assert!(!board.all_ready());
    }

    #[tokio::test]
    async fn an_early_ok_end_or_a_panic_is_a_failure_too() {
        let board = Readiness::default();
        let stop = CancellationToken::new();
        helpers(&board, &stop)
            .spawn("slice watch", async {})
            .await
            .unwrap();
        assert_eq!(
            board.states()[0].1,
            State::Failed(
                "slice watch stopped on its own; the subsystem is not doing its job until \
                 gpud restarts"
                    .into()
            )
        );
        let board = Readiness::default();
        helpers(&board, &stop)
            .spawn("renderer", async {
                if std::hint::black_box(true) {
                    panic!("a bug in the renderer");
                }
            })
            .await
            .unwrap();
        assert!(
            matches!(&board.states()[0].1, State::Failed(why) if why.starts_with("renderer: panicked")),
            "{:?}",
            board.states()
        );
    }

    #[tokio::test]
    async fn a_daemon_helper_is_on_the_board_only_once_it_stopped() {
        let board = Readiness::default();
        let slot = board.register("health");
        board.mark(slot, State::Ready);
        let stop = CancellationToken::new();
        let (end, ended) = tokio::sync::oneshot::channel::<()>();
        let serving = spawn_unowned(
            &board,
            "handover",
            stop.clone(),
            "handover socket server",
            async move {
                let _ = ended.await;
            },
        );
        tokio::task::yield_now().await;
        assert_eq!(board.report(), (true, "ready\nhealth ready\n".to_owned()));
        end.send(()).unwrap();
        tokio::time::timeout(Duration::from_secs(5), serving)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            board.report(),
            (
                false,
                "not ready\nhealth ready\nhandover failed: handover socket server stopped on \
                 its own; the subsystem is not doing its job until gpud restarts\n"
                    .to_owned()
            )
        );
        // After the stop signal its end is expected: nothing is added.
        let board = Readiness::default();
        stop.cancel();
        spawn_unowned(&board, "handover", stop, "handover socket server", async {})
            .await
            .unwrap();
        assert!(board.states().is_empty());
    }

    #[tokio::test]
    async fn an_end_after_the_stop_signal_is_expected() {
        let board = Readiness::default();
        let daemon = CancellationToken::new();
        let helpers = helpers(&board, &daemon);
        let plugin = daemon.child_token();
        let served = helpers.until(plugin.clone()).spawn("gRPC server", {
            let plugin = plugin.clone();
            async move {
                plugin.cancelled().await;
                Err::<(), _>("connection reset while stopping")
            }
        });
        plugin.cancel();
        tokio::time::timeout(Duration::from_secs(5), served)
            .await
            .unwrap()
            .unwrap();
        assert!(board.all_ready(), "{:?}", board.states());
    }
}
