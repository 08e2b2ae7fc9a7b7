//! `update-ldcache`: the container's linker cache learns the folders the driver's libraries
//! were mounted into.
//!
//! The folders are written to `/etc/ld.so.conf.d/00-nvcr-gpud.conf` inside the root (so a
//! later `ldconfig` in the container keeps them; `00-nvcr` sorts as NVIDIA's hook's files do),
//! and the host's ldconfig, a static binary the image cannot replace, is run with `-r <root>`:
//! it chroots into the root before it reads anything, so the `/etc/ld.so.conf` it reads and
//! the `/etc/ld.so.cache` it writes are the container's, never the host's. The folders are also given on its command
//! line, so they are in the cache even when the image's ld.so.conf has no `include` of
//! ld.so.conf.d. An image with neither `/etc/ld.so.cache` nor `/etc/ld.so.conf` does not use
//! glibc's cache (musl, static binaries) and is left alone.
//!
//! ldconfig runs with an empty environment (a fixed PATH only), stdin from /dev/null and the
//! default signal mask: nothing of the image's or the runtime's environment (`LD_PRELOAD`,
//! `LD_LIBRARY_PATH`) reaches it.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::error::HookError;
use super::root::Root;

/// The ldconfig run when `--ldconfig-path` is not given: the host's.
pub const DEFAULT_LDCONFIG: &str = "/sbin/ldconfig";

/// The folder of the linker's drop-in files inside the container.
pub const CONF_DIR: &str = "/etc/ld.so.conf.d";

/// gpud's drop-in for the mounted driver folders (one name, replaced on each run).
pub const CONF_NAME: &str = "00-nvcr-gpud.conf";

/// The only environment a child of the hook gets.
pub const CHILD_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

const CACHE: &str = "/etc/ld.so.cache";
const CONF: &str = "/etc/ld.so.conf";

/// What `update-ldcache` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Updated {
    /// The cache was rebuilt.
    Cache,
    /// The image uses no glibc linker cache; nothing was changed.
    NoCache,
}

/// Whether the image uses glibc's linker cache: it has `/etc/ld.so.cache` or
/// `/etc/ld.so.conf`.
pub fn uses_linker_cache(root: &Root) -> bool {
    root.exists(Path::new(CACHE)) || root.exists(Path::new(CONF))
}

/// The ldconfig named by `--ldconfig-path`: NVIDIA's `@` prefix (a host path) is accepted.
pub fn ldconfig_path(flag: &str) -> PathBuf {
    PathBuf::from(flag.strip_prefix('@').unwrap_or(flag))
}

/// Adds `folders` (paths inside the container) to the container's linker cache with the host's
/// `ldconfig`.
pub fn update(root: &Root, ldconfig: &Path, folders: &[String]) -> Result<Updated, HookError> {
    if !uses_linker_cache(root) {
        return Ok(Updated::NoCache);
    }
    let folders = distinct(folders);
    if !folders.is_empty() {
        root.write_file(
            Path::new(CONF_DIR),
            CONF_NAME,
            conf_lines(&folders).as_bytes(),
        )?;
    }
    run(ldconfig, &ldconfig_args(root.path(), &folders), root.path())?;
    Ok(Updated::Cache)
}

/// The folders once each, in their order.
fn distinct(folders: &[String]) -> Vec<&str> {
    let mut out: Vec<&str> = Vec::new();
    for folder in folders {
        if !folder.is_empty() && !out.contains(&folder.as_str()) {
            out.push(folder);
        }
    }
    out
}

/// A drop-in file naming `folders`, one a line.
pub fn conf_lines(folders: &[&str]) -> String {
    folders.iter().map(|f| format!("{f}\n")).collect()
}

/// ldconfig's arguments: the container root (`-r`: every path below is inside it), its
/// config and cache, then the folders.
fn ldconfig_args(root: &Path, folders: &[&str]) -> Vec<OsString> {
    let mut args: Vec<OsString> = vec![
        "-r".into(),
        root.into(),
        "-f".into(),
        CONF.into(),
        "-C".into(),
        CACHE.into(),
    ];
    args.extend(folders.iter().map(OsString::from));
    args
}

/// Runs `program` with `args`: a cleared environment but for [`CHILD_PATH`], stdin from
/// /dev/null, output kept for the error message. The standard library starts the child with
/// the default signal mask and dispositions.
fn run(program: &Path, args: &[OsString], root: &Path) -> Result<(), HookError> {
    let output = Command::new(program)
        .args(args)
        .env_clear()
        .env("PATH", CHILD_PATH)
        .stdin(Stdio::null())
        .output()
        .map_err(|source| HookError::StartLdconfig {
            path: program.to_owned(),
            source,
        })?;
    if output.status.success() {
        return Ok(());
    }
    let stderr = String::from_utf8_lossy(&output.stderr);
    Err(HookError::Ldconfig {
        path: program.to_owned(),
        root: root.to_owned(),
        status: output.status,
        stderr: stderr
            .lines()
            .rev()
            .find(|line| !line.trim().is_empty())
            .unwrap_or("no output")
            .to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn args_keep_every_path_inside_the_root() {
        let args = ldconfig_args(Path::new("/run/c1/rootfs"), &["/usr/lib/x86_64-linux-gnu"]);
        assert_eq!(
            args,
            [
                "-r",
                "/run/c1/rootfs",
                "-f",
                "/etc/ld.so.conf",
                "-C",
                "/etc/ld.so.cache",
                "/usr/lib/x86_64-linux-gnu"
            ]
            .map(OsString::from)
        );
    }

    #[test]
    fn folders_once_each_and_the_at_prefix() {
        let folders = [
            "/a".to_owned(),
            "/b".to_owned(),
            "/a".to_owned(),
            String::new(),
        ];
        assert_eq!(distinct(&folders), ["/a", "/b"]);
        assert_eq!(conf_lines(&["/a", "/b"]), "/a\n/b\n");
        assert_eq!(
            ldconfig_path("@/sbin/ldconfig"),
            PathBuf::from("/sbin/ldconfig")
        );
        assert_eq!(
            ldconfig_path("/sbin/ldconfig.real"),
            PathBuf::from("/sbin/ldconfig.real")
        );
    }

    #[test]
    fn an_image_without_a_linker_cache_is_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let root = Root::open(dir.path()).unwrap();
        let outcome = update(
            &root,
            Path::new("/nonexistent/ldconfig"),
            &["/x".to_owned()],
        );
        assert_eq!(outcome.unwrap(), Updated::NoCache);
        assert!(!dir.path().join("etc").exists());
    }

    #[test]
    fn a_failing_ldconfig_is_one_line_with_its_last_words() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("etc")).unwrap();
        std::fs::write(dir.path().join("etc/ld.so.conf"), "").unwrap();
        let root = Root::open(dir.path()).unwrap();
        let err = update(&root, Path::new("/bin/false"), &[]).unwrap_err();
        let text = err.to_string();
        assert!(
            text.starts_with("/bin/false failed for the container root"),
            "{text}"
        );
        let err = update(&root, Path::new("/nonexistent/ldconfig"), &[]).unwrap_err();
        assert!(err.to_string().contains("--ldconfig-path"), "{err}");
    }
}
