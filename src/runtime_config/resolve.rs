//! Which file `--config` really names: a runtime's config is often a symlink (into a
//! configuration-management folder, or an absolute link that only means something on the
//! host), and replacing the link by a regular file would cut it from where it points.
//!
//! The path is walked one component at a time, following each symlink as the kernel would,
//! except that a path under `--host-root` (a container that sees the host's `/` at `/host`)
//! resolves absolute link targets inside that root, as they resolve on the host itself; `..`
//! never climbs above it. A link whose target does not exist is refused: writing a new file
//! there would hide that the runtime reads something else (or nothing).

use std::collections::VecDeque;
use std::ffi::OsString;
use std::io::ErrorKind;
use std::path::{Component, Path, PathBuf};

use super::Error;

/// More links than this in one path is a loop (the kernel's own limit).
const MAX_LINKS: usize = 40;

/// The file gpud edits for the `--config` path `path`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The path as given.
    pub given: PathBuf,
    /// The regular file (or the file to create) it resolves to.
    pub real: PathBuf,
    /// Whether a symlink was followed on the way.
    pub through_link: bool,
}

impl Target {
    /// Whether the path went through a symlink.
    pub fn is_link(&self) -> bool {
        self.through_link
    }
}

/// Resolves `path` (inside `host_root` when it lies under it and that is not `/`).
pub fn resolve(path: &Path, host_root: &Path) -> Result<Target, Error> {
    let absolute = if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir()
            .map_err(|source| Error::Read {
                path: path.to_path_buf(),
                source,
            })?
            .join(path)
    };
    let root = if host_root != Path::new("/") && absolute.starts_with(host_root) {
        host_root.to_path_buf()
    } else {
        PathBuf::from("/")
    };
    let below = absolute.strip_prefix(&root).unwrap_or(&absolute);
    // Each name still to walk, with the link (index into `links`) whose target it came from.
    let mut pending: VecDeque<(OsString, Option<usize>)> =
        names(below).into_iter().map(|n| (n, None)).collect();
    let mut resolved: Vec<OsString> = Vec::new();
    let mut links: Vec<(PathBuf, PathBuf)> = Vec::new();
    while let Some((name, origin)) = pending.pop_front() {
        if name == ".." {
            resolved.pop();
            continue;
        }
        let candidate = join(&root, &resolved).join(&name);
        match std::fs::symlink_metadata(&candidate) {
            Ok(meta) if meta.file_type().is_symlink() => {
                if links.len() >= MAX_LINKS {
                    return Err(Error::Link {
                        path: path.to_path_buf(),
                        message: format!(
                            "more than {MAX_LINKS} symlinks on the way (a loop at {})",
                            candidate.display()
                        ),
                    });
                }
                let target = std::fs::read_link(&candidate).map_err(|source| Error::Read {
                    path: candidate.clone(),
                    source,
                })?;
                if target.is_absolute() {
                    resolved.clear();
                }
                let index = links.len();
                for (i, part) in names(&target).into_iter().enumerate() {
                    pending.insert(i, (part, Some(index)));
                }
                links.push((candidate, target));
            }
            Ok(_) => resolved.push(name),
            Err(err) => {
                let missing = err.kind() == ErrorKind::NotFound;
                resolved.push(name);
                resolved.extend(pending.into_iter().map(|(n, _)| n));
                let real = join(&root, &resolved);
                // A name a link brought in is missing: the link dangles. A name of the path
                // as given is a file (or folder) to create. Any other error: writing names it.
                if let (true, Some((link, target))) = (missing, origin.and_then(|i| links.get(i))) {
                    return Err(dangling(path, link, target, &real, &root));
                }
                return Ok(Target {
                    given: path.to_path_buf(),
                    real,
                    through_link: !links.is_empty(),
                });
            }
        }
    }
    Ok(Target {
        given: path.to_path_buf(),
        real: join(&root, &resolved),
        through_link: !links.is_empty(),
    })
}

fn dangling(given: &Path, link: &Path, target: &Path, real: &Path, root: &Path) -> Error {
    let inside = if root == Path::new("/") {
        String::new()
    } else {
        format!(" (resolved inside the host root {})", root.display())
    };
    Error::Link {
        path: given.to_path_buf(),
        message: format!(
            "{} is a symlink to {}, which does not exist: {}{inside} is missing; create the file the link points to (or replace the link with a file), or give --config the file the runtime really reads, and run again",
            link.display(),
            target.display(),
            real.display()
        ),
    }
}

/// The normal components of `path` (`.` dropped, `..` kept as a name the walk handles).
fn names(path: &Path) -> Vec<OsString> {
    path.components()
        .filter_map(|c| match c {
            Component::Normal(name) => Some(name.to_owned()),
            Component::ParentDir => Some(OsString::from("..")),
            Component::RootDir | Component::CurDir | Component::Prefix(_) => None,
        })
        .collect()
}

fn join(root: &Path, parts: &[OsString]) -> PathBuf {
    let mut path = root.to_path_buf();
    path.extend(parts);
    path
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::symlink;

    use super::*;

    #[test]
    fn a_plain_path_is_itself_and_a_link_is_its_target() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("real.toml");
        std::fs::write(&real, "").unwrap();
        let plain = resolve(&real, Path::new("/")).unwrap();
        assert!(!plain.is_link());
        let link = dir.path().join("config.toml");
        symlink("real.toml", &link).unwrap();
        let target = resolve(&link, Path::new("/")).unwrap();
        assert_eq!(target.real, real);
        assert!(target.is_link());
        let missing = resolve(&dir.path().join("new/config.toml"), Path::new("/")).unwrap();
        assert_eq!(missing.real, dir.path().join("new/config.toml"));
    }

    #[test]
    fn an_absolute_target_resolves_inside_the_host_root() {
        let dir = tempfile::tempdir().unwrap();
        let host = dir.path().join("host");
        std::fs::create_dir_all(host.join("etc/containerd")).unwrap();
        std::fs::create_dir_all(host.join("srv/conf")).unwrap();
        std::fs::write(host.join("srv/conf/containerd.toml"), "").unwrap();
        let link = host.join("etc/containerd/config.toml");
        symlink("/srv/conf/containerd.toml", &link).unwrap();
        let target = resolve(&link, &host).unwrap();
        assert_eq!(target.real, host.join("srv/conf/containerd.toml"));
        // Outside the host root the same link dangles, and is refused naming both ends.
        let err = resolve(&link, Path::new("/")).unwrap_err().to_string();
        assert!(
            err.contains("is a symlink to /srv/conf/containerd.toml"),
            "{err}"
        );
    }

    #[test]
    fn a_loop_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        symlink("b", dir.path().join("a")).unwrap();
        symlink("a", dir.path().join("b")).unwrap();
        let err = resolve(&dir.path().join("a"), Path::new("/")).unwrap_err();
        assert!(err.to_string().contains("a loop"), "{err}");
    }
}
