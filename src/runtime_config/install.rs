//! `gpud runtime install` / `uninstall`: puts this gpud binary and its `nvidia-cdi-hook` link
//! into a host folder (`/usr/local/nvidia/toolkit` by default), where the container runtime
//! runs the hooks that CDI specs name. The toolkit step of a Kubernetes node does this from
//! its pod; on bare metal the package's own `/usr/bin/gpud` can serve instead.
//!
//! The binary is replaced by a rename, never rewritten in place: a hook the runtime is running
//! at that moment keeps the old file, and a half-copied binary is never executable under the
//! hook's name. A second install of the same binary writes nothing.

use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt, symlink};
use std::path::{Path, PathBuf};

/// Where the toolkit step installs gpud on the host by default; the CDI specs' default hook
/// is the link in it.
pub const DEFAULT_TOOLKIT_DIR: &str = "/usr/local/nvidia/toolkit";

/// The binary's name in the toolkit folder.
pub const BINARY: &str = "gpud";

/// The hook's name, the one NVIDIA's specs use too: gpud runs as its CDI hook when called by it.
pub const HOOK_LINK: &str = "nvidia-cdi-hook";

/// What an install did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Installed {
    /// The binary in the toolkit folder.
    pub binary: PathBuf,
    /// The hook link beside it.
    pub hook: PathBuf,
    /// Whether anything was written (false: the same binary and link were there already).
    pub changed: bool,
}

/// A file of the toolkit folder that could not be read or written.
#[derive(Debug, thiserror::Error)]
#[error("{path}: cannot {action}: {source}")]
pub struct InstallError {
    pub path: PathBuf,
    pub action: &'static str,
    #[source]
    pub source: io::Error,
}

fn failed(path: &Path, action: &'static str) -> impl FnOnce(io::Error) -> InstallError {
    let path = path.to_path_buf();
    move |source| InstallError {
        path,
        action,
        source,
    }
}

/// Copies `source` (normally this process's own binary) to `<dir>/gpud` and links
/// `<dir>/nvidia-cdi-hook` to it, creating `dir` when missing.
pub fn install(source: &Path, dir: &Path) -> Result<Installed, InstallError> {
    fs::create_dir_all(dir).map_err(failed(dir, "create the folder"))?;
    let binary = dir.join(BINARY);
    let hook = dir.join(HOOK_LINK);
    let wanted = fs::read(source).map_err(failed(source, "read the binary to install"))?;
    let mut changed = false;
    if fs::read(&binary).ok().as_deref() != Some(wanted.as_slice()) {
        replace_file(&binary, &wanted)?;
        changed = true;
    }
    if fs::read_link(&hook).ok().as_deref() != Some(Path::new(BINARY)) {
        replace_link(&hook, Path::new(BINARY))?;
        changed = true;
    }
    Ok(Installed {
        binary,
        hook,
        changed,
    })
}

/// Removes what [`install`] put in `dir`: the hook link when it points at gpud, the binary
/// when it is one, and the folder when that leaves it empty. Anything else there stays.
/// Returns the paths removed.
pub fn uninstall(dir: &Path) -> Result<Vec<PathBuf>, InstallError> {
    let mut removed = Vec::new();
    let hook = dir.join(HOOK_LINK);
    if fs::read_link(&hook).ok().as_deref() == Some(Path::new(BINARY)) {
        fs::remove_file(&hook).map_err(failed(&hook, "remove the hook link"))?;
        removed.push(hook);
    }
    let binary = dir.join(BINARY);
    if fs::symlink_metadata(&binary).is_ok_and(|meta| meta.is_file()) {
        fs::remove_file(&binary).map_err(failed(&binary, "remove the binary"))?;
        removed.push(binary);
    }
    // Only an empty folder goes; anything else the host keeps there is not gpud's to remove.
    if fs::read_dir(dir).is_ok_and(|mut entries| entries.next().is_none()) {
        fs::remove_dir(dir).map_err(failed(dir, "remove the folder"))?;
        removed.push(dir.to_path_buf());
    }
    Ok(removed)
}

/// Writes `bytes` beside `path` (mode 0755, synced) and renames it over `path`.
fn replace_file(path: &Path, bytes: &[u8]) -> Result<(), InstallError> {
    let temporary = temporary_beside(path);
    let written = (|| {
        let mut file = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o755)
            .open(&temporary)?;
        file.write_all(bytes)?;
        // The mode asked for at creation is cut by the umask; a hook must be executable.
        file.set_permissions(fs::Permissions::from_mode(0o755))?;
        file.sync_all()
    })();
    finish(written, &temporary, path, "write the binary")
}

/// Points a new link beside `path` at `target` and renames it over `path`.
fn replace_link(path: &Path, target: &Path) -> Result<(), InstallError> {
    let temporary = temporary_beside(path);
    finish(
        symlink(target, &temporary),
        &temporary,
        path,
        "link the hook",
    )
}

/// Renames `temporary` over `path` when it was written, else removes it.
fn finish(
    written: io::Result<()>,
    temporary: &Path,
    path: &Path,
    action: &'static str,
) -> Result<(), InstallError> {
    let result = written.and_then(|()| fs::rename(temporary, path));
    if result.is_err() {
        let _ = fs::remove_file(temporary);
    }
    result.map_err(failed(path, action))
}

fn temporary_beside(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy())
        .unwrap_or_default();
    path.with_file_name(format!(".{name}.{}.tmp", std::process::id()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn binary(dir: &Path, body: &str) -> PathBuf {
        let path = dir.join("source-gpud");
        fs::write(&path, body).unwrap();
        path
    }

    #[test]
    fn installs_the_binary_and_the_hook_link_once() {
        let tmp = tempfile::tempdir().unwrap();
        let source = binary(tmp.path(), "gpud v1");
        let dir = tmp.path().join("usr/local/nvidia/toolkit");

        let first = install(&source, &dir).unwrap();
        assert!(first.changed);
        assert_eq!(fs::read_to_string(dir.join("gpud")).unwrap(), "gpud v1");
        let mode = fs::metadata(dir.join("gpud")).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o755);
        assert_eq!(
            fs::read_link(dir.join("nvidia-cdi-hook")).unwrap(),
            Path::new("gpud")
        );

        let second = install(&source, &dir).unwrap();
        assert!(!second.changed, "the same binary again writes nothing");

        fs::write(&source, "gpud v2").unwrap();
        assert!(install(&source, &dir).unwrap().changed);
        assert_eq!(fs::read_to_string(dir.join("gpud")).unwrap(), "gpud v2");
        let names: Vec<String> = fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(names.len(), 2, "no temporary file left: {names:?}");
    }

    #[test]
    fn a_link_pointing_elsewhere_is_replaced() {
        let tmp = tempfile::tempdir().unwrap();
        let source = binary(tmp.path(), "gpud");
        let dir = tmp.path().join("toolkit");
        fs::create_dir(&dir).unwrap();
        symlink("/usr/bin/nvidia-ctk", dir.join("nvidia-cdi-hook")).unwrap();
        assert!(install(&source, &dir).unwrap().changed);
        assert_eq!(
            fs::read_link(dir.join("nvidia-cdi-hook")).unwrap(),
            Path::new("gpud")
        );
    }

    #[test]
    fn uninstall_removes_only_what_install_put_there() {
        let tmp = tempfile::tempdir().unwrap();
        let source = binary(tmp.path(), "gpud");
        let dir = tmp.path().join("toolkit");
        install(&source, &dir).unwrap();
        fs::write(dir.join("notes.txt"), "the host's own").unwrap();
        let removed = uninstall(&dir).unwrap();
        assert_eq!(removed, [dir.join("nvidia-cdi-hook"), dir.join("gpud")]);
        assert!(dir.join("notes.txt").exists());

        fs::remove_file(dir.join("notes.txt")).unwrap();
        install(&source, &dir).unwrap();
        assert_eq!(
            uninstall(&dir).unwrap().last(),
            Some(&dir),
            "an emptied folder goes"
        );
        assert!(!dir.exists());
        assert_eq!(
            uninstall(&dir).unwrap(),
            Vec::<PathBuf>::new(),
            "nothing left is fine"
        );
    }

    #[test]
    fn an_unwritable_folder_names_the_path() {
        let tmp = tempfile::tempdir().unwrap();
        let source = binary(tmp.path(), "gpud");
        let blocker = tmp.path().join("file");
        fs::write(&blocker, "").unwrap();
        let err = install(&source, &blocker.join("toolkit")).unwrap_err();
        assert!(
            err.to_string()
                .starts_with(&format!("{}", blocker.join("toolkit").display()))
        );
        assert!(
            err.to_string().contains("cannot create the folder"),
            "{err}"
        );
    }
}
