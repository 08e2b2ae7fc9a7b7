//! `gpud cdi-hook` as a runtime runs it: the built binary (and a link to it named
//! `nvidia-cdi-hook`) with the OCI state on stdin and a bundle whose config.json names a temp
//! rootfs. The rootfs is treated as hostile: symlinks to `/`, up and out with `..`, or to a
//! host file beside it (a canary folder outside the root) must never change anything outside
//! the root, and neither the image's nor the runtime's `LD_PRELOAD` reaches ldconfig. The last
//! test runs the hooks from a CDI spec through podman, a real CDI consumer.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::fs;
use std::io::Write;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use common::{gpud_bin, tool_missing};

/// A container as a runtime lays it out: `bundle/config.json` naming `bundle/rootfs`, and a
/// `host/` folder beside the bundle with a canary file that no hook may touch.
struct Container {
    dir: tempfile::TempDir,
}

impl Container {
    fn new() -> Container {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir_all(dir.path().join("bundle/rootfs")).unwrap();
        fs::create_dir_all(dir.path().join("host/lib")).unwrap();
        fs::write(dir.path().join("host/canary"), "canary").unwrap();
        fs::set_permissions(
            dir.path().join("host/canary"),
            fs::Permissions::from_mode(0o600),
        )
        .unwrap();
        let config = serde_json::json!({
            "ociVersion": "1.0.2",
            "process": {
                "args": ["/bin/true"],
                "env": ["PATH=/evil/bin", "LD_PRELOAD=/evil/preload.so", "LD_LIBRARY_PATH=/evil"],
            },
            "root": {"path": "rootfs"},
        });
        fs::write(dir.path().join("bundle/config.json"), config.to_string()).unwrap();
        Container { dir }
    }

    fn root(&self) -> PathBuf {
        self.dir.path().join("bundle/rootfs")
    }

    fn host(&self) -> PathBuf {
        self.dir.path().join("host")
    }

    fn state(&self) -> String {
        serde_json::json!({
            "ociVersion": "1.0.2",
            "id": "c1",
            "status": "creating",
            "pid": std::process::id(),
            "bundle": self.dir.path().join("bundle"),
        })
        .to_string()
    }

    /// Runs `program` (gpud or a link to it) with `args` and the state on stdin.
    fn run_as(&self, program: &Path, args: &[&str]) -> Output {
        let mut cmd = Command::new(program);
        cmd.args(args);
        self.run(cmd)
    }

    /// Runs `cmd` with the state on stdin, as a runtime runs a hook.
    fn run(&self, mut cmd: Command) -> Output {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(self.state().as_bytes())
            .unwrap();
        child.wait_with_output().unwrap()
    }

    /// `gpud cdi-hook <args>`.
    fn hook(&self, args: &[&str]) -> Output {
        let mut all = vec!["cdi-hook"];
        all.extend_from_slice(args);
        self.run_as(&gpud_bin(), &all)
    }

    /// The canary folder holds what it held, with the canary's bytes and mode.
    fn host_unchanged(&self) {
        let mut names: Vec<_> = fs::read_dir(self.host())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(names, ["canary", "lib"]);
        assert_eq!(fs::read_dir(self.host().join("lib")).unwrap().count(), 0);
        let canary = self.host().join("canary");
        assert!(!canary.is_symlink());
        assert_eq!(fs::read_to_string(&canary).unwrap(), "canary");
        let mode = fs::metadata(&canary).unwrap().permissions().mode();
        assert_eq!(mode & 0o7777, 0o600);
    }
}

fn ok(output: &Output) {
    assert!(
        output.status.success(),
        "exit {:?}\nstderr: {}",
        output.status.code(),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// The hook refused with one line naming the container root.
fn refused(output: &Output, root: &Path) -> String {
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.starts_with("gpud: cdi-hook: "), "{stderr}");
    assert!(stderr.contains(&root.display().to_string()), "{stderr}");
    stderr
}

const LINK: &str = "libcuda.so.1::/usr/lib/x86_64-linux-gnu/libcuda.so";

#[test]
fn create_symlinks_makes_the_link_also_as_nvidia_cdi_hook() {
    let container = Container::new();
    ok(&container.hook(&["create-symlinks", "--link", LINK]));
    let link = container.root().join("usr/lib/x86_64-linux-gnu/libcuda.so");
    assert_eq!(fs::read_link(&link).unwrap(), PathBuf::from("libcuda.so.1"));
    // Again: the same link is fine.
    ok(&container.hook(&["create-symlinks", "--link", LINK]));

    // The name NVIDIA's tools write into specs runs the same applet.
    let bin = tempfile::tempdir().unwrap();
    let nvidia = bin.path().join("nvidia-cdi-hook");
    symlink(gpud_bin(), &nvidia).unwrap();
    ok(&container.run_as(
        &nvidia,
        &[
            "create-symlinks",
            "--link",
            "libnvidia-ml.so.1::/usr/lib64/libnvidia-ml.so",
        ],
    ));
    let link = container.root().join("usr/lib64/libnvidia-ml.so");
    assert_eq!(
        fs::read_link(&link).unwrap(),
        PathBuf::from("libnvidia-ml.so.1")
    );
    container.host_unchanged();
}

#[test]
fn a_library_folder_linked_to_the_root_or_above_stays_inside_the_container() {
    // The image says its library folder is `/` (absolutely), or climbs deep enough with `..`
    // to reach the host's / from the rootfs, were it followed on the host: inside the root,
    // both are the container's own root.
    for target in ["/", "../../../../../../../../../../.."] {
        let container = Container::new();
        let root = container.root();
        fs::create_dir_all(root.join("usr/lib")).unwrap();
        symlink(target, root.join("usr/lib/x86_64-linux-gnu")).unwrap();
        ok(&container.hook(&["create-symlinks", "--link", LINK]));
        assert!(root.join("libcuda.so").is_symlink(), "{target}");
        assert!(!Path::new("/libcuda.so").exists());
        container.host_unchanged();
    }
}

#[test]
fn a_library_folder_linked_to_a_host_folder_is_refused() {
    let container = Container::new();
    let root = container.root();
    fs::create_dir_all(root.join("usr/lib")).unwrap();
    symlink(
        container.host().join("lib"),
        root.join("usr/lib/x86_64-linux-gnu"),
    )
    .unwrap();
    let output = container.hook(&["create-symlinks", "--link", LINK]);
    // The host path names <root>/<host path> inside the root: the hook writes there or
    // refuses, and never into the host folder.
    if output.status.success() {
        let inside = root.join(container.host().strip_prefix("/").unwrap());
        assert!(inside.join("lib/libcuda.so").is_symlink());
    } else {
        let stderr = refused(&output, &root);
        assert!(stderr.contains("/usr/lib/x86_64-linux-gnu"), "{stderr}");
    }
    container.host_unchanged();
}

#[test]
fn a_link_path_that_is_a_symlink_to_a_host_file_is_replaced_not_followed() {
    let container = Container::new();
    let root = container.root();
    fs::create_dir_all(root.join("usr/lib/x86_64-linux-gnu")).unwrap();
    let link = root.join("usr/lib/x86_64-linux-gnu/libcuda.so");
    symlink(container.host().join("canary"), &link).unwrap();
    ok(&container.hook(&["create-symlinks", "--link", LINK]));
    assert_eq!(fs::read_link(&link).unwrap(), PathBuf::from("libcuda.so.1"));
    container.host_unchanged();
}

#[test]
fn chmod_through_a_symlink_to_a_host_file_is_refused() {
    let container = Container::new();
    let root = container.root();
    fs::create_dir_all(root.join("dev/dri")).unwrap();
    fs::write(root.join("dev/dri/card0"), "").unwrap();
    symlink(container.host().join("canary"), root.join("dev/dri/card1")).unwrap();
    ok(&container.hook(&[
        "chmod",
        "--mode",
        "666",
        "--path",
        "/dev/dri/card0",
        "--path",
        "/dev/dri/missing",
    ]));
    let mode = fs::metadata(root.join("dev/dri/card0"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o666);

    let output = container.hook(&["chmod", "--mode", "777", "--path", "/dev/dri/card1"]);
    let stderr = refused(&output, &root);
    assert!(stderr.contains("/dev/dri/card1"), "{stderr}");
    assert!(stderr.contains("symlink"), "{stderr}");

    // A folder on the way that links to the host folder resolves inside the root (where the
    // file is missing, so it is skipped).
    symlink(container.host(), root.join("host")).unwrap();
    ok(&container.hook(&["chmod", "--mode", "777", "--path", "/host/canary"]));
    container.host_unchanged();
}

/// Gives the rootfs at `root` a linker config that includes its drop-ins, as glibc images have.
fn linker_config(root: &Path) {
    fs::create_dir_all(root.join("etc")).unwrap();
    fs::write(
        root.join("etc/ld.so.conf"),
        "include /etc/ld.so.conf.d/*.conf\n",
    )
    .unwrap();
}

/// `ldconfig -p` output lists the library `name` in the container `folder`.
fn assert_cached(listed: &str, name: &str, folder: &str) {
    let soname = name.split(".so").next().unwrap();
    assert!(
        listed
            .lines()
            .any(|l| l.contains(soname) && l.contains(&format!("=> {folder}/"))),
        "the container's linker cache lacks {name} in {folder}:\n{listed}"
    );
}

/// A fake ldconfig on the host that records its environment, arguments, signal mask, stdin,
/// limits and what its `/` is into `/recorded` of the root it runs in. It is static (cc
/// -static), as update-ldcache requires: the host's ldconfig runs with the container root as
/// its root.
fn recording_ldconfig(dir: &Path) -> PathBuf {
    let source = dir.join("record.c");
    fs::write(
        &source,
        r#"#include <signal.h>
#include <stdio.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
extern char **environ;
static FILE *open_record(const char *name) {
    char path[64];
    snprintf(path, sizeof path, "/recorded/%s", name);
    return fopen(path, "w");
}
int main(int argc, char **argv) {
    FILE *f = open_record("env");
    for (char **e = environ; *e; e++) fprintf(f, "%s\n", *e);
    fclose(f);
    f = open_record("args");
    for (int i = 1; i < argc; i++) fprintf(f, "%s\n", argv[i]);
    fclose(f);
    sigset_t mask;
    sigprocmask(SIG_BLOCK, NULL, &mask);
    int blocked = 0;
    for (int s = 1; s < NSIG; s++) blocked += sigismember(&mask, s) == 1;
    f = open_record("signals");
    fprintf(f, "%d\n", blocked);
    fclose(f);
    struct stat st;
    f = open_record("stdin");
    fprintf(f, "%s\n", fstat(0, &st) == 0 && S_ISCHR(st.st_mode) && major(st.st_rdev) == 1
        && minor(st.st_rdev) == 3 ? "/dev/null" : "other");
    fclose(f);
    struct rlimit as;
    getrlimit(RLIMIT_AS, &as);
    f = open_record("root");
    fprintf(f, "marker %s, /proc/self %s, address space %llu MiB\n",
        stat("/etc/gpud-root-marker", &st) == 0 ? "found" : "missing",
        stat("/proc/self", &st) == 0 ? "present" : "absent",
        (unsigned long long)as.rlim_cur >> 20);
    fclose(f);
    return 0;
}
"#,
    )
    .unwrap();
    let program = dir.join("ldconfig");
    let output = Command::new("cc")
        .args(["-static", "-O1", "-o"])
        .arg(&program)
        .arg(&source)
        .output()
        .unwrap();
    assert!(output.status.success(), "cc -static: {output:?}");
    program
}

#[test]
fn ldconfig_runs_in_the_container_root_with_neither_the_images_nor_the_runtimes_environment() {
    if needs_root_and("cc", "the ldconfig sandbox test") {
        return;
    }
    let container = Container::new();
    let root = container.root();
    linker_config(&root);
    fs::write(root.join("etc/gpud-root-marker"), "").unwrap();
    fs::create_dir(root.join("recorded")).unwrap();
    let tools = tempfile::tempdir().unwrap();
    let ldconfig = recording_ldconfig(tools.path());

    let mut cmd = Command::new(gpud_bin());
    cmd.args(["cdi-hook", "update-ldcache", "--ldconfig-path"])
        .arg(&ldconfig)
        .args([
            "--folder",
            "/usr/lib/x86_64-linux-gnu",
            "--folder",
            "/opt/nvidia/lib",
        ])
        // The runtime's own environment: a preload (that does not exist, so gpud itself just
        // warns and runs), a library path and a marker.
        .env("LD_PRELOAD", "/nonexistent/runtime-preload.so")
        .env("LD_LIBRARY_PATH", "/nonexistent/lib")
        .env("GPUD_TEST_MARKER", "from-the-runtime");
    ok(&container.run(cmd));

    let recorded = |name: &str| fs::read_to_string(root.join("recorded").join(name)).unwrap();
    assert_eq!(
        recorded("env"),
        "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n"
    );
    // The default signal mask (gpud blocks the daemon signals in itself); stdin /dev/null.
    assert_eq!(recorded("signals"), "0\n");
    assert_eq!(recorded("stdin"), "/dev/null\n");
    // Its `/` is the container root, with no procfs, and its memory is capped.
    assert_eq!(
        recorded("root"),
        "marker found, /proc/self absent, address space 256 MiB\n"
    );
    assert_eq!(
        recorded("args"),
        "-f\n/etc/ld.so.conf\n-C\n/etc/ld.so.cache\n/usr/lib/x86_64-linux-gnu\n/opt/nvidia/lib\n"
    );
    assert_eq!(
        fs::read_to_string(root.join("etc/ld.so.conf.d/00-nvcr-gpud.conf")).unwrap(),
        "/usr/lib/x86_64-linux-gnu\n/opt/nvidia/lib\n"
    );
    container.host_unchanged();
}

#[test]
fn a_script_or_dynamic_ldconfig_is_refused_before_it_runs() {
    let container = Container::new();
    linker_config(&container.root());
    let tools = tempfile::tempdir().unwrap();
    let script = tools.path().join("ldconfig");
    let ran = tools.path().join("ran");
    fs::write(&script, format!("#!/bin/sh\ntouch '{}'\n", ran.display())).unwrap();
    fs::set_permissions(&script, fs::Permissions::from_mode(0o755)).unwrap();
    for (ldconfig, what) in [
        (script.as_path(), "is a script"),
        (Path::new("/bin/true"), "is a dynamically linked program"),
    ] {
        let output = container.hook(&[
            "update-ldcache",
            "--ldconfig-path",
            ldconfig.to_str().unwrap(),
        ]);
        assert_eq!(output.status.code(), Some(1));
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(
            stderr.starts_with(&format!(
                "gpud: cdi-hook: {} {what}, not a static program",
                ldconfig.display()
            )),
            "{stderr}"
        );
    }
    assert!(!ran.exists());
    container.host_unchanged();
}

#[test]
fn an_image_without_a_linker_cache_is_left_alone() {
    let container = Container::new();
    // Nothing is run: not even a program that is no ldconfig at all.
    ok(&container.hook(&[
        "update-ldcache",
        "--ldconfig-path",
        "/nonexistent/ldconfig",
        "--folder",
        "/usr/lib64",
    ]));
    assert!(!container.root().join("etc").exists());
}

/// A real shared library to put in a rootfs.
fn a_shared_library() -> PathBuf {
    let lib = PathBuf::from("/usr/lib/x86_64-linux-gnu/libz.so.1");
    if lib.exists() {
        return lib;
    }
    common::mock_lib()
}

/// A library folder that exists only inside this test's containers, named after this test
/// process so that nothing else on the host names it.
fn container_only_folder() -> String {
    format!("/opt/gpud-test-{}/lib", std::process::id())
}

/// Asserts the host's linker cache was not written from the container: it names no library
/// in `folder` (a [`container_only_folder`]).
///
/// Not a comparison of the host's cache before and after the hook: whoever runs ldconfig on
/// the host (a package's trigger, another test binary running ldconfig at the same moment)
/// rewrites it whenever it likes, and a before/after comparison would fail for that — nor a
/// lock, which only this suite's tests would take. What the hook must never do is write the
/// container's cache over the host's, and a cache built from the container's linker config
/// names the folder only the container has; no other writer of the host's cache can put that
/// path in it.
fn assert_host_cache_never_names(folder: &str) {
    let cache = fs::read("/etc/ld.so.cache").unwrap_or_default();
    let needle = format!("{folder}/");
    assert!(
        !cache.windows(needle.len()).any(|w| w == needle.as_bytes()),
        "the host's /etc/ld.so.cache names {folder}: the container's cache was written over it"
    );
}

#[test]
fn update_ldcache_with_the_real_ldconfig_writes_only_the_containers_cache() {
    if tool_missing(
        !Path::new("/sbin/ldconfig").exists(),
        "/sbin/ldconfig is required (CI is set)",
        "skipping: no /sbin/ldconfig on this host",
    ) {
        return;
    }
    let container = Container::new();
    let root = container.root();
    let lib = a_shared_library();
    let name = lib.file_name().unwrap().to_str().unwrap().to_owned();
    let folder = container_only_folder();
    let inside = root.join(folder.trim_start_matches('/'));
    fs::create_dir_all(&inside).unwrap();
    fs::copy(&lib, inside.join(&name)).unwrap();
    linker_config(&root);
    // The image's cache is a link to a host file: ldconfig replaces the link inside the root.
    symlink(
        container.host().join("canary"),
        root.join("etc/ld.so.cache"),
    )
    .unwrap();

    ok(&container.hook(&["update-ldcache", "--folder", &folder]));

    assert_host_cache_never_names(&folder);
    let cache = root.join("etc/ld.so.cache");
    assert!(!cache.is_symlink());
    let listed = Command::new("/sbin/ldconfig")
        .arg("-p")
        .arg("-C")
        .arg(&cache)
        .output()
        .unwrap();
    assert_cached(&String::from_utf8_lossy(&listed.stdout), &name, &folder);
    container.host_unchanged();
}

#[test]
fn a_linker_config_folder_linked_to_the_host_is_refused() {
    let container = Container::new();
    let root = container.root();
    linker_config(&root);
    symlink(container.host().join("lib"), root.join("etc/ld.so.conf.d")).unwrap();
    // Refused before any ldconfig is looked for.
    let output = container.hook(&[
        "update-ldcache",
        "--ldconfig-path",
        "/nonexistent/ldconfig",
        "--folder",
        "/opt/gpu/lib",
    ]);
    let stderr = refused(&output, &root);
    assert!(stderr.contains("/etc/ld.so.conf.d"), "{stderr}");
    container.host_unchanged();
}

#[test]
fn enable_cuda_compat_puts_a_newer_compat_folder_first() {
    let container = Container::new();
    let root = container.root();
    fs::create_dir_all(root.join("etc")).unwrap();
    fs::write(root.join("etc/ld.so.cache"), "").unwrap();
    fs::create_dir_all(root.join("usr/local/cuda/compat")).unwrap();
    fs::write(root.join("usr/local/cuda/compat/libcuda.so.570.86.10"), "").unwrap();
    ok(&container.hook(&["enable-cuda-compat", "--host-driver-version=570.1"]));
    assert!(!root.join("etc/ld.so.conf.d").exists());
    ok(&container.hook(&["enable-cuda-compat", "--host-driver-version=550.54.15"]));
    assert_eq!(
        fs::read_to_string(root.join("etc/ld.so.conf.d/00-compat-gpud.conf")).unwrap(),
        "/usr/local/cuda/compat\n"
    );
    container.host_unchanged();
}

#[test]
fn a_state_without_a_bundle_is_one_line_and_exit_1() {
    let output = Command::new(gpud_bin())
        .args(["cdi-hook", "create-symlinks", "--link", LINK])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with("gpud: cdi-hook: cannot parse the container state on stdin"),
        "{stderr}"
    );
    let output = Command::new(gpud_bin())
        .args(["cdi-hook", "create-symlinks", "--link", "no-separator"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(64));
}

/// Whether a test that needs `tool` and root is skipped (failed instead, in CI).
fn needs_root_and(tool: &str, test: &str) -> bool {
    let has_tool = Command::new(tool)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    let is_root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0");
    tool_missing(
        !has_tool || !is_root,
        &format!("{tool} and root are required (CI is set)"),
        &format!("skipping: {test} needs {tool} and root"),
    )
}

#[test]
fn disable_device_node_modification_masks_the_params_in_a_mount_namespace() {
    if needs_root_and("unshare", "the mount namespace test") {
        return;
    }
    let container = Container::new();
    let root = container.root();
    fs::create_dir_all(root.join("proc/driver/nvidia")).unwrap();
    fs::write(
        root.join("proc/driver/nvidia/params"),
        "ModifyDeviceFiles: 1\nDeviceFileUID: 0\n",
    )
    .unwrap();
    let host_params = container.dir.path().join("host-params");
    fs::write(&host_params, "ModifyDeviceFiles: 1\nDeviceFileUID: 0\n").unwrap();
    let state = container.dir.path().join("state.json");
    fs::write(&state, container.state()).unwrap();
    let params = root.join("proc/driver/nvidia/params");

    // The hook and the checks run in one new mount namespace, as a createContainer hook runs
    // in the container's; nothing is mounted on the host.
    let script = format!(
        "set -e; '{gpud}' cdi-hook disable-device-node-modification --driver-params '{host}' \
         --container-spec '{state}'; cat '{params}'; \
         if echo x 2>/dev/null > '{params}'; then echo writable; else echo read-only; fi",
        gpud = gpud_bin().display(),
        host = host_params.display(),
        state = state.display(),
        params = params.display(),
    );
    let output = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c", &script])
        .output()
        .unwrap();
    ok(&output);
    assert_eq!(
        String::from_utf8_lossy(&output.stdout),
        "ModifyDeviceFiles: 0\nDeviceFileUID: 0\nread-only\n"
    );
    // Outside that namespace the file is as it was.
    assert_eq!(
        fs::read_to_string(&params).unwrap(),
        "ModifyDeviceFiles: 1\nDeviceFileUID: 0\n"
    );

    // In the mount namespace of pid 1 (the host's) nothing is mounted. Checked only where
    // this test runs in it: elsewhere the hook would rightly mount in the test's namespace.
    let own = fs::read_link("/proc/self/ns/mnt").ok();
    if own.is_some() && own == fs::read_link("/proc/1/ns/mnt").ok() {
        let output = Command::new(gpud_bin())
            .args([
                "cdi-hook",
                "disable-device-node-modification",
                "--driver-params",
            ])
            .arg(&host_params)
            .arg("--container-spec")
            .arg(&state)
            .output()
            .unwrap();
        ok(&output);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains("host's mount namespace"), "{stderr}");
        assert!(!root.join("run/gpud-cdi-hook").exists());
    }
    container.host_unchanged();
}

/// Removes a CDI spec file when the test ends, passing or not.
struct SpecGuard(PathBuf);

impl Drop for SpecGuard {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.0);
    }
}

#[test]
fn podman_runs_the_hooks_of_a_cdi_spec() {
    if needs_root_and("podman", "the CDI consumer test") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // The rootfs: the host's static ldconfig, a linker config that includes its drop-ins.
    let rootfs = dir.path().join("rootfs");
    fs::create_dir_all(rootfs.join("sbin")).unwrap();
    fs::copy("/sbin/ldconfig", rootfs.join("sbin/ldconfig")).unwrap();
    linker_config(&rootfs);
    // The "driver": a library folder on the host the spec mounts into the container.
    let lib = a_shared_library();
    let name = lib.file_name().unwrap().to_str().unwrap().to_owned();
    let libdir = dir.path().join("driver-lib");
    fs::create_dir_all(&libdir).unwrap();
    fs::copy(&lib, libdir.join(&name)).unwrap();
    // The hook: a link under the name NVIDIA's specs use, and gpud itself, which the
    // spec's args[0] (the program name a runtime passes) makes the same applet.
    let link_to_gpud = dir.path().join("nvidia-cdi-hook");
    symlink(gpud_bin(), &link_to_gpud).unwrap();

    let kind = format!("gpud-test-{}.example.com/gpu", std::process::id());
    let hook_entry = |path: &Path, args: &[&str]| serde_json::json!({"hookName": "createContainer", "path": path, "args": args});
    let folder = container_only_folder();
    let link = format!("{name}::/opt/gpud-test/links/libtest.so");
    let spec = serde_json::json!({
        "cdiVersion": "0.5.0",
        "kind": kind,
        "devices": [{
            "name": "lib",
            "containerEdits": {
                "mounts": [{
                    "hostPath": libdir,
                    "containerPath": folder,
                    "options": ["ro", "nosuid", "nodev", "bind"],
                }],
                "hooks": [
                    hook_entry(
                        &link_to_gpud,
                        &["nvidia-cdi-hook", "create-symlinks", "--link", &link],
                    ),
                    hook_entry(
                        &gpud_bin(),
                        &["nvidia-cdi-hook", "update-ldcache", "--folder", &folder],
                    ),
                ],
            },
        }],
    });
    fs::create_dir_all("/var/run/cdi").unwrap();
    let spec_path = PathBuf::from(format!(
        "/var/run/cdi/gpud-test-{}.json",
        std::process::id()
    ));
    let _guard = SpecGuard(spec_path.clone());
    fs::write(&spec_path, spec.to_string()).unwrap();

    let output = Command::new("podman")
        .args([
            "run",
            "--rm",
            "--network",
            "none",
            "--ulimit",
            "nofile=1024:20000",
            "--ulimit",
            "nproc=1024:1024",
            "--device",
            &format!("{kind}=lib"),
            "--rootfs",
        ])
        .arg(&rootfs)
        .args(["/sbin/ldconfig", "-p"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    ok(&output);
    assert_cached(&String::from_utf8_lossy(&output.stdout), &name, &folder);
    assert_eq!(
        fs::read_link(rootfs.join("opt/gpud-test/links/libtest.so")).unwrap(),
        PathBuf::from(&name)
    );
    assert_host_cache_never_names(&folder);
}
