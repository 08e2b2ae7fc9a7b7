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
