//! gpud's HTTP server: any axum [`Router`](axum::Router) served over HTTP/1.1 on the tokio
//! runtime, with bounds on what a client can hold. The exporter serves `/metrics` through it;
//! the daemon's admin endpoint (`/healthz`, `/readyz`) can too.
//!
//! # Bounds
//!
//! A connection is always in one of three phases ([`activity::Phase`]):
//!
//! * **head**: from accept, and from the first byte of a new request, until the request head is
//!   complete. It may last [`Limits::header_read_timeout`]; more bytes do not extend it, so a
//!   client that trickles a head (slowloris) is closed like one that sends nothing.
//! * **busy**: a request is being answered. Not timed: the handlers answer from memory, and once
//!   the response's last frame is handed to hyper the connection is idle again, so a client that
//!   stops reading is bounded by the idle timeout.
//! * **idle**: between requests on a keep-alive connection, for at most
//!   [`Limits::idle_timeout`].
//!
//! At most [`Limits::max_connections`] connections are open, fewer when the file-descriptor
//! limit is low ([`fd_limit::connection_cap`]): the kubelet's sockets, NVML and the rest of the
//! process share the descriptor table, and a port anyone can connect to must not exhaust it.
//! At the cap a new connection closes the open connection that has been waiting longest
//! without a request in progress (evicted), so idle or hostile sockets cannot lock a scraper
//! out; when every open connection is answering a request, the new one is closed at once
//! (refused). Each of these outcomes is counted in [`Stats`].
//!
//! On cancellation the listener closes, idle connections close, and requests in progress are
//! answered; connections still open after [`server::DRAIN_TIMEOUT`] are dropped.

pub mod activity;
pub mod args;
mod connection;
pub mod fd_limit;
pub mod listen;
pub mod mirror;
mod registry;
pub mod server;
pub mod stats;

use std::time::Duration;

pub use args::HttpArgs;
pub use fd_limit::raise_fd_limit;
pub use listen::{ListenError, bind, parse_address};
pub use server::serve;
pub use stats::{Stats, StatsSnapshot};

/// How much a client may take of the server. See the module documentation for what each
/// bound means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// How long a connection may take to send a whole request head, counted from accept or from
    /// the first byte of the request. Default 10 s.
    pub header_read_timeout: Duration,
    /// How long a keep-alive connection may wait between two requests. Default 60 s: longer
    /// than Prometheus' usual scrape intervals (15 s to 30 s), so a scraper keeps its connection.
    pub idle_timeout: Duration,
    /// Most connections open at once; lowered when the file-descriptor limit would not leave
    /// room for the rest of the process. Default 512.
    pub max_connections: usize,
}

/// [`Limits::header_read_timeout`]'s default.
pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// [`Limits::idle_timeout`]'s default.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// [`Limits::max_connections`]' default: far more than the scrapers of a node (one to a few
/// Prometheus servers), and half a systemd service's usual 1024 descriptors.
pub const DEFAULT_MAX_CONNECTIONS: usize = 512;

impl Default for Limits {
    fn default() -> Self {
        Limits {
            header_read_timeout: DEFAULT_HEADER_READ_TIMEOUT,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            max_connections: DEFAULT_MAX_CONNECTIONS,
        }
    }
}
