//! A relay's metrics, through the `metrics` facade (no-op handles without a recorder),
//! labelled `outbox` with the relay's name; listed in docs/guide/operations.md.

use std::time::SystemTime;

use justonce_core::{OutboxFailure, OutboxStats};
use metrics::{Counter, Gauge, Label};

pub(super) struct RelayInstruments {
    /// Rows published and marked sent.
    pub(super) sent: Counter,
    retrying: Counter,
    dead: Counter,
    /// Passes that failed for a reason that was not a row's.
    pub(super) pauses: Counter,
    pending: Gauge,
    leased: Gauge,
    dead_rows: Gauge,
    lag: Gauge,
}

impl RelayInstruments {
    pub(super) fn register(name: &str) -> Self {
        let labels = || vec![Label::new("outbox", name.to_owned())];
        let failed = |outcome: &'static str| {
            let mut l = labels();
            l.push(Label::new("outcome", outcome));
            metrics::counter!("justonce_outbox_publish_failures_total", l)
        };
        metrics::describe_counter!(
            "justonce_outbox_sent_total",
            "Outbox rows published (confirmed) and marked sent"
        );
        metrics::describe_counter!(
            "justonce_outbox_publish_failures_total",
            "Outbox rows whose publish was refused: retrying, or dead after the last attempt"
        );
        metrics::describe_gauge!(
            "justonce_outbox_lag_seconds",
            "Age of the oldest outbox row not yet sent (0 when none)"
        );
        RelayInstruments {
            sent: metrics::counter!("justonce_outbox_sent_total", labels()),
            retrying: failed("retrying"),
            dead: failed("dead"),
            pauses: metrics::counter!("justonce_outbox_relay_pauses_total", labels()),
            pending: metrics::gauge!("justonce_outbox_pending", labels()),
            leased: metrics::gauge!("justonce_outbox_leased", labels()),
            dead_rows: metrics::gauge!("justonce_outbox_dead", labels()),
            lag: metrics::gauge!("justonce_outbox_lag_seconds", labels()),
        }
    }

    pub(super) fn failed(&self, fate: OutboxFailure) {
        match fate {
            OutboxFailure::Retrying => self.retrying.increment(1),
            OutboxFailure::Dead => self.dead.increment(1),
        }
    }

    pub(super) fn stats(&self, s: &OutboxStats) {
        self.pending.set(s.pending as f64);
        self.leased.set(s.leased as f64);
        self.dead_rows.set(s.dead as f64);
        let lag = s
            .oldest
            .and_then(|t| SystemTime::now().duration_since(t).ok())
            .map_or(0.0, |d| d.as_secs_f64());
        self.lag.set(lag);
    }
}
