//! The PostgreSQL outbox's schema and SQL ([`crate::outbox`] runs it). Per key, seq order
//! is commit order: an enqueue with a key takes that key's transaction-scoped advisory
//! lock first, so a second producer of the key waits for the first one's commit before it
//! draws its seq. Relays take rows with `FOR UPDATE SKIP LOCKED` and, per key, a try-lock
//! of their own, so two relays never hold one key at once.

use justonce_core::{validate_identifier, Result};
use sqlx::Postgres;

use super::PgStore;
use crate::outbox::{OutboxOptions, OutboxSql, SqlOutbox, TakeSql};

/// The advisory lock classes: a producer's per-key lock, and a relay's.
const ENQUEUE_LOCK: i32 = 0x6a6f_0001;
const TAKE_LOCK: i32 = 0x6a6f_0002;

/// The outbox of a [`PgStore`] ([`SqlOutbox`]).
pub type PgOutbox = SqlOutbox<Postgres>;

impl PgStore {
    /// The store's outbox, table `jo_outbox`, created if missing.
    pub async fn outbox(&self) -> Result<PgOutbox> {
        self.outbox_with(OutboxOptions::default()).await
    }

    /// As [`PgStore::outbox`], with options.
    pub async fn outbox_with(&self, opts: OutboxOptions) -> Result<PgOutbox> {
        let t = &opts.table;
        validate_identifier(t)?;
        super::create(
            self.pool(),
            &[
                format!(
                    "CREATE TABLE IF NOT EXISTS {t} (
                         seq          BIGSERIAL   PRIMARY KEY,
                         okey         TEXT        COLLATE \"C\",
                         message_id   TEXT        NOT NULL,
                         payload      BYTEA       NOT NULL,
                         headers      TEXT        NOT NULL,
                         content_type TEXT,
                         enqueued_at  TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
                         due_at       TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
                         attempts     BIGINT      NOT NULL DEFAULT 0,
                         owner        TEXT,
                         leased_until TIMESTAMPTZ,
                         last_error   TEXT,
                         dead_reason  TEXT)"
                ),
                format!(
                    "CREATE INDEX IF NOT EXISTS {t}_okey ON {t} (okey, seq) WHERE okey IS NOT NULL"
                ),
            ],
        )
        .await?;
        Ok(SqlOutbox::new(self.pool().clone(), sql(t), &opts))
    }
}

fn sql(t: &str) -> OutboxSql {
    let now = "clock_timestamp()";
    let ms = "* interval '1 millisecond'";
    OutboxSql {
        enqueue_lock: Some(format!(
            "SELECT pg_advisory_xact_lock({ENQUEUE_LOCK}, hashtext($1))::text"
        )),
        enqueue: format!(
            "INSERT INTO {t} (okey, message_id, payload, headers, content_type)
             VALUES ($1, $2, $3, $4, $5)"
        ),
        take: TakeSql::Returning(format!(
            "WITH chosen AS (
                 SELECT o.seq FROM {t} o
                 WHERE o.dead_reason IS NULL AND o.due_at <= {now}
                   AND (o.leased_until IS NULL OR o.leased_until <= {now})
                   AND (o.okey IS NULL OR (
                       NOT EXISTS (
                           SELECT 1 FROM {t} e WHERE e.okey = o.okey AND e.seq < o.seq
                             AND (e.dead_reason IS NOT NULL OR e.due_at > {now}
                                  OR e.leased_until > {now}))
                       AND pg_try_advisory_xact_lock({TAKE_LOCK}, hashtext(o.okey))))
                 ORDER BY o.seq LIMIT $3
                 FOR UPDATE SKIP LOCKED)
             UPDATE {t} SET owner = $1, leased_until = {now} + $2 {ms}
             FROM chosen WHERE {t}.seq = chosen.seq
             RETURNING {t}.seq, {t}.okey, {t}.message_id, {t}.payload, {t}.headers,
                       {t}.content_type, {t}.attempts"
        )),
        fail: format!(
            "UPDATE {t} SET attempts = attempts + 1, owner = NULL, leased_until = NULL,
                 due_at = {now} + $1 {ms}, last_error = $2,
                 dead_reason = CASE WHEN attempts + 1 >= $3 THEN $2 END
             WHERE seq = $4"
        ),
        is_dead: format!(
            "SELECT CASE WHEN dead_reason IS NULL THEN 0 ELSE 1 END::bigint FROM {t} WHERE seq = $1"
        ),
        sent: format!("DELETE FROM {t} WHERE seq IN ({{seqs}})"),
        release: format!(
            "UPDATE {t} SET owner = NULL, leased_until = NULL WHERE seq IN ({{seqs}})"
        ),
        stats: format!(
            "SELECT (count(*) FILTER (WHERE dead_reason IS NULL))::text,
                    (count(*) FILTER (WHERE dead_reason IS NULL AND leased_until > {now}))::text,
                    (count(*) FILTER (WHERE dead_reason IS NOT NULL))::text,
                    ((EXTRACT(EPOCH FROM min(enqueued_at) FILTER (WHERE dead_reason IS NULL))
                      * 1000)::bigint)::text
             FROM {t}"
        ),
    }
}
