//! [`RedisStore`]: effects that live in Redis, committed with their dedup records in one
//! script, so that a handler whose effects are Redis writes is effectively-once with no
//! database.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use justonce_core::{
    Claim, DedupKey, DedupStore, Error, ErrorKind, Fingerprint, MessageId, Result, Store,
};
use redis::aio::ConnectionManager;
use redis::{Script, Value};
use tracing::warn;

use crate::connection;
use crate::error::redis;
use crate::server::ServerSettings;

/// Options of a [`RedisStore`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RedisStoreOptions {
    /// The prefix of the dedup keys (default `jo:`); the handler names its own keys.
    pub prefix: String,
    /// How long a dedup record is kept, by key expiry (default 24 hours, the source
    /// article's `EX 86400`). The consumer refuses to start when its redelivery horizon is
    /// not shorter ([`DedupStore::expiry`]).
    pub expiry: Duration,
    /// How long a command may wait for its reply (default 5 s).
    pub response_timeout: Duration,
}

impl Default for RedisStoreOptions {
    fn default() -> Self {
        RedisStoreOptions {
            prefix: "jo:".into(),
            expiry: Duration::from_secs(86_400),
            response_timeout: Duration::from_secs(5),
        }
    }
}

impl RedisStoreOptions {
    /// Sets [`RedisStoreOptions::prefix`].
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Sets [`RedisStoreOptions::expiry`].
    pub fn expiry(mut self, expiry: Duration) -> Self {
        self.expiry = expiry;
        self
    }
}

/// One write of a handler, run at the commit.
#[derive(Debug, Clone, PartialEq)]
enum Write {
    HIncrBy(String, String, i64),
    HSet(String, String, Vec<u8>),
    IncrBy(String, i64),
    Set(String, Vec<u8>, Option<Duration>),
    RPush(String, Vec<u8>),
    SAdd(String, Vec<u8>),
    ZAdd(String, f64, Vec<u8>),
    Del(String),
    PExpire(String, Duration),
}

impl Write {
    /// The four script arguments: op, key, a, b.
    fn args(&self) -> [Vec<u8>; 4] {
        let s = |x: &str| x.as_bytes().to_vec();
        let none = Vec::new;
        match self {
            Write::HIncrBy(k, f, n) => [s("hincrby"), s(k), s(f), s(&n.to_string())],
            Write::HSet(k, f, v) => [s("hset"), s(k), s(f), v.clone()],
            Write::IncrBy(k, n) => [s("incrby"), s(k), s(&n.to_string()), none()],
            Write::Set(k, v, px) => [
                s("set"),
                s(k),
                v.clone(),
                px.map_or_else(none, |d| s(&d.as_millis().max(1).to_string())),
            ],
            Write::RPush(k, v) => [s("rpush"), s(k), v.clone(), none()],
            Write::SAdd(k, v) => [s("sadd"), s(k), v.clone(), none()],
            Write::ZAdd(k, score, v) => [s("zadd"), s(k), s(&score.to_string()), v.clone()],
            Write::Del(k) => [s("del"), s(k), none(), none()],
            Write::PExpire(k, d) => [s("pexpire"), s(k), s(&d.as_millis().to_string()), none()],
        }
    }
}

/// A dedup record waiting for the commit.
#[derive(Debug, Clone)]
struct Pending {
    key: String,
    fp: Fingerprint,
}

/// A transaction of a [`RedisStore`]: the handler's writes and the batch's dedup records,
/// buffered here and written by one script at [`Store::commit`], all or nothing. Nothing is
/// written before the commit, so a read in the handler sees what was committed before the
/// batch, never the batch's own writes.
///
/// The writes are the ones Redis can check before it runs them, so that a batch never
/// applies in part: increments of integers, sets, pushes, adds, deletes and expiries.
#[derive(Debug, Default)]
pub struct RedisTx {
    writes: Vec<Write>,
    claims: Vec<Pending>,
    /// Lengths of `writes` and `claims` at each open savepoint.
    savepoints: Vec<(usize, usize)>,
}

impl RedisTx {
    /// `HINCRBY key field by`.
    pub fn hincr_by(&mut self, key: impl Into<String>, field: impl Into<String>, by: i64) {
        self.writes
            .push(Write::HIncrBy(key.into(), field.into(), by));
    }

    /// `HSET key field value`.
    pub fn hset(
        &mut self,
        key: impl Into<String>,
        field: impl Into<String>,
        value: impl AsRef<[u8]>,
    ) {
        self.writes.push(Write::HSet(
            key.into(),
            field.into(),
            value.as_ref().to_vec(),
        ));
    }

    /// `INCRBY key by`.
    pub fn incr_by(&mut self, key: impl Into<String>, by: i64) {
        self.writes.push(Write::IncrBy(key.into(), by));
    }

    /// `SET key value`, with `PX` when `expiry` is given.
    pub fn set(
        &mut self,
        key: impl Into<String>,
        value: impl AsRef<[u8]>,
        expiry: Option<Duration>,
    ) {
        self.writes
            .push(Write::Set(key.into(), value.as_ref().to_vec(), expiry));
    }

    /// `RPUSH key value`.
    pub fn rpush(&mut self, key: impl Into<String>, value: impl AsRef<[u8]>) {
        self.writes
            .push(Write::RPush(key.into(), value.as_ref().to_vec()));
    }

    /// `SADD key member`.
    pub fn sadd(&mut self, key: impl Into<String>, member: impl AsRef<[u8]>) {
        self.writes
            .push(Write::SAdd(key.into(), member.as_ref().to_vec()));
    }

    /// `ZADD key score member`.
    pub fn zadd(&mut self, key: impl Into<String>, score: f64, member: impl AsRef<[u8]>) {
        self.writes
            .push(Write::ZAdd(key.into(), score, member.as_ref().to_vec()));
    }

    /// `DEL key`.
    pub fn del(&mut self, key: impl Into<String>) {
        self.writes.push(Write::Del(key.into()));
    }

    /// `PEXPIRE key ms`.
    pub fn pexpire(&mut self, key: impl Into<String>, expiry: Duration) {
        self.writes.push(Write::PExpire(key.into(), expiry));
    }

    /// Writes buffered so far.
    pub fn len(&self) -> usize {
        self.writes.len()
    }

    /// Whether nothing is buffered.
    pub fn is_empty(&self) -> bool {
        self.writes.is_empty() && self.claims.is_empty()
    }
}

/// A [`DedupStore`] whose business data lives in Redis: the handler writes through its
/// [`RedisTx`] (`tx.hincr_by("balances", "acct-7", 250)`), and the commit runs one script
/// that records the batch's dedup keys and applies the writes together, only if none of
/// the keys was recorded meanwhile and every write can run. A handler whose effects are
/// Redis writes is effectively-once with no database.
///
/// Redis holds no locks for a transaction: two batches of one message both find its key
/// fresh, and the second to commit is refused with [`ErrorKind::Busy`] and writes nothing.
/// The consumer hands that batch back; delivered again, the message is a duplicate.
///
/// ```no_run
/// use justonce_core::{DedupKey, DedupStore, Fingerprint, MessageId, Store};
/// use justonce_redis::RedisStore;
///
/// # async fn run() -> justonce_core::Result<()> {
/// let store = RedisStore::connect("redis://127.0.0.1:6379").await?;
/// let id = MessageId::new("PAY-1")?;
/// let mut tx = store.begin().await?;
/// let key = DedupKey { consumer: "billing", message_id: &id };
/// if store.claim(&mut tx, key, Fingerprint::of(b"payment")).await? == justonce_core::Claim::Fresh {
///     tx.hincr_by("shop:balances", "acct-7", 250);
///     tx.rpush("shop:ledger", "PAY-1");
/// }
/// store.commit(tx).await?; // the balance, the ledger entry and the dedup key, or nothing
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RedisStore {
    conn: ConnectionManager,
    opts: Arc<RedisStoreOptions>,
    commit: Arc<Script>,
    purge: Arc<Script>,
    server: Arc<ServerSettings>,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("opts", &self.opts)
            .finish()
    }
}

impl RedisStore {
    /// Connects with the default options, reads the server's settings and logs what they
    /// mean for the dedup records (a server that keeps nothing on disk, or may evict keys).
    pub async fn connect(url: &str) -> Result<Self> {
        Self::connect_with(url, RedisStoreOptions::default()).await
    }

    /// As [`RedisStore::connect`], with options.
    pub async fn connect_with(url: &str, opts: RedisStoreOptions) -> Result<Self> {
        if opts.expiry.is_zero() {
            return Err(Error::config("a Redis store's expiry must be above zero"));
        }
        let mut conn = connection::open(url, opts.response_timeout).await?;
        let commit = Script::new(include_str!("lua/commit.lua"));
        let purge = Script::new(include_str!("lua/dedup_purge.lua"));
        for script in [&commit, &purge] {
            script
                .load_async(&mut conn)
                .await
                .map_err(|e| redis("loading the store's scripts", e))?;
        }
        let server = ServerSettings::read(&mut conn).await?;
        for w in server.warnings() {
            warn!(url = %justonce_core::redact_url(url), "dedup records on Redis: {w}");
        }
        Ok(RedisStore {
            conn,
            opts: Arc::new(opts),
            commit: Arc::new(commit),
            purge: Arc::new(purge),
            server: Arc::new(server),
        })
    }

    /// The server's settings, as read at connect.
    pub fn server(&self) -> &ServerSettings {
        &self.server
    }

    /// The options.
    pub fn options(&self) -> &RedisStoreOptions {
        &self.opts
    }

    /// A connection for reads (and for anything a [`RedisTx`] cannot buffer): it sees what
    /// was committed, never a transaction's own writes.
    pub fn connection(&self) -> ConnectionManager {
        self.conn.clone()
    }

    /// The key of a dedup record: `{prefix}dedup:{length of the consumer}:{consumer}:{id}`.
    pub fn key_of(&self, key: DedupKey<'_>) -> String {
        format!(
            "{}dedup:{}:{}:{}",
            self.opts.prefix,
            key.consumer.len(),
            key.consumer,
            key.message_id
        )
    }

    /// The stored fingerprints of `keys` (`None`: not recorded), in one round trip.
    async fn stored(&self, keys: &[String]) -> Result<Vec<Option<String>>> {
        let mut pipe = redis::pipe();
        for k in keys {
            pipe.cmd("HGET").arg(k).arg("fp");
        }
        pipe.query_async(&mut self.conn.clone())
            .await
            .map_err(|e| redis("reading dedup records", e))
    }

    /// Answers `keys` against what is stored and what `tx` claimed already, and records the
    /// fresh ones in `tx`.
    fn decide(
        tx: &mut RedisTx,
        keys: Vec<(String, Fingerprint)>,
        stored: Vec<Option<String>>,
    ) -> Vec<Claim> {
        keys.into_iter()
            .zip(stored)
            .map(|((key, fp), stored)| {
                let earlier = tx
                    .claims
                    .iter()
                    .find(|p| p.key == key)
                    .map(|p| p.fp)
                    .or_else(|| {
                        stored.map(|s| {
                            Fingerprint::from_hex(&s)
                                .unwrap_or_else(|| Fingerprint::of(s.as_bytes()))
                        })
                    });
                match earlier {
                    None => {
                        tx.claims.push(Pending { key, fp });
                        Claim::Fresh
                    }
                    Some(stored) if stored == fp => Claim::Duplicate,
                    Some(stored) => Claim::Conflict { stored },
                }
            })
            .collect()
    }
}

#[async_trait]
impl Store for RedisStore {
    type Tx = RedisTx;

    fn backend(&self) -> &'static str {
        "redis"
    }

    async fn begin(&self) -> Result<RedisTx> {
        Ok(RedisTx::default())
    }

    async fn commit(&self, tx: RedisTx) -> Result<()> {
        if tx.is_empty() {
            return Ok(());
        }
        let mut call = self.commit.prepare_invoke();
        for p in &tx.claims {
            call.key(&p.key);
        }
        call.arg(self.opts.expiry.as_millis().max(1) as u64);
        for p in &tx.claims {
            call.arg(p.fp.to_hex());
        }
        for w in &tx.writes {
            for a in w.args() {
                call.arg(a);
            }
        }
        // Not asked again on a lost reply: the script may have run, and a second run would
        // find its own keys taken. The batch fails as not committed; the messages come back
        // and are answered from what is stored, duplicates if it ran.
        let reply: Vec<Value> = call
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(|e| redis("committing to Redis", e))?;
        let text = |i: usize| match reply.get(i) {
            Some(Value::BulkString(b)) => String::from_utf8_lossy(b).into_owned(),
            Some(Value::SimpleString(s)) => s.clone(),
            other => format!("{other:?}"),
        };
        match text(0).as_str() {
            "ok" => Ok(()),
            "taken" => Err(Error::new(
                ErrorKind::Busy,
                format!(
                    "dedup key {} was recorded by another batch since this one read it: \
                     nothing was written; delivered again, the message is a duplicate",
                    text(1)
                ),
            )),
            "refused" => Err(Error::new(
                ErrorKind::Schema,
                format!(
                    "a handler's write cannot run ({}); nothing was written: fix the data or \
                     the handler's keys",
                    text(2)
                ),
            )),
            _ => Err(Error::new(
                ErrorKind::Internal,
                format!("the commit script answered {reply:?}"),
            )),
        }
    }

    async fn rollback(&self, _tx: RedisTx) -> Result<()> {
        Ok(())
    }

    async fn savepoint(&self, tx: &mut RedisTx) -> Result<()> {
        tx.savepoints.push((tx.writes.len(), tx.claims.len()));
        Ok(())
    }

    async fn release_savepoint(&self, tx: &mut RedisTx) -> Result<()> {
        tx.savepoints.pop();
        Ok(())
    }

    async fn rollback_to_savepoint(&self, tx: &mut RedisTx) -> Result<()> {
        if let Some((writes, claims)) = tx.savepoints.pop() {
            tx.writes.truncate(writes);
            tx.claims.truncate(claims);
        }
        Ok(())
    }
}

#[async_trait]
impl DedupStore for RedisStore {
    async fn claim(&self, tx: &mut RedisTx, key: DedupKey<'_>, fp: Fingerprint) -> Result<Claim> {
        let name = self.key_of(key);
        let stored = self.stored(std::slice::from_ref(&name)).await?;
        let mut claims = Self::decide(tx, vec![(name, fp)], stored);
        claims
            .pop()
            .ok_or_else(|| Error::new(ErrorKind::Internal, "no claim answered"))
    }

    async fn claim_many(
        &self,
        tx: &mut RedisTx,
        consumer: &str,
        keys: &[(&MessageId, Fingerprint)],
    ) -> Result<Vec<Claim>> {
        let named: Vec<(String, Fingerprint)> = keys
            .iter()
            .map(|(id, fp)| {
                (
                    self.key_of(DedupKey {
                        consumer,
                        message_id: id,
                    }),
                    *fp,
                )
            })
            .collect();
        let names: Vec<String> = named.iter().map(|(k, _)| k.clone()).collect();
        let stored = self.stored(&names).await?;
        Ok(Self::decide(tx, named, stored))
    }

    /// Deletes records older than `retention`, one pass over the store's keys (`SCAN`)
    /// that stops after `batch` deletions. Expiry does this on its own; a purge only
    /// removes records sooner.
    async fn purge(&self, retention: Duration, batch: u32) -> Result<u64> {
        crate::scan::purge(
            &self.conn,
            &format!("{}dedup:*", self.opts.prefix),
            &self.purge,
            retention,
            batch,
        )
        .await
    }

    fn expiry(&self) -> Option<Duration> {
        Some(self.opts.expiry)
    }
}

/// What tools read in a Redis store (`justonce dedup`, `justonce doctor`): the dedup keys
/// under the prefix, counted per consumer with one `SCAN`; a record by its key; the
/// server's clock. Records go by key expiry, so a purge has rarely anything to do.
#[async_trait]
impl justonce_core::InspectStore for RedisStore {
    async fn dedup_stats(&self) -> Result<Vec<justonce_core::ConsumerRecords>> {
        let mut conn = self.conn.clone();
        let head = format!("{}dedup:", self.opts.prefix);
        let mut per: std::collections::BTreeMap<String, (u64, Option<u64>)> = Default::default();
        let mut cursor: u64 = 0;
        loop {
            let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(format!("{head}*"))
                .arg("COUNT")
                .arg(1000)
                .query_async(&mut conn)
                .await
                .map_err(|e| redis("scanning the dedup keys", e))?;
            if !keys.is_empty() {
                let mut pipe = redis::pipe();
                for k in &keys {
                    pipe.cmd("HGET").arg(k).arg("at");
                }
                let ats: Vec<Option<u64>> = pipe
                    .query_async(&mut conn)
                    .await
                    .map_err(|e| redis("reading the dedup records", e))?;
                for (k, at) in keys.iter().zip(ats) {
                    let Some(consumer) = consumer_of(&k[head.len()..]) else {
                        continue;
                    };
                    let e = per.entry(consumer.to_owned()).or_default();
                    e.0 += 1;
                    e.1 = match (e.1, at) {
                        (Some(a), Some(b)) => Some(a.min(b)),
                        (a, b) => a.or(b),
                    };
                }
            }
            if next == 0 {
                break;
            }
            cursor = next;
        }
        Ok(per
            .into_iter()
            .map(|(c, (n, oldest))| justonce_core::ConsumerRecords::new(c, n, oldest.map(at_ms)))
            .collect())
    }

    async fn dedup_record(&self, key: DedupKey<'_>) -> Result<Option<justonce_core::DedupRecord>> {
        let (fp, at): (Option<String>, Option<u64>) = redis::cmd("HMGET")
            .arg(self.key_of(key))
            .arg("fp")
            .arg("at")
            .query_async(&mut self.conn.clone())
            .await
            .map_err(|e| redis("reading a dedup record", e))?;
        let Some(fp) = fp else { return Ok(None) };
        let fp = Fingerprint::from_hex(&fp).ok_or_else(|| {
            Error::new(
                ErrorKind::Schema,
                format!("the dedup record {} holds no fingerprint", self.key_of(key)),
            )
        })?;
        Ok(Some(justonce_core::DedupRecord::new(fp, at.map(at_ms))))
    }

    async fn purge_records(&self, retention: Duration, batch: u32) -> Result<u64> {
        DedupStore::purge(self, retention, batch).await
    }

    async fn clock(&self) -> Result<Option<std::time::SystemTime>> {
        let (s, us): (u64, u64) = redis::cmd("TIME")
            .query_async(&mut self.conn.clone())
            .await
            .map_err(|e| redis("reading the server's clock", e))?;
        Ok(Some(
            std::time::UNIX_EPOCH + Duration::from_secs(s) + Duration::from_micros(us),
        ))
    }
}

/// The consumer in the rest of a dedup key after `dedup:` (`{len}:{consumer}:{id}`).
fn consumer_of(rest: &str) -> Option<&str> {
    let (len, tail) = rest.split_once(':')?;
    let len: usize = len.parse().ok()?;
    tail.get(..len)
}

fn at_ms(ms: u64) -> std::time::SystemTime {
    std::time::UNIX_EPOCH + Duration::from_millis(ms)
}

#[cfg(test)]
mod tests;
