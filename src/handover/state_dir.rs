//! The state directory is root's: gpud trusts what it finds there (the handover socket a new
//! gpud hands the kubelet's sockets to, the saved verdicts), so a directory another user can
//! write to, or one another user owns, is refused at start, and nothing in it is followed
//! through a symlink.
//!
//! The checks look at the directories once, with `lstat` below the state directory itself.
//! What they prove holds afterwards: only this process's user can then create, replace or
//! link anything in them, so no other user can swap a checked path for a symlink in between.
//! The state directory's own path may be a link an administrator made (onto a larger disk);
//! its target is checked.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// Refuses a state directory (`state_dir`), or the handover folder holding `socket`, that
/// another user owns or can write to, a handover folder or socket that is a symlink, and a
/// state directory that is not a directory. One not there yet is fine: gpud makes it 0700.
/// The message names the path, what is wrong with it and the command that fixes it.
pub fn check(state_dir: &Path, socket: &Path) -> Result<(), String> {
    let euid = nix::unistd::geteuid().as_raw();
    match std::fs::metadata(state_dir) {
        Ok(meta) if !meta.is_dir() => {
            return Err(format!(
                "the state directory {} (--state-dir, GPUD_STATE_DIR) is not a directory: \
                 remove it or choose another --state-dir",
                state_dir.display()
            ));
        }
        Ok(meta) => private(state_dir, "the state directory", &meta, euid)?,
        Err(err) if absent(&err) => return Ok(()),
        Err(err) => return Err(unreadable(state_dir, &err)),
    }
    let Some(folder) = socket.parent() else {
        return Ok(());
    };
    match std::fs::symlink_metadata(folder) {
        Ok(meta) if meta.file_type().is_symlink() => {
            return Err(format!(
                "the handover folder {} is a symlink: gpud follows no link in its state \
                 directory; remove it (`rm {}`) and gpud makes the folder itself",
                folder.display(),
                folder.display()
            ));
        }
        Ok(meta) if !meta.is_dir() => {
            return Err(format!(
                "the handover folder {} is not a directory: remove it and gpud makes the \
                 folder itself",
                folder.display()
            ));
        }
        Ok(meta) => private(folder, "the handover folder", &meta, euid)?,
        Err(err) if absent(&err) => return Ok(()),
        Err(err) => return Err(unreadable(folder, &err)),
    }
    match std::fs::symlink_metadata(socket) {
        Ok(meta) if meta.file_type().is_symlink() => Err(format!(
            "the handover socket {} is a symlink: gpud follows no link in its state \
             directory; remove it (`rm {}`) and gpud binds the socket itself",
            socket.display(),
            socket.display()
        )),
        Ok(_) => Ok(()),
        Err(err) if absent(&err) => Ok(()),
        Err(err) => Err(unreadable(socket, &err)),
    }
}

/// Whether `err` means there is nothing at the path (or a file where a folder of it would be,
/// which the handover's bind then reports).
fn absent(err: &std::io::Error) -> bool {
    matches!(
        err.kind(),
        std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory
    )
}

fn unreadable(path: &Path, err: &std::io::Error) -> String {
    format!(
        "cannot look at {} in the state directory: {err}; gpud does not start on a state \
         directory it cannot check",
        path.display()
    )
}

/// `path` (`what`) must be owned by `euid` and writable by nobody else.
fn private(path: &Path, what: &str, meta: &std::fs::Metadata, euid: u32) -> Result<(), String> {
    let mode = meta.mode() & 0o7777;
    if meta.uid() != euid {
        return Err(format!(
            "{what} {} is owned by uid {}, not by this process's user (uid {euid}): another \
             user could replace what gpud trusts there; `chown {euid} {}` and \
             `chmod 0700 {}`, or choose another --state-dir",
            path.display(),
            meta.uid(),
            path.display(),
            path.display()
        ));
    }
    if mode & 0o022 != 0 {
        let who = match (mode & 0o020 != 0, mode & 0o002 != 0) {
            (true, true) => "its group and every user",
            (true, false) => "its group",
            _ => "every user",
        };
        return Err(format!(
            "{what} {} has mode {mode:04o}: {who} can write to it and replace what gpud \
             trusts there; `chmod 0700 {}`",
            path.display(),
            path.display()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn chmod(path: &Path, mode: u32) {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    #[test]
    fn a_private_directory_or_none_at_all_passes() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        let socket = state.join("handover/run.sock");
        assert_eq!(check(&state, &socket), Ok(()));
        std::fs::create_dir_all(socket.parent().unwrap()).unwrap();
        chmod(&state, 0o755);
        chmod(socket.parent().unwrap(), 0o700);
        assert_eq!(check(&state, &socket), Ok(()));
        // A file where the state directory's parent should be: not there, for the bind to say.
        let blocked = dir.path().join("file");
        std::fs::write(&blocked, "").unwrap();
        assert_eq!(
            check(
                &blocked.join("state"),
                &blocked.join("state/handover/run.sock")
            ),
            Ok(())
        );
    }

    #[test]
    fn writable_by_others_or_linked_is_refused_with_the_fix() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        let folder = state.join("handover");
        let socket = folder.join("run.sock");
        std::fs::create_dir_all(&folder).unwrap();
        chmod(&state, 0o777);
        let err = check(&state, &socket).unwrap_err();
        assert!(
            err.contains(&format!("{} has mode 0777", state.display())),
            "{err}"
        );
        assert!(err.contains("chmod 0700"), "{err}");
        chmod(&state, 0o700);
        chmod(&folder, 0o770);
        let err = check(&state, &socket).unwrap_err();
        assert!(err.contains("the handover folder"), "{err}");
        assert!(err.contains("its group can write"), "{err}");
        chmod(&folder, 0o700);
        std::os::unix::fs::symlink("/tmp", &socket).unwrap();
        let err = check(&state, &socket).unwrap_err();
        assert!(err.contains("is a symlink"), "{err}");
        std::fs::remove_file(&socket).unwrap();
        std::fs::remove_dir(&folder).unwrap();
        std::os::unix::fs::symlink(dir.path(), &folder).unwrap();
        let err = check(&state, &socket).unwrap_err();
        assert!(
            err.contains("handover folder") && err.contains("symlink"),
            "{err}"
        );
    }
}
