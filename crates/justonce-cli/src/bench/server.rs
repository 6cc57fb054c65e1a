//! What a run asks the servers: their deadlock counts, and a known state before each timed
//! drain.

use justonce::backend::{StoreKind, TransportKind};

use super::run::BenchRunArgs;
use crate::bus::Bus;

/// The deadlocks the store's server has counted so far: PostgreSQL's for the database,
/// MariaDB's for the server. `None` on SQLite.
pub(crate) async fn deadlocks(store: &str) -> anyhow::Result<Option<u64>> {
    use sqlx::Connection as _;
    Ok(match StoreKind::from_url(store)? {
        StoreKind::Postgres => {
            let mut c = sqlx::PgConnection::connect(store).await?;
            let n: i64 = sqlx::query_scalar(
                "SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()",
            )
            .fetch_one(&mut c)
            .await?;
            c.close().await?;
            Some(n as u64)
        }
        StoreKind::MySql => {
            let url = store.replacen("mariadb://", "mysql://", 1);
            let mut c = sqlx::MySqlConnection::connect(&url).await?;
            let (_, n): (String, String) =
                sqlx::query_as("SHOW GLOBAL STATUS LIKE 'Innodb_deadlocks'")
                    .fetch_one(&mut c)
                    .await?;
            c.close().await?;
            Some(n.parse()?)
        }
        StoreKind::Sqlite | StoreKind::Redis => None,
    })
}

/// Brings the databases to the same state before every timed drain, so that no run pays
/// for the writes of the runs before it: on PostgreSQL a `VACUUM ANALYZE` of the queue
/// table (every run deletes its rows) and a `CHECKPOINT` (a checkpoint that starts during a
/// drain makes it write full pages again); on SQLite a checkpoint that empties the WAL.
pub(crate) async fn settle(args: &BenchRunArgs) -> anyhow::Result<()> {
    use sqlx::Connection as _;
    /// A database to bring to a known state, and whether the queue table is in it.
    enum Db {
        Postgres { queue: bool },
        Sqlite,
    }
    let mut dbs: Vec<(&str, Db)> = vec![];
    if args.store != args.transport {
        match StoreKind::from_url(&args.store)? {
            StoreKind::Postgres => dbs.push((&args.store, Db::Postgres { queue: false })),
            StoreKind::Sqlite => dbs.push((&args.store, Db::Sqlite)),
            StoreKind::MySql | StoreKind::Redis => {}
        }
    }
    match Bus::kind_of(&args.transport)? {
        TransportKind::Postgres => dbs.push((&args.transport, Db::Postgres { queue: true })),
        TransportKind::Sqlite => dbs.push((&args.transport, Db::Sqlite)),
        TransportKind::Amqp | TransportKind::Redis | TransportKind::Nats | TransportKind::Kafka => {
        }
    }
    for (url, db) in dbs {
        match db {
            Db::Postgres { queue } => {
                let mut c = sqlx::PgConnection::connect(url).await?;
                if queue {
                    sqlx::raw_sql("VACUUM ANALYZE jo_queue")
                        .execute(&mut c)
                        .await?;
                }
                if let Err(e) = sqlx::raw_sql("CHECKPOINT").execute(&mut c).await {
                    tracing::warn!(%e, "CHECKPOINT refused: runs may pay for earlier runs' writes");
                }
                c.close().await?;
            }
            Db::Sqlite => {
                let mut c = sqlx::SqliteConnection::connect(url).await?;
                sqlx::raw_sql("PRAGMA wal_checkpoint(TRUNCATE)")
                    .execute(&mut c)
                    .await?;
                c.close().await?;
            }
        }
    }
    Ok(())
}
