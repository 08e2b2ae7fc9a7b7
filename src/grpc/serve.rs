//! Running a gRPC server on a bound socket until told to stop, the one way every gpud service
//! the kubelet talks to runs: connections wrapped by [`super::incoming`] (any `:authority`),
//! a task in the caller's span, and a failure logged with its cause rather than lost.

use tokio::net::UnixListener;
use tokio_util::sync::CancellationToken;
use tracing::error;

/// Serves `router` on `listener` in a task until `stop` is cancelled; `what` names the server
/// in the log line of a failure.
pub fn spawn(
    router: tonic::transport::server::Router,
    listener: UnixListener,
    stop: CancellationToken,
    what: String,
) {
    crate::logging::spawn(async move {
        let served = router
            .serve_with_incoming_shutdown(super::incoming(listener), stop.cancelled())
            .await;
        if let Err(err) = served {
            error!(server = %what, error = %crate::logging::error_chain(&err), "gRPC server failed");
        }
    });
}
