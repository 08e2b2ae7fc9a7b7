//! What a check sees: the run's options, what NVML said, and the host root.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use super::host::HostRoot;
use crate::doctor_report::Verdict;
use crate::inventory::Snapshot;
use crate::nvml::GpuPreflight;
use crate::nvml::mig_admin::MigGpu;

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
    /// mig-parted config file the node follows (`mig.config`); NVML's MIG layout is read only
    /// when it is given.
    pub mig_config: Option<PathBuf>,
    /// The config label selected in it; without it, the one the reconciler last followed.
    pub mig_selected: Option<String>,
    /// The reconciler's state directory (its last state and reason).
    pub mig_state_dir: PathBuf,
    /// The UID MPS workloads run as (`mps.uid`); `None` skips that check.
    pub mps_workload_uid: Option<u32>,
    /// The GPUs (NVML indices) the per-GPU checks judge; empty: every GPU.
    pub gpus: Vec<u32>,
    /// The inventory as the health watcher of this process last published it (the doctor
    /// inside `gpud run`): `gpu.xid` then reports the watcher's verdicts rather than judging
    /// the kernel log again. `None` in `gpud doctor`, which has no watcher.
    pub watched: Option<Arc<Snapshot>>,
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
            mig_config: None,
            mig_selected: None,
            mig_state_dir: PathBuf::from(crate::mig_state::DEFAULT_STATE_DIR),
            mps_workload_uid: None,
            gpus: Vec::new(),
            watched: None,
        }
    }
}

/// The `--gpu` indices NVML does not list, and the ones it lists.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Unlisted {
    pub named: Vec<u32>,
    pub listed: Vec<u32>,
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
        /// The MIG layout in mig-parted's terms; read only for `mig.config`.
        mig: Result<Arc<Vec<MigGpu>>, String>,
        /// GPUs `--gpu` names that NVML does not list: a mistyped index, not a driver fault.
        unlisted: Unlisted,
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

    /// The MIG layout, when it was read and NVML answered; `Err` says why not.
    pub fn mig_gpus(&self) -> Result<&[MigGpu], String> {
        match &self.driver {
            Driver::Loaded { mig, .. } => mig.as_ref().map(|g| g.as_slice()).map_err(Clone::clone),
            Driver::Unavailable(why) => Err(why.clone()),
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
