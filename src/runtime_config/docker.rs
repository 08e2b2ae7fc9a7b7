//! Docker's `daemon.json`: `features.cdi`, `cdi-spec-dirs`, `runtimes.<name>` and
//! `default-runtime`, edited so that the file keeps its key order and every value gpud does not
//! change byte for byte.
//!
//! serde_json's maps are sorted unless its `preserve_order` feature is on, which would change
//! every map in gpud; instead an object is read here as an ordered list of keys with their
//! values' raw text ([`Object`]), and only the objects on the path to a changed key are written
//! anew, in the file's own indentation.

use std::fmt;
use std::path::Path;

use serde::de::{Deserialize, Deserializer, MapAccess, Visitor};
use serde_json::value::RawValue;

use super::record::Change;
use super::{Edited, Error, Plan, Request, Wanted, key};

/// nvidia-ctk's default `--config` for Docker.
pub const DEFAULT_CONFIG: &str = "/etc/docker/daemon.json";

/// What `request` sets in daemon.json, and the keys gpud owns there.
pub fn plan(request: &Request) -> Plan {
    let mut plan = Plan::default();
    let cdi = key(&["features", "cdi"]);
    let dirs = key(&["cdi-spec-dirs"]);
    if request.enable_cdi {
        plan.settings.push((cdi.clone(), Wanted::Bool(true)));
    }
    if !request.cdi_spec_dirs.is_empty() {
        plan.settings
            .push((dirs.clone(), Wanted::Strings(request.cdi_spec_dirs.clone())));
    }
    plan.owned.extend([cdi, dirs]);
    plan.add_runtime(request, &["runtimes"], &["default-runtime"], |path| {
        vec![
            (&["path"], Wanted::Str(path.to_owned())),
            (&["args"], Wanted::Strings(Vec::new())),
        ]
    });
    plan
}

/// `plan`'s settings applied to `text`, the contents of `path` ("" for a missing file), with
/// what changed.
pub fn configure(path: &Path, text: &str, plan: &Plan) -> Result<(String, Vec<Change>), Error> {
    let mut top = parse(path, text)?;
    let style = Style::of(text);
    let mut changes = Vec::new();
    for (key, wanted) in &plan.settings {
        let before = value_text(&top, key);
        let parents_before = parents_before(&top, key);
        if set(path, &mut top, key, wanted, &style, 1)?
            && let Some(after) = value_text(&top, key)
        {
            changes.push(Change {
                key: key.clone(),
                before,
                set: after,
                parents_before,
            });
        }
    }
    let text = if changes.is_empty() {
        text.to_owned()
    } else {
        style.render(&top, 0) + "\n"
    };
    Ok((text, changes))
}

/// The JSON text of the value at `key`.
fn value_text(object: &Object, key: &[String]) -> Option<String> {
    let (first, rest) = key.split_first()?;
    let raw = object.get(first)?;
    if rest.is_empty() {
        return Some(raw.text().to_owned());
    }
    value_text(&object_in(raw)?, rest)
}

/// How many of `key`'s parent objects exist in `object`.
fn parents_before(object: &Object, key: &[String]) -> usize {
    match key.split_first() {
        Some((first, rest)) if !rest.is_empty() => object
            .get(first)
            .and_then(object_in)
            .map_or(0, |child| 1 + parents_before(&child, rest)),
        _ => 0,
    }
}

/// Whether two JSON texts mean the same.
fn same_text(a: &str, b: &str) -> bool {
    match (
        serde_json::from_str::<serde_json::Value>(a),
        serde_json::from_str::<serde_json::Value>(b),
    ) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    }
}

/// Gives back `change` under `object`, `key` being its key from `level` on; whether anything
/// changed. Objects gpud created for the key go when they are left empty.
fn restore(
    object: &mut Object,
    key: &[String],
    change: &Change,
    level: usize,
    style: &Style,
) -> bool {
    let Some((first, rest)) = key.split_first() else {
        return false;
    };
    if rest.is_empty() {
        return match &change.before {
            Some(text) => {
                object.put(first, Raw::New(text.clone()));
                true
            }
            None => object.remove(first),
        };
    }
    let Some(mut child) = object.get(first).and_then(object_in) else {
        return false;
    };
    if !restore(&mut child, rest, change, level + 1, style) {
        return false;
    }
    if child.0.is_empty() && level + 1 > change.parents_before {
        object.remove(first);
    } else {
        object.put(first, Raw::New(style.render(&child, level + 1)));
    }
    true
}

/// See [`super::toml_keys::revert_recorded`]: the same for daemon.json.
pub fn revert_recorded(
    path: &Path,
    text: &str,
    changes: &[Change],
    backup: Option<&str>,
    created: bool,
) -> Result<(Edited, Vec<Change>), Error> {
    let current = parse(path, text)?;
    let mut top = current.clone();
    let style = Style::of(text);
    let mut skipped = Vec::new();
    let mut restored = Vec::new();
    let mut changed = false;
    for change in changes.iter().rev() {
        if value_text(&top, &change.key).is_some_and(|now| same_text(&now, &change.set)) {
            changed |= restore(&mut top, &change.key, change, 0, &style);
            restored.push(change);
        } else {
            skipped.push(change.clone());
        }
    }
    if let Some(old) = backup
        && let Ok(mut probe) = parse(path, old)
    {
        let before_matches =
            restored
                .iter()
                .all(|c| match (value_text(&probe, &c.key), &c.before) {
                    (None, None) => true,
                    (Some(a), Some(b)) => same_text(&a, b),
                    _ => false,
                });
        let old_style = Style::of(old);
        let mut probe_changed = false;
        for change in restored.iter().rev() {
            probe_changed |= copy(path, Some(&current), &mut probe, &change.key, &old_style, 1)?;
        }
        let probe_text = if probe_changed {
            old_style.render(&probe, 0) + "\n"
        } else {
            old.to_owned()
        };
        if before_matches && probe_text == text {
            return Ok((Edited::Text(old.to_owned()), skipped));
        }
    }
    if created && top.0.is_empty() {
        return Ok((Edited::Remove, skipped));
    }
    let text = if changed {
        style.render(&top, 0) + "\n"
    } else {
        text.to_owned()
    };
    Ok((Edited::Text(text), skipped))
}

/// See [`super::revert`]; `owned` are the key paths gpud owns.
pub fn revert(
    path: &Path,
    text: &str,
    backup: Option<&str>,
    owned: &[Vec<String>],
) -> Result<Edited, Error> {
    let mut current = parse(path, text)?;
    let base = match backup {
        Some(old) => parse(&super::write::backup_path(path), old)?,
        None => Object::default(),
    };
    if let Some(old) = backup {
        let mut probe = base.clone();
        let style = Style::of(old);
        let mut changed = false;
        for key in owned {
            changed |= copy(path, Some(&current), &mut probe, key, &style, 1)?;
        }
        let probe_text = if changed {
            style.render(&probe, 0) + "\n"
        } else {
            old.to_owned()
        };
        if probe_text == text {
            return Ok(Edited::Text(old.to_owned()));
        }
    }
    let style = Style::of(text);
    let mut changed = false;
    for key in owned {
        changed |= copy(path, Some(&base), &mut current, key, &style, 1)?;
    }
    if backup.is_none() && current.0.is_empty() {
        return Ok(Edited::Remove);
    }
    Ok(Edited::Text(if changed {
        style.render(&current, 0) + "\n"
    } else {
        text.to_owned()
    }))
}

/// A value's JSON text: as read, or written by gpud.
#[derive(Debug, Clone)]
enum Raw {
    Read(Box<RawValue>),
    New(String),
}

impl Raw {
    fn text(&self) -> &str {
        match self {
            Raw::Read(raw) => raw.get(),
            Raw::New(text) => text,
        }
    }
}

/// A JSON object as an ordered list of keys and their values' text.
#[derive(Debug, Clone, Default)]
struct Object(Vec<(String, Raw)>);

impl Object {
    fn get(&self, name: &str) -> Option<&Raw> {
        self.0.iter().find(|(k, _)| k == name).map(|(_, v)| v)
    }

    /// Replaces the value in place, or appends the key.
    fn put(&mut self, name: &str, value: Raw) {
        match self.0.iter_mut().find(|(k, _)| k == name) {
            Some((_, old)) => *old = value,
            None => self.0.push((name.to_owned(), value)),
        }
    }

    /// The same keys, in the same order, with the same text.
    fn same(&self, other: &Object) -> bool {
        self.0.len() == other.0.len()
            && self
                .0
                .iter()
                .zip(&other.0)
                .all(|((a, x), (b, y))| a == b && x.text() == y.text())
    }

    fn remove(&mut self, name: &str) -> bool {
        let before = self.0.len();
        self.0.retain(|(k, _)| k != name);
        self.0.len() != before
    }
}

impl<'de> Deserialize<'de> for Object {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Ordered;
        impl<'de> Visitor<'de> for Ordered {
            type Value = Object;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<M: MapAccess<'de>>(self, mut map: M) -> Result<Object, M::Error> {
                let mut entries = Vec::new();
                while let Some((name, value)) = map.next_entry::<String, Box<RawValue>>()? {
                    entries.push((name, Raw::Read(value)));
                }
                Ok(Object(entries))
            }
        }
        deserializer.deserialize_map(Ordered)
    }
}

/// The top-level object of `text`; an empty file is an empty object.
fn parse(path: &Path, text: &str) -> Result<Object, Error> {
    if text.trim().is_empty() {
        return Ok(Object::default());
    }
    serde_json::from_str(text).map_err(|err| Error::Json {
        path: path.to_path_buf(),
        line: err.line(),
        column: err.column(),
        message: err.to_string(),
    })
}

/// The object a value holds, if it is one.
fn object_in(value: &Raw) -> Option<Object> {
    serde_json::from_str(value.text()).ok()
}

fn shape(path: &Path, key: &[String]) -> Error {
    Error::Shape {
        path: path.to_path_buf(),
        key: key.join("."),
        found: "not an object".to_owned(),
    }
}

/// Sets `key` under `object` (at `depth`); whether anything changed.
fn set(
    path: &Path,
    object: &mut Object,
    key: &[String],
    wanted: &Wanted,
    style: &Style,
    depth: usize,
) -> Result<bool, Error> {
    let Some((first, rest)) = key.split_first() else {
        return Ok(false);
    };
    if rest.is_empty() {
        let value = to_json(wanted);
        let equal = object
            .get(first)
            .and_then(|raw| serde_json::from_str::<serde_json::Value>(raw.text()).ok())
            .is_some_and(|old| old == value);
        if !equal {
            object.put(first, Raw::New(value.to_string()));
        }
        return Ok(!equal);
    }
    let mut child = match object.get(first) {
        Some(raw) => object_in(raw).ok_or_else(|| shape(path, &key[..1]))?,
        None => Object::default(),
    };
    if !set(path, &mut child, rest, wanted, style, depth + 1)? {
        return Ok(false);
    }
    object.put(first, Raw::New(style.render(&child, depth)));
    Ok(true)
}

/// Gives `key` in `to` the value it has in `from`, or removes it (with the objects that held
/// only it, unless `from` has them); whether anything changed.
fn copy(
    path: &Path,
    from: Option<&Object>,
    to: &mut Object,
    key: &[String],
    style: &Style,
    depth: usize,
) -> Result<bool, Error> {
    let Some((first, rest)) = key.split_first() else {
        return Ok(false);
    };
    let source = from.and_then(|f| f.get(first));
    if rest.is_empty() {
        return Ok(match source {
            Some(value) if to.get(first).map(Raw::text) == Some(value.text()) => false,
            Some(value) => {
                to.put(first, value.clone());
                true
            }
            None => to.remove(first),
        });
    }
    let from_child = source.and_then(object_in);
    let mut child = match to.get(first) {
        Some(raw) => object_in(raw).ok_or_else(|| shape(path, &key[..1]))?,
        None if from_child.is_none() => return Ok(false),
        None => Object::default(),
    };
    if !copy(
        path,
        from_child.as_ref(),
        &mut child,
        rest,
        style,
        depth + 1,
    )? {
        return Ok(false);
    }
    if child.0.is_empty() && source.is_none() {
        to.remove(first);
    } else if let Some(same) =
        source.filter(|_| from_child.as_ref().is_some_and(|f| f.same(&child)))
    {
        // Back to what `from` holds: its own text, not a re-rendering.
        to.put(first, same.clone());
    } else {
        to.put(first, Raw::New(style.render(&child, depth)));
    }
    Ok(true)
}

fn to_json(wanted: &Wanted) -> serde_json::Value {
    match wanted {
        Wanted::Bool(b) => serde_json::Value::Bool(*b),
        Wanted::Str(s) => serde_json::Value::String(s.clone()),
        Wanted::Strings(list) => list
            .iter()
            .cloned()
            .map(serde_json::Value::String)
            .collect(),
    }
}

/// How the file indents: the whitespace before its first key (four spaces for a new file).
#[derive(Debug)]
struct Style {
    unit: String,
}

impl Style {
    fn of(text: &str) -> Style {
        let unit = text
            .lines()
            .skip(1)
            .find_map(|line| {
                let indent = line.len() - line.trim_start().len();
                (indent > 0 && line.trim_start().starts_with('"'))
                    .then(|| line[..indent].to_owned())
            })
            .unwrap_or_else(|| "    ".to_owned());
        Style { unit }
    }

    /// `object` written as the value of a key at `depth` (0: the whole file).
    fn render(&self, object: &Object, depth: usize) -> String {
        if object.0.is_empty() {
            return "{}".to_owned();
        }
        let inner = self.unit.repeat(depth + 1);
        let entries: Vec<String> = object
            .0
            .iter()
            .map(|(name, value)| {
                let name = serde_json::Value::String(name.clone());
                format!("{inner}{name}: {}", value.text())
            })
            .collect();
        format!("{{\n{}\n{}}}", entries.join(",\n"), self.unit.repeat(depth))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime_config::NvidiaRuntime;

    const ORIGINAL: &str = r#"{
  "log-driver": "json-file",
  "log-opts": {"max-size": "10m",   "max-file": "3"},
  "features": {
    "buildkit": true
  },
  "storage-driver": "overlay2",
  "insecure-registries" : [ "b.example:5000", "a.example:5000" ]
}
"#;

    fn request() -> Request {
        Request {
            enable_cdi: true,
            cdi_spec_dirs: vec!["/etc/cdi".into()],
            runtime: Some(NvidiaRuntime {
                name: "nvidia".into(),
                path: "nvidia-container-runtime".into(),
            }),
            set_as_default: true,
        }
    }

    #[test]
    fn order_and_other_values_are_kept_byte_for_byte() {
        let path = Path::new(DEFAULT_CONFIG);
        let (out, _) = configure(path, ORIGINAL, &plan(&request())).unwrap();
        assert_eq!(
            out,
            r#"{
  "log-driver": "json-file",
  "log-opts": {"max-size": "10m",   "max-file": "3"},
  "features": {
    "buildkit": true,
    "cdi": true
  },
  "storage-driver": "overlay2",
  "insecure-registries": [ "b.example:5000", "a.example:5000" ],
  "cdi-spec-dirs": ["/etc/cdi"],
  "runtimes": {
    "nvidia": {
      "path": "nvidia-container-runtime",
      "args": []
    }
  },
  "default-runtime": "nvidia"
}
"#
        );
        assert_eq!(
            configure(path, &out, &plan(&request())).unwrap(),
            (out.clone(), vec![])
        );
        let owned = plan(&request()).owned;
        assert_eq!(
            revert(path, &out, Some(ORIGINAL), &owned).unwrap(),
            Edited::Text(ORIGINAL.to_owned())
        );
    }

    #[test]
    fn a_new_file_is_created_and_reverted_away() {
        let path = Path::new("daemon.json");
        let cdi = Request {
            enable_cdi: true,
            ..Request::default()
        };
        let (out, _) = configure(path, "", &plan(&cdi)).unwrap();
        assert_eq!(
            out,
            "{\n    \"features\": {\n        \"cdi\": true\n    }\n}\n"
        );
        let owned = plan(&request()).owned;
        assert_eq!(revert(path, &out, None, &owned).unwrap(), Edited::Remove);
    }

    #[test]
    fn a_revert_after_other_edits_keeps_them() {
        let path = Path::new("daemon.json");
        let original = "{\n  \"features\": {\"cdi\": false}\n}\n";
        let (out, _) = configure(path, original, &plan(&request())).unwrap();
        let edited = out.replacen("{\n", "{\n  \"debug\": true,\n", 1);
        let owned = plan(&request()).owned;
        let Edited::Text(reverted) = revert(path, &edited, Some(original), &owned).unwrap() else {
            panic!("removed");
        };
        assert_eq!(
            reverted,
            "{\n  \"debug\": true,\n  \"features\": {\"cdi\": false}\n}\n"
        );
    }

    #[test]
    fn bad_json_is_named_with_line_and_column() {
        let err =
            configure(Path::new("d.json"), "{\n  \"a\": ,\n}", &plan(&request())).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("d.json:2:8: not a valid JSON object"),
            "{err}"
        );
        let err = configure(Path::new("d.json"), "[1]", &plan(&request())).unwrap_err();
        assert!(err.is_data());
        let err =
            configure(Path::new("d.json"), "{\"features\": 1}", &plan(&request())).unwrap_err();
        assert!(
            err.to_string().contains("features is not an object"),
            "{err}"
        );
    }
}
