//! A log consumer's positions in a SQL store's database ([`justonce_core::Positions`]):
//! a Kafka source seeks to them when it is assigned partitions, and the runtime moves
//! them in the batch's transaction, beside the effects and the dedup records. One row per
//! consumer, topic and partition; a position only moves forward. Written once over
//! [`Conn`]; each backend gives its DDL and SQL text.

use std::sync::Arc;

use async_trait::async_trait;
use justonce_core::{
    validate_identifier, Error, ErrorKind, Position, Positions, PositionsIn, Result,
};

use crate::conn::{Arg, Conn};

/// A backend's positions statements. `load` (consumer, topic) answers rows of text
/// `partition, offset`; `save` (consumer, topic, partition, offset) writes one partition's
/// position unless the row holds a larger one.
#[derive(Debug)]
pub(crate) struct PositionsSql {
    pub(crate) load: String,
    pub(crate) save: String,
}

/// The positions table of a SQL store: [`SqliteStore::positions`](crate::SqliteStore::positions),
/// [`PgStore::positions`](crate::PgStore::positions),
/// [`MySqlStore::positions`](crate::MySqlStore::positions). Table `jo_positions` unless named.
pub struct SqlPositions<DB: sqlx::Database> {
    pool: sqlx::Pool<DB>,
    sql: Arc<PositionsSql>,
}

impl<DB: sqlx::Database> Clone for SqlPositions<DB> {
    fn clone(&self) -> Self {
        SqlPositions {
            pool: self.pool.clone(),
            sql: self.sql.clone(),
        }
    }
}

impl<DB: sqlx::Database> std::fmt::Debug for SqlPositions<DB> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqlPositions").finish_non_exhaustive()
    }
}

impl<DB: sqlx::Database> SqlPositions<DB> {
    pub(crate) fn new(pool: sqlx::Pool<DB>, sql: PositionsSql) -> Self {
        SqlPositions {
            pool,
            sql: Arc::new(sql),
        }
    }
}

/// The default table.
pub(crate) const TABLE: &str = "jo_positions";

pub(crate) fn checked(table: &str) -> Result<&str> {
    validate_identifier(table)?;
    Ok(table)
}

fn parse(rows: Vec<(String, String)>, partitions: &[i32]) -> Result<Vec<Position>> {
    let mut out = Vec::with_capacity(rows.len());
    for (p, o) in rows {
        let (Ok(partition), Ok(offset)) = (p.trim().parse::<i32>(), o.trim().parse::<i64>()) else {
            return Err(Error::new(
                ErrorKind::Internal,
                format!("a positions row justonce cannot read: partition {p:?}, offset {o:?}"),
            ));
        };
        if partitions.contains(&partition) {
            out.push(Position { partition, offset });
        }
    }
    out.sort();
    Ok(out)
}

#[async_trait]
impl<DB> Positions for SqlPositions<DB>
where
    DB: sqlx::Database<Connection: Conn>,
{
    async fn load(&self, consumer: &str, topic: &str, partitions: &[i32]) -> Result<Vec<Position>> {
        let mut conn = self.pool.acquire().await?;
        let rows = (*conn)
            .text_pairs(&self.sql.load, &[Arg::Text(consumer), Arg::Text(topic)])
            .await?;
        parse(rows, partitions)
    }

    async fn save(&self, consumer: &str, topic: &str, positions: &[Position]) -> Result<()> {
        let mut conn = self.pool.acquire().await?;
        for p in positions {
            let args = [
                Arg::Text(consumer),
                Arg::Text(topic),
                Arg::Int(i64::from(p.partition)),
                Arg::Int(p.offset),
            ];
            (*conn).execute(&self.sql.save, &args).await?;
        }
        Ok(())
    }
}

#[async_trait]
impl<DB> PositionsIn<sqlx::Transaction<'static, DB>> for SqlPositions<DB>
where
    DB: sqlx::Database<Connection: Conn>,
{
    async fn save_in(
        &self,
        tx: &mut sqlx::Transaction<'static, DB>,
        consumer: &str,
        topic: &str,
        positions: &[Position],
    ) -> Result<()> {
        for p in positions {
            let args = [
                Arg::Text(consumer),
                Arg::Text(topic),
                Arg::Int(i64::from(p.partition)),
                Arg::Int(p.offset),
            ];
            (**tx).execute(&self.sql.save, &args).await?;
        }
        Ok(())
    }
}

impl crate::SqliteStore {
    /// The store's positions table, `jo_positions`, created if missing: where a Kafka
    /// source keeps its consumer's positions, moved in this store's transactions.
    pub async fn positions(&self) -> Result<SqlPositions<sqlx::Sqlite>> {
        self.positions_in_table(TABLE, true).await
    }

    /// As [`SqliteStore::positions`](crate::SqliteStore::positions), in `table`; with
    /// `create` false the table must exist (tools).
    pub async fn positions_in_table(
        &self,
        table: &str,
        create: bool,
    ) -> Result<SqlPositions<sqlx::Sqlite>> {
        let t = checked(table)?;
        if create {
            sqlx::raw_sql(&format!(
                "CREATE TABLE IF NOT EXISTS {t} (
                 consumer    TEXT    NOT NULL,
                 topic       TEXT    NOT NULL,
                 part        INTEGER NOT NULL,
                 next_offset INTEGER NOT NULL,
                 PRIMARY KEY (consumer, topic, part)
             ) WITHOUT ROWID"
            ))
            .execute(self.pool())
            .await?;
        }
        Ok(SqlPositions::new(
            self.pool().clone(),
            PositionsSql {
                load: format!(
                    "SELECT CAST(part AS TEXT), CAST(next_offset AS TEXT) FROM {t} \
                     WHERE consumer = ? AND topic = ?"
                ),
                save: format!(
                    "INSERT INTO {t} (consumer, topic, part, next_offset) VALUES (?, ?, ?, ?) \
                     ON CONFLICT (consumer, topic, part) DO UPDATE \
                     SET next_offset = MAX(next_offset, excluded.next_offset)"
                ),
            },
        ))
    }
}

#[cfg(feature = "postgres")]
impl crate::PgStore {
    /// The store's positions table, `jo_positions`, created if missing: where a Kafka
    /// source keeps its consumer's positions, moved in this store's transactions.
    pub async fn positions(&self) -> Result<SqlPositions<sqlx::Postgres>> {
        self.positions_in_table(TABLE, true).await
    }

    /// As [`PgStore::positions`](crate::PgStore::positions), in `table`; with `create`
    /// false the table must exist (tools).
    pub async fn positions_in_table(
        &self,
        table: &str,
        create: bool,
    ) -> Result<SqlPositions<sqlx::Postgres>> {
        let t = checked(table)?;
        if create {
            crate::postgres::create(
                self.pool(),
                &[format!(
                    "CREATE TABLE IF NOT EXISTS {t} (
                     consumer    TEXT    NOT NULL,
                     topic       TEXT    NOT NULL,
                     part        INTEGER NOT NULL,
                     next_offset BIGINT  NOT NULL,
                     PRIMARY KEY (consumer, topic, part))"
                )],
            )
            .await?;
        }
        Ok(SqlPositions::new(
            self.pool().clone(),
            PositionsSql {
                load: format!(
                    "SELECT part::text, next_offset::text FROM {t} WHERE consumer = $1 AND topic = $2"
                ),
                save: format!(
                    "INSERT INTO {t} AS p (consumer, topic, part, next_offset) \
                     VALUES ($1, $2, $3::int, $4) \
                     ON CONFLICT (consumer, topic, part) DO UPDATE \
                     SET next_offset = GREATEST(p.next_offset, EXCLUDED.next_offset)"
                ),
            },
        ))
    }
}

#[cfg(feature = "mysql")]
impl crate::MySqlStore {
    /// The store's positions table, `jo_positions`, created if missing: where a Kafka
    /// source keeps its consumer's positions, moved in this store's transactions.
    pub async fn positions(&self) -> Result<SqlPositions<sqlx::MySql>> {
        self.positions_in_table(TABLE, true).await
    }

    /// As [`MySqlStore::positions`](crate::MySqlStore::positions), in `table`; with
    /// `create` false the table must exist (tools).
    pub async fn positions_in_table(
        &self,
        table: &str,
        create: bool,
    ) -> Result<SqlPositions<sqlx::MySql>> {
        let t = checked(table)?;
        if create {
            sqlx::query(&format!(
                "CREATE TABLE IF NOT EXISTS {t} (
                 consumer    VARCHAR(100) NOT NULL,
                 topic       VARCHAR(249) NOT NULL,
                 part        INT          NOT NULL,
                 next_offset BIGINT       NOT NULL,
                 PRIMARY KEY (consumer, topic, part)
             ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin"
            ))
            .execute(self.pool())
            .await?;
        }
        Ok(SqlPositions::new(
            self.pool().clone(),
            PositionsSql {
                load: format!(
                    "SELECT CAST(part AS CHAR), CAST(next_offset AS CHAR) FROM {t} \
                     WHERE consumer = ? AND topic = ?"
                ),
                save: format!(
                    "INSERT INTO {t} (consumer, topic, part, next_offset) VALUES (?, ?, ?, ?) \
                     ON DUPLICATE KEY UPDATE next_offset = GREATEST(next_offset, VALUES(next_offset))"
                ),
            },
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_of_other_partitions_are_left_out_and_the_rest_sorted() {
        let rows = vec![
            ("2".into(), "40".into()),
            ("0".into(), "7".into()),
            ("5".into(), "1".into()),
        ];
        assert_eq!(
            parse(rows, &[0, 2]).unwrap(),
            [
                Position {
                    partition: 0,
                    offset: 7
                },
                Position {
                    partition: 2,
                    offset: 40
                }
            ]
        );
        assert!(parse(vec![("x".into(), "1".into())], &[0]).is_err());
    }
}
