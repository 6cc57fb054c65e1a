//! What a receive takes: the ready script, the blocking read, and an entry turned into a
//! delivery (or into a dead letter, when it carries no message).

use std::time::{Duration, Instant};

use justonce_core::{DeadLetterReason, Delivery, Error, ErrorKind, Receipt, Result};
use redis::{AsyncConnectionConfig, Value};
use tracing::warn;

use super::codec::{self, Decoded};
use super::reply::{pairs, text};
use super::settle::reason_args;
use super::{internal, lock, RedisStream, Tag, Token};
use crate::error::redis;

impl RedisStream {
    /// One script call for what a receive can take without waiting; the milliseconds
    /// until the next delayed retry is due, if any.
    pub(super) async fn ready(&self, max: usize) -> Result<(Vec<Delivery>, Option<Duration>)> {
        let o = &self.inner.opts;
        let first = {
            let mut resumed = lock(&self.inner.resumed);
            !std::mem::replace(&mut *resumed, true)
        };
        let now = Instant::now();
        if !first {
            let sweep = lock(&self.inner.sweep);
            let every = (o.lease / 10).min(Duration::from_millis(100));
            let recent = sweep.at.is_some_and(|at| now < at + every);
            let due_now = sweep.due_at.is_some_and(|d| now >= d);
            if recent && !sweep.found && !due_now {
                return Ok((Vec::new(), sweep.due_at.map(|d| d - now)));
            }
        }
        let keys = self.keys();
        let mut call = self.inner.scripts.ready.prepare_invoke();
        call.key(&keys[0]).key(&keys[1]).key(&keys[2]);
        call.arg(&o.group)
            .arg(&o.consumer)
            .arg(o.lease.as_millis() as u64)
            .arg(max)
            .arg(if first { "1" } else { "0" });
        let reply: Value = match call.invoke_async(&mut self.inner.conn.clone()).await {
            Ok(v) => v,
            Err(e) => {
                if first {
                    *lock(&self.inner.resumed) = false;
                }
                return Err(redis("receiving from the stream", e));
            }
        };
        let Value::Array(parts) = reply else {
            return Err(internal(format!("the receive script answered {reply:?}")));
        };
        let entries = match parts.first() {
            Some(Value::Array(e)) => e.clone(),
            _ => Vec::new(),
        };
        let due = parts
            .get(1)
            .and_then(text)
            .and_then(|s| s.parse::<i64>().ok())
            .filter(|&ms| ms >= 0)
            .map(|ms| Duration::from_millis(ms as u64));
        let mut out = Vec::with_capacity(entries.len());
        for e in entries {
            let Value::Array(e) = e else { continue };
            let (Some(tag), Some(id), Some(count)) = (
                e.first().and_then(text),
                e.get(1).and_then(text),
                e.get(2).and_then(text).and_then(|c| c.parse::<u64>().ok()),
            ) else {
                return Err(internal(format!(
                    "the receive script answered an entry {e:?}"
                )));
            };
            let tag = if tag == "m" { Tag::Main } else { Tag::Retry };
            let fields = e.get(3).map(pairs).unwrap_or_default();
            if let Some(d) = self.delivery(tag, id, count, &fields).await? {
                out.push(d);
            }
        }
        *lock(&self.inner.sweep) = super::Sweep {
            at: Some(now),
            found: !out.is_empty(),
            due_at: due.map(|d| now + d),
        };
        Ok((out, due))
    }

    /// The delivery of an entry, or `None` for an entry that carries no message (it goes
    /// to the dead letters at once, with its reason).
    pub(super) async fn delivery(
        &self,
        tag: Tag,
        id: String,
        count: u64,
        fields: &[(Vec<u8>, Vec<u8>)],
    ) -> Result<Option<Delivery>> {
        match codec::decode(fields) {
            Decoded::Message { message, before } => {
                let attempt = before.saturating_add(count as u32).max(1);
                let token = Token {
                    tag,
                    id,
                    count,
                    attempt,
                };
                lock(&self.inner.held).insert((tag, token.id.clone()), count);
                self.inner
                    .delivered
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                Ok(Some(Delivery {
                    message,
                    attempt,
                    // A retry copy was delivered before, even when a release kept its attempt.
                    redelivered: attempt > 1 || tag == Tag::Retry,
                    receipt: Receipt::new(token),
                }))
            }
            Decoded::Malformed { why, .. } => {
                let token = Token {
                    tag,
                    id,
                    count,
                    attempt: count as u32,
                };
                let reason = DeadLetterReason {
                    error: format!("invalid input: {why}"),
                    attempts: count as u32,
                    source_queue: self.inner.opts.stream.clone(),
                    consumer: format!("{} (justonce transport)", self.inner.opts.consumer),
                };
                warn!(stream = %self.inner.opts.stream, entry = %token.id, %why, "dead-lettering a stream entry");
                // A dead-lettering that fails leaves the entry pending and unheld: it comes
                // back after its lease and is dead-lettered then. The receive goes on, so
                // the deliveries taken with it are not lost to the caller.
                if let Err(e) = self
                    .settle("dead", Duration::ZERO, 0, &reason_args(&reason), &[&token])
                    .await
                {
                    warn!(stream = %self.inner.opts.stream, entry = %token.id, error = %e, "could not dead-letter a stream entry; it comes back after its lease");
                }
                Ok(None)
            }
        }
    }

    /// New entries of the main stream, up to `max`, without waiting.
    pub(super) async fn fresh(&self, max: usize) -> Result<Vec<Delivery>> {
        let o = &self.inner.opts;
        let reply: Value = redis::cmd("XREADGROUP")
            .arg("GROUP")
            .arg(&o.group)
            .arg(&o.consumer)
            .arg("COUNT")
            .arg(max)
            .arg("STREAMS")
            .arg(&o.stream)
            .arg(">")
            .query_async(&mut self.inner.conn.clone())
            .await
            .map_err(|e| redis("receiving from the stream", e))?;
        self.new_entries(reply).await
    }

    /// Waits up to `wait` for new entries on the main stream, on a connection of its own.
    pub(super) async fn block(&self, max: usize, wait: Duration) -> Result<Vec<Delivery>> {
        let o = &self.inner.opts;
        let pooled = lock(&self.inner.blocking).pop();
        let mut conn = match pooled {
            Some(c) => c,
            None => self
                .inner
                .client
                .get_multiplexed_async_connection_with_config(
                    &AsyncConnectionConfig::new()
                        .set_response_timeout(None)
                        .set_connection_timeout(Some(Duration::from_secs(3))),
                )
                .await
                .map_err(|e| crate::error::connect(&self.inner.url, e))?,
        };
        let ms = wait.as_millis().max(1) as u64;
        let mut cmd = redis::cmd("XREADGROUP");
        cmd.arg("GROUP")
            .arg(&o.group)
            .arg(&o.consumer)
            .arg("COUNT")
            .arg(max)
            .arg("BLOCK")
            .arg(ms)
            .arg("STREAMS")
            .arg(&o.stream)
            .arg(">");
        let read = cmd.query_async::<Value>(&mut conn);
        // The server answers by its BLOCK; a connection that never answers is dropped.
        let reply = match tokio::time::timeout(wait + Duration::from_secs(2), read).await {
            Ok(Ok(v)) => {
                lock(&self.inner.blocking).push(conn);
                v
            }
            Ok(Err(e)) => return Err(redis("waiting on the stream", e)),
            Err(_) => {
                return Err(Error::new(
                    ErrorKind::Timeout,
                    format!("a blocking read of {ms} ms had no answer 2 s after it"),
                ))
            }
        };
        self.new_entries(reply).await
    }

    /// The deliveries of an `XREADGROUP … >` reply on the main stream (RESP2:
    /// `[[stream, [[id, [field, value, ...]], ...]]]`; nil when nothing came).
    async fn new_entries(&self, reply: Value) -> Result<Vec<Delivery>> {
        let mut out = Vec::new();
        if let Value::Array(streams) = reply {
            for s in streams {
                let Value::Array(s) = s else { continue };
                let Some(Value::Array(entries)) = s.get(1) else {
                    continue;
                };
                for e in entries {
                    let Value::Array(e) = e else { continue };
                    let Some(id) = e.first().and_then(text) else {
                        continue;
                    };
                    let fields = e.get(1).map(pairs).unwrap_or_default();
                    if let Some(d) = self.delivery(Tag::Main, id, 1, &fields).await? {
                        out.push(d);
                    }
                }
            }
        }
        Ok(out)
    }
}
