//! gpud's CDI hook (`gpud cdi-hook`, or a link named `nvidia-cdi-hook`): what a container
//! runtime runs at `createContainer` for the hooks of a CDI spec, compatible with the
//! subcommands and flags of NVIDIA's `nvidia-cdi-hook`.
//!
//! Each job is one file: [`state`] finds the container's root from the OCI state on stdin,
//! [`root`] makes every change inside that root through descriptors the kernel resolved inside
//! it, and [`symlinks`], [`chmod`], [`cuda_compat`], [`ldcache`] and [`device_nodes`] are the
//! subcommands. ldconfig, which follows the image's paths itself, runs in [`sandbox`]: the
//! container root as its `/`, no host mount ([`mountinfo`]) and only a static program
//! ([`elf`]), ended by a [`deadline`]. The rootfs is the image's and so untrusted: nothing in it (symlinks, its
//! environment, its `LD_PRELOAD`) can make the hook write outside it or run code on the host.

pub mod chmod;
pub mod cuda_compat;
pub mod deadline;
pub mod device_nodes;
pub mod elf;
pub mod error;
pub mod ldcache;
pub mod mountinfo;
pub mod root;
pub mod sandbox;
pub mod state;
pub mod symlinks;

pub use error::HookError;
pub use root::Root;
