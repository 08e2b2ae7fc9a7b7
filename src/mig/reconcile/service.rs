//! The reconcile loop, a daemon subsystem of `gpud mig reconcile` and of `gpud run`.
//!
//! Each pass reads the Node. A requested config is attempted when this process has not yet
//! brought it to a terminal outcome: always once after start (a restart in `pending` or
//! `rebooting` resumes, a `success` is re-checked in one assert), again whenever the label
//! changes, and again after a failure once its backoff has passed. An attempt asserts first
//! (an applied config only confirms `success`), writes `pending`, applies, and writes
//! `success`, `failed` with the reason, or `rebooting`. Between passes the loop watches the
//! Node until it changes or the next retry is due.
//!
//! Every apply holds the node's MIG layout lock ([`crate::holdings::layout_lock`]), so it
//! never runs beside a DRA claim's prepare or remediation's restore; after each success the
//! GPUs' layout is recorded as the MIG manager's ([`crate::holdings::layout`]), which is what
//! remediation makes again after a reset.
//!
//! After every apply the inventory is rescanned at once, so in `gpud run` the device plugin
//! advertises the new MIG devices (and withdraws the old ones), the labeller relabels and the
//! exporter follows without waiting for the periodic rescan.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::attempt::Job;
use super::marker::Marker;
use super::node::{self, FIELD_MANAGER, State, View};
use crate::backoff::{self, Backoff};
use crate::daemon::{Context, Subsystem};
use crate::holdings::{layout, layout_lock};
use crate::inventory::Inventory;
use crate::kube::{self, ApiReadiness, NodeClient, Watched};
use crate::mig::apply::{ApplyError, Outcome};
use crate::mig_state::metrics::Metrics;
use crate::mig_state::record::{self, Record};
use crate::nvml::Rescanner;
use crate::nvml::mig_admin::MigAdmin;

/// Longest wait between retries of a failing config.
pub const RETRY_MAX: Duration = Duration::from_secs(600);
/// Longest single watch (the API server's usual watch timeout is about 5 minutes); each is
/// drawn a little shorter ([`crate::backoff::period`]) so a fleet's renewals drift apart.
const WATCH_MAX: Duration = Duration::from_secs(290);

/// The reconciler subsystem.
#[derive(Debug)]
pub struct Reconciler {
    /// How configs are applied.
    pub job: Job,
    /// The Node whose label is followed.
    pub node: String,
    /// kubeconfig; the in-cluster account without it.
    pub kubeconfig: Option<PathBuf>,
    /// The reboot-once guard.
    pub marker: Marker,
    /// Where the last state is recorded for `gpud doctor` (`--mig-state-dir`).
    pub state_dir: PathBuf,
    /// Program and arguments that reboot the node; empty: report `rebooting` and leave the
    /// reboot to the operator.
    pub reboot_command: Vec<String>,
    /// First delay before a failed config is retried (doubling up to [`RETRY_MAX`], with
    /// gpud's jitter).
    pub retry: Duration,
    /// MIG administration of the node's GPUs.
    pub admin: MigAdmin,
    /// Re-reads the node into the shared inventory after an apply.
    pub rescanner: Rescanner,
    /// Applies and states, for the exporter of the same process.
    pub metrics: Metrics,
    /// How long the API server may go unanswered before the reconciler is not ready.
    pub unready_after: Duration,
    /// The state directory with the MIG layout owners' record and lock; `None`: this process
    /// only, nothing recorded.
    pub layout_dir: Option<PathBuf>,
}

/// How an attempt ended.
enum Step {
    /// A terminal outcome for this label (`success`, or `rebooting`): nothing more to do until
    /// the label changes or the process restarts.
    Done,
    /// `failed`: try again after the backoff.
    Retry,
    /// The daemon is stopping.
    Stopped,
}

/// When a failed config is tried again.
struct Retry {
    label: String,
    at: Instant,
}

async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, String> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| format!("the MIG worker thread failed: {e}"))
}

impl Reconciler {
    /// Writes `state` (and `reason`), retrying the API server until it answers or the daemon
    /// stops; false when stopped first.
    async fn report(
        &self,
        client: &NodeClient,
        label: &str,
        state: State,
        reason: Option<&str>,
        cancel: &CancellationToken,
    ) -> bool {
        // Per node, so that a fleet reporting through one API server does not retry in step.
        let mut backoff = Backoff::new(backoff::seed_from(&self.node) ^ u64::from(state as u8));
        loop {
            let written = tokio::select! {
                () = cancel.cancelled() => return false,
                written = node::report(client, state, reason) => written,
            };
            match written {
                Ok(()) => {
                    self.noted(label, state, reason);
                    info!(
                        state = state.as_str(),
                        reason = reason.unwrap_or(""),
                        "Reported {}",
                        state.as_str()
                    );
                    return true;
                }
                Err(err) => {
                    let delay = err.paced(backoff.next_delay());
                    warn!(error = %crate::logging::error_chain(&err), state = state.as_str(), retry_in = ?delay, "Cannot write the MIG state on the Node; retrying");
                    tokio::select! {
                        () = cancel.cancelled() => return false,
                        () = tokio::time::sleep(delay) => {}
                    }
                }
            }
        }
    }

    /// Keeps the state the Node now says for the exporter and for `gpud doctor`.
    fn noted(&self, label: &str, state: State, reason: Option<&str>) {
        self.metrics.state(state);
        let record = Record {
            config: label.to_owned(),
            state: state.as_str().to_owned(),
            reason: reason.map(str::to_owned),
        };
        if let Err(err) = record::write(&self.state_dir, &record) {
            warn!(error = %err, "Cannot record the MIG state for gpud doctor");
        }
    }

    async fn failed(
        &self,
        client: &NodeClient,
        label: &str,
        reason: String,
        cancel: &CancellationToken,
    ) -> Step {
        warn!(config = label, reason = %reason, "MIG config failed; it will be retried");
        if self
            .report(client, label, State::Failed, Some(&reason), cancel)
            .await
        {
            Step::Retry
        } else {
            Step::Stopped
        }
    }

    /// Records the GPUs' layout now as the MIG manager's, for remediation's restore.
    async fn record_layout(&self) {
        let Some(dir) = self.layout_dir.clone() else {
            return;
        };
        let admin = self.admin;
        let recorded = blocking(move || {
            let gpus = admin.gpus().map_err(|e| crate::logging::error_chain(&e))?;
            layout::record_layouts(&dir, &gpus)
        })
        .await
        .and_then(|r| r);
        if let Err(err) = recorded {
            warn!(error = %err, "Cannot record the MIG layout for remediation; a GPU reset leaves it unmade");
        }
    }

    async fn success(
        &self,
        client: &NodeClient,
        label: &str,
        view: &View,
        cancel: &CancellationToken,
    ) -> Step {
        self.record_layout().await;
        if let Err(err) = self.marker.clear() {
            warn!(error = %err, "Cannot remove the reboot marker");
        }
        if view.says(State::Success, None) {
            self.noted(label, State::Success, None);
            Step::Done
        } else if self
            .report(client, label, State::Success, None, cancel)
            .await
        {
            Step::Done
        } else {
            Step::Stopped
        }
    }

    /// One attempt at `label`.
    async fn attempt(
        &self,
        client: &NodeClient,
        view: &View,
        label: &str,
        inventory: &Inventory,
        cancel: &CancellationToken,
    ) -> Step {
        let (job, admin, owned) = (self.job.clone(), self.admin, label.to_owned());
        let checked = tokio::select! {
            () = cancel.cancelled() => return Step::Stopped,
            checked = blocking(move || job.check(&admin, &owned)) => checked.and_then(|c| c),
        };
        let changing = match checked {
            Err(reason) => return self.failed(client, label, reason, cancel).await,
            Ok(changing) if changing.is_empty() => {
                info!(config = label, "MIG config already in effect");
                return self.success(client, label, view, cancel).await;
            }
            Ok(changing) => changing,
        };
        if !self
            .report(client, label, State::Pending, None, cancel)
            .await
        {
            return Step::Stopped;
        }
        // One layout change at a time on the node: wait for a claim's prepare or a restore.
        let locked = tokio::select! {
            () = cancel.cancelled() => return Step::Stopped,
            locked = layout_lock::lock(self.layout_dir.as_deref(), "the MIG manager's apply") => locked,
        };
        let lock = match locked {
            Ok(lock) => lock,
            Err(reason) => return self.failed(client, label, reason, cancel).await,
        };
        // Withdraw the GPUs from the device plugin and the exporter before the first change;
        // the rescan after the apply clears the mark in the same publish as the new layout.
        inventory.update(|snapshot| snapshot.set_reconfiguring(&changing));
        info!(config = label, gpus = ?changing, "Applying MIG config");
        let (job, admin, owned) = (self.job.clone(), self.admin, label.to_owned());
        let started = Instant::now();
        let apply = blocking(move || job.apply(&admin, &owned));
        tokio::pin!(apply);
        let applied = tokio::select! {
            applied = &mut apply => applied,
            () = cancel.cancelled() => {
                // A layout left half applied is worse than a stop that waits: the apply gets
                // the grace period, and one that outlasts it ends with the process (which
                // then exits rather than wait beside a gpud that took over); the next start
                // resumes it either way.
                info!(config = label, "Stopping once the MIG apply under way has finished");
                let applied = apply.await.map_err(ApplyError::Failed).and_then(|a| a);
                return self.stopped_after(client, label, &applied).await;
            }
        };
        let applied = applied.map_err(ApplyError::Failed).and_then(|a| a);
        let reached = matches!(applied, Ok(Outcome::Applied | Outcome::AlreadyApplied));
        self.metrics.applied(reached, started.elapsed());
        let settled = |snapshot: &mut crate::inventory::Snapshot| snapshot.set_reconfiguring(&[]);
        match self.rescanner.rescan_with(inventory, settled).await {
            Ok(changed) => info!(changed, "Inventory rescanned after the MIG apply"),
            Err(err) => {
                inventory.update(settled);
                warn!(error = %crate::logging::error_chain(&err), "Rescan after the MIG apply failed; the periodic rescan will catch up")
            }
        }
        // Let go before the Node is written: an API server that does not answer must not hold
        // up a claim's prepare.
        drop(lock);
        match applied {
            Ok(Outcome::Applied | Outcome::AlreadyApplied) => {
                info!(config = label, "MIG config applied");
                self.success(client, label, &View::default(), cancel).await
            }
            Ok(Outcome::ResetPending(_)) => {
                let why = "the MIG mode change waits for a GPU reset".to_owned();
                self.failed(client, label, why, cancel).await
            }
            Err(err @ ApplyError::RebootRequired(_)) => {
                self.reboot(client, label, err.to_string(), cancel).await
            }
            Err(err @ (ApplyError::Refused(_) | ApplyError::Failed(_))) => {
                self.failed(client, label, err.to_string(), cancel).await
            }
        }
    }

    /// Says on the Node how an apply that the stop waited for ended, briefly: the process is
    /// within its grace period, and the next start checks the layout anyway.
    async fn stopped_after(
        &self,
        client: &NodeClient,
        label: &str,
        applied: &Result<Outcome, ApplyError>,
    ) -> Step {
        let (state, reason) = match applied {
            Ok(Outcome::Applied | Outcome::AlreadyApplied) => {
                if let Err(err) = self.marker.clear() {
                    warn!(error = %err, "Cannot remove the reboot marker");
                }
                (State::Success, None)
            }
            _ => (
                State::Failed,
                Some("gpud stopped during the apply; the next start resumes it"),
            ),
        };
        let _ =
            tokio::time::timeout(Duration::from_secs(2), node::report(client, state, reason)).await;
        self.noted(label, state, reason);
        Step::Stopped
    }

    /// A mode change that needs a reboot: at most one per requested config.
    async fn reboot(
        &self,
        client: &NodeClient,
        label: &str,
        why: String,
        cancel: &CancellationToken,
    ) -> Step {
        if self.marker.holds(label) {
            let reason = format!(
                "MIG mode change did not take effect after rebooting: {why}; remove {} to allow another reboot",
                self.marker.path().display()
            );
            return self.failed(client, label, reason, cancel).await;
        }
        if let Err(err) = self.marker.set(label) {
            let reason = format!("{why}; cannot record the reboot: {err}");
            return self.failed(client, label, reason, cancel).await;
        }
        let Some((program, args)) = self.reboot_command.split_first() else {
            let reason =
                format!("{why}; reboot the node to apply it (no reboot command configured)");
            return if self
                .report(client, label, State::Rebooting, Some(&reason), cancel)
                .await
            {
                Step::Done
            } else {
                Step::Stopped
            };
        };
        if !self
            .report(client, label, State::Rebooting, Some(&why), cancel)
            .await
        {
            return Step::Stopped;
        }
        info!(command = %program, "Rebooting the node for the MIG mode change");
        let (program, args) = (program.clone(), args.to_vec());
        let ran = blocking(move || {
            let mut command = std::process::Command::new(&program);
            command.args(&args);
            crate::daemon::signals::with_default_mask(|| command.status())
                .map_err(|e| format!("cannot run the reboot command {program:?}: {e}"))
        })
        .await
        .and_then(|r| r);
        match ran {
            Ok(status) if status.success() => Step::Done,
            Ok(status) => {
                let reason = format!("{why}; the reboot command failed ({status})");
                self.failed(client, label, reason, cancel).await
            }
            Err(reason) => self.failed(client, label, reason, cancel).await,
        }
    }

    async fn run_loop(self, ctx: Context<()>, inventory: Inventory) -> anyhow::Result<()> {
        let cancel = ctx.cancel_token();
        let client = NodeClient::new(
            kube::connect(self.kubeconfig.as_deref()).await?,
            self.node.clone(),
            FIELD_MANAGER,
        );
        // Ready once the Node is read, not before: a reconciler that cannot read its label
        // follows nothing.
        let mut api_ready = ApiReadiness::new(ctx.ready_latch(), self.unready_after);
        let mut backoff = Backoff::new(backoff::seed_from(&self.node));
        // Failed configs: from `--mig-retry-interval` up to RETRY_MAX while the same label keeps
        // failing, from the start again for a new label.
        let mut config_backoff =
            Backoff::between(self.retry, RETRY_MAX, backoff::seed_from(&self.node));
        // Apart from the reads': a read that succeeds between two failed watches must not
        // bring a watch that keeps failing (410 after 410) back to the first, shortest pause.
        let mut watch_backoff = Backoff::new(backoff::seed_from(&self.node).rotate_left(1));
        let mut done: Option<String> = None;
        let mut retry: Option<Retry> = None;
        // What the last watch brought: the Node as it sent it, or the version a quiet watch
        // ended at; either spares a read.
        let mut watched: Option<Watched> = None;
        // When a failed config is retried, if the Node still asks for it.
        let mut retry_due: Option<Instant> = None;
        // The config the Node last asked for: a watch goes on through changes to the Node
        // that leave it as it was.
        let mut known: Option<Option<String>> = None;
        loop {
            let read = match watched.take() {
                Some(Watched::Changed(object)) => Ok(node::view_of(*object)),
                Some(Watched::Quiet(version)) => {
                    let watch_max = crate::backoff::period(WATCH_MAX);
                    let limit = retry_due
                        .map_or(watch_max, |at| at.saturating_duration_since(Instant::now()));
                    if limit.is_zero() {
                        // A retry is due: read, so the attempt starts from the Node now.
                        tokio::select! {
                            () = cancel.cancelled() => return Ok(()),
                            read = node::read(&client) => read,
                        }
                    } else {
                        let waited = tokio::select! {
                            () = cancel.cancelled() => return Ok(()),
                            waited = client.changed(&version, limit.min(watch_max), |n| node::asks_otherwise(known.as_ref(), n)) => waited,
                        };
                        match self
                            .after_watch(waited, &version, &mut watch_backoff, &cancel)
                            .await
                        {
                            Some(next) => watched = Some(next),
                            None if cancel.is_cancelled() => return Ok(()),
                            None => {}
                        }
                        continue;
                    }
                }
                None => tokio::select! {
                    () = cancel.cancelled() => return Ok(()),
                    read = node::read(&client) => read,
                },
            };
            let view = match read {
                Ok(view) => {
                    api_ready.answered();
                    // The gpud taken over from may be applying a layout right now: act only
                    // once it has finished (its record and marker say where it stopped), then
                    // read the Node again.
                    let mut gone = ctx.predecessor_gone();
                    let waiting = !*gone.borrow_and_update();
                    if waiting {
                        tokio::select! {
                            () = cancel.cancelled() => return Ok(()),
                            _ = gone.wait_for(|gone| *gone) => {}
                        }
                        continue;
                    }
                    view
                }
                Err(err) => {
                    api_ready.failed(&crate::logging::error_chain(&err));
                    let delay = err.paced(backoff.next_delay());
                    warn!(error = %crate::logging::error_chain(&err), retry_in = ?delay, "Cannot read the Node; retrying");
                    tokio::select! {
                        () = cancel.cancelled() => return Ok(()),
                        () = tokio::time::sleep(delay) => {}
                    }
                    continue;
                }
            };
            backoff.reset();
            known = Some(view.wanted.clone());
            let due = view.wanted.as_ref().filter(|label| {
                done.as_ref() != Some(*label)
                    && retry
                        .as_ref()
                        .is_none_or(|r| r.label != **label || Instant::now() >= r.at)
            });
            if let Some(label) = due.cloned() {
                match self
                    .attempt(&client, &view, &label, &inventory, &cancel)
                    .await
                {
                    Step::Stopped => return Ok(()),
                    Step::Done => {
                        done = Some(label);
                        retry = None;
                    }
                    Step::Retry => {
                        if retry.as_ref().is_none_or(|r| r.label != label) {
                            config_backoff.reset();
                        }
                        let delay = config_backoff.next_delay();
                        info!(config = %label, after = ?delay, "Retrying the MIG config later");
                        done = None;
                        retry = Some(Retry {
                            label,
                            at: Instant::now() + delay,
                        });
                    }
                }
                continue;
            }
            retry_due = retry
                .as_ref()
                .filter(|r| view.wanted.as_ref() == Some(&r.label))
                .map(|r| r.at);
            let watch_max = crate::backoff::period(WATCH_MAX);
            let limit = retry_due
                .map_or(watch_max, |at| at.saturating_duration_since(Instant::now()))
                .min(watch_max);
            let waited = tokio::select! {
                () = cancel.cancelled() => return Ok(()),
                waited = client.changed(&view.version, limit, |n| node::asks_otherwise(known.as_ref(), n)) => waited,
            };
            watched = self
                .after_watch(waited, &view.version, &mut watch_backoff, &cancel)
                .await;
            if cancel.is_cancelled() {
                return Ok(());
            }
        }
    }

    /// What to do after a watch from version `from`: go on from what it saw or, when it
    /// failed, after a pause, watch again from `from` — the API server sends what changed
    /// since, so no read is needed (after an outage, every node's read would join the herd) —
    /// unless the version is gone from its window (410): then read the Node again (`None`).
    async fn after_watch(
        &self,
        waited: Result<Watched, kube::ApiError>,
        from: &str,
        watch_backoff: &mut Backoff,
        cancel: &tokio_util::sync::CancellationToken,
    ) -> Option<Watched> {
        match waited {
            Ok(watched) => {
                watch_backoff.reset();
                Some(watched)
            }
            Err(err) => {
                let delay = err.paced(watch_backoff.next_delay());
                let gone = err.status() == Some(410);
                if gone {
                    warn!(error = %crate::logging::error_chain(&err), retry_in = ?delay, "Watching the Node failed; reading it again after a pause");
                } else {
                    warn!(error = %crate::logging::error_chain(&err), retry_in = ?delay, "Watching the Node failed; watching again from where it was after a pause");
                }
                tokio::select! {
                    () = cancel.cancelled() => {}
                    () = tokio::time::sleep(delay) => {}
                }
                (!gone).then(|| Watched::Quiet(from.to_owned()))
            }
        }
    }
}

impl Subsystem for Reconciler {
    type Settings = ();
    crate::subsystem_name!("mig-reconcile");

    async fn run(self, ctx: Context<()>, inventory: Inventory) -> anyhow::Result<()> {
        self.run_loop(ctx, inventory).await
    }
}
