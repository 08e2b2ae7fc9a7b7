//! Driving NVIDIA's `nvidia-cuda-mps-control`, whoever asks for a daemon: the device plugin's
//! MPS subsystem (one daemon per MPS-shared resource, [`crate::mps`]) and the DRA plugin (one
//! daemon per claim, [`crate::dra`]) start, probe and stop their daemons through this module,
//! so both take the same steps in the same order.
//!
//! One job per file: [`layout`] (NVIDIA's host layout under `mpsRoot` and the `.started`
//! markers, shared with the device plugin), [`control`] (running the binary with a daemon's environment),
//! [`server`] (one daemon's start sequence: compute mode, folders, `-d`, the wait for an
//! answer, the limits; and `quit`) and [`shm`] (the shared-memory tmpfs clients use).

pub mod control;
pub mod layout;
pub mod server;
pub mod shm;
