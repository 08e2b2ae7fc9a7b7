//! Logging setup: `tracing` to stderr, as text or JSON, filtered by `GPUD_LOG`.

use clap::ValueEnum;
use tracing_subscriber::EnvFilter;

/// Environment variable holding the log filter (`info`, `gpud=debug`, …).
pub const FILTER_ENV: &str = "GPUD_LOG";

/// Log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line, for log shippers.
    Json,
}

/// Installs the global subscriber. Calling it twice is harmless (the second call is ignored),
/// so applets can call it unconditionally.
pub fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_env(FILTER_ENV).unwrap_or_else(|_| EnvFilter::new("info"));
    // Colours only for a terminal: journald and log shippers get plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => builder.with_target(false).try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
}

/// Starts a named thread whose log lines carry the caller's span, so a line written by a
/// subsystem's helper thread still says which subsystem it belongs to.
pub fn spawn_thread<F, T>(name: &str, run: F) -> std::io::Result<std::thread::JoinHandle<T>>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    let span = tracing::Span::current();
    std::thread::Builder::new()
        .name(name.to_owned())
        .spawn(move || span.in_scope(run))
}

/// Spawns a task whose log lines carry the caller's span (`tokio::spawn` alone would drop it,
/// and the line would not say which subsystem wrote it). clippy denies `tokio::spawn` elsewhere.
#[allow(clippy::disallowed_methods)]
pub fn spawn<F>(task: F) -> tokio::task::JoinHandle<F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    tokio::spawn(tracing::Instrument::in_current_span(task))
}

/// An error with its causes, `outer: inner: innermost`, for log lines and messages. tonic's
/// and hyper's errors say little on their own (`transport error`) and keep the reason in their
/// `source()` chain, which `Display` leaves out. A cause already spelled at the end of the
/// text so far (an error that formats its source into its own message) is not repeated.
pub fn error_chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.ends_with(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("cannot connect to the kubelet at /k.sock: {0}")]
    struct Outer(#[source] Middle);

    #[derive(Debug, thiserror::Error)]
    #[error("transport error")]
    struct Middle(#[source] std::io::Error);

    #[test]
    fn error_chain_spells_every_cause_once() {
        let refused =
            std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "Connection refused");
        let err = Outer(Middle(refused));
        assert_eq!(
            error_chain(&err),
            "cannot connect to the kubelet at /k.sock: transport error: Connection refused"
        );
        let alone = std::io::Error::other("plain");
        assert_eq!(error_chain(&alone), "plain");
    }
}
