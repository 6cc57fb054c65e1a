//! The PostgreSQL outbox's schema and SQL ([`crate::outbox`] runs it). Per key, seq order
//! is commit order: an enqueue with a key takes that key's transaction-scoped advisory
//! lock first, so a second producer of the key waits for the first one's commit before it
//! draws its seq. Takes run side by side (`SKIP LOCKED`); a key's rows go only to the take
//! that holds the key's first row, as a run from it, so two relays never hold one key at
//! once and a key's rows never overtake each other.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use justonce_core::{validate_identifier, Error, OutboxMove, Result, Source};
use sqlx::postgres::PgListener;
use sqlx::{PgPool, Postgres};
use tokio::sync::{Notify, OnceCell};

use super::{listen, AbortOnDrop, PgQueue, PgStore};
use crate::outbox::{OutboxOptions, OutboxSql, SqlOutbox, TakeSql, Wake};

/// The channel enqueues notify on; the payload is the outbox table's name.
const CHANNEL: &str = "jo_outbox";

/// The advisory lock class of a producer's per-key lock.
const ENQUEUE_LOCK: i32 = 0x6a6f_0001;

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

impl PgOutbox {
    /// Moves this outbox's rows into `queue`, a PostgreSQL queue in the outbox's own
    /// database ([`OutboxMove`]): a relay built with `Relay::moving` (crate `justonce`)
    /// then takes, enqueues and deletes each batch in one transaction, with no publish to
    /// confirm and no duplicate, where a publishing relay would lease, publish, wait for
    /// the commit of the queue's transaction and mark. Fails with a configuration error
    /// when the queue's table is not one of this database: rows moved into a table no
    /// consumer reads would be lost to it.
    ///
    /// ```no_run
    /// # async fn run() -> justonce_core::Result<()> {
    /// use justonce_core::OutboxMove;
    /// use justonce_sql::{PgQueue, PgStore};
    ///
    /// let url = "postgres://app@127.0.0.1:5432/shop";
    /// let store = PgStore::open(url).await?;
    /// let receipts = PgQueue::open(url, "receipts").await?;
    /// let mover = store.outbox().await?.mover_into(&receipts).await?;
    /// let moved = mover.move_rows(500).await?; // or Relay::moving(outbox, mover, opts)
    /// # Ok(()) }
    /// ```
    pub async fn mover_into(&self, queue: &PgQueue) -> Result<PgOutboxMove> {
        let ours = database_of(&self.pool).await?;
        let theirs = database_of(queue.pool()).await?;
        if ours != theirs {
            return Err(Error::config(format!(
                "the queue `{}` is not in the outbox's database ({theirs} against {ours}): \
                 relay its rows by publishing (`Relay::new`)",
                queue.queue()
            )));
        }
        let t = &self.table;
        let channel = super::queue::CHANNEL;
        Ok(PgOutboxMove {
            pool: self.pool.clone(),
            queue: queue.queue().to_owned(),
            sql: Arc::new(format!(
                "WITH {runs},
                     moved AS (
                         DELETE FROM {t} WHERE seq = ANY (ARRAY({chosen}))
                         RETURNING seq, message_id, payload, headers, content_type),
                     queued AS (
                         INSERT INTO jo_queue (queue, message_id, payload, headers, content_type)
                         SELECT $1, message_id, payload, headers, content_type
                         FROM moved ORDER BY seq
                         RETURNING 1)
                 SELECT n, CASE WHEN n > 0 THEN pg_notify('{channel}', $1)::text END
                 FROM (SELECT count(*) AS n FROM queued) c",
                runs = runs(t, "$2", "ARRAY[]::bigint[]"),
                chosen = CHOSEN,
            )),
        })
    }
}

/// Which database a pool is on: its name, the server's start and port, and the `jo_queue`
/// table it sees (the queue's, or none yet).
async fn database_of(pool: &PgPool) -> Result<String> {
    let (name,): (String,) = sqlx::query_as(
        "SELECT current_database() || ' (' || coalesce(inet_server_port()::text, 'socket')
                || ', started ' || pg_postmaster_start_time()::text
                || ', jo_queue ' || coalesce(to_regclass('jo_queue')::oid::text, 'missing') || ')'",
    )
    .fetch_one(pool)
    .await?;
    Ok(name)
}

/// A PostgreSQL outbox's rows moving into a PostgreSQL queue of its database
/// ([`PgOutbox::mover_into`]).
#[derive(Debug, Clone)]
pub struct PgOutboxMove {
    pool: PgPool,
    queue: String,
    sql: Arc<String>,
}

#[async_trait]
impl OutboxMove for PgOutboxMove {
    /// One transaction: the rows (a take's) deleted from the outbox and inserted
    /// into the queue in their outbox order, and the queue's consumers notified at the
    /// commit.
    async fn move_rows(&self, max: usize) -> Result<usize> {
        let mut tx = crate::begin_with(&self.pool, BEGIN).await?;
        let (n, _): (i64, Option<String>) = sqlx::query_as(&self.sql)
            .bind(&self.queue)
            .bind(max as i64)
            .fetch_one(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(n as usize)
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

/// A take's transaction: the plan uses the seq index, never a scan and a sort of the whole
/// backlog. The planner cannot know how few rows are due (`clock_timestamp()`), and with
/// 860,000 rows pending it sorted them all for a hundred: 570 ms a take. No JIT: a sort
/// that is still needed (a move's hundred rows, in seq order) is then costed at 10^10,
/// over `jit_above_cost`, and compiling the statement took 400 ms of a 1 ms move.
const BEGIN: &str =
    "BEGIN; SET LOCAL enable_seqscan = off; SET LOCAL enable_sort = off; SET LOCAL jit = off";

/// The seqs [`runs`] chose.
const CHOSEN: &str = "SELECT c.seq FROM cand c LEFT JOIN gaps g ON g.okey = c.okey
                      WHERE c.okey IS NULL OR g.gap IS NULL OR c.seq < g.gap";

/// The CTEs `cand` and `gaps` of a take (or a move) of up to `max` rows, passing over the
/// seqs of `gone` (an array expression: rows the same statement deletes); [`CHOSEN`]
/// selects the rows they allow.
///
/// Takes run side by side. A key's rows go to the take that locks the key's first row in
/// the table (whatever its state), and only as a run from it: `cand` locks the first `max`
/// takeable rows (`SKIP LOCKED` passes over the rows another take, mark or release holds),
/// and `gaps` finds, per key, its first row that `cand` does not hold (leased, waiting,
/// dead, locked by another, or beyond the limit). Rows of the key from that gap on stay.
/// This holds under READ COMMITTED where a per-key try-lock did not (see
/// docs/dev/style.md): `gaps` reads the statement's snapshot, so a row another take leased
/// or sent after it began is still there, a gap, and the key waits for the next take
/// rather than overtaking it. `seq = ANY (ARRAY(…))`, not a join on the CTE: the planner
/// hash-joined the whole table for a hundred rows (5 ms for 20,000 rows, against 1 ms by
/// the index).
fn runs(t: &str, max: &str, gone: &str) -> String {
    let now = "clock_timestamp()";
    format!(
        "cand AS MATERIALIZED (
             SELECT seq, okey FROM {t}
             WHERE dead_reason IS NULL AND due_at <= {now}
               AND (leased_until IS NULL OR leased_until <= {now})
               AND seq <> ALL ({gone})
             ORDER BY seq LIMIT {max}
             FOR UPDATE SKIP LOCKED),
         gaps AS MATERIALIZED (
             SELECT k.okey,
                    (SELECT e.seq FROM {t} e
                     WHERE e.okey = k.okey
                       AND e.seq <> ALL (ARRAY(SELECT seq FROM cand))
                       AND e.seq <> ALL ({gone})
                     ORDER BY e.seq LIMIT 1) AS gap
             FROM (SELECT DISTINCT okey FROM cand WHERE okey IS NOT NULL) k)"
    )
}

fn sql(t: &str) -> OutboxSql {
    let now = "clock_timestamp()";
    let ms = "* interval '1 millisecond'";
    // The rows the relay sent last, deleted by its next take: an array built once per
    // statement (`ARRAY(…)` is an init plan; a bare `string_to_array($4, …)` in a filter
    // was parsed again for every row scanned, and took the take from 1.2 to 4.8 ms).
    let sent = "ARRAY(SELECT s::bigint FROM unnest(string_to_array($4, ',')) AS s)";
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
        // A take ([`runs`]); the rows the relay sent last (`$4`) are deleted by the same
        // statement and count as gone.
        take: TakeSql::MarkAndTake {
            begin: BEGIN.into(),
            sql: format!(
                "WITH marked AS (DELETE FROM {t} WHERE seq = ANY ({sent})),
                     {runs}
                 UPDATE {t} SET owner = $1, leased_until = {now} + $2 {ms}
                 WHERE seq = ANY (ARRAY({chosen}))
                 RETURNING seq, okey, message_id, payload, headers, content_type, attempts",
                runs = runs(t, "$3", sent),
                chosen = CHOSEN,
            ),
        },
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
