//! A batch's claims in two statements ([`ManySql`]), for dedup tables with a unique
//! `(consumer, message_id)`: the SQL each order of claiming needs, built once per row count.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// The statements of `claim_many` for a dedup table with a unique `(consumer, message_id)`
/// (SQLite, PostgreSQL). The insert takes, row by row, the consumer, the id and the
/// fingerprint, as anonymous `?` (SQLite, the only store of plain multi-row inserts: it
/// looks a numbered parameter's name up in a list on every bind, a cost that grows with the
/// square of the row count); or, as `Arrays`, the consumer `$1`, then the ids and the
/// fingerprints as two arrays. The select takes the consumer `$1`, then the message ids
/// (numbered, which SQLite reads too).
#[derive(Debug)]
pub(crate) struct ManySql {
    pub(crate) table: String,
    /// Columns and values after `(consumer, message_id, fingerprint`: `""` when the table's
    /// default stamps the row, or `", processed_at"` and its SQL expression.
    pub(crate) stamp: (&'static str, String),
    /// How the batch learns which keys were there before it:
    /// - `Arrays` (PostgreSQL): one statement takes the batch as two arrays, inserts skipping
    ///   stored keys and answers the ids it skipped (none, nearly always); then the batch
    ///   reads the fingerprints of those. Safe under concurrent claims: a second
    ///   transaction's insert waits on the first's row and then skips it.
    /// - `StatementRollback` (SQLite): a plain insert of every key; SQLite undoes a statement
    ///   that breaks a constraint alone and the transaction goes on, so on a stored key the
    ///   batch reads the stored fingerprints and inserts the rest. sqlx runs a SQLite
    ///   connection on its own thread and sends every returned row across a channel: while
    ///   no key is stored (nearly always) the claim is one statement that returns nothing.
    pub(crate) order: ManyOrder,
    /// The inserts made so far, by row count: a batch's is built once, not per batch.
    pub(crate) inserts: Mutex<HashMap<usize, Arc<str>>>,
}

/// See [`ManySql::order`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ManyOrder {
    Arrays,
    StatementRollback,
}

/// Keys per statement: three parameters each stays far below every placeholder limit.
pub(crate) const MANY_CHUNK: usize = 500;

impl ManySql {
    pub(crate) fn new(table: &str, stamp: (&'static str, String), order: ManyOrder) -> Self {
        ManySql {
            table: table.to_owned(),
            stamp,
            order,
            inserts: Default::default(),
        }
    }

    /// [`ManySql::build_insert`], built once per row count (once for `Arrays`).
    pub(crate) fn insert(&self, n: usize) -> Arc<str> {
        let n = if self.order == ManyOrder::Arrays {
            0
        } else {
            n
        };
        let mut inserts = self.inserts.lock().unwrap_or_else(|e| e.into_inner());
        if inserts.len() > 64 {
            inserts.clear(); // batch sizes vary without bound only if the caller's do
        }
        inserts
            .entry(n)
            .or_insert_with(|| self.build_insert(n).into())
            .clone()
    }

    /// The insert of `n` keys, as [`ManySql::order`] says: of the arrays `$2` (ids) and `$3`
    /// (fingerprints) for consumer `$1`, skipping the stored ones and answering their ids
    /// (`n` is not used); or a plain insert of `n` rows of `(consumer, id, fingerprint)`
    /// that fails on a stored key.
    fn build_insert(&self, n: usize) -> String {
        let (col, value) = &self.stamp;
        if self.order == ManyOrder::Arrays {
            // The ids compare as the key column does (`COLLATE "C"`), whatever collation
            // an older table was created with.
            return format!(
                "WITH k (message_id, fingerprint) AS (SELECT * FROM unnest($2::text[], $3::text[])),
                      ins AS (INSERT INTO {t} (consumer, message_id, fingerprint{col})
                              SELECT $1, message_id, fingerprint{value} FROM k
                              ON CONFLICT (consumer, message_id) DO NOTHING
                              RETURNING message_id)
                 SELECT message_id FROM k
                 WHERE NOT EXISTS (SELECT 1 FROM ins
                                   WHERE ins.message_id = k.message_id COLLATE \"C\")",
                t = self.table
            );
        }
        let rows: Vec<String> = (0..n).map(|_| format!("(?, ?, ?{value})")).collect();
        format!(
            "INSERT INTO {} (consumer, message_id, fingerprint{col}) VALUES {}",
            self.table,
            rows.join(", "),
        )
    }

    pub(crate) fn select(&self, n: usize) -> String {
        let ids: Vec<String> = (0..n).map(|k| format!("${}", k + 2)).collect();
        format!(
            "SELECT message_id, fingerprint FROM {} WHERE consumer = $1 AND message_id IN ({})",
            self.table,
            ids.join(", ")
        )
    }
}
