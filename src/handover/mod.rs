//! Upgrades without a gap: a starting gpud takes over from the one running on the node.
//!
//! The running process serves a handover socket in the state directory
//! ([`socket_of`]`(state_dir, applet)`: each applet of a per-applet deployment hands over its
//! own part). A starting process of the same applet connects, and:
//!
//! 1. receives the old process's listening sockets ([`crate::listeners`]: the metrics/admin
//!    TCP port within one network namespace, the DRA plugin socket) by `SCM_RIGHTS`, so no
//!    connection is refused, and the state that must survive ([`Board`]: XID counts, the MPS
//!    daemons to adopt);
//! 2. starts every subsystem on them; sockets the kubelet must tell apart from the old
//!    process's (device plugin sockets, the DRA registration socket) get a name of this
//!    instance ([`crate::listeners::instance_file_name`]), and the kubelet switches to them;
//! 3. once everything serves, tells the old process to stop ([`take::Predecessor::stop`]); the old
//!    one stops accepting, finishes what is in flight within its grace period, and leaves
//!    every file and daemon it handed on where it is.
//!
//! The messages are versioned ([`message::VERSIONS`]); a new gpud that cannot speak with
//! the old one, or finds it hung, stops it and starts cold within a few seconds, and says
//! so with the gap it measured. `gpud upgrade` and SIGUSR2 ask the running process to start
//! the installed binary, which then takes over the same way.
//!
//! This module knows no subsystem: the daemon core runs both sides, and the parts of gpud
//! that keep state put it on the [`Board`] through their context.

mod board;
pub mod message;
pub mod offer;
pub mod pause;
pub mod peer;
pub mod state_dir;
pub mod take;
pub mod upgrade;
pub mod wire;

use std::path::{Path, PathBuf};

pub use board::Board;

/// The handover socket of `applet` in `state_dir`.
pub fn socket_of(state_dir: &Path, applet: &str) -> PathBuf {
    state_dir.join("handover").join(format!("{applet}.sock"))
}
