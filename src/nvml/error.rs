//! Errors of the NVML adapter.

use std::fmt;
use std::path::PathBuf;

/// What went wrong talking to NVML. A GPU that is lost or refuses a query is not an error of
/// this kind: discovery turns those into health states.
#[derive(Debug, thiserror::Error)]
pub enum NvmlError {
    /// No candidate library could be opened, or `nvmlInit` failed on the one that opened.
    #[error("cannot initialise NVML: {}", Attempts(.attempts))]
    Unavailable {
        /// Every path tried, with why it failed, in the order tried.
        attempts: Vec<(PathBuf, String)>,
    },
    /// A node-wide query failed (a per-GPU failure becomes a health state instead).
    #[error("NVML {call} failed: {source}")]
    Call {
        /// The NVML function that failed.
        call: &'static str,
        /// NVML's error.
        #[source]
        source: nvml_wrapper::error::NvmlError,
    },
    /// A thread that waits on NVML could not be started.
    #[error("cannot start the {what} thread: {source}")]
    Thread {
        /// Which thread.
        what: &'static str,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

/// A driver that cannot be loaded is exit 69 (`EX_UNAVAILABLE`); any other NVML failure at
/// start is a plain failure.
impl From<NvmlError> for crate::daemon::Error {
    fn from(err: NvmlError) -> Self {
        match err {
            NvmlError::Unavailable { .. } => crate::daemon::Error::Unavailable(err.to_string()),
            other => crate::daemon::Error::Failure(other.to_string()),
        }
    }
}

/// Formats the attempts as `PATH: reason; PATH: reason`.
struct Attempts<'a>(&'a [(PathBuf, String)]);

impl fmt::Display for Attempts<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("no library path to try");
        }
        for (i, (path, why)) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{}: {why}", path.display())?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unavailable_names_every_path_and_reason() {
        let err = NvmlError::Unavailable {
            attempts: vec![
                (PathBuf::from("/a/libnvidia-ml.so.1"), "not found".into()),
                (
                    PathBuf::from("libnvidia-ml.so.1"),
                    "Driver Not Loaded".into(),
                ),
            ],
        };
        assert_eq!(
            err.to_string(),
            "cannot initialise NVML: /a/libnvidia-ml.so.1: not found; libnvidia-ml.so.1: Driver Not Loaded"
        );
    }
}
