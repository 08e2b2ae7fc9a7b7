//! The labeller: GFD's node labels (plus gpud's health summary), kept current from the
//! inventory and written to an NFD features file, stdout, the Node object, or NFD's
//! NodeFeature object.
//!
//! - [`labels`] is the pure core: snapshot + settings → labels.
//! - [`run`] is the loop: it recomputes whenever the inventory publishes a change (the
//!   daemon's one rescanner re-reads the node), every `sleepInterval`, and when new settings
//!   arrive (SIGHUP); [`service`] runs it as a daemon subsystem. The features file is rewritten when a label other than the timestamp
//!   changed or the interval passed; an API sink writes when what it holds differs.
//! - [`features_file`], [`node`] and [`node_feature`] are the sinks; the last two go through
//!   the Kubernetes API through [`crate::kube`] (connection, errors, the Node client). [`pci`] reads the
//!   PCI facts NVML lacks (class, configuration space) and [`vgpu`] finds a vGPU in the
//!   configuration space.
//!
//! Writing failures are logged and retried (an API sink with backoff); only `--oneshot`
//! turns them into an error, since it has no later pass to recover in.

pub mod args;
pub mod features_file;
pub mod labels;
pub mod node;
pub mod node_feature;
pub mod pci;
pub mod service;
pub mod sink;
pub mod syntax;
pub mod vgpu;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

pub use labels::{LabelConfig, Labels, labels, warnings};
pub use node::NodeSink;
pub use node_feature::NodeFeatureSink;
pub use sink::ApiSink;

use crate::backoff::{self, Backoff};
use crate::daemon::ReadyLatch;
use crate::inventory::{Inventory, Snapshot};
use crate::kube::ApiError;
use crate::nvidia_config::{self, MigStrategy, OutputTarget, Sharing, SleepInterval};

/// The labeller's settings: GFD's (from NVIDIA's config) and gpud's own.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// `flags.migStrategy`.
    pub mig_strategy: MigStrategy,
    /// `sharing`.
    pub sharing: Sharing,
    /// `flags.gfd.noTimestamp`.
    pub no_timestamp: bool,
    /// `flags.gfd.oneshot`.
    pub oneshot: bool,
    /// `flags.gfd.sleepInterval`.
    pub sleep_interval: SleepInterval,
    /// `flags.gfd.outputFile`; `None` when the file sink is off (an API sink only).
    pub output: Option<OutputTarget>,
    /// `flags.gfd.machineTypeFile`; `None` means machine type `unknown`.
    pub machine_type_file: Option<PathBuf>,
    /// Where sysfs is mounted (for PCI classes).
    pub sysfs_root: PathBuf,
    /// Whether to add gpud's health-summary labels.
    pub health_labels: bool,
}

impl Settings {
    /// The labeller's part of a resolved NVIDIA config.
    pub fn from_config(
        config: &nvidia_config::Config,
        file_sink: bool,
        sysfs_root: PathBuf,
        health_labels: bool,
    ) -> Self {
        let gfd = &config.flags.gfd;
        Settings {
            mig_strategy: config.flags.mig_strategy,
            sharing: config.sharing.clone(),
            no_timestamp: gfd.no_timestamp,
            oneshot: gfd.oneshot,
            sleep_interval: gfd.sleep_interval,
            output: file_sink.then(|| gfd.output.clone()),
            machine_type_file: gfd.machine_type_file.clone(),
            sysfs_root,
            health_labels,
        }
    }
}

/// Failures that end the labeller.
#[derive(Debug, thiserror::Error)]
pub enum LabellerError {
    /// The features file cannot be written.
    #[error("cannot write the features file: {0}")]
    Write(#[source] crate::files::WriteError),
    /// The features file's folder is missing: usually no node-feature-discovery on this host.
    #[error(
        "cannot write {}: the folder {} does not exist (is node-feature-discovery installed on \
         this host?); print the labels with -o -, write them elsewhere with -o PATH, or label \
         the Node through the API with --sink node",
        .path.display(),
        .dir.display()
    )]
    NoFolder { path: PathBuf, dir: PathBuf },
    /// Stdout is closed or failing.
    #[error("cannot write the labels to stdout: {0}")]
    Stdout(#[source] std::io::Error),
    /// An API sink could not be written (after retries, in oneshot mode).
    #[error(transparent)]
    Api(#[from] ApiError),
}

/// The field manager of the labeller's writes.
pub const FIELD_MANAGER: &str = "gpud-labeller";

/// Attempts at the API in oneshot mode before giving up.
pub const ONESHOT_API_ATTEMPTS: u32 = 5;
/// Longest a single API sync may take before it counts as failed.
pub const API_SYNC_TIMEOUT: Duration = Duration::from_secs(20);

/// Builds the label settings for one pass: reads the machine-type file, the PCI classes and
/// the NVIDIA functions' configuration spaces (host facts NVML does not give). A node without
/// GPUs gets no GPU labels, so its PCI devices are not read.
pub fn label_config(settings: &Settings, snapshot: &Snapshot, timestamp: u64) -> LabelConfig {
    LabelConfig {
        mig_strategy: settings.mig_strategy,
        sharing: settings.sharing.clone(),
        timestamp: (!settings.no_timestamp).then_some(timestamp),
        machine_type: settings
            .machine_type_file
            .as_deref()
            .and_then(read_machine_type),
        pci_classes: pci::read_classes(&settings.sysfs_root, snapshot),
        vgpu: if snapshot.gpus.is_empty() {
            vgpu::Vgpu::Absent
        } else {
            match pci::nvidia_functions(&settings.sysfs_root) {
                Ok(functions) => vgpu::detect(&functions),
                Err(err) => vgpu::Vgpu::Unknown(err.to_string()),
            }
        },
        health_labels: settings.health_labels,
    }
}

fn read_machine_type(path: &Path) -> Option<String> {
    match crate::files::read_text(path) {
        Ok(text) => Some(text.trim().to_owned()),
        Err(err) => {
            tracing::debug!(path = %path.display(), error = %crate::logging::error_chain(&err), "Machine type unreadable; using unknown");
            None
        }
    }
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// How long labels the API sink found or wrote on the object count as still there: within
/// it, a pass with the same labels reads nothing. Each read is a GET of the Node (or the
/// NodeFeature and the pod); every `sleepInterval` (60 s) on every node of a large cluster
/// would be most of what gpud asks the API server while nothing changes. A label someone
/// removed is put back within this long.
pub const API_RECHECK: Duration = Duration::from_secs(300);

/// Pending work for the API sink: the labels still to write, and when to try next.
#[derive(Debug)]
struct ApiState {
    sink: ApiSink,
    pending: Option<Labels>,
    retry_at: Option<Instant>,
    backoff: Backoff,
    /// The labels last found on (or written to) the object, and when to check them again:
    /// [`API_RECHECK`] after that was checked (or the check found the API server
    /// unreachable: it waits for its next turn), a little less at random.
    confirmed: Option<(Labels, Instant)>,
}

impl ApiState {
    fn new(sink: ApiSink, timestamp: u64) -> Self {
        let seed = sink.seed();
        ApiState {
            sink,
            pending: None,
            retry_at: None,
            backoff: Backoff::new(seed ^ timestamp),
            confirmed: None,
        }
    }

    /// Asks for `labels` on the object at `now`: nothing to do when they are the ones
    /// confirmed there within [`API_RECHECK`].
    fn want(&mut self, labels: &Labels, now: Instant) {
        let fresh = self
            .confirmed
            .as_ref()
            .is_some_and(|(held, recheck_at)| held == labels && now < *recheck_at);
        if fresh && self.pending.is_none() {
            return;
        }
        self.pending = Some(labels.clone());
        self.retry_at = Some(now);
    }

    /// Tries to write the pending labels once; schedules a retry on failure.
    async fn push(&mut self) -> Result<(), ApiError> {
        let Some(wanted) = self.pending.clone() else {
            return Ok(());
        };
        let target = self.sink.target();
        let mut result =
            crate::kube::within(API_SYNC_TIMEOUT, || target.clone(), self.sink.sync(&wanted)).await;
        // Someone wrote the object between gpud's read and its write (409): every sync reads
        // it first, so trying again at once writes over what is there now. Once: a second
        // conflict in a row backs off like any other failure.
        if let Err(err) = &result
            && err.status() == Some(409)
        {
            info!(error = %crate::logging::error_chain(err), "The {target} changed while gpud wrote its labels; reading it again");
            result =
                crate::kube::within(API_SYNC_TIMEOUT, || target.clone(), self.sink.sync(&wanted))
                    .await;
        }
        match result {
            Ok(written) => {
                if written {
                    info!(sink = %self.sink.target(), labels = wanted.len(), "Labels written");
                }
                self.pending = None;
                self.retry_at = None;
                self.backoff.reset();
                self.confirmed = Some((wanted, Instant::now() + backoff::period(API_RECHECK)));
                Ok(())
            }
            // A recheck of labels already confirmed that cannot reach the API server waits
            // for its next turn, as a kubelet's status report does: retried, it would come
            // back with every other node whose recheck fell in the same outage.
            Err(err)
                if crate::kube::pace::unreachable()
                    && self
                        .confirmed
                        .as_ref()
                        .is_some_and(|(held, _)| *held == wanted) =>
            {
                info!(error = %crate::logging::error_chain(&err), after = ?API_RECHECK, "Cannot check the labels on {}; checking again on the next turn", self.sink.target());
                self.pending = None;
                self.retry_at = None;
                self.confirmed = Some((wanted, Instant::now() + backoff::period(API_RECHECK)));
                Err(err)
            }
            Err(err) => {
                let delay = err.paced(self.backoff.next_delay());
                warn!(error = %crate::logging::error_chain(&err), retry_in = ?delay, "Cannot write the labels to {}; retrying", self.sink.target());
                self.retry_at = Some(Instant::now() + delay);
                Err(err)
            }
        }
    }
}

/// Writes labels to the file sink (or stdout).
fn write_output(target: &OutputTarget, labels: &Labels) -> Result<(), LabellerError> {
    let text = features_file::render(labels);
    match target {
        OutputTarget::Stdout => {
            use std::io::Write;
            let mut out = std::io::stdout().lock();
            out.write_all(text.as_bytes())
                .and_then(|()| out.flush())
                .map_err(LabellerError::Stdout)
        }
        OutputTarget::File(path) => {
            features_file::write_atomic(path, text.as_bytes()).map_err(|source| {
                match path.parent().filter(|dir| !dir.as_os_str().is_empty()) {
                    Some(dir) if !dir.exists() => LabellerError::NoFolder {
                        path: path.clone(),
                        dir: dir.to_path_buf(),
                    },
                    _ => LabellerError::Write(source),
                }
            })
        }
    }
}

/// GFD removes its features file on a clean exit of a looping labeller, so NFD drops the
/// labels of a node that no longer runs it; a oneshot or infinite-sleep labeller leaves it.
fn removes_on_exit(settings: &Settings) -> Option<&Path> {
    match (&settings.output, settings.oneshot, settings.sleep_interval) {
        (Some(OutputTarget::File(path)), false, SleepInterval::Every(_)) => Some(path),
        _ => None,
    }
}

/// Runs until `cancel` fires (or after one pass with `oneshot`).
///
/// On a node where NVML is unavailable and `failOnInitError` is false, `inventory` holds
/// an empty [`Snapshot`] (no GPUs: only the timestamp label, as GFD does). New settings arriving on `settings` replace the current ones and restart
/// the timestamp, as GFD's SIGHUP restart does. `ready` is set once the labels reached every
/// sink. On the way out the features file is removed, unless `handed_over()` says a new gpud
/// writes it now. Every change on `abandoned` (a new gpud went away mid-takeover, maybe after
/// writing its own labels) writes the labels again at once.
pub async fn run(
    cancel: CancellationToken,
    inventory: Inventory,
    mut settings_rx: watch::Receiver<Arc<Settings>>,
    api_sink: Option<ApiSink>,
    ready: ReadyLatch,
    handed_over: &(dyn Fn() -> bool + Send + Sync),
    mut abandoned: watch::Receiver<u64>,
) -> Result<(), LabellerError> {
    let mut settings = settings_rx.borrow_and_update().clone();
    let mut updates = inventory.subscribe();
    let mut timestamp = unix_now();
    let mut written: Option<Labels> = None;
    let mut logged_warnings: Vec<String> = Vec::new();
    let mut api = api_sink.map(|sink| ApiState::new(sink, timestamp));
    let mut force = true;
    let mut file_written = false;
    let mut settings_open = true;
    let mut abandoned_open = true;
    let mut next_tick = next_pass(settings.sleep_interval);

    loop {
        let snapshot = updates.borrow_and_update().clone();
        let config = label_config(&settings, &snapshot, timestamp);
        let current = labels(&snapshot, &config);
        let found = warnings(&snapshot, &config);
        if found != logged_warnings {
            for warning in &found {
                warn!("{warning}");
            }
            logged_warnings = found;
        }
        if current.len() <= 1 && force {
            warn!("No labels generated from any source");
        }
        let core = labels::without_timestamp(&current);
        if force || written.as_ref() != Some(&core) {
            if let Some(target) = &settings.output {
                match write_output(target, &current) {
                    Ok(()) => {
                        file_written = true;
                        tracing::debug!(labels = current.len(), "Labels written");
                    }
                    Err(err) if settings.oneshot => return Err(err),
                    Err(err @ LabellerError::Stdout(_)) => return Err(err),
                    Err(err) => {
                        error!(error = %crate::logging::error_chain(&err), "Cannot write the features file; retrying on the next pass")
                    }
                }
            } else {
                file_written = true;
            }
            if let Some(api) = &mut api {
                api.want(&current, Instant::now());
            }
            written = Some(core);
        }
        force = false;
        if settings.oneshot {
            if let Some(api) = &mut api {
                return oneshot_api(api, &cancel).await;
            }
            return Ok(());
        }
        if let Some(api) = &mut api
            && api.retry_at.is_some_and(|at| at <= Instant::now())
        {
            let _ = api.push().await;
        }
        if file_written && api.as_ref().is_none_or(|api| api.pending.is_none()) {
            ready.set();
        }

        let retry_at = api.as_ref().and_then(|a| a.retry_at);
        tokio::select! {
            () = cancel.cancelled() => break,
            changed = updates.changed() => if changed.is_err() { break },
            () = sleep_until(next_tick), if next_tick.is_some() => {
                force = true;
                next_tick = next_pass(settings.sleep_interval);
            }
            () = sleep_until(retry_at), if retry_at.is_some() => {
                if let Some(api) = &mut api {
                    let _ = api.push().await;
                }
            }
            changed = abandoned.changed(), if abandoned_open => {
                if changed.is_err() {
                    abandoned_open = false;
                    continue;
                }
                debug!("A takeover was abandoned; labelling again now");
                force = true;
                // The newcomer may have written the object: read it again, not trusting what
                // this process confirmed there before.
                if let Some(api) = &mut api {
                    api.confirmed = None;
                }
            }
            changed = settings_rx.changed(), if settings_open => {
                if changed.is_err() {
                    // Nobody can send new settings any more: keep running with these.
                    settings_open = false;
                    continue;
                }
                let new = settings_rx.borrow_and_update().clone();
                if new != settings {
                    if let Some(old) = removes_on_exit(&settings)
                        && removes_on_exit(&new) != Some(old)
                    {
                        let _ = features_file::remove(old);
                    }
                    debug!("Settings changed; relabelling now");
                }
                settings = new;
                timestamp = unix_now();
                force = true;
                next_tick = next_pass(settings.sleep_interval);
            }
        }
    }
    if let Some(path) = removes_on_exit(&settings).filter(|_| !handed_over())
        && let Err(err) = features_file::remove(path)
    {
        warn!(path = %path.display(), error = %crate::logging::error_chain(&err), "Cannot remove the features file");
    }
    Ok(())
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// When the next periodic pass is due: `sleepInterval` from now, a little less at random so a
/// fleet's passes (and their API rechecks) do not stay in step; never, without an interval.
fn next_pass(interval: SleepInterval) -> Option<Instant> {
    interval
        .period()
        .map(|period| Instant::now() + backoff::period(period))
}

/// Oneshot with an API sink: a bounded number of attempts with backoff.
async fn oneshot_api(api: &mut ApiState, cancel: &CancellationToken) -> Result<(), LabellerError> {
    let mut last = None;
    for _ in 0..ONESHOT_API_ATTEMPTS {
        match api.push().await {
            Ok(()) => return Ok(()),
            Err(err) => last = Some(err),
        }
        let wait = api
            .retry_at
            .map(|at| at.saturating_duration_since(Instant::now()));
        tokio::select! {
            () = cancel.cancelled() => break,
            () = tokio::time::sleep(wait.unwrap_or_default()) => {}
        }
    }
    match last {
        Some(err) => Err(err.into()),
        None => Ok(()),
    }
}
