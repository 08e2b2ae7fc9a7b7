//! The kubelet pod-resources client: polls `List` on its own interval and publishes who uses
//! which GPU.
//!
//! dcgm-exporter asks the kubelet on every scrape, which makes scrapes slow and loads the
//! kubelet. Here `List` is called every poll interval, the answer is attributed to devices
//! (`pods::attribute`) and cached; scrapes read the cache. When the socket is missing or the
//! kubelet does not answer, attribution is empty (series carry no pod labels), one line is
//! logged, and the next poll tries again; one more line is logged when it answers again.
//! A claimed DRA device whose name the node does not have is logged once when it first shows
//! up (and again only if it goes away and comes back), however many polls it stays.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tonic::transport::{Channel, Endpoint};
use tracing::{info, warn};

use super::pods::{self, Attribution, ResourceFilter};
use crate::inventory::Inventory;
use crate::proto::podresources::ListPodResourcesRequest;
use crate::proto::podresources::pod_resources_lister_client::PodResourcesListerClient;

/// The kubelet's pod-resources socket, as dcgm-exporter defaults it.
pub const DEFAULT_SOCKET: &str = crate::holdings::pod_resources::DEFAULT_SOCKET;

/// How long one `List` may take before the poll counts as failed.
const LIST_TIMEOUT: Duration = Duration::from_secs(5);
/// How long connecting to the socket may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// Settings of the poller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodResourcesConfig {
    /// The kubelet's pod-resources socket.
    pub socket: PathBuf,
    /// Which resources are GPUs.
    pub resources: ResourceFilter,
    /// Time between two `List` calls.
    pub poll_interval: Duration,
}

/// The cached attribution and whether the last `List` worked.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodsState {
    /// Containers per device.
    pub attribution: Attribution,
    /// Whether the last `List` succeeded.
    pub up: bool,
}

/// Why one poll failed, for the log line.
#[derive(Debug, thiserror::Error)]
enum PollError {
    #[error("cannot connect")]
    Connect(#[from] tonic::transport::Error),
    #[error("List failed: {0}")]
    List(#[from] tonic::Status),
    #[error("List timed out after {0:?}")]
    Timeout(Duration),
}

/// Polls until `cancel` fires, publishing each result.
pub async fn run(
    cancel: CancellationToken,
    config: PodResourcesConfig,
    inventory: Inventory,
    tx: watch::Sender<Arc<PodsState>>,
) {
    let mut ticks = tokio::time::interval(config.poll_interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut client: Option<PodResourcesListerClient<Channel>> = None;
    let mut reported: Option<bool> = None;
    let mut unresolved_logged: BTreeSet<String> = BTreeSet::new();
    loop {
        tokio::select! {
            () = cancel.cancelled() => return,
            _ = ticks.tick() => {}
        }
        let state = match list(&mut client, &config.socket).await {
            Ok(answer) => {
                if reported != Some(true) {
                    info!(
                        socket = %config.socket.display(),
                        "Pod attribution on: the kubelet's pod-resources API answers"
                    );
                    reported = Some(true);
                }
                let attribution = pods::attribute(&answer, &config.resources, &inventory.current());
                log_new_unresolved(&mut unresolved_logged, attribution.unresolved());
                PodsState {
                    attribution,
                    up: true,
                }
            }
            Err(err) => {
                client = None;
                if reported != Some(false) {
                    warn!(
                        socket = %config.socket.display(),
                        error = %crate::logging::error_chain(&err),
                        interval = ?config.poll_interval,
                        "Pod attribution off: the kubelet's pod-resources API does not answer; metrics carry no pod labels, retrying every interval"
                    );
                    reported = Some(false);
                }
                PodsState::default()
            }
        };
        tx.send_if_modified(|current| {
            if **current == state {
                return false;
            }
            *current = Arc::new(state);
            true
        });
    }
}

/// Logs the unresolved DRA device names not logged before, then remembers the current set,
/// so a name is logged once while it stays and the memory is bounded by one answer.
fn log_new_unresolved(logged: &mut BTreeSet<String>, now: &BTreeSet<String>) {
    for name in now.difference(logged) {
        warn!(
            device = %name,
            "A DRA claim holds a device this node does not have (destroyed MIG device, or not named as gpud names devices); its pod is not attributed"
        );
    }
    if logged != now {
        logged.clone_from(now);
    }
}

/// One `List`, connecting first if needed.
async fn list(
    client: &mut Option<PodResourcesListerClient<Channel>>,
    socket: &Path,
) -> Result<crate::proto::podresources::ListPodResourcesResponse, PollError> {
    let client = match client {
        Some(client) => client,
        None => client.insert(PodResourcesListerClient::new(connect(socket).await?)),
    };
    match tokio::time::timeout(LIST_TIMEOUT, client.list(ListPodResourcesRequest {})).await {
        Ok(answer) => Ok(answer?.into_inner()),
        Err(_) => Err(PollError::Timeout(LIST_TIMEOUT)),
    }
}

async fn connect(socket: &Path) -> Result<Channel, PollError> {
    // tonic dials `unix:` endpoints itself; an absolute path reads `unix:///var/lib/…`.
    let uri = format!("unix:{}", socket.display());
    let endpoint = Endpoint::from_shared(uri)?.connect_timeout(CONNECT_TIMEOUT);
    Ok(endpoint.connect().await?)
}
