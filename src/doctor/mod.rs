//! `gpud doctor`: a node preflight that says what is wrong and what to do about it.
//!
//! Every check runs on its own thread with a deadline, so a driver call that hangs on a sick
//! GPU turns that one check into a `fail` instead of hanging the doctor. NVML is read once, up
//! front and under the same deadline ([`runner::gather`]); checks then judge those facts and the
//! host's files, read through [`host::HostRoot`] so a container with the host mounted elsewhere
//! sees the host, not itself.
//!
//! The result is a [`Report`] (JSON schema `gpud.doctor/v1`, `docs/doctor.md`). `gpud run`
//! repeats it on an interval ([`service::PeriodicDoctor`]) and keeps the latest in a
//! [`crate::doctor_report::LatestReport`], which the admin endpoint serves at `/doctor` and other subsystems
//! may read. A check whose thread from an earlier run still hangs is not started again
//! ([`busy::Busy`]), so repeating the doctor never piles up abandoned threads.

pub mod bundle;
pub mod busy;
pub mod checks;
pub mod env;
pub mod host;
pub mod render;
pub mod runner;
pub mod select;
pub mod service;
pub mod validations;

pub use crate::doctor_report::{CheckResult, Report, SCHEMA, Status, Verdict};
pub use env::Options;
pub use runner::run;
