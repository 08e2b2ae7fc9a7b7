//! The documentation and the binary agree: every flag named in README.md, docs/*.md and
//! systemd/gpud.env is in some applet's `--help`; every environment variable in an `env`
//! column of a table, in gpud.env or in gpud's own `GPUD_` namespace is in the help too; and a
//! default a table states is the default the help shows for that flag.
//!
//! Per applet: a variable a document gives for an applet (`DOC_APPLETS`, or the applet a row,
//! sentence or heading names) is in that applet's `--help`; a flag shows one variable and one
//! default in every daemon that takes it; and a table with an `applets` column (docs/cli.md's
//! daemon options) names exactly the daemons that take each option.
//!
//! New documents in docs/ are covered as they are added. Flags of other programs that the
//! documents quote (cargo, nvidia-ctk, …) are listed in `FOREIGN_FLAGS`, each with the program.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use common::{gpud_bin, stdout_ok};

/// Flags the documents quote that belong to other programs, or that gpud refuses on purpose
/// and says so.
const FOREIGN_FLAGS: &[(&str, &str)] = &[
    ("--release", "cargo"),
    ("--workspace", "cargo"),
    ("--all-targets", "cargo clippy"),
    ("--all", "cargo fmt"),
    ("--check", "cargo fmt"),
    ("--bench", "cargo bench"),
    ("--example", "cargo run"),
    ("--test", "cargo test"),
    ("--lib", "cargo test"),
    ("--bin", "cargo build"),
    ("--set-timeslice", "nvidia-smi compute-policy"),
    ("--delete-emptydir-data", "kubectl drain"),
    ("--ignore-daemonsets", "kubectl drain"),
    ("--overwrite", "kubectl label"),
    ("--kill-who", "systemctl kill (before systemd 252)"),
    ("--kill-whom", "systemctl kill"),
    ("--value", "systemctl show"),
    (
        "--device-id",
        "nvidia-ctk cdi generate, refused by gpud cdi generate",
    ),
    (
        "--enable-hook",
        "nvidia-ctk cdi generate, refused by gpud cdi generate",
    ),
    (
        "--feature-flag",
        "nvidia-ctk cdi generate, refused by gpud cdi generate",
    ),
    (
        "--web-config-file",
        "dcgm-exporter, listed as not supported",
    ),
    ("--enable-pprof", "dcgm-exporter, listed as not supported"),
    (
        "--kubernetes-enable-pod-labels",
        "dcgm-exporter, listed as not supported",
    ),
    (
        "--kubernetes-enable-pod-uid",
        "dcgm-exporter, listed as not supported",
    ),
    ("--kubernetes-virtual-gpus", "dcgm-exporter, compared with"),
    (
        "--kubernetes-enable-dra",
        "dcgm-exporter, listed as not supported",
    ),
    ("--fresh-only", "benches/exporter.sh"),
    ("--now", "systemctl enable"),
    ("--rm", "docker run"),
    ("--entrypoint", "docker run"),
    ("--read-only", "docker run"),
    ("--cap-add", "docker run"),
    ("--cap-drop", "docker run"),
    ("--security-opt", "docker run"),
    ("--gpus", "docker run, without CDI"),
    ("--image", "kubectl debug"),
    ("--profile", "kubectl debug"),
];

/// Environment variables the documents name that are not the binary's.
const FOREIGN_ENV: &[(&str, &str)] = &[
    (
        "GPUD_ARGS",
        "systemd/gpud.service passes it to gpud run as arguments",
    ),
    (
        "GPUD_GPU_MEMORY_SHARES",
        "set by the DRA plugin in a shared claim's CDI spec, for the workload",
    ),
    ("GPUD_BLESS", "the test harness: rewrite golden files"),
    (
        "GPUD_TEST_HANDOVER_PAUSE",
        "tests/handover.rs: stops a new gpud at a step of its takeover",
    ),
    ("GPUD_BENCH_BASELINE", "make bench"),
    ("GPUD_BENCH_INTERVALS", "make bench"),
    (
        "GPUD_FLEET_GPUD",
        "make fleet: another gpud binary to measure",
    ),
    (
        "GPUD_FLEET_ARGS",
        "make fleet: more gpud run flags for every node",
    ),
];

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// README.md, every Markdown file in docs/, and systemd/gpud.env, with their text.
fn documents() -> Vec<(PathBuf, String)> {
    let mut paths = vec![repo().join("README.md"), repo().join("systemd/gpud.env")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(repo().join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    paths.extend(docs);
    paths
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(&p).unwrap();
            (p, text)
        })
        .collect()
}

fn help(args: &[&str]) -> String {
    stdout_ok(&Command::new(gpud_bin()).args(args).output().unwrap())
}

/// `--help` of every applet and of every subcommand an applet lists.
fn all_help() -> Vec<String> {
    let mut texts = vec![help(&["--help"])];
    for applet in help(&["--list"]).lines() {
        let text = help(&[applet, "--help"]);
        let subcommands: Vec<String> = text
            .lines()
            .skip_while(|l| *l != "Commands:")
            .skip(1)
            .take_while(|l| !l.is_empty())
            .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
            .filter(|c| c != "help")
            .collect();
        for sub in subcommands {
            texts.push(help(&[applet, &sub, "--help"]));
        }
        texts.push(text);
    }
    texts
}

/// Every `--flag` in `text`: two dashes after a non-word character, then lower-case words.
fn flags_in(text: &str) -> Vec<String> {
    let bytes = text.as_bytes();
    let mut found = Vec::new();
    let mut i = 0;
    while i + 2 < bytes.len() {
        let starts = bytes[i] == b'-'
            && bytes[i + 1] == b'-'
            && bytes[i + 2].is_ascii_lowercase()
            && (i == 0 || !(bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'-'));
        if starts {
            let end = (i + 2..bytes.len())
                .find(|&j| {
                    !(bytes[j].is_ascii_lowercase()
                        || bytes[j].is_ascii_digit()
                        || bytes[j] == b'-')
                })
                .unwrap_or(bytes.len());
            found.push(text[i..end].trim_end_matches('-').to_owned());
            i = end;
        } else {
            i += 1;
        }
    }
    found
}

/// The options of one help text: flag (long name and visible aliases) → its block of text.
fn options(help: &str) -> BTreeMap<String, String> {
    let mut blocks: Vec<(Vec<String>, String)> = Vec::new();
    for line in help.lines() {
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        if (2..=6).contains(&indent) && trimmed.starts_with('-') {
            let names: Vec<String> = flags_in(trimmed.split("  ").next().unwrap_or(trimmed));
            blocks.push((names, String::new()));
        } else if let Some((_, block)) = blocks.last_mut() {
            block.push_str(line);
            block.push('\n');
            if let Some(aliases) = trimmed
                .strip_prefix("[aliases: ")
                .or(trimmed.strip_prefix("[alias: "))
            {
                let names = flags_in(aliases);
                blocks.last_mut().unwrap().0.extend(names);
            }
        }
    }
    let mut map = BTreeMap::new();
    for (names, block) in blocks {
        for name in names {
            map.insert(name, block.clone());
        }
    }
    map
}

/// The `[default: …]` of an option's block, joined over wrapped lines.
fn default_of(block: &str) -> Option<String> {
    let flat = block.split_whitespace().collect::<Vec<_>>().join(" ");
    let start = flat.find("[default: ")? + "[default: ".len();
    let end = start + flat[start..].find(']')?;
    // clap quotes a default that holds spaces: `[default: "nvidia-smi -r -i"]`.
    let value = &flat[start..end];
    let unquoted = value
        .strip_prefix('"')
        .and_then(|v| v.strip_suffix('"'))
        .unwrap_or(value);
    Some(unquoted.to_owned())
}

/// One table row's cells, without the outer pipes (escaped pipes kept).
fn cells(line: &str) -> Vec<String> {
    let inner = line.trim().trim_start_matches('|').trim_end_matches('|');
    let mut cells = vec![String::new()];
    let mut chars = inner.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' if chars.peek() == Some(&'|') => {
                cells.last_mut().unwrap().push('|');
                chars.next();
            }
            '|' => cells.push(String::new()),
            c => cells.last_mut().unwrap().push(c),
        }
    }
    cells.into_iter().map(|c| c.trim().to_owned()).collect()
}

/// Upper-case words that look like environment variables (`A_B`, at least one underscore or
/// a known single word).
fn env_names_in(text: &str) -> Vec<String> {
    text.split(|c: char| !(c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_'))
        .filter(|w| {
            w.len() > 2 && w.contains('_') && w.starts_with(|c: char| c.is_ascii_uppercase())
        })
        .map(str::to_owned)
        .collect()
}

/// What a table says: (document, flag, env names, stated default).
struct Row {
    doc: String,
    flags: Vec<String>,
    envs: Vec<String>,
    default: Option<String>,
}

/// Every body row of every markdown table in `text`: (line index, the table's header cells in
/// lower case, the row's cells).
fn table_body_rows(text: &str) -> Vec<(usize, Vec<String>, Vec<String>)> {
    let mut out = Vec::new();
    let mut header: Option<Vec<String>> = None;
    for (index, line) in text.lines().enumerate() {
        if !line.trim_start().starts_with('|') {
            header = None;
            continue;
        }
        let row = cells(line);
        if row
            .iter()
            .all(|c| c.chars().all(|ch| ch == '-' || ch == ':'))
        {
            continue;
        }
        match &header {
            None => header = Some(row.iter().map(|c| c.to_lowercase()).collect()),
            Some(head) => out.push((index, head.clone(), row)),
        }
    }
    out
}

fn table_rows(doc: &Path, text: &str) -> Vec<Row> {
    let name = doc.strip_prefix(repo()).unwrap().display().to_string();
    let mut rows = Vec::new();
    for (_, head, row) in table_body_rows(text) {
        let column = |names: &[&str]| head.iter().position(|h| names.contains(&h.as_str()));
        let flags = flags_in(row.first().map_or("", String::as_str));
        let envs = column(&["env", "environment", "variable"])
            .and_then(|i| row.get(i))
            .map(|c| env_names_in(c))
            .unwrap_or_default();
        // A default written as one code span (`30s`) is compared; prose is not.
        let default = column(&["default"]).and_then(|i| row.get(i)).and_then(|c| {
            let inner = c.strip_prefix('`')?.strip_suffix('`')?;
            (!inner.contains('`')).then(|| inner.to_owned())
        });
        rows.push(Row {
            doc: name.clone(),
            flags,
            envs,
            default,
        });
    }
    rows
}

#[test]
fn documented_flags_env_and_defaults_match_the_help() {
    let helps = all_help();
    let all_options: Vec<BTreeMap<String, String>> = helps.iter().map(|h| options(h)).collect();
    // Options of every applet, and gpud's own (`--list`, in its usage line).
    let top_level = flags_in(&helps[0]);
    let known_flags: BTreeSet<&String> = all_options
        .iter()
        .flat_map(|o| o.keys())
        .chain(&top_level)
        .collect();
    let whole_help = helps.join("\n");
    let foreign: BTreeSet<&str> = FOREIGN_FLAGS.iter().map(|(f, _)| *f).collect();
    let mut problems = Vec::new();

    for (path, text) in documents() {
        let doc = path.strip_prefix(repo()).unwrap().display().to_string();
        for flag in flags_in(text.as_str()).into_iter().collect::<BTreeSet<_>>() {
            if !known_flags.contains(&flag) && !foreign.contains(flag.as_str()) {
                problems.push(format!("{doc}: {flag} is in no applet's --help"));
            }
        }
        let mut envs: BTreeSet<String> = BTreeSet::new();
        if path.extension().is_some_and(|e| e == "env") {
            for line in text.lines() {
                let line = line.trim_start_matches('#');
                if let Some((name, _)) = line.split_once('=')
                    && !name.is_empty()
                    && name
                        .chars()
                        .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
                {
                    envs.insert(name.to_owned());
                }
            }
        }
        envs.extend(
            env_names_in(&text)
                .into_iter()
                .filter(|e| e.starts_with("GPUD_")),
        );
        for row in table_rows(&path, &text) {
            envs.extend(row.envs.iter().cloned());
            let (Some(stated), false) = (&row.default, row.flags.is_empty()) else {
                continue;
            };
            let flag = &row.flags[0];
            let shown: BTreeSet<Option<String>> = all_options
                .iter()
                .filter_map(|o| o.get(flag))
                .map(|block| default_of(block))
                .collect();
            if !shown.is_empty() && !shown.contains(&Some(stated.clone())) {
                problems.push(format!(
                    "{}: {flag} default `{stated}`, but --help shows {shown:?}",
                    row.doc
                ));
            }
        }
        for env in envs {
            if !whole_help.contains(&env) && !FOREIGN_ENV.iter().any(|(e, _)| *e == env) {
                problems.push(format!("{doc}: environment variable {env} is in no --help"));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_scanners_find_what_they_should() {
    assert_eq!(
        flags_in("`--kmsg PATH` and --a-b=1, not a--b or ---"),
        ["--kmsg", "--a-b"]
    );
    assert_eq!(
        cells("| `--format yaml\\|json` | | `yaml` |"),
        ["`--format yaml|json`", "", "`yaml`"]
    );
    assert_eq!(
        default_of("  text\n  [default:\n  30s]\n"),
        Some("30s".into())
    );
    assert_eq!(
        env_names_in("`GPUD_LOG`, NODE_NAME and PATH"),
        ["GPUD_LOG", "NODE_NAME"]
    );
}

/// The applets each document is about, whose options its tables and prose describe unless a
/// row or paragraph names other applets (`gpud run --dra`). Documents not listed attribute
/// only what their headings, rows or paragraphs name.
const DOC_APPLETS: &[(&str, &[&str])] = &[
    ("docs/cdi.md", &["cdi generate"]),
    ("docs/device-plugin.md", &["device-plugin"]),
    ("docs/doctor.md", &["doctor"]),
    ("docs/dra.md", &["dra"]),
    ("docs/exporter.md", &["exporter"]),
    // "the watcher in every daemon": its options are those of every applet that runs it.
    (
        "docs/health.md",
        &[
            "health",
            "run",
            "device-plugin",
            "dra",
            "exporter",
            "labeller",
            "node-status",
        ],
    ),
    ("docs/inventory.md", &["inventory"]),
    ("docs/labeller.md", &["labeller"]),
    ("docs/mps.md", &["mps-control-daemon"]),
    ("docs/node-status.md", &["node-status"]),
    ("docs/run.md", &["run"]),
    // The toolkit component's cdi container loads NVML as `gpud cdi generate` does.
    ("docs/toolkit.md", &["cdi generate"]),
    // gpud.service runs `gpud run` with this file as its environment.
    ("systemd/gpud.env", &["run"]),
];

/// `gpud <applet> --help` of every applet, by applet; an applet with subcommands (`mig`,
/// `cdi`) by subcommand instead (`mig reconcile`), since the options are theirs.
fn helps_by_applet() -> BTreeMap<String, String> {
    let mut helps = BTreeMap::new();
    for applet in help(&["--list"]).lines() {
        let text = help(&[applet, "--help"]);
        let subcommands: Vec<String> = text
            .lines()
            .skip_while(|l| *l != "Commands:")
            .skip(1)
            .take_while(|l| !l.is_empty())
            .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
            .filter(|c| c != "help")
            .collect();
        if subcommands.is_empty() {
            helps.insert(applet.to_owned(), text);
        }
        for sub in subcommands {
            helps.insert(format!("{applet} {sub}"), help(&[applet, &sub, "--help"]));
        }
    }
    helps
}

/// The applets `text` names as `gpud <applet>` (or `gpud <applet> <subcommand>`), among
/// `known`. `gpud mig` without a subcommand names none: its options are the subcommands'.
fn applets_named(text: &str, known: &BTreeSet<String>) -> BTreeSet<String> {
    let word = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
            .collect()
    };
    let mut named = BTreeSet::new();
    for (at, _) in text.match_indices("gpud ") {
        let before = text[..at].chars().next_back();
        if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') {
            continue;
        }
        let rest = &text[at + "gpud ".len()..];
        let first = word(rest);
        let second = rest[first.len()..]
            .strip_prefix(' ')
            .map(word)
            .unwrap_or_default();
        let pair = format!("{first} {second}");
        if known.contains(&pair) {
            named.insert(pair);
        } else if known.contains(&first) {
            named.insert(first);
        }
    }
    named
}

/// The applet `text` names last (`gpud run` in "the `gpud dra` and `gpud run`").
fn last_applet_named(text: &str, known: &BTreeSet<String>) -> Option<String> {
    text.rmatch_indices("gpud ")
        .find_map(|(at, _)| applets_named(&text[at..], known).into_iter().next())
}

/// Whether `text` holds `name` as a whole environment variable name (not `GPUD_NODE_STATUS`
/// inside `GPUD_NODE_STATUS_HOLD`).
fn mentions_env(text: &str, name: &str) -> bool {
    let is_name = |c: char| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_';
    text.match_indices(name).any(|(at, _)| {
        !text[..at].chars().next_back().is_some_and(is_name)
            && !text[at + name.len()..].chars().next().is_some_and(is_name)
    })
}

/// What a document says about environment variables: (line, variable, the applets it is
/// documented for). A table row or a paragraph that names applets (`gpud run`) documents for
/// those; a table with an `applets` column for the applets it lists; otherwise the document's
/// applets (`DOC_APPLETS`), or those its current heading names.
fn documented_env(
    doc: &str,
    text: &str,
    known: &BTreeSet<String>,
) -> Vec<(usize, String, BTreeSet<String>)> {
    let doc_applets: Option<BTreeSet<String>> = DOC_APPLETS
        .iter()
        .find(|(d, _)| *d == doc)
        .map(|(_, a)| a.iter().map(|s| (*s).to_owned()).collect());
    let is_env_file = doc.ends_with(".env");
    let mut found = Vec::new();
    let mut heading = BTreeSet::new();
    let mut header: Option<Vec<String>> = None;
    // The paragraph being read: its first line and its text.
    let mut paragraph: Option<(usize, String)> = None;
    let fallback = |heading: &BTreeSet<String>| doc_applets.clone().unwrap_or(heading.clone());
    let flush = |paragraph: &mut Option<(usize, String)>,
                 heading: &BTreeSet<String>,
                 found: &mut Vec<(usize, String, BTreeSet<String>)>| {
        let Some((line, text)) = paragraph.take() else {
            return;
        };
        let is_env = |name: &str| {
            !name.is_empty()
                && !name.ends_with('_')
                && name
                    .chars()
                    .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
        };
        // Each variable goes to the applet named last before it in its sentence (`gpud run
        // --dra` (`GPUD_DRA`)), else to the document's.
        for sentence in text.split_inclusive([';', '.', '?', '!']) {
            let mut at = 0;
            for env in env_names_in(sentence) {
                let Some(found_at) = sentence[at..].find(&env).map(|i| i + at) else {
                    continue;
                };
                at = found_at + env.len();
                let assigned = is_env_file && {
                    let line_start = sentence[..found_at].rfind('\n').map_or(0, |i| i + 1);
                    let head = sentence[line_start..found_at].trim_start();
                    (head.is_empty() || head == "#") && sentence[at..].starts_with('=')
                };
                if !is_env(&env) || !(env.starts_with("GPUD_") || assigned) {
                    continue;
                }
                let applets = last_applet_named(&sentence[..found_at], known)
                    .map(|a| BTreeSet::from([a]))
                    .unwrap_or_else(|| fallback(heading));
                found.push((line, env, applets));
            }
        }
    };
    for (index, line) in text.lines().enumerate() {
        let number = index + 1;
        let trimmed = line.trim_start();
        if trimmed.starts_with('|') {
            flush(&mut paragraph, &heading, &mut found);
            let row = cells(line);
            if row
                .iter()
                .all(|c| c.chars().all(|ch| ch == '-' || ch == ':'))
            {
                continue;
            }
            let Some(head) = &header else {
                header = Some(row.iter().map(|c| c.to_lowercase()).collect());
                continue;
            };
            let column = |names: &[&str]| head.iter().position(|h| names.contains(&h.as_str()));
            let Some(envs) = column(&["env", "environment", "variable"]).and_then(|i| row.get(i))
            else {
                continue;
            };
            let named = applets_named(row.first().map_or("", String::as_str), known);
            let listed: BTreeSet<String> = column(&["applets"])
                .and_then(|i| row.get(i))
                .map(|cell| {
                    cell.split('`')
                        .skip(1)
                        .step_by(2)
                        .map(str::to_owned)
                        .collect()
                })
                .unwrap_or_default();
            let applets = if !named.is_empty() {
                named
            } else if !listed.is_empty() {
                listed
            } else {
                fallback(&heading)
            };
            for env in env_names_in(envs) {
                found.push((number, env, applets.clone()));
            }
            continue;
        }
        header = None;
        let is_heading = !is_env_file && trimmed.starts_with('#');
        let starts_item = ["- ", "* "].iter().any(|p| trimmed.starts_with(p))
            || trimmed
                .split_once(". ")
                .is_some_and(|(n, _)| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()));
        if trimmed.is_empty() || is_heading || starts_item {
            flush(&mut paragraph, &heading, &mut found);
        }
        if is_heading {
            heading = applets_named(trimmed, known);
            continue;
        }
        if trimmed.is_empty() {
            continue;
        }
        let (_, text) = paragraph.get_or_insert_with(|| (number, String::new()));
        text.push_str(line);
        text.push('\n');
    }
    flush(&mut paragraph, &heading, &mut found);
    found
}

#[test]
fn every_documented_variable_is_accepted_by_every_applet_it_is_documented_for() {
    let helps = helps_by_applet();
    let known: BTreeSet<String> = helps.keys().cloned().collect();
    for (doc, applets) in DOC_APPLETS {
        for applet in *applets {
            assert!(
                known.contains(*applet),
                "DOC_APPLETS: {doc}: no applet {applet}"
            );
        }
    }
    let mut problems = Vec::new();
    for (path, text) in documents() {
        let doc = path.strip_prefix(repo()).unwrap().display().to_string();
        for (line, env, applets) in documented_env(&doc, &text, &known) {
            if FOREIGN_ENV.iter().any(|(e, _)| *e == env) {
                continue;
            }
            for applet in applets {
                match helps.get(&applet) {
                    None => problems.push(format!("{doc}:{line}: no applet `{applet}`")),
                    Some(help) if !mentions_env(help, &env) => problems.push(format!(
                        "{doc}:{line}: {env} is documented for `gpud {applet}`, whose --help \
                         does not take it"
                    )),
                    Some(_) => {}
                }
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The long-running applets. Their shared options (docs/cli.md, "Daemon options") are declared
/// once each; the one-shot commands follow the tools they replace (`cdi generate` is
/// nvidia-ctk's, `mig apply` mig-parted's) and may differ from the daemons on purpose.
const DAEMONS: &[&str] = &[
    "device-plugin",
    "dra",
    "exporter",
    "health",
    "labeller",
    "mig reconcile",
    "mps-control-daemon",
    "node-status",
    "run",
];

/// Flags that show another variable in some daemon, on purpose: (flag, applet, why).
const DIFFERENT_ON_PURPOSE: &[(&str, &str, &str)] = &[(
    "--config-file",
    "labeller",
    "GFD reads GFD_CONFIG_FILE before CONFIG_FILE; the device plugin CONFIG_FILE only",
)];

/// The `[env: …]` of an option's block: the variable names clap shows.
fn env_of(block: &str) -> Option<String> {
    let flat = block.split_whitespace().collect::<Vec<_>>().join(" ");
    let start = flat.find("[env: ")? + "[env: ".len();
    let end = start + flat[start..].find(']')?;
    let value = &flat[start..end];
    Some(value.split('=').next().unwrap_or(value).to_owned())
}

/// What a help shows of one flag: its environment variables and its default.
type Shown = (Option<String>, Option<String>);

#[test]
fn a_flag_has_one_variable_and_one_default_in_every_daemon() {
    let helps = helps_by_applet();
    for daemon in DAEMONS {
        assert!(helps.contains_key(*daemon), "DAEMONS: no applet {daemon}");
    }
    // flag → (env, default) → the applets showing them.
    let mut seen: BTreeMap<String, BTreeMap<Shown, Vec<String>>> = BTreeMap::new();
    for (applet, help) in helps.iter().filter(|(a, _)| DAEMONS.contains(&a.as_str())) {
        for (flag, block) in options(help) {
            if ["--help", "--version"].contains(&flag.as_str())
                || DIFFERENT_ON_PURPOSE
                    .iter()
                    .any(|(f, a, _)| *f == flag && a == applet)
            {
                continue;
            }
            seen.entry(flag)
                .or_default()
                .entry((env_of(&block), default_of(&block)))
                .or_default()
                .push(applet.clone());
        }
    }
    let drifted: Vec<String> = seen
        .into_iter()
        .filter(|(_, variants)| variants.len() > 1)
        .map(|(flag, variants)| format!("{flag}: {variants:?}"))
        .collect();
    assert!(
        drifted.is_empty(),
        "flags with different variables or defaults ((env, default) → applets):\n{}",
        drifted.join("\n")
    );
}

#[test]
fn documented_variables_are_attributed_to_the_applets_named() {
    let known: BTreeSet<String> = ["run", "dra", "mig reconcile", "device-plugin"]
        .map(String::from)
        .into();
    assert_eq!(
        applets_named(
            "`gpud run --dra`, gpud-dra, gpud mig, gpud mig reconcile",
            &known
        ),
        BTreeSet::from(["run".to_owned(), "mig reconcile".to_owned()])
    );
    assert!(mentions_env(
        "[env: GPUD_NODE_STATUS_HOLD=]",
        "GPUD_NODE_STATUS_HOLD"
    ));
    assert!(!mentions_env(
        "[env: GPUD_NODE_STATUS_HOLD=]",
        "GPUD_NODE_STATUS"
    ));
    let text = "# `gpud dra`\n\
                \n\
                `GPUD_A` for `gpud run`; with `gpud run --x`\n\
                (`GPUD_B`).\n\
                \n\
                - `GPUD_C`\n\
                \n\
                | flag | env | applets |\n\
                |---|---|---|\n\
                | `--x` | `X_Y` | `dra`, `device-plugin` |\n\
                | `--z` (`gpud run`) | `GPUD_Z` | |\n";
    let found: Vec<(usize, String, Vec<String>)> = documented_env("docs/other.md", text, &known)
        .into_iter()
        .map(|(line, env, applets)| (line, env, applets.into_iter().collect()))
        .collect();
    let s = |v: &[&str]| v.iter().map(|x| (*x).to_owned()).collect::<Vec<_>>();
    assert_eq!(
        found,
        [
            (3, "GPUD_A".to_owned(), s(&["dra"])),
            (3, "GPUD_B".to_owned(), s(&["run"])),
            (6, "GPUD_C".to_owned(), s(&["dra"])),
            (10, "X_Y".to_owned(), s(&["device-plugin", "dra"])),
            (11, "GPUD_Z".to_owned(), s(&["run"])),
        ]
    );
}

#[test]
fn a_table_of_applets_names_exactly_the_daemons_that_take_each_option() {
    let helps = helps_by_applet();
    let options: BTreeMap<&str, BTreeMap<String, String>> = helps
        .iter()
        .map(|(applet, help)| (applet.as_str(), options(help)))
        .collect();
    let mut problems = Vec::new();
    let mut rows = 0;
    for (path, text) in documents() {
        let doc = path.strip_prefix(repo()).unwrap().display().to_string();
        for (index, head, row) in table_body_rows(&text) {
            let Some(listed) = head
                .iter()
                .position(|h| h == "applets")
                .and_then(|i| row.get(i))
            else {
                continue;
            };
            let listed: BTreeSet<&str> = listed.split('`').skip(1).step_by(2).collect();
            for flag in flags_in(row.first().map_or("", String::as_str)) {
                rows += 1;
                for applet in &listed {
                    if !options.contains_key(applet) {
                        problems.push(format!("{doc}:{}: no applet `{applet}`", index + 1));
                    }
                }
                for daemon in DAEMONS {
                    let takes = options[daemon].contains_key(&flag);
                    if takes != listed.contains(daemon) {
                        problems.push(format!(
                            "{doc}:{}: {flag}: `gpud {daemon}` {} it, the table says {}",
                            index + 1,
                            if takes { "takes" } else { "does not take" },
                            if takes { "it does not" } else { "it does" },
                        ));
                    }
                }
            }
        }
    }
    assert!(rows > 0, "no table with an applets column");
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_admin_port_table_is_the_one_the_applets_use_and_no_port_is_shared() {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/cli.md")).unwrap();
    let mut ports = std::collections::BTreeSet::new();
    for (applet, port) in gpud::applets::ADMIN_PORTS {
        assert!(
            ports.insert(*port),
            "port {port} of {applet} is another applet's too"
        );
        let row = format!("127.0.0.1:{port}` |");
        assert!(
            doc.lines()
                .any(|l| l.starts_with(&format!("| `{applet}`")) && l.ends_with(&row)),
            "docs/cli.md has no row `{applet}` … 127.0.0.1:{port}"
        );
    }
}

/// docs/cli.md's applet table is one table with one row per applet `gpud --list` prints
/// (subcommands in the same row): a missing row or a second one is what a new user trips on.
#[test]
fn the_applet_table_has_one_row_for_each_applet() {
    let doc = std::fs::read_to_string(repo().join("docs/cli.md")).unwrap();
    let rows: Vec<(usize, Vec<String>, Vec<String>)> = table_body_rows(&doc)
        .into_iter()
        .filter(|(_, head, _)| head == &["applet", "what it does"])
        .collect();
    let first = rows.first().expect("docs/cli.md has no applet table").0;
    let lines: Vec<usize> = rows.iter().map(|(line, _, _)| *line).collect();
    assert_eq!(
        lines,
        (first..first + rows.len()).collect::<Vec<_>>(),
        "docs/cli.md's applet table is cut in two (lines {lines:?})"
    );
    let mut named = BTreeMap::<String, usize>::new();
    for (_, _, row) in &rows {
        // "`mig apply\|assert`" names the applet `mig`.
        let applet = row[0]
            .trim_matches('`')
            .split([' ', '`'])
            .next()
            .unwrap()
            .to_owned();
        *named.entry(applet).or_default() += 1;
    }
    for applet in help(&["--list"]).lines() {
        assert_eq!(
            named.remove(applet),
            Some(1),
            "docs/cli.md's applet table needs exactly one row for `{applet}`"
        );
    }
    assert!(
        named.is_empty(),
        "docs/cli.md's applet table names applets gpud does not have: {named:?}"
    );
}
