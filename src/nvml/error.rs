//! Errors of the NVML adapter.

use std::fmt;
use std::path::PathBuf;

/// What went wrong talking to NVML. A GPU that is lost or refuses a query is not an error of
/// this kind: discovery turns those into health states.
#[derive(Debug, thiserror::Error)]
pub enum NvmlError {
    /// No candidate library could be opened, or `nvmlInit` failed on the one that opened.
    /// The second line says what to do about it.
    #[error("cannot initialise NVML: {}\n{}", Attempts(.attempts), next_step(*.explicit))]
    Unavailable {
        /// Every path tried, with why it failed, in the order tried.
        attempts: Vec<(PathBuf, String)>,
        /// Whether the path was given (`--nvml-lib`), rather than searched for.
        explicit: bool,
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

/// What to do when NVML cannot be initialised.
fn next_step(explicit: bool) -> &'static str {
    if explicit {
        "gpud: check the path given with --nvml-lib (GPUD_NVML_LIB), or leave it out to search \
         the usual places"
    } else {
        "gpud: install the NVIDIA driver (or mount its files into this container), or give \
         the library's path with --nvml-lib PATH (GPUD_NVML_LIB)"
    }
}

/// Formats the attempts as `PATH: reason; PATH: reason`, each path once: the paths that do
/// not exist together as `not present: PATH, PATH`.
struct Attempts<'a>(&'a [(PathBuf, String)]);

/// The reason given for a search path that does not exist.
pub(crate) const NOT_PRESENT: &str = "not present";

impl fmt::Display for Attempts<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("no library path to try");
        }
        let mut first = true;
        let mut separate = |f: &mut fmt::Formatter<'_>| {
            let gap = if first { "" } else { "; " };
            first = false;
            f.write_str(gap)
        };
        for (path, why) in self.0.iter().filter(|(_, why)| why != NOT_PRESENT) {
            separate(f)?;
            write!(f, "{}: {why}", path.display())?;
        }
        let absent: Vec<String> = self
            .0
            .iter()
            .filter(|(_, why)| why == NOT_PRESENT)
            .map(|(path, _)| path.display().to_string())
            .collect();
        if !absent.is_empty() {
            separate(f)?;
            write!(f, "{NOT_PRESENT}: {}", absent.join(", "))?;
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
                (PathBuf::from("/b/libnvidia-ml.so.1"), NOT_PRESENT.into()),
                (PathBuf::from("/c/libnvidia-ml.so.1"), NOT_PRESENT.into()),
            ],
            explicit: false,
        };
        assert_eq!(
            err.to_string(),
            "cannot initialise NVML: /a/libnvidia-ml.so.1: not found; libnvidia-ml.so.1: Driver \
             Not Loaded; not present: /b/libnvidia-ml.so.1, /c/libnvidia-ml.so.1\n\
             gpud: install the NVIDIA driver (or mount its files into this container), or give \
             the library's path with --nvml-lib PATH (GPUD_NVML_LIB)"
        );
    }
}
