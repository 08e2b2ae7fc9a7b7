//! The hostile-image corpus: images built to make `gpud cdi-hook update-ldcache` (which every
//! GPU container's start runs) write to the host, or hang or bloat the start. Each image is
//! started by a real runtime (podman with runc, as root) with a CDI spec that runs gpud's
//! hook, and each test asserts that host canaries (a folder with a library, a symlink, a file)
//! are byte for byte what they were, and that the container either starts or fails with
//! gpud's one-line error.
//!
//! At `createContainer` the container's procfs is mounted in its root and `/proc/1/root` there
//! is the host's `/`: every path below goes through it, by the linker config, a drop-in, a
//! symlinked folder or a library's SONAME. Every future change to the hook meets this corpus.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
#[path = "runtime/containerd.rs"]
mod containerd;
#[path = "runtime/cri_api.rs"]
mod cri_api;

use std::fs;
use std::os::unix::fs::{FileTypeExt, MetadataExt, symlink};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};

use common::{gpud_bin, tool_missing};
use containerd::{Containerd, Pod};
use cri_api::Cri;

/// ldconfig's deadline in these specs: short, so the images that would hang show it quickly.
const DEADLINE: &str = "3s";

/// A host folder the images aim at: a library (whose soname link ldconfig would make), a
/// symlink (which a SONAME would replace) and a file.
struct Canary {
    dir: tempfile::TempDir,
}

impl Canary {
    fn new() -> Canary {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir(dir.path().join("libs")).unwrap();
        fs::copy(a_library(), dir.path().join("libs/libz.so.1.2.13")).unwrap();
        symlink("original-target", dir.path().join("link")).unwrap();
        fs::write(dir.path().join("file"), "host file\n").unwrap();
        fs::create_dir(dir.path().join("etc")).unwrap();
        fs::write(
            dir.path().join("etc/ld.so.conf"),
            format!("{}/libs\n", dir.path().display()),
        )
        .unwrap();
        Canary { dir }
    }

    /// The canary's path as seen from inside a starting container: through the host's `/`.
    fn via_proc(&self) -> String {
        format!("/proc/1/root{}", self.dir.path().display())
    }

    /// Every entry under the canary: its path, type, mode, owner and bytes or link target.
    fn snapshot(&self) -> Vec<String> {
        fn walk(dir: &Path, base: &Path, out: &mut Vec<String>) {
            let mut entries: Vec<_> = fs::read_dir(dir).unwrap().map(|e| e.unwrap()).collect();
            entries.sort_by_key(|e| e.file_name());
            for entry in entries {
                let path = entry.path();
                let meta = fs::symlink_metadata(&path).unwrap();
                let name = path.strip_prefix(base).unwrap().display().to_string();
                let what = if meta.file_type().is_symlink() {
                    format!("link -> {}", fs::read_link(&path).unwrap().display())
                } else if meta.is_dir() {
                    "dir".to_owned()
                } else {
                    let bytes = fs::read(&path).unwrap();
                    format!("file {} bytes, sum {}", bytes.len(), checksum(&bytes))
                };
                out.push(format!(
                    "{name}: {what} mode {:o} uid {} mtime {}",
                    meta.mode(),
                    meta.uid(),
                    meta.mtime_nsec()
                ));
                if meta.is_dir() {
                    walk(&path, base, out);
                }
            }
        }
        let mut out = Vec::new();
        walk(self.dir.path(), self.dir.path(), &mut out);
        out
    }
}

fn checksum(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |hash, byte| {
        (hash ^ u64::from(*byte)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// A real shared library (soname `libz.so.1`).
fn a_library() -> PathBuf {
    let lib = PathBuf::from("/usr/lib/x86_64-linux-gnu/libz.so.1");
    if lib.exists() {
        return lib;
    }
    common::mock_lib()
}

/// A glibc-style image: the host's static ldconfig (the container's command lists its cache)
/// and a linker config that includes its drop-ins.
struct Image {
    dir: tempfile::TempDir,
}

impl Image {
    fn glibc() -> Image {
        let image = Image::bare();
        let root = image.root();
        fs::create_dir_all(root.join("etc/ld.so.conf.d")).unwrap();
        fs::write(
            root.join("etc/ld.so.conf"),
            "include /etc/ld.so.conf.d/*.conf\n",
        )
        .unwrap();
        image
    }

    /// An image with only the static ldconfig: no linker config (musl and static images).
    fn bare() -> Image {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir_all(dir.path().join("rootfs/sbin")).unwrap();
        fs::copy("/sbin/ldconfig", dir.path().join("rootfs/sbin/ldconfig")).unwrap();
        fs::create_dir_all(dir.path().join("driver")).unwrap();
        fs::copy(a_library(), dir.path().join("driver/libz.so.1.2.13")).unwrap();
        Image { dir }
    }

    fn root(&self) -> PathBuf {
        self.dir.path().join("rootfs")
    }

    fn write(&self, path: &str, text: &str) {
        let path = self.root().join(path.trim_start_matches('/'));
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, text).unwrap();
    }

    fn link(&self, path: &str, target: &str) {
        let path = self.root().join(path.trim_start_matches('/'));
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        let _ = fs::remove_file(&path);
        symlink(target, path).unwrap();
    }

    fn fifo(&self, path: &str) {
        let path = self.root().join(path.trim_start_matches('/'));
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        let _ = fs::remove_file(&path);
        let status = Command::new("mkfifo").arg(&path).status().unwrap();
        assert!(status.success());
        assert!(fs::metadata(&path).unwrap().file_type().is_fifo());
    }

    /// A library at `path` in the image whose SONAME is `soname`.
    fn library_with_soname(&self, path: &str, soname: &str) {
        let out = self.root().join(path.trim_start_matches('/'));
        fs::create_dir_all(out.parent().unwrap()).unwrap();
        let source = self.dir.path().join("empty.c");
        fs::write(&source, "int gpud_corpus_symbol(void) { return 1; }\n").unwrap();
        let output = Command::new("cc")
            .args(["-shared", "-fPIC", "-nostdlib", "-o"])
            .arg(&out)
            .arg(format!("-Wl,-soname,{soname}"))
            .arg(&source)
            .output()
            .unwrap();
        assert!(output.status.success(), "cc: {output:?}");
    }

    /// The CDI spec of device `<kind>=gpu`: the driver folder mounted at /opt/driver and a
    /// hook that runs `gpud cdi-hook update-ldcache` for it.
    fn spec(&self, kind: &str) -> serde_json::Value {
        serde_json::json!({
            "cdiVersion": "0.5.0",
            "kind": kind,
            "devices": [{
                "name": "gpu",
                "containerEdits": {
                    "mounts": [{
                        "hostPath": self.dir.path().join("driver"),
                        "containerPath": "/opt/driver",
                        "options": ["ro", "nosuid", "nodev", "bind"],
                    }],
                    "hooks": [{
                        "hookName": "createContainer",
                        "path": gpud_bin(),
                        "args": ["nvidia-cdi-hook", "update-ldcache", "--folder", "/opt/driver",
                                 "--timeout", DEADLINE],
                        "timeout": 30,
                    }],
                },
            }],
        })
    }

    /// Starts the image with podman (runc) and [`Image::spec`].
    fn start(&self) -> Output {
        let kind = unique_kind();
        fs::create_dir_all("/var/run/cdi").unwrap();
        let spec_path = PathBuf::from(format!(
            "/var/run/cdi/{}.json",
            kind.replace(['/', '.'], "-")
        ));
        fs::write(&spec_path, self.spec(&kind).to_string()).unwrap();
        let output = Command::new("podman")
            .args([
                "--runtime",
                "runc",
                "run",
                "--rm",
                "--network",
                "none",
                "--no-hosts",
                "--ulimit",
                "nofile=1024:20000",
                "--ulimit",
                "nproc=1024:1024",
                "--device",
                &format!("{kind}=gpu"),
                "--rootfs",
            ])
            .arg(self.root())
            .args(["/sbin/ldconfig", "-p"])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let _ = fs::remove_file(&spec_path);
        output
    }

    /// Starts the image as a container of `pod` on `containerd`, through CRI, with
    /// [`Image::spec`] asked for in `CDI_devices`: its output, or the runtime's refusal.
    async fn start_on_containerd(
        &self,
        containerd: &Containerd,
        cri: &mut Cri,
        pod: &mut Pod,
    ) -> Result<String, String> {
        let kind = unique_kind();
        let name = kind.replace(['/', '.'], "-");
        let spec_path = containerd.cdi.join(format!("{name}.json"));
        fs::write(&spec_path, self.spec(&kind).to_string()).unwrap();
        let image = format!("localhost/gpud-corpus/{name}:1");
        containerd
            .import(cri, &image, &containerd::layer_of(&self.root()))
            .await;
        let mut config = pod.container(&name);
        config.image = Some(cri_api::ImageSpec { image });
        config.command = vec!["/sbin/ldconfig".into(), "-p".into()];
        config.cdi_devices = vec![cri_api::CdiDevice {
            name: format!("{kind}=gpu"),
        }];
        let output = pod.run_to_end(cri, config).await;
        fs::remove_file(&spec_path).unwrap();
        output
    }
}

/// A CDI kind no other start of this process or another uses.
fn unique_kind() -> String {
    static STARTED: AtomicUsize = AtomicUsize::new(0);
    format!(
        "gpud-corpus-{}-{}.example.com/gpu",
        std::process::id(),
        STARTED.fetch_add(1, Ordering::Relaxed)
    )
}

/// Whether the runtime corpus runs here: podman, runc, cc and root (always in CI).
fn runtime_missing() -> bool {
    let works = |tool: &str| {
        Command::new(tool)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    };
    let is_root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0");
    tool_missing(
        !(works("podman") && works("runc") && works("cc") && is_root),
        "podman, runc, cc and root are required (CI is set)",
        "skipping: the hostile-image corpus needs podman, runc, cc and root",
    )
}

/// How the container's start went.
#[derive(Debug, PartialEq, Eq)]
enum Start {
    /// It ran; its linker cache lists these lines.
    Ran(String),
    /// It failed with gpud's one-line error, given here.
    HookFailed(String),
}

/// Starts `image`, checks the canary is unchanged and the start either ran or failed with
/// gpud's error (one line, `gpud: cdi-hook: ...`), and says which.
fn start_and_check(image: &Image, canary: &Canary) -> Start {
    let before = canary.snapshot();
    let output = image.start();
    assert_eq!(canary.snapshot(), before, "the host canary changed");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    if let Some(at) = stderr.find("gpud: cdi-hook: ") {
        let line = stderr[at..].lines().next().unwrap();
        return Start::HookFailed(line.trim_end_matches(['"', '\\']).to_owned());
    }
    // 125-127: podman or the runtime failed; anything else is the container's own exit.
    assert!(
        !matches!(output.status.code(), Some(125..=127) | None),
        "the start failed without gpud's error:\nstdout: {stdout}\nstderr: {stderr}"
    );
    Start::Ran(stdout)
}

/// The driver folder is in the container's cache: the hook did its job.
fn driver_cached(start: &Start) {
    let Start::Ran(listed) = start else {
        panic!("the container did not start: {start:?}");
    };
    assert!(
        listed
            .lines()
            .any(|l| l.contains("libz.so.1 ") && l.contains("=> /opt/driver/libz.so.1")),
        "the driver folder is not in the container's cache:\n{listed}"
    );
}

// === the corpus: each image, built against a canary ===

/// A glibc image whose linker config names the canary's library folder through the host's
/// root as the container's procfs shows it.
fn linker_config_through_proc(canary: &Canary) -> Image {
    let image = Image::glibc();
    image.write(
        "/etc/ld.so.conf",
        &format!(
            "include /etc/ld.so.conf.d/*.conf\n{}/libs\n",
            canary.via_proc()
        ),
    );
    image
}

/// A drop-in naming the canary through /proc, and an include of its linker config.
fn drop_in_through_proc(canary: &Canary) -> Image {
    let image = Image::glibc();
    image.write(
        "/etc/ld.so.conf.d/zz-evil.conf",
        &format!(
            "{0}/libs\n/proc/self/root{1}/libs\ninclude {0}/etc/ld.so.conf\n",
            canary.via_proc(),
            canary.dir.path().display()
        ),
    );
    image
}

/// Library folders that are symlinks (absolute and relative) into the canary through /proc.
fn library_folder_symlinked_into_proc(canary: &Canary) -> Image {
    let image = Image::glibc();
    image.link("/opt/evil-absolute", &format!("{}/libs", canary.via_proc()));
    image.link(
        "/opt/evil-relative",
        &format!("..{}/libs", canary.via_proc()),
    );
    image.write(
        "/etc/ld.so.conf.d/zz-evil.conf",
        "/opt/evil-absolute\n/opt/evil-relative\n",
    );
    image
}

/// Libraries whose SONAMEs climb out with `..` or are absolute, aimed at the canary's
/// symlink, file and library.
fn sonames_aimed_at_the_host(canary: &Canary) -> Image {
    let image = Image::glibc();
    let up = "../".repeat(12);
    image.library_with_soname(
        "/usr/lib/evil/libevil.so.1.0",
        &format!("{up}{}/link", canary.via_proc().trim_start_matches('/')),
    );
    image.library_with_soname(
        "/usr/lib/evil/libevil2.so.1.0",
        &format!("{}/file", canary.via_proc()),
    );
    image.library_with_soname(
        "/usr/lib/evil/libevil3.so.1.0",
        &format!(
            "sub/{up}{}/libs/libz.so.1",
            canary.via_proc().trim_start_matches('/')
        ),
    );
    image.write("/etc/ld.so.conf.d/zz-evil.conf", "/usr/lib/evil\n");
    image
}

/// /etc itself a symlink to the canary's etc through /proc.
fn etc_symlinked_to_the_host(canary: &Canary) -> Image {
    let image = Image::glibc();
    fs::remove_dir_all(image.root().join("etc")).unwrap();
    image.link("/etc", &format!("{}/etc", canary.via_proc()));
    // The same path as folders of the image, where the runtime looks before the container's
    // procfs is mounted over them: the runtime starts it, and the hook sees /etc through the
    // host.
    fs::create_dir_all(
        image
            .root()
            .join(format!("{}/etc", canary.via_proc()).trim_start_matches('/')),
    )
    .unwrap();
    image
}

/// The linker cache a symlink to the canary's file.
fn cache_symlinked_to_a_host_file(canary: &Canary) -> Image {
    let image = Image::glibc();
    image.link("/etc/ld.so.cache", &format!("{}/file", canary.via_proc()));
    image
}

fn fifo_as_the_linker_config(_: &Canary) -> Image {
    let image = Image::glibc();
    image.fifo("/etc/ld.so.conf");
    image
}

fn fifo_as_a_drop_in(_: &Canary) -> Image {
    let image = Image::glibc();
    image.fifo("/etc/ld.so.conf.d/zz-fifo.conf");
    image
}

/// A FIFO named like a library: ldconfig skips what is not a regular file.
fn fifo_in_a_library_folder(_: &Canary) -> Image {
    let image = Image::glibc();
    image.fifo("/usr/lib/fifo/libfifo.so.1");
    image.write("/etc/ld.so.conf.d/zz-fifo.conf", "/usr/lib/fifo\n");
    image
}

/// What a corpus image's start must give.
#[derive(Debug, Clone, Copy)]
enum Expect {
    /// It ran with the driver folder in its cache.
    DriverCached,
    /// It ran (the hook left it alone).
    Ran,
    /// The hook ended at ldconfig's deadline and said so.
    Deadline,
}

type Build = fn(&Canary) -> Image;

/// The corpus, each image with what its start must give. (The 1 GiB linker config runs under
/// podman only: a runtime that imports images would first copy the GiB.)
const CORPUS: &[(&str, Build, Expect)] = &[
    ("glibc", |_| Image::glibc(), Expect::DriverCached),
    ("musl-or-static", |_| Image::bare(), Expect::Ran),
    (
        "linker-config-through-proc",
        linker_config_through_proc,
        Expect::DriverCached,
    ),
    (
        "drop-in-through-proc",
        drop_in_through_proc,
        Expect::DriverCached,
    ),
    (
        "library-folder-symlinked",
        library_folder_symlinked_into_proc,
        Expect::DriverCached,
    ),
    (
        "sonames-aimed-at-the-host",
        sonames_aimed_at_the_host,
        Expect::DriverCached,
    ),
    (
        "etc-symlinked-to-the-host",
        etc_symlinked_to_the_host,
        Expect::Ran,
    ),
    (
        "cache-symlinked-to-a-host-file",
        cache_symlinked_to_a_host_file,
        Expect::DriverCached,
    ),
    (
        "fifo-linker-config",
        fifo_as_the_linker_config,
        Expect::Deadline,
    ),
    ("fifo-drop-in", fifo_as_a_drop_in, Expect::Deadline),
    (
        "fifo-library",
        fifo_in_a_library_folder,
        Expect::DriverCached,
    ),
];

/// Asserts that `start` is what `expect` says.
fn as_expected(name: &str, expect: Expect, start: &Start) {
    match expect {
        Expect::DriverCached => driver_cached(start),
        Expect::Ran => assert!(matches!(start, Start::Ran(_)), "{name}: {start:?}"),
        Expect::Deadline => {
            let Start::HookFailed(line) = start else {
                panic!("{name}: {start:?}");
            };
            assert!(line.contains("did not finish within 3 s"), "{name}: {line}");
        }
    }
}

/// Builds corpus image `name` against a new canary and starts it under podman.
fn start_under_podman(name: &str) -> (Image, Canary, Start) {
    let (_, build, expect) = CORPUS.iter().find(|(n, _, _)| *n == name).unwrap();
    let canary = Canary::new();
    let image = build(&canary);
    let start = start_and_check(&image, &canary);
    as_expected(name, *expect, &start);
    (image, canary, start)
}

// === under podman, where the image's root is a host folder the tests can read back ===

#[test]
fn a_glibc_image_gets_the_driver_folder_in_its_cache() {
    if runtime_missing() {
        return;
    }
    let (image, _, _) = start_under_podman("glibc");
    assert_eq!(
        fs::read_to_string(image.root().join("etc/ld.so.conf.d/00-nvcr-gpud.conf")).unwrap(),
        "/opt/driver\n"
    );
}

#[test]
fn a_musl_or_static_image_is_left_alone() {
    if runtime_missing() {
        return;
    }
    // Its own ldconfig finds no cache: the hook made none.
    let (image, _, _) = start_under_podman("musl-or-static");
    assert!(!image.root().join("etc/ld.so.cache").exists());
    assert!(!image.root().join("etc/ld.so.conf.d").exists());
}

#[test]
fn a_linker_config_naming_the_host_through_proc() {
    if runtime_missing() {
        return;
    }
    start_under_podman("linker-config-through-proc");
}

#[test]
fn a_drop_in_naming_the_host_through_proc_and_an_include_of_the_hosts_config() {
    if runtime_missing() {
        return;
    }
    start_under_podman("drop-in-through-proc");
}

#[test]
fn a_library_folder_that_is_a_symlink_into_proc() {
    if runtime_missing() {
        return;
    }
    start_under_podman("library-folder-symlinked");
}

#[test]
fn sonames_with_dot_dot_and_slashes_aimed_at_a_host_symlink() {
    if runtime_missing() {
        return;
    }
    start_under_podman("sonames-aimed-at-the-host");
}

#[test]
fn etc_itself_a_symlink_to_the_hosts_etc_through_proc() {
    if runtime_missing() {
        return;
    }
    // gpud never resolves through a magic link: to it the image has no linker config.
    let (image, canary, _) = start_under_podman("etc-symlinked-to-the-host");
    assert!(
        !image
            .root()
            .join("proc/1/root")
            .join(canary.dir.path().strip_prefix("/").unwrap())
            .join("etc/ld.so.conf.d")
            .exists()
    );
}

#[test]
fn the_cache_a_symlink_to_a_host_file() {
    if runtime_missing() {
        return;
    }
    start_under_podman("cache-symlinked-to-a-host-file");
}

#[test]
fn a_fifo_as_the_linker_config_or_a_drop_in_ends_at_the_deadline() {
    if runtime_missing() {
        return;
    }
    start_under_podman("fifo-linker-config");
    start_under_podman("fifo-drop-in");
}

#[test]
fn a_fifo_in_a_library_folder_and_a_gib_linker_config() {
    if runtime_missing() {
        return;
    }
    start_under_podman("fifo-library");

    // 1 GiB of linker config (sparse): ldconfig's memory is capped, so it fails (or reads it
    // through) without bloating the node; either way the start ends.
    let canary = Canary::new();
    let image = Image::glibc();
    let conf = fs::File::create(image.root().join("etc/ld.so.conf")).unwrap();
    conf.set_len(1 << 30).unwrap();
    match start_and_check(&image, &canary) {
        Start::Ran(_) => {}
        Start::HookFailed(line) => assert!(line.contains("ldconfig"), "{line}"),
    }
}

// === the same corpus under containerd 2.x through CRI, as a kubelet starts it ===

/// The corpus under containerd 1.7 (config version 2).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_corpus_under_containerd_1_7() {
    corpus_under(containerd::V1_7).await;
}

/// The corpus under containerd 2.x (config version 3, NRI).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_corpus_under_containerd_2() {
    corpus_under(containerd::V2).await;
}

/// Every corpus image as a container of one pod on one containerd (configured by `gpud
/// runtime configure --enable-cdi`), asked for its device by `CDI_devices`: the host canary
/// unchanged, and the start as under podman.
async fn corpus_under(build: containerd::Build) {
    if containerd::missing(build) {
        return;
    }
    let mut runtime = Containerd::prepare(build);
    let cdi = runtime.cdi.display().to_string();
    runtime.configure(&["--enable-cdi", "--cdi-spec-dirs", &cdi]);
    runtime.start();
    let (mut cri, version) = Cri::connect(&runtime.socket).await;
    eprintln!("containerd {}", version.runtime_version);
    runtime.import_image(&mut cri).await;
    let uid = format!("{:08x}-0000-4000-8000-000000000001", std::process::id());
    let mut pod = Pod::run(&mut cri, &runtime, "corpus", &uid).await;
    for (name, build, expect) in CORPUS {
        let canary = Canary::new();
        let image = build(&canary);
        let before = canary.snapshot();
        let output = image
            .start_on_containerd(&runtime, &mut cri, &mut pod)
            .await;
        assert_eq!(canary.snapshot(), before, "{name}: the host canary changed");
        let start = match output {
            Ok(stdout) => Start::Ran(stdout),
            Err(refused) => {
                let at = refused
                    .find("gpud: cdi-hook: ")
                    .unwrap_or_else(|| panic!("{name}: refused without gpud's error: {refused}"));
                let line = refused[at..].lines().next().unwrap();
                Start::HookFailed(line.trim_end_matches(['"', '\\']).to_owned())
            }
        };
        as_expected(name, *expect, &start);
    }
    pod.remove(&mut cri).await;
}
