//! containerd's `config.toml`: where CDI and runtime entries live in each config version, and
//! which versions gpud edits.
//!
//! - version 2 (containerd 1.x): the CRI plugin is `plugins."io.containerd.grpc.v1.cri"`, with
//!   `enable_cdi`, `cdi_spec_dirs` and `containerd.runtimes.<name>`;
//! - version 3 (containerd 2.x): the same keys under `plugins."io.containerd.cri.v1.runtime"`.
//!
//! A file without `version` is version 1 to containerd; gpud edits neither it nor a version it
//! does not know (the key layout would be a guess). Files named in `imports` are merged over
//! the main file by containerd, so one that sets a key gpud sets would win: gpud edits the main
//! file and names such imports ([`shadowing_imports`]).

use std::path::{Path, PathBuf};
use std::process::Command;

use toml_edit::DocumentMut;

use super::record::Change;
use super::toml_keys::{self, get, parse};
use super::{Edited, Error, NvidiaRuntime, Plan, Request, Wanted, key};

/// nvidia-ctk's default config path for containerd.
pub const DEFAULT_CONFIG: &str = "/etc/containerd/config.toml";

/// The runc shim every runtime entry gpud writes runs (the NVIDIA runtime is a runc
/// replacement, given as the shim's `BinaryName`).
pub const RUNC_SHIM: &str = "io.containerd.runc.v2";

/// The CRI plugin that holds the CDI and runtime keys in config `version`.
fn cri_plugin(version: i64) -> &'static str {
    if version == 3 {
        "io.containerd.cri.v1.runtime"
    } else {
        "io.containerd.grpc.v1.cri"
    }
}

/// A key path under the CRI plugin of `version`.
fn cri(version: i64, rest: &[&str]) -> Vec<String> {
    let mut path = key(&["plugins", cri_plugin(version)]);
    path.extend(rest.iter().map(|p| (*p).to_owned()));
    path
}

/// What `request` sets in a config of `version`, and the keys gpud owns there.
pub fn plan(version: i64, request: &Request) -> Plan {
    let mut plan = Plan::default();
    if request.enable_cdi {
        plan.settings
            .push((cri(version, &["enable_cdi"]), Wanted::Bool(true)));
    }
    if !request.cdi_spec_dirs.is_empty() {
        plan.settings.push((
            cri(version, &["cdi_spec_dirs"]),
            Wanted::Strings(request.cdi_spec_dirs.clone()),
        ));
    }
    plan.owned.extend([
        cri(version, &["enable_cdi"]),
        cri(version, &["cdi_spec_dirs"]),
    ]);
    let plugin = cri_plugin(version);
    plan.add_runtime(
        request,
        &["plugins", plugin, "containerd", "runtimes"],
        &["plugins", plugin, "containerd", "default_runtime_name"],
        |path| {
            vec![
                (&["runtime_type"], Wanted::Str(RUNC_SHIM.to_owned())),
                (&["options", "BinaryName"], Wanted::Str(path.to_owned())),
            ]
        },
    );
    plan
}

/// The config version of `doc` (the contents of `path`), if gpud edits it.
pub fn version_of(path: &Path, doc: &DocumentMut) -> Result<i64, Error> {
    let bad = |value: String| Error::Version {
        path: path.to_path_buf(),
        value,
    };
    match doc.get("version") {
        None => Err(bad("1 (no `version` key)".to_owned())),
        Some(item) => match item.as_integer() {
            Some(version @ (2 | 3)) => Ok(version),
            _ => Err(bad(item.to_string().trim().to_owned())),
        },
    }
}

/// `request` applied to `text` (`None`: a new file of config version `new_version`).
pub fn configure(
    path: &Path,
    text: Option<&str>,
    request: &Request,
    new_version: i64,
) -> Result<(String, Vec<Change>), Error> {
    let empty = format!("version = {new_version}\n");
    let mut doc = parse(path, text.unwrap_or(&empty))?;
    let version = version_of(path, &doc)?;
    let changes = toml_keys::apply(path, &mut doc, &plan(version, request))?;
    Ok((doc.to_string(), changes))
}

/// The keys gpud owns in `text` for the runtime entry `name`.
pub fn owned(path: &Path, text: &str, name: &str) -> Result<Vec<Vec<String>>, Error> {
    let version = version_of(path, &parse(path, text)?)?;
    Ok(plan(version, &named(name)).owned)
}

/// See [`super::revert`].
pub fn revert(path: &Path, text: &str, backup: Option<&str>, name: &str) -> Result<Edited, Error> {
    let current = parse(path, text)?;
    let version = version_of(path, &current)?;
    let base = match backup {
        Some(old) => parse(&super::write::backup_path(path), old)?,
        None => DocumentMut::new(),
    };
    let owned = plan(version, &named(name)).owned;
    toml_keys::revert_docs(current, &base, backup, text, &owned, path)
}

/// A request that names the runtime entry only: the keys gpud owns for `name`.
fn named(name: &str) -> Request {
    Request {
        runtime: Some(NvidiaRuntime {
            name: name.to_owned(),
            path: String::new(),
        }),
        ..Request::default()
    }
}

/// One line per file in the `imports` of `text` (the main config at `path`) that sets a key
/// gpud owns: containerd merges imports over the main file, so that value wins.
pub fn shadowing_imports(path: &Path, text: &str, name: &str) -> Vec<String> {
    let Ok(doc) = parse(path, text) else {
        return Vec::new();
    };
    let Ok(version) = version_of(path, &doc) else {
        return Vec::new();
    };
    let owned = plan(version, &named(name)).owned;
    let imports: Vec<&str> = doc
        .get("imports")
        .and_then(|item| item.as_array())
        .map(|array| array.iter().filter_map(|v| v.as_str()).collect())
        .unwrap_or_default();
    let mut lines = Vec::new();
    for import in imports.iter().flat_map(|pattern| expand(path, pattern)) {
        let Ok(Some(imported_text)) = super::write::read(&import) else {
            continue;
        };
        let Ok(imported) = parse(&import, &imported_text) else {
            lines.push(format!(
                "{}: imported by {} and not valid TOML; containerd will refuse it",
                import.display(),
                path.display()
            ));
            continue;
        };
        for key in owned
            .iter()
            .filter(|k| get(imported.as_item(), k).is_some())
        {
            lines.push(format!(
                "{}: sets {}, and containerd merges this import over {}: its value wins over gpud's",
                import.display(),
                key.join("."),
                path.display()
            ));
        }
    }
    lines
}

/// The files an `imports` entry names: relative to the main file's folder, with `*` and `?`
/// in the file name matched as containerd's glob does, sorted.
fn expand(main: &Path, pattern: &str) -> Vec<PathBuf> {
    let folder = main.parent().unwrap_or(Path::new("."));
    let full = folder.join(pattern);
    let name = full
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    if !name.contains(['*', '?']) {
        return vec![full];
    }
    let dir = full.parent().unwrap_or(folder);
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .filter(|e| glob_match(name.as_bytes(), e.file_name().as_encoded_bytes()))
                .map(|e| e.path())
                .collect()
        })
        .unwrap_or_default();
    found.sort();
    found
}

/// `*` (any run) and `?` (one byte) matching of a file name.
fn glob_match(pattern: &[u8], name: &[u8]) -> bool {
    match (pattern.split_first(), name.split_first()) {
        (None, None) => true,
        (Some((b'*', rest)), _) => {
            glob_match(rest, name) || (!name.is_empty() && glob_match(pattern, &name[1..]))
        }
        (Some((b'?', rest)), Some((_, tail))) => glob_match(rest, tail),
        (Some((p, rest)), Some((n, tail))) if p == n => glob_match(rest, tail),
        _ => false,
    }
}

/// The config version the installed containerd writes (`containerd --version`: 2.x → 3,
/// older → 2); `None` when none runs.
pub fn installed_config_version() -> Option<i64> {
    let output = Command::new("containerd").arg("--version").output().ok()?;
    let text = String::from_utf8_lossy(&output.stdout);
    // "containerd github.com/containerd/containerd v2.0.0 <commit>" or "… 1.6.20~ds1 …".
    let release = text.split_whitespace().nth(2)?;
    let major: u32 = release
        .trim_start_matches('v')
        .split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()?;
    Some(if major >= 2 { 3 } else { 2 })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> String {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/runtime")
            .join(name);
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    fn cdi_and_runtime() -> Request {
        Request {
            enable_cdi: true,
            cdi_spec_dirs: vec!["/etc/cdi".into(), "/var/run/cdi".into()],
            runtime: Some(NvidiaRuntime {
                name: "nvidia".into(),
                path: "/usr/bin/nvidia-container-runtime".into(),
            }),
            set_as_default: true,
        }
    }

    fn cdi_only() -> Request {
        Request {
            enable_cdi: true,
            ..Request::default()
        }
    }

    /// `<name>.toml` configured is `<name>.configured.toml`; a second run changes nothing and
    /// a revert gives the original bytes back.
    fn golden_round_trip(name: &str) {
        let path = Path::new("/etc/containerd/config.toml");
        let input = fixture(&format!("{name}.toml"));
        let (out, changes) = configure(path, Some(&input), &cdi_and_runtime(), 2).unwrap();
        assert_eq!(out, fixture(&format!("{name}.configured.toml")));
        assert_eq!(
            configure(path, Some(&out), &cdi_and_runtime(), 2).unwrap(),
            (out.clone(), vec![])
        );
        let (reverted, skipped) =
            toml_keys::revert_recorded(path, &out, &changes, Some(&input), false, &[]).unwrap();
        assert_eq!(reverted, Edited::Text(input.clone()));
        assert!(skipped.is_empty());
        assert_eq!(
            revert(path, &out, Some(&input), "nvidia").unwrap(),
            Edited::Text(input)
        );
    }

    #[test]
    fn version_2_gets_cdi_and_the_runtime_keeping_everything_else() {
        golden_round_trip("containerd-v2");
    }

    #[test]
    fn version_3_matches_the_golden_file() {
        golden_round_trip("containerd-v3");
    }

    #[test]
    fn cdi_alone_adds_no_runtime_entry() {
        let path = Path::new("c.toml");
        let input = fixture("containerd-v2.toml");
        let (out, _) = configure(path, Some(&input), &cdi_only(), 2).unwrap();
        assert!(out.contains("enable_cdi = true"), "{out}");
        assert!(!out.contains("nvidia"), "{out}");
    }

    #[test]
    fn a_missing_file_becomes_a_config_of_the_given_version() {
        let path = Path::new("c.toml");
        let (out, _) = configure(path, None, &cdi_only(), 3).unwrap();
        assert_eq!(
            out,
            "version = 3\n\n[plugins.\"io.containerd.cri.v1.runtime\"]\nenable_cdi = true\n"
        );
        assert_eq!(revert(path, &out, None, "nvidia").unwrap(), Edited::Remove);
    }

    #[test]
    fn a_revert_after_other_edits_takes_back_only_gpuds_keys() {
        let path = Path::new("c.toml");
        let input = "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\"]\n  enable_cdi = false\n";
        let (out, _) = configure(path, Some(input), &cdi_and_runtime(), 2).unwrap();
        let edited = format!("{out}# added by hand\n[debug]\nlevel = \"debug\"\n");
        let Edited::Text(reverted) = revert(path, &edited, Some(input), "nvidia").unwrap() else {
            panic!("removed");
        };
        assert!(reverted.contains("enable_cdi = false"), "{reverted}");
        assert!(reverted.contains("level = \"debug\""), "{reverted}");
        assert!(!reverted.contains("nvidia"), "{reverted}");
        assert!(!reverted.contains("cdi_spec_dirs"), "{reverted}");
    }

    #[test]
    fn versions_gpud_does_not_edit_are_named() {
        let path = Path::new("/etc/containerd/config.toml");
        for (text, value) in [
            ("root = \"/var/lib/containerd\"\n", "1 (no `version` key)"),
            ("version = 1\n", "1"),
            ("version = 4\n", "4"),
            ("version = \"2\"\n", "\"2\""),
        ] {
            let err = configure(path, Some(text), &cdi_only(), 2).unwrap_err();
            assert!(err.is_data());
            assert!(
                err.to_string().starts_with(&format!(
                    "/etc/containerd/config.toml: containerd config version {value} is not"
                )),
                "{err}"
            );
        }
    }

    #[test]
    fn imports_that_set_gpuds_keys_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let main = dir.path().join("config.toml");
        std::fs::create_dir(dir.path().join("conf.d")).unwrap();
        std::fs::write(
            dir.path().join("conf.d/10-cdi.toml"),
            "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\"]\nenable_cdi = false\n",
        )
        .unwrap();
        std::fs::write(dir.path().join("conf.d/20-other.toml"), "version = 2\n").unwrap();
        let text = "version = 2\nimports = [\"conf.d/*.toml\"]\n";
        let lines = shadowing_imports(&main, text, "nvidia");
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert!(
            lines[0].contains("10-cdi.toml: sets plugins.io.containerd.grpc.v1.cri.enable_cdi")
        );
    }

    #[test]
    fn globs_match_as_containerds_do() {
        assert!(glob_match(b"*.toml", b"99-nvidia.toml"));
        assert!(glob_match(b"?9-*", b"99-x"));
        assert!(!glob_match(b"*.toml", b"x.conf"));
    }
}
