//! `justonce doctor` on the SQL queues: the links of the chain a queue's database holds.
//! The queue's tables exist (a queue opened with `create(false)` checked them), and the
//! database keeps what it commits: WAL on SQLite; `fsync` and `synchronous_commit` on
//! PostgreSQL, server settings that decide whether a committed publish or ack survives a
//! crash.

use justonce_core::{Check, Result, Source};

use crate::SqliteQueue;

/// The queue's own tables, counted.
fn tables(name: &str, pending: u64, dead: u64) -> Check {
    Check::pass(
        "queue",
        format!("queue {name} exists: {pending} messages pending, {dead} dead letters"),
    )
}

impl SqliteQueue {
    /// The links this queue's file holds. The sync level is a setting of each connection:
    /// justonce opens its queues with `synchronous=FULL` unless told `durable(false)`,
    /// which a file cannot show.
    pub async fn check(&self) -> Result<Vec<Check>> {
        let stats = self.stats().await?;
        let mut out = vec![tables(
            Source::queue(self),
            stats.pending,
            stats.dead_letters,
        )];
        let mode: String = sqlx::query_scalar("PRAGMA journal_mode")
            .fetch_one(self.pool())
            .await?;
        out.push(if mode.eq_ignore_ascii_case("wal") {
            Check::pass(
                "durable queue",
                "the file is in WAL mode, and justonce writes it with synchronous=FULL: a \
                 committed publish or ack survives a crash and a power cut",
            )
        } else {
            Check::warn(
                "durable queue",
                format!("the file's journal mode is {mode}, not WAL"),
                "open the queue with justonce, which sets WAL, and keep it there",
            )
        });
        Ok(out)
    }
}

#[cfg(feature = "postgres")]
impl crate::PgQueue {
    /// The links this queue's database holds: its tables, and the server settings that
    /// decide whether a commit survives a crash.
    pub async fn check(&self) -> Result<Vec<Check>> {
        let stats = self.stats().await?;
        let mut out = vec![tables(
            Source::queue(self),
            stats.pending,
            stats.dead_letters,
        )];
        let fsync: String = sqlx::query_scalar("SHOW fsync")
            .fetch_one(self.pool())
            .await?;
        let sync: String = sqlx::query_scalar("SHOW synchronous_commit")
            .fetch_one(self.pool())
            .await?;
        out.push(if fsync != "on" {
            Check::fail(
                "durable queue",
                "the server runs with fsync=off: a crash can lose or corrupt committed \
                 messages, acks and dedup records",
                "set fsync = on in postgresql.conf",
            )
        } else if sync == "off" {
            Check::warn(
                "durable queue",
                format!(
                    "synchronous_commit is {sync}: a crash can lose the last commits the \
                     server acknowledged (a publish the publisher saw succeed, an ack)"
                ),
                "set synchronous_commit = on (the default) for the justonce role or database",
            )
        } else {
            Check::pass(
                "durable queue",
                format!("fsync is on and synchronous_commit is {sync}: a committed publish or ack survives a crash"),
            )
        });
        Ok(out)
    }
}
