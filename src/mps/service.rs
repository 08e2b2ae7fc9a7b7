//! The MPS subsystem: keeps one control daemon per MPS-shared resource running for as long as
//! the configuration asks for MPS, and gives the GPUs back when it stops or stops asking.
//!
//! - Start: the shm tmpfs, then each daemon in resource order; `<root>/.ready` once all are up.
//!   Ready on `/readyz` once every daemon answers its probe.
//! - Supervision: every probe interval each daemon is asked
//!   `get_default_active_thread_percentage`. One that does not answer is marked down (its
//!   `.started` marker goes, so the device plugin shows its devices unhealthy) and started again
//!   after [`BACKOFF_START`], then with gpud's backoff ([`crate::backoff`], per resource)
//!   doubling up to [`BACKOFF_MAX`] while starts fail. A successful restart
//!   is logged and, with an API client configured, recorded as an event on the Node.
//! - Reconfiguration (SIGHUP, a rescan that changed the GPUs): when the daemons the settings
//!   call for differ, the old ones are stopped (`quit`, compute mode DEFAULT) and the new ones
//!   started; a configuration that is invalid for MPS keeps the running daemons.
//! - Stop: every daemon stopped, `.ready` removed — unless a new gpud took over: then the
//!   daemons, their markers and `.ready` are left running for it, and it adopts each daemon
//!   it would start (same resource, same pipe folder) that answers its probe, instead of
//!   starting it again under running clients.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use super::daemon::Daemon;
use super::layout;
use super::plan::{self, DaemonPlan};
use crate::backoff::{self, Backoff};
use crate::cuda_mps::layout as paths;
use crate::daemon::{Context, Subsystem};
use crate::inventory::Inventory;
use crate::kube::EventSender;
use crate::kube::events::{Kind, NodeEvent};
use crate::logging;
use crate::nvml::Nvml;
use crate::resources::settings::Settings;

/// The first pause before restarting a daemon that failed to start again.
pub const BACKOFF_START: Duration = Duration::from_secs(1);
/// The longest pause between restarts (before jitter).
pub const BACKOFF_MAX: Duration = Duration::from_secs(30);
/// The reason of the Node event for a restarted daemon.
pub const RESTART_REASON: &str = "MPSDaemonRestarted";
/// The running daemons' piece of the handover state: `[[resource, pipe folder], …]`.
const HANDOVER_KEY: &str = "mps-daemons";

/// The daemons up now, as `(resource, pipe folder)`, for the gpud that takes over.
type Running = Arc<std::sync::Mutex<Vec<(String, PathBuf)>>>;

/// How the subsystem runs the daemons.
#[derive(Debug, Clone)]
pub struct Options {
    /// `nvidia-cuda-mps-control`, a path or a name looked up on PATH.
    pub binary: PathBuf,
    /// Leave `<root>/shm` unmounted.
    pub skip_shm_mount: bool,
    /// How often each daemon is probed.
    pub probe_interval: Duration,
    /// Where restart events go: the Node's name and the kubeconfig (`None`: in-cluster);
    /// no target logs only.
    pub events: Option<(String, Option<PathBuf>)>,
}

/// The MPS control-daemon subsystem.
#[derive(Debug)]
pub struct MpsControl {
    nvml: Nvml,
    options: Options,
}

impl MpsControl {
    pub fn new(nvml: Nvml, options: Options) -> Self {
        MpsControl { nvml, options }
    }
}

/// One daemon and where it stands.
struct Supervised {
    daemon: Arc<Daemon>,
    up: bool,
    /// When to try starting it again while it is down.
    retry_at: Instant,
    /// The pauses between failed starts.
    backoff: Backoff,
    /// Whether it has been up before (a start after that is a restart).
    was_up: bool,
    /// Why the last start failed; `None` once it starts.
    start_error: Option<String>,
    /// The gpud taken over from left this daemon running: probe it before starting one.
    adopt: bool,
}

impl Subsystem for MpsControl {
    type Settings = Settings;
    crate::subsystem_name!("mps");

    async fn run(self, ctx: Context<Settings>, inventory: Inventory) -> anyhow::Result<()> {
        let stopping = ctx.cancel_token();
        let mut settings = ctx.settings();
        let mut snapshots = inventory.subscribe();
        let mut running: Vec<Supervised> = Vec::new();
        let mut root: Option<PathBuf> = None;
        let mut last_error: Option<String> = None;
        let mut tick = tokio::time::interval(self.options.probe_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut reconsider = true;
        let events = self
            .options
            .events
            .clone()
            .map(|(node, kubeconfig)| EventSender::start(&ctx.helpers(), node, kubeconfig));
        let mut adoptable: Vec<(String, PathBuf)> = ctx
            .inherited(HANDOVER_KEY)
            .and_then(|handed| serde_json::from_value(handed).ok())
            .unwrap_or_default();
        let up: Running = Running::default();
        {
            let up = Arc::clone(&up);
            ctx.hand_on(HANDOVER_KEY, move || {
                let daemons = up.lock().map(|d| d.clone()).unwrap_or_default();
                serde_json::to_value(daemons).unwrap_or_default()
            });
        }
        loop {
            if reconsider {
                reconsider = false;
                let current = settings.borrow_and_update().clone();
                let snapshot = snapshots.borrow_and_update().clone();
                match plan::plan(&current, &snapshot) {
                    Ok(plans) => {
                        last_error = None;
                        let wanted_root = current.mps_root.clone();
                        if wanted_root != root || !same_plans(&running, &plans) {
                            self.stop_all(&mut running, root.as_deref()).await;
                            root = wanted_root;
                            if let Some(dir) = root.clone() {
                                let (shm_root, skip) = (dir.clone(), self.options.skip_shm_mount);
                                blocking(move || layout::prepare_root(&shm_root, skip)).await??;
                                let binary = &self.options.binary;
                                running = plans
                                    .into_iter()
                                    .map(|p| {
                                        let stop = ctx.cancel_token();
                                        let mut entry =
                                            Supervised::new(Daemon::new(p, &dir, binary, stop));
                                        let pipe = paths::pipe_dir(&dir, entry.daemon.resource());
                                        entry.adopt = adoptable.iter().any(|(resource, handed)| {
                                            resource == entry.daemon.resource() && *handed == pipe
                                        });
                                        entry
                                    })
                                    .collect();
                                // Adopted once, at the first start; later changes start anew.
                                adoptable.clear();
                            }
                            self.supervise(&mut running, events.as_ref(), &stopping)
                                .await;
                            self.mark_ready(&running, root.as_deref(), &ctx).await;
                            note_up(&up, &running, root.as_deref());
                        }
                    }
                    Err(err) => {
                        let text = err.to_string();
                        if last_error.as_deref() != Some(text.as_str()) {
                            error!(error = %text, "Cannot run MPS as configured; keeping the running MPS daemons");
                            last_error = Some(text);
                        }
                    }
                }
            }
            tokio::select! {
                () = ctx.cancelled() => break,
                changed = settings.changed() => {
                    if changed.is_err() { break }
                    reconsider = true;
                }
                changed = snapshots.changed() => {
                    if changed.is_err() { break }
                    reconsider = true;
                }
                _ = tick.tick() => {
                    self.supervise(&mut running, events.as_ref(), &stopping).await;
                    self.mark_ready(&running, root.as_deref(), &ctx).await;
                    note_up(&up, &running, root.as_deref());
                }
            }
        }
        if ctx.handed_over() {
            info!(
                daemons = running.len(),
                "A new gpud took over: leaving the MPS control daemons running for it"
            );
        } else {
            self.stop_all(&mut running, root.as_deref()).await;
        }
        Ok(())
    }
}

impl Supervised {
    fn new(daemon: Daemon) -> Supervised {
        // Seeded by the resource: the daemons of one node restart apart, not in lockstep.
        let backoff = Backoff::between(
            BACKOFF_START,
            BACKOFF_MAX,
            backoff::seed_from(daemon.resource()),
        );
        Supervised {
            daemon: Arc::new(daemon),
            up: false,
            retry_at: Instant::now(),
            backoff,
            was_up: false,
            start_error: None,
            adopt: false,
        }
    }
}

/// Records which daemons are up, for the gpud that takes over.
fn note_up(up: &Running, running: &[Supervised], root: Option<&std::path::Path>) {
    let Some(root) = root else { return };
    let daemons = running
        .iter()
        .filter(|s| s.up)
        .map(|s| {
            let resource = s.daemon.resource().to_owned();
            let pipe = paths::pipe_dir(root, &resource);
            (resource, pipe)
        })
        .collect();
    if let Ok(mut shared) = up.lock() {
        *shared = daemons;
    }
}

fn same_plans(running: &[Supervised], plans: &[DaemonPlan]) -> bool {
    running.len() == plans.len() && running.iter().zip(plans).all(|(r, p)| r.daemon.plan == *p)
}

/// Runs blocking work (NVML, child processes) off the async workers.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> T + Send + 'static,
) -> anyhow::Result<T> {
    Ok(tokio::task::spawn_blocking(work).await?)
}

impl MpsControl {
    /// Probes the daemons that are up and (re)starts those that are down and due; stops
    /// early once gpud is stopping (the calls in flight are killed then). Restarts go to
    /// `events` as Node events.
    async fn supervise(
        &self,
        running: &mut [Supervised],
        events: Option<&EventSender>,
        stopping: &CancellationToken,
    ) {
        for entry in running.iter_mut() {
            if stopping.is_cancelled() {
                return;
            }
            let daemon = Arc::clone(&entry.daemon);
            if entry.up {
                let probe = blocking(move || daemon.probe()).await;
                match probe {
                    Ok(Ok(())) => continue,
                    // Killed because gpud stops, not because the daemon is down.
                    _ if stopping.is_cancelled() => return,
                    Ok(Err(err)) => {
                        warn!(resource = %entry.daemon.resource(), error = %logging::error_chain(&err),
                            "MPS control daemon does not answer; marking its devices unhealthy and starting it again");
                    }
                    Err(err) => warn!(error = %err, "MPS probe task failed"),
                }
                entry.daemon.mark_down();
                entry.up = false;
                entry.backoff.reset();
                entry.retry_at = Instant::now() + BACKOFF_START;
                continue;
            }
            if std::mem::take(&mut entry.adopt) {
                let daemon = Arc::clone(&entry.daemon);
                if let Ok(Ok(())) = blocking(move || daemon.probe()).await {
                    info!(resource = %entry.daemon.resource(), "Adopted the MPS control daemon the gpud taken over from left running");
                    entry.up = true;
                    entry.was_up = true;
                    continue;
                }
                warn!(resource = %entry.daemon.resource(), "The MPS control daemon handed over does not answer; starting one");
            }
            if Instant::now() < entry.retry_at {
                continue;
            }
            let daemon = Arc::clone(&entry.daemon);
            let nvml = self.nvml.clone();
            match blocking(move || daemon.start(&nvml)).await {
                Ok(Ok(())) => {
                    entry.up = true;
                    entry.start_error = None;
                    if entry.was_up {
                        restarted(&entry.daemon, events);
                    } else {
                        info!(resource = %entry.daemon.resource(),
                              gpus = entry.daemon.plan.gpus.len(),
                              replicas = entry.daemon.plan.replicas,
                              "MPS control daemon started");
                    }
                    entry.was_up = true;
                }
                _ if stopping.is_cancelled() => return,
                outcome => {
                    let why = match outcome {
                        Ok(Err(err)) => logging::error_chain(&err),
                        Err(err) => err.to_string(),
                        Ok(Ok(())) => String::new(),
                    };
                    let delay = entry.backoff.next_delay();
                    error!(resource = %entry.daemon.resource(), error = %why,
                           retry_in = ?delay, "Cannot start the MPS control daemon");
                    entry.start_error = Some(why);
                    entry.retry_at = Instant::now() + delay;
                }
            }
        }
    }

    /// `.ready` and readiness once every daemon is up; not ready, with the reason, while a
    /// daemon cannot be started.
    async fn mark_ready(
        &self,
        running: &[Supervised],
        root: Option<&std::path::Path>,
        ctx: &Context<Settings>,
    ) {
        if let Some((resource, why)) = running
            .iter()
            .find_map(|s| Some((s.daemon.resource(), s.start_error.as_deref()?)))
        {
            ctx.ready_latch().unset(format!(
                "the MPS control daemon for {resource} cannot start: {why}"
            ));
            return;
        }
        if !running.iter().all(|s| s.up) {
            return;
        }
        if let Some(root) = root {
            let marker = paths::ready_marker(root);
            if !marker.exists()
                && let Err(err) = layout::mark(&marker)
            {
                warn!(error = %err, "Cannot write the MPS .ready marker");
            }
        }
        ctx.set_ready();
    }

    /// Stops every daemon, in reverse order of start, and removes `.ready`.
    async fn stop_all(&self, running: &mut Vec<Supervised>, root: Option<&std::path::Path>) {
        if let Some(root) = root {
            layout::unmark(&paths::ready_marker(root));
        }
        while let Some(entry) = running.pop() {
            let nvml = self.nvml.clone();
            let daemon = Arc::clone(&entry.daemon);
            info!(resource = %daemon.resource(), "Stopping the MPS control daemon");
            if let Err(err) = blocking(move || daemon.stop(&nvml)).await {
                error!(error = %err, "MPS stop task failed");
            }
        }
    }
}

/// Logs a restart and records it on the Node when events are configured.
fn restarted(daemon: &Daemon, events: Option<&EventSender>) {
    let message = format!(
        "MPS control daemon for {} stopped answering and was restarted",
        daemon.resource()
    );
    warn!(resource = %daemon.resource(), "{message}");
    if let Some(events) = events {
        events.send(NodeEvent {
            kind: Kind::Warning,
            reason: RESTART_REASON,
            message,
            at: SystemTime::now(),
        });
    }
}
