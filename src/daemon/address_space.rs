//! The address space a daemon needs, checked before it starts, and one line instead of a
//! backtrace when a thread cannot be started later.
//!
//! Under an address-space limit (RLIMIT_AS: `ulimit -v`, or a runtime that sets it from a
//! container's memory limit) too small for a daemon, starting fails wherever the limit is first
//! reached: the NVML library cannot be mapped, tokio panics while starting its worker threads
//! (and can then wait forever for the ones it did start, with SIGTERM still blocked), a
//! subsystem's thread does not start, or an allocation aborts the process. [`check`] compares
//! the limit with what is mapped before any of that and refuses to start with one line.
//!
//! glibc's per-thread malloc arenas reserve 64 MiB of address space each when there is room
//! for one, so between the floor checked here and a limit with room for every arena, whether a
//! daemon starts depends on how many arenas its threads got first. `MALLOC_ARENA_MAX=1` (or
//! `GLIBC_TUNABLES=glibc.malloc.arena_max=1`) in the environment makes it start at any limit
//! above the floor.

use nix::sys::resource::{RLIM_INFINITY, Resource, getrlimit};

use super::Error;

/// Address space a daemon maps after [`check`]: the NVML library, the runtime's worker and
/// blocking threads (2 MiB of stack each; how many blocking threads start depends on timing),
/// the subsystems' own threads and their buffers. Measured for `gpud run` on an 8-GPU
/// simulated node with glibc's arenas limited to one: it starts every time with 20 MiB above
/// what is mapped at this point, only some of the time with 19.
pub const NEEDED_KIB: u64 = 20 * 1024;

/// Refuses to start when the address-space limit leaves less than [`NEEDED_KIB`] above what is
/// mapped now. Without a limit, or when it cannot be read, there is nothing to check.
pub fn check(applet: &str) -> Result<(), Error> {
    let Some(limit) = limit_kib() else {
        return Ok(());
    };
    let Some(mapped) = mapped_kib() else {
        return Ok(());
    };
    let free = limit.saturating_sub(mapped);
    if free >= NEEDED_KIB {
        return Ok(());
    }
    Err(Error::Failure(format!(
        "cannot start: out of memory: the address-space limit (ulimit -v) is {limit} KiB and \
         {mapped} KiB of it is mapped already, leaving {free} KiB where gpud {applet} needs \
         {NEEDED_KIB} KiB: raise the container's memory limit or the ulimit"
    )))
}

/// The soft address-space limit in KiB; `None` when there is none.
fn limit_kib() -> Option<u64> {
    let (soft, _) = getrlimit(Resource::RLIMIT_AS).ok()?;
    (soft != RLIM_INFINITY).then_some(soft / 1024)
}

/// What the process has mapped, in KiB: `VmSize`, the figure the limit applies to.
fn mapped_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    vm_size_kib(&status)
}

fn vm_size_kib(status: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmSize:"))?
        .trim()
        .strip_suffix("kB")?
        .trim()
        .parse()
        .ok()
}

/// Makes a panic about a thread that could not be started one line on stderr instead of a
/// panic message and a backtrace: tokio panics when its blocking pool has no thread and cannot
/// start one, which under a memory or thread limit is the operator's to fix, not a bug. Every
/// other panic is reported as before.
pub fn one_line_for_thread_exhaustion() {
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let text = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied());
        match text.and_then(|t| t.strip_prefix(TOKIO_NO_THREAD)) {
            Some(cause) => eprintln!("gpud: {}", thread_exhaustion(cause)),
            None => report(info),
        }
    }));
}

/// How tokio's panic starts when no thread of its blocking pool could be started.
const TOKIO_NO_THREAD: &str = "OS can't spawn worker thread: ";

fn thread_exhaustion(cause: &str) -> String {
    format!(
        "cannot start a thread: {cause}: out of memory or over a thread limit (ulimit -v, \
         ulimit -u, the container's pids limit): raise the container's limits"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vm_size_is_read_from_the_status_file() {
        let status = "Name:\tgpud\nVmPeak:\t   30000 kB\nVmSize:\t   19456 kB\nVmRSS:\t 4 kB\n";
        assert_eq!(vm_size_kib(status), Some(19456));
        assert_eq!(vm_size_kib("Name:\tgpud\n"), None);
        assert_eq!(vm_size_kib("VmSize:\tlots\n"), None);
    }

    #[test]
    fn a_thread_exhaustion_is_one_line_naming_the_cause() {
        assert_eq!(
            thread_exhaustion("Resource temporarily unavailable (os error 11)"),
            "cannot start a thread: Resource temporarily unavailable (os error 11): out of \
             memory or over a thread limit (ulimit -v, ulimit -u, the container's pids limit): \
             raise the container's limits"
        );
    }
}
