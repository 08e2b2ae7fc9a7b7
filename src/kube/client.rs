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
    let keep_retry_after: fn(Reply) -> Reply = retry_after_status;
    let bounded: fn(Reply) -> Reply = limit_body;
    Ok(builder
        .with_layer(&super::pace::PaceLayer(super::pace::pacer()))
        .with_layer(&tower::util::MapResponseLayer::new(keep_retry_after))
        .with_layer(&tower::util::MapResponseLayer::new(bounded))
        .build())
}

fn limit_body(reply: Reply) -> Reply {
    let (parts, body) = reply.into_parts();
    let limited: Box<::kube::client::DynBody> =
        Box::new(http_body_util::Limited::new(body, MAX_RESPONSE_BYTES));
    http::Response::from_parts(parts, limited)
}

type Reply = http::Response<Box<::kube::client::DynBody>>;

/// Gives a 429 whose body is not a `Status` (priority and fairness and max-in-flight answer
/// in plain text, as may a proxy) a `Status` body that carries its `Retry-After` header as
/// `details.retryAfterSeconds`: kube-rs keeps an error response's body and drops its headers,
/// and [`ApiError::retry_after`] reads the body. The header may be seconds or an HTTP date
/// (a proxy's), which becomes the seconds left until then. A `Status` body is left as it is
/// (the API server sets `retryAfterSeconds` in it together with the header).
fn retry_after_status(reply: Reply) -> Reply {
    if reply.status() != http::StatusCode::TOO_MANY_REQUESTS {
        return reply;
    }
    let headers = reply.headers();
    let is_json = headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    let wait = headers
        .get(http::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| super::call::retry_after_header(v, std::time::SystemTime::now()))
        .and_then(|wait| u32::try_from(wait.as_secs()).ok());
    let Some(seconds) = wait.filter(|_| !is_json) else {
        return reply;
    };
    let status = serde_json::json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": "Too many requests, please try again later.", "reason": "TooManyRequests",
        "code": 429, "details": {"retryAfterSeconds": seconds},
    });
    let (mut parts, _) = reply.into_parts();
    parts.headers.insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    let body: Box<::kube::client::DynBody> =
        Box::new(Once(Some(hyper::body::Bytes::from(status.to_string()))));
    http::Response::from_parts(parts, body)
}

/// A body of one chunk.
struct Once(Option<hyper::body::Bytes>);

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
                .map(|b| Ok(http_body::Frame::data(b))),
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
            Box::new(Once(Some(hyper::body::Bytes::from(body.to_owned()))));
        http::Response::builder()
            .status(code)
            .header("content-type", content_type)
            .header("retry-after", retry_after)
            .body(body)
            .unwrap()
    }

    #[tokio::test]
    async fn a_plain_text_429_keeps_its_retry_after_in_a_status() {
        let mapped = retry_after_status(reply(429, "text/plain; charset=utf-8", "3", "busy\n"));
        let status: ::kube::core::Status = serde_json::from_str(&text(mapped).await).unwrap();
        assert_eq!(status.code, 429);
        assert_eq!(status.details.map(|d| d.retry_after_seconds), Some(3));
        // A Status body, another status or an HTTP-date is left as it is.
        let json = r#"{"kind":"Status","code":429}"#;
        let kept = retry_after_status(reply(429, "application/json", "3", json));
        assert_eq!(text(kept).await, json);
        let kept = retry_after_status(reply(503, "text/plain", "3", "down"));
        assert_eq!(text(kept).await, "down");
        // A date already past asks for no wait.
        let date = "Wed, 21 Oct 2015 07:28:00 GMT";
        let kept = retry_after_status(reply(429, "text/plain", date, "busy"));
        assert_eq!(text(kept).await, "busy");
    }

    #[tokio::test]
    async fn a_plain_text_429_with_an_http_date_waits_until_that_date() {
        let at = std::time::SystemTime::now() + std::time::Duration::from_secs(30);
        let date = httpdate::fmt_http_date(at);
        let mapped = retry_after_status(reply(429, "text/plain", &date, "busy\n"));
        let status: ::kube::core::Status = serde_json::from_str(&text(mapped).await).unwrap();
        let seconds = status.details.map(|d| d.retry_after_seconds).unwrap();
        // The date has whole seconds: 29 or 30 of them are left, never more.
        assert!((29..=30).contains(&seconds), "{seconds}");
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
                Box::new(Once(Some(hyper::body::Bytes::from(vec![b'x'; n]))));
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
