//! The NVML adapter: the only code in gpud that talks to the driver.
//!
//! NVML is opened at run time through nvml-wrapper (dlopen), never linked, so gpud starts on a
//! node without a driver and reports that in one line. The rest of gpud never sees an NVML
//! handle: it reads [`Snapshot`](crate::inventory::Snapshot)s built here. All NVML calls block,
//! sometimes for long (a GPU falling off the bus can stall a call for seconds), so async code
//! runs them with `spawn_blocking` or on a dedicated thread, never on a worker.
//!
//! Every `unsafe` block of gpud lives in [`raw`], each with a `// SAFETY:` comment.

pub mod compute_mode;
mod discover;
mod error;
pub mod events;
pub mod library;
pub mod mig_admin;
mod preflight;
mod probe;
pub mod processes;
// The only module of gpud allowed `unsafe`: the NVML calls nvml-wrapper lacks.
mod health_signals;
#[allow(unsafe_code)]
mod raw;
mod rescan;
pub mod sampling;

use std::path::{Path, PathBuf};

pub use discover::{DEFAULT_MACHINE_TYPE_FILE, NodeFacts};
pub use error::NvmlError;
pub use health_signals::GpuSignals;
pub use preflight::{GpuPreflight, PcieLink};
pub use rescan::{Rescanner, Rescans};

use crate::inventory::{Inventory, Snapshot};

/// Environment variable naming the NVML library to load (same as `--nvml-lib`).
pub const LIB_ENV: &str = "GPUD_NVML_LIB";

/// An initialised NVML library, shared by every subsystem of the process.
///
/// The library is initialised once and kept for the life of the process: NVML event sets
/// borrow it for as long as they wait, and re-initialising costs hundreds of symbol lookups.
#[derive(Debug, Clone)]
pub struct Nvml {
    lib: &'static nvml_wrapper::Nvml,
    path: PathBuf,
}

impl Nvml {
    /// Loads and initialises NVML from `explicit`, or from the usual places when `None`.
    pub fn open(explicit: Option<&Path>) -> Result<Self, NvmlError> {
        let (lib, path) = library::open(explicit)?;
        // Leaked on purpose: one per process, and event sets need a `'static` borrow.
        let lib: &'static nvml_wrapper::Nvml = Box::leak(Box::new(lib));
        Ok(Nvml { lib, path })
    }

    /// The library file that was loaded.
    pub fn library_path(&self) -> &Path {
        &self.path
    }

    /// Reads the whole node. Blocks on the driver.
    pub fn discover(&self, facts: &NodeFacts) -> Result<Snapshot, NvmlError> {
        discover::discover(self.lib, facts)
    }

    /// Discovers the node once and starts an inventory with it. Blocks on the driver: call it
    /// before the runtime starts.
    pub fn inventory(&self, facts: &NodeFacts) -> Result<Inventory, NvmlError> {
        Ok(Inventory::new(self.discover(facts)?))
    }
}
