//! The container's root as a directory descriptor, and every operation the hooks make inside
//! it. The rootfs is the image's, so it is hostile: a path inside it is only ever resolved by
//! the kernel with `openat2(RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)` from the root's
//! descriptor, where an absolute symlink or `..` stays inside the root (as if chrooted) and
//! `/proc/*/root`-style links are refused. Directories, links and files are then made by name
//! in a parent directory opened that way (`mkdirat`, `symlinkat`, `openat(O_EXCL)`,
//! `renameat`), none of which follows a link in its last component, so nothing a symlink in
//! the image points at, on the host or elsewhere, is ever written.

use std::ffi::{OsStr, OsString};
use std::io::Write;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use rustix::fs::{AtFlags, FileType, Mode, OFlags, ResolveFlags};
use rustix::io::Errno;

use super::error::HookError;

/// How every path inside the root is resolved.
const RESOLVE: ResolveFlags = ResolveFlags::IN_ROOT.union(ResolveFlags::NO_MAGICLINKS);

/// Most entries a listed directory may have.
const MAX_LISTED: usize = 65_536;

/// Mode of the directories the hooks create (before the umask), as `mkdir -p` would.
const DIR_MODE: u32 = 0o755;

/// What [`Root::symlink`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Linked {
    /// The link was made.
    Created,
    /// The same link was there already.
    Existing,
    /// A link with another target was there and now points at the target asked for.
    Replaced,
}

/// An open container root.
#[derive(Debug)]
pub struct Root {
    fd: OwnedFd,
    path: PathBuf,
}

impl Root {
    /// Opens the root at `path` (the runtime's, so a host path resolved as usual), refusing
    /// the host's own `/`.
    pub fn open(path: &Path) -> Result<Root, HookError> {
        let open_error = |source: Errno| HookError::OpenRoot {
            path: path.to_owned(),
            source: source.into(),
        };
        let fd = rustix::fs::open(
            path,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(open_error)?;
        let this = rustix::fs::fstat(&fd).map_err(open_error)?;
        let host = rustix::fs::stat("/").map_err(open_error)?;
        if (this.st_dev, this.st_ino) == (host.st_dev, host.st_ino) {
            return Err(HookError::HostRoot {
                path: path.to_owned(),
            });
        }
        Ok(Root {
            fd,
            path: path.to_owned(),
        })
    }

    /// The root's path on the host (for messages and for ldconfig's `-r`).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Resolves `path` (absolute or not, always inside the root) with `flags`.
    fn resolve(&self, path: &Path, flags: OFlags) -> Result<OwnedFd, Errno> {
        let relative = path.strip_prefix("/").unwrap_or(path);
        let relative = if relative.as_os_str().is_empty() {
            Path::new(".")
        } else {
            relative
        };
        rustix::fs::openat2(
            &self.fd,
            relative,
            flags | OFlags::CLOEXEC,
            Mode::empty(),
            RESOLVE,
        )
    }

    fn error(&self, op: &'static str, path: &Path, source: Errno) -> HookError {
        HookError::InRoot {
            op,
            path: path.display().to_string(),
            root: self.path.clone(),
            source: source.into(),
        }
    }

    fn refused(&self, op: &'static str, path: &Path, why: &'static str) -> HookError {
        HookError::Refused {
            op,
            path: path.display().to_string(),
            root: self.path.clone(),
            why,
        }
    }

    /// Whether `path` exists inside the root (symlinks followed, inside the root).
    pub fn exists(&self, path: &Path) -> bool {
        self.resolve(path, OFlags::PATH).is_ok()
    }

    /// The directory `path` inside the root, opened for lookups (`O_PATH`).
    pub fn open_dir(&self, path: &Path) -> Result<OwnedFd, HookError> {
        self.resolve(path, OFlags::PATH | OFlags::DIRECTORY)
            .map_err(|err| self.error("open the directory", path, err))
    }

    /// `path` inside the root itself, opened without following a symlink in its last
    /// component (`O_PATH`), for [`fd_path`].
    pub fn open_path(&self, path: &Path) -> Result<OwnedFd, HookError> {
        self.resolve(path, OFlags::PATH | OFlags::NOFOLLOW)
            .map_err(|err| self.error("open", path, err))
    }

    /// The names in the directory `path` inside the root (`None` when it does not exist).
    pub fn list(&self, path: &Path) -> Result<Option<Vec<OsString>>, HookError> {
        let fd = match self.resolve(path, OFlags::RDONLY | OFlags::DIRECTORY) {
            Ok(fd) => fd,
            Err(Errno::NOENT) => return Ok(None),
            Err(err) => return Err(self.error("list the directory", path, err)),
        };
        let dir = rustix::fs::Dir::read_from(&fd)
            .map_err(|err| self.error("list the directory", path, err))?;
        let mut names = Vec::new();
        for entry in dir {
            let entry = entry.map_err(|err| self.error("list the directory", path, err))?;
            // The folders listed hold a few libraries; a huge one is the image's doing.
            if names.len() >= MAX_LISTED {
                return Err(self.error("list the directory", path, Errno::FBIG));
            }
            let name = OsStr::from_bytes(entry.file_name().to_bytes());
            if name != "." && name != ".." {
                names.push(name.to_owned());
            }
        }
        names.sort();
        Ok(Some(names))
    }

    /// Creates the directory `path` and its parents inside the root (an existing one is
    /// fine) and returns it opened for lookups. Each missing directory is made by name in its
    /// parent as resolved inside the root, so a symlinked parent leads somewhere inside the
    /// root or nowhere.
    pub fn mkdir_all(&self, path: &Path) -> Result<OwnedFd, HookError> {
        let op = "create the directory";
        let mut done = PathBuf::from("/");
        let mut dir = self.open_dir(&done)?;
        for component in path.components() {
            let name = match component {
                Component::Normal(name) => name,
                // `..` is resolved by the kernel, and never above the root.
                Component::ParentDir => OsStr::new(".."),
                Component::RootDir | Component::CurDir | Component::Prefix(_) => continue,
            };
            let next = done.join(name);
            dir = match self.resolve(&next, OFlags::PATH | OFlags::DIRECTORY) {
                Ok(fd) => fd,
                Err(Errno::NOENT) => {
                    match rustix::fs::mkdirat(&dir, name, Mode::from_raw_mode(DIR_MODE)) {
                        Ok(()) | Err(Errno::EXIST) => {}
                        Err(err) => return Err(self.error(op, &next, err)),
                    }
                    self.resolve(&next, OFlags::PATH | OFlags::DIRECTORY)
                        .map_err(|err| self.error(op, &next, err))?
                }
                Err(Errno::NOTDIR) => {
                    return Err(self.refused(op, &next, "it exists and is not a directory"));
                }
                Err(err) => return Err(self.error(op, &next, err)),
            };
            done = next;
        }
        Ok(dir)
    }

    /// Makes `link` inside the root a symlink to `target` (which is not followed, so it may
    /// name anything). Missing parents are created; a link already there with another target
    /// is replaced; anything else there is left alone and refused.
    pub fn symlink(&self, target: &Path, link: &Path) -> Result<Linked, HookError> {
        let op = "create the link";
        let (parent, name) = split(link).ok_or_else(|| self.refused(op, link, "it has no name"))?;
        let dir = self.mkdir_all(parent)?;
        let outcome = match rustix::fs::readlinkat(&dir, name, Vec::new()) {
            Ok(existing) if existing.as_bytes() == target.as_os_str().as_bytes() => {
                return Ok(Linked::Existing);
            }
            Ok(_) => {
                // unlinkat removes the link itself, never what it points at.
                rustix::fs::unlinkat(&dir, name, AtFlags::empty())
                    .map_err(|err| self.error("replace the link", link, err))?;
                Linked::Replaced
            }
            Err(Errno::NOENT) => Linked::Created,
            Err(Errno::INVAL) => {
                return Err(self.refused(op, link, "a file that is not a symlink is there"));
            }
            Err(err) => return Err(self.error(op, link, err)),
        };
        rustix::fs::symlinkat(target, &dir, name).map_err(|err| self.error(op, link, err))?;
        Ok(outcome)
    }

    /// Puts `contents` in the file `name` of the directory `dir` inside the root (created with
    /// its parents), world-readable, replacing the file atomically: written under a temporary
    /// name created exclusively (so never through a link), then renamed over the old one.
    pub fn write_file(&self, dir: &Path, name: &str, contents: &[u8]) -> Result<(), HookError> {
        let path = dir.join(name);
        let op = "write the file";
        let dir_fd = self.mkdir_all(dir)?;
        let temp = format!(".{name}.{}", std::process::id());
        let create = || {
            rustix::fs::openat(
                &dir_fd,
                temp.as_str(),
                OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::from_raw_mode(0o644),
            )
        };
        let fd = match create() {
            // A temporary file left by an earlier hook of this pid number: remove and retry.
            Err(Errno::EXIST) => {
                rustix::fs::unlinkat(&dir_fd, temp.as_str(), AtFlags::empty())
                    .map_err(|err| self.error(op, &path, err))?;
                create()
            }
            other => other,
        }
        .map_err(|err| self.error(op, &path, err))?;
        rustix::fs::fchmod(&fd, Mode::from_raw_mode(0o644))
            .map_err(|err| self.error(op, &path, err))?;
        let mut file = std::fs::File::from(fd);
        let written = file.write_all(contents).and_then(|()| file.sync_all());
        if let Err(err) = written {
            let _ = rustix::fs::unlinkat(&dir_fd, temp.as_str(), AtFlags::empty());
            return Err(HookError::InRoot {
                op,
                path: path.display().to_string(),
                root: self.path.clone(),
                source: err,
            });
        }
        rustix::fs::renameat(&dir_fd, temp.as_str(), &dir_fd, name)
            .map_err(|err| self.error(op, &path, err))
    }

    /// Sets the permission bits of `path` inside the root. A symlink as the last component is
    /// refused (its target is not changed); the file is changed through the descriptor that
    /// resolved it, so it cannot be swapped for a link between the check and the change.
    /// Returns false when `path` does not exist.
    pub fn chmod(&self, path: &Path, mode: u32) -> Result<bool, HookError> {
        let op = "change the mode of";
        let fd = match self.resolve(path, OFlags::PATH | OFlags::NOFOLLOW) {
            Ok(fd) => fd,
            Err(Errno::NOENT) => return Ok(false),
            Err(err) => return Err(self.error(op, path, err)),
        };
        let stat = rustix::fs::fstat(&fd).map_err(|err| self.error(op, path, err))?;
        if FileType::from_raw_mode(stat.st_mode) == FileType::Symlink {
            return Err(self.refused(op, path, "it is a symlink, whose target is not changed"));
        }
        // fchmod does not take an O_PATH descriptor; its /proc/self/fd entry names exactly the
        // file opened (not a path that could be re-resolved).
        rustix::fs::chmod(fd_path(&fd).as_str(), Mode::from_raw_mode(mode))
            .map_err(|err| self.error(op, path, err))?;
        Ok(true)
    }
}

/// The `/proc/self/fd` entry of `fd`: for the system calls that take no descriptor (chmod,
/// mount), a name for exactly the file opened, which no symlink in the image can redirect.
pub fn fd_path(fd: &OwnedFd) -> String {
    format!("/proc/self/fd/{}", fd.as_fd().as_raw_fd())
}

/// `path` as its parent and last name (`None` when it has no last name, like `/` or `a/..`).
fn split(path: &Path) -> Option<(&Path, &OsStr)> {
    let name = path.file_name()?;
    Some((path.parent().unwrap_or(Path::new("/")), name))
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::{PermissionsExt, symlink};

    use super::*;

    /// The permission bits of `path`.
    fn mode_of(path: &Path) -> u32 {
        std::fs::metadata(path).unwrap().permissions().mode() & 0o7777
    }

    /// A temp dir holding `root/` (the container) and `host/` (a canary beside it).
    struct Scene {
        dir: tempfile::TempDir,
    }

    impl Scene {
        fn new() -> Scene {
            let dir = tempfile::tempdir().unwrap();
            std::fs::create_dir(dir.path().join("root")).unwrap();
            std::fs::create_dir(dir.path().join("host")).unwrap();
            std::fs::write(dir.path().join("host/canary"), "canary").unwrap();
            Scene { dir }
        }
        fn root_path(&self) -> PathBuf {
            self.dir.path().join("root")
        }
        fn root(&self) -> Root {
            Root::open(&self.root_path()).unwrap()
        }
        fn host(&self) -> PathBuf {
            self.dir.path().join("host")
        }
        fn host_unchanged(&self) {
            let names: Vec<_> = std::fs::read_dir(self.host())
                .unwrap()
                .map(|e| e.unwrap().file_name())
                .collect();
            assert_eq!(names, vec![OsString::from("canary")]);
            let canary = self.host().join("canary");
            assert_eq!(std::fs::read_to_string(&canary).unwrap(), "canary");
        }
    }

    #[test]
    fn the_host_root_is_refused() {
        let err = Root::open(Path::new("/")).unwrap_err();
        assert!(err.to_string().contains("is the host's /"), "{err}");
    }

    #[test]
    fn mkdir_all_creates_parents_and_accepts_existing() {
        let scene = Scene::new();
        let root = scene.root();
        root.mkdir_all(Path::new("/usr/lib/x86_64-linux-gnu"))
            .unwrap();
        root.mkdir_all(Path::new("usr/lib/x86_64-linux-gnu"))
            .unwrap();
        assert!(scene.root_path().join("usr/lib/x86_64-linux-gnu").is_dir());
    }

    #[test]
    fn symlinked_parents_stay_inside_the_root() {
        let scene = Scene::new();
        let host = scene.host();
        let root_path = scene.root_path();
        std::fs::create_dir_all(root_path.join("usr")).unwrap();
        // /usr/lib -> the host folder (absolute), /lib -> ../../.. (relative, up and out).
        symlink(&host, root_path.join("usr/lib")).unwrap();
        symlink("../../../../..", root_path.join("lib")).unwrap();
        let root = scene.root();
        // An absolute target inside the root names <root>/<host path>, which is missing.
        let err = root.mkdir_all(Path::new("/usr/lib/x86_64-linux-gnu"));
        assert!(err.is_err() || root_path.join(host.strip_prefix("/").unwrap()).exists());
        // `..` past the root stops at the root: the link lands in the root itself.
        assert_eq!(
            root.symlink(Path::new("libcuda.so.1"), Path::new("/lib/libcuda.so"))
                .unwrap(),
            Linked::Created
        );
        assert!(root_path.join("libcuda.so").is_symlink());
        scene.host_unchanged();
    }

    #[test]
    fn symlink_is_idempotent_and_replaces_a_link_to_the_host() {
        let scene = Scene::new();
        let root = scene.root();
        let link = Path::new("/usr/lib/libcuda.so");
        assert_eq!(
            root.symlink(Path::new("libcuda.so.1"), link).unwrap(),
            Linked::Created
        );
        assert_eq!(
            root.symlink(Path::new("libcuda.so.1"), link).unwrap(),
            Linked::Existing
        );
        let on_host = scene.root_path().join("usr/lib/libcuda.so");
        std::fs::remove_file(&on_host).unwrap();
        symlink(scene.host().join("canary"), &on_host).unwrap();
        assert_eq!(
            root.symlink(Path::new("libcuda.so.1"), link).unwrap(),
            Linked::Replaced
        );
        assert_eq!(
            std::fs::read_link(&on_host).unwrap(),
            PathBuf::from("libcuda.so.1")
        );
        std::fs::remove_file(&on_host).unwrap();
        std::fs::write(&on_host, "a file").unwrap();
        let err = root.symlink(Path::new("libcuda.so.1"), link).unwrap_err();
        assert!(err.to_string().contains("not a symlink"), "{err}");
        scene.host_unchanged();
    }

    #[test]
    fn write_file_replaces_a_symlink_instead_of_following_it() {
        let scene = Scene::new();
        let root_path = scene.root_path();
        std::fs::create_dir_all(root_path.join("etc/ld.so.conf.d")).unwrap();
        symlink(
            scene.host().join("canary"),
            root_path.join("etc/ld.so.conf.d/00-x.conf"),
        )
        .unwrap();
        let root = scene.root();
        root.write_file(Path::new("/etc/ld.so.conf.d"), "00-x.conf", b"/opt\n")
            .unwrap();
        let written = root_path.join("etc/ld.so.conf.d/00-x.conf");
        assert!(!written.is_symlink());
        assert_eq!(std::fs::read_to_string(&written).unwrap(), "/opt\n");
        assert_eq!(mode_of(&written), 0o644);
        scene.host_unchanged();
    }

    #[test]
    fn chmod_changes_files_and_refuses_symlinks() {
        let scene = Scene::new();
        let root_path = scene.root_path();
        std::fs::create_dir_all(root_path.join("dev/dri")).unwrap();
        std::fs::write(root_path.join("dev/dri/card0"), "").unwrap();
        symlink(scene.host().join("canary"), root_path.join("dev/dri/card1")).unwrap();
        let root = scene.root();
        assert!(root.chmod(Path::new("/dev/dri/card0"), 0o666).unwrap());
        assert_eq!(mode_of(&root_path.join("dev/dri/card0")), 0o666);
        let before = mode_of(&scene.host().join("canary"));
        let err = root.chmod(Path::new("/dev/dri/card1"), 0o777).unwrap_err();
        assert!(err.to_string().contains("is a symlink"), "{err}");
        assert_eq!(mode_of(&scene.host().join("canary")), before);
        assert!(!root.chmod(Path::new("/dev/dri/card9"), 0o666).unwrap());
    }

    #[test]
    fn list_names_a_directory_inside_the_root() {
        let scene = Scene::new();
        let root_path = scene.root_path();
        std::fs::create_dir_all(root_path.join("compat")).unwrap();
        std::fs::write(root_path.join("compat/b"), "").unwrap();
        std::fs::write(root_path.join("compat/a"), "").unwrap();
        let root = scene.root();
        assert_eq!(
            root.list(Path::new("/compat")).unwrap().unwrap(),
            vec![OsString::from("a"), OsString::from("b")]
        );
        assert_eq!(root.list(Path::new("/missing")).unwrap(), None);
        assert!(root.exists(Path::new("/compat/a")));
        assert!(!root.exists(Path::new("/compat/c")));
    }
}
