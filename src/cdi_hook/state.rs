//! Where the container's root is: the OCI state a runtime writes on a hook's stdin names the
//! bundle, whose config.json names the root (`root.path`, relative to the bundle unless
//! absolute).
//!
//! `--container-spec FILE` reads the state from a file instead of stdin, as NVIDIA's hook does
//! (`-` is stdin); a file that is the bundle's config.json itself is taken too, its root
//! relative to the file's folder. Nothing else of the container's config is read: the hook
//! takes no environment, user or mounts from it.

use std::io::Read;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::error::HookError;

/// The most bytes read from the state or config: both are a few KiB; a larger input is not
/// one a runtime wrote.
const MAX_INPUT: u64 = 4 << 20;

/// The OCI state: only the bundle is used.
#[derive(Debug, Deserialize)]
struct State {
    bundle: PathBuf,
}

/// The bundle's config.json: only the root is used.
#[derive(Debug, Deserialize)]
struct Config {
    root: Option<ConfigRoot>,
}

#[derive(Debug, Deserialize)]
struct ConfigRoot {
    path: PathBuf,
}

/// The container root named by the state (or config) in `container_spec`, or on `stdin` when
/// that is `None` or `-`.
pub fn container_root(
    container_spec: Option<&Path>,
    stdin: &mut dyn Read,
) -> Result<PathBuf, HookError> {
    match container_spec.filter(|p| *p != Path::new("-")) {
        None => {
            let text = read_limited(stdin).map_err(|source| HookError::ReadState {
                from: "stdin".to_owned(),
                source,
            })?;
            root_from(&text, "the container state on stdin", None)
        }
        Some(path) => {
            let text = std::fs::File::open(path)
                .and_then(|mut file| read_limited(&mut file))
                .map_err(|source| HookError::ReadState {
                    from: path.display().to_string(),
                    source,
                })?;
            root_from(&text, &path.display().to_string(), path.parent())
        }
    }
}

fn read_limited(input: &mut dyn Read) -> std::io::Result<Vec<u8>> {
    let mut text = Vec::new();
    input.take(MAX_INPUT).read_to_end(&mut text)?;
    Ok(text)
}

/// The root from a state (its bundle's config.json is read) or, when the text is a config
/// itself, from that config, relative to `config_dir`.
fn root_from(text: &[u8], from: &str, config_dir: Option<&Path>) -> Result<PathBuf, HookError> {
    let parse_error = |reason: String| HookError::ParseState {
        from: from.to_owned(),
        reason,
    };
    let value: serde_json::Value =
        serde_json::from_slice(text).map_err(|err| parse_error(err.to_string()))?;
    if value.get("bundle").is_some() {
        let state: State =
            serde_json::from_value(value).map_err(|err| parse_error(err.to_string()))?;
        // The OCI state's bundle is absolute; a relative one would be taken from the hook's
        // working directory, which at createContainer can be the container's root: the image's.
        if !state.bundle.is_absolute() {
            return Err(parse_error(format!(
                "the bundle {} is not an absolute path",
                state.bundle.display()
            )));
        }
        let config_path = state.bundle.join("config.json");
        // Bounded, and a FIFO or device in the bundle's place is refused without reading.
        let config = crate::files::read_bytes(&config_path, MAX_INPUT).map_err(|err| {
            HookError::ReadConfig {
                path: config_path.clone(),
                source: match err {
                    crate::files::ReadError::Io { source, .. } => source,
                    other => std::io::Error::other(other.to_string()),
                },
            }
        })?;
        return root_of_config(&config, &config_path.display().to_string(), &state.bundle);
    }
    if value.get("root").is_some() {
        let dir = config_dir.unwrap_or(Path::new("."));
        return root_of_config(text, from, dir);
    }
    Err(parse_error(
        "neither \"bundle\" nor \"root\" is set".to_owned(),
    ))
}

/// `root.path` of a config.json, joined to `bundle` when relative.
fn root_of_config(text: &[u8], from: &str, bundle: &Path) -> Result<PathBuf, HookError> {
    let parse_error = |reason: String| HookError::ParseState {
        from: from.to_owned(),
        reason,
    };
    let config: Config =
        serde_json::from_slice(text).map_err(|err| parse_error(err.to_string()))?;
    let root = config
        .root
        .map(|root| root.path)
        .filter(|path| !path.as_os_str().is_empty())
        .ok_or_else(|| parse_error("root.path is not set".to_owned()))?;
    Ok(if root.is_absolute() {
        root
    } else {
        bundle.join(root)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bundle(config: &str) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("config.json"), config).unwrap();
        dir
    }

    fn state(bundle: &Path) -> String {
        serde_json::json!({
            "ociVersion": "1.0.2", "id": "c1", "status": "creating", "pid": 42,
            "bundle": bundle,
        })
        .to_string()
    }

    #[test]
    fn relative_root_is_under_the_bundle() {
        let dir = bundle(r#"{"ociVersion":"1.0.2","root":{"path":"rootfs"}}"#);
        let text = state(dir.path());
        let root = container_root(None, &mut text.as_bytes()).unwrap();
        assert_eq!(root, dir.path().join("rootfs"));
    }

    #[test]
    fn absolute_root_is_kept_and_dash_is_stdin() {
        let dir = bundle(r#"{"root":{"path":"/var/lib/c1/merged","readonly":true}}"#);
        let text = state(dir.path());
        let root = container_root(Some(Path::new("-")), &mut text.as_bytes()).unwrap();
        assert_eq!(root, PathBuf::from("/var/lib/c1/merged"));
    }

    #[test]
    fn container_spec_names_a_state_file_or_the_config_itself() {
        let dir = bundle(r#"{"root":{"path":"rootfs"}}"#);
        let state_file = dir.path().join("state.json");
        std::fs::write(&state_file, state(dir.path())).unwrap();
        let root = container_root(Some(&state_file), &mut std::io::empty()).unwrap();
        assert_eq!(root, dir.path().join("rootfs"));
        let config = dir.path().join("config.json");
        let root = container_root(Some(&config), &mut std::io::empty()).unwrap();
        assert_eq!(root, dir.path().join("rootfs"));
    }

    #[test]
    fn errors_name_what_is_missing() {
        let err = container_root(None, &mut "{}".as_bytes()).unwrap_err();
        assert!(
            err.to_string().contains("neither \"bundle\" nor \"root\""),
            "{err}"
        );
        let err = container_root(None, &mut "not json".as_bytes()).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("cannot parse the container state on stdin")
        );
        let err =
            container_root(None, &mut r#"{"bundle":"/nonexistent/b"}"#.as_bytes()).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("cannot read the container config /nonexistent/b/config.json"),
            "{err}"
        );
        let err = container_root(None, &mut r#"{"bundle":"rootfs/.."}"#.as_bytes()).unwrap_err();
        assert!(err.to_string().contains("not an absolute path"), "{err}");
        let dir = bundle(r#"{"root":{"path":""}}"#);
        let err = container_root(None, &mut state(dir.path()).as_bytes()).unwrap_err();
        assert!(err.to_string().contains("root.path is not set"), "{err}");
    }
}
