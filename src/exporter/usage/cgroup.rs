//! Which pod and container a process belongs to, from its `/proc/<pid>/cgroup` file.
//!
//! The kubelet puts every pod in a cgroup named after the pod's UID, and the runtime puts each
//! container in one named after the container's ID under it. The names differ by cgroup driver,
//! and the file by cgroup version:
//!
//! | driver | pod | container |
//! |---|---|---|
//! | cgroupfs | `pod<uid>` | `<id>`, `crio-<id>`, `docker-<id>` |
//! | systemd | `kubepods-<qos>-pod<uid with _ for ->.slice` | `cri-containerd-<id>.scope`, `crio-<id>.scope`, `docker-<id>.scope` |
//!
//! cgroup v1 lists one line per hierarchy (`4:memory:/kubepods/…`), v2 one line (`0::/…`);
//! the first line whose path names a pod decides. A path under a container's cgroup (a
//! container that runs systemd) still belongs to that container; CRI-O's `crio-conmon-<id>`
//! monitor is no container. Pure: text in, [`Owner`] out.

/// The pod (and container, when the process is in one) a process runs in.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Owner {
    /// The pod's UID, as in its metadata (`xxxxxxxx-xxxx-…`).
    pub pod_uid: String,
    /// The container's ID without the runtime's prefix, as a pod's status shows after `://`.
    pub container_id: Option<String>,
}

/// The pod and container named by the contents of a `/proc/<pid>/cgroup` file; `None` for a
/// process outside any pod (or a file this does not recognise).
pub fn owner(cgroup_file: &str) -> Option<Owner> {
    cgroup_file.lines().find_map(|line| {
        // `hierarchy:controllers:path`; the path may itself hold ':'.
        let mut fields = line.splitn(3, ':');
        let path = fields.nth(2)?;
        owner_of_path(path)
    })
}

fn owner_of_path(path: &str) -> Option<Owner> {
    let mut segments = path.split('/').filter(|s| !s.is_empty());
    let pod_uid = segments.by_ref().find_map(pod_uid)?;
    let container_id = segments.next().and_then(container_id);
    Some(Owner {
        pod_uid,
        container_id,
    })
}

/// The pod UID a cgroup name holds: `pod<uid>` (cgroupfs) or `…-pod<uid_>.slice` (systemd).
fn pod_uid(segment: &str) -> Option<String> {
    let name = match segment.strip_suffix(".slice") {
        Some(slice) => slice.rsplit('-').next()?,
        None => segment,
    };
    let uid = name.strip_prefix("pod")?.replace('_', "-");
    is_uid(&uid).then_some(uid)
}

/// A UID in its usual form: 36 characters, hex digits and four dashes.
fn is_uid(text: &str) -> bool {
    text.len() == 36
        && text.bytes().all(|b| b == b'-' || b.is_ascii_hexdigit())
        && text.bytes().filter(|b| *b == b'-').count() == 4
}

/// The container ID a cgroup name holds, without the runtime's prefix and systemd's suffix.
fn container_id(segment: &str) -> Option<String> {
    let name = segment.strip_suffix(".scope").unwrap_or(segment);
    if name.starts_with("crio-conmon-") {
        return None;
    }
    let id = ["cri-containerd-", "crio-", "docker-", "containerd-"]
        .iter()
        .find_map(|prefix| name.strip_prefix(prefix))
        .unwrap_or(name);
    // Runtimes name containers by 64 hex digits; anything else is not a container's cgroup.
    (id.len() >= 12 && id.bytes().all(|b| b.is_ascii_hexdigit())).then(|| id.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    const UID: &str = "7f3c2a1e-9b4d-4c6e-8a2f-0123456789ab";
    const ID: &str = "4f1d2c3b4a5968778695a4b3c2d1e0f94f1d2c3b4a5968778695a4b3c2d1e0f9";

    fn expected() -> Option<Owner> {
        Some(Owner {
            pod_uid: UID.into(),
            container_id: Some(ID.into()),
        })
    }

    #[test]
    fn cgroup_v1_with_the_cgroupfs_driver() {
        let file = format!(
            "12:pids:/kubepods/burstable/pod{UID}/{ID}\n4:memory:/kubepods/burstable/pod{UID}/{ID}\n1:name=systemd:/kubepods/burstable/pod{UID}/{ID}\n"
        );
        assert_eq!(owner(&file), expected());
    }

    #[test]
    fn cgroup_v1_with_the_systemd_driver_and_containerd() {
        let uid = UID.replace('-', "_");
        let file = format!(
            "11:devices:/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{uid}.slice/cri-containerd-{ID}.scope\n0::/\n"
        );
        assert_eq!(owner(&file), expected());
    }

    #[test]
    fn cgroup_v2_with_the_systemd_driver_and_cri_o() {
        let uid = UID.replace('-', "_");
        let file = format!("0::/kubepods.slice/kubepods-pod{uid}.slice/crio-{ID}.scope\n");
        assert_eq!(
            owner(&file),
            expected(),
            "a guaranteed pod has no QoS level"
        );
    }

    #[test]
    fn cgroup_v2_with_the_cgroupfs_driver() {
        let file = format!("0::/kubepods/besteffort/pod{UID}/{ID}\n");
        assert_eq!(owner(&file), expected());
        // A container running systemd has cgroups of its own under the container's.
        let file = format!("0::/kubepods/besteffort/pod{UID}/{ID}/init.scope\n");
        assert_eq!(owner(&file), expected());
    }

    #[test]
    fn processes_outside_containers() {
        assert_eq!(owner("0::/system.slice/containerd.service\n"), None);
        assert_eq!(
            owner("0::/user.slice/user-1000.slice/session-3.scope\n"),
            None
        );
        assert_eq!(owner(""), None);
        assert_eq!(owner("garbage without colons"), None);
        // The pod's own cgroup (a process of the sandbox) and CRI-O's monitor: the pod, no
        // container.
        let pod_only = Some(Owner {
            pod_uid: UID.into(),
            container_id: None,
        });
        assert_eq!(owner(&format!("0::/kubepods/pod{UID}\n")), pod_only);
        let uid = UID.replace('-', "_");
        let conmon = format!("0::/kubepods.slice/kubepods-pod{uid}.slice/crio-conmon-{ID}.scope\n");
        assert_eq!(owner(&conmon), pod_only);
        // Names that merely look alike.
        assert_eq!(owner("0::/kubepods/podnot-a-uid/abc\n"), None);
        assert_eq!(owner("0::/kubepods.slice/kubepods-burstable.slice\n"), None);
    }
}
