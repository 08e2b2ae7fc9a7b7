//! Health verdicts that only an event proves, kept in gpud's state directory so that a restart
//! (a crash, an OOM kill, an upgrade) does not put a GPU that still needs a reset back into
//! service: NVML keeps no trace of an XID, and the kernel log is read from its end.
//!
//! One file per applet (`<state-dir>/health/<applet>.json`: the containers of the per-applet
//! DaemonSet each run a watcher), keyed by GPU UUID (indices can change across a restart) and
//! stamped with the boot ID: after a reboot every GPU was reset, and the file is ignored. A GPU
//! is kept until the tracker sees it reset, then dropped from the file. Its format and checksum
//! are [`super::kept_file`]'s, its two generations on disk [`super::kept_store`]'s.
//!
//! The file fails closed: one that cannot be read is moved aside and said once, and every GPU
//! it could have covered is held out of service (and kept held in the file) until the doctor's
//! checks of it pass ([`super::evidence`]). It is written only when what it holds changed, by a
//! thread of its own while the watcher runs so that an XID's verdict never waits on the disk;
//! a write that fails (a full disk) is retried until it lands, and the watcher's readiness
//! names the file and the error meanwhile.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use tracing::{info, warn};

use super::evidence::HeldGpu;
use super::kept_file::{self, Verdicts};
use super::kept_store::{Loaded, Store};
use super::tracker::{Kept, Tracker};
use crate::daemon::{Helpers, ReadyLatch};
use crate::inventory::Snapshot;
use crate::kube::EventSender;
use crate::kube::events::{Kind, NodeEvent};

/// The default state directory (a hostPath in the DaemonSet, `StateDirectory=` on bare metal).
pub const DEFAULT_STATE_DIR: &str = crate::cli::DEFAULT_STATE_DIR;
/// Where Linux says which boot this is.
const BOOT_ID: &str = "/proc/sys/kernel/random/boot_id";
/// The first wait before a failed write is tried again; it doubles up to [`RETRY_MAX`].
const RETRY_FIRST: Duration = Duration::from_millis(500);
/// The longest wait between two tries of a failed write.
const RETRY_MAX: Duration = Duration::from_secs(5);

/// The reason of the Node event that says a damaged file.
pub const EVENT_REASON: &str = "KeptVerdictsDamaged";

/// What the file holds (or is to hold), to write only changes.
#[derive(Debug, Clone, PartialEq, Default)]
struct Contents {
    gpus: BTreeMap<String, Kept>,
    unproven: BTreeMap<String, String>,
}

/// The kept verdicts of one applet's watcher.
#[derive(Debug)]
pub struct KeptVerdicts {
    store: Store,
    boot_id: String,
    /// What the file holds now (as written or read), to write only changes.
    written: Option<Contents>,
    /// The generation last written or read.
    generation: u64,
    /// GPUs held until fresh evidence, by UUID, with why.
    unproven: BTreeMap<String, String>,
    /// Where a failing write is reported (readiness) and its end.
    outcome: WriteOutcome,
    /// The thread that writes while the watcher runs, started on the first change.
    writer: Option<Writer>,
    /// Where a damaged file is said as a Node event, when the applet has a Node.
    events: Option<NodeEvents>,
}

/// The Node a damaged file is said on. Its sender (a helper of the watcher) starts with the
/// first event and lives as long as the watcher: a helper that ends before the daemon does
/// would fail the watcher.
#[derive(Debug)]
pub struct NodeEvents {
    helpers: Helpers,
    node: String,
    kubeconfig: Option<PathBuf>,
    sender: Option<EventSender>,
}

impl NodeEvents {
    /// Events on Node `node`, through `kubeconfig` (else the in-cluster service account).
    pub fn new(helpers: Helpers, node: String, kubeconfig: Option<PathBuf>) -> Self {
        NodeEvents {
            helpers,
            node,
            kubeconfig,
            sender: None,
        }
    }

    fn send(&mut self, event: NodeEvent) {
        let (helpers, node, kubeconfig) = (&self.helpers, &self.node, &self.kubeconfig);
        self.sender
            .get_or_insert_with(|| EventSender::start(helpers, node.clone(), kubeconfig.clone()))
            .send(event);
    }
}

/// The file of `applet` in `state_dir`.
pub fn file_of(state_dir: &std::path::Path, applet: &str) -> PathBuf {
    state_dir.join("health").join(format!("{applet}.json"))
}

impl KeptVerdicts {
    /// The verdicts kept in `path` for this boot.
    pub fn new(path: PathBuf) -> Self {
        let boot_id = std::fs::read_to_string(BOOT_ID)
            .map(|id| id.trim().to_owned())
            .unwrap_or_default();
        Self::for_boot(path, boot_id)
    }

    /// [`new`](Self::new) for a given boot ID.
    pub fn for_boot(path: PathBuf, boot_id: String) -> Self {
        KeptVerdicts {
            store: Store::new(path),
            boot_id,
            written: None,
            generation: 0,
            unproven: BTreeMap::new(),
            outcome: WriteOutcome::default(),
            writer: None,
            events: None,
        }
    }

    /// Reports a failing write on `latch` (not ready, naming the file and the error) until it
    /// lands; the watcher's own readiness is given by [`WriteOutcome::registered`].
    pub fn reporting_on(mut self, latch: ReadyLatch) -> Self {
        self.outcome = WriteOutcome::on(latch);
        self
    }

    /// Says a damaged file as a Warning event on the Node too.
    pub fn with_events(mut self, events: Option<NodeEvents>) -> Self {
        self.events = events;
        self
    }

    /// Where a failing write is reported.
    pub fn outcome(&self) -> WriteOutcome {
        self.outcome.clone()
    }

    /// Gives the tracker what the last run kept, for the GPUs of `snapshot` (by UUID), and
    /// holds every GPU a damaged file could have covered. Returns the GPUs held until fresh
    /// evidence. Nothing from another boot.
    pub fn restore(&mut self, tracker: &mut Tracker, snapshot: &Snapshot) -> Vec<HeldGpu> {
        let loaded = self.store.load();
        let now = SystemTime::now();
        let damage = self.said_damage(&loaded);
        let mut unproven = BTreeMap::new();
        let mut restored = BTreeMap::new();
        let found = loaded.found.is_some();
        if let Some((path, decoded)) = loaded.found {
            self.generation = decoded.generation;
            if decoded.version > kept_file::VERSION {
                info!(path = %path.display(), version = decoded.version, "The kept health verdicts were written by a newer gpud; reading what this one knows of them");
            }
            if decoded.verdicts.boot_id == self.boot_id {
                restored = self.restore_gpus(tracker, snapshot, decoded.verdicts.gpus, now);
                unproven = decoded.verdicts.unproven;
            } else {
                info!(path = %path.display(), "The node rebooted since the health verdicts were kept (every GPU was reset); starting from what NVML says now");
            }
        }
        if let Some(why) = damage {
            for gpu in &snapshot.gpus {
                unproven
                    .entry(gpu.uuid.clone())
                    .or_insert_with(|| why.clone());
            }
        }
        let mut held = Vec::new();
        for (uuid, why) in unproven {
            let Some(gpu) = snapshot.gpus.iter().find(|gpu| gpu.uuid == uuid) else {
                continue;
            };
            warn!(gpu = gpu.index, uuid = %uuid, why = %why, "Holding the GPU out of service until the doctor's checks of it pass");
            tracker.observe_unproven(gpu.index, Some(&why), now);
            held.push(HeldGpu {
                index: gpu.index,
                uuid: uuid.clone(),
            });
            self.unproven.insert(uuid, why);
        }
        // Written again at start unless a copy that reads is all there is: no file yet, or a
        // damaged copy moved aside.
        self.written = (found && loaded.damaged.is_empty()).then(|| Contents {
            gpus: restored,
            unproven: self.unproven.clone(),
        });
        held
    }

    /// Says each damaged copy once (it was moved aside) and counts it; returns why the GPUs
    /// are held when the newest copy is among them.
    fn said_damage(&mut self, loaded: &Loaded) -> Option<String> {
        let mut newest = None;
        for damaged in &loaded.damaged {
            crate::inventory::health::note_kept_verdicts_damaged();
            let aside = damaged.moved_to.as_ref().map_or_else(
                || "could not be moved aside".to_owned(),
                |to| format!("moved aside as {}", to.display()),
            );
            warn!(path = %damaged.path.display(), error = %damaged.why, "The kept health verdicts cannot be read ({aside}); what they held is unknown, so every GPU they could have covered is held out of service until the doctor's checks of it pass");
            if let Some(events) = &mut self.events {
                events.send(NodeEvent {
                    kind: Kind::Warning,
                    reason: EVENT_REASON,
                    message: format!(
                        "gpud's kept health verdicts {} cannot be read ({}; {aside}): the GPUs they could have covered are held out of service until the doctor's checks of each pass",
                        damaged.path.display(),
                        damaged.why
                    ),
                    at: SystemTime::now(),
                });
            }
            if damaged.path == self.store.path() {
                newest = Some(format!(
                    "the kept health verdicts {} could not be read ({}; {aside})",
                    damaged.path.display(),
                    damaged.why
                ));
            }
        }
        loaded.newest_damaged.then_some(newest).flatten()
    }

    fn restore_gpus(
        &self,
        tracker: &mut Tracker,
        snapshot: &Snapshot,
        gpus: BTreeMap<String, Kept>,
        now: SystemTime,
    ) -> BTreeMap<String, Kept> {
        for (uuid, kept) in &gpus {
            match snapshot.gpus.iter().find(|gpu| gpu.uuid == *uuid) {
                Some(gpu) => {
                    let codes: Vec<u32> = kept.xids.iter().map(|x| x.code).collect();
                    info!(gpu = gpu.index, uuid = %uuid, xids = ?codes, "Keeping the health verdict from before the restart until the GPU is seen reset");
                    tracker.restore(gpu.index, kept, now);
                }
                None => {
                    info!(uuid = %uuid, "A GPU with a kept health verdict is not on the node any more; forgetting it");
                }
            }
        }
        gpus
    }

    /// The doctor's checks of the GPU `uuid` (index `gpu`) passed: it is no longer held.
    pub fn proven(&mut self, tracker: &mut Tracker, gpu: u32, uuid: &str) {
        self.unproven.remove(uuid);
        tracker.observe_unproven(gpu, None, SystemTime::now());
    }

    /// Writes what the tracker holds for the GPUs of `snapshot`, when it changed, now: at
    /// start, before the watcher is ready. A failed write is handed to the writer thread,
    /// which tries it again until it lands.
    pub fn save_now(&mut self, tracker: &Tracker, snapshot: &Snapshot) {
        let Some(bytes) = self.changed(tracker, snapshot) else {
            return;
        };
        match self.store.write(&bytes) {
            Ok(()) => self.outcome.landed(self.store.path()),
            Err(why) => {
                self.outcome.failed(self.store.path(), &why);
                self.queue(bytes);
            }
        }
    }

    /// Hands what the tracker holds for the GPUs of `snapshot`, when it changed, to a writer
    /// thread: the watcher's loop never waits on the disk (a synchronous write tripled the
    /// XID → verdict latency under a stream of XIDs). Only the newest waiting file is written.
    pub fn save(&mut self, tracker: &Tracker, snapshot: &Snapshot) {
        if let Some(bytes) = self.changed(tracker, snapshot) {
            self.queue(bytes);
        }
    }

    fn queue(&mut self, bytes: Vec<u8>) {
        if self.writer.is_none() {
            self.writer = Writer::start(self.store.clone(), self.outcome.clone());
        }
        match &self.writer {
            Some(writer) => writer.queue(bytes),
            // No thread to be had: write in place rather than keep nothing.
            None => match self.store.write(&bytes) {
                Ok(()) => self.outcome.landed(self.store.path()),
                Err(why) => self.outcome.failed(self.store.path(), &why),
            },
        }
    }

    /// The file's new contents when what the tracker holds differs from what was last
    /// written; remembers it as written.
    fn changed(&mut self, tracker: &Tracker, snapshot: &Snapshot) -> Option<Vec<u8>> {
        let gpus: BTreeMap<String, Kept> = snapshot
            .gpus
            .iter()
            .map(|gpu| (gpu.uuid.clone(), tracker.kept(gpu.index)))
            .filter(|(_, kept)| !kept.xids.is_empty())
            .collect();
        let contents = Contents {
            gpus,
            unproven: self.unproven.clone(),
        };
        if self.written.as_ref() == Some(&contents) {
            return None;
        }
        let verdicts = Verdicts {
            boot_id: self.boot_id.clone(),
            gpus: contents.gpus.clone(),
            unproven: contents.unproven.clone(),
        };
        let bytes = match kept_file::encode(&verdicts, self.generation + 1) {
            Ok(bytes) => bytes,
            Err(err) => {
                warn!(error = %err, "Cannot encode the kept health verdicts");
                return None;
            }
        };
        self.generation += 1;
        self.written = Some(contents);
        Some(bytes)
    }
}

/// Whether the kept verdicts' writes land, reported on the watcher's readiness: not ready,
/// naming the file and the error, while one fails; ready again once it lands and the watcher
/// is registered. Clones share it (the writer thread holds one).
#[derive(Debug, Clone, Default)]
pub struct WriteOutcome {
    latch: Option<ReadyLatch>,
    state: Arc<Mutex<OutcomeState>>,
}

#[derive(Debug, Default)]
struct OutcomeState {
    /// The watcher registered its sources: ready as far as it is concerned.
    registered: bool,
    /// The error of the write that fails now.
    failing: Option<String>,
}

impl WriteOutcome {
    fn on(latch: ReadyLatch) -> Self {
        WriteOutcome {
            latch: Some(latch),
            state: Arc::default(),
        }
    }

    fn with(&self, change: impl FnOnce(&mut OutcomeState)) {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        change(&mut state);
        let Some(latch) = &self.latch else {
            return;
        };
        match (&state.failing, state.registered) {
            (Some(why), _) => latch.unset(format!(
                "cannot keep the health verdicts ({why}); a restart now would forget XIDs that need a GPU reset; retrying until the write lands (free space in the state directory or make it writable)"
            )),
            (None, true) => latch.set(),
            (None, false) => {}
        }
    }

    /// The watcher registered its sources; ready unless a write fails.
    pub fn registered(&self) {
        self.with(|state| state.registered = true);
    }

    /// A write of `path` failed with `why`: said once per failing streak.
    fn failed(&self, path: &std::path::Path, why: &str) {
        self.with(|state| {
            if state.failing.is_none() {
                warn!(path = %path.display(), error = %why, "Cannot keep the health verdicts: a restart now would forget XIDs that need a GPU reset; retrying until the write lands (free space in the state directory or make it writable)");
            }
            state.failing = Some(why.to_owned());
        });
    }

    /// A write of `path` landed.
    fn landed(&self, path: &std::path::Path) {
        self.with(|state| {
            if state.failing.take().is_some() {
                info!(path = %path.display(), "Health verdicts are kept again");
            }
        });
    }
}

/// The thread that writes the kept verdicts, newest first, trying a failed write again until
/// it lands; it ends, after the write in hand (and one last try of a failing one), once the
/// watcher lets go of it.
#[derive(Debug)]
struct Writer {
    queue: Option<std::sync::mpsc::Sender<Vec<u8>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Writer {
    fn start(store: Store, outcome: WriteOutcome) -> Option<Writer> {
        let (queue, files) = std::sync::mpsc::channel::<Vec<u8>>();
        let span = tracing::Span::current();
        let thread = std::thread::Builder::new()
            .name("gpud-kept".into())
            .spawn(move || {
                let _entered = span.enter();
                write_until_landed(&store, &outcome, &files);
            });
        match thread {
            Ok(thread) => Some(Writer {
                queue: Some(queue),
                thread: Some(thread),
            }),
            Err(err) => {
                warn!(error = %err, "Cannot start the thread that keeps health verdicts; writing them in place");
                None
            }
        }
    }

    fn queue(&self, bytes: Vec<u8>) {
        if let Some(queue) = &self.queue {
            // The thread ends only when this sender is dropped.
            let _ = queue.send(bytes);
        }
    }
}

/// Writes what `files` brings, only the newest of what waits; a failed write is tried again
/// after a pause that doubles up to [`RETRY_MAX`], or at once when a newer file arrives.
fn write_until_landed(
    store: &Store,
    outcome: &WriteOutcome,
    files: &std::sync::mpsc::Receiver<Vec<u8>>,
) {
    use std::sync::mpsc::RecvTimeoutError;
    let mut pending: Option<Vec<u8>> = None;
    let mut pause = RETRY_FIRST;
    let mut last_try = false;
    loop {
        let next = match pending {
            None => files.recv().map_err(|_| RecvTimeoutError::Disconnected),
            Some(_) => files.recv_timeout(pause),
        };
        match next {
            Ok(bytes) => pending = Some(bytes),
            Err(RecvTimeoutError::Timeout) => pause = (pause * 2).min(RETRY_MAX),
            Err(RecvTimeoutError::Disconnected) if pending.is_some() && !last_try => {
                last_try = true;
            }
            Err(RecvTimeoutError::Disconnected) => return,
        }
        // Only the newest of what waits matters.
        while let Ok(newer) = files.try_recv() {
            pending = Some(newer);
        }
        let Some(bytes) = &pending else {
            continue;
        };
        match store.write(bytes) {
            Ok(()) => {
                outcome.landed(store.path());
                pending = None;
                pause = RETRY_FIRST;
            }
            Err(why) => outcome.failed(store.path(), &why),
        }
        if last_try {
            return;
        }
    }
}

impl Drop for Writer {
    /// Lets the last file be written before the watcher's end is reported.
    fn drop(&mut self) {
        drop(self.queue.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::health::tracker::TrackerConfig;
    use crate::inventory::test_support;
    use crate::xid::catalog::XidPolicy;

    /// Three GPUs, indices 0–2.
    fn node() -> Snapshot {
        Snapshot {
            gpus: (0..3)
                .map(|i| test_support::gpu(i, &format!("GPU-{i}"), "NVIDIA H100", 81_559))
                .collect(),
            ..Snapshot::default()
        }
    }

    fn tracker() -> Tracker {
        Tracker::new(XidPolicy::default(), TrackerConfig::default())
    }

    #[test]
    fn a_fatal_xid_is_kept_for_this_boot_only_and_by_uuid() {
        let dir = tempfile::tempdir().unwrap();
        let path = file_of(dir.path(), "run");
        let snapshot = node();
        let mut before = tracker();
        before.observe_xid(2, 79, None, SystemTime::now());
        let mut kept = KeptVerdicts::for_boot(path.clone(), "boot-a".into());
        kept.save_now(&before, &snapshot);
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains(&snapshot.gpus[2].uuid), "{text}");

        // The same boot: GPU 2 is unhealthy again from the start.
        let mut after = tracker();
        KeptVerdicts::for_boot(path.clone(), "boot-a".into()).restore(&mut after, &snapshot);
        assert!(!after.verdict(2).is_healthy());
        assert!(after.verdict(1).is_healthy());
        assert!(
            after
                .verdict(2)
                .reason
                .is_some_and(|r| r.starts_with("XID 79"))
        );

        // Another boot: the reboot reset every GPU.
        let mut rebooted = tracker();
        KeptVerdicts::for_boot(path, "boot-b".into()).restore(&mut rebooted, &snapshot);
        assert!(rebooted.verdict(2).is_healthy());
    }

    #[test]
    fn a_damaged_file_holds_every_gpu_until_proven_and_is_rewritten() {
        let dir = tempfile::tempdir().unwrap();
        let path = file_of(dir.path(), "run");
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, "{\"version\": 2, \"boot_id\": ").unwrap();
        let snapshot = node();
        let mut after = tracker();
        let mut kept = KeptVerdicts::for_boot(path.clone(), "boot-a".into());
        let before = crate::inventory::health::kept_verdicts_damaged();
        let held = kept.restore(&mut after, &snapshot);
        assert!(crate::inventory::health::kept_verdicts_damaged() > before);
        assert_eq!(held.len(), 3);
        assert!((0..3).all(|gpu| !after.verdict(gpu).is_healthy()));
        assert!(!path.exists(), "moved aside");
        // The hold is kept in the file: a second restart before the evidence holds them again.
        kept.save_now(&after, &snapshot);
        let mut again = tracker();
        let held =
            KeptVerdicts::for_boot(path.clone(), "boot-a".into()).restore(&mut again, &snapshot);
        assert_eq!(held.len(), 3);
        assert!(!again.verdict(1).is_healthy());

        kept.proven(&mut after, 1, "GPU-1");
        assert!(after.verdict(1).is_healthy());
        assert!(!after.verdict(0).is_healthy());
        kept.save_now(&after, &snapshot);
        let mut third = tracker();
        let held = KeptVerdicts::for_boot(path, "boot-a".into()).restore(&mut third, &snapshot);
        assert_eq!(held.len(), 2);
        assert!(third.verdict(1).is_healthy());
    }

    #[test]
    fn an_unchanged_verdict_is_not_rewritten_and_the_thread_writes_the_last() {
        let dir = tempfile::tempdir().unwrap();
        let path = file_of(dir.path(), "run");
        let snapshot = node();
        let mut after = tracker();
        let mut kept = KeptVerdicts::for_boot(path.clone(), "boot-a".into());
        kept.restore(&mut after, &snapshot);
        after.observe_xid(0, 48, None, SystemTime::now());
        kept.save_now(&after, &snapshot);
        assert!(std::fs::read_to_string(&path).unwrap().contains("GPU-0"));
        std::fs::write(&path, "unchanged marker").unwrap();
        kept.save_now(&after, &snapshot);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "unchanged marker");
        // Written by the thread once the watcher lets go of it.
        after.observe_xid(1, 48, None, SystemTime::now());
        kept.save(&after, &snapshot);
        drop(kept);
        assert!(std::fs::read_to_string(&path).unwrap().contains("GPU-1"));
    }

    /// A write that fails (the folder cannot be made) is tried again until it lands.
    #[test]
    fn a_failed_write_is_tried_again_until_it_lands() {
        let dir = tempfile::tempdir().unwrap();
        let blocker = dir.path().join("health");
        std::fs::write(&blocker, "in the way").unwrap();
        let path = file_of(dir.path(), "run");
        let snapshot = node();
        let mut after = tracker();
        let mut kept = KeptVerdicts::for_boot(path.clone(), "boot-a".into());
        kept.restore(&mut after, &snapshot);
        after.observe_xid(2, 79, None, SystemTime::now());
        kept.save_now(&after, &snapshot);
        assert!(kept.outcome().state.lock().unwrap().failing.is_some());
        std::fs::remove_file(&blocker).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !path.exists() {
            assert!(std::time::Instant::now() < deadline, "never written");
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(std::fs::read_to_string(&path).unwrap().contains("GPU-2"));
        drop(kept);
    }
}
