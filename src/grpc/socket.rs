//! Binding a unix socket with an exact mode, whatever the umask.
//!
//! `bind(2)` creates the socket file with `0777 & !umask`, so under umask 000 anyone could
//! connect. Changing the mode after binding at the final path leaves a window, and changing
//! the umask affects every thread of the process. Instead the socket is bound inside a
//! private staging folder next to the final path (mode 0700, so nobody else can reach it
//! there), given its mode, and renamed over the final path, which replaces a stale socket
//! atomically. The staging folder's name starts with a dot, which the kubelet's plugin
//! watcher ignores.

use std::fs::{self, DirBuilder, Permissions};
use std::io;
use std::os::fd::AsFd;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

use tokio::net::UnixListener;
use tracing::warn;

use crate::listeners;

/// Mode of every gRPC socket gpud serves: read and write for its owner only. gpud runs as
/// root and so does the kubelet, the only client of these sockets.
pub const SOCKET_MODE: u32 = 0o600;

/// Mode of the staging folder: only its owner may enter it.
const STAGING_MODE: u32 = 0o700;
/// Name of the socket inside the staging folder (short: socket paths are limited to 107 bytes).
const STAGED_NAME: &str = "s";

/// A step of binding that failed, with the path it failed on.
#[derive(Debug, thiserror::Error)]
#[error("{path}: cannot {step}: {source}")]
pub struct BindError {
    /// The socket or folder involved.
    pub path: PathBuf,
    /// What was being done, e.g. `bind the socket`.
    pub step: &'static str,
    /// The system error.
    #[source]
    pub source: io::Error,
}

fn fail(path: &Path, step: &'static str) -> impl FnOnce(io::Error) -> BindError {
    let path = path.to_path_buf();
    move |source| BindError { path, step, source }
}

/// Listens on a unix socket at `path` with exactly `mode` (e.g. [`SOCKET_MODE`]), replacing
/// whatever socket was there. The socket never exists anywhere reachable with another mode.
/// Must be called within a tokio runtime.
pub fn bind(path: &Path, mode: u32) -> Result<UnixListener, BindError> {
    let listener = bind_new(path, mode)?;
    listeners::bound(path);
    Ok(listener)
}

/// As [`bind`], but serves the socket the gpud this one took over from listened on at `path`
/// when there is one ([`crate::listeners`]): the kubelet's connections made during the
/// takeover wait in its queue instead of being refused. For sockets whose path the kubelet
/// keeps across a takeover (the DRA plugin socket).
pub fn bind_or_inherit(path: &Path, mode: u32) -> Result<UnixListener, BindError> {
    let key = listeners::unix_key(path);
    let listener = match listeners::take(&key) {
        Some(inherited) => {
            let std = std::os::unix::net::UnixListener::from(inherited);
            std.set_nonblocking(true)
                .and_then(|()| UnixListener::from_std(std))
                .map_err(fail(path, "serve the inherited socket"))?
        }
        None => bind(path, mode)?,
    };
    listeners::bound(path);
    listeners::serve(&key, listener.as_fd());
    Ok(listener)
}

fn bind_new(path: &Path, mode: u32) -> Result<UnixListener, BindError> {
    let name = path.file_name().ok_or_else(|| BindError {
        path: path.to_path_buf(),
        step: "use this path as a socket",
        source: io::Error::new(io::ErrorKind::InvalidInput, "no file name"),
    })?;
    let mut staging_name = std::ffi::OsString::from(".");
    staging_name.push(name);
    staging_name.push(".bind");
    let staging = path.with_file_name(staging_name);
    let staged = staging.join(STAGED_NAME);
    // A crashed run may have left the folder behind.
    remove_staging(&staging, &staged)?;
    DirBuilder::new()
        .mode(STAGING_MODE)
        .create(&staging)
        .map_err(fail(&staging, "create the staging folder"))?;
    let result = bind_staged(&staging, &staged, path, mode);
    if let Err(err) = remove_staging(&staging, &staged) {
        // The socket is in place; an empty hidden folder left behind harms nobody.
        warn!(error = %crate::logging::error_chain(&err), "Cannot remove the socket staging folder");
    }
    result
}

fn bind_staged(
    staging: &Path,
    staged: &Path,
    path: &Path,
    mode: u32,
) -> Result<UnixListener, BindError> {
    // The umask may have narrowed the folder's mode further; make it exact.
    fs::set_permissions(staging, Permissions::from_mode(STAGING_MODE))
        .map_err(fail(staging, "set the mode of the staging folder"))?;
    let listener = UnixListener::bind(staged).map_err(fail(staged, "bind the socket"))?;
    fs::set_permissions(staged, Permissions::from_mode(mode))
        .map_err(fail(staged, "set the mode of the socket"))?;
    fs::rename(staged, path).map_err(fail(path, "move the socket into place"))?;
    Ok(listener)
}

/// Removes the staging folder and a socket left in it; absent is fine.
fn remove_staging(staging: &Path, staged: &Path) -> Result<(), BindError> {
    for (path, result) in [
        (staged, fs::remove_file(staged)),
        (staging, fs::remove_dir(staging)),
    ] {
        match result {
            Err(err) if err.kind() != io::ErrorKind::NotFound => {
                return Err(fail(path, "remove the leftover staging folder")(err));
            }
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::FileTypeExt;

    use super::*;

    fn mode(path: &Path) -> u32 {
        fs::metadata(path).unwrap().permissions().mode() & 0o777
    }

    #[tokio::test]
    async fn binds_with_the_mode_replacing_a_stale_socket_and_leftovers() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("plugin.sock");
        // A stale socket and a staging folder from a crashed run.
        let stale = std::os::unix::net::UnixListener::bind(&path).unwrap();
        drop(stale);
        fs::create_dir(dir.path().join(".plugin.sock.bind")).unwrap();
        std::os::unix::net::UnixListener::bind(dir.path().join(".plugin.sock.bind/s")).unwrap();

        let listener = bind(&path, SOCKET_MODE).unwrap();
        assert!(fs::metadata(&path).unwrap().file_type().is_socket());
        assert_eq!(mode(&path), 0o600);
        let names: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(names, ["plugin.sock"]);
        // The listener serves the final path.
        let (client, accepted) =
            tokio::join!(tokio::net::UnixStream::connect(&path), listener.accept());
        client.unwrap();
        accepted.unwrap();

        let again = bind(&path, 0o660).unwrap();
        assert_eq!(mode(&path), 0o660);
        drop(again);
    }

    #[tokio::test]
    async fn failure_names_the_path_and_step() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("missing/plugin.sock");
        let err = bind(&path, SOCKET_MODE).unwrap_err();
        assert_eq!(err.step, "create the staging folder");
        assert_eq!(err.path, dir.path().join("missing/.plugin.sock.bind"));
        assert!(
            err.to_string().starts_with(&format!(
                "{}: cannot create the staging folder: ",
                err.path.display()
            )),
            "{err}"
        );
    }
}
