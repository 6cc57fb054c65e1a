//! [`RedisClaimStore`]: the source articles' `SET NX`, done so that none of its known
//! failures can happen.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use justonce_core::{
    ClaimState, ClaimStore, DedupKey, Error, ErrorKind, Fingerprint, Finish, Result,
};
use redis::aio::ConnectionManager;
use redis::{Script, Value};
use tracing::warn;

use crate::connection;
use crate::error::{is_ambiguous, redis};
use crate::server::ServerSettings;

/// Options of a [`RedisClaimStore`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RedisClaimOptions {
    /// The prefix of every key the store writes (default `jo:`).
    pub prefix: String,
    /// How long a completed claim is kept, by key expiry (default 24 hours, the source
    /// article's `EX 86400`); a held one is kept its lease plus this.
    pub expiry: Duration,
    /// How long a command may wait for its reply before it counts as ambiguous (default
    /// 5 s; redis-rs's own default, 500 ms, is short for a batch's script on a busy server).
    pub response_timeout: Duration,
}

impl Default for RedisClaimOptions {
    fn default() -> Self {
        RedisClaimOptions {
            prefix: "jo:".into(),
            expiry: Duration::from_secs(86_400),
            response_timeout: Duration::from_secs(5),
        }
    }
}

impl RedisClaimOptions {
    /// Sets [`RedisClaimOptions::prefix`].
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Sets [`RedisClaimOptions::expiry`].
    pub fn expiry(mut self, expiry: Duration) -> Self {
        self.expiry = expiry;
        self
    }

    /// Sets [`RedisClaimOptions::response_timeout`].
    pub fn response_timeout(mut self, timeout: Duration) -> Self {
        self.response_timeout = timeout;
        self
    }
}

struct Scripts {
    acquire: Script,
    finish: Script,
    purge: Script,
}

impl Scripts {
    fn new() -> Self {
        Scripts {
            acquire: Script::new(include_str!("lua/claim_acquire.lua")),
            finish: Script::new(include_str!("lua/claim_finish.lua")),
            purge: Script::new(include_str!("lua/claim_purge.lua")),
        }
    }
}

/// A [`ClaimStore`] on Redis, for effects outside any database (an email, a third-party
/// API): a claim with a lease by the server's clock and a fencing token, completed with its
/// result or released, each by one script.
///
/// - **One script per batch**, answering with what it found: a claim is taken, or the
///   existing record comes back in the same round trip (held with its time left, completed
///   with its result, or a conflict with the stored fingerprint). Nothing is read first and
///   written after, so nothing can change in between.
/// - **The server's clock** decides leases (`TIME` inside the script), never a worker's.
/// - **Fencing tokens** grow on every new holder, and across a restart of a server that
///   keeps nothing: a token is `max(last + 1, the server's clock in µs)`, so after a
///   restart the clock has passed every token issued before. The limit: a server whose
///   clock is set back across its restart by more than the time since the last token
///   could issue a token again. Within a run, a clock set back changes nothing (`last + 1`).
/// - **Compare-and-set completion**: a completion or release names its token, and is
///   refused (completion) or ignored (release) when the token no longer holds the claim,
///   so a holder paused past its lease cannot overwrite the next holder's claim or result.
/// - **An ambiguous reply** (the connection dropped, or the reply timed out, after the
///   script was sent) is resolved by running the script again with the same owner nonce:
///   a claim held by that nonce is the caller's, with its token. A completion repeated by
///   the same token is a success.
/// - **Retention by expiry**: a completed claim expires after
///   [`RedisClaimOptions::expiry`] (the article's `EX 86400`), a held one after its lease
///   plus that; the consumer refuses to start when the expiry is not longer than its
///   redelivery horizon, as with a purge-based retention.
///
/// ```no_run
/// use std::time::Duration;
/// use justonce_core::{ClaimState, ClaimStore, DedupKey, Fingerprint, MessageId};
/// use justonce_redis::RedisClaimStore;
///
/// # async fn run() -> justonce_core::Result<()> {
/// let claims = RedisClaimStore::connect("redis://127.0.0.1:6379").await?;
/// let id = MessageId::new("ORD-1")?;
/// let key = DedupKey { consumer: "mailer", message_id: &id };
/// match claims.acquire(key, Fingerprint::of(b"payload"), Duration::from_secs(30)).await? {
///     ClaimState::Acquired { token } => {
///         // send the email with `token` as its idempotency key, then:
///         claims.complete(key, token, Some(b"sent")).await?;
///     }
///     ClaimState::Completed { .. } => { /* sent before: ack */ }
///     ClaimState::InProgress { retry_after } => { /* someone is sending it: look again later */ }
///     ClaimState::Conflict { .. } => { /* same id, other payload: dead-letter */ }
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RedisClaimStore {
    conn: ConnectionManager,
    opts: Arc<RedisClaimOptions>,
    scripts: Arc<Scripts>,
    server: Arc<ServerSettings>,
}

impl std::fmt::Debug for RedisClaimStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisClaimStore")
            .field("opts", &self.opts)
            .finish()
    }
}

/// One claim's answer from the acquire script.
#[derive(Debug, PartialEq, Eq)]
enum Found {
    Acquired(u64),
    Held(Duration),
    Done(Option<Vec<u8>>),
    Conflict(String),
}

impl RedisClaimStore {
    /// Connects with the default options, reads the server's settings and logs what they
    /// mean for the claims (a server that keeps nothing on disk, or may evict keys).
    pub async fn connect(url: &str) -> Result<Self> {
        Self::connect_with(url, RedisClaimOptions::default()).await
    }

    /// As [`RedisClaimStore::connect`], with options.
    pub async fn connect_with(url: &str, opts: RedisClaimOptions) -> Result<Self> {
        if opts.expiry.is_zero() {
            return Err(Error::config(
                "a Redis claim store's expiry must be above zero",
            ));
        }
        let mut conn = connection::open(url, opts.response_timeout).await?;
        let scripts = Scripts::new();
        for script in [&scripts.acquire, &scripts.finish, &scripts.purge] {
            // Loaded now, so that the first call is one round trip (EVALSHA); after a
            // restart of the server redis-rs loads them again on NOSCRIPT.
            script
                .load_async(&mut conn)
                .await
                .map_err(|e| redis("loading the claim scripts", e))?;
        }
        let server = ServerSettings::read(&mut conn).await?;
        for w in server.warnings() {
            warn!(url = %justonce_core::redact_url(url), "claims on Redis: {w}");
        }
        Ok(RedisClaimStore {
            conn,
            opts: Arc::new(opts),
            scripts: Arc::new(scripts),
            server: Arc::new(server),
        })
    }

    /// The server's settings, as read at connect.
    pub fn server(&self) -> &ServerSettings {
        &self.server
    }

    /// The options.
    pub fn options(&self) -> &RedisClaimOptions {
        &self.opts
    }

    /// The key of a claim: `{prefix}claim:{length of the consumer}:{consumer}:{id}`. The
    /// length keeps a consumer with a `:` in its name apart from an id that has one.
    pub fn key_of(&self, key: DedupKey<'_>) -> String {
        format!(
            "{}claim:{}:{}:{}",
            self.opts.prefix,
            key.consumer.len(),
            key.consumer,
            key.message_id
        )
    }

    fn fence_key(&self) -> String {
        format!("{}fence", self.opts.prefix)
    }

    /// Runs `call` once more after an ambiguous failure, on a connection the manager has
    /// opened again: the scripts decide from what the first run left, so a second run
    /// answers what the first one did.
    async fn twice<T, F, Fut>(&self, what: &str, call: F) -> Result<T>
    where
        F: Fn(ConnectionManager) -> Fut,
        Fut: std::future::Future<Output = redis::RedisResult<T>>,
    {
        match call(self.conn.clone()).await {
            Ok(v) => Ok(v),
            Err(e) if is_ambiguous(&e) => {
                warn!(error = %e, "no reply to {what}: asking again with the same owner");
                call(self.conn.clone()).await.map_err(|e| redis(what, e))
            }
            Err(e) => Err(redis(what, e)),
        }
    }

    async fn acquire_all(
        &self,
        keys: &[(DedupKey<'_>, Fingerprint)],
        lease: Duration,
    ) -> Result<Vec<ClaimState>> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let owner = format!("{:016x}{:016x}", fastrand::u64(..), fastrand::u64(..));
        let lease_ms = lease.as_millis().max(1) as u64;
        let keep_ms = self.opts.expiry.as_millis().max(1) as u64;
        let names: Vec<String> = keys.iter().map(|(k, _)| self.key_of(*k)).collect();
        let fps: Vec<String> = keys.iter().map(|(_, fp)| fp.to_hex()).collect();
        let fence = self.fence_key();
        let reply: Vec<Vec<Value>> = self
            .twice("the claim script", |mut conn| {
                let mut call = self.scripts.acquire.key(&fence);
                for n in &names {
                    call.key(n);
                }
                call.arg(lease_ms).arg(keep_ms).arg(&owner);
                for fp in &fps {
                    call.arg(fp);
                }
                async move { call.invoke_async(&mut conn).await }
            })
            .await?;
        if reply.len() != keys.len() {
            return Err(Error::new(
                ErrorKind::Internal,
                format!(
                    "the claim script answered {} claims for {} keys",
                    reply.len(),
                    keys.len()
                ),
            ));
        }
        reply.iter().map(|r| Ok(state(parse_found(r)?))).collect()
    }
}

/// The acquire script's answer for one key.
fn parse_found(r: &[Value]) -> Result<Found> {
    let text = |v: Option<&Value>| -> Option<String> {
        match v {
            Some(Value::BulkString(b)) => Some(String::from_utf8_lossy(b).into_owned()),
            Some(Value::SimpleString(s)) => Some(s.clone()),
            Some(Value::Int(i)) => Some(i.to_string()),
            _ => None,
        }
    };
    let bad = || {
        Error::new(
            ErrorKind::Internal,
            format!("the claim script answered {r:?}"),
        )
    };
    let number = |v: Option<&Value>| text(v).and_then(|s| s.parse::<u64>().ok());
    match text(r.first()).as_deref() {
        Some("acquired") => Ok(Found::Acquired(number(r.get(1)).ok_or_else(bad)?)),
        Some("held") => Ok(Found::Held(Duration::from_millis(
            number(r.get(1)).ok_or_else(bad)?,
        ))),
        Some("done") => Ok(Found::Done(match r.get(1) {
            Some(Value::BulkString(b)) => Some(b.clone()),
            _ => None,
        })),
        Some("conflict") => Ok(Found::Conflict(text(r.get(1)).unwrap_or_default())),
        _ => Err(bad()),
    }
}

fn state(found: Found) -> ClaimState {
    match found {
        Found::Acquired(token) => ClaimState::Acquired { token },
        Found::Held(retry_after) => ClaimState::InProgress { retry_after },
        Found::Done(result) => ClaimState::Completed { result },
        Found::Conflict(stored) => ClaimState::Conflict {
            stored: Fingerprint::from_hex(&stored)
                .unwrap_or_else(|| Fingerprint::of(stored.as_bytes())),
        },
    }
}

/// The error of a completion refused by its fencing token.
fn fenced(key: DedupKey<'_>, token: u64, current: &str) -> Error {
    Error::new(
        ErrorKind::Conflict,
        format!(
            "claim on {} for consumer {} is fenced: token {token} no longer holds it (current \
             token {})",
            key.message_id,
            key.consumer,
            if current.is_empty() { "none" } else { current }
        ),
    )
}

#[async_trait]
impl ClaimStore for RedisClaimStore {
    async fn acquire(
        &self,
        key: DedupKey<'_>,
        fp: Fingerprint,
        lease: Duration,
    ) -> Result<ClaimState> {
        let mut states = self.acquire_all(&[(key, fp)], lease).await?;
        states
            .pop()
            .ok_or_else(|| Error::new(ErrorKind::Internal, "the claim script answered nothing"))
    }

    async fn acquire_batch(
        &self,
        keys: &[(DedupKey<'_>, Fingerprint)],
        lease: Duration,
    ) -> Result<Vec<ClaimState>> {
        self.acquire_all(keys, lease).await
    }

    async fn complete(&self, key: DedupKey<'_>, token: u64, result: Option<&[u8]>) -> Result<()> {
        let mut out = self
            .finish_batch(&[(key, token, Finish::Complete(result))])
            .await?;
        out.pop()
            .unwrap_or_else(|| Err(Error::new(ErrorKind::Internal, "no answer")))
    }

    async fn release(&self, key: DedupKey<'_>, token: u64) -> Result<()> {
        let mut out = self.finish_batch(&[(key, token, Finish::Release)]).await?;
        out.pop()
            .unwrap_or_else(|| Err(Error::new(ErrorKind::Internal, "no answer")))
    }

    async fn finish_batch(
        &self,
        items: &[(DedupKey<'_>, u64, Finish<'_>)],
    ) -> Result<Vec<Result<()>>> {
        if items.is_empty() {
            return Ok(Vec::new());
        }
        let keep_ms = self.opts.expiry.as_millis().max(1) as u64;
        let names: Vec<String> = items.iter().map(|(k, _, _)| self.key_of(*k)).collect();
        let reply: Vec<String> = self
            .twice("the claim completion script", |mut conn| {
                let mut call = self.scripts.finish.prepare_invoke();
                for n in &names {
                    call.key(n);
                }
                call.arg(keep_ms);
                for (_, token, finish) in items {
                    let (op, result): (&str, &[u8]) = match finish {
                        Finish::Complete(Some(r)) => ("c", r),
                        Finish::Complete(None) => ("n", b""),
                        Finish::Release => ("r", b""),
                    };
                    call.arg(token.to_string()).arg(op).arg(result);
                }
                async move { call.invoke_async(&mut conn).await }
            })
            .await?;
        if reply.len() != items.len() {
            return Err(Error::new(
                ErrorKind::Internal,
                format!(
                    "the claim completion script answered {} items for {}",
                    reply.len(),
                    items.len()
                ),
            ));
        }
        Ok(reply
            .iter()
            .zip(items)
            .map(|(r, (key, token, _))| {
                if r == "ok" {
                    Ok(())
                } else {
                    Err(fenced(*key, *token, r))
                }
            })
            .collect())
    }

    /// Deletes completed claims older than `retention`, one pass over the store's keys
    /// (`SCAN`) that stops after `batch` deletions. Expiry does this on its own; a purge
    /// only removes completed claims sooner.
    async fn purge(&self, retention: Duration, batch: u32) -> Result<u64> {
        crate::scan::purge(
            &self.conn,
            &format!("{}claim:*", self.opts.prefix),
            &self.scripts.purge,
            retention,
            batch,
        )
        .await
    }

    fn expiry(&self) -> Option<Duration> {
        Some(self.opts.expiry)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn script_answers_are_read_as_claim_states() {
        let read = |r: Vec<Value>| state(parse_found(&r).unwrap());
        assert_eq!(
            read(vec![bulk("acquired"), bulk("1796279958123456")]),
            ClaimState::Acquired {
                token: 1_796_279_958_123_456
            }
        );
        assert_eq!(
            read(vec![bulk("held"), bulk("150")]),
            ClaimState::InProgress {
                retry_after: Duration::from_millis(150)
            }
        );
        assert_eq!(
            read(vec![bulk("done"), Value::Nil]),
            ClaimState::Completed { result: None }
        );
        assert_eq!(
            read(vec![bulk("done"), bulk("")]),
            ClaimState::Completed {
                result: Some(Vec::new())
            }
        );
        let other = Fingerprint::of(b"y");
        assert_eq!(
            read(vec![bulk("conflict"), bulk(&other.to_hex())]),
            ClaimState::Conflict { stored: other }
        );
        assert!(parse_found(&[bulk("what")]).is_err());
        assert!(parse_found(&[bulk("acquired")]).is_err());
    }
}
