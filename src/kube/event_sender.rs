//! Node events posted in the background for subsystems whose own loop does not talk to the
//! API server (a restarted MPS daemon, a corrupt DRA checkpoint): each event goes into an
//! [`Outbox`] (de-duplicated, rate-limited, bounded), a helper task sends it, and while the
//! API server refuses or is away it is retried on the jittered backoff, lengthened to a 429's
//! `Retry-After`. One warning per failing streak and one line when events get through again,
//! so a long outage is not a log line per retry.

use std::path::PathBuf;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;
use tracing::{info, warn};

use super::events::{COMPONENT, NodeEvent, Outbox};
use super::{ApiError, NodeClient};
use crate::backoff::{self, Backoff};
use crate::daemon::Helpers;
use crate::logging;

/// The longest pause between two tries.
pub const RETRY_MAX: Duration = Duration::from_secs(60);

/// Queues events for the helper that sends them; clones share the helper.
#[derive(Debug, Clone)]
pub struct EventSender {
    queue: mpsc::UnboundedSender<NodeEvent>,
}

impl EventSender {
    /// Starts the helper `node events` of the calling subsystem; it connects (from
    /// `kubeconfig`, else in-cluster) on its first event and runs while a sender is held.
    pub fn start(helpers: &Helpers, node: String, kubeconfig: Option<PathBuf>) -> EventSender {
        let (queue, events) = mpsc::unbounded_channel();
        helpers.spawn("node events", deliver(events, node, kubeconfig));
        EventSender { queue }
    }

    /// Queues `event`; it is sent as soon as the API server takes it.
    pub fn send(&self, event: NodeEvent) {
        // The helper ends only when every sender is gone or the daemon stops: an event sent
        // while stopping is dropped with it, as the outbox is.
        let _ = self.queue.send(event);
    }
}

/// Moves queued events into the outbox and sends them, oldest first, until every sender is
/// gone; what is still waiting then is dropped (gpud is stopping).
async fn deliver(
    mut events: mpsc::UnboundedReceiver<NodeEvent>,
    node: String,
    kubeconfig: Option<PathBuf>,
) {
    let mut outbox = Outbox::new(Instant::now().into_std());
    let mut backoff = Backoff::capped(backoff::seed_from(&node), RETRY_MAX);
    let mut client: Option<NodeClient> = None;
    let mut retry_at: Option<Instant> = None;
    let mut failing = false;
    loop {
        if !outbox.is_empty() && retry_at.is_none_or(|at| Instant::now() >= at) {
            match send_waiting(&mut client, &mut outbox, &node, kubeconfig.as_ref()).await {
                Ok(()) => {
                    if failing {
                        info!("Node events are recorded again");
                    }
                    failing = false;
                    backoff.reset();
                    retry_at = None;
                }
                Err(err) => {
                    let delay = err.paced(backoff.next_delay());
                    if !failing {
                        warn!(error = %logging::error_chain(&err), retry_in = ?delay, waiting = outbox.len(), "Cannot record an event on the Node; retrying until the API server takes it");
                    }
                    failing = true;
                    retry_at = Some(Instant::now() + delay);
                }
            }
            continue;
        }
        let wake = retry_at.filter(|_| !outbox.is_empty());
        tokio::select! {
            event = events.recv() => match event {
                Some(event) => {
                    outbox.push(event, Instant::now().into_std());
                }
                None => return,
            },
            () = sleep_until(wake) => {}
        }
    }
}

/// Sends what waits in the outbox, connecting first when there is no client yet.
async fn send_waiting(
    client: &mut Option<NodeClient>,
    outbox: &mut Outbox,
    node: &str,
    kubeconfig: Option<&PathBuf>,
) -> Result<(), ApiError> {
    let api =
        NodeClient::in_slot(client, kubeconfig.map(PathBuf::as_path), node, COMPONENT).await?;
    while let Some(event) = outbox.front() {
        api.create_event(event, None).await?;
        outbox.sent();
    }
    Ok(())
}

/// Sleeps until `at`; never wakes without one.
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
