//! The demo's business data in Redis ([`RedisStore`]): the balances in a hash, the ledger
//! in a list, written by the handler through its [`RedisTx`] and committed with the dedup
//! records in one script. The strategies that need a database's constraints or row locks
//! (unique key, state machine, version) and the outbox are SQL only, and say so.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use justonce::backend::StoreKind;
use justonce::redis::{RedisClaimOptions, RedisClaimStore, RedisStore, RedisStoreOptions, RedisTx};
use justonce::{
    async_trait, Cas, ClaimStore, Error, Message, OutboxFailure, OutboxRow, OutboxStats,
    OutboxStore, Result, StateMachine, Store, Transition,
};
use redis::AsyncCommands;

use super::{Bank, Effects, Payment, Receipt, Seen, Tables};

fn sql_only(what: &str) -> Error {
    Error::config(format!(
        "{what} needs a SQL store (sqlite:, postgres://, mysql://); on Redis the demo runs the \
         dedup-table and claim strategies"
    ))
}

fn redis_error(what: &str, e: redis::RedisError) -> Error {
    Error::with_source(justonce::ErrorKind::Io, what.to_owned(), e)
}

/// The list of `(order id, account, amount)` ledger entries, as `id|account|amount`.
fn ledger_entry(p: &Payment) -> String {
    format!("{}|{}|{}", p.order_id, p.account, p.amount)
}

#[async_trait]
impl Bank for RedisStore {
    const KIND: StoreKind = StoreKind::Redis;

    type StateGuard = ();
    type VersionGuard = ();

    async fn open(url: &str, t: &Tables) -> Result<Self> {
        let o = RedisStoreOptions::default().prefix(format!("{}:", t.dedup));
        RedisStore::connect_with(url, o).await
    }

    async fn setup(&self, _t: &Tables, _orders: &[&str]) -> Result<()> {
        // A hash field is created by its first increment: every account exists at 0.
        Ok(())
    }

    async fn drop_tables(&self, t: &Tables) -> Result<()> {
        let mut conn = self.connection();
        let mut keys: Vec<String> = t.all().iter().map(|k| k.to_string()).collect();
        // SCAN, not KEYS: the server may be shared, and KEYS blocks it for the whole walk.
        for prefix in [&t.dedup, &t.claims] {
            let mut found = conn
                .scan_match::<_, String>(format!("{prefix}:*"))
                .await
                .map_err(|e| redis_error("listing the run's keys", e))?;
            while let Some(k) = found.next_item().await {
                keys.push(k.map_err(|e| redis_error("listing the run's keys", e))?);
            }
        }
        for chunk in keys.chunks(1000) {
            let _: () = conn
                .del(chunk)
                .await
                .map_err(|e| redis_error("deleting the run's keys", e))?;
        }
        Ok(())
    }

    async fn effects(&self, t: &Tables) -> Result<Effects> {
        let mut conn = self.connection();
        let ledger: Vec<String> = conn
            .lrange(&t.ledger, 0, -1)
            .await
            .map_err(|e| redis_error("reading the ledger", e))?;
        let balances: HashMap<String, i64> = conn
            .hgetall(&t.accounts)
            .await
            .map_err(|e| redis_error("reading the balances", e))?;
        let mut per_order: HashMap<String, u64> = HashMap::new();
        let mut by_account: HashMap<String, i64> = HashMap::new();
        for entry in &ledger {
            let mut parts = entry.split('|');
            let (Some(order), Some(account), Some(amount)) =
                (parts.next(), parts.next(), parts.next())
            else {
                continue;
            };
            *per_order.entry(order.to_owned()).or_default() += 1;
            *by_account.entry(account.to_owned()).or_default() +=
                amount.parse::<i64>().unwrap_or(0);
        }
        let consistent = balances.iter().all(|(a, b)| by_account.get(a) == Some(b))
            && by_account
                .iter()
                .all(|(a, s)| *s == 0 || balances.get(a) == Some(s));
        Ok(Effects {
            per_order,
            total: ledger.len() as u64,
            consistent,
        })
    }

    async fn claims(&self, url: &str, t: &Tables) -> Result<Arc<dyn ClaimStore>> {
        let o = RedisClaimOptions::default().prefix(format!("{}:", t.claims));
        Ok(Arc::new(RedisClaimStore::connect_with(url, o).await?))
    }

    fn state_guard(_orders: &str, _machine: StateMachine) -> Result<()> {
        Err(sql_only("the state-machine strategy"))
    }

    fn version_guard(_orders: &str) -> Result<()> {
        Err(sql_only("the version strategy"))
    }

    async fn record_order(_tx: &mut RedisTx, _t: &Tables, _order_id: &str) -> Result<()> {
        Err(sql_only("the unique-key strategy"))
    }

    async fn transition(
        _g: &(),
        _tx: &mut RedisTx,
        _order_id: &str,
        _to: &str,
    ) -> Result<Transition> {
        Err(sql_only("the state-machine strategy"))
    }

    async fn bump(_g: &(), _tx: &mut RedisTx, _order_id: &str, _expected: i64) -> Result<Cas> {
        Err(sql_only("the version strategy"))
    }

    async fn pay(tx: &mut RedisTx, t: &Tables, p: &Payment) -> Result<bool> {
        tx.hincr_by(&t.accounts, p.account.to_string(), p.amount);
        tx.rpush(&t.ledger, ledger_entry(p));
        Ok(true)
    }

    async fn record_deliveries(&self, t: &Tables, rows: &[Seen]) -> Result<()> {
        if rows.is_empty() {
            return Ok(());
        }
        let entries: Vec<String> = rows.iter().map(entry).collect();
        let _: () = self
            .connection()
            .rpush(&t.deliveries, entries)
            .await
            .map_err(|e| redis_error("recording deliveries", e))?;
        Ok(())
    }

    async fn ledger_rows(&self, t: &Tables) -> Result<u64> {
        self.connection()
            .llen(&t.ledger)
            .await
            .map_err(|e| redis_error("counting the ledger", e))
    }

    async fn ledger_high(&self, t: &Tables) -> Result<u64> {
        self.ledger_rows(t).await
    }

    async fn delivery_counts(&self, t: &Tables) -> Result<(u64, u64)> {
        Ok(counts(&deliveries(self, t).await?))
    }

    async fn broker_duplicates(&self, t: &Tables) -> Result<u64> {
        Ok(duplicates(&deliveries(self, t).await?))
    }

    async fn place(_tx: &mut RedisTx, _t: &Tables, _order_id: &str) -> Result<bool> {
        Err(sql_only("the lab's producer (its outbox)"))
    }

    async fn begin_direct(&self) -> Result<RedisTx> {
        self.begin().await
    }

    async fn commit_direct(_tx: RedisTx) -> Result<()> {
        Err(sql_only("the bench's bare baseline"))
    }

    async fn close(&self) {}

    type Outbox = NoOutbox;

    async fn outbox(&self, _t: &Tables) -> Result<NoOutbox> {
        Err(sql_only("the outbox"))
    }

    async fn receipt(tx: &mut RedisTx, t: &Tables, r: &Receipt) -> Result<()> {
        tx.rpush(&t.receipts, &r.order_id);
        Ok(())
    }

    async fn receipts(&self, t: &Tables) -> Result<HashMap<String, u64>> {
        let ids: Vec<String> = self
            .connection()
            .lrange(&t.receipts, 0, -1)
            .await
            .map_err(|e| redis_error("reading the receipts", e))?;
        let mut out: HashMap<String, u64> = HashMap::new();
        for id in ids {
            *out.entry(id).or_default() += 1;
        }
        Ok(out)
    }

    async fn table_bytes(&self, table: &str) -> Result<u64> {
        let n: Option<u64> = redis::cmd("MEMORY")
            .arg("USAGE")
            .arg(table)
            .query_async(&mut self.connection())
            .await
            .map_err(|e| redis_error("reading a key's memory", e))?;
        Ok(n.unwrap_or(0))
    }

    async fn outbox_has_rows(&self, _table: &str) -> Result<bool> {
        Err(sql_only("the outbox"))
    }
}

/// An entry of the audit list: `AGAIN|POSITION|ID` (a message id may hold `|`; a
/// position never does).
fn entry(s: &Seen) -> String {
    format!(
        "{}|{}|{}",
        u8::from(s.redelivered),
        s.at.as_deref().unwrap_or(""),
        s.id.as_deref().unwrap_or("")
    )
}

fn parse(r: &str) -> Seen {
    let mut parts = r.splitn(3, '|');
    let again = parts.next().unwrap_or("") == "1";
    let at = parts.next().filter(|p| !p.is_empty()).map(str::to_owned);
    let id = parts.next().filter(|p| !p.is_empty()).map(str::to_owned);
    Seen {
        id,
        redelivered: again,
        at,
    }
}

/// Deliveries and redeliveries, as the SQL banks count them.
fn counts(rows: &[Seen]) -> (u64, u64) {
    let marked = rows
        .iter()
        .filter(|s| s.at.is_none() && s.redelivered)
        .count();
    let positioned: Vec<&str> = rows.iter().filter_map(|s| s.at.as_deref()).collect();
    let distinct: HashSet<&str> = positioned.iter().copied().collect();
    (
        rows.len() as u64,
        (marked + positioned.len() - distinct.len()) as u64,
    )
}

/// Broker duplicates, as the SQL banks count them.
fn duplicates(rows: &[Seen]) -> u64 {
    let mut firsts: HashMap<&str, u64> = HashMap::new();
    let mut places: HashMap<&str, HashSet<&str>> = HashMap::new();
    for s in rows {
        let Some(id) = s.id.as_deref() else { continue };
        match s.at.as_deref() {
            None if !s.redelivered => *firsts.entry(id).or_default() += 1,
            None => {}
            Some(at) => {
                places.entry(id).or_default().insert(at);
            }
        }
    }
    firsts.values().map(|n| n - 1).sum::<u64>()
        + places.values().map(|p| p.len() as u64 - 1).sum::<u64>()
}

/// The audit list.
async fn deliveries(store: &RedisStore, t: &Tables) -> Result<Vec<Seen>> {
    let rows: Vec<String> = store
        .connection()
        .lrange(&t.deliveries, 0, -1)
        .await
        .map_err(|e| redis_error("reading the deliveries", e))?;
    Ok(rows.iter().map(|r| parse(r)).collect())
}

/// Redis keeps no outbox: every call says so ([`Bank::outbox`] never makes one).
#[derive(Debug, Clone, Copy)]
pub(crate) struct NoOutbox;

#[async_trait]
impl OutboxStore for NoOutbox {
    type Tx = RedisTx;

    async fn enqueue(&self, _tx: &mut RedisTx, _m: &Message, _key: Option<&str>) -> Result<()> {
        Err(sql_only("the outbox"))
    }

    async fn take(&self, _owner: &str, _max: usize, _lease: Duration) -> Result<Vec<OutboxRow>> {
        Err(sql_only("the outbox"))
    }

    async fn mark_sent(&self, _seqs: &[u64]) -> Result<()> {
        Err(sql_only("the outbox"))
    }

    async fn mark_failed(
        &self,
        _seq: u64,
        _error: &str,
        _retry_after: Duration,
        _max_attempts: u32,
    ) -> Result<OutboxFailure> {
        Err(sql_only("the outbox"))
    }

    async fn release(&self, _seqs: &[u64]) -> Result<()> {
        Err(sql_only("the outbox"))
    }

    async fn outbox_stats(&self) -> Result<OutboxStats> {
        Err(sql_only("the outbox"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(id: &str, redelivered: bool, at: Option<&str>) -> Seen {
        Seen {
            id: Some(id.to_owned()),
            redelivered,
            at: at.map(str::to_owned),
        }
    }

    #[test]
    fn audit_entries_round_trip_and_ids_may_hold_the_separator() {
        for s in [
            seen("a|b", true, None),
            seen("m1", false, Some("0:17")),
            Seen {
                id: None,
                redelivered: false,
                at: Some("2:3".into()),
            },
        ] {
            assert_eq!(parse(&entry(&s)), s);
        }
    }

    /// Marks count where there is no position; a position read twice is a redelivery, a
    /// second position of one id a duplicate at the broker.
    #[test]
    fn redeliveries_and_broker_duplicates_from_marks_or_positions() {
        let marked = [
            seen("a", false, None),
            seen("a", true, None),
            seen("a", false, None),
        ];
        assert_eq!(counts(&marked), (3, 1));
        assert_eq!(duplicates(&marked), 1);
        let positioned = [
            seen("a", false, Some("0:1")),
            seen("a", true, Some("0:1")),
            seen("a", false, Some("0:1")),
            seen("a", false, Some("0:9")),
            seen("b", false, Some("0:2")),
        ];
        assert_eq!(counts(&positioned), (5, 2));
        assert_eq!(duplicates(&positioned), 1);
    }
}
