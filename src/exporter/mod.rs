//! The exporter: dcgm-exporter's metrics, names, units and labels, served from a body rendered
//! off the scrape path.
//!
//! # Design
//!
//! Three producers and one renderer:
//!
//! * the sampling thread ([`sampler`]) reads NVML every collect interval;
//! * the pod-resources poller ([`podresources`]) asks the kubelet who uses which GPU on its
//!   own interval;
//! * the health watcher (run by the applet) publishes health through the inventory and counts
//!   every XID in the shared [`XidLedger`], waking the renderer once per batch.
//!
//! The renderer task wakes on any of them, renders the whole exposition body once
//! ([`render`]) and publishes it; gpud's bounded HTTP server ([`crate::http`]) serves the routes
//! of [`server`], which hand out the last body. A scrape therefore never waits on the driver or
//! the kubelet, and costs the same whatever the node size. Field mapping, counters-file parsing, pod attribution and rendering are pure modules;
//! the sampler, poller and server are thin shells around them.

pub mod args;
pub mod counters;
pub mod fields;
pub mod podresources;
pub mod pods;
pub mod render;
pub mod sampler;
pub mod server;
pub mod service;
pub mod usage;
pub mod xids;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use axum::body::Bytes;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::info;

use crate::daemon::{Helpers, ReadyLatch};
use crate::http::{self, ListenError};
use crate::inventory::Inventory;
use crate::nvml::{Nvml, NvmlError};
use crate::pod_directory::PodDirectory;
use crate::xid::ledger::XidLedger;
use fields::Selection;
use podresources::{PodResourcesConfig, PodsState};
use render::{Frame, LabelOptions, OwnStats};
use sampler::Sampled;
use server::{Published, Shared};

/// dcgm-exporter's default listen address.
pub const DEFAULT_ADDRESS: &str = ":9400";
/// dcgm-exporter's default collect interval.
pub const DEFAULT_COLLECT_INTERVAL: Duration = Duration::from_millis(30_000);
/// The shortest collect interval accepted: the interval is in milliseconds, and a value
/// meant as seconds (`3`) would otherwise sample NVML 333 times a second.
pub const MIN_COLLECT_INTERVAL: Duration = Duration::from_millis(100);

/// Settings of one exporter.
#[derive(Debug, Clone)]
pub struct ExporterConfig {
    /// `[host]:port` to listen on.
    pub address: String,
    /// What to collect.
    pub selection: Selection,
    /// Time between two NVML samples.
    pub collect_interval: Duration,
    /// How labels are spelled.
    pub labels: LabelOptions,
    /// Pod attribution, when enabled.
    pub kubernetes: Option<PodResourcesConfig>,
    /// Window of `DCGM_EXP_XID_ERRORS_COUNT`.
    pub xid_window: Duration,
    /// Bounds on the HTTP connections.
    pub http: http::Limits,
    /// The MIG reconciler's counters, when it runs in the same process (`gpud run`).
    pub mig: Option<crate::mig_state::metrics::Metrics>,
    /// The remediation's counters, when it runs in the same process (`gpud run`).
    pub remediation: Option<crate::remediation_state::metrics::Metrics>,
    /// The remediation record of this node (`<state-dir>/remediation.json`): without the
    /// remediation in this process, its counters are read from there (a DaemonSet runs it in
    /// the node-status container) once the file exists.
    pub remediation_record: Option<std::path::PathBuf>,
    /// Per-pod usage from per-process data, when enabled.
    pub usage: Option<usage::UsageConfig>,
}

/// What stops the exporter from starting.
#[derive(Debug, thiserror::Error)]
pub enum ExporterError {
    /// The listen address is invalid or cannot be bound.
    #[error(transparent)]
    Listen(#[from] ListenError),
    /// The sampling thread could not start.
    #[error(transparent)]
    Nvml(#[from] NvmlError),
    /// The HTTP server stopped with an error.
    #[error("metrics server failed: {0}")]
    Serve(#[source] std::io::Error),
    /// No client for the API server (per-pod usage names pods through it).
    #[error(transparent)]
    Api(#[from] crate::kube::ApiError),
}

/// Runs the exporter until `cancel` fires. `xids` is the ledger the health watcher counts XIDs
/// in (none when it does not run); build it with `XidLedger::new(config.xid_window)`, as its
/// window is the one `DCGM_EXP_XID_ERRORS_COUNT` reports. `admin` is served on the same port
/// for the paths the exporter does not have (the daemon's probes; an empty router adds
/// nothing); `ready` is set when the first body is published, and unset while the last
/// sample is older than [`STALE_INTERVALS`] collect intervals (a hung NVML call). Fails only on setup
/// (listen address, threads) or if the server itself fails; the renderer and the pod-resources
/// poller run as `helpers`, so one that stops marks the exporter failed on `/readyz` (its
/// metrics would go stale) while `/metrics` keeps answering.
#[allow(clippy::too_many_arguments)]
pub async fn run(
    cancel: CancellationToken,
    helpers: Helpers,
    nvml: Nvml,
    inventory: Inventory,
    config: ExporterConfig,
    xids: Option<XidLedger>,
    admin: axum::Router,
    ready: ReadyLatch,
) -> Result<(), ExporterError> {
    let listener = http::bind(&config.address).await?;
    if let Ok(local) = listener.local_addr() {
        info!(address = %local, interval = ?config.collect_interval, "Serving metrics");
    }
    let (sample_tx, sample_rx) = watch::channel(None);
    let mut plan = config.selection.plan.clone();
    plan.processes = config.usage.is_some();
    let owners = config
        .usage
        .as_ref()
        .map(|u| usage::owners::ProcessOwners::new(u.proc_root.clone()));
    let _sampler = sampler::start(
        nvml,
        inventory.clone(),
        plan,
        config.collect_interval,
        owners,
        sample_tx,
    )?;
    let (directory_tx, directory_rx) = watch::channel(Arc::new(PodDirectory::default()));
    // What keeps the pod directory from the API server, if anything (none for the runtime's).
    let (trouble_tx, trouble_rx) = watch::channel(None);
    let directory = match config.usage.as_ref().map(|u| &u.names) {
        Some(usage::PodNames::Api { node, kubeconfig }) => {
            let client = crate::kube::connect(kubeconfig.as_deref())
                .await
                .map_err(ExporterError::Api)?;
            Some(helpers.spawn(
                "pod directory",
                crate::kube::pods::follow(
                    client,
                    node.clone(),
                    directory_tx,
                    trouble_tx,
                    cancel.clone(),
                ),
            ))
        }
        Some(usage::PodNames::Runtime { socket, interval }) => Some(helpers.spawn(
            "pod directory",
            crate::cri::follow::follow(
                crate::cri::client::RuntimeClient::new(socket.clone()),
                *interval,
                directory_tx,
                cancel.clone(),
            ),
        )),
        None => None,
    };
    let (pods_tx, pods_rx) = watch::channel(Arc::new(PodsState::default()));
    let poller = config.kubernetes.clone().map(|k8s| {
        helpers.spawn(
            "pod-resources poller",
            podresources::run(cancel.clone(), k8s, inventory.clone(), pods_tx),
        )
    });
    let shared: Shared = Arc::new(watch::Sender::new(Published::default()));
    let http_stats = Arc::new(http::Stats::default());
    let renderer = helpers.spawn(
        "renderer",
        render_loop(
            cancel.clone(),
            config.clone(),
            inventory,
            Sources {
                samples: sample_rx,
                pods: pods_rx,
                directory: directory_rx,
                trouble: trouble_rx,
            },
            xids,
            Publisher {
                shared: Arc::clone(&shared),
                http_stats: Arc::clone(&http_stats),
                ready,
                first: true,
                stale: false,
            },
        ),
    );
    let router = server::router(shared, admin);
    let served = http::serve(listener, router, config.http, http_stats, cancel.clone()).await;
    cancel.cancel();
    let _ = renderer.await;
    for helper in [poller, directory].into_iter().flatten() {
        let _ = helper.await;
    }
    served.map_err(ExporterError::Serve)
}

/// What the render loop renders from, besides the inventory and the XID record.
struct Sources {
    samples: watch::Receiver<Option<Arc<Sampled>>>,
    pods: watch::Receiver<Arc<PodsState>>,
    /// This node's pods, for per-pod usage (empty without it).
    directory: watch::Receiver<Arc<PodDirectory>>,
    /// What keeps the pod directory from the API server now, if anything.
    trouble: watch::Receiver<Option<String>>,
}

/// Where the render loop publishes bodies.
struct Publisher {
    shared: Shared,
    /// The HTTP server's counters, rendered into each body.
    http_stats: Arc<http::Stats>,
    /// The exporter's readiness: set after the first body, unset while samples are stale,
    /// and naming (ready still: the metrics flow) what keeps per-pod usage from the pods'
    /// names.
    ready: ReadyLatch,
    /// No body published yet.
    first: bool,
    /// The last body was rendered from a stale sample.
    stale: bool,
}

impl Publisher {
    /// Publishes a body rendered from a sample `age` old, moving readiness with its freshness
    /// and with `trouble`, what keeps per-pod usage from the pods' names.
    fn publish(
        &mut self,
        published: Published,
        age: Duration,
        interval: Duration,
        trouble: Option<&str>,
    ) {
        self.shared.send_replace(published);
        let stale = age > interval * STALE_INTERVALS;
        if stale && (!self.stale || self.first) {
            self.ready.unset(format!(
                "the last NVML sample is {:.1}s old (collect interval {}): an NVML call hangs",
                age.as_secs_f64(),
                humantime::format_duration(interval)
            ));
        } else if !stale {
            // Marking the same state again changes nothing: no need to remember the last.
            self.ready.busy(trouble.map(str::to_owned));
        }
        self.stale = stale;
        self.first = false;
    }
}

/// A sample older than this many collect intervals is stale: the exporter is not ready and
/// re-renders its body every interval so that the age gauge keeps growing.
pub const STALE_INTERVALS: u32 = 3;

/// Renders a new body whenever a sample, the pod attribution, the inventory or the XID record
/// changes.
async fn render_loop(
    cancel: CancellationToken,
    config: ExporterConfig,
    inventory: Inventory,
    sources: Sources,
    xids: Option<XidLedger>,
    mut publisher: Publisher,
) {
    let Sources {
        mut samples,
        mut pods,
        directory,
        mut trouble,
    } = sources;
    // Once the follower that sends it is gone, stop watching it.
    let mut trouble_live = true;
    let mut snapshots = inventory.subscribe();
    let ledger = xids.unwrap_or_else(|| XidLedger::new(config.xid_window));
    let mut xid_changes = ledger.subscribe();
    let mut capacity = 16 * 1024;
    let mut record = config
        .remediation_record
        .clone()
        .filter(|_| config.remediation.is_none())
        .map(crate::remediation_state::record::Follower::new);
    let mut recorded = None;
    // Without pod attribution the pods channel's sender is gone at once; stop watching it.
    let mut pods_live = true;
    // A sampler stuck in NVML sends nothing: this tick notices, and re-renders.
    let mut freshness = tokio::time::interval(config.collect_interval);
    freshness.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = cancel.cancelled() => return,
            changed = samples.changed() => if changed.is_err() { return },
            changed = pods.changed(), if pods_live => if changed.is_err() { pods_live = false },
            changed = trouble.changed(), if trouble_live => if changed.is_err() { trouble_live = false },
            changed = snapshots.changed() => if changed.is_err() { return },
            changed = xid_changes.changed() => if changed.is_err() { return },
            _ = freshness.tick() => {
                let stale = samples
                    .borrow()
                    .as_ref()
                    .is_some_and(|s| s.at.elapsed() > config.collect_interval * STALE_INTERVALS);
                if !stale {
                    continue;
                }
            }
        }
        let sample = samples.borrow_and_update().clone();
        let Some(sample) = sample else {
            continue; // nothing to serve before the first sample
        };
        let age = sample.at.elapsed();
        let now = SystemTime::now();
        let pods_state = pods.borrow_and_update().clone();
        let snapshot = snapshots.borrow_and_update().clone();
        xid_changes.borrow_and_update();
        // A rescan may have removed GPU instances: their XID totals go with their series.
        let xids = ledger.view(now, |gpu, gi| {
            snapshot
                .gpu(gpu)
                .is_some_and(|g| g.mig.devices.iter().any(|m| m.gpu_instance_id == gi))
        });
        let own = OwnStats {
            samples: sample.cycles,
            last_sample_seconds: sample.duration.as_secs_f64(),
            last_sample_age_seconds: age.as_secs_f64(),
            pod_resources_up: config.kubernetes.as_ref().map(|_| pods_state.up),
            http: Some(publisher.http_stats.snapshot()),
            mig: config.mig.as_ref().map(|m| m.read()),
            kept_verdicts_damaged: crate::inventory::health::kept_verdicts_damaged(),
            remediation: match &config.remediation {
                Some(metrics) => Some(metrics.read()),
                None => {
                    // Read when the file changed (a stat otherwise), never on a scrape.
                    if let Some(view) = record.as_mut().and_then(|r| r.changed()) {
                        recorded = Some(view.counters.unwrap_or_default());
                    }
                    recorded.clone()
                }
            },
        };
        let frame = Frame {
            selection: &config.selection,
            labels: &config.labels,
            snapshot: &snapshot,
            telemetry: Some(&sample.telemetry),
            nvlink_rates: &sample.nvlink_rates,
            pods: &pods_state.attribution,
            xids: &xids,
            now,
            own: &own,
        };
        let mut body = String::with_capacity(capacity);
        render::render(&frame, &mut body);
        if config.usage.is_some() {
            let directory = directory.borrow().clone();
            let totals = usage::totals(&snapshot, &sample.telemetry, &sample.owners, &directory);
            usage::render(&frame, &totals, &mut body);
        }
        capacity = body.len() + body.len() / 8;
        let published = Published {
            body: Arc::new(http::mirror::Mirrored::new(Bytes::from(body))),
            ready: true,
            nvml_up: sample.telemetry.nvml_up,
        };
        let trouble = trouble.borrow_and_update().clone();
        publisher.publish(published, age, config.collect_interval, trouble.as_deref());
    }
}
