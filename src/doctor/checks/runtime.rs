//! The container runtime: containerd or CRI-O must hand GPUs to containers, through the NVIDIA
//! runtime or through CDI, and a CDI spec must describe the GPUs and MIG devices there are now
//! (a spec written before a MIG change names devices that no longer exist).

use std::collections::BTreeSet;
use std::os::unix::fs::PermissionsExt;

use serde::Deserialize;

use crate::doctor::env::Env;
use crate::doctor::host::HostRoot;
use crate::doctor_report::Verdict;

const CONTAINERD_CONFIG: &str = "/etc/containerd/config.toml";
const CRIO_CONFIG: &str = "/etc/crio/crio.conf";
const CRIO_DROP_INS: &str = "/etc/crio/crio.conf.d";
/// Where CDI specs live, in the order the runtimes scan them.
const CDI_DIRS: [&str; 2] = ["/etc/cdi", "/var/run/cdi"];

/// One `key = value` of a TOML file, with the table it is in (`a.b.c`, quotes removed).
#[derive(Debug, PartialEq, Eq)]
struct Entry {
    table: String,
    key: String,
    value: String,
}

/// The `key = value` lines of TOML text under their tables. Enough for the flat settings the
/// runtimes' NVIDIA sections use; multi-line values are not read.
fn toml_entries(text: &str) -> Vec<Entry> {
    let mut table = String::new();
    let mut entries = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        if let Some(header) = line.strip_prefix('[') {
            let header = header.trim_start_matches('[');
            let header = header.split(']').next().unwrap_or("");
            table = header.replace(['"', '\'', ' '], "");
            continue;
        }
        if let Some((key, value)) = line.split_once('=') {
            let value = value.split(" #").next().unwrap_or("").trim();
            entries.push(Entry {
                table: table.clone(),
                key: key.trim().trim_matches('"').to_owned(),
                value: value.trim_matches(|c| c == '"' || c == '\'').to_owned(),
            });
        }
    }
    entries
}

/// The files an `imports` value names, globs in the file name expanded.
fn imported(host: &HostRoot, value: &str) -> Vec<String> {
    let mut files = Vec::new();
    for item in value.trim_matches(['[', ']']).split(',') {
        let item = item.trim().trim_matches(|c| c == '"' || c == '\'');
        if item.is_empty() {
            continue;
        }
        let Some((dir, pattern)) = item.rsplit_once('/') else {
            continue;
        };
        match pattern.split_once('*') {
            None => files.push(item.to_owned()),
            Some((prefix, suffix)) => files.extend(
                host.list(dir)
                    .into_iter()
                    .filter(|name| name.starts_with(prefix) && name.ends_with(suffix))
                    .map(|name| format!("{dir}/{name}")),
            ),
        }
    }
    files
}

/// The NVIDIA runtime's binary in containerd's entries (`None` when there is no runtime
/// `nvidia`; `Some(None)` when it has no `BinaryName`).
fn containerd_runtime(entries: &[Entry]) -> Option<Option<String>> {
    let has_table = entries.iter().any(|e| {
        e.table.ends_with(".runtimes.nvidia") || e.table.ends_with(".runtimes.nvidia.options")
    });
    let binary = entries
        .iter()
        .find(|e| e.table.ends_with(".runtimes.nvidia.options") && e.key == "BinaryName")
        .map(|e| e.value.clone());
    (has_table || binary.is_some()).then_some(binary)
}

/// `runtime.containerd`
pub fn containerd(env: &Env) -> Verdict {
    let Some(text) = env.host.read(CONTAINERD_CONFIG) else {
        return Verdict::skip(format!("no containerd config at {CONTAINERD_CONFIG}"));
    };
    let mut entries = toml_entries(&text);
    let imports: Vec<String> = entries
        .iter()
        .filter(|e| e.table.is_empty() && e.key == "imports")
        .flat_map(|e| imported(&env.host, &e.value))
        .collect();
    for file in &imports {
        if let Some(text) = env.host.read(file) {
            entries.extend(toml_entries(&text));
        }
    }
    let version = entries
        .iter()
        .find(|e| e.table.is_empty() && e.key == "version")
        .map(|e| e.value.clone());
    let cdi_setting = entries
        .iter()
        .rev()
        .find(|e| e.key == "enable_cdi")
        .map(|e| e.value == "true");
    // containerd 2 (config version 3) turns CDI on by default.
    let cdi = cdi_setting.unwrap_or(version.as_deref() == Some("3"));
    let default_nvidia = entries
        .iter()
        .any(|e| e.key == "default_runtime_name" && e.value == "nvidia");
    let mut found = Vec::new();
    match containerd_runtime(&entries) {
        Some(Some(binary)) if !env.host.exists(&binary) => {
            return Verdict::fail(
                format!("containerd runtime \"nvidia\" runs {binary}, which does not exist"),
                "fix BinaryName and restart containerd, or drop the entry: GPUs reach containers through CDI without it (gpud runtime configure --runtime=containerd --enable-cdi --restart-mode=systemd)",
            );
        }
        Some(binary) => {
            let binary = binary.unwrap_or_else(|| "(no BinaryName)".to_owned());
            let default = if default_nvidia { " (the default)" } else { "" };
            found.push(format!("runtime \"nvidia\" → {binary}{default}"));
        }
        None => {}
    }
    if cdi {
        found.push("CDI enabled".to_owned());
    }
    if found.is_empty() {
        Verdict::fail(
            format!("containerd has no \"nvidia\" runtime and CDI is off ({CONTAINERD_CONFIG})"),
            "run gpud runtime configure --runtime=containerd --enable-cdi --restart-mode=systemd",
        )
    } else {
        Verdict::ok(format!("containerd: {}", found.join("; ")))
    }
}

/// `runtime.crio`
pub fn crio(env: &Env) -> Verdict {
    let mut files: Vec<String> = Vec::new();
    if env.host.exists(CRIO_CONFIG) {
        files.push(CRIO_CONFIG.to_owned());
    }
    files.extend(
        env.host
            .list(CRIO_DROP_INS)
            .into_iter()
            .map(|name| format!("{CRIO_DROP_INS}/{name}")),
    );
    if files.is_empty() {
        return Verdict::skip(format!("no CRI-O config ({CRIO_CONFIG}, {CRIO_DROP_INS})"));
    }
    let mut runtime = None;
    for file in &files {
        let entries = toml_entries(&env.host.read(file).unwrap_or_default());
        if let Some(path) = entries
            .iter()
            .find(|e| e.table == "crio.runtime.runtimes.nvidia" && e.key == "runtime_path")
        {
            runtime = Some((file.clone(), path.value.clone()));
        }
    }
    match runtime {
        Some((file, path)) if !env.host.exists(&path) => Verdict::fail(
            format!("CRI-O runtime \"nvidia\" ({file}) runs {path}, which does not exist"),
            "fix runtime_path and restart CRI-O, or drop the entry: CRI-O reads CDI specs without it",
        ),
        Some((_, path)) => {
            Verdict::ok(format!("CRI-O: CDI always on; runtime \"nvidia\" → {path}"))
        }
        None => Verdict::ok(
            "CRI-O: CDI always on (no \"nvidia\" runtime: GPUs reach containers through CDI)",
        ),
    }
}

/// The part of a CDI spec the check reads.
#[derive(Debug, Deserialize)]
struct Spec {
    kind: String,
    #[serde(default)]
    devices: Vec<SpecDevice>,
    #[serde(default, rename = "containerEdits")]
    container_edits: SpecEdits,
}

/// The spec-wide edits: only the hooks are read (every GPU container runs them).
#[derive(Debug, Default, Deserialize)]
struct SpecEdits {
    #[serde(default)]
    hooks: Vec<SpecHook>,
}

#[derive(Debug, Deserialize)]
struct SpecHook {
    path: String,
}

#[derive(Debug, Deserialize)]
struct SpecDevice {
    name: String,
}

/// At most three names, then how many more.
fn some_of(names: &[String]) -> String {
    match names.len() {
        0..=3 => names.join(", "),
        n => format!("{} and {} more", names[..3].join(", "), n - 3),
    }
}

/// `runtime.cdi-spec`
pub fn cdi_spec(env: &Env) -> Verdict {
    let Some(snapshot) = env.snapshot() else {
        return env.no_nvml();
    };
    let mut specs = Vec::new();
    let mut names = BTreeSet::new();
    for dir in CDI_DIRS {
        for file in env.host.list(dir) {
            if !(file.ends_with(".json") || file.ends_with(".yaml") || file.ends_with(".yml")) {
                continue;
            }
            let path = format!("{dir}/{file}");
            let local = env.host.path(&path);
            let text = match std::fs::read_to_string(&local) {
                Ok(text) => text,
                Err(err) => {
                    return Verdict::fail(
                        format!("cannot read {path}: {err}"),
                        format!("make it readable: chmod 644 {path}"),
                    );
                }
            };
            let spec: Spec = match serde_yaml_ng::from_str(&text) {
                Ok(spec) => spec,
                Err(err) => {
                    return Verdict::fail(
                        format!("{path} is not a CDI spec: {err}"),
                        format!("regenerate it (gpud cdi generate --output {path}) or remove it"),
                    );
                }
            };
            if !spec.kind.contains("nvidia") {
                continue;
            }
            let mode = std::fs::metadata(&local)
                .map(|m| m.permissions().mode())
                .unwrap_or(0);
            if mode & 0o004 == 0 {
                return Verdict::fail(
                    format!(
                        "{path} is not world-readable (mode {:04o}): the runtime may not read it",
                        mode & 0o7777
                    ),
                    format!("chmod 644 {path}"),
                );
            }
            // A hook the runtime cannot run fails every GPU container's start, whatever the
            // devices say: the most urgent finding about a spec.
            if let Some(hook) = spec
                .container_edits
                .hooks
                .iter()
                .find(|hook| !env.host.exists(&hook.path))
            {
                return Verdict::fail(
                    format!(
                        "{path} names the hook {}, which does not exist: every container given a GPU through it fails to start",
                        hook.path
                    ),
                    format!(
                        "install gpud's hook (gpud runtime install) and regenerate the spec: gpud cdi generate --output {path}"
                    ),
                );
            }
            names.extend(spec.devices.into_iter().map(|d| d.name));
            specs.push(path);
        }
    }
    if specs.is_empty() {
        return Verdict::warn(
            format!("no NVIDIA CDI spec in {}", CDI_DIRS.join(" or ")),
            "generate one: gpud cdi generate --output /var/run/cdi/nvidia.yaml; runtimes using CDI cannot inject GPUs without it",
        );
    }
    let by_uuid = names
        .iter()
        .any(|n| n.starts_with("GPU-") || n.starts_with("MIG-"));
    let mut current = BTreeSet::new();
    let mut missing = Vec::new();
    // A GPU lost before discovery has no UUID to look for (gpu.present reports it).
    for gpu in snapshot.gpus.iter().filter(|g| !g.uuid.is_empty()) {
        let mut want = vec![(gpu.uuid.clone(), gpu.index.to_string())];
        want.extend(
            gpu.mig
                .devices
                .iter()
                .map(|m| (m.uuid.clone(), format!("{}:{}", gpu.index, m.index))),
        );
        for (uuid, index) in want {
            let listed = if by_uuid {
                names.contains(&uuid)
            } else {
                names.contains(&index)
            };
            if !listed {
                missing.push(if by_uuid { uuid.clone() } else { index });
            }
            current.insert(uuid);
        }
    }
    // With a GPU whose identity NVML cannot give, a UUID the spec lists may be that GPU's.
    let identities_known = snapshot.gpus.iter().all(|g| !g.uuid.is_empty());
    let stale: Vec<String> = names
        .iter()
        .filter(|n| identities_known && (n.starts_with("GPU-") || n.starts_with("MIG-")))
        .filter(|n| !current.contains(*n))
        .cloned()
        .collect();
    let mut problems = Vec::new();
    if !missing.is_empty() {
        problems.push(format!("lacks {}", some_of(&missing)));
    }
    if !stale.is_empty() {
        problems.push(format!("lists {} not on this node", some_of(&stale)));
    }
    if problems.is_empty() {
        Verdict::ok(format!(
            "{} lists every GPU and MIG device ({} devices)",
            specs.join(", "),
            current.len()
        ))
    } else {
        Verdict::fail(
            format!("{} is stale: {}", specs.join(", "), problems.join("; ")),
            "regenerate it after every MIG change, or keep it current: gpud cdi generate --watch --output /var/run/cdi/nvidia.yaml (the toolkit component runs it)",
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn toml_entries_follow_tables() {
        let text = "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.nvidia.options]\n  BinaryName = \"/usr/bin/nvidia-container-runtime\" # set by nvidia-ctk\n";
        let entries = toml_entries(text);
        assert_eq!(entries.len(), 2);
        assert_eq!(entries[0].table, "");
        assert_eq!(
            entries[1],
            Entry {
                table: "plugins.io.containerd.grpc.v1.cri.containerd.runtimes.nvidia.options"
                    .into(),
                key: "BinaryName".into(),
                value: "/usr/bin/nvidia-container-runtime".into(),
            }
        );
        assert_eq!(
            containerd_runtime(&entries),
            Some(Some("/usr/bin/nvidia-container-runtime".into()))
        );
    }
}
