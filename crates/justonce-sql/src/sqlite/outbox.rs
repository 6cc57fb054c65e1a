//! The SQLite outbox's schema and SQL ([`crate::outbox`] runs it). SQLite serialises
//! writers, so one `UPDATE … RETURNING` takes rows: relays in several processes never take
//! one row twice while its lease runs, and seq order is commit order.

use justonce_core::{validate_identifier, Result};
use sqlx::Sqlite;

use super::{SqliteStore, NOW_MS};
use crate::outbox::{Local, OutboxOptions, OutboxSql, SqlOutbox, TakeSql};

/// The outbox of a [`SqliteStore`] ([`SqlOutbox`]).
pub type SqliteOutbox = SqlOutbox<Sqlite>;

impl SqliteStore {
    /// The store's outbox, table `jo_outbox`, created if missing.
    pub async fn outbox(&self) -> Result<SqliteOutbox> {
        self.outbox_with(OutboxOptions::default()).await
    }

    /// As [`SqliteStore::outbox`], with options.
    pub async fn outbox_with(&self, opts: OutboxOptions) -> Result<SqliteOutbox> {
        let t = &opts.table;
        validate_identifier(t)?;
        if opts.create {
            sqlx::raw_sql(&format!(
                "CREATE TABLE IF NOT EXISTS {t} (
                 seq          INTEGER PRIMARY KEY AUTOINCREMENT,
                 okey         TEXT,
                 message_id   TEXT    NOT NULL,
                 payload      BLOB    NOT NULL,
                 headers      TEXT    NOT NULL,
                 content_type TEXT,
                 enqueued_at  INTEGER NOT NULL,
                 due_at       INTEGER NOT NULL,
                 attempts     INTEGER NOT NULL DEFAULT 0,
                 owner        TEXT,
                 leased_until INTEGER,
                 last_error   TEXT,
                 dead_reason  TEXT
             );
             CREATE INDEX IF NOT EXISTS {t}_okey ON {t} (okey, seq) WHERE okey IS NOT NULL;"
            ))
            .execute(self.pool())
            .await?;
        }
        Ok(SqlOutbox::new(
            self.pool().clone(),
            sql(t),
            &opts,
            std::sync::Arc::new(Local::default()),
        ))
    }
}

fn sql(t: &str) -> OutboxSql {
    let now = NOW_MS;
    OutboxSql {
        enqueue_lock: None,
        enqueue: format!(
            "INSERT INTO {t} (okey, message_id, payload, headers, content_type, enqueued_at, due_at)
             VALUES (?, ?, ?, ?, ?, {now}, {now})"
        ),
        take: TakeSql::Returning(format!(
            "UPDATE {t} SET owner = ?1, leased_until = {now} + ?2
             WHERE seq IN (
                 SELECT o.seq FROM {t} o
                 LEFT JOIN (
                     SELECT okey, MIN(seq) AS first FROM {t}
                     WHERE okey IS NOT NULL AND (dead_reason IS NOT NULL OR due_at > {now}
                                                 OR leased_until > {now})
                     GROUP BY okey) b ON b.okey = o.okey
                 WHERE o.dead_reason IS NULL AND o.due_at <= {now}
                   AND (o.leased_until IS NULL OR o.leased_until <= {now})
                   AND (b.first IS NULL OR o.seq < b.first)
                 ORDER BY o.seq LIMIT ?3)
             RETURNING seq, okey, message_id, payload, headers, content_type, attempts"
        )),
        fail: format!(
            "UPDATE {t} SET attempts = attempts + 1, owner = NULL, leased_until = NULL,
                 due_at = {now} + ?1, last_error = ?2,
                 dead_reason = CASE WHEN attempts + 1 >= ?3 THEN ?2 END
             WHERE seq = ?4"
        ),
        is_dead: format!("SELECT dead_reason IS NOT NULL FROM {t} WHERE seq = ?"),
        sent: format!("DELETE FROM {t} WHERE seq IN ({{seqs}})"),
        release: format!(
            "UPDATE {t} SET owner = NULL, leased_until = NULL WHERE seq IN ({{seqs}})"
        ),
        stats: format!(
            "SELECT CAST(COALESCE(SUM(dead_reason IS NULL), 0) AS TEXT),
                    CAST(COALESCE(SUM(dead_reason IS NULL AND leased_until > {now}), 0) AS TEXT),
                    CAST(COALESCE(SUM(dead_reason IS NOT NULL), 0) AS TEXT),
                    CAST(MIN(CASE WHEN dead_reason IS NULL THEN enqueued_at END) AS TEXT)
             FROM {t}"
        ),
        tidy: None,
        owners: format!(
            "SELECT owner, CAST(COUNT(*) AS TEXT), CAST(MAX(leased_until) AS TEXT)
             FROM {t} WHERE leased_until > {now} GROUP BY owner ORDER BY owner"
        ),
        dead: format!(
            "SELECT CAST(seq AS TEXT), okey, message_id, CAST(attempts AS TEXT), dead_reason
             FROM {t} WHERE dead_reason IS NOT NULL ORDER BY seq LIMIT ?"
        ),
        revive: format!(
            "UPDATE {t} SET dead_reason = NULL, attempts = 0, due_at = {now}, owner = NULL,
                 leased_until = NULL
             WHERE dead_reason IS NOT NULL{{and}}"
        ),
        discard: format!("DELETE FROM {t} WHERE dead_reason IS NOT NULL{{and}}"),
    }
}
