//! Errors of NVIDIA's config: every message names where the value came from (the file, an
//! environment variable or the merged settings), the field path and the value.

use std::fmt;
use std::path::PathBuf;

/// Where a rejected value came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// The config file.
    File(PathBuf),
    /// An environment variable.
    Env(String),
    /// The settings after flags, environment, file and defaults were merged (a rule that
    /// spans several fields, such as MPS needing `mpsRoot`).
    Merged,
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Origin::File(path) => write!(f, "{}", path.display()),
            Origin::Env(name) => write!(f, "environment variable {name}"),
            Origin::Merged => f.write_str("configuration"),
        }
    }
}

/// A config that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum NvidiaConfigError {
    /// The file cannot be read, or is refused before parsing (too large, nested too deep).
    #[error(transparent)]
    Read(#[from] crate::files::ReadError),
    /// The file is not YAML/JSON of the right shape: a syntax error, an unknown key or a
    /// value of the wrong type. The message carries the field path and the line; a value it
    /// quotes is cut to a short excerpt.
    #[error("{path}: {}", crate::files::clip_quoted(message))]
    Parse { path: PathBuf, message: String },
    /// A field parses but its value is not acceptable (quoted as a short excerpt).
    #[error(
        "{origin}: field {field}: invalid value {}: {why}",
        crate::files::excerpt(value)
    )]
    Invalid {
        origin: Origin,
        field: String,
        value: String,
        why: String,
    },
}

impl NvidiaConfigError {
    /// Shorthand for [`NvidiaConfigError::Invalid`].
    pub(crate) fn invalid(
        origin: &Origin,
        field: impl Into<String>,
        value: impl Into<String>,
        why: impl Into<String>,
    ) -> Self {
        NvidiaConfigError::Invalid {
            origin: origin.clone(),
            field: field.into(),
            value: value.into(),
            why: why.into(),
        }
    }
}
