//! Running the checks: NVML's facts gathered once under a deadline, then every selected check
//! on its own thread, each with the same deadline. A check still running at its deadline is
//! reported as `fail` ("did not finish") and its thread is left behind: a thread blocked in
//! the driver cannot be cancelled, only abandoned.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use super::checks::{CATALOG, Check};
use super::host::HostRoot;
use super::report::{CheckResult, Report, Verdict};
use super::select::Selection;
use crate::inventory::Snapshot;
use crate::nvml::{GpuPreflight, NodeFacts, Nvml};

/// The default per-check deadline.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

/// What a doctor run reads and how.
#[derive(Debug, Clone)]
pub struct Options {
    /// The host's root (`/` on the host).
    pub host_root: PathBuf,
    /// The NVML library to load (`None`: the usual search).
    pub nvml_lib: Option<PathBuf>,
    /// The kernel log to read XIDs from; `None`: the host's `/dev/kmsg`.
    pub kmsg: Option<PathBuf>,
    /// gpud's own config file, checked when given.
    pub gpud_config: Option<PathBuf>,
    /// NVIDIA's device plugin / GFD config file, checked when given.
    pub nvidia_config: Option<PathBuf>,
    /// Per-check deadline.
    pub timeout: Duration,
    /// Which checks run.
    pub selection: Selection,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            host_root: PathBuf::from("/"),
            nvml_lib: None,
            kmsg: None,
            gpud_config: None,
            nvidia_config: None,
            timeout: DEFAULT_TIMEOUT,
            selection: Selection::default(),
        }
    }
}

/// What NVML told the doctor.
#[derive(Debug, Clone)]
pub enum Driver {
    /// NVML loaded from this path; discovery and preflight are `Err` with the reason when
    /// they failed or did not answer in time.
    Loaded {
        path: PathBuf,
        snapshot: Result<Arc<Snapshot>, String>,
        preflight: Result<Arc<Vec<GpuPreflight>>, String>,
    },
    /// NVML did not load (or did not answer in time).
    Unavailable(String),
}

/// Everything a check may look at.
#[derive(Debug, Clone)]
pub struct Env {
    pub host: HostRoot,
    pub driver: Driver,
    pub options: Arc<Options>,
}

impl Env {
    /// The discovered node, when NVML answered.
    pub fn snapshot(&self) -> Option<&Snapshot> {
        match &self.driver {
            Driver::Loaded {
                snapshot: Ok(s), ..
            } => Some(s),
            _ => None,
        }
    }

    /// The per-GPU preflight facts, when NVML answered.
    pub fn preflight(&self) -> Option<&[GpuPreflight]> {
        match &self.driver {
            Driver::Loaded {
                preflight: Ok(p), ..
            } => Some(p),
            _ => None,
        }
    }

    /// A skip verdict for a check that needs NVML's answers, saying why there are none.
    pub fn no_nvml(&self) -> Verdict {
        let why = match &self.driver {
            Driver::Unavailable(why) => why.clone(),
            Driver::Loaded {
                snapshot: Err(why), ..
            }
            | Driver::Loaded {
                preflight: Err(why),
                ..
            } => why.clone(),
            Driver::Loaded { .. } => "NVML gave no answer".to_owned(),
        };
        Verdict::skip(format!("needs NVML, which failed: {why} (see driver.nvml)"))
    }
}

/// Starts `work` on a thread of its own; `None` when the thread cannot start.
pub fn start<T: Send + 'static>(
    name: &str,
    work: impl FnOnce() -> T + Send + 'static,
) -> Option<mpsc::Receiver<T>> {
    let (tx, rx) = mpsc::sync_channel(1);
    crate::telemetry::spawn_thread(name, move || {
        let _ = tx.send(work());
    })
    .ok()
    .map(|_| rx)
}

/// Waits for a [`start`]ed result until `deadline`; `None` when it did not come by then (its
/// thread is abandoned).
pub fn wait<T>(started: Option<mpsc::Receiver<T>>, deadline: Instant) -> Option<T> {
    started?
        .recv_timeout(deadline.saturating_duration_since(Instant::now()))
        .ok()
}

/// Loads NVML (when `nvml` is not given) and reads discovery and preflight facts, each bounded
/// by the timeout.
pub fn gather(options: &Options, nvml: Option<Nvml>) -> Driver {
    let timeout = options.timeout;
    let waited = format!(
        "did not answer within {}",
        humantime::format_duration(timeout)
    );
    let nvml = match nvml {
        Some(nvml) => nvml,
        None => {
            let explicit = options.nvml_lib.clone();
            let opened = start("gpud-doctor-nvml", move || {
                Nvml::open(explicit.as_deref()).map_err(|err| err.to_string())
            });
            match wait(opened, Instant::now() + timeout) {
                Some(Ok(nvml)) => nvml,
                Some(Err(why)) => return Driver::Unavailable(why),
                None => return Driver::Unavailable(format!("nvmlInit {waited}")),
            }
        }
    };
    let deadline = Instant::now() + timeout;
    let discovered = start("gpud-doctor-discover", {
        let nvml = nvml.clone();
        move || {
            let facts = NodeFacts {
                node_name: None,
                machine_type_file: None,
            };
            nvml.discover(&facts).map_err(|err| err.to_string())
        }
    });
    let preflight = start("gpud-doctor-preflight", {
        let nvml = nvml.clone();
        move || nvml.preflight()
    });
    let snapshot = wait(discovered, deadline)
        .unwrap_or_else(|| Err(format!("NVML discovery {waited}")))
        .map(Arc::new);
    let preflight = wait(preflight, deadline)
        .map(Arc::new)
        .ok_or_else(|| format!("NVML health queries {waited}"));
    Driver::Loaded {
        path: nvml.library_path().to_path_buf(),
        snapshot,
        preflight,
    }
}

/// Runs the selected checks over `env`, all at once, each bounded by the timeout.
pub fn run_checks(env: &Env) -> Vec<CheckResult> {
    let timeout = env.options.timeout;
    let selected: Vec<&'static Check> = CATALOG
        .iter()
        .filter(|check| env.options.selection.includes(check.id))
        .collect();
    let started = Instant::now();
    let deadline = started + timeout;
    let receivers: Vec<_> = selected
        .iter()
        .map(|check| {
            let (env, run) = (env.clone(), check.run);
            start("gpud-doctor-check", move || {
                let began = Instant::now();
                (run(&env), began.elapsed())
            })
        })
        .collect();
    selected
        .iter()
        .zip(receivers)
        .map(|(check, rx)| {
            let outcome = wait(rx, deadline);
            let (verdict, took) = outcome.unwrap_or_else(|| {
                (
                    Verdict::fail(
                        format!(
                            "did not finish within {} (a driver call or a file read hangs)",
                            humantime::format_duration(timeout)
                        ),
                        "look for a GPU that fell off the bus (dmesg | grep -i xid) or a hung mount; reboot the node if NVML hangs",
                    ),
                    started.elapsed(),
                )
            });
            CheckResult {
                id: check.id.to_owned(),
                group: check.group().to_owned(),
                status: verdict.status,
                found: verdict.found,
                fix: verdict.fix,
                duration_ms: u64::try_from(took.as_millis()).unwrap_or(u64::MAX),
            }
        })
        .collect()
}

/// A whole doctor run: gathers NVML's facts (opening NVML unless `nvml` is given) and runs the
/// selected checks. Blocks; returns within about twice the timeout whatever the driver does.
/// Also returns what NVML said, for the support bundle and the validator's files.
pub fn run(options: Options, nvml: Option<Nvml>) -> (Report, Driver) {
    let host_root = options.host_root.display().to_string();
    let needs_nvml = CATALOG
        .iter()
        .any(|c| c.needs_nvml && options.selection.includes(c.id));
    let driver = if needs_nvml {
        gather(&options, nvml)
    } else {
        Driver::Unavailable("not loaded: no selected check needs it".to_owned())
    };
    let env = Env {
        host: HostRoot::new(options.host_root.clone()),
        driver,
        options: Arc::new(options),
    };
    (Report::new(host_root, run_checks(&env)), env.driver)
}
