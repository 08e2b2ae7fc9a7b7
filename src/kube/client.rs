//! A client for the API server: from a kubeconfig file when one is named, else the usual
//! inference (in-cluster service account, then `$KUBECONFIG` / `~/.kube/config`). A named
//! kubeconfig is read under the same limits as every config file ([`crate::files`]).

use std::path::Path;

use super::ApiError;
use super::call::MAX_RESPONSE_BYTES;

/// Builds a client; fails with the kubeconfig's path and the reason.
pub async fn connect(kubeconfig: Option<&Path>) -> Result<::kube::Client, ApiError> {
    let config = match kubeconfig {
        Some(path) => {
            let named =
                |e: &dyn std::fmt::Display| ApiError::Config(format!("{}: {e}", path.display()));
            // Checked first with gpud's own limits: a regular file of bounded size, so a FIFO
            // or a link to a device cannot hang or bloat the process.
            crate::files::read_text(path).map_err(|e| ApiError::Config(e.to_string()))?;
            let file = ::kube::config::Kubeconfig::read_from(path).map_err(|e| named(&e))?;
            ::kube::Config::from_custom_kubeconfig(
                file,
                &::kube::config::KubeConfigOptions::default(),
            )
            .await
            .map_err(|e| named(&e))?
        }
        None => ::kube::Config::infer()
            .await
            .map_err(|e| ApiError::Config(e.to_string()))?,
    };
    // No retries hidden inside one call: kube-rs would otherwise repeat a 429, 503 or 504 up
    // to 15 times from 5 ms within the call's time limit, unseen by gpud's log and backoff.
    // Each call is one request; its caller retries on gpud's backoff, lengthened to what the
    // API server asks for ([`ApiError::paced`]). Every request of the process passes one
    // pacer first: the client-side rate limit and the gate that spreads a fleet's return
    // after an outage ([`super::pace`]).
    let mut config = config;
    config.default_retry = false;
    let builder = ::kube::client::ClientBuilder::try_from(config)
        .map_err(|e| ApiError::Config(e.to_string()))?;
    let bounded: fn(Reply) -> Reply = limit_body;
    let keep_retry_after: fn(Reply) -> Waited = keep_retry_after;
    // The last layer is the outermost: an answer's body is cut at the cap before the
    // Retry-After layer reads it.
    Ok(builder
        .with_layer(&super::pace::PaceLayer(super::pace::pacer()))
        .with_layer(&tower::util::MapResponseLayer::new(bounded))
        .with_layer(&tower::util::AndThenLayer::new(keep_retry_after))
        .build())
}

fn limit_body(reply: Reply) -> Reply {
    let (parts, body) = reply.into_parts();
    let limited: Box<::kube::client::DynBody> =
        Box::new(http_body_util::Limited::new(body, MAX_RESPONSE_BYTES));
    http::Response::from_parts(parts, limited)
}

type Reply = http::Response<Box<::kube::client::DynBody>>;

/// An answer as [`keep_retry_after`] hands it on: at once, or once its body is read.
type Waited = futures_util::future::Either<
    std::future::Ready<Result<Reply, tower::BoxError>>,
    futures_util::future::BoxFuture<'static, Result<Reply, tower::BoxError>>,
>;

/// Makes the wait an answer's `Retry-After` header asks for reach [`ApiError::retry_after`],
/// which reads the `Status` body: kube-rs keeps an error answer's body and drops its headers.
///
/// As client-go's `checkWait`, a 429 or any 5xx with a `Retry-After` is a request to wait,
/// whatever its body: a `Status` without `details.retryAfterSeconds` gets the header's seconds
/// there, one with a shorter wait is lengthened to the header's (never sooner than either
/// asks), and a body that is not JSON (priority and fairness, max-in-flight or a proxy answer
/// in plain text) becomes a `Status` with its text as the message. The header may be seconds
/// or an HTTP date (a proxy's), which becomes the seconds left until then. Any other answer,
/// every success among them, passes untouched and unread.
///
/// [`ApiError::retry_after`]: super::ApiError::retry_after
fn keep_retry_after(reply: Reply) -> Waited {
    let code = reply.status();
    let asks = code == http::StatusCode::TOO_MANY_REQUESTS || code.as_u16() >= 500;
    let wait = reply
        .headers()
        .get(http::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| super::call::retry_after_header(v, std::time::SystemTime::now()))
        .and_then(|wait| u32::try_from(wait.as_secs()).ok())
        .filter(|&seconds| seconds > 0);
    match wait.filter(|_| asks) {
        None => futures_util::future::Either::Left(std::future::ready(Ok(reply))),
        Some(seconds) => futures_util::future::Either::Right(Box::pin(with_wait(reply, seconds))),
    }
}

/// `reply` with `seconds` in its `Status` body ([`status_with_wait`]). The body read is an
/// error answer's, already capped at [`MAX_RESPONSE_BYTES`] and read whole by kube-rs next
/// anyway; a body that fails to read is handed on as that failure.
async fn with_wait(reply: Reply, seconds: u32) -> Result<Reply, tower::BoxError> {
    let (mut parts, body) = reply.into_parts();
    let body: Box<::kube::client::DynBody> = match http_body_util::BodyExt::collect(body).await {
        Ok(read) => {
            let status = status_with_wait(parts.status, &read.to_bytes(), seconds);
            parts.headers.insert(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static("application/json"),
            );
            parts.headers.remove(http::header::CONTENT_LENGTH);
            Box::new(Once(Some(Ok(hyper::body::Bytes::from(status)))))
        }
        Err(err) => Box::new(Once(Some(Err(err)))),
    };
    Ok(http::Response::from_parts(parts, body))
}

/// The `Status` body of a `code` answer whose body was `body` and whose `Retry-After` asked
/// for `seconds`: a JSON object keeps every field, with `details.retryAfterSeconds` the longer
/// of its own and `seconds`; anything else becomes a `Status` with the text as its message.
fn status_with_wait(code: http::StatusCode, body: &[u8], seconds: u32) -> Vec<u8> {
    let mut status = match serde_json::from_slice::<serde_json::Value>(body) {
        Ok(serde_json::Value::Object(status)) => status,
        _ => {
            let text = String::from_utf8_lossy(body);
            let text = text.trim();
            let message = if text.is_empty() {
                code.canonical_reason().unwrap_or("no message")
            } else {
                text
            };
            let mut status = serde_json::Map::new();
            status.insert("kind".into(), "Status".into());
            status.insert("apiVersion".into(), "v1".into());
            status.insert("status".into(), "Failure".into());
            status.insert("message".into(), message.into());
            status.insert("reason".into(), reason_of(code).into());
            status.insert("code".into(), code.as_u16().into());
            status
        }
    };
    let details = status
        .entry("details")
        .or_insert_with(|| serde_json::Value::Object(serde_json::Map::new()));
    if !details.is_object() {
        *details = serde_json::Value::Object(serde_json::Map::new());
    }
    if let serde_json::Value::Object(details) = details {
        let own = details
            .get("retryAfterSeconds")
            .and_then(serde_json::Value::as_u64)
            .and_then(|own| u32::try_from(own).ok())
            .unwrap_or(0);
        details.insert("retryAfterSeconds".into(), own.max(seconds).into());
    }
    serde_json::Value::Object(status).to_string().into_bytes()
}

/// The API server's `reason` for `code`, as its own `Status` would say it; kube-rs's words for
/// a body it cannot parse otherwise.
fn reason_of(code: http::StatusCode) -> &'static str {
    match code.as_u16() {
        429 => "TooManyRequests",
        500 => "InternalError",
        503 => "ServiceUnavailable",
        504 => "Timeout",
        _ => "Failed to parse error data",
    }
}

/// A body of one chunk, or of the failure to read one.
struct Once(Option<Result<hyper::body::Bytes, tower::BoxError>>);

impl http_body::Body for Once {
    type Data = hyper::body::Bytes;
    type Error = tower::BoxError;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        std::task::Poll::Ready(
            self.get_mut()
                .0
                .take()
                .map(|chunk| chunk.map(http_body::Frame::data)),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn refused(path: &Path) -> ApiError {
        match connect(Some(path)).await {
            Err(err) => err,
            Ok(_) => panic!("{} was accepted", path.display()),
        }
    }

    /// The body of `reply`, which is one chunk here.
    async fn text(reply: Reply) -> String {
        let mut body = reply.into_body();
        let frame = std::future::poll_fn(|cx| {
            http_body::Body::poll_frame(std::pin::Pin::new(&mut body), cx)
        })
        .await;
        let data = frame
            .and_then(Result::ok)
            .and_then(|f| f.into_data().ok())
            .unwrap_or_default();
        String::from_utf8_lossy(&data).into_owned()
    }

    fn reply(code: u16, content_type: &str, retry_after: &str, body: &str) -> Reply {
        let body: Box<::kube::client::DynBody> =
            Box::new(Once(Some(Ok(hyper::body::Bytes::from(body.to_owned())))));
        http::Response::builder()
            .status(code)
            .header("content-type", content_type)
            .header("retry-after", retry_after)
            .body(body)
            .unwrap()
    }

    /// What the client's Retry-After layer hands kube-rs for `reply`.
    async fn kept(reply: Reply) -> Reply {
        keep_retry_after(reply).await.unwrap()
    }

    /// The `details.retryAfterSeconds` kube-rs reads from `reply`'s body, and its `Status`.
    async fn waited(reply: Reply) -> (Option<u32>, ::kube::core::Status) {
        let status: ::kube::core::Status = serde_json::from_str(&text(reply).await).unwrap();
        (
            status.details.as_ref().map(|d| d.retry_after_seconds),
            status,
        )
    }

    fn status_body(code: u16, reason: &str, retry_after_seconds: Option<u32>) -> String {
        let mut status = serde_json::json!({"kind": "Status", "apiVersion": "v1",
            "metadata": {}, "status": "Failure", "message": "slow down", "reason": reason,
            "code": code, "details": {"name": "n", "kind": "nodes"}});
        if let Some(seconds) = retry_after_seconds {
            status["details"]["retryAfterSeconds"] = seconds.into();
        }
        status.to_string()
    }

    #[tokio::test]
    async fn a_status_without_retry_after_seconds_gets_the_headers_seconds() {
        for (code, reason) in [(429, "TooManyRequests"), (503, "ServiceUnavailable")] {
            let body = status_body(code, reason, None);
            let (seconds, status) =
                waited(kept(reply(code, "application/json", "2", &body)).await).await;
            assert_eq!(seconds, Some(2), "{code}");
            // Everything else in the Status is kept.
            assert_eq!(
                (status.code, status.reason.as_str(), status.message.as_str()),
                (code, reason, "slow down")
            );
            assert_eq!(status.details.unwrap().name, "n");
        }
        // Any 5xx asks, as in client-go; a Status with no details at all gets them.
        let bare = r#"{"kind":"Status","code":500,"reason":"InternalError"}"#;
        let (seconds, _) = waited(kept(reply(500, "application/json", "4", bare)).await).await;
        assert_eq!(seconds, Some(4));
    }

    #[tokio::test]
    async fn the_longer_of_the_bodys_and_the_headers_wait_is_kept() {
        // The body asks longer: the body's wait.
        let body = status_body(429, "TooManyRequests", Some(7));
        let (seconds, _) = waited(kept(reply(429, "application/json", "2", &body)).await).await;
        assert_eq!(seconds, Some(7));
        // The header asks longer: the header's wait (client-go's retry waits the header's).
        let body = status_body(429, "TooManyRequests", Some(1));
        let (seconds, _) = waited(kept(reply(429, "application/json", "5", &body)).await).await;
        assert_eq!(seconds, Some(5));
    }

    #[tokio::test]
    async fn a_plain_text_429_or_5xx_becomes_a_status_with_the_headers_seconds() {
        let plain = "text/plain; charset=utf-8";
        let (seconds, status) = waited(kept(reply(429, plain, "3", "busy\n")).await).await;
        assert_eq!(seconds, Some(3));
        assert_eq!(
            (status.code, status.reason.as_str(), status.message.as_str()),
            (429, "TooManyRequests", "busy")
        );
        let (seconds, status) = waited(kept(reply(503, plain, "2", "upstream down")).await).await;
        assert_eq!(seconds, Some(2));
        assert_eq!(
            (status.code, status.reason.as_str(), status.message.as_str()),
            (503, "ServiceUnavailable", "upstream down")
        );
        let (_, status) = waited(kept(reply(502, plain, "2", "")).await).await;
        assert_eq!(status.message, "Bad Gateway");
    }

    #[tokio::test]
    async fn a_retry_after_as_an_http_date_waits_until_that_date() {
        let at = std::time::SystemTime::now() + std::time::Duration::from_secs(30);
        let date = httpdate::fmt_http_date(at);
        let body = status_body(503, "ServiceUnavailable", None);
        let (seconds, _) = waited(kept(reply(503, "application/json", &date, &body)).await).await;
        // The date has whole seconds: 29 or 30 of them are left, never more.
        let seconds = seconds.unwrap();
        assert!((29..=30).contains(&seconds), "{seconds}");
    }

    #[tokio::test]
    async fn an_answer_that_asks_for_no_wait_passes_untouched() {
        let body = status_body(429, "TooManyRequests", None);
        let past = "Wed, 21 Oct 2015 07:28:00 GMT";
        // No header, a zero, a date already past, a value in neither form.
        for header in [None, Some("0"), Some(past), Some("soon")] {
            let mut answer = reply(429, "application/json", "", &body);
            match header {
                Some(value) => {
                    answer
                        .headers_mut()
                        .insert("retry-after", http::HeaderValue::from_static(value));
                }
                None => {
                    answer.headers_mut().remove("retry-after");
                }
            }
            assert_eq!(text(kept(answer).await).await, body, "{header:?}");
        }
        // Neither a 429 nor a 5xx: not a request to wait, as in client-go.
        for code in [200, 409, 403] {
            let answer = reply(code, "text/plain", "3", "as sent");
            assert_eq!(text(kept(answer).await).await, "as sent", "{code}");
        }
    }

    #[tokio::test]
    async fn an_error_body_past_the_cap_still_fails_to_read() {
        let huge: Box<::kube::client::DynBody> =
            Box::new(Once(Some(Ok(hyper::body::Bytes::from(vec![
                b'x';
                MAX_RESPONSE_BYTES
                    + 1
            ])))));
        let answer = http::Response::builder()
            .status(503)
            .header("retry-after", "2")
            .body(huge)
            .unwrap();
        let mut body = kept(limit_body(answer)).await.into_body();
        let frame = std::future::poll_fn(|cx| {
            http_body::Body::poll_frame(std::pin::Pin::new(&mut body), cx)
        })
        .await
        .unwrap();
        assert!(
            frame
                .unwrap_err()
                .to_string()
                .contains("length limit exceeded"),
            "an answer past the cap read whole"
        );
    }

    #[tokio::test]
    async fn a_kubeconfig_that_is_a_fifo_or_a_device_is_refused_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("kubeconfig");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRUSR).unwrap();
        let err = refused(&fifo).await;
        assert_eq!(
            err.to_string(),
            format!(
                "cannot configure the Kubernetes client: {}: is a FIFO, not a regular file; \
                 refused without reading (name the file itself)",
                fifo.display()
            )
        );
        let err = refused(Path::new("/dev/zero")).await;
        assert!(err.to_string().contains("is a character device"), "{err}");
    }

    #[tokio::test]
    async fn an_answer_past_the_cap_fails_to_read_and_a_normal_one_passes() {
        let body = |n: usize| -> Reply {
            let body: Box<::kube::client::DynBody> =
                Box::new(Once(Some(Ok(hyper::body::Bytes::from(vec![b'x'; n])))));
            http::Response::new(body)
        };
        let frame = |reply: Reply| async move {
            let mut body = reply.into_body();
            std::future::poll_fn(|cx| {
                http_body::Body::poll_frame(std::pin::Pin::new(&mut body), cx)
            })
            .await
        };
        let small = frame(limit_body(body(1024))).await.unwrap().unwrap();
        assert_eq!(small.into_data().unwrap().len(), 1024);
        let huge = frame(limit_body(body(MAX_RESPONSE_BYTES + 1)))
            .await
            .unwrap();
        assert!(
            huge.unwrap_err()
                .to_string()
                .contains("length limit exceeded")
        );
    }
}
