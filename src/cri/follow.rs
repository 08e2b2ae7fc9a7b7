//! Keeps this node's pod directory current from the container runtime: both lists every
//! interval, off the scrape path, the directory replaced only when it changed. A failed
//! round keeps the last good directory (series stay named as they were), is logged naming the
//! socket once per outage, and is retried on gpud's backoff rather than the interval; one more
//! line is logged when the runtime answers again.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::client::RuntimeClient;
use super::directory::directory;
use crate::backoff::{self, Backoff};
use crate::pod_directory::PodDirectory;

/// Asks `client`'s runtime every `interval` until `cancel` fires, publishing into `out`.
pub async fn follow(
    mut client: RuntimeClient,
    interval: Duration,
    out: watch::Sender<Arc<PodDirectory>>,
    cancel: CancellationToken,
) {
    let socket = client.socket().display().to_string();
    let mut backoff = Backoff::new(backoff::seed_from(&socket));
    // Whether the last round answered; `None` before the first.
    let mut answered: Option<bool> = None;
    loop {
        let result = tokio::select! {
            () = cancel.cancelled() => return,
            result = client.list() => result,
        };
        let pause = match result {
            Ok((sandboxes, containers)) => {
                let listed = directory(&sandboxes, &containers);
                if answered != Some(true) {
                    info!(
                        socket = %socket,
                        pods = listed.len(),
                        "Naming containers from the container runtime's CRI socket"
                    );
                }
                answered = Some(true);
                backoff.reset();
                out.send_if_modified(|current| {
                    if **current == listed {
                        return false;
                    }
                    *current = Arc::new(listed);
                    true
                });
                interval
            }
            Err(err) => {
                let delay = backoff.next_delay();
                let error = crate::logging::error_chain(&err);
                if answered != Some(false) {
                    warn!(
                        socket = %socket,
                        error = %error,
                        retry_in = ?delay,
                        "Cannot list this node's pods from the container runtime; containers stay named from its last answer (none before the first), retrying"
                    );
                } else {
                    debug!(socket = %socket, error = %error, retry_in = ?delay, "The container runtime still does not answer");
                }
                answered = Some(false);
                delay
            }
        };
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(pause) => {}
        }
    }
}
