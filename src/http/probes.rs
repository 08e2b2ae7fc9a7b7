//! Liveness and readiness answers, as routes any gpud HTTP server can carry: `/healthz` is `ok`
//! while the process serves, `/readyz` is `ok` once the owner said it is ready (503 before).

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use tokio::sync::watch;

/// The probe routes, and the call that turns `/readyz` ready (once; later calls change nothing).
pub fn probes() -> (Router, Box<dyn FnOnce() + Send>) {
    let (ready_tx, ready_rx) = watch::channel(false);
    let router = Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(ready_rx);
    let on_ready = Box::new(move || {
        ready_tx.send_replace(true);
    });
    (router, on_ready)
}

async fn healthz() -> &'static str {
    "ok"
}

async fn readyz(State(ready): State<watch::Receiver<bool>>) -> (StatusCode, &'static str) {
    if *ready.borrow() {
        (StatusCode::OK, "ok")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready")
    }
}

#[cfg(test)]
mod tests {
    use axum::body::Body;
    use axum::http::Request;
    use hyper::service::Service;
    use hyper_util::service::TowerToHyperService;

    use super::*;

    async fn get(router: &Router, path: &str) -> (StatusCode, String) {
        let request = Request::get(path).body(Body::empty()).unwrap();
        let service = TowerToHyperService::new(router.clone());
        let response = service.call(request).await.unwrap();
        let status = response.status();
        let body = axum::body::to_bytes(response.into_body(), 1024)
            .await
            .unwrap();
        (status, String::from_utf8(body.to_vec()).unwrap())
    }

    #[tokio::test]
    async fn readyz_turns_ready_when_told() {
        let (router, on_ready) = probes();
        assert_eq!(
            get(&router, "/healthz").await,
            (StatusCode::OK, "ok".into())
        );
        assert_eq!(
            get(&router, "/readyz").await,
            (StatusCode::SERVICE_UNAVAILABLE, "not ready".into())
        );
        on_ready();
        assert_eq!(get(&router, "/readyz").await, (StatusCode::OK, "ok".into()));
    }
}
