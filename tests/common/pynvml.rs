//! NVIDIA's Python bindings (nvidia-ml-py) in another process on the simulated node: what
//! they see of the driver is what a CUDA program would see, the cross-check of what gpud did.

use std::path::{Path, PathBuf};

use crate::common::{self, Node, stdout_ok};

/// The Python the cross-check runs: `make test`'s environment in target/py-venv, else python3.
pub fn python() -> PathBuf {
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/py-venv/bin/python");
    if venv.exists() {
        venv
    } else {
        "python3".into()
    }
}

/// The MIG devices NVIDIA's own bindings (nvidia-ml-py) see on the node, as `profile=count`
/// words; `None` where the bindings are not installed (outside CI).
pub fn mig_devices(node: &Node) -> Option<String> {
    const SCRIPT: &str = "
import collections, pynvml as nv
nv.nvmlInit()
counts = collections.Counter()
for i in range(nv.nvmlDeviceGetCount()):
    gpu = nv.nvmlDeviceGetHandleByIndex(i)
    if nv.nvmlDeviceGetMigMode(gpu)[0] != 1:
        continue
    for j in range(nv.nvmlDeviceGetMaxMigDeviceCount(gpu)):
        try:
            mig = nv.nvmlDeviceGetMigDeviceHandleByIndex(gpu, j)
        except nv.NVMLError_NotFound:
            continue
        counts[nv.nvmlDeviceGetName(mig).rsplit(' MIG ', 1)[1]] += 1
nv.nvmlShutdown()
print(' '.join(f'{k}={v}' for k, v in sorted(counts.items())))
";
    let installed = std::process::Command::new(python())
        .args(["-c", "import pynvml"])
        .output()
        .is_ok_and(|o| o.status.success());
    if common::tool_missing(
        !installed,
        "nvidia-ml-py is required in CI (make test installs it in target/py-venv)",
        "skipped: nvidia-ml-py is not installed (tests/python/venv.sh installs it)",
    ) {
        return None;
    }
    // pynvml loads libnvidia-ml.so.1 by name, as it loads the driver's.
    let libs = node.dir.path().join("pylib");
    std::fs::create_dir_all(&libs).unwrap();
    let _ = std::os::unix::fs::symlink(common::mock_lib(), libs.join("libnvidia-ml.so.1"));
    let mut cmd = std::process::Command::new(python());
    node.wire(&mut cmd);
    let out = cmd
        .env("LD_LIBRARY_PATH", &libs)
        .args(["-c", SCRIPT])
        .output()
        .unwrap();
    Some(stdout_ok(&out).trim().to_owned())
}
