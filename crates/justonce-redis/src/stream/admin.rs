//! What tools read and do on a stream ([`Inspect`]): counts, dead letters listed,
//! replayed and purged; creating and checking the group.

use std::collections::HashMap;

use async_trait::async_trait;
use justonce_core::{
    no_such_dead_letter, Check, DeadLetter, DeadLetterEntry, Error, Inspect, Replay, Result,
};
use redis::aio::ConnectionManager;
use redis::Value;

use super::codec;
use super::reply::{entries, flat_map};
use super::{Entry, RedisStream, RedisStreamOptions};
use crate::error::redis;

impl RedisStream {
    /// The dead-letter entries, oldest first, as (entry id, fields).
    pub(super) async fn dead_entries(&self) -> Result<Vec<Entry>> {
        let reply: Value = redis::cmd("XRANGE")
            .arg(self.inner.opts.dead_key())
            .arg("-")
            .arg("+")
            .query_async(&mut self.inner.conn.clone())
            .await
            .map_err(|e| redis("reading the dead letters", e))?;
        Ok(entries(reply))
    }
}

impl RedisStream {
    /// `justonce doctor`'s links on this stream: the stream and its group, counted
    /// (pending: unread, held and retries; the dead-letter stream's length), and what the
    /// server keeps on disk and may evict ([`ServerSettings::checks`](crate::ServerSettings::checks)).
    pub async fn check(&self) -> Result<Vec<Check>> {
        let o = &self.inner.opts;
        let pending = self.pending().await?;
        let dead: u64 = redis::cmd("XLEN")
            .arg(o.dead_key())
            .query_async(&mut self.inner.conn.clone())
            .await
            .map_err(|e| redis("counting the dead letters", e))?;
        let mut out = vec![Check::pass(
            "queue",
            format!(
                "stream {} with group {} exists: {pending} messages pending, {dead} dead letters",
                o.stream, o.group
            ),
        )];
        out.extend(self.inner.server.checks());
        Ok(out)
    }
}

pub(super) async fn create_group(
    conn: &mut ConnectionManager,
    stream: &str,
    group: &str,
    start: &str,
) -> Result<()> {
    let r: redis::RedisResult<()> = redis::cmd("XGROUP")
        .arg("CREATE")
        .arg(stream)
        .arg(group)
        .arg(start)
        .arg("MKSTREAM")
        .query_async(conn)
        .await;
    match r {
        Ok(()) => Ok(()),
        Err(e) if e.code() == Some("BUSYGROUP") => Ok(()),
        Err(e) => Err(redis(
            format!("creating the consumer group {group} on {stream}"),
            e,
        )),
    }
}

/// For tools: the stream must exist with the group, or the error says what does exist.
pub(super) async fn must_exist(
    conn: &mut ConnectionManager,
    opts: &RedisStreamOptions,
    url: &str,
) -> Result<()> {
    let kind: String = redis::cmd("TYPE")
        .arg(&opts.stream)
        .query_async(conn)
        .await
        .map_err(|e| redis("reading the stream's type", e))?;
    if kind != "stream" {
        return Err(Error::config(format!(
            "no stream {} at {} (the key holds: {kind})",
            opts.stream,
            justonce_core::redact_url(url)
        )));
    }
    let groups: Value = redis::cmd("XINFO")
        .arg("GROUPS")
        .arg(&opts.stream)
        .query_async(conn)
        .await
        .map_err(|e| redis("reading the stream's groups", e))?;
    let names = group_names(&groups);
    if !names.contains(&opts.group) {
        return Err(Error::config(format!(
            "stream {} has no consumer group {} (its groups: {})",
            opts.stream,
            opts.group,
            names.join(", ")
        )));
    }
    Ok(())
}

#[async_trait]
impl Inspect for RedisStream {
    /// New entries not yet delivered to the group, entries pending in it, and the retries:
    /// copies in the retry stream and delayed ones. The undelivered are counted exactly up
    /// to a thousand; beyond, Redis's `lag` estimates them, bounded by the stream's length.
    async fn pending(&self) -> Result<u64> {
        let o = &self.inner.opts;
        let mut conn = self.inner.conn.clone();
        let main = group_counts(&mut conn, &self.inner.scripts.count, &o.stream, &o.group).await?;
        let retry: u64 = redis::cmd("XLEN")
            .arg(o.retry_key())
            .query_async(&mut conn)
            .await
            .map_err(|e| redis("counting retries", e))?;
        let delayed: u64 = redis::cmd("ZCARD")
            .arg(o.delayed_key())
            .query_async(&mut conn)
            .await
            .map_err(|e| redis("counting delayed retries", e))?;
        Ok(main + retry + delayed)
    }

    /// The deliveries this source handed out: Redis keeps no count of a group's
    /// deliveries, so those of other processes are not in it.
    async fn deliveries(&self) -> Result<Option<u64>> {
        Ok(Some(
            self.inner
                .delivered
                .load(std::sync::atomic::Ordering::Relaxed),
        ))
    }

    async fn dead_letters(&self) -> Result<Vec<DeadLetter>> {
        Ok(self
            .dead_letter_entries()
            .await?
            .into_iter()
            .map(|e| e.letter)
            .collect())
    }

    async fn cleanup(&self) -> Result<()> {
        self.delete().await
    }

    async fn dead_letter_entries(&self) -> Result<Vec<DeadLetterEntry>> {
        Ok(self
            .dead_entries()
            .await?
            .into_iter()
            .map(|(id, f)| {
                let (message, reason, at) = codec::dead_letter(&f);
                DeadLetterEntry::new(id, DeadLetter::new(message, reason), at)
            })
            .collect())
    }

    async fn replay_dead_letters(&self, keys: &[String], replay: &Replay) -> Result<u64> {
        let target = replay
            .to
            .clone()
            .unwrap_or_else(|| self.inner.opts.stream.clone());
        let mut conn = self.inner.conn.clone();
        let kind: String = redis::cmd("TYPE")
            .arg(&target)
            .query_async(&mut conn)
            .await
            .map_err(|e| redis("reading the target's type", e))?;
        if kind != "stream" {
            return Err(Error::config(format!(
                "no stream {target} to replay into (the key holds: {kind})"
            )));
        }
        let chosen = self.chosen(keys).await?;
        let mut moved = 0;
        for (id, fields) in chosen {
            let (message, reason, _) = codec::dead_letter(&fields);
            let m = DeadLetter::new(message, reason).replay_message(replay);
            // The copy and the removal of the dead letter in one transaction.
            let mut pipe = redis::pipe();
            pipe.atomic();
            pipe.cmd("XADD").arg(&target).arg("*");
            for (k, v) in codec::fields(&m) {
                pipe.arg(k).arg(v);
            }
            pipe.ignore();
            pipe.cmd("XDEL")
                .arg(self.inner.opts.dead_key())
                .arg(&id)
                .ignore();
            let _: () = pipe
                .query_async(&mut conn)
                .await
                .map_err(|e| redis("replaying a dead letter", e))?;
            moved += 1;
        }
        Ok(moved)
    }

    async fn purge_dead_letters(&self, keys: &[String]) -> Result<u64> {
        let chosen = self.chosen(keys).await?;
        let ids: Vec<String> = chosen.into_iter().map(|(id, _)| id).collect();
        if ids.is_empty() {
            return Ok(0);
        }
        let n: u64 = redis::cmd("XDEL")
            .arg(self.inner.opts.dead_key())
            .arg(&ids)
            .query_async(&mut self.inner.conn.clone())
            .await
            .map_err(|e| redis("purging dead letters", e))?;
        Ok(n)
    }
}

impl RedisStream {
    /// The dead letters `keys` names, each once; an error before anything moves when one
    /// is not there.
    pub(super) async fn chosen(&self, keys: &[String]) -> Result<Vec<Entry>> {
        let all = self.dead_entries().await?;
        let mut out = Vec::new();
        for k in keys {
            let found = all
                .iter()
                .find(|(id, _)| id == k)
                .ok_or_else(|| no_such_dead_letter(k))?;
            if !out.iter().any(|(id, _): &(String, _)| id == k) {
                out.push(found.clone());
            }
        }
        Ok(out)
    }
}

/// Entries counted one by one, inside Redis, before a group's undelivered count falls back
/// on Redis's `lag`.
const COUNTED: u64 = 1000;

/// A group's undelivered and pending entries on a stream.
///
/// The undelivered entries (those after the group's last delivered one) are counted in
/// Redis (`stream_count.lua`), up to [`COUNTED`]: exact for a group near or at the end of its stream. Past that
/// the count is Redis's `lag` (entries added less the group's `entries-read`), which is
/// only an estimate: a Redis 7.0 restarted from an append-only file rewritten mid-run takes
/// `entries-read` back to its value at the rewrite, and a drained group of the lab's soak
/// kept a `lag` of 236,005 on an empty stream (docs/reliability.md). So the estimate is
/// bounded by the stream's length less its pending entries (every pending entry is still
/// in the stream: trims stop at the first pending one).
async fn group_counts(
    conn: &mut ConnectionManager,
    count: &redis::Script,
    stream: &str,
    group: &str,
) -> Result<u64> {
    let groups: Value = redis::cmd("XINFO")
        .arg("GROUPS")
        .arg(stream)
        .query_async(conn)
        .await
        .map_err(|e| redis("reading the stream's groups", e))?;
    let Some(g) = group_info(&groups, group) else {
        return Ok(0);
    };
    let pending = g
        .get("pending")
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(0);
    let last = g
        .get("last-delivered-id")
        .cloned()
        .unwrap_or_else(|| "0-0".into());
    let counted: u64 = count
        .key(stream)
        .arg(format!("({last}"))
        .arg(COUNTED)
        .invoke_async(conn)
        .await
        .map_err(|e| redis("counting undelivered entries", e))?;
    if counted < COUNTED {
        return Ok(counted + pending);
    }
    let len: u64 = redis::cmd("XLEN")
        .arg(stream)
        .query_async(conn)
        .await
        .map_err(|e| redis("counting the stream's entries", e))?;
    let bound = len.saturating_sub(pending).max(COUNTED);
    let undelivered = g
        .get("lag")
        .and_then(|v| v.parse::<u64>().ok())
        .map_or(bound, |lag| lag.clamp(COUNTED, bound));
    Ok(undelivered + pending)
}

fn group_names(groups: &Value) -> Vec<String> {
    match groups {
        Value::Array(gs) => gs
            .iter()
            .filter_map(|g| flat_map(g).get("name").cloned())
            .collect(),
        _ => Vec::new(),
    }
}

fn group_info(groups: &Value, group: &str) -> Option<HashMap<String, String>> {
    match groups {
        Value::Array(gs) => gs
            .iter()
            .map(flat_map)
            .find(|m| m.get("name").map(String::as_str) == Some(group)),
        _ => None,
    }
}
