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

    /// How long the API server asked the client to wait (`details.retryAfterSeconds` of a
    /// 429 or 5xx `Status`, which the API server sets together with its `Retry-After`
    /// header; a plain-text 429 gets it from the header in [`super::connect`]'s client).
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            ApiError::Api {
                source: ::kube::Error::Api(status),
                ..
            }
            | ApiError::Hinted {
                source: ::kube::Error::Api(status),
                ..
            } => status
                .details
                .as_ref()
                .map(|d| d.retry_after_seconds)
                .filter(|&seconds| seconds > 0)
                .map(|seconds| Duration::from_secs(u64::from(seconds))),
            _ => None,
        }
    }

    /// The pause before the next attempt: the backoff's `delay`, or longer if the API
    /// server asked for longer.
    pub fn paced(&self, delay: Duration) -> Duration {
        self.retry_after().map_or(delay, |after| after.max(delay))
    }

    /// A refusal by RBAC says so: the fix is in gpud's ClusterRole, not in gpud.
    fn with_hint(self) -> Self {
        match self {
            ApiError::Api { what, source } if matches!(&source, ::kube::Error::Api(s) if s.code == 403) => {
                ApiError::Hinted {
                    what,
                    hint: "forbidden by RBAC: gpud's service account needs this verb on this \
                           resource; check the ClusterRole bound to it",
                    source,
                }
            }
            other => other,
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
        }
        .with_hint()),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(code: u16, retry_after: u32) -> ::kube::Error {
        let mut status = ::kube::core::Status::failure("refused", "Refused").with_code(code);
        if retry_after > 0 {
            status.details = Some(::kube::core::response::StatusDetails {
                name: String::new(),
                group: String::new(),
                kind: String::new(),
                uid: String::new(),
                causes: Vec::new(),
                retry_after_seconds: retry_after,
            });
        }
        ::kube::Error::Api(status.boxed())
    }

    async fn failed(source: ::kube::Error) -> ApiError {
        match bounded(|| "patching node n".to_owned(), async {
            Err::<(), _>(source)
        })
        .await
        {
            Err(err) => err,
            Ok(()) => panic!("no error"),
        }
    }

    #[tokio::test]
    async fn retry_after_lengthens_the_backoff_and_never_shortens_it() {
        let err = failed(refused(429, 7)).await;
        assert_eq!(err.status(), Some(429));
        assert_eq!(err.retry_after(), Some(Duration::from_secs(7)));
        assert_eq!(err.paced(Duration::from_secs(1)), Duration::from_secs(7));
        assert_eq!(err.paced(Duration::from_secs(9)), Duration::from_secs(9));
        let plain = failed(refused(500, 0)).await;
        assert_eq!(plain.paced(Duration::from_secs(1)), Duration::from_secs(1));
    }

    #[tokio::test]
    async fn a_refusal_by_rbac_names_rbac() {
        let err = failed(refused(403, 0)).await;
        assert_eq!(err.status(), Some(403));
        let text = err.to_string();
        assert!(text.starts_with("patching node n: "), "{text}");
        assert!(text.contains("forbidden by RBAC"), "{text}");
    }
}
