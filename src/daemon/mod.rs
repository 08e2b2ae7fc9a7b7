//! The daemon core: one shape for every long-running subsystem, one supervisor for every applet.
//!
//! A subsystem (device plugin, labeller, exporter, health watcher, rescanner, …) is a name plus
//! [`Subsystem::run`]`(ctx, inventory)`. The [`Context`] carries what every subsystem needs from
//! the process: cancellation, a readiness latch, the settings it re-reads on SIGHUP, a
//! tracing span named after it, so every log line says which subsystem wrote it, and a
//! spawner for its helper tasks ([`Helpers`]): a helper that stops before the daemon does
//! marks its subsystem failed on `/readyz` while the rest keeps serving.
//!
//! [`Daemon`] is the supervisor every long-running applet uses: `gpud run` adds every
//! subsystem, each standalone applet the few it needs. It starts them, reports readiness on
//! `/readyz` (and to systemd), fans SIGHUP out through one reloaded configuration, stops
//! everything with one grace period, and turns one [`Error`] type into the exit code.
//!
//! Signals come first: [`signals::block`] runs before anything else in `main`, so a SIGHUP or
//! SIGTERM that arrives while the applet is still reading its config or opening NVML waits
//! for the supervisor's handlers instead of killing the process.

pub mod address_space;
mod admin;
mod context;
mod error;
pub mod file_watch;
mod helpers;
mod notify;
pub mod poll;
mod readiness;
mod rescan;
pub mod signals;
mod subsystem;
mod successor;
mod supervisor;

pub use admin::{Admin, DEFAULT_HEALTH_PORT, routes as admin_routes};
pub use context::{Context, ReadyLatch};
pub use error::{Error, exit_code};
pub use helpers::{Helpers, Outcome};
pub use readiness::{Readiness, State};
pub use subsystem::Subsystem;
pub use supervisor::Daemon;

/// Gives a [`Subsystem`] impl its name and its tracing span from one literal (a span's name
/// must be known at compile time). The span is at ERROR level so that it is enabled whenever
/// any line is logged: a `GPUD_LOG=warn` line still says which subsystem wrote it.
#[macro_export]
macro_rules! subsystem_name {
    ($name:literal) => {
        fn name(&self) -> &'static str {
            $name
        }

        fn span(&self) -> ::tracing::Span {
            ::tracing::error_span!($name)
        }
    };
}
