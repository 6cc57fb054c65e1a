//! The PostgreSQL outbox's schema and SQL ([`crate::outbox`] runs it). Per key, seq order
//! is commit order: an enqueue with a key takes that key's transaction-scoped advisory
//! lock first, so a second producer of the key waits for the first one's commit before it
//! draws its seq. Takes run one at a time under a transaction-scoped advisory lock of the
//! table (a few milliseconds each; relays spend their time publishing), skipping rows a
//! mark or a release holds (`SKIP LOCKED`), so two relays never hold one key at once.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use justonce_core::{validate_identifier, Result};
use sqlx::postgres::PgListener;
use sqlx::{PgPool, Postgres};
use tokio::sync::{Notify, OnceCell};

use super::{listen, AbortOnDrop, PgStore};
use crate::outbox::{OutboxOptions, OutboxSql, SqlOutbox, TakeSql, Wake};

/// The channel enqueues notify on; the payload is the outbox table's name.
const CHANNEL: &str = "jo_outbox";

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
        if opts.create {
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
                         dead_reason  TEXT)
                         WITH (fillfactor = 50)"
                    ),
                    format!(
                    "CREATE INDEX IF NOT EXISTS {t}_okey ON {t} (okey, seq) WHERE okey IS NOT NULL"
                ),
                ],
            )
            .await?;
        }
        let wake = Arc::new(Listen {
            pool: self.pool().clone(),
            table: t.clone(),
            notify: Arc::new(Notify::new()),
            listener: OnceCell::new(),
        });
        Ok(SqlOutbox::new(self.pool().clone(), sql(t), &opts, wake))
    }
}

/// Wakes relays on the `NOTIFY` an enqueueing transaction sends, which PostgreSQL
/// delivers at its commit (and never if it rolls back). The listener starts at a relay's
/// first wait, on a connection of the pool it keeps; a producer that only enqueues holds
/// none.
struct Listen {
    pool: PgPool,
    table: String,
    notify: Arc<Notify>,
    listener: OnceCell<AbortOnDrop>,
}

impl Listen {
    async fn start(&self) -> Result<AbortOnDrop> {
        let mut listener = PgListener::connect_with(&self.pool).await?;
        listener.listen(CHANNEL).await?;
        let notify = self.notify.clone();
        // One permit, so a notification that arrives while the relay publishes is kept.
        let wake = Arc::new(move || notify.notify_one());
        Ok(AbortOnDrop(tokio::spawn(listen(
            listener,
            self.table.clone(),
            wake,
        ))))
    }
}

#[async_trait]
impl Wake for Listen {
    async fn wait(&self, max: Duration) {
        if let Err(e) = self.listener.get_or_try_init(|| self.start()).await {
            tracing::warn!(error = %e, "cannot LISTEN for outbox commits; the relay polls");
            tokio::time::sleep(max).await;
            return;
        }
        let _ = tokio::time::timeout(max, self.notify.notified()).await;
    }
}

fn sql(t: &str) -> OutboxSql {
    let now = "clock_timestamp()";
    let ms = "* interval '1 millisecond'";
    OutboxSql {
        enqueue_lock: Some(format!(
            "SELECT pg_advisory_xact_lock({ENQUEUE_LOCK}, hashtext($1))::text"
        )),
        // The row and its `NOTIFY` in one round trip: the notification is queued in the
        // transaction and delivered at its commit (never if it rolls back), and
        // PostgreSQL folds a transaction's identical ones into one.
        enqueue: format!(
            "INSERT INTO {t} (okey, message_id, payload, headers, content_type)
             SELECT $1::text, $2::text, $3::bytea, $4::text, $5::text
             FROM (SELECT pg_notify('{CHANNEL}', '{t}')) AS notified"
        ),
        // Takes are serialised by a transaction-scoped lock, and run their statement after
        // it, so each reads the leases of the one before. Per-key try-locks inside one
        // statement are not enough: under READ COMMITTED the statement's snapshot is taken
        // before a concurrent take commits and frees its key, and the later rows of that
        // key, read after it, would pass both the "no earlier row leased" check (the
        // snapshot's) and the lock (free by then), overtaking the rows just leased.
        // With the lock, the plan: by the seq index, never a scan and a sort of the whole
        // backlog. The planner cannot know how few rows are due (`clock_timestamp()`),
        // and with 860,000 rows pending it sorted them all for a hundred: 570 ms a take
        // (80 ms by the index, the rest of that the deleted rows at the head).
        take_lock: Some(format!(
            "SELECT pg_advisory_xact_lock({TAKE_LOCK}, hashtext('{t}'))::text,
                        set_config('enable_seqscan', 'off', true),
                        set_config('enable_sort', 'off', true)"
        )),
        // `seq = ANY (ARRAY(…))`, not a join on the CTE: the planner hash-joined the whole
        // table for a hundred rows (5 ms for 20,000 rows, against 1 ms by the index).
        take: TakeSql::Returning(format!(
            "WITH blocked AS (
                     SELECT okey, min(seq) AS first FROM {t}
                     WHERE okey IS NOT NULL AND (dead_reason IS NOT NULL OR due_at > {now}
                                                 OR leased_until > {now})
                     GROUP BY okey),
                 chosen AS (
                     SELECT o.seq FROM {t} o LEFT JOIN blocked b ON b.okey = o.okey
                     WHERE o.dead_reason IS NULL AND o.due_at <= {now}
                       AND (o.leased_until IS NULL OR o.leased_until <= {now})
                       AND (b.first IS NULL OR o.seq < b.first)
                     ORDER BY o.seq LIMIT $3
                     FOR UPDATE OF o SKIP LOCKED)
                 UPDATE {t} SET owner = $1, leased_until = {now} + $2 {ms}
                 WHERE seq = ANY (ARRAY(SELECT seq FROM chosen))
                 RETURNING seq, okey, message_id, payload, headers, content_type, attempts"
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
        // Autovacuum visits a database once a minute at most; a relay sending thousands
        // of rows a second leaves hundreds of thousands of deleted rows at the head of the
        // table by then, and every take wades through them. Vacuumed by the relays every
        // few seconds, a drained table also shrinks back to a few pages.
        tidy: Some(format!("VACUUM (SKIP_LOCKED) {t}")),
        owners: format!(
            "SELECT owner, count(*)::text,
                    ((EXTRACT(EPOCH FROM max(leased_until)) * 1000)::bigint)::text
             FROM {t} WHERE leased_until > {now} GROUP BY owner ORDER BY owner"
        ),
        dead: format!(
            "SELECT seq::text, okey, message_id, attempts::text, dead_reason FROM {t}
             WHERE dead_reason IS NOT NULL ORDER BY seq LIMIT $1"
        ),
        revive: format!(
            "UPDATE {t} SET dead_reason = NULL, attempts = 0, due_at = {now}, owner = NULL,
                 leased_until = NULL
             WHERE dead_reason IS NOT NULL{{and}}"
        ),
        discard: format!("DELETE FROM {t} WHERE dead_reason IS NOT NULL{{and}}"),
    }
}
