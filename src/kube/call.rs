//! One API call with a time limit, and the one error type for what the API server (or the
//! lack of one) says.

use std::future::Future;
use std::time::Duration;

/// How long one API call may take; a slow API server delays only the caller's next retry.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a call to the API server did not succeed.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// No client could be built (kubeconfig, in-cluster settings).
    #[error("cannot configure the Kubernetes client: {0}")]
    Config(String),
    /// The call took longer than its limit.
    #[error("{what}: no answer from the API server within {after:?}")]
    Timeout { what: String, after: Duration },
    /// The API server (or the connection to it) answered with an error.
    #[error("{what}: {source}")]
    Api {
        what: String,
        #[source]
        source: ::kube::Error,
    },
    /// As [`ApiError::Api`], with what the user should check.
    #[error("{what}: {source} ({hint})")]
    Hinted {
        what: String,
        hint: &'static str,
        #[source]
        source: ::kube::Error,
    },
}

impl ApiError {
    /// The HTTP status the API server answered with, if it answered.
    pub fn status(&self) -> Option<u16> {
        match self {
            ApiError::Api {
                source: ::kube::Error::Api(status),
                ..
            }
            | ApiError::Hinted {
                source: ::kube::Error::Api(status),
                ..
            } => Some(status.code),
            _ => None,
        }
    }
}

/// Runs `call` within [`CALL_TIMEOUT`]; `what` names it in the error.
pub async fn bounded<T>(
    what: impl Fn() -> String,
    call: impl Future<Output = Result<T, ::kube::Error>>,
) -> Result<T, ApiError> {
    within(CALL_TIMEOUT, what, call).await
}

/// Runs `call` (one or several requests) within `limit`; `what` names it in the error.
pub async fn within<T, E>(
    limit: Duration,
    what: impl Fn() -> String,
    call: impl Future<Output = Result<T, E>>,
) -> Result<T, ApiError>
where
    E: Into<ApiError>,
{
    match tokio::time::timeout(limit, call).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(err)) => Err(match err.into() {
            // A bare client error gets its name here; one named deeper down keeps its name.
            ApiError::Api {
                what: named,
                source,
            } if named.is_empty() => ApiError::Api {
                what: what(),
                source,
            },
            other => other,
        }),
        Err(_) => Err(ApiError::Timeout {
            what: what(),
            after: limit,
        }),
    }
}

/// A bare client error, named by the caller of [`within`].
impl From<::kube::Error> for ApiError {
    fn from(source: ::kube::Error) -> Self {
        ApiError::Api {
            what: String::new(),
            source,
        }
    }
}
