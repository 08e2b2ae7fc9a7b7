//! Process signals, handled before anything else can be hurt by them.
//!
//! SIGHUP's default action kills a process, and a `systemctl reload` can come at any moment,
//! even while an applet is still parsing its flags or opening NVML. So `main` blocks SIGHUP,
//! SIGTERM and SIGINT as its very first step ([`block`]): a signal that arrives early stays
//! pending. Every thread started afterwards inherits the mask, so none of them takes the
//! signal. The supervisor installs its handlers and then unblocks the signals on its own
//! thread ([`Signals::install`]); whatever was pending is delivered to the handlers at that
//! moment — an early SIGHUP becomes a reload, an early SIGTERM a clean stop. Applets that are
//! not daemons give the default actions back at once ([`unblock`]). A child process inherits
//! the mask of the thread that spawns it (seen with `gpud mps-control-daemon`'s children on
//! Linux), so code that starts long-lived children calls [`unblock`] on its thread first.

use nix::sys::signal::{SigSet, SigmaskHow, Signal, pthread_sigmask};
use tokio::signal::unix::{SignalKind, signal};

/// The signals the supervisor handles.
fn handled() -> SigSet {
    let mut set = SigSet::empty();
    set.add(Signal::SIGHUP);
    set.add(Signal::SIGTERM);
    set.add(Signal::SIGINT);
    set
}

/// Blocks the handled signals on the calling thread (call it first thing in `main`, before
/// any other thread exists). Failing to block only reopens the early window; it is not fatal.
pub fn block() {
    let _ = pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&handled()), None);
}

/// Gives the handled signals back to the calling thread (their default actions, or the
/// handlers installed meanwhile).
pub fn unblock() {
    let _ = pthread_sigmask(SigmaskHow::SIG_UNBLOCK, Some(&handled()), None);
}

/// What a signal asks the daemon to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Request {
    /// SIGHUP: re-read the configuration.
    Reload,
    /// SIGTERM or SIGINT: stop.
    Stop,
}

/// The supervisor's signal handlers.
#[derive(Debug)]
pub struct Signals {
    hangup: tokio::signal::unix::Signal,
    terminate: tokio::signal::unix::Signal,
    interrupt: tokio::signal::unix::Signal,
}

impl Signals {
    /// Installs the handlers, then unblocks the signals on this thread so that pending ones
    /// are delivered to them. Must run inside the runtime, on the thread that drives the
    /// supervisor.
    pub fn install() -> std::io::Result<Self> {
        let signals = Signals {
            hangup: signal(SignalKind::hangup())?,
            terminate: signal(SignalKind::terminate())?,
            interrupt: signal(SignalKind::interrupt())?,
        };
        unblock();
        Ok(signals)
    }

    /// The next request.
    pub async fn next(&mut self) -> Request {
        tokio::select! {
            _ = self.hangup.recv() => Request::Reload,
            _ = self.terminate.recv() => Request::Stop,
            _ = self.interrupt.recv() => Request::Stop,
        }
    }
}

/// Resolves on the first SIGINT or SIGTERM, for the command-line tools that follow the node
/// (`gpud inventory --watch`) rather than run as daemons. If the handlers cannot be installed
/// it never resolves, and the default actions still stop the process.
pub async fn shutdown() {
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        std::future::pending::<()>().await;
        return;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}
