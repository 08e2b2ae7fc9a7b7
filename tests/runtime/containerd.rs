//! A real containerd for tests: one of the daemons tests/runtime/fetch-containerd.sh unpacked
//! (1.7 from trixie, 2.x from sid), run as root in the test's own folder with bookworm's runc,
//! no CNI (host-network pods) and an image imported from a local archive (a static busybox and
//! the host's static ldconfig), so no registry is needed.
//!
//! Nothing outside the folder changes: containerd puts its shims' sockets in
//! `/run/containerd/s` whatever `--state` says, so it runs in a private mount namespace with a
//! tmpfs there; the pods' cgroups live under a parent named after the test process. Dropping a
//! [`Containerd`] kills the daemon, its shims and every process left in those cgroups, and
//! removes the cgroup folders.

#![allow(dead_code)]

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use std::collections::HashMap;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use toml_edit::DocumentMut;

use super::common::{gpud_bin, tool_missing, until};
use super::cri_api::{
    ContainerConfig, ContainerMetadata, Cri, ImageSpec, LinuxContainerConfig,
    LinuxContainerSecurityContext, LinuxPodSandboxConfig, LinuxSandboxSecurityContext, NODE,
    NamespaceOption, PodSandboxConfig, PodSandboxMetadata,
};

/// The image every pod and container runs (also the sandbox's "pause" image).
pub const IMAGE: &str = "localhost/gpud-test/busybox:1";

/// What a containerd build is called here: the Debian suite it came from and what it is.
#[derive(Debug, Clone, Copy)]
pub struct Build {
    pub suite: &'static str,
    /// The version `containerd --version` must start with.
    pub version: &'static str,
    /// The config file version its `config default` writes.
    pub config_version: i64,
}

pub const V1_7: Build = Build {
    suite: "trixie",
    version: "1.7.",
    config_version: 2,
};
pub const V2: Build = Build {
    suite: "sid",
    version: "2.",
    config_version: 3,
};

fn fetched() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("target/containerd")
}

/// bookworm's runc (trixie's needs a newer glibc than these machines have).
fn runc() -> Option<PathBuf> {
    ["/usr/sbin/runc", "/usr/bin/runc"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
}

/// Whether the suite cannot run here: root, runc, unshare, cc and the fetched containerd build
/// and busybox are needed; without them it is skipped, or fails when `CI` is set.
pub fn missing(build: Build) -> bool {
    let bin = fetched().join(build.suite);
    let is_root = nix::unistd::geteuid().is_root();
    let tools = ["containerd", "containerd-shim-runc-v2", "ctr"]
        .iter()
        .all(|b| bin.join(b).exists())
        && fetched().join("busybox").exists();
    let works = |tool: &str| {
        Command::new(tool)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    };
    tool_missing(
        !(is_root && tools && runc().is_some() && works("unshare") && works("cc")),
        "root, runc, unshare, cc and containerd 1.7 and 2.x with busybox under target/containerd \
         (tests/runtime/fetch-containerd.sh) are required (CI is set)",
        &format!(
            "skipping: the containerd {}x suite needs root, runc, unshare, cc and \
             tests/runtime/fetch-containerd.sh's binaries",
            build.version
        ),
    )
}

/// A containerd with its own folder, config, socket and CDI spec folder.
pub struct Containerd {
    pub build: Build,
    pub dir: tempfile::TempDir,
    /// The folder its binaries are in (put first on PATH: the shim is looked up there).
    pub bin: PathBuf,
    pub config: PathBuf,
    pub socket: PathBuf,
    /// The CDI spec folder `gpud runtime configure` names.
    pub cdi: PathBuf,
    /// The cgroup every pod of this daemon goes under (relative to each hierarchy's root).
    pub cgroup: String,
    child: Option<Child>,
}

impl Containerd {
    /// A folder with containerd's default config, its host paths moved into the folder; not
    /// yet configured by gpud nor started.
    pub fn prepare(build: Build) -> Containerd {
        let dir = tempfile::Builder::new()
            .prefix("gpud-cri-")
            .tempdir()
            .unwrap();
        let bin = fetched().join(build.suite);
        let cdi = dir.path().join("cdi");
        fs::create_dir_all(&cdi).unwrap();
        let config = dir.path().join("config.toml");
        let socket = dir.path().join("run/containerd.sock");
        let cgroup = format!("gpud-cri-test-{}-{}", std::process::id(), build.suite);
        let containerd = Containerd {
            build,
            dir,
            bin,
            config,
            socket,
            cdi,
            cgroup,
            child: None,
        };
        let mut default = containerd.command("containerd", &["config", "default"]);
        let default = super::common::stdout_ok(&default.output().unwrap());
        fs::write(&containerd.config, containerd.in_own_folders(&default)).unwrap();
        containerd
    }

    fn path(&self, rel: &str) -> String {
        self.dir.path().join(rel).display().to_string()
    }

    /// `program args…` from this build's folder, with the folder first on PATH.
    pub fn command(&self, program: &str, args: &[&str]) -> Command {
        let mut cmd = Command::new(self.bin.join(program));
        cmd.args(args).env("PATH", self.search_path());
        cmd
    }

    fn search_path(&self) -> String {
        format!(
            "{}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            self.bin.display()
        )
    }

    /// containerd's default config with every host folder it would write to (root, state,
    /// socket, opt, CNI, the verifier's folder, runc's state) in this folder, bookworm's runc
    /// as the runc binary, and what this machine needs: the sandbox image imported here, no
    /// `oom_score_adj` below the daemon's own (the sandbox lacks CAP_SYS_RESOURCE), NRI off
    /// (2.x turns it on, with its socket in /var/run/nri).
    fn in_own_folders(&self, default: &str) -> String {
        let mut doc: DocumentMut = default.parse().unwrap();
        let version = doc.get("version").and_then(|v| v.as_integer()).unwrap();
        assert_eq!(
            version, self.build.config_version,
            "containerd {}x writes config version {version}",
            self.build.version
        );
        set(&mut doc, &["root"], self.path("root"));
        set(&mut doc, &["state"], self.path("state"));
        set(
            &mut doc,
            &["grpc", "address"],
            self.path("run/containerd.sock"),
        );
        let opt = ["plugins", "io.containerd.internal.v1.opt", "path"];
        set(&mut doc, &opt, self.path("opt"));
        let runc = runc().unwrap().display().to_string();
        let (images, runtime) = if version == 2 {
            ("io.containerd.grpc.v1.cri", "io.containerd.grpc.v1.cri")
        } else {
            (
                "io.containerd.cri.v1.images",
                "io.containerd.cri.v1.runtime",
            )
        };
        if version == 2 {
            set(&mut doc, &["plugins", images, "sandbox_image"], IMAGE);
            set(
                &mut doc,
                &["plugins", runtime, "cni", "bin_dir"],
                self.path("cni/bin"),
            );
        } else {
            let verifier = [
                "plugins",
                "io.containerd.image-verifier.v1.bindir",
                "bin_dir",
            ];
            set(&mut doc, &verifier, self.path("verifier"));
            let pinned = ["plugins", images, "pinned_images", "sandbox"];
            set(&mut doc, &pinned, IMAGE);
            let bins = toml_edit::Array::from_iter([self.path("cni/bin")]);
            set(&mut doc, &["plugins", runtime, "cni", "bin_dirs"], bins);
            set(
                &mut doc,
                &["plugins", "io.containerd.nri.v1.nri", "disable"],
                true,
            );
        }
        set(
            &mut doc,
            &["plugins", runtime, "cni", "conf_dir"],
            self.path("cni/net.d"),
        );
        set(
            &mut doc,
            &["plugins", runtime, "restrict_oom_score_adj"],
            true,
        );
        let options = [
            "plugins",
            runtime,
            "containerd",
            "runtimes",
            "runc",
            "options",
        ];
        let at =
            |key: &'static str| -> Vec<&str> { options.iter().copied().chain([key]).collect() };
        set(&mut doc, &at("BinaryName"), runc);
        set(&mut doc, &at("Root"), self.path("runc"));
        set(&mut doc, &at("SystemdCgroup"), false);
        doc.to_string()
    }

    /// `gpud runtime configure --runtime containerd <args…> --config <this config>`, with
    /// this build first on PATH (gpud asks `containerd --version` what it runs).
    pub fn configure(&self, args: &[&str]) -> Output {
        let output = Command::new(gpud_bin())
            .args(["runtime", "configure", "--runtime", "containerd"])
            .args(args)
            .arg("--config")
            .arg(&self.config)
            .env("PATH", self.search_path())
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "gpud runtime configure {args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        output
    }

    /// Starts the daemon in a private mount namespace and waits for its socket.
    pub fn start(&mut self) {
        assert!(self.child.is_none(), "containerd already runs");
        let _ = fs::remove_file(&self.socket);
        let log = fs::File::options()
            .create(true)
            .append(true)
            .open(self.dir.path().join("containerd.log"))
            .unwrap();
        // The tmpfs over /run/containerd (or /run, where that folder does not exist) is seen
        // only in the new namespace and goes with its last process.
        let script = "set -e
            if [ -d /run/containerd ]; then mount -t tmpfs -o mode=0711 gpud-test /run/containerd
            else mount -t tmpfs -o mode=0755 gpud-test /run; mkdir /run/containerd; fi
            exec containerd --config \"$1\" --address \"$2\"";
        let child = Command::new("unshare")
            .args([
                "--mount",
                "--propagation",
                "private",
                "--",
                "sh",
                "-c",
                script,
                "sh",
            ])
            .arg(&self.config)
            .arg(&self.socket)
            .env_clear()
            .env("PATH", self.search_path())
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        self.child = Some(child);
        until("containerd's socket", 20, || {
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("containerd exited ({status}):\n{}", self.log());
            }
            if self.socket.exists() {
                Ok(())
            } else {
                Err(self.log())
            }
        });
    }

    pub fn log(&self) -> String {
        fs::read_to_string(self.dir.path().join("containerd.log")).unwrap_or_default()
    }

    /// Stops the daemon (SIGTERM, then SIGKILL after 10 s) and waits for it.
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let pid = Pid::from_raw(i32::try_from(child.id()).unwrap());
        let _ = kill(pid, Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(10);
        while child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
    }

    /// Imports the test image (built here) into the CRI plugin's namespace.
    pub async fn import_image(&self, cri: &mut Cri) {
        self.import(cri, IMAGE, &busybox_layer()).await;
    }

    /// Imports an image named `name` of one `layer` (a tar) into the CRI plugin's namespace,
    /// and waits until the plugin knows it.
    pub async fn import(&self, cri: &mut Cri, name: &str, layer: &[u8]) {
        let archive = self
            .dir
            .path()
            .join(format!("{}.tar", name.replace(['/', ':'], "_")));
        write_image(&archive, name, layer);
        let output = self
            .command("ctr", &["-a"])
            .arg(&self.socket)
            .args([
                "-n",
                "k8s.io",
                "images",
                "import",
                "--snapshotter",
                "overlayfs",
            ])
            .arg(&archive)
            .output()
            .unwrap();
        assert!(output.status.success(), "ctr images import: {output:?}");
        let deadline = Instant::now() + Duration::from_secs(10);
        while !cri.has_image(name).await {
            assert!(
                Instant::now() < deadline,
                "CRI does not know {name} 10 s after its import"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The cgroup parent of pod `uid`, as the kubelet's cgroupfs driver names a pod's.
    pub fn cgroup_parent(&self, uid: &str) -> String {
        format!("/{}/pod{uid}", self.cgroup)
    }

    /// Kills what the daemon left (its shims, any process in its pods' cgroups) and removes
    /// the cgroup folders, deepest first.
    fn clean_up(&mut self) {
        self.stop();
        let socket = self.socket.display().to_string();
        for pid in processes_naming(&socket) {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
        for root in cgroup_roots(&self.cgroup) {
            remove_cgroup(&root);
        }
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        self.clean_up();
    }
}

/// Sets `keys` (tables created as needed) to `value`.
fn set(doc: &mut DocumentMut, keys: &[&str], value: impl Into<toml_edit::Value>) {
    let (last, parents) = keys.split_last().unwrap();
    let mut table = doc.as_table_mut();
    for key in parents {
        let item = table.entry(key).or_insert(toml_edit::table());
        table = item
            .as_table_mut()
            .unwrap_or_else(|| panic!("{keys:?}: {key} is not a table"));
    }
    table[last] = toml_edit::value(value);
}

/// Every folder of cgroup `name` (relative to each hierarchy's root) that exists.
pub fn cgroup_roots(name: &str) -> Vec<PathBuf> {
    let base = Path::new("/sys/fs/cgroup");
    let mut roots = vec![base.join(name)];
    if let Ok(entries) = fs::read_dir(base) {
        for entry in entries.flatten() {
            roots.push(entry.path().join(name));
        }
    }
    roots.retain(|p| p.is_dir());
    roots
}

/// The processes whose command line names `text` (the shims name their daemon's socket).
pub fn processes_naming(text: &str) -> Vec<i32> {
    let mut pids = Vec::new();
    for entry in fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(cmdline) = fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        if String::from_utf8_lossy(&cmdline).contains(text) && pid != std::process::id() as i32 {
            pids.push(pid);
        }
    }
    pids
}

/// Kills every process under `dir` and removes it, deepest first.
fn remove_cgroup(dir: &Path) {
    if let Ok(entries) = fs::read_dir(dir) {
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                remove_cgroup(&entry.path());
            }
        }
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let procs = fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
        for pid in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
        if fs::remove_dir(dir).is_ok() || !dir.exists() || Instant::now() > deadline {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The busybox applets the tests run.
const APPLETS: &[&str] = &[
    "sh", "sleep", "cat", "ls", "env", "readlink", "stat", "test", "echo", "grep", "head",
];

/// The test image's one layer: busybox with its applets, the host's static ldconfig and a
/// linker config that includes its drop-ins (as a glibc image has).
pub fn busybox_layer() -> Vec<u8> {
    let busybox = fs::read(fetched().join("busybox")).unwrap();
    let ldconfig = fs::read("/sbin/ldconfig").unwrap();
    let mut layer = tar::Builder::new(Vec::new());
    for dir in [
        "bin",
        "sbin",
        "dev",
        "proc",
        "sys",
        "etc",
        "etc/ld.so.conf.d",
        "tmp",
    ] {
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(tar::EntryType::Directory);
        header.set_mode(if dir == "tmp" { 0o1777 } else { 0o755 });
        header.set_size(0);
        layer
            .append_data(&mut header, dir, std::io::empty())
            .unwrap();
    }
    let ld_conf = b"include /etc/ld.so.conf.d/*.conf\n";
    for (path, bytes, mode) in [
        ("bin/busybox", &busybox[..], 0o755),
        ("sbin/ldconfig", &ldconfig[..], 0o755),
        ("etc/ld.so.conf", &ld_conf[..], 0o644),
    ] {
        let mut header = tar::Header::new_gnu();
        header.set_mode(mode);
        header.set_size(bytes.len() as u64);
        layer.append_data(&mut header, path, bytes).unwrap();
    }
    for applet in APPLETS {
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(tar::EntryType::Symlink);
        header.set_size(0);
        header.set_mode(0o777);
        layer
            .append_link(&mut header, format!("bin/{applet}"), "busybox")
            .unwrap();
    }
    layer.into_inner().unwrap()
}

/// A layer holding the folder `root` as it is: folders, files, symlinks and FIFOs (the
/// hostile images' parts), owned by root.
pub fn layer_of(root: &Path) -> Vec<u8> {
    fn add(layer: &mut tar::Builder<Vec<u8>>, root: &Path, dir: &Path) {
        let mut entries: Vec<_> = fs::read_dir(dir).unwrap().flatten().collect();
        entries.sort_by_key(std::fs::DirEntry::file_name);
        for entry in entries {
            let path = entry.path();
            let name = path.strip_prefix(root).unwrap();
            let meta = fs::symlink_metadata(&path).unwrap();
            let mut header = tar::Header::new_gnu();
            header.set_mode(std::os::unix::fs::PermissionsExt::mode(&meta.permissions()));
            header.set_size(0);
            let kind = meta.file_type();
            if kind.is_dir() {
                header.set_entry_type(tar::EntryType::Directory);
                layer
                    .append_data(&mut header, name, std::io::empty())
                    .unwrap();
                add(layer, root, &path);
            } else if kind.is_symlink() {
                header.set_entry_type(tar::EntryType::Symlink);
                let target = fs::read_link(&path).unwrap();
                layer.append_link(&mut header, name, target).unwrap();
            } else if std::os::unix::fs::FileTypeExt::is_fifo(&kind) {
                header.set_entry_type(tar::EntryType::Fifo);
                layer
                    .append_data(&mut header, name, std::io::empty())
                    .unwrap();
            } else {
                let bytes = fs::read(&path).unwrap();
                header.set_size(bytes.len() as u64);
                layer.append_data(&mut header, name, &bytes[..]).unwrap();
            }
        }
    }
    let mut layer = tar::Builder::new(Vec::new());
    add(&mut layer, root, root);
    layer.into_inner().unwrap()
}

/// Writes an OCI image-layout archive of image `name` with one `layer`, run as `/bin/busybox
/// sleep` by default (the sandbox's "pause" process).
fn write_image(archive: &Path, name: &str, layer: &[u8]) {
    let diff_id = sha256(layer);
    let config = serde_json::json!({
        "architecture": "amd64", "os": "linux",
        "config": {"Entrypoint": ["/bin/busybox"], "Cmd": ["sleep", "100000"],
                   "Env": ["PATH=/bin:/sbin"], "WorkingDir": "/"},
        "rootfs": {"type": "layers", "diff_ids": [format!("sha256:{diff_id}")]},
    })
    .to_string()
    .into_bytes();
    let mut out = tar::Builder::new(fs::File::create(archive).unwrap());
    let mut blob = |bytes: &[u8], media: &str| {
        let digest = sha256(bytes);
        let mut header = tar::Header::new_gnu();
        header.set_mode(0o644);
        header.set_size(bytes.len() as u64);
        out.append_data(&mut header, format!("blobs/sha256/{digest}"), bytes)
            .unwrap();
        serde_json::json!({"mediaType": media, "digest": format!("sha256:{digest}"),
                           "size": bytes.len()})
    };
    let layer_desc = blob(layer, "application/vnd.oci.image.layer.v1.tar");
    let config_desc = blob(&config, "application/vnd.oci.image.config.v1+json");
    let manifest = serde_json::json!({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": config_desc, "layers": [layer_desc],
    })
    .to_string()
    .into_bytes();
    let mut manifest_desc = blob(&manifest, "application/vnd.oci.image.manifest.v1+json");
    manifest_desc["annotations"] = serde_json::json!({
        "io.containerd.image.name": name,
        "org.opencontainers.image.ref.name": name.rsplit(':').next().unwrap(),
    });
    manifest_desc["platform"] = serde_json::json!({"architecture": "amd64", "os": "linux"});
    let index = serde_json::json!({"schemaVersion": 2, "manifests": [manifest_desc]}).to_string();
    for (name, bytes) in [
        ("oci-layout", &br#"{"imageLayoutVersion":"1.0.0"}"#[..]),
        ("index.json", index.as_bytes()),
    ] {
        let mut header = tar::Header::new_gnu();
        header.set_mode(0o644);
        header.set_size(bytes.len() as u64);
        out.append_data(&mut header, name, bytes).unwrap();
    }
    out.into_inner().unwrap().flush().unwrap();
}

/// The hex SHA-256 of `bytes` (coreutils' sha256sum; gpud has no hash crate).
fn sha256(bytes: &[u8]) -> String {
    let mut child = Command::new("sha256sum")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(bytes).unwrap();
    let output = child.wait_with_output().unwrap();
    String::from_utf8(output.stdout).unwrap()[..64].to_owned()
}

/// Creates a character device node at `path` with major 1 and `minor`: one of the memory
/// devices (/dev/null 3, /dev/zero 5, /dev/full 7, /dev/urandom 9), which a container can
/// open and which tell apart which host node it was given.
pub fn mknod_memory_device(path: &Path, minor: u32) {
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    let status = Command::new("mknod")
        .arg(path)
        .args(["c", "1", &minor.to_string()])
        .status()
        .unwrap();
    assert!(status.success(), "mknod {}", path.display());
}

/// A pod sandbox on the host network, as the kubelet asks for one.
pub struct Pod {
    pub id: String,
    pub config: PodSandboxConfig,
    containers: Vec<String>,
}

impl Pod {
    pub async fn run(cri: &mut Cri, containerd: &Containerd, name: &str, uid: &str) -> Pod {
        let labels = HashMap::from([
            ("io.kubernetes.pod.name".to_owned(), name.to_owned()),
            (
                "io.kubernetes.pod.namespace".to_owned(),
                "gpud-test".to_owned(),
            ),
            ("io.kubernetes.pod.uid".to_owned(), uid.to_owned()),
        ]);
        let config = PodSandboxConfig {
            metadata: Some(PodSandboxMetadata {
                name: name.to_owned(),
                uid: uid.to_owned(),
                namespace: "gpud-test".into(),
                attempt: 0,
            }),
            // The kubelet sends no hostname for a host-network pod (there is no UTS namespace
            // to set it in).
            hostname: String::new(),
            log_directory: containerd
                .dir
                .path()
                .join(format!("logs/gpud-test_{name}_{uid}"))
                .display()
                .to_string(),
            labels,
            annotations: HashMap::new(),
            linux: Some(LinuxPodSandboxConfig {
                cgroup_parent: containerd.cgroup_parent(uid),
                security_context: Some(LinuxSandboxSecurityContext {
                    namespace_options: Some(host_network()),
                }),
            }),
        };
        let id = cri.run_pod_sandbox(&config).await;
        Pod {
            id,
            config,
            containers: Vec::new(),
        }
    }

    /// A container of this pod running `sleep`, with the kubelet's labels.
    pub fn container(&self, name: &str) -> ContainerConfig {
        let mut labels = self.config.labels.clone();
        labels.insert("io.kubernetes.container.name".into(), name.into());
        ContainerConfig {
            metadata: Some(ContainerMetadata {
                name: name.into(),
                attempt: 0,
            }),
            image: Some(ImageSpec {
                image: IMAGE.into(),
            }),
            command: vec!["/bin/sleep".into(), "100000".into()],
            labels,
            log_path: format!("{name}/0.log"),
            linux: Some(LinuxContainerConfig {
                security_context: Some(LinuxContainerSecurityContext {
                    privileged: false,
                    namespace_options: Some(host_network()),
                }),
            }),
            ..ContainerConfig::default()
        }
    }

    /// CreateContainer and StartContainer; the container's ID.
    pub async fn start(
        &mut self,
        cri: &mut Cri,
        config: ContainerConfig,
    ) -> Result<String, String> {
        let id = cri
            .create_container(&self.id, &self.config, config)
            .await
            .map_err(|s| s.message().to_owned())?;
        self.containers.push(id.clone());
        cri.start_container(&id)
            .await
            .map_err(|s| s.message().to_owned())?;
        Ok(id)
    }

    /// Runs `config` to its end: the lines it wrote to stdout and stderr (from its CRI log),
    /// or the runtime's refusal of CreateContainer or StartContainer.
    pub async fn run_to_end(
        &mut self,
        cri: &mut Cri,
        config: ContainerConfig,
    ) -> Result<String, String> {
        let log = Path::new(&self.config.log_directory).join(&config.log_path);
        let id = self.start(cri, config).await?;
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let status = cri.container_status(&id).await;
            if status.status.as_ref().unwrap().state == super::cri_api::EXITED {
                break;
            }
            assert!(Instant::now() < deadline, "{id} still runs after 60 s");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // `<time> <stream> <F|P> <text>` per line.
        let text = fs::read_to_string(&log).unwrap_or_default();
        Ok(text
            .lines()
            .filter_map(|l| l.splitn(4, ' ').nth(3))
            .map(|l| format!("{l}\n"))
            .collect())
    }

    /// Stops and removes container `id`.
    pub async fn remove_container(&mut self, cri: &mut Cri, id: &str) {
        cri.remove_container(id).await;
        self.containers.retain(|c| c != id);
    }

    /// Stops and removes every container, then the sandbox, as the kubelet tears a pod down.
    pub async fn remove(self, cri: &mut Cri) {
        for id in &self.containers {
            cri.remove_container(id).await;
        }
        cri.remove_pod_sandbox(&self.id).await;
    }
}

pub fn host_network() -> NamespaceOption {
    NamespaceOption {
        network: NODE,
        pid: 0,
        ipc: 0,
    }
}
