//! Drives the exported NVML functions of the rlib the way a C caller would: out-pointers,
//! opaque handles, count protocols, versioned structs, blocking event waits.
//!
//! All tests share the process-wide mock, so each one takes the [`common::start`] guard, which
//! serialises them and begins from a freshly loaded fixture.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;
mod faults;
mod gpm;
mod inventory;
mod mig;
mod processes;
mod telemetry;
