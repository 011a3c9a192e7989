//! Log output of the daemons: `tracing` events, one line each, on stderr.
//!
//! [`init`] installs the subscriber and enters a root span carrying the
//! daemon's name and id, so every line says which process wrote it. Stdout
//! is left alone: the daemons print their `ready …` line there.

use std::fmt;
use std::io::IsTerminal;
use std::str::FromStr;

use tracing::Subscriber;
use tracing::span::EnteredSpan;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::filter::{Directive, LevelFilter};
use tracing_subscriber::fmt::MakeWriter;

/// Name and target of the root span; its fields are `daemon` and `id`.
pub const ROOT_SPAN: &str = "pmem_fabric";

/// How log lines are written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum LogFormat {
    /// For people:
    /// `2025-01-01T00:00:00.000000Z  INFO pmem_fabric{daemon=pmem-server id=S}: pmem_server::cli: stopped cleanly`.
    #[default]
    Text,
    /// One JSON object a line (tracing-subscriber's JSON formatter): the
    /// event's fields at the top level, the root span's under `spans`.
    Json,
}

impl FromStr for LogFormat {
    type Err = ParseLogFormatError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "text" => Ok(Self::Text),
            "json" => Ok(Self::Json),
            _ => Err(ParseLogFormatError(text.to_owned())),
        }
    }
}

impl fmt::Display for LogFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Text => "text",
            Self::Json => "json",
        })
    }
}

/// A log format other than `text` or `json`.
#[derive(Debug, Clone, thiserror::Error)]
#[error("unknown log format {0:?}: expected text or json")]
pub struct ParseLogFormatError(String);

/// Keeps the root span entered on the thread that called [`init`].
#[must_use = "the root span is left when the guard is dropped"]
#[derive(Debug)]
pub struct LogGuard {
    _root: EnteredSpan,
}

/// Sends `tracing` events to stderr in `format`, at the levels `RUST_LOG`
/// enables (`info` when it is unset or empty), and enters the root span
/// [`ROOT_SPAN`] with `daemon` and `id` on the calling thread.
///
/// Other threads log inside the root span only when they enter it: take
/// [`tracing::Span::current`] before spawning and enter it in the thread.
/// A subscriber already installed (a second call in one process) is kept.
pub fn init(daemon: &str, id: &str, format: LogFormat) -> LogGuard {
    let ansi = format == LogFormat::Text && std::io::stderr().is_terminal();
    let filter = EnvFilter::builder()
        .with_default_directive(LevelFilter::INFO.into())
        .from_env_lossy();
    let _ =
        tracing::subscriber::set_global_default(subscriber(format, filter, std::io::stderr, ansi));
    LogGuard {
        _root: root_span(daemon, id).entered(),
    }
}

/// The root span for `daemon` `id`, at level ERROR so that no level in
/// `RUST_LOG` drops it (short of `off`).
pub fn root_span(daemon: &str, id: &str) -> tracing::Span {
    tracing::error_span!(target: ROOT_SPAN, ROOT_SPAN, daemon = %daemon, id = %id)
}

/// A subscriber writing `format` lines to `writer`, filtered by `filter`
/// except for the root span, which is always enabled (`RUST_LOG=pmem_server=debug`
/// would otherwise drop it and the daemon's name and id with it).
fn subscriber<W>(
    format: LogFormat,
    filter: EnvFilter,
    writer: W,
    ansi: bool,
) -> Box<dyn Subscriber + Send + Sync>
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let filter = match format!("{ROOT_SPAN}=error").parse::<Directive>() {
        Ok(root) => filter.add_directive(root),
        Err(_) => filter,
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer)
        .with_ansi(ansi);
    match format {
        LogFormat::Text => Box::new(builder.finish()),
        LogFormat::Json => Box::new(
            builder
                .json()
                .flatten_event(true)
                .with_current_span(false)
                .with_span_list(true)
                .finish(),
        ),
    }
}

/// An error and its causes on one line: `error: cause: cause of the cause`.
pub fn error_chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io;
    use std::sync::{Arc, Mutex, PoisonError};

    /// Collects what a subscriber writes.
    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);

    impl Buffer {
        fn text(&self) -> String {
            String::from_utf8_lossy(&self.0.lock().unwrap_or_else(PoisonError::into_inner))
                .into_owned()
        }
    }

    impl io::Write for Buffer {
        fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
            self.0
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .extend_from_slice(bytes);
            Ok(bytes.len())
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    impl MakeWriter<'_> for Buffer {
        type Writer = Buffer;

        fn make_writer(&self) -> Buffer {
            self.clone()
        }
    }

    /// Logs a few events inside the root span with `filter`; returns the lines.
    fn lines(format: LogFormat, filter: &str) -> Vec<String> {
        let buffer = Buffer::default();
        let subscriber = subscriber(format, EnvFilter::new(filter), buffer.clone(), false);
        tracing::subscriber::with_default(subscriber, || {
            let _root = root_span("pmem-server", "S").entered();
            tracing::debug!(peer = "10.0.0.1:7", "connection accepted");
            tracing::info!("stopped cleanly");
            tracing::warn!(error = "gone", "reload refused, keeping the old map");
        });
        buffer.text().lines().map(str::to_owned).collect()
    }

    #[test]
    fn text_lines_carry_the_daemon_and_its_id() {
        let lines = lines(LogFormat::Text, "info");
        assert_eq!(lines.len(), 2, "{lines:#?}");
        assert!(
            lines[0].contains(" INFO pmem_fabric{daemon=pmem-server id=S}: "),
            "{}",
            lines[0]
        );
        assert!(lines[0].ends_with(": stopped cleanly"), "{}", lines[0]);
        assert!(lines[1].contains(" WARN "), "{}", lines[1]);
        assert!(
            lines[1].ends_with("reload refused, keeping the old map error=\"gone\""),
            "{}",
            lines[1]
        );
    }

    #[test]
    fn json_lines_are_objects_with_the_root_span() {
        let lines = lines(LogFormat::Json, "debug");
        assert_eq!(lines.len(), 3, "{lines:#?}");
        let first: serde_json::Value = serde_json::from_str(&lines[0]).expect("JSON");
        assert_eq!(first["level"], "DEBUG");
        assert_eq!(first["message"], "connection accepted");
        assert_eq!(first["peer"], "10.0.0.1:7");
        assert_eq!(first["spans"][0]["name"], ROOT_SPAN);
        assert_eq!(first["spans"][0]["daemon"], "pmem-server");
        assert_eq!(first["spans"][0]["id"], "S");
    }

    #[test]
    fn the_root_span_survives_any_filter() {
        for filter in ["warn", "error", "pmem_server=debug,warn"] {
            let lines = lines(LogFormat::Text, filter);
            assert_eq!(
                lines.len(),
                usize::from(filter != "error"),
                "{filter}: {lines:#?}"
            );
            for line in lines {
                assert!(
                    line.contains("pmem_fabric{daemon=pmem-server id=S}"),
                    "{line}"
                );
            }
        }
    }

    #[test]
    fn formats_parse_and_print() {
        for format in [LogFormat::Text, LogFormat::Json] {
            assert_eq!(format.to_string().parse::<LogFormat>().ok(), Some(format));
        }
        let err = "yaml".parse::<LogFormat>().unwrap_err();
        assert_eq!(
            err.to_string(),
            "unknown log format \"yaml\": expected text or json"
        );
    }

    #[test]
    fn error_chain_joins_the_causes() {
        let inner = io::Error::new(io::ErrorKind::NotFound, "no such file");
        assert_eq!(
            error_chain(&ParseFailure(inner)),
            "bad config: no such file"
        );
    }

    #[derive(Debug, thiserror::Error)]
    #[error("bad config")]
    struct ParseFailure(#[source] io::Error);
}
