//! Settling deliveries: one script checks each receipt and acks, nacks, releases or
//! dead-letters its entry.

use std::time::Duration;

use justonce_core::{DeadLetterReason, Receipt, Result};

use super::codec;
use super::{internal, lock, RedisStream, Tag, Token};
use crate::error::redis;

impl RedisStream {
    /// Runs the settle script for `tokens`; answers how many still held their entry.
    pub(super) async fn settle(
        &self,
        op: &str,
        delay: Duration,
        attempts: u32,
        reason: &[String],
        tokens: &[&Token],
    ) -> Result<u64> {
        if tokens.is_empty() {
            return Ok(0);
        }
        let o = &self.inner.opts;
        let keys = self.keys();
        let mut call = self.inner.scripts.settle.prepare_invoke();
        for k in &keys {
            call.key(k);
        }
        call.arg(&o.group)
            .arg(&o.consumer)
            .arg(op)
            .arg(delay.as_millis() as u64)
            .arg(attempts)
            .arg(reason.len() / 2);
        for r in reason {
            call.arg(r);
        }
        for tag in [Tag::Main, Tag::Retry] {
            let (lo, hi) = bounds(tokens.iter().filter(|t| t.tag == tag).map(|t| &t.id[..]));
            call.arg(lo).arg(hi);
        }
        for t in tokens {
            call.arg(t.tag.as_str()).arg(&t.id).arg(t.count);
        }
        let answer = call.invoke_async(&mut self.inner.conn.clone()).await;
        // Settled or not, these entries are no longer held: a heartbeat that went on
        // touching an entry whose settle failed would keep it from every other consumer
        // for as long as this one lives (its lease must run out instead).
        self.unhold(tokens.iter().copied());
        answer.map_err(|e| redis("settling deliveries on the stream", e))
    }

    /// Stops heartbeating `tokens`' entries (those already let go are skipped).
    pub(super) fn unhold<'a>(&self, tokens: impl IntoIterator<Item = &'a Token>) {
        let mut held = lock(&self.inner.held);
        for t in tokens {
            held.remove(&(t.tag, t.id.clone()));
        }
    }

    pub(super) fn token(receipt: &Receipt) -> Result<&Token> {
        receipt
            .downcast_ref::<Token>()
            .ok_or_else(|| internal("a receipt of another transport".into()))
    }
}

/// The smallest and the largest of stream entry `ids`, compared as (ms, seq): as strings,
/// `9-0` would sort after `10-0`. With no id, or one that does not parse (never from
/// Redis), the whole stream (`-`, `+`): the script's XPENDING then reads more, and is
/// still right.
fn bounds<'a>(ids: impl Iterator<Item = &'a str>) -> (&'a str, &'a str) {
    fn parse(id: &str) -> Option<(u64, u64)> {
        let (ms, seq) = id.split_once('-')?;
        Some((ms.parse().ok()?, seq.parse().ok()?))
    }
    let mut lo: Option<((u64, u64), &str)> = None;
    let mut hi = lo;
    for id in ids {
        let Some(at) = parse(id) else {
            return ("-", "+");
        };
        if lo.is_none_or(|(l, _)| at < l) {
            lo = Some((at, id));
        }
        if hi.is_none_or(|(h, _)| at > h) {
            hi = Some((at, id));
        }
    }
    match (lo, hi) {
        (Some((_, lo)), Some((_, hi))) => (lo, hi),
        _ => ("-", "+"),
    }
}

/// A dead letter's reason as the settle script's field/value arguments.
pub(super) fn reason_args(r: &DeadLetterReason) -> Vec<String> {
    codec::reason_fields(r)
        .into_iter()
        .flat_map(|(k, v)| [k.to_owned(), v])
        .collect()
}

#[cfg(test)]
mod tests {
    use super::bounds;

    #[test]
    fn bounds_compare_ids_as_numbers_not_strings() {
        let ids = ["10-0", "9-5", "10-11", "10-2", "9-10"];
        assert_eq!(bounds(ids.into_iter()), ("9-5", "10-11"));
        assert_eq!(bounds(["7-3"].into_iter()), ("7-3", "7-3"));
        assert_eq!(bounds(std::iter::empty()), ("-", "+"));
        assert_eq!(bounds(["1-1", "x"].into_iter()), ("-", "+"));
    }
}
