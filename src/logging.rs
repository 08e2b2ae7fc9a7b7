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
    // Read through tracing's own parser (it is what reads the environment); its directives
    // come back as text to add gpud's default to.
    let wanted = EnvFilter::try_from_env(FILTER_ENV)
        .ok()
        .map(|f| f.to_string());
    let filter = filter(wanted.as_deref());
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

/// The kube client's HTTP layer logs every failed request at ERROR ("failed with error client
/// error (Connect)"), without saying what the request was for. gpud reports each failed call
/// itself, with what it was doing and what happens next, at the level it deserves; during an
/// API server outage the client's line would add one ERROR per retry on every node.
const KUBE_HTTP_QUIET: &str = "kube_client::client::builder=off";

/// `GPUD_LOG`'s filter (`info` when unset or unreadable), with the kube client's HTTP layer
/// off unless the filter names `kube` itself.
fn filter(wanted: Option<&str>) -> EnvFilter {
    let wanted = wanted.map(str::trim).filter(|w| !w.is_empty());
    let text = match wanted {
        Some(text) if text.contains("kube") => text.to_owned(),
        Some(text) => format!("{text},{KUBE_HTTP_QUIET}"),
        None => format!("info,{KUBE_HTTP_QUIET}"),
    };
    EnvFilter::try_new(&text).unwrap_or_else(|_| EnvFilter::new(format!("info,{KUBE_HTTP_QUIET}")))
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

    /// The lines `filter(wanted)` lets through of an ERROR from the kube client's HTTP layer
    /// and a WARN from gpud.
    fn passed(wanted: Option<&str>) -> String {
        #[derive(Clone, Default)]
        struct Lines(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);
        impl std::io::Write for Lines {
            fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(buf);
                Ok(buf.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let lines = Lines::default();
        let writer = lines.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_env_filter(filter(wanted))
            .with_writer(move || writer.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            tracing::error!(target: "kube_client::client::builder", "failed with error client error (Connect)");
            tracing::warn!(target: "gpud::kube", "Cannot write the node status; retrying");
        });
        String::from_utf8(lines.0.lock().unwrap().clone()).unwrap()
    }

    #[test]
    fn the_kube_clients_own_error_lines_are_off_unless_asked_for() {
        for wanted in [None, Some(""), Some("debug"), Some("gpud=debug,info")] {
            let out = passed(wanted);
            assert!(!out.contains("client error (Connect)"), "{wanted:?}: {out}");
            assert!(
                out.contains("Cannot write the node status"),
                "{wanted:?}: {out}"
            );
        }
        // What `init` hands over: the environment's filter as tracing parsed and printed it.
        let printed = EnvFilter::new("gpud=debug,warn").to_string();
        assert!(
            !passed(Some(&printed)).contains("client error (Connect)"),
            "{printed}"
        );
        let printed = EnvFilter::new("info,kube_client=debug").to_string();
        assert!(
            passed(Some(&printed)).contains("client error (Connect)"),
            "{printed}"
        );
        let out = passed(Some("info,kube_client=debug"));
        assert!(
            out.contains("ERROR") && out.contains("client error (Connect)"),
            "{out}"
        );
    }
}
