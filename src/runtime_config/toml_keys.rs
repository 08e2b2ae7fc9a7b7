//! Setting, copying and removing keys of a TOML file by key path, through `toml_edit`, so that
//! every comment, blank line, key order and quoting style gpud does not touch stays byte for
//! byte: containerd's config and CRI-O's drop-in are edited here.
//!
//! A value already equal to the wanted one is left alone (with its comment), which is what
//! makes a second run change nothing. Tables gpud has to create are implicit: their header
//! appears only when they hold a key.

use std::path::Path;

use toml_edit::{Array, DocumentMut, InlineTable, Item, Table, Value};

use super::record::Change;
use super::{Edited, Error, Plan, Wanted, line_column};

/// Parses `text`, the contents of `path`; an error names the file, line and column.
pub fn parse(path: &Path, text: &str) -> Result<DocumentMut, Error> {
    text.parse::<DocumentMut>().map_err(|err| {
        let offset = err.span().map_or(0, |span| span.start);
        let (line, column) = line_column(text, offset);
        Error::Toml {
            path: path.to_path_buf(),
            line,
            column,
            message: err.message().trim().to_owned(),
        }
    })
}

/// `plan`'s settings applied to `text` (the contents of `path`), with what changed.
pub fn configure(path: &Path, text: &str, plan: &Plan) -> Result<(String, Vec<Change>), Error> {
    let mut doc = parse(path, text)?;
    let changes = apply(path, &mut doc, plan)?;
    Ok((doc.to_string(), changes))
}

/// Sets every key of `plan` in `doc`; the keys whose value changed.
pub fn apply(path: &Path, doc: &mut DocumentMut, plan: &Plan) -> Result<Vec<Change>, Error> {
    let mut changes = Vec::new();
    for (key, wanted) in &plan.settings {
        let before = value_text(doc.as_item(), key);
        let parents_before = parents_before(doc.as_item(), key);
        set(path, doc.as_item_mut(), key, wanted)?;
        let Some(after) = value_text(doc.as_item(), key) else {
            continue;
        };
        if before.as_deref().is_none_or(|b| !same_text(b, &after)) {
            changes.push(Change {
                key: key.clone(),
                before,
                set: after,
                parents_before,
            });
        }
    }
    Ok(changes)
}

/// The value at `key` as TOML text without its decoration (a table as an inline table).
pub fn value_text(root: &Item, key: &[String]) -> Option<String> {
    let mut value = get(root, key)?.clone().into_value().ok()?;
    value.decor_mut().clear();
    Some(value.to_string())
}

/// How many of `key`'s parent tables exist under `root`.
pub fn parents_before(root: &Item, key: &[String]) -> usize {
    (1..key.len())
        .take_while(|&depth| get(root, &key[..depth]).is_some_and(Item::is_table_like))
        .count()
}

/// Whether two values' TOML texts mean the same (whitespace and quoting aside).
pub fn same_text(a: &str, b: &str) -> bool {
    match (a.parse::<Value>(), b.parse::<Value>()) {
        (Ok(a), Ok(b)) => meaning(&Item::Value(a)) == meaning(&Item::Value(b)),
        _ => a == b,
    }
}

/// What an item means, as JSON: formatting, comments and table styles aside.
pub fn meaning(item: &Item) -> serde_json::Value {
    use serde_json::Value as J;
    fn of_value(value: &Value) -> J {
        match value {
            Value::String(s) => J::String(s.value().clone()),
            Value::Integer(i) => J::from(*i.value()),
            Value::Float(f) => J::from(*f.value()),
            Value::Boolean(b) => J::Bool(*b.value()),
            Value::Datetime(d) => J::String(d.value().to_string()),
            Value::Array(array) => J::Array(array.iter().map(of_value).collect()),
            Value::InlineTable(table) => J::Object(
                table
                    .iter()
                    .map(|(k, v)| (k.to_owned(), of_value(v)))
                    .collect(),
            ),
        }
    }
    match item {
        Item::None => J::Null,
        Item::Value(value) => of_value(value),
        Item::Table(table) => J::Object(
            table
                .iter()
                .map(|(k, v)| (k.to_owned(), meaning(v)))
                .collect(),
        ),
        Item::ArrayOfTables(array) => J::Array(
            array
                .iter()
                .map(|t| meaning(&Item::Table(t.clone())))
                .collect(),
        ),
    }
}

/// Gives back one recorded key: its `before` value (keeping the key's comment), or removes it
/// with the parent tables gpud created for it when they are left empty.
pub fn restore(path: &Path, doc: &mut DocumentMut, change: &Change) -> Result<(), Error> {
    let key = &change.key;
    let Some((last, parents)) = key.split_last() else {
        return Ok(());
    };
    match &change.before {
        Some(text) => {
            let old = text.parse::<Value>().map_err(|err| Error::Record {
                path: path.to_path_buf(),
                message: format!(
                    "{}: the value before gpud, {text}, is not TOML: {err}",
                    key.join(".")
                ),
            })?;
            let parent = descend(path, doc.as_item_mut(), parents)?;
            let table = as_table(path, parent, parents)?;
            match table.get_mut(last) {
                Some(Item::Value(value)) => {
                    let decor = value.decor().clone();
                    *value = old;
                    *value.decor_mut() = decor;
                }
                Some(other) => *other = Item::Value(old),
                None => {
                    table.insert(last, Item::Value(old));
                }
            }
        }
        None => {
            if let Some(table) =
                get_mut(doc.as_item_mut(), parents).and_then(Item::as_table_like_mut)
            {
                table.remove(last);
            }
            for depth in (change.parents_before + 1..key.len()).rev() {
                let empty =
                    get(doc.as_item(), &key[..depth]).is_some_and(|t| holds_nothing(t, &[]));
                if !empty {
                    break;
                }
                if let Some(table) =
                    get_mut(doc.as_item_mut(), &key[..depth - 1]).and_then(Item::as_table_like_mut)
                {
                    table.remove(&key[depth - 1]);
                }
            }
        }
    }
    Ok(())
}

/// Takes back the recorded `changes` in `text` (the contents of `path`): each key that still
/// holds what gpud set gets its value before gpud; a key that holds something else now was
/// changed since and is left alone (returned). The backup's bytes come back when the file is
/// the backup plus gpud's values; a file gpud `created` is removed when nothing else is left
/// in it (the top-level keys `ignored` aside).
pub fn revert_recorded(
    path: &Path,
    text: &str,
    changes: &[Change],
    backup: Option<&str>,
    created: bool,
    ignored: &[&str],
) -> Result<(Edited, Vec<Change>), Error> {
    let current = parse(path, text)?;
    let mut doc = current.clone();
    let mut skipped = Vec::new();
    let mut restored = Vec::new();
    for change in changes.iter().rev() {
        let now = value_text(doc.as_item(), &change.key);
        if now.as_deref().is_some_and(|n| same_text(n, &change.set)) {
            restore(path, &mut doc, change)?;
            restored.push(change);
        } else {
            skipped.push(change.clone());
        }
    }
    if let Some(old) = backup
        && let Ok(mut probe) = old.parse::<DocumentMut>()
    {
        let before_matches =
            restored
                .iter()
                .all(|c| match (value_text(probe.as_item(), &c.key), &c.before) {
                    (None, None) => true,
                    (Some(a), Some(b)) => same_text(&a, b),
                    _ => false,
                });
        for change in restored.iter().rev() {
            copy(path, current.as_item(), probe.as_item_mut(), &change.key)?;
        }
        if before_matches && probe.to_string() == text {
            return Ok((Edited::Text(old.to_owned()), skipped));
        }
    }
    if created && holds_nothing(doc.as_item(), ignored) {
        return Ok((Edited::Remove, skipped));
    }
    Ok((Edited::Text(doc.to_string()), skipped))
}

/// See [`super::revert`]; `owned` are the key paths gpud owns in this file.
pub fn revert(
    path: &Path,
    text: &str,
    backup: Option<&str>,
    owned: &[Vec<String>],
) -> Result<Edited, Error> {
    let current = parse(path, text)?;
    let base = match backup {
        Some(old) => parse(&super::write::backup_path(path), old)?,
        None => DocumentMut::new(),
    };
    revert_docs(current, &base, backup, text, owned, path)
}

/// [`revert`] on parsed documents: containerd's revert parses first to learn the version.
pub fn revert_docs(
    mut current: DocumentMut,
    base: &DocumentMut,
    backup: Option<&str>,
    text: &str,
    owned: &[Vec<String>],
    path: &Path,
) -> Result<Edited, Error> {
    if let Some(old) = backup {
        // Unchanged since, but for gpud's keys: the backup is the file as it was.
        let mut probe = base.clone();
        for key in owned {
            copy(path, current.as_item(), probe.as_item_mut(), key)?;
        }
        if probe.to_string() == text {
            return Ok(Edited::Text(old.to_owned()));
        }
    }
    for key in owned {
        copy(path, base.as_item(), current.as_item_mut(), key)?;
    }
    if backup.is_none() && holds_nothing(current.as_item(), &["version"]) {
        return Ok(Edited::Remove);
    }
    Ok(Edited::Text(current.to_string()))
}

/// The item at `key` under `root`, if any.
pub fn get<'a>(root: &'a Item, key: &[String]) -> Option<&'a Item> {
    key.iter()
        .try_fold(root, |item, part| item.as_table_like()?.get(part))
}

/// Sets `key` to `wanted`, creating the tables on the way; a value already equal is kept
/// with its comment, a different one is replaced keeping its comment.
fn set(path: &Path, root: &mut Item, key: &[String], wanted: &Wanted) -> Result<(), Error> {
    let Some((last, parents)) = key.split_last() else {
        return Ok(());
    };
    let parent = descend(path, root, parents)?;
    let table = as_table(path, parent, parents)?;
    match table.get_mut(last) {
        Some(Item::Value(value)) if same(value, wanted) => {}
        Some(Item::Value(value)) => {
            let decor = value.decor().clone();
            *value = to_value(wanted);
            *value.decor_mut() = decor;
        }
        Some(other) => *other = Item::Value(to_value(wanted)),
        None => {
            let indent = sibling_indent(table);
            table.insert(last, Item::Value(to_value(wanted)));
            if let (Some(indent), Some(mut new)) = (indent, table.key_mut(last)) {
                new.leaf_decor_mut().set_prefix(indent);
            }
        }
    }
    Ok(())
}

/// The indentation of the table's last plain key, for a new key to line up with the others.
fn sibling_indent(table: &dyn toml_edit::TableLike) -> Option<String> {
    let (name, _) = table.iter().filter(|(_, item)| item.is_value()).last()?;
    let (key, _) = table.get_key_value(name)?;
    // A comment above the key is part of its prefix: the indentation is what follows it.
    let prefix = key.leaf_decor().prefix()?.as_str()?;
    let indent = prefix.rsplit('\n').next().unwrap_or(prefix);
    indent
        .chars()
        .all(|c| c == ' ' || c == '\t')
        .then(|| indent.to_owned())
}

/// Gives `key` in `to` the item it has in `from`, or removes it (and the tables that held only
/// it, unless `from` has them) when `from` has none.
fn copy(path: &Path, from: &Item, to: &mut Item, key: &[String]) -> Result<(), Error> {
    let Some((last, parents)) = key.split_last() else {
        return Ok(());
    };
    match get(from, key) {
        Some(item) => {
            // The key keeps its own formatting where it exists, else takes the source's.
            let source_prefix = get(from, parents)
                .and_then(Item::as_table_like)
                .and_then(|t| t.get_key_value(last))
                .and_then(|(k, _)| k.leaf_decor().prefix())
                .and_then(|p| p.as_str())
                .map(str::to_owned);
            let parent = descend(path, to, parents)?;
            let table = as_table(path, parent, parents)?;
            match table.get_mut(last) {
                Some(slot) => *slot = item.clone(),
                None => {
                    table.insert(last, item.clone());
                    if let (Some(prefix), Some(mut new)) = (source_prefix, table.key_mut(last)) {
                        new.leaf_decor_mut().set_prefix(prefix);
                    }
                }
            }
        }
        None => {
            for depth in (0..key.len()).rev() {
                let (parents, name) = (&key[..depth], &key[depth]);
                let prefix = &key[..=depth];
                let empty = get(to, prefix).is_some_and(|item| holds_nothing(item, &[]));
                let last = depth + 1 == key.len();
                if !(last || (empty && get(from, prefix).is_none())) {
                    break;
                }
                let Some(table) = get_mut(to, parents).and_then(Item::as_table_like_mut) else {
                    break;
                };
                table.remove(name);
            }
        }
    }
    Ok(())
}

fn get_mut<'a>(root: &'a mut Item, key: &[String]) -> Option<&'a mut Item> {
    key.iter()
        .try_fold(root, |item, part| item.as_table_like_mut()?.get_mut(part))
}

/// The item at `key`, with missing tables created (inline inside inline tables, implicit
/// elsewhere); a non-table on the way is an error naming it.
fn descend<'a>(path: &Path, root: &'a mut Item, key: &[String]) -> Result<&'a mut Item, Error> {
    let mut item = root;
    for (depth, part) in key.iter().enumerate() {
        let inline = item.is_inline_table();
        let table = as_table(path, item, &key[..depth])?;
        if table.get(part).is_none() {
            let new = if inline {
                Item::Value(Value::InlineTable(InlineTable::new()))
            } else {
                let mut table = Table::new();
                table.set_implicit(true);
                Item::Table(table)
            };
            table.insert(part, new);
        }
        item = table
            .get_mut(part)
            .ok_or_else(|| shape(path, &key[..=depth], "missing"))?;
    }
    Ok(item)
}

fn as_table<'a>(
    path: &Path,
    item: &'a mut Item,
    key: &[String],
) -> Result<&'a mut dyn toml_edit::TableLike, Error> {
    let found = item.type_name();
    item.as_table_like_mut()
        .ok_or_else(|| shape(path, key, &format!("a {found}")))
}

fn shape(path: &Path, key: &[String], found: &str) -> Error {
    Error::Shape {
        path: path.to_path_buf(),
        key: key.join("."),
        found: found.to_owned(),
    }
}

/// Whether `item` is a table without any value in it (tables of tables count as empty), not
/// counting the top-level keys `ignored`.
pub fn holds_nothing(item: &Item, ignored: &[&str]) -> bool {
    match item.as_table_like() {
        Some(table) => table
            .iter()
            .all(|(name, child)| ignored.contains(&name) || holds_nothing(child, &[])),
        None => item.is_none(),
    }
}

fn same(value: &Value, wanted: &Wanted) -> bool {
    match wanted {
        Wanted::Bool(b) => value.as_bool() == Some(*b),
        Wanted::Str(s) => value.as_str() == Some(s.as_str()),
        Wanted::Strings(list) => value.as_array().is_some_and(|array| {
            array.len() == list.len()
                && array
                    .iter()
                    .zip(list)
                    .all(|(v, s)| v.as_str() == Some(s.as_str()))
        }),
    }
}

fn to_value(wanted: &Wanted) -> Value {
    match wanted {
        Wanted::Bool(b) => Value::from(*b),
        Wanted::Str(s) => Value::from(s.as_str()),
        Wanted::Strings(list) => Value::Array(list.iter().map(String::as_str).collect::<Array>()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime_config::key;

    fn plan(settings: &[(&[&str], Wanted)]) -> Plan {
        Plan {
            settings: settings.iter().map(|(k, w)| (key(k), w.clone())).collect(),
            owned: settings.iter().map(|(k, _)| key(k)).collect(),
        }
    }

    #[test]
    fn a_bad_file_is_named_with_line_and_column() {
        let err = parse(Path::new("/etc/x.toml"), "a = 1\nb = = 2\n").unwrap_err();
        let text = err.to_string();
        assert!(text.starts_with("/etc/x.toml:2:"), "{text}");
        assert!(err.is_data());
    }

    #[test]
    fn an_equal_value_keeps_its_comment_and_a_different_one_keeps_it_too() {
        let text = "[a]\nx = true # kept\ny = false # also kept\n";
        let plan = plan(&[
            (&["a", "x"], Wanted::Bool(true)),
            (&["a", "y"], Wanted::Bool(true)),
        ]);
        let (out, changes) = configure(Path::new("f"), text, &plan).unwrap();
        assert_eq!(out, "[a]\nx = true # kept\ny = true # also kept\n");
        assert_eq!(changes.len(), 1, "only y changed: {changes:?}");
        assert_eq!(changes[0].before.as_deref(), Some("false"));
    }

    #[test]
    fn a_value_where_a_table_is_needed_is_an_error_naming_the_key() {
        let plan = plan(&[(&["a", "b", "c"], Wanted::Bool(true))]);
        let err = configure(Path::new("f"), "[a]\nb = 1\n", &plan).unwrap_err();
        assert_eq!(
            err.to_string(),
            "f: a.b is a integer, where gpud needs a table; fix the file and run again"
        );
    }

    #[test]
    fn inline_tables_get_inline_children() {
        let plan = plan(&[(&["a", "b", "c"], Wanted::Str("d".into()))]);
        let (out, _) = configure(Path::new("f"), "a = { x = 1 }\n", &plan).unwrap();
        assert_eq!(out, "a = { x = 1 , b = { c = \"d\" } }\n");
    }

    #[test]
    fn revert_without_backup_removes_what_gpud_created() {
        let plan = plan(&[(&["a", "b", "c"], Wanted::Strings(vec!["x".into()]))]);
        let (text, _) = configure(Path::new("f"), "", &plan).unwrap();
        assert_eq!(text, "[a.b]\nc = [\"x\"]\n");
        let reverted = revert(Path::new("f"), &text, None, &plan.owned).unwrap();
        assert_eq!(reverted, Edited::Remove);
    }
}
