//! Settling deliveries: one script checks each receipt and acks, nacks, releases or
//! dead-letters its entry.

use std::time::Duration;

use justonce_core::{DeadLetterReason, Receipt, Result};

use super::codec;
use super::{internal, lock, RedisStream, Token};
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

/// A dead letter's reason as the settle script's field/value arguments.
pub(super) fn reason_args(r: &DeadLetterReason) -> Vec<String> {
    codec::reason_fields(r)
        .into_iter()
        .flat_map(|(k, v)| [k.to_owned(), v])
        .collect()
}
