//! The servers the exporter benchmarks start: `gpud exporter` (this build, or another build of
//! gpud to compare with), nginx serving the same bytes as a static file, and nvitop-exporter on
//! the same simulated node. Each is stopped when dropped.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::client::{Error, get_once};

/// A child process stopped on drop: SIGTERM first, so that nginx's master takes its workers
/// down with it (SIGKILL would leave them running), then SIGKILL if it is still there.
pub struct Proc(pub Child);

impl Proc {
    pub fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let pid = self.0.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        for _ in 0..100 {
            if matches!(self.0.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A running server on a loopback port.
pub struct Server {
    pub proc: Proc,
    pub port: u16,
}

pub fn free_port() -> Result<u16, Error> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// Waits until `GET path` answers 200, failing after `secs`.
fn wait_ok(port: u16, path: &str, secs: u64, what: &str) -> Result<Vec<u8>, Error> {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Ok(response) = get_once(port, path)
            && response.status == 200
        {
            return Ok(response.body);
        }
        if Instant::now() > deadline {
            return Err(format!("{what} did not answer {path} within {secs} s").into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The simulated driver, as the benchmarks run it.
pub struct Node<'a> {
    /// `libnvidia_ml_mock.so`.
    pub mock: &'a Path,
    pub fixture: &'a str,
    /// A directory of the run's own for control files and links.
    pub dir: &'a Path,
}

/// `gpud exporter` (the binary `gpud`, whatever its file is called) sampling every
/// `interval_ms`, once its body has everything (two samples in).
pub fn start_exporter(gpud: &Path, node: &Node<'_>, interval_ms: u64) -> Result<Server, Error> {
    use std::os::unix::process::CommandExt;
    let port = free_port()?;
    let child = Command::new(gpud)
        // A multicall binary: the name it is called by picks the applet.
        .arg0("gpud")
        .args([
            "exporter",
            "-a",
            &format!("127.0.0.1:{port}"),
            "-c",
            &interval_ms.to_string(),
            "--kmsg",
            "",
        ])
        .env("GPUD_NVML_LIB", node.mock)
        .env("NVML_MOCK_FIXTURE", node.fixture)
        .env("NVML_MOCK_CLOCK", "1000")
        .env("NODE_NAME", "bench-node")
        // Its own state dir: two exporters sharing one (a baseline beside the build under test)
        // would hand over from one to the other.
        .env("GPUD_STATE_DIR", node.dir.join(format!("state-{port}")))
        .env("GPUD_LOG", "warn")
        .stdout(Stdio::null())
        .spawn()?;
    let proc = Proc(child);
    // Ready to scrape once two samples are in: rates and GPM metrics need two.
    let deadline = Instant::now() + Duration::from_secs(20);
    while samples_in(&String::from_utf8(wait_ok(
        port,
        "/metrics",
        20,
        "gpud exporter",
    )?)?)
        < 2
    {
        if Instant::now() > deadline {
            return Err("gpud exporter did not sample twice within 20 s".into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(Server { proc, port })
}

/// `gpud_samples_total` of the body served now.
pub fn samples_total(port: u16) -> Result<u64, Error> {
    let body = String::from_utf8(get_once(port, "/metrics")?.body)?;
    Ok(samples_in(&body))
}

/// `gpud_samples_total` of a body (0 without one).
pub fn samples_in(body: &str) -> u64 {
    body.lines()
        .find_map(|l| l.strip_prefix("gpud_samples_total "))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// A program on `PATH` or in one of `more` directories.
pub fn find_program(name: &str, more: &[&str]) -> Option<PathBuf> {
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .chain(more.iter().map(PathBuf::from))
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// nginx serving `body` at `/metrics` with the exporter's content type, on loopback.
pub fn start_nginx(nginx: &Path, dir: &Path, body: &[u8]) -> Result<Server, Error> {
    use std::os::unix::fs::PermissionsExt;
    let port = free_port()?;
    let www = dir.join("www");
    std::fs::create_dir_all(&www)?;
    std::fs::write(www.join("metrics"), body)?;
    // nginx workers may run as another user: let them read the directory.
    for path in [dir, &www] {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))?;
    }
    std::fs::set_permissions(www.join("metrics"), std::fs::Permissions::from_mode(0o644))?;
    let d = dir.display();
    let conf = format!(
        "worker_processes 2;\ndaemon off;\npid {d}/nginx.pid;\nerror_log {d}/nginx-error.log warn;\n\
         events {{ worker_connections 256; }}\n\
         http {{\n  access_log off;\n  sendfile on;\n  tcp_nopush on;\n  tcp_nodelay on;\n  keepalive_requests 1000000;\n\
           client_body_temp_path {d}/tmp-body;\n  proxy_temp_path {d}/tmp-proxy;\n  fastcgi_temp_path {d}/tmp-fcgi;\n\
           uwsgi_temp_path {d}/tmp-uwsgi;\n  scgi_temp_path {d}/tmp-scgi;\n\
           server {{\n    listen 127.0.0.1:{port};\n    root {www};\n\
             location = /metrics {{ default_type \"text/plain; version=0.0.4; charset=utf-8\"; }}\n  }}\n}}\n",
        www = www.display()
    );
    let conf_path = dir.join("nginx.conf");
    std::fs::write(&conf_path, conf)?;
    let child = Command::new(nginx)
        .arg("-c")
        .arg(&conf_path)
        .arg("-e")
        .arg(dir.join("nginx-error.log"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    let proc = Proc(child);
    if wait_ok(port, "/metrics", 10, "nginx")? != body {
        return Err("nginx serves different bytes".into());
    }
    Ok(Server { proc, port })
}

/// nvitop-exporter collecting every second on the simulated node: it loads
/// `libnvidia-ml.so.1` through pynvml, so the mock is linked under that name in a directory of
/// its own on `LD_LIBRARY_PATH`.
pub fn start_nvitop(program: &Path, node: &Node<'_>) -> Result<Server, Error> {
    let lib_dir = node.dir.join("nvml");
    std::fs::create_dir_all(&lib_dir)?;
    let link = lib_dir.join("libnvidia-ml.so.1");
    if !link.exists() {
        std::os::unix::fs::symlink(node.mock, &link)?;
    }
    let port = free_port()?;
    let child = Command::new(program)
        .args(["--bind-address", "127.0.0.1", "--port", &port.to_string()])
        .args(["--interval", "1.0"])
        .env("LD_LIBRARY_PATH", &lib_dir)
        .env("NVML_MOCK_FIXTURE", node.fixture)
        .env("NVML_MOCK_CLOCK", "1000")
        .stdout(Stdio::null())
        // It logs a traceback each interval for the process listing the mock does not have.
        .stderr(Stdio::null())
        .spawn()?;
    let proc = Proc(child);
    wait_ok(port, "/metrics", 30, "nvitop-exporter")?;
    Ok(Server { proc, port })
}
