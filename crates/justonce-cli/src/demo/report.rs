//! The demo's result: one JSON object (the contract in docs/reference.md) or a table.

use std::fmt::Write as _;

use serde::Serialize;

use super::plan::FaultCounts;

/// The name of the fourth row: effectively-once with the ack in the business transaction.
pub(crate) const EXACTLY_ONCE: &str = "exactly-once (same database)";

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
    /// The transport drops the planned duplicate publishes itself
    /// ([`TransportKind::drops_republished_ids`](justonce::backend::TransportKind::drops_republished_ids)).
    #[serde(skip)]
    pub(crate) broker_dedup: bool,
}

/// One semantic's run. Every count is read from the data: `effects`, `lost` and
/// `duplicate_effects` from the business tables, `deliveries` and `dead_lettered` from
/// the queue's tables (`deliveries` is `null` where the transport does not count them:
/// Kafka keeps positions, not deliveries).
#[derive(Debug, Serialize)]
pub(crate) struct Row {
    pub(crate) semantics: String,
    pub(crate) sent: u64,
    pub(crate) deliveries: Option<u64>,
    pub(crate) handler_runs: u64,
    pub(crate) effects: u64,
    pub(crate) lost: u64,
    pub(crate) duplicate_effects: u64,
    pub(crate) dead_lettered: u64,
    pub(crate) seconds: f64,
    pub(crate) msgs_per_sec: f64,
    /// The crashes and lost acks that actually happened in this run.
    pub(crate) faults_fired: FaultCounts,
    /// Calls the external payment API received (claim strategy only); `effects` are its charges.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) api_calls: Option<u64>,
    /// The second hop's receipts (`--pipeline two-hop` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) receipts: Option<super::hop::Receipts>,
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
        let w = self
            .rows
            .iter()
            .map(|r| r.semantics.len())
            .max()
            .unwrap_or(0)
            .max(17);
        let _ = writeln!(
            out,
            "{:<w$} {:>7} {:>10} {:>9} {:>8} {:>6} {:>10} {:>13} {:>8} {:>8}",
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
                "{:<w$} {:>7} {:>10} {:>9} {:>8} {:>6} {:>10} {:>13} {:>8.2} {:>8.0}",
                r.semantics,
                r.sent,
                count(r.deliveries),
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
        if self.rows.iter().any(|r| r.receipts.is_some()) {
            self.receipts_table(&mut out, w);
        }
        for r in &self.rows {
            let _ = writeln!(out, "{}", self.explain(r));
        }
        if let Some(note) = self.id_note() {
            let _ = writeln!(out, "\n{note}");
        }
        out
    }

    /// The second hop: receipts sent through the outbox and applied by a second consumer.
    fn receipts_table(&self, out: &mut String, w: usize) {
        let _ = writeln!(
            out,
            "second hop: a receipt per payment applied, through the payments consumer's outbox, a relay and a receipts consumer\n"
        );
        let _ = writeln!(
            out,
            "{:<w$} {:>8} {:>10} {:>9} {:>8} {:>6} {:>10} {:>14}",
            "semantics",
            "expected",
            "deliveries",
            "handler",
            "receipts",
            "lost",
            "duplicate",
            "relay re-sent"
        );
        for r in &self.rows {
            let Some(x) = &r.receipts else { continue };
            let _ = writeln!(
                out,
                "{:<w$} {:>8} {:>10} {:>9} {:>8} {:>6} {:>10} {:>14}",
                r.semantics,
                x.expected,
                count(x.deliveries),
                x.handler_runs,
                x.effects,
                x.lost,
                x.duplicate_effects,
                format!("{} in {}", x.resent, x.relay_crashes)
            );
        }
        let _ = writeln!(
            out,
            "\n(relay re-sent: receipts published again because their relay pass crashed \
             between the confirm and the mark, in that many crashes; the receipts consumer \
             met seeded crashes and lost acks of its own)\n"
        );
    }

    /// One line on where the ids came from, when it is not the plain message id.
    fn id_note(&self) -> Option<String> {
        let eo = self
            .rows
            .iter()
            .find(|r| r.semantics == "effectively-once")?;
        let retries = self.faults.duplicate_publishes;
        Some(match self.id_strategy.as_str() {
            "fresh-uuid" if eo.duplicate_effects > 0 => format!(
                "fresh-uuid: the publisher gave each of its {retries} retries a new UUID, so dedup saw \
                 new messages and applied them again: a producer id regenerated on retry defeats \
                 dedup; use the business id (or a content hash) as the message id."
            ),
            "fresh-uuid" => format!(
                "fresh-uuid: the publisher gave each of its {retries} retries a new UUID, but the {} \
                 guard keys on the order itself, not on the message id, so the retries were caught.",
                self.strategy
            ),
            "field" => format!(
                "field: the publisher gave each of its {retries} retries a new UUID; the consumer took \
                 the id from the payload's /order_id instead, so the retries were caught."
            ),
            "content-hash" => format!(
                "content-hash: the publisher gave each of its {retries} retries a new UUID; the \
                 consumer keyed on sha256 of the payload's canonical JSON instead, so the identical \
                 retries were caught."
            ),
            _ => return None,
        })
    }

    fn explain(&self, r: &Row) -> String {
        let fired = &r.faults_fired;
        let tail = format!(
            "{} lost, {} duplicate effects; {} poison messages dead-lettered with a reason.",
            r.lost, r.duplicate_effects, r.dead_lettered
        );
        // NATS drops a second publish of an id inside the stream's duplicate window, so the
        // demo's duplicate publishes never reach a consumer there.
        let dups = self.faults.duplicate_publishes;
        let (crashed, lost_acks) = (fired.crash_after_commit, fired.ack_lost);
        let (amo_dups, alo_again, alo_dropped) = if self.broker_dedup {
            (
                format!(
                    "the {dups} duplicate publishes were dropped by the server (the same \
                     Nats-Msg-Id inside the stream's duplicate window)"
                ),
                format!(
                    "the {crashed} batches that crashed after commit and the {lost_acks} lost acks"
                ),
                format!(
                    " (the {dups} duplicate publishes were dropped by the server: the same \
                     Nats-Msg-Id inside the stream's duplicate window)"
                ),
            )
        } else {
            (
                format!("the {dups} duplicate publishes were still applied twice"),
                format!(
                    "the {crashed} batches that crashed after commit, the {lost_acks} lost acks \
                     and the {dups} duplicate publishes"
                ),
                String::new(),
            )
        };
        match (r.semantics.as_str(), self.strategy.as_str()) {
            (EXACTLY_ONCE, _) if self.transport == "kafka" => format!(
                "exactly-once (same database): the consumer's positions are a table of the business \
                 database, and each batch moved them in the transaction of its payments: the {} \
                 batches that crashed after commit left nothing to read again, and no offset commit \
                 could be lost; records came again only from batches that rolled back ({} crashed \
                 before commit), and the {} duplicate publishes (a second record each) were caught \
                 by the dedup record: {tail}",
                fired.crash_after_commit,
                fired.crash_before_commit,
                self.faults.duplicate_publishes,
            ),
            (EXACTLY_ONCE, _) => format!(
                "exactly-once (same database): the queue is a table of the business database, and \
                 each batch deleted its deliveries in the transaction of its payments: the {} \
                 batches that crashed after commit left nothing to redeliver, and no ack could be \
                 lost; deliveries came again only from batches that rolled back ({} crashed before \
                 commit), and the {} duplicate publishes were caught by the dedup record: {tail}",
                fired.crash_after_commit,
                fired.crash_before_commit,
                self.faults.duplicate_publishes,
            ),
            ("at-most-once", _) => format!(
                "at-most-once: acks before handling, so the {} batches that crashed after their ack \
                 and the {} that crashed before commit lost {} orders; {amo_dups} ({} duplicate \
                 effects).",
                fired.crash_after_ack,
                fired.crash_before_commit,
                r.lost,
                r.duplicate_effects
            ),
            ("at-least-once", strategy) => format!(
                "at-least-once: acks after commit, so nothing is lost ({} lost), but {alo_again} \
                 were delivered again and applied again{}{alo_dropped}: {} duplicate effects.",
                r.lost,
                if strategy == "claim" { " (each call with a new key)" } else { "" },
                r.duplicate_effects
            ),
            (_, "unique-key") => format!(
                "effectively-once (unique key): each payment inserts its order id as a primary key in \
                 its transaction; a second delivery failed on the unique index, rolled back to its \
                 savepoint and was acked: {tail}"
            ),
            (_, "state-machine") => format!(
                "effectively-once (state machine): each payment moves its order PENDING -> PAID with a \
                 conditional update in its transaction; a second delivery found it PAID and was acked \
                 as a duplicate: {tail}"
            ),
            (_, "version") => format!(
                "effectively-once (version): each payment bumps its order's version from the one it \
                 carries (compare-and-set); a second delivery found a newer version and was acked as \
                 a duplicate: {tail}"
            ),
            (_, "claim") => format!(
                "effectively-once (claim): each API call ran under a claim with a lease and a stable \
                 idempotency key; {} calls made {} charges: completed claims kept redeliveries from \
                 calling, and calls repeated after a crash took the claim over with the same key, \
                 which the API charged once: {tail}",
                r.api_calls.unwrap_or(0),
                r.effects
            ),
            _ => format!(
                "effectively-once: the dedup record commits with the payment, so a delivery after \
                 a commit finds its key and is acked without a second effect (the handler ran {} \
                 times{}), and one after a rollback finds no key and applies once: {tail}",
                r.handler_runs,
                match r.deliveries {
                    Some(d) => format!(" for {d} deliveries"),
                    None => format!(" for {} orders", r.sent),
                }
            ),
        }
    }
}

/// A count for the table; `-` where the transport keeps none.
fn count(n: Option<u64>) -> String {
    n.map_or_else(|| "-".into(), |n| n.to_string())
}
