use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use crate::{ClaimState, ClaimStore, DedupKey, Error, ErrorKind, Fingerprint, MessageId, Result};

#[derive(Debug)]
struct Entry {
    fp: Fingerprint,
    token: u64,
    state: State,
}

#[derive(Debug)]
enum State {
    InProgress {
        until: Instant,
    },
    Released,
    Completed {
        result: Option<Vec<u8>>,
        at: Instant,
    },
}

/// An in-memory [`ClaimStore`].
///
/// ```
/// use std::time::Duration;
/// use justonce_core::{memory::MemoryClaims, ClaimState, ClaimStore, DedupKey, Fingerprint, MessageId};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> justonce_core::Result<()> {
/// let claims = MemoryClaims::default();
/// let id = MessageId::new("mail-1")?;
/// let key = DedupKey { consumer: "mailer", message_id: &id };
/// let fp = Fingerprint::of(b"hello");
/// let ClaimState::Acquired { token } = claims.acquire(key, fp, Duration::from_secs(30)).await? else { panic!() };
/// claims.complete(key, token, Some(b"sent")).await?;
/// assert_eq!(claims.acquire(key, fp, Duration::from_secs(30)).await?, ClaimState::Completed { result: Some(b"sent".to_vec()) });
/// # Ok(()) }
/// ```
#[derive(Debug, Default)]
pub struct MemoryClaims {
    entries: Mutex<HashMap<(String, MessageId), Entry>>,
}

fn k(key: DedupKey<'_>) -> (String, MessageId) {
    (key.consumer.to_owned(), key.message_id.clone())
}

#[async_trait]
impl ClaimStore for MemoryClaims {
    async fn acquire(
        &self,
        key: DedupKey<'_>,
        fp: Fingerprint,
        lease: Duration,
    ) -> Result<ClaimState> {
        let now = Instant::now();
        let mut map = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        let entry = map.entry(k(key)).or_insert(Entry {
            fp,
            token: 0,
            state: State::Released,
        });
        match &entry.state {
            State::Completed { result, .. } => {
                return Ok(if entry.fp == fp {
                    ClaimState::Completed {
                        result: result.clone(),
                    }
                } else {
                    ClaimState::Conflict { stored: entry.fp }
                });
            }
            State::InProgress { until } if *until > now => {
                return Ok(ClaimState::InProgress {
                    retry_after: *until - now,
                });
            }
            _ => {}
        }
        entry.token += 1;
        entry.fp = fp;
        entry.state = State::InProgress { until: now + lease };
        Ok(ClaimState::Acquired { token: entry.token })
    }

    async fn complete(&self, key: DedupKey<'_>, token: u64, result: Option<&[u8]>) -> Result<()> {
        let mut map = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        match map.get_mut(&k(key)) {
            Some(e) if e.token == token && matches!(e.state, State::InProgress { .. }) => {
                e.state = State::Completed {
                    result: result.map(<[u8]>::to_vec),
                    at: Instant::now(),
                };
                Ok(())
            }
            other => Err(Error::new(
                ErrorKind::Conflict,
                format!(
                    "claim on {} is fenced: token {token} no longer holds it (current token {})",
                    key.message_id,
                    other.map_or(0, |e| e.token)
                ),
            )),
        }
    }

    async fn release(&self, key: DedupKey<'_>, token: u64) -> Result<()> {
        let mut map = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(e) = map.get_mut(&k(key)) {
            if e.token == token && matches!(e.state, State::InProgress { .. }) {
                e.state = State::Released;
            }
        }
        Ok(())
    }

    async fn purge(&self, retention: Duration, batch: u32) -> Result<u64> {
        let now = Instant::now();
        let mut map = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        let old: Vec<_> = map
            .iter()
            .filter(|(_, e)| matches!(e.state, State::Completed { at, .. } if now.duration_since(at) > retention))
            .map(|(k, _)| k.clone())
            .take(batch as usize)
            .collect();
        for key in &old {
            map.remove(key);
        }
        Ok(old.len() as u64)
    }
}
