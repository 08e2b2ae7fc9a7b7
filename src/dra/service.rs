//! The `dra` subsystem: gpud as the kubelet's DRA plugin for its driver.
//!
//! The checkpoint is read (and, with dynamic MIG, the MIG devices gpud made for claims no
//! longer in it destroyed and the GPUs to partition on demand chosen: [`super::dynamic_mig`]),
//! the two sockets are served ([`super::sockets`]: the plugin socket,
//! then the registration socket), and the subsystem is ready. Then one loop keeps the node's
//! ResourceSlices right ([`super::publish`]): after every inventory change (a MIG change or
//! lost GPU arrives with the next rescan; health at once), every registration by the kubelet,
//! every watch event on the node's slices (the kubelet's wipe), with backoff after failures
//! and a resync every few minutes.
//!
//! The socket servers, the socket keeper, the slice watch and the MPS probe run as the
//! subsystem's helpers (`daemon::Helpers`): one that stops while gpud runs marks `dra` failed
//! on `/readyz`, naming it. The Warning event about a corrupt checkpoint is a one-off report,
//! not a helper.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use super::api_version::{NewField, ResourceApi, ResourceApiError};
use super::args::DraConfig;
use super::checkpoint::Checkpoint;
use super::dynamic_mig::DynamicMig;
use super::partitions::{self, DynamicGpus};
use super::prepare::Preparer;
use super::publish::Publisher;
use super::readiness::{Cause, DraReadiness};
use super::shares;
use super::sockets::Sockets;
use super::status_writer::{self, StatusWriter};
use super::taint_rules;
use super::topology::{self, Topology};
use crate::backoff::{self, Backoff};
use crate::daemon::{Context, Subsystem};
use crate::grpc;
use crate::holdings::Held;
use crate::inventory::{Inventory, Snapshot};
use crate::kube::events::{Kind, NodeEvent};
use crate::kube::{self, EventSender};
use crate::logging;
use crate::nvml::{Nvml, Rescanner};

/// The reason of the event about a corrupt checkpoint.
pub const CHECKPOINT_CORRUPT: &str = "DRACheckpointCorrupt";

/// How often the slices are compared with the inventory when nothing else happened.
pub const RESYNC: Duration = Duration::from_secs(300);
/// The longest pause between failed publish attempts.
const RETRY_MAX: Duration = Duration::from_secs(30);

/// Why the plugin cannot start.
#[derive(Debug, thiserror::Error)]
pub enum DraError {
    #[error(
        "the kubelet's plugin registration folder {} does not exist (is a kubelet running on \
         this host, and is the folder mounted?); point --dra-registry-dir at it",
        .0.display()
    )]
    NoRegistryDir(std::path::PathBuf),
    #[error("{}: cannot create the plugin folder: {source}", path.display())]
    PluginDir {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot serve the DRA plugin: {0}")]
    Bind(#[from] grpc::BindError),
}

/// The DRA plugin subsystem.
#[derive(Debug)]
pub struct Dra {
    config: Arc<DraConfig>,
    held: watch::Sender<Held>,
    nvml: Nvml,
    /// Reads the node again after a MIG device is made or destroyed (dynamic MIG).
    rescanner: Option<Rescanner>,
}

impl Dra {
    /// A plugin publishing the devices its claims hold on `held` (the device plugin of
    /// `gpud run` listens there); `nvml` sets compute modes for claims' MPS daemons.
    pub fn new(config: DraConfig, held: watch::Sender<Held>, nvml: Nvml) -> Self {
        Dra {
            config: Arc::new(config),
            held,
            nvml,
            rescanner: None,
        }
    }

    /// The plugin with the rescanner its dynamic MIG reads the node again with.
    pub fn with_rescanner(mut self, rescanner: Rescanner) -> Self {
        self.rescanner = Some(rescanner);
        self
    }
}

impl Subsystem for Dra {
    type Settings = ();
    crate::subsystem_name!("dra");

    async fn run(self, ctx: Context<()>, inventory: Inventory) -> anyhow::Result<()> {
        let config = self.config;
        if !config.registry_dir.is_dir() {
            return Err(DraError::NoRegistryDir(config.registry_dir.clone()).into());
        }
        let plugin_dir = config.plugin_dir();
        std::fs::create_dir_all(&plugin_dir).map_err(|source| DraError::PluginDir {
            path: plugin_dir.clone(),
            source,
        })?;
        let (checkpoint, problem) = Checkpoint::load(&config.checkpoint());
        let client = kube::connect(config.kubeconfig.as_deref()).await?;
        // Held while the plugin runs: the event is retried until the API server takes it.
        let _node_events = problem.map(|problem| {
            let message = logging::error_chain(&problem);
            error!(error = %message, "DRA checkpoint unreadable; serving on");
            let events = EventSender::start(
                &ctx.helpers(),
                config.node.clone(),
                config.kubeconfig.clone(),
            );
            events.send(checkpoint_event(message));
            events
        });
        let resources = Arc::new(ResourceApi::new(client.clone()));
        let takeover = !*ctx.predecessor_gone().borrow();
        let dynamic = match (&self.rescanner, config.dynamic_mig) {
            (Some(rescanner), true) => Some(Arc::new(
                DynamicMig::start(
                    config.made_instances(),
                    &self.nvml,
                    rescanner.clone(),
                    inventory.clone(),
                    &checkpoint,
                    takeover,
                    config.layout_dir.clone(),
                )
                .await,
            )),
            _ => None,
        };
        let partitioned = dynamic
            .as_ref()
            .map(|d| d.gpus().clone())
            .unwrap_or_default();
        let held = self.held.subscribe();
        let mut preparer = Preparer::new(
            Arc::clone(&config),
            Some(Arc::clone(&resources)),
            inventory.clone(),
            checkpoint,
            self.held,
            self.nvml,
        );
        if let Some(dynamic) = dynamic {
            preparer = preparer.with_dynamic_mig(dynamic);
        }
        let preparer = Arc::new(preparer);
        ctx.spawn_helper(
            "MPS daemon probe",
            supervise_mps(
                Arc::clone(&preparer),
                config.mps.probe_interval,
                ctx.cancel_token(),
            ),
        );
        let cancel = ctx.cancel_token();
        ctx.spawn_helper(
            "claim device status",
            status_writer::keep(
                Arc::new(StatusWriter::new(Arc::clone(&resources), &config.driver)),
                Arc::clone(&preparer),
                (inventory.clone(), held),
                config.sysfs_root.clone(),
                backoff::seed_from(&config.node),
                cancel.clone(),
            ),
        );
        ctx.spawn_helper(
            "DeviceTaintRule watch",
            taint_rules::follow(
                client.clone(),
                (config.driver.clone(), config.node.clone()),
                (inventory.clone(), config.state_dir.clone()),
                cancel.clone(),
            ),
        );
        let registered = Arc::new(Notify::new());
        let ready = DraReadiness::new(ctx.ready_latch());
        let sockets = Sockets::serve(
            Arc::clone(&config),
            preparer,
            inventory.clone(),
            Arc::clone(&registered),
            ready.clone(),
            cancel.clone(),
            ctx.helpers(),
            ctx.predecessor_gone(),
        )
        .map_err(DraError::Bind)?;
        // Ready before the kubelet registers the plugin: it serves what the kubelet asks. A
        // registration the kubelet refuses unsets it (`super::registration`).
        ctx.set_ready();
        ctx.spawn_helper("socket keeper", sockets.keep());

        let publisher = Publisher::new(resources, &config.driver, &config.node);
        let slice_events = Arc::new(Notify::new());
        // Retries are jittered per node: every node of a cluster watches and publishes through
        // the same API server, and should not come back to it in step after an outage.
        let seed = backoff::seed_from(&config.node);
        ctx.spawn_helper(
            "ResourceSlice watch",
            watch_slices(
                publisher.clone(),
                Arc::clone(&slice_events),
                seed,
                cancel.clone(),
            ),
        );
        publish_loop(
            publisher,
            &config,
            (&partitioned, config.shared_capacity),
            seed,
            &inventory,
            (&registered, &slice_events),
            SliceFailures::new(ready, &config),
            &cancel,
        )
        .await;
        // The sockets' own task removes them too, but the daemon need not wait for it.
        for socket in [config.registration_socket(), config.plugin_socket()] {
            crate::listeners::remove_if_owned(&socket);
        }
        Ok(())
    }
}

/// Probes the prepared claims' MPS daemons every `interval` and starts again one that stopped
/// answering (on the next tick after it died; a failed start is tried on every tick).
async fn supervise_mps(preparer: Arc<Preparer>, interval: Duration, cancel: CancellationToken) {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = cancel.cancelled() => return,
            _ = tick.tick() => preparer.supervise_mps().await,
        }
    }
}

/// A Warning event `DRACheckpointCorrupt` on the Node, so the moved-aside checkpoint shows in
/// `kubectl describe node` and not only in gpud's log.
fn checkpoint_event(message: String) -> NodeEvent {
    NodeEvent {
        kind: Kind::Warning,
        reason: CHECKPOINT_CORRUPT,
        message,
        at: std::time::SystemTime::now(),
    }
}

/// Keeps a watch on the node's slices open, waking `events` on each event; reopens it after
/// a pause when it fails.
///
/// A watch opens only from a version a list or an earlier watch saw: one from "0" would
/// replay every slice, and one opened while the first list is still under way could not
/// resume after a break. Without such a version (at start, after 410 Gone) it waits for the
/// publisher's next list, asking for one unless the start's is already coming.
async fn watch_slices(
    publisher: Publisher,
    events: Arc<Notify>,
    seed: u64,
    cancel: CancellationToken,
) {
    let mut backoff = Backoff::capped(seed, RETRY_MAX);
    let mut lists = publisher.lists();
    let mut listed_before = 0;
    loop {
        if !publisher.resumable() {
            tokio::select! {
                () = cancel.cancelled() => return,
                listed = lists.wait_for(|&lists| lists > listed_before) => if listed.is_err() { return },
            }
        }
        let failed = tokio::select! {
            () = cancel.cancelled() => return,
            result = publisher.watch(&events) => match result {
                Ok(()) => {
                    backoff.reset();
                    false
                }
                Err(err) => {
                    info!(error = %logging::error_chain(&err), "ResourceSlice watch failed; watching again after a pause");
                    true
                }
            },
        };
        // A watch that cannot resume from where it was may have missed events: list again.
        if !publisher.resumable() {
            listed_before = *lists.borrow_and_update();
            events.notify_one();
        }
        if failed {
            tokio::select! {
                () = cancel.cancelled() => return,
                () = tokio::time::sleep(backoff.next_delay()) => {}
            }
        }
    }
}

/// Publishes `devices` with what the API server keeps of the newer fields, again without a
/// field a write showed it drops (fields only ever go, so this ends).
async fn publish(
    publisher: &mut Publisher,
    (snapshot, driver, topology): (&Snapshot, &str, &Topology),
    partitioned: &DynamicGpus,
    shared_capacity: bool,
) -> Result<(), ResourceApiError> {
    loop {
        let served = publisher.served_fields().await?;
        if !partitioned.profiles.is_empty() && !served.has(NewField::Counters) {
            publisher.api().left_out(NewField::Counters);
        }
        // numaNode as a list where the server keeps lists; said once where it does not.
        let lists;
        let topology = if served.has(NewField::ListAttributes) {
            lists = topology.with_numa_lists();
            &lists
        } else {
            if snapshot.gpus.iter().any(|gpu| gpu.numa_node.is_some()) {
                publisher.api().left_out(NewField::ListAttributes);
            }
            topology
        };
        let (mut devices, groups) =
            partitions::layout(snapshot, driver, topology, partitioned, served);
        if shared_capacity {
            if served.has(NewField::SharedCapacity) {
                shares::offer(&mut devices);
            } else {
                publisher.api().left_out(NewField::SharedCapacity);
            }
        }
        publisher.sync(devices, groups, served).await?;
        // A write that showed a field dropped changed what is served: publish again without it.
        if publisher.served_fields().await? == served {
            return Ok(());
        }
    }
}

/// Publishing failures onto the plugin's readiness: from the first failure `/readyz` names
/// the slices and the API server's answer (ready still: a refusal or two is an API server
/// restarting or throttling, and the slices published before still serve the scheduler);
/// once publishing has failed for `--api-unready-after`, the plugin is not ready. A
/// publication clears it.
struct SliceFailures {
    ready: DraReadiness,
    limit: Duration,
    what: String,
    since: Option<tokio::time::Instant>,
}

impl SliceFailures {
    fn new(ready: DraReadiness, config: &DraConfig) -> Self {
        SliceFailures {
            ready,
            limit: config.unready_after,
            what: format!(
                "the ResourceSlices of node {} (driver {})",
                config.node, config.driver
            ),
            since: None,
        }
    }

    fn published(&mut self) {
        self.since = None;
        self.ready.clear(Cause::Slices);
    }

    fn failed(&mut self, error: &str) {
        let now = tokio::time::Instant::now();
        let since = *self.since.get_or_insert(now);
        let failing = now.saturating_duration_since(since);
        if failing >= self.limit {
            self.ready.not_ready(
                Cause::Slices,
                format!(
                    "cannot publish {} for {}: {error}; retrying with backoff",
                    self.what,
                    humantime::format_duration(Duration::from_secs(failing.as_secs()))
                ),
            );
        } else {
            self.ready.degraded(
                Cause::Slices,
                format!(
                    "cannot publish {} now: {error}; retrying with backoff",
                    self.what
                ),
            );
        }
    }
}

#[allow(clippy::too_many_arguments)]
async fn publish_loop(
    mut publisher: Publisher,
    config: &DraConfig,
    (partitioned, shared_capacity): (&DynamicGpus, bool),
    seed: u64,
    inventory: &Inventory,
    (registered, slice_events): (&Notify, &Notify),
    mut failures: SliceFailures,
    cancel: &CancellationToken,
) {
    let (driver, sysfs_root) = (config.driver.as_str(), config.sysfs_root.as_path());
    let mut snapshots = inventory.subscribe();
    let mut backoff = Backoff::capped(seed, RETRY_MAX);
    let mut last_error: Option<String> = None;
    // Whether this publish is the periodic resync: nothing asked for it but the clock.
    let mut resync = false;
    loop {
        let snapshot = snapshots.borrow_and_update().clone();
        // A few symlinks per GPU, read again with each inventory change (a GPU back after a
        // reset may sit elsewhere).
        let topology = topology::read(sysfs_root, &snapshot);
        let (wait, turn) = match publish(
            &mut publisher,
            (&snapshot, driver, &topology),
            partitioned,
            shared_capacity,
        )
        .await
        {
            Ok(_) => {
                if last_error.take().is_some() {
                    warn!("ResourceSlices published again");
                }
                failures.published();
                backoff.reset();
                (crate::backoff::period(RESYNC), true)
            }
            // A resync that cannot reach the API server waits for its next turn: retried, it
            // would come back with every other node whose resync fell in the same outage. A
            // slice changed meanwhile reaches the slice watch when it resumes.
            Err(ResourceApiError::Call(err)) if resync && crate::kube::pace::unreachable() => {
                let text = logging::error_chain(&err);
                info!(error = %text, after = ?RESYNC, "Cannot check the node's ResourceSlices; checking again on the next turn");
                failures.failed(&text);
                (crate::backoff::period(RESYNC), true)
            }
            Err(err) => {
                let text = logging::error_chain(&err);
                failures.failed(&text);
                if last_error.as_deref() != Some(text.as_str()) {
                    warn!(error = %text, "Cannot publish the node's ResourceSlices; retrying with backoff");
                    last_error = Some(text);
                }
                let delay = backoff.next_delay();
                let wait = match &err {
                    ResourceApiError::Call(call) => call.paced(delay),
                    ResourceApiError::NotServed { .. } => delay,
                };
                (wait, false)
            }
        };
        resync = false;
        let retry_at = (!turn).then(|| tokio::time::Instant::now() + wait);
        tokio::select! {
            () = cancel.cancelled() => return,
            changed = snapshots.changed() => if changed.is_err() { return },
            () = registered.notified() => {}
            () = slice_events.notified() => {}
            () = tokio::time::sleep(wait) => resync = turn,
        }
        // A failed publication is not tried again before its pause is over, whatever woke the
        // loop meanwhile (the inventory, the kubelet, a slice event): the retry publishes what
        // they changed, and neither a burst of them nor an API server's Retry-After is
        // answered with a burst of writes.
        if let Some(at) = retry_at {
            tokio::select! {
                () = cancel.cancelled() => return,
                () = tokio::time::sleep_until(at) => {}
            }
        }
    }
}
