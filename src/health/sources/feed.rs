//! What every health source shares: the bounded queue to the watcher ([`Feed`]), what goes on
//! it ([`Report`]), how a source is started ([`Row`], [`Setup`], [`Started`]) and how its end
//! is reported, so that a source that stops is never only a log line.
//!
//! The queue makes a source wait rather than drop when it is full (the NVML driver and the
//! kernel keep their own queues meanwhile): every XID is counted. A source runs until the
//! watcher stops it; one that ends before — a read error, a panic, or returning on its own —
//! reports [`Report::Ended`], which the watcher turns into a failed readiness naming the
//! source and the reason.

use std::future::Future;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Notify, mpsc};
use tokio_util::sync::CancellationToken;

use super::observer::{GpuMap, Observer};
use crate::nvml::{Nvml, NvmlError};

/// One thing a source saw, taken into the tracker by the watcher's task.
pub trait Observation: Send {
    /// Takes it into `observer` (the tracker, the de-duplicator and the XID ledger), against
    /// the GPUs of this batch.
    fn observe(self: Box<Self>, observer: &mut Observer, gpus: &GpuMap);

    /// Whether the signals are polled again right after it is published: the driver says
    /// what a fault needs (the recovery action) right after it, so a reset that follows
    /// within one poll interval is seen. The poll's own results do not ask for another.
    fn polls_after(&self) -> bool {
        true
    }
}

/// What travels on the queue.
pub enum Report {
    /// Something seen.
    Seen(Box<dyn Observation>),
    /// The source `source` stopped before the watcher stopped it, for `reason`.
    Ended {
        source: &'static str,
        reason: String,
    },
}

/// The sending end of the watcher's queue, one clone per source.
pub type Feed = mpsc::Sender<Report>;

/// What a source may need to start.
#[derive(Debug)]
pub struct Setup<'a> {
    pub nvml: &'a Nvml,
    /// The kernel log to follow; `None`: not followed.
    pub kmsg_path: Option<&'a Path>,
    pub poll_interval: Duration,
    /// Notified after a batch whose observations ask for a poll ([`Observation::polls_after`]).
    pub poll_soon: Arc<Notify>,
    /// Cancelled when the watcher stops: every source ends then, and its end is expected.
    pub stop: CancellationToken,
}

/// How a source started.
pub enum Started {
    /// Running; dropping this stops it.
    Running(Box<dyn Send>),
    /// Off by configuration (`--kmsg ""`).
    Off,
    /// Cannot watch on this node (no permission to read the kernel log): said once, and the
    /// other sources carry on.
    Unmonitored(String),
    /// Cannot watch, and the watcher cannot do without it.
    Fatal(NvmlError),
}

/// One row of the table: a source's name (as logs and `/readyz` say it) and how to start it.
/// Started in table order, before the watcher says it is ready: a source is watching once its
/// `start` returned.
#[derive(Debug, Clone, Copy)]
pub struct Row {
    pub name: &'static str,
    pub start: fn(&Setup<'_>, Feed) -> Started,
}

impl std::fmt::Debug for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Report::Seen(_) => f.write_str("Seen(..)"),
            Report::Ended { source, reason } => f
                .debug_struct("Ended")
                .field("source", source)
                .field("reason", reason)
                .finish(),
        }
    }
}

impl std::fmt::Debug for Started {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Started::Running(_) => f.write_str("Running(..)"),
            Started::Off => f.write_str("Off"),
            Started::Unmonitored(why) => f.debug_tuple("Unmonitored").field(why).finish(),
            Started::Fatal(err) => f.debug_tuple("Fatal").field(err).finish(),
        }
    }
}

/// The reason given for a source that returned without an error before it was stopped.
const RETURNED: &str = "it returned on its own";

/// Reports the end of a source thread when it is dropped (its body returned or panicked),
/// unless the watcher stopped it.
struct EndOnDrop {
    source: &'static str,
    feed: Feed,
    stop: CancellationToken,
    reason: Option<String>,
}

impl Drop for EndOnDrop {
    fn drop(&mut self) {
        if self.stop.is_cancelled() {
            return;
        }
        let reason = self
            .reason
            .take()
            .unwrap_or_else(|| "it panicked".to_owned());
        // The watcher may be gone meanwhile; then nobody needs to know.
        let _ = self.feed.blocking_send(Report::Ended {
            source: self.source,
            reason,
        });
    }
}

/// Runs `body` on the thread `thread` as the source `source`; its end before `stop` fires (an
/// `Err` says why) is reported on `feed`.
pub fn spawn_thread(
    source: &'static str,
    thread: &str,
    feed: Feed,
    stop: CancellationToken,
    body: impl FnOnce(&Feed, &CancellationToken) -> Result<(), String> + Send + 'static,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    crate::logging::spawn_thread(thread, move || {
        let mut end = EndOnDrop {
            source,
            feed: feed.clone(),
            stop: stop.clone(),
            reason: None,
        };
        end.reason = Some(
            body(&feed, &stop)
                .err()
                .unwrap_or_else(|| RETURNED.to_owned()),
        );
    })
}

/// Runs `task` as the source `source`; its end before `stop` fires (an `Err` says why, a
/// panic is one) is reported on `feed`.
pub fn spawn_task<F>(
    source: &'static str,
    feed: Feed,
    stop: CancellationToken,
    task: F,
) -> tokio::task::JoinHandle<()>
where
    F: Future<Output = Result<(), String>> + Send + 'static,
{
    // The task runs on its own so that a panic ends it, not the report below.
    let running = crate::logging::spawn(task);
    crate::logging::spawn(async move {
        let ended = running.await;
        if stop.is_cancelled() {
            return;
        }
        let reason = match ended {
            Ok(Ok(())) => RETURNED.to_owned(),
            Ok(Err(why)) => why,
            Err(join) => format!("it panicked: {join}"),
        };
        let _ = feed.send(Report::Ended { source, reason }).await;
    })
}
