//! The simulated driver's global state: reference-counted init/shutdown, configuration read
//! from the environment at init, the session (the validated node plus everything that changes
//! at run time), handle resolution, and the control-file watcher thread.
//!
//! Locking: the global [`DRIVER`] mutex only guards the reference count and which session is
//! current; each session has one runtime mutex. An export takes `DRIVER` just long enough to
//! clone the session, then the runtime lock. The watcher takes only the runtime lock, and an
//! event-set wait takes neither, so nothing blocks behind a waiting consumer.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::control::{self, Command, Growth, Tail, Target};
use crate::events::{Event, EventSet, NO_INSTANCE};
use crate::faults::{Faults, GpuProcess, RetiredPage};
use crate::ffi::{Res, rc};
use crate::fixture;
use crate::gpm::GpmSample;
use crate::mig::{MigState, mig_uuid};
use crate::node::Node;
use crate::registry::{Obj, Registry};
use crate::state::StateStore;
use crate::telemetry::Probe;
use nvml_wrapper_sys::bindings as b;

/// How often the watcher checks the control file's length.
const CONTROL_POLL: Duration = Duration::from_millis(1);

/// Wall-clock seconds that `t = 0` maps to when `NVML_MOCK_CLOCK` pins the clock, so that
/// timestamps are reproducible too (2023-11-14T22:13:20Z).
const PINNED_EPOCH_S: u64 = 1_700_000_000;

/// Settings read from the environment at the first `nvmlInit` of a session.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Config {
    /// `NVML_MOCK_FIXTURE`: built-in name or JSON path (default `dgx-h100`).
    pub fixture: Option<String>,
    /// `NVML_MOCK_CLOCK`: pins the telemetry clock to this many seconds.
    pub clock: Option<u64>,
    /// `NVML_MOCK_STATE`: MIG state file shared between processes.
    pub state: Option<PathBuf>,
    /// `NVML_MOCK_CONTROL`: fault-injection command file.
    pub control: Option<PathBuf>,
    /// `NVML_MOCK_MIG_RESET_REQUIRED=1`: MIG mode changes wait for a `reset` control line.
    pub mig_reset_required: bool,
    /// `NVML_MOCK_MIG_IN_USE=1`: MIG mode changes answer `NVML_ERROR_IN_USE` (clients hold the
    /// GPU, as on bare metal) and wait for a `reset` control line.
    pub mig_in_use: bool,
}

impl Config {
    // The simulated driver is configured by its environment, as tests and users set it.
    #[allow(clippy::disallowed_methods)]
    pub fn from_env() -> Config {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        Config {
            fixture: var("NVML_MOCK_FIXTURE"),
            clock: var("NVML_MOCK_CLOCK").and_then(|v| match v.trim().parse() {
                Ok(t) => Some(t),
                Err(_) => {
                    warn(&format!(
                        "NVML_MOCK_CLOCK={v:?} is not whole seconds; using the real clock"
                    ));
                    None
                }
            }),
            state: var("NVML_MOCK_STATE").map(PathBuf::from),
            control: var("NVML_MOCK_CONTROL").map(PathBuf::from),
            mig_reset_required: var("NVML_MOCK_MIG_RESET_REQUIRED").as_deref() == Some("1"),
            mig_in_use: var("NVML_MOCK_MIG_IN_USE").as_deref() == Some("1"),
        }
    }
}

/// Prints one diagnostic line on stderr, the only channel a library has to tell a test why.
pub fn warn(message: &str) {
    eprintln!("nvml-mock: {message}");
}

// ---------------------------------------------------------------------------------------------
// Runtime state
// ---------------------------------------------------------------------------------------------

/// A device handle resolved to what it names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dev {
    Gpu(usize),
    Mig { gpu: usize, gi: u32, ci: u32 },
}

impl Dev {
    /// The physical GPU behind the handle.
    pub fn gpu(self) -> usize {
        match self {
            Dev::Gpu(i) | Dev::Mig { gpu: i, .. } => i,
        }
    }
}

/// Everything about a session that changes after init.
#[derive(Debug)]
pub struct Runtime {
    /// MIG state per GPU (index-aligned with `node.gpus`).
    pub mig: Vec<MigState>,
    /// Compute mode per GPU (index-aligned with `node.gpus`), starting at the fixture's.
    pub compute_mode: Vec<u32>,
    pub faults: Vec<Faults>,
    pub registry: Registry,
    event_sets: HashMap<u64, Arc<EventSet>>,
    next_event_set: u64,
    gpm_samples: HashMap<u64, GpmSample>,
    next_gpm_sample: u64,
    store: Option<StateStore>,
    /// State-file entries for GPUs this fixture does not have; written back untouched.
    foreign: BTreeMap<String, MigState>,
    /// The same for compute modes.
    foreign_compute_modes: BTreeMap<String, u32>,
    /// Messages already printed, so a repeated problem is reported once.
    warned: HashSet<String>,
}

impl Runtime {
    fn new(node: &Node) -> Runtime {
        Runtime {
            mig: node.gpus.iter().map(|g| g.initial_mig.clone()).collect(),
            compute_mode: node.gpus.iter().map(|g| g.compute_mode).collect(),
            faults: node.gpus.iter().map(Faults::new).collect(),
            registry: Registry::default(),
            event_sets: HashMap::new(),
            next_event_set: 1,
            gpm_samples: HashMap::new(),
            next_gpm_sample: 1,
            store: None,
            foreign: BTreeMap::new(),
            foreign_compute_modes: BTreeMap::new(),
            warned: HashSet::new(),
        }
    }

    fn warn_once(&mut self, message: String) {
        if self.warned.insert(message.clone()) {
            warn(&message);
        }
    }

    /// Loads the state file if it changed. At init (`strict`) a bad file is an error; later it
    /// is reported once and the in-memory state kept, since a peer may be mid-update.
    fn load_state(&mut self, node: &Node, strict: bool) -> Result<(), String> {
        let Some(store) = self.store.as_mut() else {
            return Ok(());
        };
        if !strict && !store.changed() {
            return Ok(());
        }
        let path = store.path().display().to_string();
        let file = match store.load() {
            Ok(Some(file)) => file,
            Ok(None) => return Ok(()),
            Err(e) => return Err(format!("state file {path}: {e}")),
        };
        let mut foreign_modes = file.compute_modes.clone();
        for gpu in &node.gpus {
            if let Some(mode) = foreign_modes.remove(&gpu.uuid) {
                self.compute_mode[gpu.index] = mode;
            }
        }
        self.foreign_compute_modes = foreign_modes;
        let mut foreign = file.gpus.clone();
        for gpu in &node.gpus {
            let Some(state) = foreign.remove(&gpu.uuid) else {
                continue;
            };
            let Some(table) = gpu.model.mig else { continue };
            match state.check(table) {
                Ok(()) => self.mig[gpu.index] = state,
                Err(e) => return Err(format!("state file {path}: {}: {e}", gpu.uuid)),
            }
        }
        self.foreign = foreign;
        Ok(())
    }

    /// Picks up changes another process made to the state file.
    pub fn sync_state(&mut self, node: &Node) {
        if let Err(e) = self.load_state(node, false) {
            self.warn_once(e);
        }
    }

    /// Writes the MIG state of every MIG-capable GPU, and the compute mode of every GPU whose
    /// mode differs from the fixture's, to the state file, if there is one.
    pub fn persist(&mut self, node: &Node) {
        let Some(store) = self.store.as_mut() else {
            return;
        };
        let mut gpus = self.foreign.clone();
        for gpu in node.gpus.iter().filter(|g| g.mig_capable()) {
            gpus.insert(gpu.uuid.clone(), self.mig[gpu.index].clone());
        }
        let mut modes = self.foreign_compute_modes.clone();
        for gpu in &node.gpus {
            if self.compute_mode[gpu.index] != gpu.compute_mode {
                modes.insert(gpu.uuid.clone(), self.compute_mode[gpu.index]);
            }
        }
        if let Err(e) = store.save(gpus, modes) {
            self.warn_once(format!("state file: {e}"));
        }
    }

    fn alive(&self, gpu: usize) -> Res {
        if self.faults[gpu].lost {
            Err(rc::GPU_IS_LOST)
        } else {
            Ok(())
        }
    }

    /// Resolves a device handle (GPU or MIG device); lost GPUs answer `GPU_IS_LOST`.
    pub fn device(&mut self, node: &Node, handle: usize) -> Res<Dev> {
        match self.registry.lookup(handle) {
            Some(Obj::Gpu(i)) => {
                self.alive(i)?;
                Ok(Dev::Gpu(i))
            }
            Some(Obj::Mig { gpu, gi, ci }) => {
                self.alive(gpu)?;
                self.sync_state(node);
                self.mig[gpu].ci(gi, ci).ok_or(rc::INVALID_ARGUMENT)?;
                Ok(Dev::Mig { gpu, gi, ci })
            }
            _ => Err(rc::INVALID_ARGUMENT),
        }
    }

    /// Resolves a handle that must be a physical GPU; MIG devices do not support the call.
    pub fn gpu(&mut self, node: &Node, handle: usize) -> Res<usize> {
        match self.device(node, handle)? {
            Dev::Gpu(i) => Ok(i),
            Dev::Mig { .. } => Err(rc::NOT_SUPPORTED),
        }
    }

    /// Resolves a GPU-instance handle to `(gpu, gi id)`.
    pub fn gpu_instance(&mut self, node: &Node, handle: usize) -> Res<(usize, u32)> {
        let Some(Obj::GpuInstance { gpu, gi }) = self.registry.lookup(handle) else {
            return Err(rc::INVALID_ARGUMENT);
        };
        self.alive(gpu)?;
        self.sync_state(node);
        self.mig[gpu].gi(gi).ok_or(rc::INVALID_ARGUMENT)?;
        Ok((gpu, gi))
    }

    /// Resolves a compute-instance handle to `(gpu, gi id, ci id)`.
    pub fn compute_instance(&mut self, node: &Node, handle: usize) -> Res<(usize, u32, u32)> {
        let Some(Obj::ComputeInstance { gpu, gi, ci }) = self.registry.lookup(handle) else {
            return Err(rc::INVALID_ARGUMENT);
        };
        self.alive(gpu)?;
        self.sync_state(node);
        self.mig[gpu].ci(gi, ci).ok_or(rc::INVALID_ARGUMENT)?;
        Ok((gpu, gi, ci))
    }

    /// A new, empty event set and its handle.
    pub fn create_event_set(&mut self) -> usize {
        let id = self.next_event_set;
        self.next_event_set += 1;
        self.event_sets.insert(id, Arc::new(EventSet::default()));
        self.registry.handle(Obj::EventSet(id))
    }

    pub fn event_set(&self, handle: usize) -> Res<Arc<EventSet>> {
        match self.registry.lookup(handle) {
            Some(Obj::EventSet(id)) => self
                .event_sets
                .get(&id)
                .cloned()
                .ok_or(rc::INVALID_ARGUMENT),
            _ => Err(rc::INVALID_ARGUMENT),
        }
    }

    /// Frees a set: later waits on it fail, its handle is retired.
    pub fn free_event_set(&mut self, handle: usize) -> Res {
        let Some(Obj::EventSet(id)) = self.registry.lookup(handle) else {
            return Err(rc::INVALID_ARGUMENT);
        };
        if let Some(set) = self.event_sets.remove(&id) {
            set.close();
        }
        self.registry.forget(Obj::EventSet(id));
        Ok(())
    }

    /// A new, empty GPM sample and its handle.
    pub fn alloc_gpm_sample(&mut self) -> usize {
        let id = self.next_gpm_sample;
        self.next_gpm_sample += 1;
        self.gpm_samples.insert(id, GpmSample::Empty);
        self.registry.handle(Obj::GpmSample(id))
    }

    /// The sample behind a handle, for reading or filling.
    pub fn gpm_sample(&mut self, handle: usize) -> Res<&mut GpmSample> {
        match self.registry.lookup(handle) {
            Some(Obj::GpmSample(id)) => self.gpm_samples.get_mut(&id).ok_or(rc::INVALID_ARGUMENT),
            _ => Err(rc::INVALID_ARGUMENT),
        }
    }

    /// Frees a GPM sample; its handle is retired.
    pub fn free_gpm_sample(&mut self, handle: usize) -> Res {
        let Some(Obj::GpmSample(id)) = self.registry.lookup(handle) else {
            return Err(rc::INVALID_ARGUMENT);
        };
        self.gpm_samples.remove(&id);
        self.registry.forget(Obj::GpmSample(id));
        Ok(())
    }

    /// The NVLinks of a GPU that are trained and up now.
    pub fn links_up(&self, node: &Node, gpu: usize) -> Vec<u32> {
        node.gpus[gpu]
            .links
            .iter()
            .zip(&self.faults[gpu].link_up)
            .enumerate()
            .filter(|(_, (link, up))| **up && link.remote != crate::node::Remote::None)
            .map(|(i, _)| i as u32)
            .collect()
    }

    fn close_event_sets(&mut self) {
        for (id, set) in self.event_sets.drain() {
            set.close();
            self.registry.forget(Obj::EventSet(id));
        }
    }

    /// The event sets that exist now, to deliver to once the runtime lock is released.
    fn sets(&self) -> Vec<Arc<EventSet>> {
        self.event_sets.values().cloned().collect()
    }

    /// Finds the GPU (and MIG instance) a control command names.
    fn resolve(
        &mut self,
        node: &Node,
        target: &Target,
    ) -> Result<(usize, Option<(u32, u32)>), String> {
        match target {
            Target::Index(i) if *i < node.gpus.len() => Ok((*i, None)),
            Target::Index(i) => Err(format!("no GPU {i} (the fixture has {})", node.gpus.len())),
            Target::Uuid(uuid) if uuid.starts_with("MIG-") => {
                self.sync_state(node);
                for gpu in &node.gpus {
                    for (gi, ci) in self.mig[gpu.index].mig_devices() {
                        if mig_uuid(&gpu.uuid, gi, ci) == *uuid {
                            return Ok((gpu.index, Some((gi, ci))));
                        }
                    }
                }
                Err(format!("no MIG device {uuid}"))
            }
            // A GPU UUID, or its PCI bus id in either spelling (what `nvidia-smi -i` takes).
            Target::Uuid(uuid) => node
                .gpu_by_uuid(uuid)
                .or_else(|| {
                    node.gpus.iter().find(|g| {
                        g.address.bus_id().eq_ignore_ascii_case(uuid)
                            || g.address.bus_id_legacy().eq_ignore_ascii_case(uuid)
                    })
                })
                .map(|g| (g.index, None))
                .ok_or_else(|| format!("no GPU {uuid}")),
            Target::Instance { gpu, gi } => {
                let (index, attributed) = self.resolve(node, gpu)?;
                if attributed.is_some() {
                    return Err(format!(
                        "/gi{gi} after a MIG device UUID, which names its GPU instance already"
                    ));
                }
                self.sync_state(node);
                self.mig[index]
                    .gi(*gi)
                    .ok_or_else(|| format!("GPU {index} has no GPU instance {gi}"))?;
                Ok((index, Some((*gi, 0))))
            }
        }
    }

    /// Applies one control command. State effects always happen; the event to deliver is
    /// returned only when `live` (a line appended after init), because a driver does not
    /// deliver events from before a consumer subscribed.
    fn apply(
        &mut self,
        node: &Node,
        cmd: &Command,
        live: bool,
        now_us: u64,
    ) -> Result<Option<Event>, String> {
        let (gpu, attributed) = self.resolve(node, cmd.target())?;
        let (gi, ci) = attributed.unwrap_or((NO_INSTANCE, NO_INSTANCE));
        let event = |event_type: u32, data: u64, instance: (u32, u32)| Event {
            gpu,
            event_type: event_type as u64,
            data,
            gpu_instance: instance.0,
            compute_instance: instance.1,
        };
        let f = &mut self.faults[gpu];
        let emitted = match cmd {
            Command::Xid { code, instance, .. } => {
                f.last_xid = Some(*code);
                if f.recovery_action == 0 {
                    f.recovery_action = recovery_action_after(*code);
                }
                Some(event(
                    b::nvmlEventTypeXidCriticalError,
                    *code,
                    instance.unwrap_or((gi, ci)),
                ))
            }
            Command::Sbe(_) => {
                f.sbe_volatile += 1;
                f.sbe_aggregate += 1;
                Some(event(b::nvmlEventTypeSingleBitEccError, 0, (gi, ci)))
            }
            Command::Dbe(_) => {
                f.dbe_volatile += 1;
                f.dbe_aggregate += 1;
                Some(event(b::nvmlEventTypeDoubleBitEccError, 0, (gi, ci)))
            }
            Command::Lost(_) => {
                f.lost = true;
                None
            }
            Command::Recover(_) => {
                f.reset();
                None
            }
            Command::RemapPending(_) => {
                f.remapped_uncorrectable += 1;
                f.remap_pending = true;
                let n = f.retired_pages.len() as u64;
                f.retired_pages.push(RetiredPage {
                    address: 0x0000_0002_0000_0000 + (gpu as u64) * 0x1000_0000 + n * 0x20_0000,
                    timestamp_us: now_us,
                    cause: b::nvmlPageRetirementCause_enum_NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR,
                });
                f.pages_pending = true;
                None
            }
            Command::RemapFailure(_) => {
                f.remap_failure = true;
                None
            }
            Command::NvLink { link, up, .. } => {
                let count = f.link_up.len();
                let slot = f
                    .link_up
                    .get_mut(*link as usize)
                    .ok_or_else(|| format!("GPU {gpu} has {count} NVLinks"))?;
                *slot = *up;
                None
            }
            Command::Temp { celsius, .. } => {
                f.temperature_override = *celsius;
                None
            }
            Command::EccPending { on, .. } => {
                f.ecc_pending = Some(*on);
                None
            }
            Command::PcieLink { link, .. } => {
                f.pcie_link = *link;
                None
            }
            Command::MigFail { op, kill, fail, .. } => {
                if *fail {
                    f.mig_fail.insert(op.clone(), *kill);
                } else {
                    f.mig_fail.remove(op);
                }
                None
            }
            Command::Process {
                pid,
                running,
                usage,
                ..
            } => {
                if *running {
                    let process = GpuProcess {
                        usage: *usage,
                        gpu_instance: attributed.map(|(gi, _)| gi),
                    };
                    f.processes.insert(*pid, process);
                } else {
                    f.processes.remove(pid);
                }
                None
            }
            Command::RecoveryAction { action, .. } => {
                f.recovery_action = *action;
                None
            }
            Command::Reset(_) => {
                f.reset();
                if live {
                    self.apply_pending_mig_mode(node, gpu);
                    self.drop_instances(node, gpu);
                }
                None
            }
        };
        Ok(emitted.filter(|_| live))
    }

    /// What a GPU reset does to the MIG devices of a GPU that stays in MIG mode: they are gone
    /// (GPU and compute instances do not survive a reset; the mode does).
    pub fn drop_instances(&mut self, node: &Node, gpu: usize) {
        self.sync_state(node);
        let mig = &mut self.mig[gpu];
        if !mig.gpu_instances.is_empty() {
            mig.gpu_instances.clear();
            self.persist(node);
        }
    }

    /// What a GPU reset does to MIG: the pending mode becomes current, dropping instances.
    pub fn apply_pending_mig_mode(&mut self, node: &Node, gpu: usize) {
        self.sync_state(node);
        let mig = &mut self.mig[gpu];
        if mig.pending != mig.current {
            mig.current = mig.pending;
            mig.gpu_instances.clear();
            self.persist(node);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Session
// ---------------------------------------------------------------------------------------------

/// The control watcher while it runs: its stop flag and its thread (which hands back the
/// tail position when it ends, so a later init resumes where it stopped).
#[derive(Debug)]
struct Watcher {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<Tail>,
}

/// One loaded fixture and its runtime state.
#[derive(Debug)]
pub struct Session {
    pub config: Config,
    pub node: Node,
    rt: Mutex<Runtime>,
    /// The control file position while no watcher is running.
    tail: Mutex<Option<Tail>>,
    watcher: Mutex<Option<Watcher>>,
}

/// Locks a mutex, recovering from poisoning: a panic caught at the C boundary must not make
/// every later call fail.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Session {
    pub fn lock(&self) -> MutexGuard<'_, Runtime> {
        lock(&self.rt)
    }

    /// Seconds on the mock clock.
    pub fn now(&self) -> u64 {
        match self.config.clock {
            Some(t) => t,
            None => clock_origin().elapsed().as_secs(),
        }
    }

    /// Microseconds since the epoch for timestamps: derived from the pinned clock when there
    /// is one, real time otherwise.
    pub fn timestamp_us(&self) -> u64 {
        match self.config.clock {
            Some(t) => (PINNED_EPOCH_S + t) * 1_000_000,
            None => SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_micros() as u64),
        }
    }

    /// A telemetry probe for GPU `gpu` now.
    pub fn probe(&self, gpu: usize) -> Probe<'_> {
        Probe {
            seed: self.node.seed,
            gpu: &self.node.gpus[gpu],
            t: self.now(),
        }
    }

    fn apply_line(&self, line: &str, live: bool) {
        let origin = self
            .config
            .control
            .as_ref()
            .map_or(String::new(), |p| p.display().to_string());
        let mut rt = self.lock();
        let result = match crate::hang::command(line) {
            Some(applied) => applied.map(|()| None),
            None => match control::parse_line(line) {
                Ok(None) => Ok(None),
                Ok(Some(cmd)) => rt.apply(&self.node, &cmd, live, self.timestamp_us()),
                Err(e) => Err(e),
            },
        };
        match result {
            Ok(Some(event)) => {
                let sets = rt.sets();
                // A delivery may wait for a consumer to make room, and the consumer needs the
                // runtime lock to reach its set: deliver without holding it.
                drop(rt);
                for set in sets {
                    set.deliver(&event);
                }
            }
            Ok(None) => {}
            Err(e) => rt.warn_once(format!(
                "control file {origin}: skipping {:?}: {e}",
                line.trim()
            )),
        }
    }

    /// Rebuilds fault state from the whole control file, without events.
    fn replay(&self, tail: &mut Tail) {
        {
            let mut rt = self.lock();
            rt.faults = self.node.gpus.iter().map(Faults::new).collect();
        }
        if let Growth::Lines(lines) = tail.poll() {
            for line in &lines {
                self.apply_line(line, false);
            }
        }
    }

    fn start_watcher(self: &Arc<Self>) {
        let Some(tail) = lock(&self.tail).take() else {
            return;
        };
        let stop = Arc::new(AtomicBool::new(false));
        let session = Arc::clone(self);
        let flag = Arc::clone(&stop);
        let spawned = std::thread::Builder::new()
            .name("nvml-mock-control".into())
            .spawn(move || session.watch(tail, &flag));
        match spawned {
            Ok(thread) => *lock(&self.watcher) = Some(Watcher { stop, thread }),
            Err(e) => warn(&format!("cannot start the control watcher: {e}")),
        }
    }

    fn watch(&self, mut tail: Tail, stop: &AtomicBool) -> Tail {
        while !stop.load(Ordering::Acquire) {
            match tail.poll() {
                Growth::Lines(lines) => {
                    for line in &lines {
                        self.apply_line(line, true);
                    }
                }
                Growth::Truncated => self.replay(&mut tail),
            }
            std::thread::sleep(CONTROL_POLL);
        }
        tail
    }

    /// Stops the watcher and keeps its position; called at the last shutdown, so that no
    /// thread runs inside the library once its user is done with it.
    fn stop_watcher(&self) {
        let Some(w) = lock(&self.watcher).take() else {
            return;
        };
        w.stop.store(true, Ordering::Release);
        match w.thread.join() {
            Ok(tail) => *lock(&self.tail) = Some(tail),
            Err(_) => warn("the control watcher panicked"),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Init and shutdown
// ---------------------------------------------------------------------------------------------

#[derive(Debug)]
struct Driver {
    refcount: u32,
    session: Option<Arc<Session>>,
    /// Set by the Rust test hook; used instead of the environment at the next first init.
    next_config: Option<Config>,
}

static DRIVER: Mutex<Driver> = Mutex::new(Driver {
    refcount: 0,
    session: None,
    next_config: None,
});

static CLOCK_ORIGIN: OnceLock<Instant> = OnceLock::new();

fn clock_origin() -> Instant {
    *CLOCK_ORIGIN.get_or_init(Instant::now)
}

/// Builds a session: loads and validates the fixture, applies the state file, replays the
/// control file's existing lines (state effects only).
fn open(config: Config) -> Result<Arc<Session>, String> {
    let node = fixture::load(config.fixture.as_deref()).map_err(|e| e.to_string())?;
    let mut rt = Runtime::new(&node);
    if let Some(path) = &config.state {
        rt.store = Some(StateStore::new(path));
        rt.load_state(&node, true)?;
    }
    let tail = config.control.as_deref().map(Tail::new);
    let session = Arc::new(Session {
        config,
        node,
        rt: Mutex::new(rt),
        tail: Mutex::new(None),
        watcher: Mutex::new(None),
    });
    if let Some(mut tail) = tail {
        session.replay(&mut tail);
        *lock(&session.tail) = Some(tail);
    }
    Ok(session)
}

/// `nvmlInit_v2` / `nvmlInitWithFlags`: the first call of a process (or the first after the
/// last shutdown) reads the configuration; later calls only count.
pub fn init() -> u32 {
    clock_origin();
    let mut d = lock(&DRIVER);
    if d.refcount > 0 {
        d.refcount += 1;
        return rc::SUCCESS;
    }
    let config = d.next_config.take().unwrap_or_else(Config::from_env);
    let reuse = d.session.as_ref().filter(|s| s.config == config).cloned();
    let session = match reuse {
        Some(s) => {
            s.lock().sync_state(&s.node);
            s
        }
        None => match open(config) {
            Ok(s) => s,
            Err(e) => {
                warn(&e);
                return rc::UNKNOWN;
            }
        },
    };
    session.start_watcher();
    d.session = Some(session);
    d.refcount = 1;
    rc::SUCCESS
}

/// `nvmlShutdown`: the last one closes event sets (waking their waiters) and stops the
/// watcher; the session itself is kept so a re-init with the same settings hands out the same
/// handles.
pub fn shutdown() -> u32 {
    let mut d = lock(&DRIVER);
    if d.refcount == 0 {
        return rc::UNINITIALIZED;
    }
    d.refcount -= 1;
    if d.refcount == 0
        && let Some(s) = d.session.clone()
    {
        s.lock().close_event_sets();
        s.stop_watcher();
    }
    rc::SUCCESS
}

/// The current session, or `NVML_ERROR_UNINITIALIZED`.
pub fn session() -> Res<Arc<Session>> {
    let d = lock(&DRIVER);
    match (&d.session, d.refcount) {
        (Some(s), n) if n > 0 => Ok(Arc::clone(s)),
        _ => Err(rc::UNINITIALIZED),
    }
}

/// Runs `f` with the session and its locked runtime.
pub fn with<R>(f: impl FnOnce(&Session, &mut Runtime) -> Res<R>) -> Res<R> {
    let s = session()?;
    let mut rt = s.lock();
    f(&s, &mut rt)
}

/// Hooks for Rust tests that link the library directly: they configure sessions without
/// touching the process environment, which tests running in parallel threads share.
#[doc(hidden)]
pub mod testing {
    use super::*;

    /// Uses `config` instead of the environment at the next first `nvmlInit`.
    pub fn configure(config: Config) {
        lock(&DRIVER).next_config = Some(config);
    }

    /// Drops every session and reference, as if the library had just been loaded.
    pub fn reset() {
        let mut d = lock(&DRIVER);
        if let Some(s) = d.session.take() {
            s.lock().close_event_sets();
            s.stop_watcher();
        }
        d.refcount = 0;
        d.next_config = None;
    }

    /// The last XID injected on a GPU (NVML has no call for it).
    pub fn last_xid(gpu: usize) -> Option<u64> {
        let s = session().ok()?;
        let rt = s.lock();
        rt.faults.get(gpu).and_then(|f| f.last_xid)
    }
}

/// The recovery action (NVML field 230) a driver of R550 or newer asks for after `xid`, as the
/// immediate action of NVIDIA's XID catalog says: a GPU reset (1) for the errors a reset
/// clears, a node reboot (2) for a GPU that fell off the bus; nothing for the rest. A `reset`
/// or `recover` line puts it back to none, which is how gpud sees a reset that left the GPU
/// answering throughout.
fn recovery_action_after(xid: u64) -> u32 {
    match xid {
        48 | 64 | 95 | 119 | 120 => 1,
        79 => 2,
        _ => 0,
    }
}
