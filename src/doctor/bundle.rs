//! `--bundle FILE.tar.gz`: one file that answers a support ticket. It holds the doctor's
//! report, the inventory (with each GPU's health), what `gpud health --once` would print
//! (judged from the signals the doctor already read), the kernel log's XID lines, gpud's and
//! NVIDIA's config files, the CDI specs and versions, and nothing secret: no environment
//! values but gpud's own (`GPUD_*`, minus any whose name says secret), and every
//! `token`/`password`/`secret`/`key-data` value in a copied file replaced by `<redacted>`.

use std::io::Write;
use std::path::Path;

use flate2::Compression;
use flate2::write::GzEncoder;

use super::checks::read_kernel_log;
use super::env::{Driver, Options};
use super::host::HostRoot;
use super::render;
use crate::doctor_report::Report;
use crate::inventory::Snapshot;
use crate::nvml::GpuSignals;

/// The folder every entry is under in the archive.
const TOP: &str = "gpud-doctor";

/// What `gpud health --once` prints for a node, judged from signals already read: marks the
/// snapshot's devices with their health and returns the table and the JSON lines. The applet
/// passes the health subsystem's judgement in; the doctor does not decide health itself.
pub type HealthReport<'a> = &'a dyn Fn(&mut Snapshot, &[&GpuSignals]) -> (String, String);

/// Words that mark a key or variable whose value must not leave the node.
const SECRET_WORDS: [&str; 6] = [
    "token",
    "secret",
    "password",
    "passwd",
    "key-data",
    "credential",
];

fn is_secret(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    SECRET_WORDS.iter().any(|w| lower.contains(w)) || lower.ends_with("key")
}

/// `text` with the value of every `key: value` / `key = value` / `KEY=value` line whose key
/// names a secret replaced by `<redacted>`.
pub fn redact(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        let split = line.find([':', '=']);
        match split {
            Some(at) if is_secret(&line[..at]) => {
                out.push_str(&line[..=at]);
                out.push_str(" <redacted>");
            }
            _ => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

/// gpud's own environment (`GPUD_*`), secrets' values redacted.
#[allow(clippy::disallowed_methods)] // the bundle records gpud's own configuration
fn own_environment() -> String {
    let mut lines: Vec<String> = std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.to_string_lossy().into_owned())))
        .filter(|(k, _)| k.starts_with("GPUD_"))
        .map(|(k, v)| {
            if is_secret(&k) {
                format!("{k}=<redacted>")
            } else {
                format!("{k}={v}")
            }
        })
        .collect();
    lines.sort();
    lines.join("\n") + "\n"
}

/// Versions: gpud, the driver, CUDA, NVML, the kernel and the OS.
fn versions(driver: &Driver, host: &HostRoot) -> String {
    let mut text = format!("gpud {}\n", env!("CARGO_PKG_VERSION"));
    if let Driver::Loaded {
        path,
        snapshot: Ok(s),
        ..
    } = driver
    {
        text.push_str(&format!(
            "driver {}\ncuda {}\nnvml {} ({})\n",
            s.node.driver_version,
            s.node.cuda_driver_version.as_deref().unwrap_or("unknown"),
            s.node.nvml_version.as_deref().unwrap_or("unknown"),
            path.display()
        ));
    }
    for file in [
        "/proc/version",
        "/proc/driver/nvidia/version",
        "/etc/os-release",
    ] {
        if let Some(content) = host.read(file) {
            text.push_str(&format!("\n# {file}\n{}", redact(&content)));
        }
    }
    text
}

/// The kernel log's NVRM lines about XIDs and lost GPUs.
fn xid_lines(options: &Options, host: &HostRoot) -> String {
    let path = options
        .kmsg
        .clone()
        .unwrap_or_else(|| host.path("/dev/kmsg"));
    match read_kernel_log(&path) {
        Ok(text) => text
            .lines()
            .filter(|l| l.contains("NVRM: Xid") || l.contains("fallen off the bus"))
            .map(|l| format!("{l}\n"))
            .collect(),
        Err(err) => format!("cannot read {}: {err}\n", path.display()),
    }
}

/// Writes the bundle to `path`.
pub fn write(
    path: &Path,
    report: &Report,
    health: HealthReport<'_>,
    driver: &Driver,
    options: &Options,
) -> std::io::Result<()> {
    let host = HostRoot::new(options.host_root.clone());
    let mut files: Vec<(String, String)> = vec![
        ("doctor.json".into(), render::json(report)),
        ("versions.txt".into(), versions(driver, &host)),
        ("environment.txt".into(), own_environment()),
        ("xid.log".into(), xid_lines(options, &host)),
    ];
    if let Driver::Loaded {
        snapshot: Ok(snapshot),
        preflight,
        ..
    } = driver
    {
        let mut snapshot = snapshot.as_ref().clone();
        match preflight {
            Ok(gpus) => {
                let signals: Vec<&GpuSignals> = gpus.iter().map(|g| &g.signals).collect();
                let (table, json_lines) = health(&mut snapshot, &signals);
                files.push(("health.txt".into(), table));
                files.push(("health.jsonl".into(), json_lines));
            }
            Err(why) => files.push(("health.txt".into(), format!("no health: {why}\n"))),
        }
        let json = serde_json::to_string_pretty(&snapshot)
            .unwrap_or_else(|err| format!("cannot serialise the inventory: {err}"));
        files.push(("inventory.json".into(), json + "\n"));
    }
    for (name, config) in [
        ("gpud", &options.gpud_config),
        ("nvidia", &options.nvidia_config),
    ] {
        if let Some(config) = config
            && let Ok(text) = std::fs::read_to_string(config)
        {
            files.push((
                format!("config/{name}-{}", file_name(config)),
                redact(&text),
            ));
        }
    }
    for dir in ["/etc/cdi", "/var/run/cdi"] {
        for name in host.list(dir) {
            if let Some(text) = host.read(&format!("{dir}/{name}")) {
                files.push((format!("cdi{dir}/{name}"), redact(&text)));
            }
        }
    }
    let out = std::fs::File::create(path)?;
    let mut archive = tar::Builder::new(GzEncoder::new(out, Compression::default()));
    let mtime = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    for (name, text) in files {
        let mut header = tar::Header::new_gnu();
        header.set_size(text.len() as u64);
        header.set_mode(0o644);
        header.set_mtime(mtime);
        header.set_cksum();
        archive.append_data(&mut header, format!("{TOP}/{name}"), text.as_bytes())?;
    }
    archive.into_inner()?.finish()?.flush()
}

fn file_name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "config".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_redacted() {
        let text = "users:\n- name: kubelet\n  user:\n    token: abc123\n    client-key-data: LS0t\nGPUD_API_TOKEN=xyz\nserver: https://10.0.0.1\n";
        assert_eq!(
            redact(text),
            "users:\n- name: kubelet\n  user:\n    token: <redacted>\n    client-key-data: <redacted>\nGPUD_API_TOKEN= <redacted>\nserver: https://10.0.0.1\n"
        );
    }
}
