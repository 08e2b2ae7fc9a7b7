//! What was found on the host for a spec: driver files to mount, control device nodes, MIG
//! capability minors and the hook binary. Plain data; [`super::discover`] fills it from disk,
//! tests and other callers may build it by hand.

use std::collections::BTreeMap;

/// A file or socket to bind-mount: where it is on the host and where it goes in the
/// container (the host path without the driver root).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostPath {
    /// Path on the host, driver root included, e.g. `/run/nvidia/driver/usr/bin/nvidia-smi`.
    pub host: String,
    /// Path in the container, e.g. `/usr/bin/nvidia-smi`.
    pub container: String,
}

impl HostPath {
    /// `rel` (starting with `/`) under `root` (`/` for the host's own root).
    pub fn under(root: &str, rel: &str) -> Self {
        HostPath {
            host: join_root(root, rel),
            container: rel.to_owned(),
        }
    }

    /// The directory of the container path, e.g. `/usr/lib/x86_64-linux-gnu`.
    pub fn container_dir(&self) -> &str {
        match self.container.rfind('/') {
            Some(0) => "/",
            Some(at) => &self.container[..at],
            None => "",
        }
    }

    /// The file name, e.g. `libcuda.so.570.133.20`.
    pub fn file_name(&self) -> &str {
        self.container
            .rsplit('/')
            .next()
            .unwrap_or(self.container.as_str())
    }
}

/// `rel` (starting with `/`) under `root`; `root` `/` (or empty) leaves it unchanged.
pub fn join_root(root: &str, rel: &str) -> String {
    let root = root.trim_end_matches('/');
    format!("{root}{rel}")
}

/// Minors of the `/dev/nvidia-caps/nvidia-cap<N>` nodes that grant access to MIG GPU and
/// compute instances, by GPU minor number and instance ids.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MigCaps {
    /// The directory they were read from, e.g. `/proc/driver/nvidia/capabilities`; named in
    /// errors about a missing entry.
    pub source: String,
    gpu_instances: BTreeMap<(u32, u32), u32>,
    compute_instances: BTreeMap<(u32, u32, u32), u32>,
}

impl MigCaps {
    /// No capabilities, as read from `source`.
    pub fn new(source: impl Into<String>) -> Self {
        MigCaps {
            source: source.into(),
            ..MigCaps::default()
        }
    }

    /// Records the access minor of GPU instance `gi` on the GPU with minor `gpu_minor`.
    pub fn insert_gpu_instance(&mut self, gpu_minor: u32, gi: u32, cap_minor: u32) {
        self.gpu_instances.insert((gpu_minor, gi), cap_minor);
    }

    /// Records the access minor of compute instance `ci` in GPU instance `gi`.
    pub fn insert_compute_instance(&mut self, gpu_minor: u32, gi: u32, ci: u32, cap_minor: u32) {
        self.compute_instances
            .insert((gpu_minor, gi, ci), cap_minor);
    }

    /// The access minor of a GPU instance.
    pub fn gpu_instance(&self, gpu_minor: u32, gi: u32) -> Option<u32> {
        self.gpu_instances.get(&(gpu_minor, gi)).copied()
    }

    /// The access minor of a compute instance.
    pub fn compute_instance(&self, gpu_minor: u32, gi: u32, ci: u32) -> Option<u32> {
        self.compute_instances.get(&(gpu_minor, gi, ci)).copied()
    }

    /// Whether nothing was found (no MIG instances on the node, or no procfs).
    pub fn is_empty(&self) -> bool {
        self.gpu_instances.is_empty() && self.compute_instances.is_empty()
    }

    /// Where the access file of a GPU instance lives, for messages.
    pub fn gpu_instance_file(&self, gpu_minor: u32, gi: u32) -> String {
        format!("{}/gpu{gpu_minor}/mig/gi{gi}/access", self.source)
    }

    /// Where the access file of a compute instance lives, for messages.
    pub fn compute_instance_file(&self, gpu_minor: u32, gi: u32, ci: u32) -> String {
        format!("{}/gpu{gpu_minor}/mig/gi{gi}/ci{ci}/access", self.source)
    }
}

/// Everything found on the host that a spec refers to.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostFiles {
    /// Where the host's `/dev` lives (`/` normally, the driver root for a containerised
    /// driver). Device nodes get a `hostPath` under it when it is not `/`.
    pub dev_root: String,
    /// Control device nodes that exist, by container path, in spec order (`/dev/nvidiactl`,
    /// `/dev/nvidia-uvm`, `/dev/nvidia-uvm-tools`, `/dev/nvidia-modeset`).
    pub control_devices: Vec<String>,
    /// Versioned driver libraries (`lib*.so.<driver version>`).
    pub libraries: Vec<HostPath>,
    /// Driver utilities (`nvidia-smi`, `nvidia-persistenced` …).
    pub binaries: Vec<HostPath>,
    /// Sockets and pipe directories of driver daemons.
    pub ipc: Vec<HostPath>,
    /// GSP firmware files of this driver version.
    pub firmware: Vec<HostPath>,
    /// MIG capability minors.
    pub mig_caps: MigCaps,
    /// The `nvidia-cdi-hook` executable, when it exists on the host.
    pub hook: Option<String>,
}

impl HostFiles {
    /// The host path of a device node at `path` (`/dev/…`), `None` when it is the same.
    pub fn device_host_path(&self, path: &str) -> Option<String> {
        let root = self.dev_root.trim_end_matches('/');
        (!root.is_empty()).then(|| join_root(root, path))
    }

    /// The `libcuda.so.<version>` mount, if one was found.
    pub fn libcuda(&self) -> Option<&HostPath> {
        self.libraries
            .iter()
            .find(|lib| lib.file_name().starts_with("libcuda.so."))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_under_a_root() {
        let p = HostPath::under("/run/nvidia/driver/", "/usr/lib64/libcuda.so.570.1");
        assert_eq!(p.host, "/run/nvidia/driver/usr/lib64/libcuda.so.570.1");
        assert_eq!(p.container, "/usr/lib64/libcuda.so.570.1");
        assert_eq!(p.container_dir(), "/usr/lib64");
        assert_eq!(p.file_name(), "libcuda.so.570.1");
        assert_eq!(HostPath::under("/", "/bin/x").host, "/bin/x");
        assert_eq!(HostPath::under("/", "/x").container_dir(), "/");
    }

    #[test]
    fn device_host_path_only_off_the_host_root() {
        let mut host = HostFiles {
            dev_root: "/".into(),
            ..HostFiles::default()
        };
        assert_eq!(host.device_host_path("/dev/nvidia0"), None);
        host.dev_root = "/run/nvidia/driver".into();
        assert_eq!(
            host.device_host_path("/dev/nvidia0").as_deref(),
            Some("/run/nvidia/driver/dev/nvidia0")
        );
    }

    #[test]
    fn mig_caps_by_gpu_minor_and_ids() {
        let mut caps = MigCaps::new("/proc/driver/nvidia/capabilities");
        caps.insert_gpu_instance(0, 1, 12);
        caps.insert_compute_instance(0, 1, 0, 13);
        assert_eq!(caps.gpu_instance(0, 1), Some(12));
        assert_eq!(caps.compute_instance(0, 1, 0), Some(13));
        assert_eq!(caps.gpu_instance(1, 1), None);
        assert_eq!(caps.compute_instance(0, 1, 1), None);
        assert_eq!(
            caps.compute_instance_file(0, 1, 0),
            "/proc/driver/nvidia/capabilities/gpu0/mig/gi1/ci0/access"
        );
    }
}
