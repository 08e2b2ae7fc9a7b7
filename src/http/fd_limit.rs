//! The open-file limit (`RLIMIT_NOFILE`): raising the soft limit to the hard one at start, and
//! the connection cap that leaves the rest of the process its descriptors.
//!
//! systemd starts services with a soft limit of 1024 (kept low for programs that still use
//! `select(2)`) and a much higher hard limit; gpud waits with epoll and may raise it.

use std::io;

use nix::sys::resource::{RLIM_INFINITY, Resource, getrlimit, setrlimit};

/// Descriptors the HTTP server leaves to everything else in the process (NVML's device files,
/// the kubelet's sockets in `gpud run`, inotify, the kernel log, the listeners) and to
/// connections being closed to make room ([`super::registry::MAX_CLOSING`]). An idle `gpud
/// exporter` holds about a dozen on the simulated driver; the real one adds device files.
pub const RESERVED_FDS: u64 = 128;

/// Where `/proc/sys/fs/nr_open` cannot be read: the kernel's default ceiling.
const DEFAULT_NR_OPEN: u64 = 1 << 20;

/// Raises the soft open-file limit to the hard one (to the kernel's ceiling when the hard limit
/// is unlimited). Returns the soft limit before and after. Call once at start.
pub fn raise_fd_limit() -> Result<(u64, u64), io::Error> {
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE)
        .map_err(|errno| io::Error::other(format!("getrlimit(RLIMIT_NOFILE): {errno}")))?;
    let target = if hard == RLIM_INFINITY {
        std::fs::read_to_string("/proc/sys/fs/nr_open")
            .ok()
            .and_then(|text| text.trim().parse().ok())
            .unwrap_or(DEFAULT_NR_OPEN)
    } else {
        hard
    };
    if soft >= target {
        return Ok((soft, soft));
    }
    setrlimit(Resource::RLIMIT_NOFILE, target, hard).map_err(|errno| {
        io::Error::other(format!(
            "setrlimit(RLIMIT_NOFILE) from {soft} to {target}: {errno}"
        ))
    })?;
    Ok((soft, target))
}

/// The soft open-file limit now; `None` when unlimited or unreadable.
pub fn soft_limit() -> Option<u64> {
    getrlimit(Resource::RLIMIT_NOFILE)
        .ok()
        .map(|(soft, _)| soft)
        .filter(|soft| *soft != RLIM_INFINITY)
}

/// The connection cap: `max_connections`, lowered so that open connections leave
/// [`RESERVED_FDS`] descriptors (half the limit, when the limit is that small) to the rest of
/// the process. At least one.
pub fn connection_cap(max_connections: usize, soft_limit: Option<u64>) -> usize {
    let Some(soft) = soft_limit else {
        return max_connections.max(1);
    };
    let room = soft.saturating_sub(RESERVED_FDS.min(soft / 2));
    let room = usize::try_from(room).unwrap_or(usize::MAX);
    max_connections.min(room).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_leaves_descriptors_to_the_process() {
        assert_eq!(connection_cap(512, Some(1024)), 512);
        assert_eq!(connection_cap(5000, Some(1024)), 1024 - 128);
        assert_eq!(connection_cap(512, Some(200)), 100, "half of a small limit");
        assert_eq!(connection_cap(512, Some(1)), 1);
        assert_eq!(connection_cap(512, None), 512);
        assert_eq!(connection_cap(0, None), 1);
    }

    #[test]
    fn raising_sets_the_soft_limit_to_the_hard_one() {
        let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
        let (before, now) = raise_fd_limit().unwrap();
        assert!(before <= now);
        let (soft, _) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
        assert_eq!(soft, now);
        if hard != RLIM_INFINITY {
            assert_eq!(now, hard);
        }
        assert_eq!(
            raise_fd_limit().unwrap(),
            (now, now),
            "a second call changes nothing"
        );
        assert_eq!(soft_limit(), Some(now).filter(|n| *n != RLIM_INFINITY));
    }
}
