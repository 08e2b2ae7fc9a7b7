//! The `node-status` subsystem: keeps gpud's conditions, taints and events on its own Node.
//!
//! Level-triggered: each round works out the desired state from the latest inventory and
//! doctor report ([`Desired`]) and, when it differs from what was last written (or the resync
//! is due), writes all of it, from a fresh read of the Node. Nothing is queued but events, so
//! after an API outage the Node gets the state of that moment, not a replay. A failed write
//! is retried with a capped, jittered backoff; the health watcher and the device plugin never
//! wait on this task.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use tokio::time::Instant;
use tracing::{info, warn};

use super::args::Settings;
use super::conditions::{Condition, GpuHealth, Status};
use super::events;
use super::hold::Handed;
use super::state::{self, Desired};
use super::taints::{self, Wanted};
use crate::backoff::{self, Backoff};
use crate::daemon::{Context, Subsystem};
use crate::doctor_report::LatestReport;
use crate::inventory::Inventory;
use crate::inventory::transitions;
use crate::kube::events::Outbox;
use crate::kube::{self, ApiError, ApiReadiness, ConditionRecord, NodeClient, NodeView};

/// The node-status subsystem for one node.
/// The field manager of gpud's conditions and taints, and the component of its events.
pub const FIELD_MANAGER: &str = "gpud";
/// The node status's piece of the handover state: each GPU's held health and what was last
/// written ([`HandedStatus`]).
const HANDOVER_KEY: &str = "node-status-hold";
/// How long the first write waits for the doctor's first verdict: the doctor's first run takes
/// tens of milliseconds, and writing "not run yet" just before it costs the Node a second write
/// and the cluster an event.
const FIRST_VERDICT_WAIT: Duration = Duration::from_secs(5);

#[derive(Debug)]
pub struct NodeStatus {
    node: String,
    kubeconfig: Option<PathBuf>,
    settings: Settings,
    doctor: Option<LatestReport>,
    /// How long the API server may go unanswered before the subsystem is not ready.
    unready_after: Duration,
}

impl NodeStatus {
    /// Publishes the GPUs' health on `node`, connecting with `kubeconfig` (else in-cluster).
    pub fn new(node: String, kubeconfig: Option<PathBuf>, settings: Settings) -> Self {
        NodeStatus {
            node,
            kubeconfig,
            settings,
            doctor: None,
            unready_after: Duration::from_secs(120),
        }
    }

    /// Not ready after `limit` without an answer from the API server (`--api-unready-after`).
    pub fn with_unready_after(mut self, limit: Duration) -> Self {
        self.unready_after = limit;
        self
    }

    /// Also publishes the verdict of the daemon's periodic doctor.
    pub fn with_doctor(mut self, latest: LatestReport) -> Self {
        self.doctor = Some(latest);
        self
    }
}

/// What was last written successfully.
#[derive(Debug, Clone, PartialEq)]
struct Wrote {
    conditions: Vec<Condition>,
    taints: Vec<Wanted>,
}

impl Wrote {
    /// The text a process hands on for what it wrote: the same text in the next process means
    /// the same Node state (its debug form, so a gpud whose types differ writes once more).
    fn fingerprint(&self) -> String {
        format!("{self:?}")
    }
}

/// What the gpud taken over from hands on: each GPU's held health by UUID, what it last wrote
/// to the Node and how long until its next resync, so the new process neither shows a recovery
/// early nor writes the Node again to say the same.
#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
struct HandedStatus {
    gpus: BTreeMap<String, Handed<GpuHealth>>,
    #[serde(default)]
    wrote: Option<String>,
    #[serde(default)]
    resync_in_ms: u64,
}

/// What this process would hand on now, kept current by the loop.
#[derive(Debug)]
struct Handing {
    gpus: BTreeMap<String, super::hold::Held<GpuHealth>>,
    wrote: Option<String>,
    resync_at: std::time::Instant,
}

impl Handing {
    fn handed(&self, now: std::time::Instant) -> HandedStatus {
        HandedStatus {
            gpus: state::handed(&self.gpus, now),
            wrote: self.wrote.clone(),
            resync_in_ms: u64::try_from(self.resync_at.saturating_duration_since(now).as_millis())
                .unwrap_or(u64::MAX),
        }
    }
}

impl Subsystem for NodeStatus {
    type Settings = ();
    crate::subsystem_name!("node-status");

    async fn run(self, ctx: Context<()>, inventory: Inventory) -> anyhow::Result<()> {
        let client = kube::connect(self.kubeconfig.as_deref()).await?;
        let api = NodeClient::new(client, self.node.clone(), FIELD_MANAGER);
        let settings = self.settings;
        let mut updates = inventory.subscribe();
        let mut last = updates.borrow_and_update().clone();
        let mut reports = self.doctor.as_ref().map(LatestReport::subscribe);
        if let Some(reports) = reports.as_mut() {
            tokio::select! {
                () = ctx.cancelled() => return Ok(()),
                _ = tokio::time::timeout(FIRST_VERDICT_WAIT, reports.wait_for(Option::is_some)) => {}
            }
        }
        let report = reports.as_mut().and_then(|r| r.borrow_and_update().clone());
        let mut desired = Desired::new(
            settings.hold,
            settings.taints,
            &last,
            reports.is_some(),
            report.as_deref(),
            Instant::now().into_std(),
        );
        let mut wrote: Option<Wrote> = None;
        let mut resync_at = Instant::now();
        // The hold goes on where the gpud taken over from was: a GPU it still showed failed
        // while waiting out its quiet hold is not shown recovered early; and what it wrote is
        // on the Node, so the same state is not written again before its resync.
        if let Some(handed) = ctx.inherited(HANDOVER_KEY) {
            match serde_json::from_value::<HandedStatus>(handed) {
                Ok(handed) => {
                    let now = Instant::now();
                    desired.take_on(handed.gpus, now.into_std());
                    let want = Wrote {
                        conditions: desired.conditions(),
                        taints: desired.taints(),
                    };
                    if handed.wrote.as_deref() == Some(want.fingerprint().as_str()) {
                        wrote = Some(want);
                        resync_at = now + Duration::from_millis(handed.resync_in_ms);
                    }
                }
                Err(err) => {
                    warn!(error = %err, "Cannot read the node status handed over; holding from now")
                }
            }
        }
        // What to hand on, kept current after every step, for the gpud that takes over.
        let handing = Arc::new(Mutex::new(Handing {
            gpus: desired.held_gpus(),
            wrote: wrote.as_ref().map(Wrote::fingerprint),
            resync_at: resync_at.into_std(),
        }));
        {
            let handing = Arc::clone(&handing);
            ctx.hand_on(HANDOVER_KEY, move || {
                let handing = handing.lock().unwrap_or_else(PoisonError::into_inner);
                serde_json::to_value(handing.handed(std::time::Instant::now())).unwrap_or_default()
            });
        }
        // Ready once the API server answers, not before: the first write, or a read of the Node
        // when what the gpud taken over from wrote is still what this one would write.
        let mut api_ready = ApiReadiness::new(ctx.ready_latch(), self.unready_after);
        let mut answered = false;

        let mut backoff = Backoff::capped(backoff::seed_from(&self.node), settings.retry_max);
        let mut outbox = Outbox::new(Instant::now().into_std());
        let mut uid: Option<String> = None;
        // The conditions this process last wrote, while nothing since says they may differ.
        let mut written: Option<Transitions> = None;
        let mut next_attempt = Instant::now();
        // Whether the last attempt lost a race for the taints (409) and was retried at once.
        let mut reread = false;
        loop {
            handing.lock().unwrap_or_else(PoisonError::into_inner).gpus = desired.held_gpus();
            let now = Instant::now();
            if let Some(changed) = desired.settle(now.into_std()) {
                outbox.push(
                    events::condition(&changed, SystemTime::now()),
                    now.into_std(),
                );
            }
            let want = Wrote {
                conditions: desired.conditions(),
                taints: desired.taints(),
            };
            let due = wrote.as_ref() != Some(&want) || now >= resync_at;
            let pending = due || !outbox.is_empty() || !answered;
            // Only the resync: nothing changed and nothing to send.
            let check_only = answered && outbox.is_empty() && wrote.as_ref() == Some(&want);
            if now >= next_attempt && pending {
                let attempt = async {
                    if due {
                        // A resync with nothing changed, or the first write of a process
                        // (a restart), writes only what the Node does not show already.
                        let resync = wrote.as_ref().is_none_or(|w| w == &want);
                        let how = How {
                            taints_on: settings.taints.any(),
                            resync,
                        };
                        uid = write(&api, &want, how, uid.clone(), &mut written).await?;
                    } else if !answered {
                        uid = api.read().await?.uid;
                    }
                    send_events(&api, &mut outbox, uid.as_deref()).await
                };
                match attempt.await {
                    Ok(()) => {
                        api_ready.answered();
                        answered = true;
                        if due {
                            log_changes(wrote.as_ref(), &want);
                            resync_at = Instant::now() + backoff::period(settings.resync);
                            let mut handing =
                                handing.lock().unwrap_or_else(PoisonError::into_inner);
                            handing.wrote = Some(want.fingerprint());
                            handing.resync_at = resync_at.into_std();
                            wrote = Some(want);
                        }
                        backoff.reset();
                        reread = false;
                    }
                    // Someone changed the Node between the read and the taint patch: read it
                    // again and retry at once, once; a second conflict in a row backs off.
                    Err(err) if err.status() == Some(409) && !reread => {
                        info!(error = %crate::logging::error_chain(&err), "The Node changed while gpud wrote its taints; reading it again");
                        reread = true;
                        next_attempt = Instant::now();
                    }
                    // A resync that cannot reach the API server waits for its next turn, as
                    // the kubelet's status report does: retried, it would come back with every
                    // other node whose resync fell in the same outage.
                    Err(err) if check_only && crate::kube::pace::unreachable() => {
                        api_ready.failed(&crate::logging::error_chain(&err));
                        info!(error = %crate::logging::error_chain(&err), after = ?settings.resync, "Cannot check the node status on the Node; checking again on the next turn");
                        resync_at = Instant::now() + backoff::period(settings.resync);
                        handing
                            .lock()
                            .unwrap_or_else(PoisonError::into_inner)
                            .resync_at = resync_at.into_std();
                    }
                    Err(err) => {
                        api_ready.failed(&crate::logging::error_chain(&err));
                        reread = false;
                        let delay = err.paced(backoff.next_delay());
                        warn!(error = %crate::logging::error_chain(&err), retry_in = ?delay, "Node status not written; retrying with the state of that moment");
                        next_attempt = Instant::now() + delay;
                    }
                }
                continue;
            }
            let wake = [
                desired.deadline().map(Instant::from_std),
                pending.then_some(next_attempt),
                Some(resync_at),
            ]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or_else(|| now + Duration::from_secs(3600));
            tokio::select! {
                () = ctx.cancelled() => return Ok(()),
                changed = updates.changed() => {
                    if changed.is_err() {
                        return Ok(());
                    }
                    let snapshot = updates.borrow_and_update().clone();
                    let at = SystemTime::now();
                    for change in transitions::between(&last, &snapshot) {
                        outbox.push(events::transition(&change, at), Instant::now().into_std());
                    }
                    desired.observe_gpus(&snapshot, Instant::now().into_std());
                    last = snapshot;
                }
                changed = next_report(&mut reports) => {
                    if changed {
                        let report = reports.as_mut().and_then(|r| r.borrow_and_update().clone());
                        let now = Instant::now().into_std();
                        if let Some(condition) = desired.observe_doctor(report.as_deref(), now) {
                            outbox.push(events::condition(&condition, SystemTime::now()), now);
                        }
                    } else {
                        reports = None;
                    }
                }
                () = tokio::time::sleep_until(wake) => {}
            }
        }
    }
}

/// Waits for the next doctor report; `false` when the doctor is gone. Never finishes without
/// a doctor.
async fn next_report(
    reports: &mut Option<
        tokio::sync::watch::Receiver<Option<std::sync::Arc<crate::doctor_report::Report>>>,
    >,
) -> bool {
    match reports {
        Some(rx) => rx.changed().await.is_ok(),
        None => std::future::pending().await,
    }
}

/// Each of gpud's conditions as last written: its status and transition time.
type Transitions = BTreeMap<String, (Status, String)>;

/// How a write goes: whether taints are gpud's to write (they need the Node's version), and
/// whether it is a resync (nothing changed: write only what the Node lost).
#[derive(Debug, Clone, Copy)]
struct How {
    taints_on: bool,
    resync: bool,
}

/// Writes `want` to the Node; the Node's uid after it (`uid` is the one known before).
///
/// A resync, a process's first write and any write with taints read the Node first: what it
/// shows decides what to write. A change of conditions alone, with the conditions this
/// process wrote last in hand (`written`), is written without the read: their transition
/// times are known, and a fleet whose nodes all see one fault (or whose API server comes
/// back) sends one request per node, not two. A write that failed leaves them as they were:
/// had it landed after all, the next write only puts back the transition time it replaced.
async fn write(
    api: &NodeClient,
    want: &Wrote,
    how: How,
    uid: Option<String>,
    written: &mut Option<Transitions>,
) -> Result<Option<String>, ApiError> {
    let now = SystemTime::now();
    let (uid, seen) = match written.as_ref() {
        Some(known) if !how.resync && !how.taints_on && uid.is_some() => (uid, known.clone()),
        _ => {
            let view = api.read().await?;
            if how.resync && shows(&view, want, how.taints_on) {
                *written = Some(transitions_on(&view));
                return Ok(view.uid);
            }
            if how.taints_on {
                let added = Time(
                    k8s_openapi::jiff::Timestamp::try_from(now)
                        .unwrap_or(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
                );
                if let Some(next) = taints::plan(&view.taints, &want.taints, &added) {
                    api.replace_taints(&next, view.resource_version.as_deref())
                        .await?;
                }
            }
            (view.uid.clone(), transitions_on(&view))
        }
    };
    let stamp = humantime::format_rfc3339_seconds(now).to_string();
    // The transition time survives restarts and rewrites: kept while the status on the Node
    // is the one being written.
    let next: Transitions = want
        .conditions
        .iter()
        .map(|condition| {
            let transition = seen
                .get(condition.kind)
                .filter(|(status, _)| *status == condition.status)
                .map_or_else(|| stamp.clone(), |(_, at)| at.clone());
            (condition.kind.to_owned(), (condition.status, transition))
        })
        .collect();
    let records: Vec<ConditionRecord<'_>> = want
        .conditions
        .iter()
        .map(|condition| ConditionRecord {
            kind: condition.kind,
            status: condition.status.as_str(),
            reason: condition.reason,
            message: &condition.message,
            transition: next.get(condition.kind).map_or(&stamp, |(_, at)| at),
            heartbeat: &stamp,
        })
        .collect();
    api.apply_conditions(&records).await?;
    *written = Some(next);
    Ok(uid)
}

/// gpud's conditions as `view` shows them, with their transition times.
fn transitions_on(view: &NodeView) -> Transitions {
    view.conditions
        .iter()
        .filter_map(|(kind, status, at)| Some((kind.clone(), (Status::parse(status), at.clone()?))))
        .collect()
}

/// Whether the Node in `view` already shows `want`: every condition with its status, reason
/// and message, and gpud's taints as wanted.
fn shows(view: &NodeView, want: &Wrote, taints_on: bool) -> bool {
    let conditions = want.conditions.iter().all(|condition| {
        let status = view.conditions.iter().any(|(kind, status, _)| {
            kind == condition.kind && Status::parse(status) == condition.status
        });
        let said = view.said.iter().any(|(kind, reason, message)| {
            kind == condition.kind && reason == condition.reason && *message == condition.message
        });
        status && said
    });
    let added = Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
    let taints = !taints_on || taints::plan(&view.taints, &want.taints, &added).is_none();
    conditions && taints
}

/// Sends the waiting events, oldest first, until one fails.
async fn send_events(
    api: &NodeClient,
    outbox: &mut Outbox,
    uid: Option<&str>,
) -> Result<(), ApiError> {
    while let Some(event) = outbox.front() {
        api.create_event(event, uid).await?;
        outbox.sent();
    }
    Ok(())
}

/// One log line per condition or taint whose status changed on the Node.
fn log_changes(before: Option<&Wrote>, now: &Wrote) {
    for condition in &now.conditions {
        let old = before.and_then(|b| b.conditions.iter().find(|c| c.kind == condition.kind));
        if old.map(|c| c.status) != Some(condition.status) {
            info!(condition = condition.kind, status = condition.status.as_str(), reason = condition.reason, message = %condition.message, "Node condition set");
        }
    }
    for taint in &now.taints {
        let old = before.and_then(|b| b.taints.iter().find(|t| t.key == taint.key));
        if old.map(|t| t.present) != Some(taint.present) {
            info!(
                taint = taint.key,
                effect = taint.effect.as_str(),
                present = taint.present,
                "Node taint updated"
            );
        }
    }
}
