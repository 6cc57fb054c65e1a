//! The command's log: stderr, filtered by `JUSTONCE_LOG`, as text or JSON lines.

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::EnvFilter;

/// Logs to stderr, filtered by `JUSTONCE_LOG`; as one JSON object per line when
/// `JUSTONCE_LOG_FORMAT=json`, for log pipelines: each event with the spans it is in, and a
/// line when a span closes, so `JUSTONCE_LOG=justonce=info` gives one line per batch with
/// what it came to (and `debug`, one per delivery with its outcome).
pub(crate) fn init(default: &str) {
    let filter =
        EnvFilter::try_from_env("JUSTONCE_LOG").unwrap_or_else(|_| EnvFilter::new(default));
    let registry = tracing_subscriber::registry()
        .with(filter)
        .with(QuietChecks);
    let _ = match std::env::var("JUSTONCE_LOG_FORMAT").as_deref() {
        Ok("json") => registry
            .with(
                tracing_subscriber::fmt::layer()
                    .json()
                    .with_current_span(true)
                    .with_span_list(true)
                    .with_span_events(tracing_subscriber::fmt::format::FmtSpan::CLOSE)
                    .with_writer(std::io::stderr),
            )
            .try_init(),
        _ => registry
            .with(
                tracing_subscriber::fmt::layer()
                    .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
                    .with_writer(std::io::stderr),
            )
            .try_init(),
    };
}

/// Drops lapin's `Channel closed` errors for a `NOT_FOUND`: RabbitMQ answers a passive
/// declaration of a queue or exchange that does not exist by closing the channel, and lapin
/// logs every closed channel at ERROR. justonce asks that way on purpose (what exists before
/// a declare, what a tool may read), on a channel of its own, and says in its own words when
/// a missing part is a problem; any other closed channel is still logged.
struct QuietChecks;

impl<S: Subscriber> Layer<S> for QuietChecks {
    fn event_enabled(&self, event: &Event<'_>, _: Context<'_, S>) -> bool {
        let meta = event.metadata();
        if *meta.level() != Level::ERROR || !meta.target().starts_with("lapin") {
            return true;
        }
        let mut fields = Fields::default();
        event.record(&mut fields);
        !expected_check(&fields.message, &fields.rest)
    }
}

/// Whether lapin's event is a channel closed by a `NOT_FOUND` (reply code 404).
fn expected_check(message: &str, rest: &str) -> bool {
    message == "Channel closed" && rest.contains("NOT_FOUND")
}

#[derive(Default)]
struct Fields {
    message: String,
    rest: String,
}

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.message = format!("{value:?}");
        } else {
            self.rest.push_str(&format!("{value:?} "));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_channel_closed_for_a_missing_part_is_quiet() {
        let missing = r#"AMQPError { kind: Soft(NOTFOUND), message: "NOT_FOUND - no queue 'billing.dlq' in vhost '/'" }"#;
        assert!(expected_check("Channel closed", missing));
        let refused = r#"AMQPError { kind: Soft(PRECONDITIONFAILED), message: "PRECONDITION_FAILED - inequivalent arg 'x-queue-type'" }"#;
        assert!(!expected_check("Channel closed", refused));
        assert!(!expected_check("Connection closed", missing));
    }
}
