//! The one error type applets return, and the exit code each kind maps to.

use std::process::ExitCode;

use crate::exit;
use crate::nvml::NvmlError;

/// Why an applet stopped. Each variant is one exit code; the message is printed once, as
/// `gpud: <message>`, by [`exit_code`].
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A bad flag or a combination of flags that cannot work (64).
    #[error("{0}")]
    Usage(String),
    /// A config file or value that does not validate; the message names the file, the field and
    /// the value (65).
    #[error("{0}")]
    Config(String),
    /// A file that cannot be created or replaced; the message names it (73).
    #[error("{0}")]
    CantCreate(String),
    /// The driver is not there: NVML could not be loaded or initialised (69).
    #[error("{0}")]
    Unavailable(String),
    /// A subsystem stopped with an error while running (1). Each cause is written once, even
    /// when a message already ends with its source's.
    #[error("{name}: {}", crate::logging::error_chain(cause.as_ref()))]
    Subsystem {
        /// The subsystem's name.
        name: &'static str,
        /// What went wrong, with its causes.
        cause: anyhow::Error,
    },
    /// Any other failure (1).
    #[error("{0}")]
    Failure(String),
    /// Already reported (clap's help, version and usage messages): exit with this code and
    /// print nothing more.
    #[error("exit {0}")]
    Reported(u8),
}

impl Error {
    /// A config error from anything that displays as one.
    pub fn config(err: impl std::fmt::Display) -> Self {
        Error::Config(err.to_string())
    }

    /// The process exit code for this error.
    pub fn code(&self) -> u8 {
        match self {
            Error::Usage(_) => exit::USAGE,
            Error::Config(_) => exit::DATA,
            Error::Unavailable(_) => exit::UNAVAILABLE,
            Error::CantCreate(_) => exit::CANT_CREATE,
            Error::Subsystem { .. } | Error::Failure(_) => exit::FAILURE,
            Error::Reported(code) => *code,
        }
    }
}

/// Turns an applet's outcome into the process exit code, printing the error line once.
pub fn exit_code(outcome: Result<ExitCode, Error>) -> ExitCode {
    match outcome {
        Ok(code) => code,
        Err(Error::Reported(code)) => ExitCode::from(code),
        Err(err) => {
            eprintln!("gpud: {err}");
            ExitCode::from(err.code())
        }
    }
}

/// A driver that cannot be loaded is exit 69 (`EX_UNAVAILABLE`); any other NVML failure at
/// start is a plain failure.
impl From<NvmlError> for Error {
    fn from(err: NvmlError) -> Self {
        match err {
            NvmlError::Unavailable { .. } => Error::Unavailable(err.to_string()),
            other => Error::Failure(other.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_has_its_exit_code() {
        assert_eq!(Error::Usage("x".into()).code(), 64);
        assert_eq!(Error::Config("x".into()).code(), 65);
        assert_eq!(Error::Unavailable("x".into()).code(), 69);
        assert_eq!(Error::CantCreate("x".into()).code(), 73);
        assert_eq!(Error::Failure("x".into()).code(), 1);
        assert_eq!(Error::Reported(0).code(), 0);
    }

    #[test]
    fn a_subsystem_error_names_the_subsystem_and_its_causes() {
        let cause = anyhow::anyhow!("Address in use").context("cannot listen on :9400");
        let err = Error::Subsystem {
            name: "exporter",
            cause,
        };
        assert_eq!(
            err.to_string(),
            "exporter: cannot listen on :9400: Address in use"
        );
        assert_eq!(err.code(), 1);
    }

    #[test]
    fn a_cause_whose_message_carries_its_source_is_written_once() {
        let bind = crate::http::ListenError::Bind {
            address: "127.0.0.1:9400".into(),
            source: std::io::Error::from(std::io::ErrorKind::AddrInUse),
        };
        let err = Error::Subsystem {
            name: "exporter",
            cause: anyhow::Error::new(bind),
        };
        assert_eq!(
            err.to_string(),
            "exporter: cannot listen on 127.0.0.1:9400: address in use"
        );
    }
}
