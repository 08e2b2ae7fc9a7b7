//! Renders a spec as YAML or JSON, and works out which of the two a file name asks for.

use std::path::Path;

use super::spec::Spec;

/// The two encodings CDI runtimes read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// YAML (`.yaml`, `.yml`).
    Yaml,
    /// JSON (`.json`).
    Json,
}

/// A spec that could not be encoded (plain data always encodes; kept for honesty).
#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    /// The YAML encoder failed.
    #[error("cannot encode the spec as YAML: {0}")]
    Yaml(#[from] serde_yaml_ng::Error),
    /// The JSON encoder failed.
    #[error("cannot encode the spec as JSON: {0}")]
    Json(#[from] serde_json::Error),
}

impl Format {
    /// The format a file's extension implies (`.json`, `.yaml`, `.yml`), if any.
    pub fn from_path(path: &Path) -> Option<Format> {
        match path.extension()?.to_str()? {
            "json" => Some(Format::Json),
            "yaml" | "yml" => Some(Format::Yaml),
            _ => None,
        }
    }

    /// The flag value, `yaml` or `json`.
    pub fn as_str(self) -> &'static str {
        match self {
            Format::Yaml => "yaml",
            Format::Json => "json",
        }
    }
}

/// The spec as text, ending in a newline. JSON is indented for people reading it.
pub fn render(spec: &Spec, format: Format) -> Result<String, RenderError> {
    match format {
        Format::Yaml => Ok(quote_sexagesimal_names(&serde_yaml_ng::to_string(spec)?)),
        Format::Json => {
            let mut text = serde_json::to_string_pretty(spec)?;
            text.push('\n');
            Ok(text)
        }
    }
}

/// Quotes device names such as `1:0` (GPU 1, MIG device 0). The YAML encoder leaves them
/// plain, which YAML 1.2 readers take as text but YAML 1.1 readers take as the base-60 integer
/// 60; Go's YAML encoder (and so `nvidia-ctk`) quotes them for the same reason.
fn quote_sexagesimal_names(yaml: &str) -> String {
    let mut out = String::with_capacity(yaml.len() + 64);
    for line in yaml.split_inclusive('\n') {
        let body = line.trim_end_matches('\n');
        let quoted = body.split_once("name: ").filter(|(head, value)| {
            head.chars().all(|c| c == ' ' || c == '-') && is_sexagesimal(value)
        });
        match quoted {
            Some((head, value)) => {
                out.push_str(head);
                out.push_str("name: '");
                out.push_str(value);
                out.push('\'');
                out.push_str(&line[body.len()..]);
            }
            None => out.push_str(line),
        }
    }
    out
}

/// `digits(:digits)+`, e.g. `1:0`, `12:3`.
fn is_sexagesimal(value: &str) -> bool {
    let mut parts = value.split(':');
    let all_digits = |p: &str| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit());
    value.contains(':') && parts.all(all_digits)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cdi::spec::{ContainerEdits, Device, DeviceNode};

    fn spec() -> Spec {
        Spec {
            cdi_version: "0.5.0".into(),
            kind: "nvidia.com/gpu".into(),
            devices: vec![Device {
                name: "0".into(),
                container_edits: ContainerEdits {
                    device_nodes: vec![DeviceNode::from_host("/dev/nvidia0".into(), None)],
                    ..ContainerEdits::default()
                },
            }],
            container_edits: ContainerEdits {
                env: vec!["NVIDIA_VISIBLE_DEVICES=void".into()],
                ..ContainerEdits::default()
            },
        }
    }

    #[test]
    fn extension_picks_the_format() {
        assert_eq!(
            Format::from_path(Path::new("/var/run/cdi/nvidia.yaml")),
            Some(Format::Yaml)
        );
        assert_eq!(Format::from_path(Path::new("a.yml")), Some(Format::Yaml));
        assert_eq!(Format::from_path(Path::new("a.json")), Some(Format::Json));
        assert_eq!(Format::from_path(Path::new("a.txt")), None);
        assert_eq!(Format::from_path(Path::new("-")), None);
    }

    #[test]
    fn yaml_quotes_numeric_names_and_round_trips() {
        let text = render(&spec(), Format::Yaml).unwrap();
        assert_eq!(
            text,
            "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n- name: '0'\n  containerEdits:\n    \
             deviceNodes:\n    - path: /dev/nvidia0\ncontainerEdits:\n  env:\n  - NVIDIA_VISIBLE_DEVICES=void\n"
        );
        let back: Spec = serde_yaml_ng::from_str(&text).unwrap();
        assert_eq!(back, spec());
    }

    #[test]
    fn index_names_of_mig_devices_are_quoted_for_yaml_1_1_readers() {
        let mut spec = spec();
        for name in ["1:0", "12:3", "mig1:0", "GPU-1:2"] {
            let mut device = spec.devices[0].clone();
            device.name = name.into();
            spec.devices.push(device);
        }
        let text = render(&spec, Format::Yaml).unwrap();
        let names: Vec<&str> = text.lines().filter(|l| l.contains("name: ")).collect();
        assert_eq!(
            names,
            [
                "- name: '0'",
                "- name: '1:0'",
                "- name: '12:3'",
                "- name: mig1:0",
                "- name: GPU-1:2"
            ]
        );
        let back: Spec = serde_yaml_ng::from_str(&text).unwrap();
        assert_eq!(back, spec);
    }

    #[test]
    fn json_is_indented_and_round_trips() {
        let text = render(&spec(), Format::Json).unwrap();
        assert!(
            text.starts_with("{\n  \"cdiVersion\": \"0.5.0\",\n  \"kind\": \"nvidia.com/gpu\"")
        );
        assert!(text.ends_with("}\n"));
        let back: Spec = serde_json::from_str(&text).unwrap();
        assert_eq!(back, spec());
    }
}
