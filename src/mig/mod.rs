//! The MIG manager: mig-parted's config files applied, asserted, exported and planned.
//!
//! - the config file, which entry applies to which GPU and whether the GPUs match it are
//!   [`crate::mig_config`], which the doctor reads too;
//! - [`export`]: the GPUs' layout as a config file.
//! - [`generate`]: the `all-*` configs for the GPUs present, from their profile tables.
//! - [`placement`]: the exact placement solver; [`plan`]: per-GPU changes, touching nothing.
//! - [`apply`]: executes plans, in mig-parted's order, with [`hooks`].
//! - [`reconcile`]: follows the Node's `nvidia.com/mig.config` label (a daemon subsystem).
//!
//! NVML is reached only through [`crate::nvml::mig_admin`].

pub mod apply;
pub mod export;
pub mod generate;
pub mod hooks;
pub mod placement;
pub mod plan;
pub mod reconcile;
