//! The MIG manager: mig-parted's config files applied, asserted, exported and planned.
//!
//! - [`spec`]: the `version: v1` config schema and its validation; [`profile`]: profile names.
//! - [`select`]: which entry applies to which GPU (device filters, indices).
//! - [`live`]: a GPU's layout in config terms; [`export`] and [`assert`] build on it.
//! - [`generate`]: the `all-*` configs for the GPUs present, from their profile tables.
//! - [`placement`]: the exact placement solver; [`plan`]: per-GPU changes, touching nothing.
//! - [`apply`]: executes plans, in mig-parted's order, with [`hooks`].
//! - [`reconcile`]: follows the Node's `nvidia.com/mig.config` label (a daemon subsystem).
//!
//! NVML is reached only through [`crate::nvml::mig_admin`].

pub mod apply;
pub mod assert;
pub mod export;
pub mod generate;
pub mod hooks;
pub mod live;
pub mod placement;
pub mod plan;
pub mod profile;
pub mod reconcile;
pub mod select;
pub mod spec;

use std::path::Path;

use spec::{Source, Spec, SpecError};

/// Reads a config from `path`, or from stdin for `-` (with the same size and nesting limits).
pub fn load(path: &Path) -> Result<Spec, SpecError> {
    if path == Path::new("-") {
        let text = crate::files::read_yaml(Path::new("/dev/stdin"))?;
        return Spec::parse(&text, &Source::Stdin);
    }
    Spec::load(path)
}
