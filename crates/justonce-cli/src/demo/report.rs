//! The demo's result: one JSON object (DESIGN.md's CLI contract) or a table.

use std::fmt::Write as _;

use serde::Serialize;

use super::plan::FaultCounts;

/// The whole demo, as `--json` prints it.
#[derive(Debug, Serialize)]
pub(crate) struct Report {
    pub(crate) messages: u64,
    pub(crate) seed: u64,
    pub(crate) transport: String,
    pub(crate) store: String,
    pub(crate) strategy: String,
    pub(crate) id_strategy: String,
    /// The faults the seed planned (crash counts: messages marked to crash their batch).
    pub(crate) faults: FaultCounts,
    pub(crate) rows: Vec<Row>,
}

/// One semantic's run. Every count is read from the data: `effects`, `lost` and
/// `duplicate_effects` from the business tables, `deliveries` and `dead_lettered` from
/// the queue's tables.
#[derive(Debug, Serialize)]
pub(crate) struct Row {
    pub(crate) semantics: String,
    pub(crate) sent: u64,
    pub(crate) deliveries: u64,
    pub(crate) handler_runs: u64,
    pub(crate) effects: u64,
    pub(crate) lost: u64,
    pub(crate) duplicate_effects: u64,
    pub(crate) dead_lettered: u64,
    pub(crate) seconds: f64,
    pub(crate) msgs_per_sec: f64,
    /// The crashes and lost acks that actually happened in this run.
    pub(crate) faults_fired: FaultCounts,
}

impl Report {
    pub(crate) fn to_table(&self) -> String {
        let f = &self.faults;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "justonce demo: {} orders, seed {}, transport {}, store {}, strategy {}, ids {}",
            self.messages, self.seed, self.transport, self.store, self.strategy, self.id_strategy
        );
        let _ = writeln!(
            out,
            "faults planned: {} duplicate publishes, {} poison, crash marks: {} before commit, \
             {} after commit, {} lost acks, {} after ack\n",
            f.duplicate_publishes,
            f.poison,
            f.crash_before_commit,
            f.crash_after_commit,
            f.ack_lost,
            f.crash_after_ack
        );
        let _ = writeln!(
            out,
            "{:<17} {:>7} {:>10} {:>9} {:>8} {:>6} {:>10} {:>13} {:>8} {:>8}",
            "semantics",
            "sent",
            "deliveries",
            "handler",
            "effects",
            "lost",
            "duplicate",
            "dead-lettered",
            "seconds",
            "msg/s"
        );
        for r in &self.rows {
            let _ = writeln!(
                out,
                "{:<17} {:>7} {:>10} {:>9} {:>8} {:>6} {:>10} {:>13} {:>8.2} {:>8.0}",
                r.semantics,
                r.sent,
                r.deliveries,
                r.handler_runs,
                r.effects,
                r.lost,
                r.duplicate_effects,
                r.dead_lettered,
                r.seconds,
                r.msgs_per_sec
            );
        }
        out.push('\n');
        for r in &self.rows {
            let _ = writeln!(out, "{}", self.explain(r));
        }
        if self.id_strategy == "fresh-uuid" {
            let _ = writeln!(
                out,
                "\nfresh-uuid: the publisher gave each of its {} retries a new UUID, so dedup saw new \
                 messages and applied them again: a producer id regenerated on retry defeats dedup; \
                 use the business id (or a content hash) as the message id.",
                f.duplicate_publishes
            );
        }
        out
    }

    fn explain(&self, r: &Row) -> String {
        let fired = &r.faults_fired;
        match r.semantics.as_str() {
            "at-most-once" => format!(
                "at-most-once: acks before handling, so the {} batches that crashed after their ack \
                 and the {} that crashed before commit lost {} orders; the {} duplicate publishes \
                 were still applied twice ({} duplicate effects).",
                fired.crash_after_ack, fired.crash_before_commit, r.lost, self.faults.duplicate_publishes,
                r.duplicate_effects
            ),
            "at-least-once" => format!(
                "at-least-once: acks after commit, so nothing is lost ({} lost), but the {} batches \
                 that crashed after commit, the {} lost acks and the {} duplicate publishes were \
                 delivered again and applied again: {} duplicate effects.",
                r.lost, fired.crash_after_commit, fired.ack_lost, self.faults.duplicate_publishes,
                r.duplicate_effects
            ),
            _ => format!(
                "effectively-once: the dedup record commits with the payment, so a delivery after \
                 a commit finds its key and is acked without a second effect (the handler ran {} \
                 times for {} deliveries), and one after a rollback finds no key and applies once: \
                 {} lost, {} duplicate effects; {} poison messages dead-lettered with a reason.",
                r.handler_runs, r.deliveries, r.lost, r.duplicate_effects, r.dead_lettered
            ),
        }
    }
}
