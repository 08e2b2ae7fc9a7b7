//! The process that rebuilds a container's linker cache: the host's ldconfig, with the
//! container's root as its `/` and nothing of the host's in it.
//!
//! ldconfig follows every path the image gives it: `/etc/ld.so.conf` and its includes, the
//! library folders and their symlinks, and each library's SONAME, of which it makes a link.
//! `ldconfig -r <root>` only chroots, and at `createContainer` the container's procfs is
//! already mounted in the root, where `/proc/1/root` is the host's `/`; a path through it
//! would make the host's ldconfig write links or a cache on the host. So this process, started
//! by the hook as `gpud cdi-hook ldconfig-sandbox` (a fresh, single-threaded process):
//!
//! 1. opens the host's ldconfig and checks it is a static program (see [`super::elf`]): after
//!    step 4 it runs from that descriptor, and a dynamic one would load the image's libc;
//! 2. enters a mount namespace of its own whose mounts propagate nowhere;
//! 3. detaches every kernel filesystem under the root and everything at or under its `/proc`,
//!    `/sys` and `/dev` (see [`super::mountinfo`]), then binds what is left of the root (the
//!    image's files, its volumes, the driver folders a CDI spec mounted) onto itself;
//! 4. makes that its root with `pivot_root` and detaches the old one, so no path (absolute,
//!    `..`, a symlink, a magic link) leads back to the host;
//! 5. caps its memory, the size of a file it writes and core dumps, sets `no_new_privs`, and
//!    runs ldconfig from the descriptor with only `PATH` in its environment.
//!
//! The hook gives it a deadline and ends its process group when it passes; a FIFO or a huge
//! file named in the image's linker config ends there.

use std::convert::Infallible;
use std::ffi::CString;
use std::fs::File;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use nix::mount::{MntFlags, MsFlags, mount, umount2};
use nix::sched::{CloneFlags, unshare};
use nix::sys::resource::{Resource, setrlimit};

use super::elf::{self, Program};
use super::error::HookError;
use super::ldcache::{CACHE, CHILD_PATH, CONF};
use super::mountinfo;
use super::root::Root;

/// Most address space ldconfig may use: it needs a few MiB; a linker config of a GiB fails.
const MAX_MEMORY: u64 = 256 * 1024 * 1024;

/// Largest file ldconfig may write (its cache is a few hundred KiB).
const MAX_FILE: u64 = 64 * 1024 * 1024;

/// Largest mountinfo read (a node with thousands of mounts has a few MiB).
const MAX_MOUNTINFO: u64 = 16 * 1024 * 1024;

/// procfs's magic number: no procfs may be left at the new root's `/proc`.
const PROC_SUPER_MAGIC: u64 = 0x9fa0;

/// Runs `ldconfig` (a host path) for `folders` with `root` as its root. Returns only on
/// failure: on success the process is ldconfig.
pub fn exec_ldconfig(
    root: &Path,
    ldconfig: &Path,
    folders: &[String],
) -> Result<Infallible, HookError> {
    let step = |what: &'static str| {
        move |source: nix::Error| HookError::Sandbox {
            step: what,
            root: root.to_owned(),
            source: source.into(),
        }
    };
    let (program, path) = open_static(ldconfig)?;
    // The root as the kernel names it in mountinfo; Root::open refuses the host's own `/`.
    Root::open(root)?;
    let real_root = std::fs::canonicalize(root).map_err(|source| HookError::OpenRoot {
        path: root.to_owned(),
        source,
    })?;

    unshare(CloneFlags::CLONE_NEWNS).map_err(step("enter a mount namespace of its own"))?;
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .map_err(step("make its mounts private"))?;
    let text = crate::files::read_bytes(Path::new("/proc/self/mountinfo"), MAX_MOUNTINFO).map_err(
        |err| HookError::Sandbox {
            step: "list its mounts",
            root: root.to_owned(),
            source: std::io::Error::other(err.to_string()),
        },
    )?;
    let mounts = mountinfo::parse(&String::from_utf8_lossy(&text));
    for point in mountinfo::to_detach(&mounts, &real_root) {
        umount2(&point, MntFlags::MNT_DETACH | MntFlags::UMOUNT_NOFOLLOW).map_err(|source| {
            HookError::Sandbox {
                step: "detach a host view",
                root: point.clone(),
                source: source.into(),
            }
        })?;
    }
    mount(
        Some(&real_root),
        &real_root,
        None::<&str>,
        MsFlags::MS_BIND | MsFlags::MS_REC,
        None::<&str>,
    )
    .map_err(step("bind the root onto itself"))?;
    nix::unistd::chdir(&real_root).map_err(step("enter the root"))?;
    nix::unistd::pivot_root(".", ".").map_err(step("make the root its root"))?;
    umount2(".", MntFlags::MNT_DETACH).map_err(step("detach the host's root"))?;
    nix::unistd::chdir("/").map_err(step("enter the new root"))?;
    if rustix::fs::statfs("/proc").is_ok_and(|fs| fs.f_type as u64 == PROC_SUPER_MAGIC) {
        return Err(HookError::Sandbox {
            step: "check that no procfs is left",
            root: root.to_owned(),
            source: std::io::Error::other("a procfs is still mounted at /proc"),
        });
    }

    for (resource, limit) in [
        (Resource::RLIMIT_AS, MAX_MEMORY),
        (Resource::RLIMIT_FSIZE, MAX_FILE),
        (Resource::RLIMIT_CORE, 0),
    ] {
        setrlimit(resource, limit, limit).map_err(step("limit its resources"))?;
    }
    nix::sys::prctl::set_no_new_privs().map_err(step("set no_new_privs"))?;
    let arguments = |err: std::ffi::NulError| HookError::Sandbox {
        step: "pass its arguments",
        root: root.to_owned(),
        source: std::io::Error::other(err),
    };
    let args = ldconfig_args(folders).map_err(arguments)?;
    let env = [CString::new(format!("PATH={CHILD_PATH}")).map_err(arguments)?];
    let Err(source) = nix::unistd::fexecve(program.as_fd(), &args, &env);
    Err(HookError::StartLdconfig {
        path,
        source: source.into(),
    })
}

/// ldconfig's argv: its config and cache (inside its new root), then the folders.
pub fn ldconfig_args(folders: &[String]) -> Result<Vec<CString>, std::ffi::NulError> {
    ["ldconfig", "-f", CONF, "-C", CACHE]
        .into_iter()
        .chain(folders.iter().map(String::as_str))
        .map(CString::new)
        .collect()
}

/// Opens the ldconfig at `path`, or Ubuntu's `<path>.real` when `path` is the script that
/// runs it, and checks that it is static.
fn open_static(path: &Path) -> Result<(File, PathBuf), HookError> {
    let open = |path: &Path| -> Result<(File, Program), HookError> {
        let start = |source| HookError::StartLdconfig {
            path: path.to_owned(),
            source,
        };
        let file = File::open(path).map_err(start)?;
        let kind = elf::classify(&file).map_err(start)?;
        Ok((file, kind))
    };
    let (file, kind) = open(path)?;
    if kind == Program::Static {
        return Ok((file, path.to_owned()));
    }
    let mut real = path.as_os_str().to_owned();
    real.push(".real");
    let real = PathBuf::from(real);
    if kind == Program::Script && real.exists() {
        let (file, real_kind) = open(&real)?;
        if real_kind == Program::Static {
            return Ok((file, real));
        }
    }
    Err(HookError::NotStatic {
        path: path.to_owned(),
        kind: match kind {
            Program::Dynamic => "a dynamically linked program",
            Program::Script => "a script",
            _ => "not an ELF program",
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ldconfig_is_told_paths_inside_its_new_root_only() {
        let args = ldconfig_args(&["/usr/lib/x86_64-linux-gnu".to_owned()]).unwrap();
        let args: Vec<&str> = args.iter().map(|a| a.to_str().unwrap()).collect();
        assert_eq!(
            args,
            [
                "ldconfig",
                "-f",
                "/etc/ld.so.conf",
                "-C",
                "/etc/ld.so.cache",
                "/usr/lib/x86_64-linux-gnu"
            ]
        );
        assert!(ldconfig_args(&["/a\0b".to_owned()]).is_err());
    }

    #[test]
    fn a_script_or_a_dynamic_ldconfig_is_refused_and_a_script_beside_a_static_real_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("ldconfig");
        std::fs::write(&script, "#!/bin/sh\nexec /sbin/ldconfig.real \"$@\"\n").unwrap();
        let err = open_static(&script).unwrap_err().to_string();
        assert!(err.contains("is a script"), "{err}");
        let dynamic = std::env::current_exe().unwrap();
        let err = open_static(&dynamic).unwrap_err().to_string();
        assert!(err.contains("dynamically linked"), "{err}");
        let static_ldconfig = ["/sbin/ldconfig.real", "/sbin/ldconfig"]
            .into_iter()
            .find(|path| Path::new(path).exists())
            .unwrap();
        std::fs::copy(static_ldconfig, dir.path().join("ldconfig.real")).unwrap();
        let (_, chosen) = open_static(&script).unwrap();
        assert_eq!(chosen, dir.path().join("ldconfig.real"));
    }
}
