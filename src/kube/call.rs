//! One API call with a time limit, and the one error type for what the API server (or the
//! lack of one) says.

use std::future::Future;
use std::time::Duration;

/// How long one API call may take; a slow API server delays only the caller's next retry.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a call to the API server did not succeed.
///
/// A refusal by the API server reads `<what>: <code> <reason>: <message>` and, where the fix
/// or the next step is known, a hint in parentheses: one line that names what was refused,
/// why, and what happens next, without kube-rs's debug dump of the `Status`.
#[derive(Debug)]
pub enum ApiError {
    /// No client could be built (kubeconfig, in-cluster settings).
    Config(String),
    /// The call took longer than its limit.
    Timeout { what: String, after: Duration },
    /// The API server (or the connection to it) answered with an error.
    Api { what: String, source: ::kube::Error },
    /// As [`ApiError::Api`], with what the user should check.
    Hinted {
        what: String,
        hint: &'static str,
        source: ::kube::Error,
    },
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ApiError::Config(why) => write!(f, "cannot configure the Kubernetes client: {why}"),
            ApiError::Timeout { what, after } => {
                write!(f, "{what}: no answer from the API server within {after:?}")
            }
            ApiError::Api { what, source } => {
                write!(f, "{what}: {}", Refusal(source))?;
                self.retry_note(f)
            }
            ApiError::Hinted { what, hint, source } => {
                write!(f, "{what}: {} ({hint})", Refusal(source))?;
                self.retry_note(f)
            }
        }
    }
}

impl std::error::Error for ApiError {
    /// The client error beneath, except an API server's `Status`, which the message already
    /// spells out whole (its own chain would repeat it).
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ApiError::Api { source, .. } | ApiError::Hinted { source, .. } => match source {
                ::kube::Error::Api(_) => None,
                other if answer_too_long(other) => None,
                other => Some(other),
            },
            ApiError::Config(_) | ApiError::Timeout { .. } => None,
        }
    }
}

/// The most bytes one answer of the API server may have (a watch counts as one answer): far
/// above what gpud reads (its Node, its slices, a claim), far below what an endless body
/// would grow the process to. Past it the read fails and the caller retries on its backoff.
pub const MAX_RESPONSE_BYTES: usize = 32 * 1024 * 1024;

/// A client error as one clause: an API server's `Status` as `<code> <reason>: <message>`, an
/// answer cut off at [`MAX_RESPONSE_BYTES`] as such, anything else as kube-rs
/// words it.
struct Refusal<'a>(&'a ::kube::Error);

impl std::fmt::Display for Refusal<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            ::kube::Error::Api(status) => {
                write!(f, "{} {}: {}", status.code, status.reason, status.message)
            }
            other if answer_too_long(other) => write!(
                f,
                "the answer passed gpud's limit of {} MiB and was cut off (an API server or a \
                 proxy in front of it sending an endless body?)",
                MAX_RESPONSE_BYTES / (1024 * 1024)
            ),
            other => write!(f, "{other}"),
        }
    }
}

/// Whether `err` is an answer cut off at gpud's response size cap.
fn answer_too_long(err: &::kube::Error) -> bool {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = cause {
        if e.is::<http_body_util::LengthLimitError>() {
            return true;
        }
        cause = e.source();
    }
    false
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

    /// How long the API server asked the client to wait: `details.retryAfterSeconds` of a
    /// 429 or 5xx `Status`, where [`super::connect`]'s client also puts the answer's
    /// `Retry-After` header (in either of its forms, see [`retry_after_header`]) whatever the
    /// body, so that the longer of the two is read here.
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
                .map(|seconds| Duration::from_secs(u64::from(seconds)).min(MAX_RETRY_AFTER)),
            _ => None,
        }
    }

    /// The pause before the next attempt: the backoff's `delay`, or longer if the API
    /// server asked for longer, lengthened by up to a half at random
    /// ([`super::pace::spread`]; a `Retry-After` by up to as long again): every node of a
    /// fleet that failed in the same second (an outage, a 429 to all) must not retry in the
    /// same second again, which the backoff's quarter of jitter alone does not prevent.
    ///
    /// While the API server cannot be reached the pause ends no later than just after this
    /// process's next probe ([`super::pace::retry_by`]): the gate, not the caller's timer,
    /// decides when the process comes back.
    pub fn paced(&self, delay: Duration) -> Duration {
        let factor = super::pace::spread();
        let delay = delay.mul_f64(factor);
        let paced = self
            .retry_after()
            .map_or(delay, |after| after.mul_f64(2.0 * factor - 1.0).max(delay));
        super::pace::retry_by().map_or(paced, |by| paced.min(by))
    }

    /// Says how long the API server asked gpud to wait, when it did: the caller's next try
    /// is no sooner.
    fn retry_note(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.retry_after() {
            Some(after) => write!(
                f,
                " (the API server asks to wait {}s before the next call)",
                after.as_secs()
            ),
            None => Ok(()),
        }
    }

    /// A refusal whose fix lies outside gpud says where: RBAC (403) in gpud's ClusterRole, an
    /// object refused as invalid (422) in the admission rules or the API server's version.
    fn with_hint(self) -> Self {
        let hint = match &self {
            ApiError::Api {
                source: ::kube::Error::Api(s),
                ..
            } => match s.code {
                403 => Some(
                    "forbidden by RBAC: gpud's service account needs this verb on this \
                     resource; check the Role or ClusterRole bound to it",
                ),
                422 => Some(
                    "refused as invalid: an admission policy or webhook, or an API server \
                     older than gpud expects, rejects what gpud writes; gpud retries with \
                     backoff, check the policies that apply to this object",
                ),
                _ => None,
            },
            _ => None,
        };
        match (self, hint) {
            (ApiError::Api { what, source }, Some(hint)) => ApiError::Hinted { what, hint, source },
            (other, _) => other,
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

/// The longest wait a `Retry-After` is followed for. The API server's own (priority and
/// fairness) asks for seconds; a larger value is a proxy's or a broken server's, and followed
/// as asked it would stop gpud's Node updates, its slices and a GPU's remediation for as long
/// as it says (`u32::MAX` seconds is 136 years). Past this the caller retries on its backoff.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(300);

/// The wait a `Retry-After` header asks for, at `now` (RFC 9110, section 10.2.3): a number of
/// seconds, or an HTTP date (its IMF-fixdate form, and the two obsolete forms recipients must
/// accept), rounded up to whole seconds. `None` for a date already past, or a value in
/// neither form.
pub(super) fn retry_after_header(value: &str, now: std::time::SystemTime) -> Option<Duration> {
    let value = value.trim();
    if let Ok(seconds) = value.parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    let wait = at.duration_since(now).ok()?;
    let seconds = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
    (seconds > 0).then(|| Duration::from_secs(seconds))
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
    async fn a_retry_after_longer_than_five_minutes_is_followed_for_five() {
        let err = failed(refused(429, u32::MAX)).await;
        assert_eq!(err.retry_after(), Some(MAX_RETRY_AFTER));
        let paced = err.paced(Duration::from_secs(1));
        assert!(
            paced >= MAX_RETRY_AFTER / 2 && paced <= MAX_RETRY_AFTER * 2,
            "{paced:?}"
        );
        assert_eq!(
            failed(refused(503, 301)).await.retry_after(),
            Some(MAX_RETRY_AFTER)
        );
        assert_eq!(
            failed(refused(503, 299)).await.retry_after(),
            Some(Duration::from_secs(299))
        );
    }

    #[tokio::test]
    async fn retry_after_lengthens_the_backoff_and_never_shortens_it() {
        let err = failed(refused(429, 7)).await;
        assert_eq!(err.status(), Some(429));
        assert_eq!(err.retry_after(), Some(Duration::from_secs(7)));
        let secs = Duration::from_secs;
        for _ in 0..50 {
            let paced = err.paced(secs(1));
            assert!(paced >= secs(7) && paced < secs(14), "{paced:?}");
            let paced = err.paced(secs(9));
            assert!(paced >= secs(9) && paced < secs(14), "{paced:?}");
        }
        let plain = failed(refused(500, 0)).await;
        for _ in 0..50 {
            let paced = plain.paced(secs(2));
            assert!(paced >= secs(2) && paced < secs(3), "{paced:?}");
        }
    }

    #[tokio::test]
    async fn a_refusal_by_rbac_names_rbac() {
        let err = failed(refused(403, 0)).await;
        assert_eq!(err.status(), Some(403));
        assert_eq!(
            crate::logging::error_chain(&err),
            "patching node n: 403 Refused: refused (forbidden by RBAC: gpud's service account \
             needs this verb on this resource; check the Role or ClusterRole bound to it)"
        );
    }

    #[tokio::test]
    async fn a_refusal_reads_as_one_line_with_the_wait_the_api_server_asked_for() {
        let err = failed(refused(429, 3)).await;
        assert_eq!(
            crate::logging::error_chain(&err),
            "patching node n: 429 Refused: refused (the API server asks to wait 3s before the \
             next call)"
        );
        let err = failed(refused(422, 0)).await;
        assert!(
            crate::logging::error_chain(&err)
                .starts_with("patching node n: 422 Refused: refused (refused as invalid: "),
            "{err}"
        );
    }

    #[test]
    fn retry_after_is_read_as_seconds_or_as_an_http_date() {
        let now = httpdate::parse_http_date("Wed, 21 Oct 2015 07:28:00 GMT").unwrap();
        let secs = Duration::from_secs;
        assert_eq!(retry_after_header("3", now), Some(secs(3)));
        assert_eq!(retry_after_header(" 0 ", now), Some(secs(0)));
        let later = "Wed, 21 Oct 2015 07:28:05 GMT";
        assert_eq!(retry_after_header(later, now), Some(secs(5)));
        // The obsolete forms RFC 9110 still asks recipients to accept.
        let rfc850 = "Wednesday, 21-Oct-15 07:28:05 GMT";
        assert_eq!(retry_after_header(rfc850, now), Some(secs(5)));
        let asctime = "Wed Oct 21 07:28:05 2015";
        assert_eq!(retry_after_header(asctime, now), Some(secs(5)));
        // Part of a second left counts as a whole one: never sooner than asked.
        let sooner = now + Duration::from_millis(4500);
        assert_eq!(retry_after_header(later, sooner), Some(secs(1)));
        // A date already past, or neither form: no wait asked.
        assert_eq!(retry_after_header(later, now + secs(6)), None);
        assert_eq!(retry_after_header(later, now + secs(5)), None);
        assert_eq!(retry_after_header("soon", now), None);
        assert_eq!(retry_after_header("-1", now), None);
    }
}
