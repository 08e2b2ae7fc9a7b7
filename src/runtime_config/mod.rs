//! `gpud runtime configure`'s core: what containerd, CRI-O or Docker must be told to run GPU
//! containers (CDI on, an `nvidia` runtime entry, the default runtime), applied to the text of
//! their config file so that everything gpud does not set stays as it was.
//!
//! Each runtime turns a [`Request`] into a [`Plan`]: the leaf keys to set and the keys gpud
//! owns (what `--revert` takes back). The same plan drives both file formats: [`toml_keys`]
//! edits containerd's and CRI-O's TOML, [`docker`] Docker's JSON. [`resolve`] finds the file
//! a `--config` symlink names, [`lock`] keeps other runs out, [`write`] reads it bounded and
//! puts the result in place with a backup, [`record`] keeps what gpud changed for `--revert`
//! and a restart still owed; [`restart`] tells the runtime.

pub mod containerd;
pub mod crio;
pub mod docker;
pub mod install;
pub mod lock;
pub mod record;
pub mod resolve;
pub mod restart;
pub mod toml_keys;
pub mod write;

use std::path::{Path, PathBuf};

/// The container runtimes gpud configures, by `nvidia-ctk`'s names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Runtime {
    /// containerd 1.x (config version 2) or 2.x (version 3).
    Containerd,
    /// CRI-O, through a drop-in file.
    Crio,
    /// Docker's daemon.json.
    Docker,
}

impl Runtime {
    /// The name on the command line and in messages.
    pub fn name(self) -> &'static str {
        match self {
            Runtime::Containerd => "containerd",
            Runtime::Crio => "crio",
            Runtime::Docker => "docker",
        }
    }
}

/// The `nvidia` runtime entry to add: its name and the executable it runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NvidiaRuntime {
    /// The entry's name (`nvidia`).
    pub name: String,
    /// The executable (containerd's `BinaryName`, CRI-O's `runtime_path`, Docker's `path`).
    pub path: String,
}

/// What the command line asks for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Request {
    /// Turn CDI on.
    pub enable_cdi: bool,
    /// Folders the runtime reads CDI specs from; empty keeps the runtime's own list.
    pub cdi_spec_dirs: Vec<String>,
    /// The runtime entry to add, when one is asked for.
    pub runtime: Option<NvidiaRuntime>,
    /// Make the entry the default runtime (only with `runtime`).
    pub set_as_default: bool,
}

/// A value gpud writes, the same in TOML and JSON.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Wanted {
    /// `true` / `false`.
    Bool(bool),
    /// A string.
    Str(String),
    /// An array of strings.
    Strings(Vec<String>),
}

/// What a runtime's file must hold: leaf keys with their values, in the order they are set,
/// and the keys gpud owns for `--revert` (a whole table for a runtime entry).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// Key path → value.
    pub settings: Vec<(Vec<String>, Wanted)>,
    /// Key paths `--revert` gives back their old value (or removes).
    pub owned: Vec<Vec<String>>,
}

impl Plan {
    /// The runtime entry `request` asks for, under the `runtimes` table: `fields` of the
    /// executable (key paths under the entry) when there is one, and the default-runtime key
    /// `default` when asked. The entry and the default are owned either way.
    pub(crate) fn add_runtime(
        &mut self,
        request: &Request,
        runtimes: &[&str],
        default: &[&str],
        fields: impl FnOnce(&str) -> Vec<(&'static [&'static str], Wanted)>,
    ) {
        let Some(NvidiaRuntime { name, path }) = &request.runtime else {
            return;
        };
        let mut entry = key(runtimes);
        entry.push(name.clone());
        if !path.is_empty() {
            for (field, wanted) in fields(path) {
                let mut at = entry.clone();
                at.extend(key(field));
                self.settings.push((at, wanted));
            }
        }
        let default = key(default);
        if request.set_as_default {
            self.settings
                .push((default.clone(), Wanted::Str(name.clone())));
        }
        self.owned.extend([entry, default]);
    }
}

/// A key path from its parts.
pub(crate) fn key(parts: &[&str]) -> Vec<String> {
    parts.iter().map(|p| (*p).to_owned()).collect()
}

/// Why a config file cannot be configured. Each message names the file and says what to do.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The file is not valid TOML.
    #[error(
        "{}:{line}:{column}: not valid TOML: {message}; fix the file (or move it away to start from an empty config) and run again",
        path.display()
    )]
    Toml {
        /// The file.
        path: PathBuf,
        /// 1-based line of the error.
        line: usize,
        /// 1-based column of the error.
        column: usize,
        /// The parser's message.
        message: String,
    },
    /// The file is not a JSON object.
    #[error(
        "{}:{line}:{column}: not a valid JSON object: {message}; fix the file and run again",
        path.display()
    )]
    Json {
        /// The file.
        path: PathBuf,
        /// 1-based line of the error.
        line: usize,
        /// 1-based column of the error.
        column: usize,
        /// The parser's message.
        message: String,
    },
    /// A containerd config version gpud does not edit.
    #[error(
        "{}: containerd config version {value} is not one gpud edits (2 for containerd 1.x, 3 for containerd 2.x); migrate the file (`containerd config migrate` on containerd 2.x) and run again",
        path.display()
    )]
    Version {
        /// The file.
        path: PathBuf,
        /// The version found (`1 (no version key)` when absent).
        value: String,
    },
    /// A key gpud must write through holds something else than a table (or object).
    #[error(
        "{}: {key} is {found}, where gpud needs a table; fix the file and run again",
        path.display()
    )]
    Shape {
        /// The file.
        path: PathBuf,
        /// The dotted key.
        key: String,
        /// What it holds.
        found: String,
    },
    /// The file or its backup cannot be read.
    #[error("{}: cannot read: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The system error.
        #[source]
        source: std::io::Error,
    },
    /// The file, its backup or its folder cannot be written.
    #[error("{0}; check that the folder exists and gpud may write it (run as root)")]
    Write(#[from] crate::files::WriteError),
    /// The file is not one gpud reads: not a regular file, or over the size limit.
    #[error("{0}")]
    Unfit(crate::files::ReadError),
    /// `--config` is a symlink gpud cannot follow to a file.
    #[error("{}: {message}", path.display())]
    Link {
        /// The path as given.
        path: PathBuf,
        /// What is wrong and what to do.
        message: String,
    },
    /// gpud's record of what it changed cannot be read or written.
    #[error(
        "{}: gpud's record of what it changed in the config: {message}; move it away and take back gpud's keys by hand (the file before gpud is in its .gpud.bak, when there is one)",
        path.display()
    )]
    Record {
        /// The record file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
}

impl Error {
    /// Whether the file's contents are at fault (exit 65) rather than the file system (73).
    pub fn is_data(&self) -> bool {
        matches!(
            self,
            Error::Toml { .. }
                | Error::Json { .. }
                | Error::Version { .. }
                | Error::Shape { .. }
                | Error::Unfit(_)
        )
    }
}

/// 1-based line and column of byte `offset` in `text`.
pub(crate) fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before
        .rsplit('\n')
        .next()
        .map_or(0, |rest| rest.chars().count())
        + 1;
    (line, column)
}

/// The result of editing a file's text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Edited {
    /// The new text (it may equal the old: nothing to change).
    Text(String),
    /// The file is to go: `--revert` of a file gpud created, with nothing else left in it.
    Remove,
}

/// Applies `request` to the text of `path` (`None`: the file does not exist) for `runtime`.
/// `new_version` is the config version of a containerd file that does not exist yet.
pub fn configure(
    runtime: Runtime,
    path: &Path,
    text: Option<&str>,
    request: &Request,
    new_version: i64,
) -> Result<(String, Vec<record::Change>), Error> {
    match runtime {
        Runtime::Containerd => containerd::configure(path, text, request, new_version),
        Runtime::Crio => toml_keys::configure(path, text.unwrap_or(""), &crio::plan(request)),
        Runtime::Docker => docker::configure(path, text.unwrap_or(""), &docker::plan(request)),
    }
}

/// The keys `--revert` with `--nvidia-runtime-name name` takes back in `text` (CDI, the runtime
/// entry `name`, the default runtime): a recorded change under one of them is taken back.
pub fn owned(
    runtime: Runtime,
    path: &Path,
    text: &str,
    name: &str,
) -> Result<Vec<Vec<String>>, Error> {
    let owned_by_name = Request {
        runtime: Some(NvidiaRuntime {
            name: name.to_owned(),
            path: String::new(),
        }),
        ..Request::default()
    };
    Ok(match runtime {
        Runtime::Containerd => containerd::owned(path, text, name)?,
        Runtime::Crio => crio::plan(&owned_by_name).owned,
        Runtime::Docker => docker::plan(&owned_by_name).owned,
    })
}

/// Takes back the recorded `changes` in `text` (see [`toml_keys::revert_recorded`]); the
/// result and the changes left alone because their key was changed since.
pub fn revert_recorded(
    runtime: Runtime,
    path: &Path,
    text: &str,
    changes: &[record::Change],
    backup: Option<&str>,
    created: bool,
) -> Result<(Edited, Vec<record::Change>), Error> {
    match runtime {
        Runtime::Containerd => {
            toml_keys::revert_recorded(path, text, changes, backup, created, &["version"])
        }
        Runtime::Crio => toml_keys::revert_recorded(path, text, changes, backup, created, &[]),
        Runtime::Docker => docker::revert_recorded(path, text, changes, backup, created),
    }
}

/// For a file configured by a gpud that kept no record, only a backup: gives the keys gpud
/// owns in `text` (CDI, the runtime entry `name`, the default runtime) back the values they
/// have in `backup` (the file before gpud's first edit). The backup's bytes come back exactly
/// when nothing but those keys changed since; otherwise only those keys change.
pub fn revert(
    runtime: Runtime,
    path: &Path,
    text: &str,
    backup: Option<&str>,
    name: &str,
) -> Result<Edited, Error> {
    let owned_by_name = Request {
        runtime: Some(NvidiaRuntime {
            name: name.to_owned(),
            path: String::new(),
        }),
        ..Request::default()
    };
    match runtime {
        Runtime::Containerd => containerd::revert(path, text, backup, name),
        Runtime::Crio => toml_keys::revert(path, text, backup, &crio::plan(&owned_by_name).owned),
        Runtime::Docker => docker::revert(path, text, backup, &docker::plan(&owned_by_name).owned),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_and_column_are_one_based() {
        assert_eq!(line_column("ab\ncd", 0), (1, 1));
        assert_eq!(line_column("ab\ncd", 4), (2, 2));
        assert_eq!(line_column("ab", 99), (1, 3));
    }
}
