//! The fleet's simulated nodes: one `gpud run` process each, with its own node name, fixture,
//! control file, state and DRA folders and kubeconfig, and the labeller's Node sink, node
//! status, the DRA plugin and the MIG reconciler on. Processes are started, stopped and
//! restarted by index, so scenarios can restart batches (a rolling upgrade) or fault some.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// The simulated machines the fleet cycles through.
const FIXTURES: [&str; 3] = ["dgx-h100", "pcie-4gpu", "dgx-a100"];

/// One simulated node.
pub struct Node {
    pub name: String,
    pub dir: PathBuf,
    child: Option<Child>,
}

/// What every node's process needs that is not its own.
pub struct Setup {
    pub gpud: PathBuf,
    pub mock: PathBuf,
    pub mig_config: PathBuf,
    /// Extra `gpud run` arguments, the same for every node (`GPUD_FLEET_ARGS`).
    pub extra: Vec<String>,
}

impl Node {
    /// Lays out node `index` under `root`, its kubeconfig given.
    pub fn new(root: &Path, index: usize, kubeconfig: &dyn Fn(&str) -> String) -> Node {
        let name = format!("gpu-node-{index:04}");
        let dir = root.join(&name);
        for sub in [
            "plugins_registry",
            "plugins",
            "cdi",
            "driver",
            "sys",
            "state",
            "mig",
        ] {
            std::fs::create_dir_all(dir.join(sub)).expect("node folder");
        }
        std::fs::write(dir.join("control"), "").expect("control file");
        std::fs::write(dir.join("product_name"), "DGX Fleet\n").expect("machine type");
        std::fs::write(dir.join("kubeconfig"), kubeconfig(&name)).expect("kubeconfig");
        Node {
            name,
            dir,
            child: None,
        }
    }

    fn fixture(&self) -> &'static str {
        let index: usize = self.name[9..].parse().unwrap_or(0);
        FIXTURES[index % FIXTURES.len()]
    }

    /// Starts the node's gpud (a running one is left as it is).
    pub fn start(&mut self, setup: &Setup) {
        if self.child.is_some() {
            return;
        }
        let path = |rel: &str| self.dir.join(rel).display().to_string();
        let mut cmd = Command::new(&setup.gpud);
        cmd.arg("run")
            .args(["--node-name", &self.name])
            .args(["--kubeconfig", &path("kubeconfig")])
            .args(["--disable", "device-plugin,exporter"])
            .args(["--sink", "node", "--node-status", "--dra"])
            .args(["--kmsg", "", "--health-address", ""])
            .args(["--dra-registry-dir", &path("plugins_registry")])
            .args(["--dra-plugins-dir", &path("plugins")])
            .args(["--dra-cdi-root", &path("cdi")])
            .args(["--dra-driver-root", &path("driver")])
            .args(["--dra-proc-root", &path("driver")])
            .args(["--dra-pod-resources-socket", &path("pod-resources.sock")])
            .args(["--dra-sysfs-root", &path("sys")])
            .args(["--mig-config-file", &setup.mig_config.display().to_string()])
            .args(["--mig-state-dir", &path("mig")])
            .args(&setup.extra)
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env("GPUD_NVML_LIB", &setup.mock)
            .env("NVML_MOCK_FIXTURE", self.fixture())
            .env("NVML_MOCK_CONTROL", path("control"))
            .env("NVML_MOCK_STATE", path("nvml-state.json"))
            .env("GPUD_STATE_DIR", path("state"))
            .env("GFD_MACHINE_TYPE_FILE", path("product_name"))
            .env("GPUD_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(self.dir.join("gpud.log"))
                    .expect("log file"),
            );
        self.child = Some(cmd.spawn().expect("starting gpud"));
    }

    /// Asks the node's gpud to stop (SIGTERM, as a rolling update does); [`Node::reap`]
    /// waits for it. Apart, so a batch stops together.
    pub fn terminate(&self) {
        if let Some(child) = &self.child {
            let _ = Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status();
        }
    }

    /// Waits up to 10 s for the gpud asked to stop, then kills it.
    pub fn reap(&mut self) {
        if let Some(mut child) = self.child.take() {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
            while std::time::Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    return;
                }
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// The process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Appends a line to the simulated driver's control file (`xid <gpu> <code>`).
    pub fn inject(&self, line: &str) {
        let mut file = std::fs::OpenOptions::new()
            .append(true)
            .open(self.dir.join("control"))
            .expect("control file");
        writeln!(file, "{line}").expect("control write");
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
