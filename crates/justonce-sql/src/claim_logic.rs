//! The claim decision, shared by every SQL claim store: given the row as stored, what an
//! acquire means. Each store reads the row under its own lock and runs the takeover.

use std::time::Duration;

use justonce_core::{ClaimState, Fingerprint};

/// A claim row as read by an acquire.
pub(crate) struct ClaimRow<'a> {
    pub(crate) fingerprint: &'a str,
    pub(crate) state: &'a str,
    pub(crate) token: i64,
    /// Milliseconds left on the lease by the database clock; `None` when there is none.
    pub(crate) remaining_ms: Option<i64>,
    pub(crate) result: Option<Vec<u8>>,
}

/// What an acquire does with the row it found.
pub(crate) enum Decision {
    /// Answer without changing the row.
    Answer(ClaimState),
    /// Take the claim with this new token (the lease ran out, or the claim was released).
    TakeOver { token: u64 },
}

pub(crate) fn decide(row: ClaimRow<'_>, fp: Fingerprint) -> Decision {
    let stored = Fingerprint::from_hex(row.fingerprint)
        .unwrap_or_else(|| Fingerprint::of(row.fingerprint.as_bytes()));
    match row.state {
        "completed" if stored == fp => {
            Decision::Answer(ClaimState::Completed { result: row.result })
        }
        "completed" => Decision::Answer(ClaimState::Conflict { stored }),
        "in_progress" if row.remaining_ms.unwrap_or(0) > 0 => {
            Decision::Answer(ClaimState::InProgress {
                retry_after: Duration::from_millis(row.remaining_ms.unwrap_or(0) as u64),
            })
        }
        _ => Decision::TakeOver {
            token: row.token as u64 + 1,
        },
    }
}

/// The error of a completion refused by its fencing token.
pub(crate) fn fenced(
    key: justonce_core::DedupKey<'_>,
    token: u64,
    current: Option<i64>,
) -> justonce_core::Error {
    justonce_core::Error::new(
        justonce_core::ErrorKind::Conflict,
        format!(
            "claim on {} for consumer {} is fenced: token {token} no longer holds it (current token {})",
            key.message_id,
            key.consumer,
            current.map_or_else(|| "none".to_owned(), |t| t.to_string())
        ),
    )
}
