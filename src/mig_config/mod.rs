//! mig-parted's config file and what it says about the GPUs, below the MIG manager and the
//! doctor, which both read it:
//!
//! - [`spec`]: the `version: v1` config schema and its validation; [`profile`]: profile names;
//! - [`select`]: which entry applies to which GPU (device filters, indices);
//! - [`live`]: a GPU's layout in config terms; [`assert`]: whether the GPUs match a config.

pub mod assert;
pub mod live;
pub mod profile;
pub mod select;
pub mod spec;

use std::path::Path;

use spec::{Source, Spec, SpecError};

/// Reads a config from `path`, or from stdin for `-` (with the same size and nesting limits).
pub fn load(path: &Path) -> Result<Spec, SpecError> {
    if path == Path::new("-") {
        let text = crate::files::read_stdin_yaml(Path::new("<stdin>"))?;
        return Spec::parse(&text, &Source::Stdin);
    }
    Spec::load(path)
}
