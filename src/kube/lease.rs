//! A cluster-wide budget of slots on `coordination.k8s.io/v1` Leases, so that at most N nodes
//! do something disruptive (reset GPUs) at once.
//!
//! Slot `i` is the Lease `gpud-remediation-<i>` in gpud's namespace, `i` in `0..N`. A node
//! holds a slot while the Lease names it (`holderIdentity`) and it renews the Lease
//! (`renewTime`) every third of `leaseDurationSeconds`. Every write goes over the
//! resourceVersion read: of two nodes that want one slot, the API server lets one write and
//! answers the other 409, so a slot never has two holders.
//!
//! A slot is free when its Lease does not exist, names no holder (released), names this holder
//! (a restarted gpud resuming), or names a holder that stopped renewing (a dead node).
//!
//! **Expiry is judged on this node's own clock, not on `renewTime`.** A Lease counts as
//! expired when this budget has seen it at the same resourceVersion for its whole
//! `leaseDurationSeconds` (measured with [`Instant`]), as client-go's leader election does.
//! Comparing `renewTime` with the local wall clock would let a node whose clock runs ahead
//! take a live holder's slot, and two nodes would reset GPUs at once; observed time costs
//! only a wait of one lease duration before a dead holder's slot is taken by a node that has
//! just started. The budget must therefore live as long as the process (one per process),
//! not be built per attempt. `renewTime` and `acquireTime` are still written, for people and
//! tools that read the Lease.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ::kube::api::{Api, PostParams};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::ApiError;
use super::call::bounded;

/// What every slot's name starts with; slot `i` is `gpud-remediation-<i>`.
pub const SLOT_PREFIX: &str = "gpud-remediation-";

/// The shortest lease duration: `leaseDurationSeconds` is a whole number of seconds.
const MIN_DURATION: Duration = Duration::from_secs(1);

/// The name of slot `index`.
pub fn slot_name(index: u32) -> String {
    format!("{SLOT_PREFIX}{index}")
}

/// A budget of `slots` slots that this node (`holder`) may take one of. Keep one for the life
/// of the process: it remembers since when it has seen each Lease unchanged (see the module
/// documentation).
#[derive(Debug)]
pub struct SlotBudget {
    leases: Api<Lease>,
    namespace: String,
    holder: String,
    slots: u32,
    duration: Duration,
    /// What this budget last read of each slot, by index.
    seen: Mutex<HashMap<u32, Seen>>,
}

/// A slot's Lease as read: its resourceVersion, and since when (this node's monotonic clock)
/// it has been read at that version.
#[derive(Debug)]
struct Seen {
    version: String,
    since: Instant,
}

/// What taking a slot takes: nothing yet (create the Lease), or a Lease read.
#[derive(Debug)]
enum Free {
    Missing,
    /// Held by this holder already (a restart resuming).
    Ours(Lease),
    /// Released, or left by a holder that stopped renewing.
    Unheld(Lease),
    Expired(Lease),
}

impl Free {
    /// The order slots are tried in: this holder's own first (taking another would hold two),
    /// then free ones, then a dead holder's.
    fn rank(&self) -> u8 {
        match self {
            Free::Ours(_) => 0,
            Free::Missing | Free::Unheld(_) => 1,
            Free::Expired(_) => 2,
        }
    }
}

impl SlotBudget {
    /// A budget of `slots` Leases in `namespace`, taken as `holder` (the node's name), each
    /// held for `lease_duration` (at least one second, rounded up to whole seconds in the
    /// Lease) past its last renewal.
    pub fn new(
        client: ::kube::Client,
        namespace: String,
        holder: String,
        slots: u32,
        lease_duration: Duration,
    ) -> Self {
        SlotBudget {
            leases: Api::namespaced(client, &namespace),
            namespace,
            holder,
            slots,
            duration: lease_duration.max(MIN_DURATION),
            seen: Mutex::new(HashMap::new()),
        }
    }

    /// Takes a free slot: one whose Lease does not exist (created), names no holder, names
    /// this holder, or has not changed for its lease duration (its holder died). `Ok(None)`
    /// when every slot is held by a live holder, or another node won each free one first (a
    /// 409: a write over a resourceVersion no longer current, or a create of a name that
    /// exists). An error when the API server could not be read or refused a write otherwise;
    /// nothing is held then (a write whose answer was lost may have taken a slot, which then
    /// expires, as nobody renews it).
    pub async fn try_acquire(&self) -> Result<Option<HeldSlot>, ApiError> {
        let mut candidates = Vec::new();
        for index in 0..self.slots {
            let name = slot_name(index);
            let lease = bounded(
                || format!("reading lease {}/{name}", self.namespace),
                self.leases.get_opt(&name),
            )
            .await?;
            if let Some(free) = self.judge(index, lease) {
                candidates.push((free.rank(), index, free));
            }
        }
        candidates.sort_by_key(|(rank, index, _)| (*rank, *index));
        for (_, index, free) in candidates {
            let sent = Instant::now();
            match self.take(index, free).await {
                Ok(lease) => return Ok(Some(self.held(index, lease, sent))),
                // Another node took this slot between the read and the write.
                Err(err) if err.status() == Some(409) => {}
                Err(err) => return Err(err),
            }
        }
        Ok(None)
    }

    /// Whether slot `index`, whose Lease is `lease`, can be taken now, and how.
    fn judge(&self, index: u32, lease: Option<Lease>) -> Option<Free> {
        let Some(lease) = lease else {
            return Some(Free::Missing);
        };
        let version = lease.metadata.resource_version.clone().unwrap_or_default();
        let unchanged = self.unchanged_for(index, &version);
        let spec = lease.spec.as_ref();
        let holder = spec.and_then(|s| s.holder_identity.as_deref());
        let declared = spec
            .and_then(|s| s.lease_duration_seconds)
            .and_then(|s| u64::try_from(s).ok())
            .filter(|s| *s > 0)
            .map_or(self.duration, Duration::from_secs);
        match holder {
            Some(h) if h == self.holder => Some(Free::Ours(lease)),
            None | Some("") => Some(Free::Unheld(lease)),
            Some(_) if unchanged >= declared => Some(Free::Expired(lease)),
            Some(_) => None,
        }
    }

    /// How long this budget has seen slot `index` at `version`, on this node's clock; zero
    /// the first time.
    fn unchanged_for(&self, index: u32, version: &str) -> Duration {
        let now = Instant::now();
        let mut seen = lock(&self.seen);
        let entry = seen.entry(index).or_insert_with(|| Seen {
            version: version.to_owned(),
            since: now,
        });
        if entry.version != version {
            *entry = Seen {
                version: version.to_owned(),
                since: now,
            };
        }
        now.saturating_duration_since(entry.since)
    }

    /// Writes this holder into slot `index`: creates its Lease, or replaces the one read
    /// (over its resourceVersion).
    async fn take(&self, index: u32, free: Free) -> Result<Lease, ApiError> {
        let name = slot_name(index);
        let what = || format!("taking lease {}/{name}", self.namespace);
        let params = PostParams::default();
        let lease = match free {
            Free::Missing => {
                let lease = self.created(&name);
                return bounded(what, self.leases.create(&params, &lease)).await;
            }
            Free::Ours(lease) | Free::Unheld(lease) => lease,
            Free::Expired(lease) => {
                let gone = lease.spec.as_ref().and_then(|s| s.holder_identity.clone());
                info!(slot = %name, from = ?gone, "Taking a remediation slot whose holder stopped renewing it");
                lease
            }
        };
        let lease = self.claimed(lease);
        bounded(what, self.leases.replace(&name, &params, &lease)).await
    }

    /// A new Lease for slot `name`, held by this holder: no transition yet.
    fn created(&self, name: &str) -> Lease {
        let mut lease = self.claimed(Lease {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                namespace: Some(self.namespace.clone()),
                labels: Some(
                    [("app.kubernetes.io/managed-by".to_owned(), "gpud".to_owned())].into(),
                ),
                ..ObjectMeta::default()
            },
            spec: None,
        });
        if let Some(spec) = lease.spec.as_mut() {
            spec.lease_transitions = Some(0);
        }
        lease
    }

    /// `lease` held by this holder from now: renewed now; acquired now, one more transition,
    /// unless this holder held it already.
    fn claimed(&self, mut lease: Lease) -> Lease {
        let now = now();
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        if spec.holder_identity.as_deref() != Some(self.holder.as_str()) {
            spec.holder_identity = Some(self.holder.clone());
            spec.acquire_time = Some(now.clone());
            spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0).saturating_add(1));
        }
        spec.lease_duration_seconds = Some(whole_seconds(self.duration));
        spec.renew_time = Some(now);
        lease
    }

    /// The slot `index` held as `lease`, written at `sent`, renewed from now on.
    fn held(&self, index: u32, lease: Lease, sent: Instant) -> HeldSlot {
        let name = slot_name(index);
        info!(slot = %name, holder = %self.holder, "Took a remediation slot");
        let slot = Arc::new(Slot {
            leases: self.leases.clone(),
            namespace: self.namespace.clone(),
            name,
            index,
            holder: self.holder.clone(),
            duration: self.duration,
            hold: Mutex::new(Hold {
                lease,
                until: sent + self.duration,
                lost: false,
            }),
        });
        let stop = CancellationToken::new();
        let renewer = crate::logging::spawn(renew(Arc::clone(&slot), stop.clone()));
        HeldSlot {
            slot,
            stop,
            renewer: Some(renewer),
        }
    }
}

/// A slot this node holds. Renewed in the background every third of the lease duration while
/// it lives; [`HeldSlot::is_held`] turns false for good once a renewal finds the slot taken by
/// another, or none succeeded before the lease ran out. [`HeldSlot::release`] gives it back;
/// dropping it without release stops the renewals, so the Lease expires as a dead holder's
/// would.
#[derive(Debug)]
pub struct HeldSlot {
    slot: Arc<Slot>,
    stop: CancellationToken,
    renewer: Option<JoinHandle<()>>,
}

/// What the holder and its renewals share.
#[derive(Debug)]
struct Slot {
    leases: Api<Lease>,
    namespace: String,
    name: String,
    index: u32,
    holder: String,
    duration: Duration,
    hold: Mutex<Hold>,
}

#[derive(Debug)]
struct Hold {
    /// The Lease as this holder last wrote it (its resourceVersion the one to write over).
    lease: Lease,
    /// Until when the slot is this holder's: one lease duration after the last successful
    /// write was sent (others take it no sooner, having seen that write unchanged as long).
    until: Instant,
    /// A write found the slot another's (or gone): held no more, whatever the clock says,
    /// and not to be released.
    lost: bool,
}

impl HeldSlot {
    /// The Lease's name (`gpud-remediation-<i>`).
    pub fn name(&self) -> &str {
        &self.slot.name
    }

    /// The slot's index `i`.
    pub fn index(&self) -> u32 {
        self.slot.index
    }

    /// Whether the slot is still this holder's: renewed in time, and not taken by another.
    pub fn is_held(&self) -> bool {
        self.slot.is_held()
    }

    /// Stops renewing and gives the slot back: clears `holderIdentity` over the version last
    /// written. A slot already taken by another (or deleted) is left as it is. On an error the
    /// Lease is left to expire, as nobody renews it any more.
    pub async fn release(mut self) -> Result<(), ApiError> {
        self.stop.cancel();
        if let Some(renewer) = self.renewer.take() {
            // Ends at its next wait: a renewal in flight finishes first, so the release
            // writes over the version that renewal wrote.
            let _ = renewer.await;
        }
        if lock(&self.slot.hold).lost {
            return Ok(());
        }
        let released = self.slot.write(released).await?;
        if released.is_some() {
            info!(slot = %self.slot.name, "Released the remediation slot");
        }
        Ok(())
    }
}

impl Drop for HeldSlot {
    fn drop(&mut self) {
        self.stop.cancel();
        if let Some(renewer) = self.renewer.take() {
            renewer.abort();
        }
    }
}

impl Slot {
    fn is_held(&self) -> bool {
        let hold = lock(&self.hold);
        !hold.lost && Instant::now() < hold.until
    }

    fn lose(&self) {
        lock(&self.hold).lost = true;
    }

    /// Writes `change` over the version this holder last wrote. When another write came in
    /// between (409) and the Lease still names this holder (a write of its own whose answer
    /// was lost), once more over that version. `Ok(None)`: the slot is not this holder's any
    /// more (another's, or deleted); marked lost.
    async fn write(
        &self,
        change: fn(&mut LeaseSpec, MicroTime),
    ) -> Result<Option<Lease>, ApiError> {
        let mut conflict = None;
        for _ in 0..2 {
            let sent = Instant::now();
            let mut lease = lock(&self.hold).lease.clone();
            change(lease.spec.get_or_insert_with(LeaseSpec::default), now());
            let written = bounded(
                || format!("writing lease {}/{}", self.namespace, self.name),
                self.leases
                    .replace(&self.name, &PostParams::default(), &lease),
            )
            .await;
            match written {
                Ok(lease) => {
                    let mut hold = lock(&self.hold);
                    hold.lease = lease.clone();
                    // A slot that ran out while the write was on its way stays run out:
                    // [`HeldSlot::is_held`] never turns back to true.
                    if Instant::now() < hold.until {
                        hold.until = sent + self.duration;
                    }
                    return Ok(Some(lease));
                }
                Err(err) if err.status() == Some(409) => {
                    if !self.adopt_if_ours().await? {
                        self.lose();
                        return Ok(None);
                    }
                    conflict = Some(err);
                }
                Err(err) if err.status() == Some(404) => {
                    self.lose();
                    return Ok(None);
                }
                Err(err) => return Err(err),
            }
        }
        conflict.map_or(Ok(None), Err)
    }

    /// Reads the Lease; when it still names this holder, writes go over its version from now
    /// on. Whether it does.
    async fn adopt_if_ours(&self) -> Result<bool, ApiError> {
        let lease = bounded(
            || format!("reading lease {}/{}", self.namespace, self.name),
            self.leases.get_opt(&self.name),
        )
        .await?;
        match lease {
            Some(lease) if holder_of(&lease) == Some(self.holder.as_str()) => {
                lock(&self.hold).lease = lease;
                Ok(true)
            }
            _ => Ok(false),
        }
    }
}

/// Renews `slot` every third of its duration until `stop`, or until it is held no more.
async fn renew(slot: Arc<Slot>, stop: CancellationToken) {
    let every = slot.duration / 3;
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(every) => {}
        }
        // Run out, but perhaps not taken: a release still clears it if nobody wrote since.
        if !slot.is_held() {
            warn!(slot = %slot.name, "Lost the remediation slot: it could not be renewed before its lease ran out");
            return;
        }
        match slot.write(renewed).await {
            Ok(Some(_)) => {}
            Ok(None) => {
                warn!(slot = %slot.name, "Lost the remediation slot: another holder has it");
                return;
            }
            Err(err) => {
                warn!(slot = %slot.name, error = %crate::logging::error_chain(&err), "Cannot renew the remediation slot; retrying");
            }
        }
    }
}

/// A renewal: renewed now.
fn renewed(spec: &mut LeaseSpec, now: MicroTime) {
    spec.renew_time = Some(now);
}

/// A release: no holder (as client-go's leader election releases), renewed now.
fn released(spec: &mut LeaseSpec, now: MicroTime) {
    spec.holder_identity = None;
    spec.renew_time = Some(now);
}

fn holder_of(lease: &Lease) -> Option<&str> {
    lease.spec.as_ref()?.holder_identity.as_deref()
}

/// `duration` in whole seconds, rounded up (a holder never declares less than it means).
fn whole_seconds(duration: Duration) -> i32 {
    let seconds = duration.as_secs() + u64::from(duration.subsec_nanos() > 0);
    i32::try_from(seconds).unwrap_or(i32::MAX)
}

/// The wall clock now, to the microsecond, as Lease times are written.
fn now() -> MicroTime {
    let micros = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX));
    MicroTime(k8s_openapi::jiff::Timestamp::from_microsecond(micros).unwrap_or_default())
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_are_declared_in_whole_seconds_rounded_up() {
        assert_eq!(whole_seconds(Duration::from_secs(15)), 15);
        assert_eq!(whole_seconds(Duration::from_millis(1500)), 2);
        assert_eq!(whole_seconds(Duration::from_millis(1)), 1);
    }

    #[test]
    fn slots_are_named_by_index() {
        assert_eq!(slot_name(0), "gpud-remediation-0");
        assert_eq!(slot_name(12), "gpud-remediation-12");
    }

    #[test]
    fn lease_times_are_the_wall_clock_to_the_microsecond() {
        let written = now().0.as_microsecond();
        let clock = i64::try_from(
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap()
                .as_micros(),
        )
        .unwrap();
        assert!((clock - written).abs() < 5_000_000, "{written} vs {clock}");
    }
}
