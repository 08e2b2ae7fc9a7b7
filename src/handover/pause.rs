//! For tests only: stops a new gpud at a named step of its takeover, so that a test can kill
//! it there (SIGKILL) and see what the old one does about a takeover abandoned at that step.
//!
//! `GPUD_TEST_HANDOVER_PAUSE=<step>` makes the taking-over side log
//! `Paused at handover step <step>` and block that step's thread for good; the rest of the
//! process runs on (at `before-stop` every subsystem serves, and the device plugin registers
//! with the kubelet meanwhile). The steps, in their order:
//!
//! - `connected`: connected to the old process's socket, before `hello`;
//! - `hello-sent`: `hello` sent, before the offer is read;
//! - `offer-received`: the old process's sockets and state taken, before any subsystem starts;
//! - `before-stop`: every subsystem serves, before the old process is told to stop.
//!
//! Unset (as everywhere but in tests) it costs one look at the environment per step.

use tracing::warn;

/// The steps a test can pause at, in their order.
pub const STEPS: &[&str] = &["connected", "hello-sent", "offer-received", "before-stop"];

/// The variable that names the step.
pub const VARIABLE: &str = "GPUD_TEST_HANDOVER_PAUSE";

/// Blocks this thread for good if the test asked to pause at `step`.
// A test's knob, read where it acts: it is not configuration a user sets.
#[allow(clippy::disallowed_methods)]
pub fn here(step: &str) {
    debug_assert!(STEPS.contains(&step), "unknown handover step {step}");
    if std::env::var_os(VARIABLE).is_some_and(|wanted| wanted == step) {
        warn!(
            step,
            "Paused at handover step {step} ({VARIABLE} is set: for tests only)"
        );
        loop {
            std::thread::park();
        }
    }
}
