//! A stream entry's fields and the message they carry; pure.
//!
//! justonce writes `id` (the message id, absent when it has none), `payload`, `headers`
//! (a JSON object) and `ct` (the content type); a retry copy adds `att` (the attempts the
//! message had before the copy) and `src` (the entry it was copied from); a dead letter
//! adds the `dl_*` reason fields. An entry written by another producer may have only some
//! of them: any other field becomes a header of its own name.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use justonce_core::{DeadLetterReason, Headers, Message, MessageId};

/// A stream entry's fields, as bytes.
pub(crate) type Fields = Vec<(Vec<u8>, Vec<u8>)>;

/// The field of the message id.
pub(crate) const ID: &str = "id";
/// The field of the payload.
pub(crate) const PAYLOAD: &str = "payload";
const HEADERS: &str = "headers";
const CONTENT_TYPE: &str = "ct";
const DL_ERROR: &str = "dl_error";
const DL_ATTEMPTS: &str = "dl_attempts";
const DL_QUEUE: &str = "dl_queue";
const DL_CONSUMER: &str = "dl_consumer";
const DL_AT: &str = "dl_at";

/// The fields of `m`, as justonce writes them.
pub(crate) fn fields(m: &Message) -> Vec<(&'static str, Vec<u8>)> {
    let mut f = Vec::with_capacity(4);
    if let Some(id) = m.id() {
        f.push((ID, id.as_str().as_bytes().to_vec()));
    }
    f.push((PAYLOAD, m.payload().to_vec()));
    if !m.headers().is_empty() {
        let json = serde_json::to_string(m.headers()).unwrap_or_else(|_| "{}".into());
        f.push((HEADERS, json.into_bytes()));
    }
    if let Some(ct) = m.content_type() {
        f.push((CONTENT_TYPE, ct.as_bytes().to_vec()));
    }
    f
}

/// What an entry holds.
#[derive(Debug)]
pub(crate) enum Decoded {
    /// A message, and the attempts it had before this entry.
    Message { message: Message, before: u32 },
    /// An entry that carries no message: why.
    Malformed { why: String, message: Message },
}

/// The message an entry carries. An entry without a `payload` field carries none: it is
/// dead-lettered with the fields it had, as headers. An id that is empty or not UTF-8 is no
/// id (the consumer then dead-letters the message, or derives one).
pub(crate) fn decode(raw: &[(Vec<u8>, Vec<u8>)]) -> Decoded {
    let mut id = None;
    let mut payload = None;
    let mut headers = Headers::new();
    let mut extra = Headers::new();
    let mut ct = None;
    let mut before = 0;
    let mut bad_id = None;
    for (k, v) in raw {
        match k.as_slice() {
            b"id" => match std::str::from_utf8(v)
                .ok()
                .and_then(|s| MessageId::new(s).ok())
            {
                Some(m) => id = Some(m),
                None => bad_id = Some(String::from_utf8_lossy(v).into_owned()),
            },
            b"payload" => payload = Some(v.clone()),
            b"headers" => {
                headers = serde_json::from_slice(v).unwrap_or_default();
            }
            b"ct" => ct = Some(String::from_utf8_lossy(v).into_owned()),
            b"att" => before = String::from_utf8_lossy(v).parse().unwrap_or(0),
            b"src" => {}
            k if k.starts_with(b"dl_") => {}
            k => {
                extra.insert(
                    String::from_utf8_lossy(k).into_owned(),
                    String::from_utf8_lossy(v).into_owned(),
                );
            }
        }
    }
    for (k, v) in extra {
        headers.entry(k).or_insert(v);
    }
    if let Some(bad) = bad_id {
        headers.entry("x-justonce-bad-id".into()).or_insert(bad);
    }
    let mut message = Message::new(payload.clone().unwrap_or_default())
        .with_message_id(id)
        .with_headers(headers);
    if let Some(ct) = ct {
        message = message.with_content_type(ct);
    }
    match payload {
        Some(_) => Decoded::Message { message, before },
        None => {
            let names: Vec<String> = raw
                .iter()
                .map(|(k, _)| String::from_utf8_lossy(k).into_owned())
                .collect();
            Decoded::Malformed {
                why: format!(
                    "the stream entry has no `payload` field (its fields: {})",
                    names.join(", ")
                ),
                message,
            }
        }
    }
}

/// The reason fields of a dead letter.
pub(crate) fn reason_fields(r: &DeadLetterReason) -> Vec<(&'static str, String)> {
    vec![
        (DL_ERROR, r.error.clone()),
        (DL_ATTEMPTS, r.attempts.to_string()),
        (DL_QUEUE, r.source_queue.clone()),
        (DL_CONSUMER, r.consumer.clone()),
    ]
}

/// A dead-letter entry: its message, its reason and when it was dead-lettered.
pub(crate) fn dead_letter(
    raw: &[(Vec<u8>, Vec<u8>)],
) -> (Message, DeadLetterReason, Option<SystemTime>) {
    let text = |name: &str| {
        raw.iter()
            .find(|(k, _)| k.as_slice() == name.as_bytes())
            .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
    };
    let message = match decode(raw) {
        Decoded::Message { message, .. } | Decoded::Malformed { message, .. } => message,
    };
    let reason = DeadLetterReason {
        error: text(DL_ERROR).unwrap_or_default(),
        attempts: text(DL_ATTEMPTS).and_then(|a| a.parse().ok()).unwrap_or(0),
        source_queue: text(DL_QUEUE).unwrap_or_default(),
        consumer: text(DL_CONSUMER).unwrap_or_default(),
    };
    let at = text(DL_AT)
        .and_then(|ms| ms.parse::<u64>().ok())
        .map(|ms| UNIX_EPOCH + Duration::from_millis(ms));
    (message, reason, at)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(pairs: &[(&str, &[u8])]) -> Vec<(Vec<u8>, Vec<u8>)> {
        pairs
            .iter()
            .map(|(k, v)| (k.as_bytes().to_vec(), v.to_vec()))
            .collect()
    }

    #[test]
    fn a_message_round_trips_through_its_fields() {
        let m = Message::new(vec![0u8, 159, 146, 150])
            .with_id("ORD-1")
            .unwrap()
            .with_header("tenant", "acme")
            .with_content_type("application/octet-stream");
        let f: Vec<(Vec<u8>, Vec<u8>)> = fields(&m)
            .into_iter()
            .map(|(k, v)| (k.as_bytes().to_vec(), v))
            .collect();
        let Decoded::Message { message, before } = decode(&f) else {
            panic!("a message");
        };
        assert_eq!(message.id(), m.id());
        assert_eq!(message.payload(), m.payload());
        assert_eq!(message.header("tenant"), Some("acme"));
        assert_eq!(message.content_type(), Some("application/octet-stream"));
        assert_eq!(before, 0);
    }

    #[test]
    fn foreign_and_bad_entries() {
        let Decoded::Message { message, before } = decode(&raw(&[
            ("payload", b"{}"),
            ("kind", b"order"),
            ("att", b"3"),
        ])) else {
            panic!("a message");
        };
        assert_eq!(message.id(), None, "no id field: no id");
        assert_eq!(
            message.header("kind"),
            Some("order"),
            "other fields are headers"
        );
        assert_eq!(before, 3);
        let Decoded::Message { message, .. } = decode(&raw(&[("payload", b"x"), ("id", b"")]))
        else {
            panic!("a message");
        };
        assert_eq!(message.id(), None, "an empty id is none");
        let Decoded::Message { message, .. } =
            decode(&raw(&[("payload", b"x"), ("id", &[0xff, 0xfe])]))
        else {
            panic!("a message");
        };
        assert_eq!(message.id(), None, "a non-UTF-8 id is none");
        assert!(message.header("x-justonce-bad-id").is_some());
        let Decoded::Malformed { why, .. } = decode(&raw(&[("body", b"{}")])) else {
            panic!("no payload: malformed");
        };
        assert!(
            why.contains("no `payload` field") && why.contains("body"),
            "{why}"
        );
    }
}
