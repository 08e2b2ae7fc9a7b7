//! Which mounts under a container root the linker cache's sandbox takes away: every mount of
//! a kernel filesystem (procfs, sysfs, devpts, cgroup, …) and everything at or under the
//! root's `/proc`, `/sys` and `/dev`.
//!
//! At `createContainer` the runtime has already mounted the container's procfs in its root,
//! and `/proc/1/root` there is the host's `/` (the container's first process has not pivoted
//! yet). A path through it, in the image's `ld.so.conf`, a library folder's symlink or a
//! library's SONAME, is a way out of the container for anything that follows paths inside the
//! root; so is sysfs (links to devices) and the runtime's `/dev`. Without those mounts the
//! root holds only the image's files and the volumes and driver folders mounted into it.
//!
//! The list is read from `/proc/self/mountinfo` (see proc(5)), which the kernel writes, so
//! the mount points in it are real paths, not the image's symlinks.

use std::path::{Path, PathBuf};

/// Kernel filesystems that never belong in the linker cache's view, wherever they are mounted.
const KERNEL_FILESYSTEMS: &[&str] = &[
    "proc",
    "sysfs",
    "devtmpfs",
    "devpts",
    "mqueue",
    "cgroup",
    "cgroup2",
    "securityfs",
    "debugfs",
    "tracefs",
    "bpf",
    "configfs",
    "fusectl",
    "binfmt_misc",
    "efivarfs",
    "pstore",
    "hugetlbfs",
    "autofs",
    "nsfs",
    "rpc_pipefs",
    "selinuxfs",
];

/// Folders of the container whose mounts are the runtime's view of the host, whatever their
/// filesystem (`/dev` is a tmpfs holding the host's device nodes).
const HOST_VIEWS: &[&str] = &["proc", "sys", "dev"];

/// One line of mountinfo: where it is mounted and what filesystem it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    /// The mount point, unescaped.
    pub point: PathBuf,
    /// The filesystem type (`proc`, `ext4`, `fuse.lxcfs`, …).
    pub fstype: String,
}

/// The mounts of a mountinfo text, in its order (parents before their children). Lines that
/// do not have the fields proc(5) describes are skipped: the kernel writes this file, and a
/// line it adds in a later format would still have them.
pub fn parse(text: &str) -> Vec<Mount> {
    text.lines().filter_map(parse_line).collect()
}

fn parse_line(line: &str) -> Option<Mount> {
    let (fields, rest) = line.split_once(" - ")?;
    let point = fields.split(' ').nth(4)?;
    let fstype = rest.split(' ').next()?;
    Some(Mount {
        point: PathBuf::from(unescape(point)),
        fstype: fstype.to_owned(),
    })
}

/// Undoes the kernel's octal escapes (`\040` for a space, `\011`, `\012`, `\134`).
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .filter(|digits| bytes[i] == b'\\' && digits.iter().all(|d| (b'0'..=b'7').contains(d)))
            .map(|d| (d[0] - b'0') * 64 + (d[1] - b'0') * 8 + (d[2] - b'0'));
        match octal {
            Some(byte) => {
                out.push(byte);
                i += 4;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The mount points under `root` (not `root` itself) to take away, deepest first, so each is
/// detached before the mount it sits on.
pub fn to_detach(mounts: &[Mount], root: &Path) -> Vec<PathBuf> {
    let views: Vec<PathBuf> = HOST_VIEWS.iter().map(|view| root.join(view)).collect();
    let mut out: Vec<PathBuf> = mounts
        .iter()
        .filter(|mount| mount.point != root && mount.point.starts_with(root))
        .filter(|mount| {
            is_kernel_filesystem(&mount.fstype)
                || views.iter().any(|view| mount.point.starts_with(view))
        })
        .map(|mount| mount.point.clone())
        .collect();
    out.sort_by_key(|point| std::cmp::Reverse(point.components().count()));
    out.dedup();
    out
}

fn is_kernel_filesystem(fstype: &str) -> bool {
    KERNEL_FILESYSTEMS.contains(&fstype)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What runc leaves in a container's mount namespace at createContainer, abridged.
    const RUNC: &str = "\
22 1 254:1 / / rw,relatime shared:1 - ext4 /dev/vda1 rw
25 22 0:22 / /proc rw,nosuid,nodev,noexec,relatime shared:12 - proc proc rw
300 22 0:50 / /run/c1/rootfs rw,relatime - overlay overlay rw,lowerdir=/l,upperdir=/u
301 300 0:51 / /run/c1/rootfs/proc rw,nosuid,nodev,noexec,relatime - proc proc rw
302 300 0:52 / /run/c1/rootfs/dev rw,nosuid - tmpfs tmpfs rw,size=65536k,mode=755
303 302 0:53 / /run/c1/rootfs/dev/pts rw,nosuid,noexec - devpts devpts rw,gid=5
304 302 0:54 / /run/c1/rootfs/dev/shm rw,nosuid,nodev - tmpfs shm rw,size=65536k
305 300 0:55 / /run/c1/rootfs/sys ro,nosuid,nodev,noexec - sysfs sysfs ro
306 305 0:56 / /run/c1/rootfs/sys/fs/cgroup ro - cgroup2 cgroup rw
307 300 254:1 /usr/lib/nvidia /run/c1/rootfs/usr/lib/x86_64-linux-gnu/nvidia ro - ext4 /dev/vda1 rw
308 300 254:1 /data /run/c1/rootfs/my\\040data rw - ext4 /dev/vda1 rw
309 300 0:57 / /run/c1/rootfs/mnt/proc-again rw - proc proc rw
310 301 254:1 /null /run/c1/rootfs/proc/kcore rw - ext4 /dev/vda1 rw
";

    #[test]
    fn kernel_filesystems_and_the_host_views_go_deepest_first_and_the_rest_stays() {
        let mounts = parse(RUNC);
        assert_eq!(mounts.len(), 13);
        assert_eq!(mounts[10].point, PathBuf::from("/run/c1/rootfs/my data"));
        let detach = to_detach(&mounts, Path::new("/run/c1/rootfs"));
        let detach: Vec<&str> = detach.iter().map(|p| p.to_str().unwrap()).collect();
        assert_eq!(
            detach,
            [
                "/run/c1/rootfs/sys/fs/cgroup",
                "/run/c1/rootfs/dev/pts",
                "/run/c1/rootfs/dev/shm",
                "/run/c1/rootfs/mnt/proc-again",
                "/run/c1/rootfs/proc/kcore",
                "/run/c1/rootfs/proc",
                "/run/c1/rootfs/dev",
                "/run/c1/rootfs/sys",
            ]
        );
    }

    #[test]
    fn a_root_with_nothing_mounted_in_it_has_nothing_to_detach() {
        let mounts = parse(RUNC);
        assert!(to_detach(&mounts, Path::new("/run/c2/rootfs")).is_empty());
        // A sibling whose name starts like the root is not under it.
        assert!(to_detach(&mounts, Path::new("/run/c1/root")).is_empty());
    }

    #[test]
    fn escapes_and_lines_without_the_separator() {
        assert_eq!(unescape("a\\040b\\011c\\134d"), "a b\tc\\d");
        assert_eq!(unescape("trailing\\04"), "trailing\\04");
        assert!(parse("garbage line\n\n").is_empty());
    }
}
