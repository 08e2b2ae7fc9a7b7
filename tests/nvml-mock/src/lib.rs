//! A simulated `libnvidia-ml.so.1`.
//!
//! Built as a cdylib, this crate exports the NVML C API that gpud (through nvml-wrapper) and
//! NVIDIA's Python bindings call, answering from a fixture that describes a whole node instead
//! of from a driver. It simulates telemetry as a pure function of time, MIG reconfiguration
//! with the real placement rules (persisted across processes), and faults injected at run time
//! through a control file. `README.md` documents the environment variables, fixture schema
//! and control commands.
//!
//! Built as an rlib, the same exports can be called directly from Rust tests.

#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used, clippy::panic))]

pub mod api;
pub mod control;
pub mod driver;
pub mod events;
pub mod faults;
pub mod ffi;
pub mod fixture;
pub mod gpm;
pub mod hang;
pub mod jsonpath;
pub mod mig;
pub mod models;
pub mod node;
pub mod profiles;
pub mod registry;
pub mod state;
pub mod telemetry;
pub mod topology;

pub use api::*;
