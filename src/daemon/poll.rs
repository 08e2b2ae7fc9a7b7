//! A value read from the host's files and followed by polling, for state another process
//! keeps in a file where no notification says it changed: the MPS daemons' `.started`
//! markers, the DRA checkpoint of a plugin in another container.

use std::time::Duration;

use tokio::sync::watch;

/// Reads `read` every `interval` and publishes its answers: the receiver starts at `initial`
/// and changes only when an answer differs from what it holds; `None` keeps it. `read` runs on
/// the runtime and must be quick (a stat, a small file). The polling ends once every receiver
/// is dropped.
pub fn follow<T>(
    initial: T,
    interval: Duration,
    mut read: impl FnMut() -> Option<T> + Send + 'static,
) -> watch::Receiver<T>
where
    T: PartialEq + Send + Sync + 'static,
{
    let (tx, rx) = watch::channel(initial);
    crate::logging::spawn(async move {
        while !tx.is_closed() {
            tokio::time::sleep(interval).await;
            if let Some(now) = read() {
                tx.send_if_modified(|held| {
                    let changed = *held != now;
                    if changed {
                        *held = now;
                    }
                    changed
                });
            }
        }
    });
    rx
}
