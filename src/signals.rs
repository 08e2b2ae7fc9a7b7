//! Process signals: the shutdown future every long-running applet waits on.

use tokio::signal::unix::{SignalKind, signal};

/// Resolves on the first SIGINT or SIGTERM. If the handlers cannot be installed (which only
/// happens when the runtime lacks signal support), it resolves never rather than at once, so a
/// daemon keeps running and can still be killed.
pub async fn shutdown() {
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        std::future::pending::<()>().await;
        return;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}
