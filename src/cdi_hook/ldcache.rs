//! `update-ldcache`: the container's linker cache learns the folders the driver's libraries
//! were mounted into.
//!
//! The folders are written to `/etc/ld.so.conf.d/00-nvcr-gpud.conf` inside the root (so a
//! later `ldconfig` in the container keeps them; `00-nvcr` sorts as NVIDIA's hook's files do),
//! and the host's ldconfig, a static binary the image cannot replace, rebuilds the cache with
//! the container root as its `/` and nothing of the host's reachable from it (see
//! [`super::sandbox`]: a mount namespace of its own, no procfs, sysfs or `/dev`, `pivot_root`).
//! The folders are also given on its command line, so they are in the cache even when the
//! image's ld.so.conf has no `include` of ld.so.conf.d. An image with neither
//! `/etc/ld.so.cache` nor `/etc/ld.so.conf` does not use glibc's cache (musl, static binaries)
//! and is left alone.
//!
//! Everything ldconfig reads is the image's: its linker config, includes, folders, symlinks and
//! SONAMEs are hostile input. Besides the sandbox, ldconfig has a deadline ([`DEFAULT_DEADLINE`],
//! `--timeout`) after which its process group is killed, a cap on its memory and on the files
//! it writes, an empty environment (a fixed PATH only) and stdin from /dev/null.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use super::deadline::{self, Ended};
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

/// The image's linker cache and config, as ldconfig sees them from inside the root.
pub const CACHE: &str = "/etc/ld.so.cache";
pub const CONF: &str = "/etc/ld.so.conf";

/// How long ldconfig may take before it is ended and the container's start fails: a large
/// image takes about a second.
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(20);

/// How the sandbox's own errors start (gpud's error line), where ldconfig's start with its
/// name.
const SANDBOX_SAYS: &str = "gpud: cdi-hook: ";

/// The hidden subcommand of `gpud cdi-hook` that runs ldconfig inside the root.
pub const SANDBOX_COMMAND: &str = "ldconfig-sandbox";

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
/// `ldconfig`, ended after `deadline`.
pub fn update(
    root: &Root,
    ldconfig: &Path,
    folders: &[String],
    deadline: Duration,
) -> Result<Updated, HookError> {
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
    run_sandboxed(root.path(), ldconfig, &folders, deadline)?;
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

/// The sandbox's command line: gpud itself (`/proc/self/exe`, the binary that runs now even
/// if it was replaced since), the root, the ldconfig and the folders.
fn sandbox_command(root: &Path, ldconfig: &Path, folders: &[&str]) -> Command {
    let mut command = Command::new("/proc/self/exe");
    command
        .arg0("gpud")
        .args(["cdi-hook", SANDBOX_COMMAND, "--root"])
        .arg(root)
        .arg("--ldconfig-path")
        .arg(ldconfig);
    for folder in folders {
        command.arg("--folder").arg(folder);
    }
    command.env_clear().env("PATH", CHILD_PATH);
    command
}

/// Runs the sandbox (which runs ldconfig) and turns how it ended into the hook's error.
fn run_sandboxed(
    root: &Path,
    ldconfig: &Path,
    folders: &[&str],
    deadline: Duration,
) -> Result<(), HookError> {
    let command = sandbox_command(root, ldconfig, folders);
    let outcome = deadline::run(command, deadline).map_err(|source| HookError::Sandbox {
        step: "start the process",
        root: root.to_owned(),
        source,
    })?;
    // The sandbox's own failure (before ldconfig ran) is gpud's line: said as it is.
    let succeeded = matches!(outcome.ended, Ended::Exited(status) if status.success());
    if let Some(said) = outcome.last_line.strip_prefix(SANDBOX_SAYS)
        && !succeeded
    {
        return Err(HookError::Said(said.to_owned()));
    }
    match outcome.ended {
        Ended::Exited(status) if status.success() => Ok(()),
        Ended::Exited(status) => Err(HookError::Ldconfig {
            path: ldconfig.to_owned(),
            root: root.to_owned(),
            status,
            stderr: outcome.last_line,
        }),
        Ended::TimedOut => Err(HookError::LdconfigTimeout {
            path: ldconfig.to_owned(),
            root: root.to_owned(),
            secs: deadline.as_secs().max(1),
            stderr: outcome.last_line,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
            DEFAULT_DEADLINE,
        );
        assert_eq!(outcome.unwrap(), Updated::NoCache);
        assert!(!dir.path().join("etc").exists());
    }
}
