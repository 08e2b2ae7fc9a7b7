//! systemd's readiness protocol (`sd_notify`): `READY=1` once every subsystem is ready,
//! `RELOADING=1` around a reload and `STOPPING=1` on the way out. With `Type=notify` systemd
//! holds `systemctl reload` back until the daemon said it is ready, and orders units that
//! need gpud after it is really serving. Without `NOTIFY_SOCKET` every call does nothing.

use std::os::unix::net::UnixDatagram;
use std::path::PathBuf;

use tracing::debug;

/// The notification socket systemd gave this process, if any.
#[derive(Debug, Default)]
pub struct Notifier {
    socket: Option<PathBuf>,
}

impl Notifier {
    /// The notifier for `NOTIFY_SOCKET` (read once, with the rest of the configuration).
    pub fn from_env(value: Option<std::ffi::OsString>) -> Self {
        Notifier {
            socket: value.filter(|v| !v.is_empty()).map(PathBuf::from),
        }
    }

    /// Every subsystem is ready (again, after a reload).
    pub fn ready(&self) {
        self.send("READY=1");
    }

    /// A reload begins; `READY=1` ends it.
    pub fn reloading(&self) {
        let usec = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
            .map(|t| t.tv_sec() as u64 * 1_000_000 + t.tv_nsec() as u64 / 1_000)
            .unwrap_or(0);
        self.send(&format!("RELOADING=1\nMONOTONIC_USEC={usec}"));
    }

    /// This process is the service's main process now: it took over from the one systemd
    /// started (`NotifyAccess=all` lets it say so).
    pub fn main_pid(&self, pid: u32) {
        self.send(&format!("MAINPID={pid}"));
    }

    /// The daemon is stopping.
    pub fn stopping(&self) {
        self.send("STOPPING=1");
    }

    fn send(&self, message: &str) {
        let Some(path) = &self.socket else { return };
        let sent = UnixDatagram::unbound().and_then(|socket| {
            let bytes = path.as_os_str().as_encoded_bytes();
            match bytes.strip_prefix(b"@") {
                // An abstract socket: systemd's default for NOTIFY_SOCKET.
                Some(name) => {
                    use std::os::linux::net::SocketAddrExt;
                    let address = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
                    socket.send_to_addr(message.as_bytes(), &address)
                }
                None => socket.send_to(message.as_bytes(), path),
            }
        });
        if let Err(err) = sent {
            debug!(error = %crate::logging::error_chain(&err), "Cannot notify systemd");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_reach_the_socket() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let socket = UnixDatagram::bind(&path).unwrap();
        let notifier = Notifier::from_env(Some(path.clone().into_os_string()));
        notifier.ready();
        notifier.stopping();
        let mut buf = [0u8; 64];
        let n = socket.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"READY=1");
        let n = socket.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"STOPPING=1");
    }

    #[test]
    fn without_a_socket_nothing_happens() {
        Notifier::from_env(None).ready();
        Notifier::from_env(Some("".into())).ready();
    }
}
