//! Process signals, handled before anything else can be hurt by them.
//!
//! SIGHUP's (and SIGUSR2's) default action kills a process, and a `systemctl reload` can come at any moment,
//! even while an applet is still parsing its flags or opening NVML. So `main` blocks SIGHUP,
//! SIGTERM and SIGINT as its very first step ([`block`]): a signal that arrives early stays
//! pending. Every thread started afterwards inherits the mask, so none of them takes the
//! signal. The supervisor installs its handlers and then unblocks the signals on its own
//! thread ([`Signals::install`]); whatever was pending is delivered to the handlers at that
//! moment — an early SIGHUP becomes a reload, an early SIGTERM a clean stop. Applets that are
//! not daemons give the default actions back at once ([`unblock`]). A child process inherits
//! the mask of the thread that spawns it, so every child gpud starts is started through
//! [`with_default_mask`].

use nix::sys::signal::{SigSet, SigmaskHow, Signal, pthread_sigmask};
use tokio::signal::unix::{SignalKind, signal};

/// The signals the supervisor handles.
fn handled() -> SigSet {
    let mut set = SigSet::empty();
    set.add(Signal::SIGHUP);
    set.add(Signal::SIGTERM);
    set.add(Signal::SIGINT);
    set.add(Signal::SIGUSR2);
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

/// Runs `start`, which starts a child process, with the handled signals unblocked on this
/// thread, then puts the thread's mask back. A child inherits the mask of the thread that
/// forks it, and gpud's threads run with these signals blocked: a control daemon, hook or
/// reset command started from one could not be stopped by SIGTERM (nor `systemctl stop`
/// stop it) and would ignore Ctrl-C. Daemons start children only from subsystems, after the
/// supervisor's handlers are installed, so a signal arriving meanwhile reaches a handler.
pub fn with_default_mask<T>(start: impl FnOnce() -> T) -> T {
    let mut before = SigSet::empty();
    let unblocked =
        pthread_sigmask(SigmaskHow::SIG_UNBLOCK, Some(&handled()), Some(&mut before)).is_ok();
    let result = start();
    if unblocked {
        let _ = pthread_sigmask(SigmaskHow::SIG_SETMASK, Some(&before), None);
    }
    result
}

/// Waits until SIGTERM or SIGINT arrives, with the handled signals blocked on this thread (the
/// caller blocked them before the handlers went away, so one sent meanwhile is pending and
/// ends the wait at once).
pub fn wait_for_stop() {
    block();
    let mut stop = SigSet::empty();
    stop.add(Signal::SIGTERM);
    stop.add(Signal::SIGINT);
    while stop.wait().is_err() {}
}

/// What a signal asks the daemon to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Request {
    /// SIGHUP: re-read the configuration.
    Reload,
    /// SIGTERM or SIGINT: stop.
    Stop,
    /// SIGUSR2: start the installed binary, which takes over (as nginx's binary upgrade).
    Upgrade,
}

/// The supervisor's signal handlers.
#[derive(Debug)]
pub struct Signals {
    hangup: tokio::signal::unix::Signal,
    terminate: tokio::signal::unix::Signal,
    interrupt: tokio::signal::unix::Signal,
    upgrade: tokio::signal::unix::Signal,
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
            upgrade: signal(SignalKind::user_defined2())?,
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
            _ = self.upgrade.recv() => Request::Upgrade,
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The handled signals among a `SigBlk:` mask of /proc/<pid>/status.
    fn handled_bits(status: &str) -> u64 {
        let mask = status
            .lines()
            .find_map(|l| l.strip_prefix("SigBlk:"))
            .map(|hex| u64::from_str_radix(hex.trim(), 16).unwrap())
            .unwrap();
        // SIGHUP = 1, SIGINT = 2, SIGUSR2 = 12, SIGTERM = 15: bit n-1 each.
        mask & (1 | 1 << 1 | 1 << 11 | 1 << 14)
    }

    fn own_status() -> String {
        std::fs::read_to_string("/proc/thread-self/status").unwrap()
    }

    #[test]
    fn children_start_with_the_signals_unblocked_and_the_thread_keeps_its_mask() {
        std::thread::spawn(|| {
            block();
            assert_eq!(handled_bits(&own_status()), 0b100_1000_0000_0011);
            let child = with_default_mask(|| {
                std::process::Command::new("cat")
                    .arg("/proc/self/status")
                    .output()
            })
            .unwrap();
            assert_eq!(handled_bits(&String::from_utf8_lossy(&child.stdout)), 0);
            assert_eq!(handled_bits(&own_status()), 0b100_1000_0000_0011);
        })
        .join()
        .unwrap();
    }
}
