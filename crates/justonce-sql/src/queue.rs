//! What the SQL queues (SQLite, PostgreSQL) share: their counts, their dead letters, and the
//! conversions of their rows.

use justonce_core::{Headers, Message, MessageId};

pub use justonce_core::DeadLetter;

/// Counts read from the queue's own tables.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct QueueStats {
    /// Messages not yet acked or dead-lettered (ready, delayed or leased).
    pub pending: u64,
    /// Rows in the dead-letter table for this queue.
    pub dead_letters: u64,
    /// Deliveries made, redeliveries included.
    pub deliveries: u64,
    /// Deliveries of a message that had been delivered before.
    pub redeliveries: u64,
}

/// A message from a queue row's columns (`headers` is JSON; bad JSON reads as no headers,
/// so a row written by an older version is still delivered).
pub(crate) fn message_from_row(
    id: Option<String>,
    payload: Vec<u8>,
    headers: &str,
    content_type: Option<String>,
) -> Message {
    let headers: Headers = serde_json::from_str(headers).unwrap_or_default();
    let mut m = Message::new(payload)
        .with_message_id(id.and_then(|s| MessageId::new(s).ok()))
        .with_headers(headers);
    if let Some(ct) = content_type {
        m = m.with_content_type(ct);
    }
    m
}
