//! Architecture rules the compiler does not keep, checked on the source: no import cycles.
//!
//! Two graphs are built from every `use` and every `crate::…`/`super::…` path in `src/`
//! (test modules left out):
//! - top-level modules (`inventory`, `nvml`, `daemon`, …): an edge when a file of one names an
//!   item of another. It must have no cycle — the inventory stays a seam that the NVML side
//!   feeds, the daemon core knows no subsystem, and so on.
//! - the files inside each top-level module, with an item re-exported by a `mod.rs` traced to
//!   the file that defines it, and a `mod.rs` declaring or re-exporting its own children not
//!   counted as a dependency. It must have no cycle either: two files that need each other are
//!   one job split in two, or a missing third file.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// One source file: its module path (`["exporter", "server"]`) and its code without comments,
/// string literals or test modules.
struct Source {
    module: Vec<String>,
    code: String,
}

fn sources() -> Vec<Source> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    collect(&root, &mut files);
    files
        .into_iter()
        .map(|path| {
            let relative = path.strip_prefix(&root).unwrap().with_extension("");
            let mut module: Vec<String> = relative
                .iter()
                .map(|c| c.to_string_lossy().into_owned())
                .collect();
            if matches!(
                module.last().map(String::as_str),
                Some("mod" | "lib" | "main")
            ) {
                module.pop();
            }
            let text = std::fs::read_to_string(&path).unwrap();
            Source {
                module,
                code: without_tests(&strip(&text)),
            }
        })
        .collect()
}

fn collect(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            collect(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs")
            && !path.file_name().unwrap().to_string_lossy().contains("test")
        {
            out.push(path);
        }
    }
}

/// Blanks out comments and string and char literals, keeping line structure.
fn strip(text: &str) -> String {
    let bytes: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i];
        let next = bytes.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < bytes.len() && bytes[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            i += 2;
            while i + 1 < bytes.len() && !(bytes[i] == '*' && bytes[i + 1] == '/') {
                i += 1;
            }
            i += 2;
        } else if c == '"' || (c == 'r' && matches!(next, Some('"' | '#')) && raw_start(&bytes, i))
        {
            i = skip_string(&bytes, i);
            out.push_str("\"\"");
        } else if c == '\'' && is_char_literal(&bytes, i) {
            i += 1;
            while i < bytes.len() && bytes[i] != '\'' {
                if bytes[i] == '\\' {
                    i += 1;
                }
                i += 1;
            }
            i += 1;
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

fn raw_start(bytes: &[char], i: usize) -> bool {
    let before_ok = i == 0 || !(bytes[i - 1].is_alphanumeric() || bytes[i - 1] == '_');
    let mut j = i + 1;
    while bytes.get(j) == Some(&'#') {
        j += 1;
    }
    before_ok && bytes.get(j) == Some(&'"')
}

fn skip_string(bytes: &[char], mut i: usize) -> usize {
    if bytes[i] == 'r' {
        i += 1;
        let mut hashes = 0;
        while bytes[i] == '#' {
            hashes += 1;
            i += 1;
        }
        i += 1;
        while i < bytes.len() {
            if bytes[i] == '"' && (0..hashes).all(|k| bytes.get(i + 1 + k) == Some(&'#')) {
                return i + 1 + hashes;
            }
            i += 1;
        }
        return i;
    }
    i += 1;
    while i < bytes.len() && bytes[i] != '"' {
        if bytes[i] == '\\' {
            i += 1;
        }
        i += 1;
    }
    i + 1
}

/// `'a'` or `'\n'` rather than a lifetime `'a`.
fn is_char_literal(bytes: &[char], i: usize) -> bool {
    matches!(
        (bytes.get(i + 1), bytes.get(i + 2)),
        (Some('\\'), _) | (Some(_), Some('\''))
    )
}

/// Drops `#[cfg(test)]` modules (unit tests name `super::*`, which is not a dependency).
fn without_tests(code: &str) -> String {
    let mut out = String::new();
    let mut skip_depth: Option<i32> = None;
    let mut pending_cfg_test = false;
    let mut depth = 0i32;
    for line in code.lines() {
        let trimmed = line.trim();
        if skip_depth.is_none() {
            if trimmed.starts_with("#[cfg(test)]") {
                pending_cfg_test = true;
                continue;
            }
            if pending_cfg_test && (trimmed.starts_with("mod ") || trimmed.starts_with("pub mod "))
            {
                pending_cfg_test = false;
                if trimmed.ends_with(';') {
                    continue;
                }
                skip_depth = Some(depth);
            } else {
                pending_cfg_test = false;
            }
        }
        for c in line.chars() {
            match c {
                '{' => depth += 1,
                '}' => depth -= 1,
                _ => {}
            }
        }
        match skip_depth {
            Some(start) if depth <= start && line.contains('}') => skip_depth = None,
            Some(_) => {}
            None => {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    out
}

/// Every path the code names through `crate`, `super` or (in `use`) `self`, expanded from use
/// trees, as segments starting with that keyword.
fn named_paths(code: &str) -> Vec<Vec<String>> {
    let mut paths = Vec::new();
    // `use` declarations, with their trees.
    let mut rest = code;
    while let Some(at) = find_word(rest, "use") {
        let after = &rest[at + 3..];
        let Some(end) = after.find(';') else { break };
        expand_tree(&after[..end], &mut Vec::new(), &mut paths);
        rest = &after[end..];
    }
    // Paths in expressions and types.
    let chars: Vec<char> = code.chars().collect();
    let text: String = chars.iter().collect();
    for keyword in ["crate::", "super::"] {
        let mut from = 0;
        while let Some(found) = text[from..].find(keyword) {
            let at = from + found;
            from = at + keyword.len();
            let before = text[..at].chars().last();
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
                continue;
            }
            let mut segments = Vec::new();
            let mut cursor = &text[at..];
            loop {
                let ident: String = cursor
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                if ident.is_empty() {
                    break;
                }
                cursor = &cursor[ident.len()..];
                segments.push(ident);
                match cursor.strip_prefix("::") {
                    Some(next) => cursor = next,
                    None => break,
                }
            }
            paths.push(segments);
        }
    }
    paths
}

fn find_word(text: &str, word: &str) -> Option<usize> {
    let mut from = 0;
    while let Some(found) = text[from..].find(word) {
        let at = from + found;
        let before = text[..at].chars().last();
        let after = text[at + word.len()..].chars().next();
        let boundary = |c: Option<char>| !c.is_some_and(|c| c.is_alphanumeric() || c == '_');
        if boundary(before) && after.is_some_and(char::is_whitespace) {
            return Some(at);
        }
        from = at + word.len();
    }
    None
}

/// Expands `a::{b, c::{d, e}}` under `prefix`.
fn expand_tree(tree: &str, prefix: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
    let tree = tree.trim();
    if let Some(open) = tree.find('{') {
        let head: Vec<String> = segments(&tree[..open]);
        let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
        let depth_before = prefix.len();
        prefix.extend(head);
        for part in split_top(inner) {
            expand_tree(part, prefix, out);
        }
        prefix.truncate(depth_before);
    } else {
        let name = tree.split(" as ").next().unwrap_or(tree);
        let mut path = prefix.clone();
        path.extend(segments(name));
        if path.last().is_some_and(|s| s == "self") {
            path.pop();
        }
        if !path.is_empty() {
            out.push(path);
        }
    }
}

fn segments(text: &str) -> Vec<String> {
    text.split("::")
        .map(str::trim)
        .filter(|s| !s.is_empty() && *s != "*")
        .map(str::to_owned)
        .collect()
}

fn split_top(text: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0, 0);
    for (i, c) in text.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&text[start..]);
    parts
}

/// The file module a path names from `module`, as (module path, first item after it).
fn resolve(
    module: &[String],
    path: &[String],
    modules: &BTreeSet<Vec<String>>,
) -> Option<(Vec<String>, Option<String>)> {
    let mut base: Vec<String> = match path.first().map(String::as_str) {
        Some("crate") => Vec::new(),
        Some("super") | Some("self") => module.to_vec(),
        _ => return None,
    };
    let mut rest = path.iter().peekable();
    while let Some(seg) = rest.peek() {
        match seg.as_str() {
            "crate" => {}
            "self" => {}
            "super" => {
                base.pop()?;
            }
            _ => break,
        }
        rest.next();
    }
    for seg in rest.by_ref() {
        let mut next = base.clone();
        next.push(seg.clone());
        if modules.contains(&next) {
            base = next;
        } else {
            return Some((base, Some(seg.clone())));
        }
    }
    Some((base, None))
}

/// Items a `mod.rs` re-exports from its children: item name → child module.
fn re_exports(source: &Source, modules: &BTreeSet<Vec<String>>) -> BTreeMap<String, Vec<String>> {
    let mut map = BTreeMap::new();
    let mut rest = source.code.as_str();
    while let Some(at) = rest.find("pub use ") {
        let after = &rest[at + 8..];
        let Some(end) = after.find(';') else { break };
        let mut paths = Vec::new();
        expand_tree(&after[..end], &mut Vec::new(), &mut paths);
        for path in paths {
            let mut full = vec!["self".to_owned()];
            full.extend(path.iter().cloned());
            if let Some((target, Some(item))) = resolve(&source.module, &full, modules)
                && target.len() > source.module.len()
            {
                map.insert(item, target);
            }
        }
        rest = &after[end..];
    }
    map
}

/// The groups of nodes that reach each other (strongly connected components of more than one
/// node, or a node that names itself): each group is an import cycle.
fn cycles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    let nodes: Vec<&String> = graph
        .keys()
        .chain(graph.values().flatten())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let reach = |from: &String| -> BTreeSet<String> {
        let mut seen = BTreeSet::new();
        let mut todo = vec![from.clone()];
        while let Some(node) = todo.pop() {
            for next in graph.get(&node).into_iter().flatten() {
                if seen.insert(next.clone()) {
                    todo.push(next.clone());
                }
            }
        }
        seen
    };
    let reaches: BTreeMap<&String, BTreeSet<String>> =
        nodes.iter().map(|n| (*n, reach(n))).collect();
    let mut groups: Vec<Vec<String>> = Vec::new();
    let mut placed = BTreeSet::new();
    for node in &nodes {
        if placed.contains(*node) || !reaches[node].contains(*node) {
            continue;
        }
        let group: Vec<String> = nodes
            .iter()
            .filter(|other| reaches[node].contains(**other) && reaches[*other].contains(*node))
            .map(|other| (*other).clone())
            .collect();
        placed.extend(group.iter().cloned());
        groups.push(group);
    }
    groups
}

fn describe(groups: &[Vec<String>]) -> String {
    groups
        .iter()
        .map(|g| format!("{{{}}}", g.join(", ")))
        .collect::<Vec<_>>()
        .join("; ")
}

fn edges() -> Vec<(Vec<String>, Vec<String>)> {
    let sources = sources();
    let modules: BTreeSet<Vec<String>> = sources.iter().map(|s| s.module.clone()).collect();
    let exports: BTreeMap<Vec<String>, BTreeMap<String, Vec<String>>> = sources
        .iter()
        .map(|s| (s.module.clone(), re_exports(s, &modules)))
        .collect();
    let mut edges = Vec::new();
    for source in &sources {
        for path in named_paths(&source.code) {
            let Some((mut target, item)) = resolve(&source.module, &path, &modules) else {
                continue;
            };
            if let Some(child) = item.and_then(|item| exports.get(&target)?.get(&item).cloned()) {
                target = child;
            }
            let declares_child =
                target.len() > source.module.len() && target.starts_with(&source.module);
            if target != source.module && !declares_child {
                edges.push((source.module.clone(), target));
            }
        }
    }
    edges
}

fn name(module: &[String]) -> String {
    if module.is_empty() {
        "crate".to_owned()
    } else {
        module.join("::")
    }
}

#[test]
fn top_level_modules_have_no_import_cycle() {
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (from, to) in edges() {
        let (Some(a), Some(b)) = (from.first(), to.first()) else {
            continue;
        };
        if a != b {
            graph.entry(a.clone()).or_default().insert(b.clone());
        }
    }
    assert!(
        graph.contains_key("nvml"),
        "the graph was not built: {graph:?}"
    );
    let found = cycles(&graph);
    assert!(
        found.is_empty(),
        "import cycles between modules: {}",
        describe(&found)
    );
}

#[test]
fn files_within_a_module_have_no_import_cycle() {
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (from, to) in edges() {
        if from.first() == to.first() && !from.is_empty() {
            graph.entry(name(&from)).or_default().insert(name(&to));
        }
    }
    let found = cycles(&graph);
    assert!(
        found.is_empty(),
        "import cycles between files: {}",
        describe(&found)
    );
}

#[test]
fn the_checker_sees_a_cycle() {
    let graph = BTreeMap::from([
        ("a".to_owned(), BTreeSet::from(["b".to_owned()])),
        ("b".to_owned(), BTreeSet::from(["a".to_owned()])),
    ]);
    assert_eq!(cycles(&graph), [vec!["a", "b"]]);
    let mut found = Vec::new();
    expand_tree(
        "crate::x::{a::B, c::{self, D as E}}",
        &mut Vec::new(),
        &mut found,
    );
    assert_eq!(
        found,
        [
            vec!["crate", "x", "a", "B"],
            vec!["crate", "x", "c"],
            vec!["crate", "x", "c", "D"]
        ]
    );
}

/// The subsystems: the long-running parts of gpud, side by side. None may import another; what
/// two of them share is a seam below them (`kube`, `xid`, `holdings`, `doctor_report`,
/// `mig_config`, `mig_state`, `resources`, `inventory`, …). A new subsystem is found by its
/// `impl Subsystem for` (see [`detected_subsystems`]) and must be added here.
const SUBSYSTEMS: [&str; 10] = [
    "device_plugin",
    "labeller",
    "exporter",
    "health",
    "dra",
    "node_status",
    "doctor",
    "mig",
    "mps",
    "remediation",
];

/// Top-level modules that implement `daemon::Subsystem` without being subsystems: the daemon
/// core's own support tasks (admin endpoint, rescanner).
const NOT_SUBSYSTEMS: [&str; 1] = ["daemon"];

/// The longest chain of top-level modules the import graph may have, counting the binary's
/// `main` (which names only `multicall`) as the first level.
const MAX_DEPTH: usize = 8;

/// Top-level modules whose code implements the subsystem trait.
fn detected_subsystems() -> BTreeSet<String> {
    sources()
        .into_iter()
        .filter(|s| s.code.contains("impl Subsystem for"))
        .filter_map(|s| s.module.first().cloned())
        .filter(|m| !NOT_SUBSYSTEMS.contains(&m.as_str()))
        .collect()
}

fn top_level_graph() -> BTreeMap<String, BTreeSet<String>> {
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (from, to) in edges() {
        let (Some(a), Some(b)) = (from.first(), to.first()) else {
            continue;
        };
        if a != b {
            graph.entry(a.clone()).or_default().insert(b.clone());
        }
    }
    graph
}

/// The longest path from `node` (the graph has no cycle; the cycle test says so if it does).
fn longest_from(
    node: &str,
    graph: &BTreeMap<String, BTreeSet<String>>,
    memo: &mut BTreeMap<String, Vec<String>>,
) -> Vec<String> {
    if let Some(path) = memo.get(node) {
        return path.clone();
    }
    // Marks the node while it is explored, so a cycle ends the walk instead of recursing.
    memo.insert(node.to_owned(), vec![node.to_owned()]);
    let mut best = Vec::new();
    for next in graph.get(node).into_iter().flatten() {
        let path = longest_from(next, graph, memo);
        if path.len() > best.len() {
            best = path;
        }
    }
    let mut path = vec![node.to_owned()];
    path.extend(best);
    memo.insert(node.to_owned(), path.clone());
    path
}

#[test]
fn subsystems_import_no_other_subsystem() {
    let detected = detected_subsystems();
    let named: BTreeSet<String> = SUBSYSTEMS.iter().map(|s| (*s).to_owned()).collect();
    assert!(
        detected.is_subset(&named),
        "modules implementing Subsystem that are not in SUBSYSTEMS: {:?} (add them, or to \
         NOT_SUBSYSTEMS if they are the daemon core's)",
        detected.difference(&named).collect::<Vec<_>>()
    );
    let mut crossings = BTreeSet::new();
    for (from, to) in edges() {
        let (Some(a), Some(b)) = (from.first(), to.first()) else {
            continue;
        };
        if a != b && named.contains(a) && named.contains(b) {
            crossings.insert(format!("{} -> {}", name(&from), name(&to)));
        }
    }
    assert!(
        crossings.is_empty(),
        "subsystems import each other (move what they share into a seam below both):\n  {}",
        crossings.into_iter().collect::<Vec<_>>().join("\n  ")
    );
}

/// The modules that wire subsystems to seams: the applets, the multicall dispatch above them
/// and the crate root. Only these may name a subsystem from outside it.
const WIRING: [&str; 2] = ["applets", "multicall"];

/// Edges from a module that is neither a subsystem nor wiring (a seam, the daemon core, the
/// NVML adapter) to a subsystem, as `from -> to` lines.
fn seams_naming_subsystems(edges: &[(Vec<String>, Vec<String>)]) -> BTreeSet<String> {
    let subsystem = |m: &str| SUBSYSTEMS.contains(&m);
    edges
        .iter()
        .filter_map(|(from, to)| {
            let b = to.first()?;
            // The crate root (`lib.rs`, `main.rs`) has an empty path: it declares every module.
            let a = from.first()?;
            (!subsystem(a) && !WIRING.contains(&a.as_str()) && subsystem(b))
                .then(|| format!("{} -> {}", name(from), name(to)))
        })
        .collect()
}

#[test]
fn seams_import_no_subsystem() {
    let crossings = seams_naming_subsystems(&edges());
    assert!(
        crossings.is_empty(),
        "a seam (or the daemon core) imports a subsystem: what both need belongs in the seam, \
         and an applet wires the subsystem to it:\n  {}",
        crossings.into_iter().collect::<Vec<_>>().join("\n  ")
    );
}

#[test]
fn the_checker_sees_a_seam_naming_a_subsystem() {
    let module = |path: &str| path.split("::").map(str::to_owned).collect::<Vec<_>>();
    let edges = [
        (module("holdings::layout"), module("dra::checkpoint")),
        (module("applets::run"), module("dra::service")),
        (module("dra::service"), module("holdings")),
    ];
    assert_eq!(
        seams_naming_subsystems(&edges),
        BTreeSet::from(["holdings::layout -> dra::checkpoint".to_owned()])
    );
}

#[test]
fn the_module_graph_is_shallow() {
    let graph = top_level_graph();
    let mut memo = BTreeMap::new();
    // `main.rs` names `gpud::multicall` only: it is the level above multicall.
    let mut deepest = vec!["main".to_owned()];
    deepest.extend(longest_from("multicall", &graph, &mut memo));
    for node in graph.keys() {
        let path = longest_from(node, &graph, &mut memo);
        if path.len() + 1 > deepest.len() {
            deepest = std::iter::once("main".to_owned()).chain(path).collect();
        }
    }
    println!(
        "module graph depth: {} levels ({})",
        deepest.len(),
        deepest.join(" -> ")
    );
    assert!(
        deepest.len() <= MAX_DEPTH,
        "the module graph is {} levels deep (at most {MAX_DEPTH}): {}",
        deepest.len(),
        deepest.join(" -> ")
    );
}

#[test]
fn the_checker_sees_a_crossing_and_measures_depth() {
    let graph = BTreeMap::from([
        (
            "a".to_owned(),
            BTreeSet::from(["b".to_owned(), "c".to_owned()]),
        ),
        ("b".to_owned(), BTreeSet::from(["c".to_owned()])),
    ]);
    assert_eq!(
        longest_from("a", &graph, &mut BTreeMap::new()),
        ["a", "b", "c"]
    );
    assert!(detected_subsystems().contains("device_plugin"));
}

/// Every module under `src/`, as the architecture document names it: `src/dra/prepare.rs`
/// for a file, `src/dra/` for a folder's `mod.rs`.
fn module_paths() -> Vec<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    collect_all(&root, &mut files);
    let mut paths: Vec<String> = files
        .iter()
        .map(|path| {
            let relative = path
                .strip_prefix(&root)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            // A folder's `mod.rs`, not a file whose name ends so (`chmod.rs`).
            match relative.strip_suffix("mod.rs") {
                Some(folder) if folder.is_empty() || folder.ends_with('/') => {
                    format!("src/{folder}")
                }
                _ => format!("src/{relative}"),
            }
        })
        .collect();
    paths.sort();
    paths
}

fn collect_all(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            collect_all(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn the_architecture_document_lists_every_module() {
    let doc_path = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/architecture.md");
    let doc = std::fs::read_to_string(&doc_path).unwrap();
    let missing: Vec<String> = module_paths()
        .into_iter()
        .filter(|path| !doc.contains(&format!("`{path}`")))
        .collect();
    assert!(
        missing.is_empty(),
        "docs/architecture.md does not list these modules (one line each, the path in \
         backquotes):\n  {}",
        missing.join("\n  ")
    );
    let listed_but_gone: Vec<&str> = doc
        .split('`')
        .filter(|s| s.starts_with("src/") && (s.ends_with(".rs") || s.ends_with('/')))
        .filter(|s| !Path::new(env!("CARGO_MANIFEST_DIR")).join(s).exists())
        .collect();
    assert!(
        listed_but_gone.is_empty(),
        "docs/architecture.md lists modules that do not exist: {listed_but_gone:?}"
    );
}

/// What is wrong with a module row's description, if anything: a row cut mid-sentence (an
/// open bracket or backquote, no full stop at the end, a dangling `e.g.`) or rustdoc link
/// syntax copied from a header (`` `Verdict`(super::Verdict) ``).
fn row_defect(description: &str) -> Option<&'static str> {
    let count = |c: char| description.matches(c).count();
    if count('(') != count(')') {
        Some("an unclosed parenthesis")
    } else if count('`') % 2 == 1 {
        Some("an unclosed backquote")
    } else if description.contains("`(") {
        Some("rustdoc link syntax")
    } else if !(description.ends_with('.') || description.ends_with(".)"))
        || description.ends_with("e.g.")
        || description.ends_with(':')
    {
        Some("no full stop at the end")
    } else {
        None
    }
}

#[test]
fn every_module_row_is_a_whole_sentence() {
    let doc_path = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/architecture.md");
    let doc = std::fs::read_to_string(&doc_path).unwrap();
    let defects: Vec<String> = doc
        .lines()
        .filter_map(|line| {
            let rest = line.strip_prefix("| `src/")?;
            let (module, description) = rest.split_once("` | ")?;
            let description = description.trim_end().trim_end_matches('|').trim_end();
            row_defect(description).map(|why| format!("src/{module}: {why}"))
        })
        .collect();
    assert!(
        defects.is_empty(),
        "docs/architecture.md has module rows that are not whole sentences:\n  {}",
        defects.join("\n  ")
    );
}

#[test]
fn the_checker_sees_a_cut_row() {
    assert_eq!(
        row_defect("Reading each GPU's geometry (profiles, placements."),
        Some("an unclosed parenthesis")
    );
    assert_eq!(
        row_defect("Device names, so that claims"),
        Some("no full stop at the end")
    );
    assert_eq!(
        row_defect("Profile names, e.g."),
        Some("no full stop at the end")
    );
    assert_eq!(
        row_defect("a function to a `Verdict`(super::Verdict)."),
        Some("rustdoc link syntax")
    );
    assert_eq!(row_defect("Reading one file (bounded)."), None);
}
