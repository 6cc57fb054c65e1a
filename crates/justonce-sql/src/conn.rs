//! The one place the SQL stores' algorithms meet sqlx: a statement and its parameters, run
//! on a connection of any of the three databases. The dedup store, the claim store and
//! their purges are plain functions over [`Conn`] (`dedup.rs`, `claims.rs`); each backend
//! gives them only its SQL text.

use std::borrow::Cow;

use async_trait::async_trait;
use sqlx::{ColumnIndex, Database, Decode, Encode, Executor, IntoArguments, Row as _, Type};

/// `pool.begin()`, safe to cancel: see [`begin_with`].
pub async fn begin<DB: Database>(
    pool: &sqlx::Pool<DB>,
) -> sqlx::Result<sqlx::Transaction<'static, DB>> {
    begin_maybe_with(pool, None::<&'static str>).await
}

/// `pool.begin_with(statement)`, safe to cancel. Every transaction of this crate begins
/// through it or [`begin`].
///
/// sqlx 0.8 counts a transaction as open only once its `BEGIN` has come back, and on SQLite
/// a custom `BEGIN` is checked with a second round trip to the connection's thread after
/// that: a future dropped in between (by a `timeout`, a `select!` or an aborted task)
/// leaves its pooled connection inside a transaction that nothing rolls back. On SQLite a
/// `BEGIN IMMEDIATE` left so holds the file's write lock until that connection closes, and
/// every other writer fails with "database is locked" when its busy timeout runs out; on
/// PostgreSQL and MariaDB (a plain `BEGIN` too) the session stays idle in its transaction
/// with whatever it locks. Here the begin runs in a task of its own: if the caller has gone
/// when it ends, the task drops the transaction, which rolls it back.
///
/// ```
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let pool = sqlx::SqlitePool::connect("sqlite::memory:").await?;
/// let tx = justonce_sql::begin_with(&pool, "BEGIN IMMEDIATE").await?;
/// tx.commit().await?;
/// # Ok(()) }
/// ```
pub async fn begin_with<DB: Database>(
    pool: &sqlx::Pool<DB>,
    statement: impl Into<Cow<'static, str>>,
) -> sqlx::Result<sqlx::Transaction<'static, DB>> {
    begin_maybe_with(pool, Some(statement)).await
}

/// [`begin_with`] when `statement` is given, else [`begin`]: a backend's `BEGIN`.
pub(crate) async fn begin_maybe_with<DB: Database>(
    pool: &sqlx::Pool<DB>,
    statement: Option<impl Into<Cow<'static, str>>>,
) -> sqlx::Result<sqlx::Transaction<'static, DB>> {
    let (pool, statement) = (pool.clone(), statement.map(Into::into));
    let begun = tokio::spawn(async move {
        match statement {
            Some(statement) => pool.begin_with(statement).await,
            None => pool.begin().await,
        }
    });
    match begun.await {
        Ok(begun) => begun,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(e) => Err(sqlx::Error::Io(std::io::Error::other(e))),
    }
}

/// A bound parameter.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Arg<'a> {
    Text(&'a str),
    Int(i64),
    Blob(Option<&'a [u8]>),
    MaybeText(Option<&'a str>),
}

/// A claim row as an acquire reads it: columns `fingerprint, state, token, result,
/// remaining` (milliseconds left on the lease by the database clock, `NULL` when none).
#[derive(Debug)]
pub(crate) struct ClaimRow {
    pub(crate) fingerprint: String,
    pub(crate) state: String,
    pub(crate) token: i64,
    pub(crate) remaining_ms: Option<i64>,
    pub(crate) result: Option<Vec<u8>>,
}

/// A dead letter's row: columns `seq, message_id, payload, headers, content_type,
/// attempts, error, consumer, dead_lettered_at` (milliseconds since the Unix epoch), the
/// integers as 64-bit.
#[derive(Debug)]
pub(crate) struct DeadLetterRow {
    pub(crate) seq: i64,
    pub(crate) message_id: Option<String>,
    pub(crate) payload: Vec<u8>,
    pub(crate) headers: String,
    pub(crate) content_type: Option<String>,
    pub(crate) attempts: i64,
    pub(crate) error: String,
    pub(crate) consumer: String,
    pub(crate) at_ms: i64,
}

/// An outbox row as a take reads it: columns `seq, okey, message_id, payload, headers,
/// content_type, attempts`, the integers as 64-bit.
#[derive(Debug)]
pub(crate) struct OutboxRawRow {
    pub(crate) seq: i64,
    pub(crate) key: Option<String>,
    pub(crate) message_id: Option<String>,
    pub(crate) payload: Vec<u8>,
    pub(crate) headers: String,
    pub(crate) content_type: Option<String>,
    pub(crate) attempts: i64,
}

/// What the stores run on a connection. Implemented once, for every sqlx connection whose
/// database binds and decodes the types of [`Arg`] (SQLite, PostgreSQL, MariaDB).
#[async_trait]
pub(crate) trait Conn: Send {
    /// Runs `sql`; the rows it changed.
    async fn execute<'q>(&mut self, sql: &'q str, args: &[Arg<'q>]) -> Result<u64, sqlx::Error>;
    /// The first column of the first row, as text; `None` without a row.
    async fn text<'q>(
        &mut self,
        sql: &'q str,
        args: &[Arg<'q>],
    ) -> Result<Option<String>, sqlx::Error>;
    /// The first column of the first row, as an integer; `None` without a row.
    async fn int<'q>(&mut self, sql: &'q str, args: &[Arg<'q>])
        -> Result<Option<i64>, sqlx::Error>;
    /// The first two columns of every row, as text.
    async fn text_pairs<'q>(
        &mut self,
        sql: &'q str,
        args: &[Arg<'q>],
    ) -> Result<Vec<(String, String)>, sqlx::Error>;
    /// The first row as a [`ClaimRow`].
    async fn claim_row<'q>(
        &mut self,
        sql: &'q str,
        args: &[Arg<'q>],
    ) -> Result<ClaimRow, sqlx::Error>;
    /// Every row, each column as optional text (the SQL casts what is not text).
    async fn text_rows<'q>(
        &mut self,
        sql: &'q str,
        args: &[Arg<'q>],
    ) -> Result<Vec<Vec<Option<String>>>, sqlx::Error>;
    /// Every row as a [`DeadLetterRow`].
    async fn dead_letter_rows<'q>(
        &mut self,
        sql: &'q str,
        args: &[Arg<'q>],
    ) -> Result<Vec<DeadLetterRow>, sqlx::Error>;
    /// Every row as an [`OutboxRawRow`].
    async fn outbox_rows<'q>(
        &mut self,
        sql: &'q str,
        args: &[Arg<'q>],
    ) -> Result<Vec<OutboxRawRow>, sqlx::Error>;
}

/// The rows a statement changed (sqlx has no trait for it).
pub(crate) trait Affected {
    fn rows(&self) -> u64;
}

impl Affected for sqlx::sqlite::SqliteQueryResult {
    fn rows(&self) -> u64 {
        self.rows_affected()
    }
}

#[cfg(feature = "postgres")]
impl Affected for sqlx::postgres::PgQueryResult {
    fn rows(&self) -> u64 {
        self.rows_affected()
    }
}

#[cfg(feature = "mysql")]
impl Affected for sqlx::mysql::MySqlQueryResult {
    fn rows(&self) -> u64 {
        self.rows_affected()
    }
}

/// `sql` with `args` bound in order.
fn query<'q, DB>(sql: &'q str, args: &[Arg<'q>]) -> sqlx::query::Query<'q, DB, DB::Arguments<'q>>
where
    DB: Database,
    &'q str: Encode<'q, DB> + Type<DB>,
    i64: Encode<'q, DB> + Type<DB>,
    Option<&'q [u8]>: Encode<'q, DB> + Type<DB>,
    Option<&'q str>: Encode<'q, DB> + Type<DB>,
{
    let mut q = sqlx::query(sql);
    for arg in args {
        q = match *arg {
            Arg::Text(s) => q.bind(s),
            Arg::Int(n) => q.bind(n),
            Arg::Blob(b) => q.bind(b),
            Arg::MaybeText(s) => q.bind(s),
        };
    }
    q
}

#[async_trait]
impl<C> Conn for C
where
    C: sqlx::Connection,
    for<'c> &'c mut C: Executor<'c, Database = C::Database>,
    for<'q> <C::Database as Database>::Arguments<'q>: IntoArguments<'q, C::Database>,
    for<'q> &'q str: Encode<'q, C::Database> + Type<C::Database>,
    for<'q> Option<&'q [u8]>: Encode<'q, C::Database> + Type<C::Database>,
    for<'q> Option<&'q str>: Encode<'q, C::Database> + Type<C::Database>,
    for<'q> i64: Encode<'q, C::Database> + Decode<'q, C::Database> + Type<C::Database>,
    for<'r> String: Decode<'r, C::Database> + Type<C::Database>,
    for<'r> Vec<u8>: Decode<'r, C::Database> + Type<C::Database>,
    usize: ColumnIndex<<C::Database as Database>::Row>,
    <C::Database as Database>::QueryResult: Affected,
{
    async fn execute<'q>(&mut self, sql: &'q str, args: &[Arg<'q>]) -> Result<u64, sqlx::Error> {
        let done = Executor::execute(self, query::<C::Database>(sql, args)).await?;
        Ok(done.rows())
    }

    async fn text<'q>(
        &mut self,
        sql: &'q str,
        args: &[Arg<'q>],
    ) -> Result<Option<String>, sqlx::Error> {
        let row = self.fetch_optional(query::<C::Database>(sql, args)).await?;
        row.map(|r| r.try_get(0)).transpose()
    }

    async fn int<'q>(
        &mut self,
        sql: &'q str,
        args: &[Arg<'q>],
    ) -> Result<Option<i64>, sqlx::Error> {
        let row = self.fetch_optional(query::<C::Database>(sql, args)).await?;
        row.map(|r| r.try_get(0)).transpose()
    }

    async fn text_pairs<'q>(
        &mut self,
        sql: &'q str,
        args: &[Arg<'q>],
    ) -> Result<Vec<(String, String)>, sqlx::Error> {
        let rows = self.fetch_all(query::<C::Database>(sql, args)).await?;
        rows.iter()
            .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
            .collect()
    }

    async fn claim_row<'q>(
        &mut self,
        sql: &'q str,
        args: &[Arg<'q>],
    ) -> Result<ClaimRow, sqlx::Error> {
        let r = self.fetch_one(query::<C::Database>(sql, args)).await?;
        Ok(ClaimRow {
            fingerprint: r.try_get(0)?,
            state: r.try_get(1)?,
            token: r.try_get(2)?,
            result: r.try_get(3)?,
            remaining_ms: r.try_get(4)?,
        })
    }

    async fn text_rows<'q>(
        &mut self,
        sql: &'q str,
        args: &[Arg<'q>],
    ) -> Result<Vec<Vec<Option<String>>>, sqlx::Error> {
        let rows = self.fetch_all(query::<C::Database>(sql, args)).await?;
        rows.iter()
            .map(|r| (0..r.len()).map(|i| r.try_get(i)).collect())
            .collect()
    }

    async fn dead_letter_rows<'q>(
        &mut self,
        sql: &'q str,
        args: &[Arg<'q>],
    ) -> Result<Vec<DeadLetterRow>, sqlx::Error> {
        let rows = self.fetch_all(query::<C::Database>(sql, args)).await?;
        rows.iter()
            .map(|r| {
                Ok(DeadLetterRow {
                    seq: r.try_get(0)?,
                    message_id: r.try_get(1)?,
                    payload: r.try_get(2)?,
                    headers: r.try_get(3)?,
                    content_type: r.try_get(4)?,
                    attempts: r.try_get(5)?,
                    error: r.try_get(6)?,
                    consumer: r.try_get(7)?,
                    at_ms: r.try_get(8)?,
                })
            })
            .collect()
    }

    async fn outbox_rows<'q>(
        &mut self,
        sql: &'q str,
        args: &[Arg<'q>],
    ) -> Result<Vec<OutboxRawRow>, sqlx::Error> {
        let rows = self.fetch_all(query::<C::Database>(sql, args)).await?;
        rows.iter()
            .map(|r| {
                Ok(OutboxRawRow {
                    seq: r.try_get(0)?,
                    key: r.try_get(1)?,
                    message_id: r.try_get(2)?,
                    payload: r.try_get(3)?,
                    headers: r.try_get(4)?,
                    content_type: r.try_get(5)?,
                    attempts: r.try_get(6)?,
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use futures_lite::future::poll_once;
    use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};

    /// 2,000 begins dropped after 0 to 39 polls, a yield between polls, then writes from the
    /// same pool: no begin may have left its connection holding the write lock. With sqlx's
    /// own `begin_with` instead (`JO_RAW_BEGIN=1`) it failed two runs of four.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_begin_dropped_at_any_poll_leaves_no_write_lock_behind() {
        let dir = tempfile::tempdir().unwrap();
        let opts = SqliteConnectOptions::new()
            .filename(dir.path().join("t.db"))
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .busy_timeout(Duration::from_secs(2));
        let pool = SqlitePoolOptions::new()
            .max_connections(4)
            .connect_with(opts)
            .await
            .unwrap();
        sqlx::query("CREATE TABLE t (x INTEGER)")
            .execute(&pool)
            .await
            .unwrap();
        let raw = std::env::var("JO_RAW_BEGIN").is_ok();
        for i in 0..2000u32 {
            let begin = async {
                if raw {
                    pool.begin_with("BEGIN IMMEDIATE").await
                } else {
                    super::begin_with(&pool, "BEGIN IMMEDIATE").await
                }
            };
            let mut begin = Box::pin(begin);
            for _ in 0..i % 40 {
                if poll_once(begin.as_mut()).await.is_some() {
                    break;
                }
                tokio::task::yield_now().await;
            }
            drop(begin);
        }
        for _ in 0..8 {
            let mut tx = super::begin_with(&pool, "BEGIN IMMEDIATE")
                .await
                .expect("no connection holds the write lock");
            sqlx::query("INSERT INTO t VALUES (1)")
                .execute(&mut *tx)
                .await
                .unwrap();
            tx.commit().await.unwrap();
        }
    }
}
