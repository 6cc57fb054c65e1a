//! The MariaDB outbox's schema and SQL ([`crate::outbox`] runs it). MariaDB has no
//! `UPDATE … RETURNING`, and a row lock skipped by one relay would let another take the
//! next row of its key: relays take one at a time, in a transaction that first locks a row
//! of `{table}_locks` (freed at its commit, or its rollback if the relay dies or drops the
//! take midway), and publish in parallel. Per key, seq order is commit order: an enqueue
//! with a key first locks the key's slot in `{table}_locks`, so a second producer of the
//! key waits for the first one's commit.

use justonce_core::{validate_identifier, Result};
use sqlx::MySql;

use super::MySqlStore;
use crate::outbox::{OutboxOptions, OutboxSql, Poll, SqlOutbox, TakeSql};

/// The outbox of a [`MySqlStore`] ([`SqlOutbox`]).
pub type MySqlOutbox = SqlOutbox<MySql>;

impl MySqlStore {
    /// The store's outbox, table `jo_outbox`, created if missing.
    pub async fn outbox(&self) -> Result<MySqlOutbox> {
        self.outbox_with(OutboxOptions::default()).await
    }

    /// As [`MySqlStore::outbox`], with options.
    pub async fn outbox_with(&self, opts: OutboxOptions) -> Result<MySqlOutbox> {
        let t = &opts.table;
        validate_identifier(t)?;
        if opts.create {
            sqlx::query(&format!(
                "CREATE TABLE IF NOT EXISTS {t} (
                 seq          BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
                 okey         VARCHAR(255),
                 message_id   VARCHAR(255) NOT NULL,
                 payload      LONGBLOB     NOT NULL,
                 headers      LONGTEXT     NOT NULL,
                 content_type VARCHAR(255),
                 enqueued_at  DATETIME(6)  NOT NULL,
                 due_at       DATETIME(6)  NOT NULL,
                 attempts     BIGINT       NOT NULL DEFAULT 0,
                 owner        VARCHAR(255),
                 leased_until DATETIME(6),
                 last_error   TEXT,
                 dead_reason  TEXT,
                 KEY {t}_okey (okey, seq)
             ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin"
            ))
            .execute(self.pool())
            .await?;
            sqlx::query(&format!(
                "CREATE TABLE IF NOT EXISTS {t}_locks (id INT NOT NULL PRIMARY KEY) ENGINE=InnoDB"
            ))
            .execute(self.pool())
            .await?;
            // The slots once, by the first to open the outbox: an insert beside running
            // producers waits for the slots they lock, and can deadlock with them (the lab's
            // relays, started while its producer ran, exited on that).
            let slots: i64 = sqlx::query_scalar(&format!("SELECT COUNT(*) FROM {t}_locks"))
                .fetch_one(self.pool())
                .await?;
            if slots <= KEY_SLOTS as i64 {
                sqlx::query(&format!(
                    "INSERT IGNORE INTO {t}_locks (id)
                     WITH RECURSIVE n (i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < {KEY_SLOTS})
                     SELECT i FROM n"
                ))
                .execute(self.pool())
                .await?;
            }
        }
        Ok(SqlOutbox::new(
            self.pool().clone(),
            sql(t),
            &opts,
            std::sync::Arc::new(Poll),
        ))
    }
}

/// Producers' per-key locks: rows 0 to `KEY_SLOTS - 1` of `{table}_locks`, a key's slot its
/// CRC-32 modulo this (two keys that share one only wait for each other); row `KEY_SLOTS`
/// is the relays' take lock.
const KEY_SLOTS: u32 = 256;

fn sql(t: &str) -> OutboxSql {
    let now = "NOW(6)";
    // A `utf8mb4_bin` column reads back as bytes; converted, as text.
    let text = |c: &str| format!("CONVERT({c} USING utf8mb4)");
    let row = format!(
        "seq, {}, {}, payload, {}, {}, attempts",
        text("okey"),
        text("message_id"),
        text("headers"),
        text("content_type")
    );
    OutboxSql {
        // The key's slot, a row of `{t}_locks` that exists: a record lock, no gap lock, so
        // producers of different keys never deadlock (a locking read of the key's last
        // outbox row did: its next-key locks met the other producers' inserts).
        enqueue_lock: Some(format!(
            "SELECT CAST(id AS CHAR) FROM {t}_locks WHERE id = CRC32(?) % {KEY_SLOTS} FOR UPDATE"
        )),
        enqueue: format!(
            "INSERT INTO {t} (okey, message_id, payload, headers, content_type, enqueued_at, due_at)
             VALUES (?, ?, ?, ?, ?, {now}, {now})"
        ),
        take: TakeSql::Steps {
            // The take lock: the last row of `{t}_locks`, locked to the commit. The choose
            // after it is the transaction's first consistent read, so its snapshot sees
            // every lease the takes before it committed.
            lock: format!("SELECT id FROM {t}_locks WHERE id = {KEY_SLOTS} FOR UPDATE"),
            choose: format!(
                "SELECT {} FROM {t} o
                 LEFT JOIN (
                     SELECT okey, MIN(seq) AS first FROM {t}
                     WHERE okey IS NOT NULL AND (dead_reason IS NOT NULL OR due_at > {now}
                                                 OR leased_until > {now})
                     GROUP BY okey) b ON b.okey = o.okey
                 WHERE o.dead_reason IS NULL AND o.due_at <= {now}
                   AND (o.leased_until IS NULL OR o.leased_until <= {now})
                   AND (b.first IS NULL OR o.seq < b.first)
                 ORDER BY o.seq LIMIT ?",
                text("CAST(o.seq AS CHAR)")
            ),
            lease: format!(
                "UPDATE {t} SET owner = ?, leased_until = {now} + INTERVAL ? * 1000 MICROSECOND
                 WHERE seq IN ({{seqs}})"
            ),
            read: format!("SELECT {row} FROM {t} WHERE seq IN ({{seqs}})"),
        },
        // MariaDB assigns left to right: `dead_reason` sees the new `attempts` and
        // `last_error`.
        fail: format!(
            "UPDATE {t} SET attempts = attempts + 1, owner = NULL, leased_until = NULL,
                 due_at = {now} + INTERVAL ? * 1000 MICROSECOND, last_error = ?,
                 dead_reason = CASE WHEN attempts >= ? THEN last_error END
             WHERE seq = ?"
        ),
        is_dead: format!("SELECT CAST(dead_reason IS NOT NULL AS SIGNED) FROM {t} WHERE seq = ?"),
        sent: format!("DELETE FROM {t} WHERE seq IN ({{seqs}})"),
        release: format!(
            "UPDATE {t} SET owner = NULL, leased_until = NULL WHERE seq IN ({{seqs}})"
        ),
        stats: format!(
            "SELECT CAST(COALESCE(SUM(dead_reason IS NULL), 0) AS CHAR),
                    CAST(COALESCE(SUM(dead_reason IS NULL AND leased_until > {now}), 0) AS CHAR),
                    CAST(COALESCE(SUM(dead_reason IS NOT NULL), 0) AS CHAR),
                    CAST(CAST(UNIX_TIMESTAMP(MIN(CASE WHEN dead_reason IS NULL
                         THEN enqueued_at END)) * 1000 AS SIGNED) AS CHAR)
             FROM {t}"
        ),
        tidy: None,
        owners: format!(
            "SELECT {}, CAST(COUNT(*) AS CHAR),
                    CAST(CAST(UNIX_TIMESTAMP(MAX(leased_until)) * 1000 AS SIGNED) AS CHAR)
             FROM {t} WHERE leased_until > {now} GROUP BY owner ORDER BY owner",
            text("owner")
        ),
        dead: format!(
            "SELECT CAST(seq AS CHAR), {}, {}, CAST(attempts AS CHAR), {}
             FROM {t} WHERE dead_reason IS NOT NULL ORDER BY seq LIMIT ?",
            text("okey"),
            text("message_id"),
            text("dead_reason")
        ),
        revive: format!(
            "UPDATE {t} SET dead_reason = NULL, attempts = 0, due_at = {now}, owner = NULL,
                 leased_until = NULL
             WHERE dead_reason IS NOT NULL{{and}}"
        ),
        discard: format!("DELETE FROM {t} WHERE dead_reason IS NOT NULL{{and}}"),
    }
}
