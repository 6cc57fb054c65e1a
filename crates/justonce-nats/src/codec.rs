//! A message as NATS headers and a payload, and back; pure.
//!
//! justonce publishes the message id as `Nats-Msg-Id`, which the server deduplicates
//! within the stream's `duplicate_window`; the content type as `Content-Type`; every
//! other header under its own name. A copy the source writes itself (a released
//! delivery, a replayed dead letter) cannot reuse the id as `Nats-Msg-Id`, or the server
//! would drop it as a duplicate: it carries the id in `Justonce-Id` (empty when the
//! message had none), an `Nats-Msg-Id` of its own, and `Justonce-Attempts`, the attempts
//! the message had before the copy. A dead letter adds the reason headers.

use async_nats::HeaderMap;
use bytes::Bytes;
use justonce_core::{Headers, Message, MessageId};

/// The server's dedup header.
pub(crate) const NATS_MSG_ID: &str = "Nats-Msg-Id";
/// The message id of a copy.
pub(crate) const COPY_ID: &str = "Justonce-Id";
/// The attempts a copy's message had before it.
pub(crate) const ATTEMPTS: &str = "Justonce-Attempts";
const CONTENT_TYPE: &str = "Content-Type";

/// The headers and payload of `m` as justonce publishes it.
pub(crate) fn encode(m: &Message) -> (HeaderMap, Bytes) {
    let mut h = user_headers(m);
    if let Some(id) = m.id() {
        h.insert(NATS_MSG_ID, id.as_str());
    }
    (h, Bytes::copy_from_slice(m.payload()))
}

/// The headers and payload of a copy of `m`: its id in [`COPY_ID`], `dedup` as its
/// `Nats-Msg-Id` (derived from what is copied, so a copy written twice is stored once),
/// and, for a retry copy, the attempts before it (a dead letter or a replay has none).
pub(crate) fn encode_copy(m: &Message, dedup: &str, before: Option<u32>) -> (HeaderMap, Bytes) {
    let mut h = user_headers(m);
    h.insert(COPY_ID, m.id().map_or("", MessageId::as_str));
    h.insert(NATS_MSG_ID, dedup);
    if let Some(before) = before {
        h.insert(ATTEMPTS, before.to_string());
    }
    (h, Bytes::copy_from_slice(m.payload()))
}

fn user_headers(m: &Message) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (k, v) in m.headers() {
        if is_reserved(k) || !valid_name(k) {
            continue;
        }
        h.insert(k.as_str(), sanitize(v));
    }
    if let Some(ct) = m.content_type() {
        h.insert(CONTENT_TYPE, sanitize(ct));
    }
    h
}

fn is_reserved(k: &str) -> bool {
    [NATS_MSG_ID, COPY_ID, ATTEMPTS, CONTENT_TYPE]
        .iter()
        .any(|r| r.eq_ignore_ascii_case(k))
}

/// A header name NATS carries: printable ASCII without `:` or spaces.
fn valid_name(k: &str) -> bool {
    !k.is_empty() && k.bytes().all(|b| b.is_ascii_graphic() && b != b':')
}

/// A header value on one line.
fn sanitize(v: &str) -> String {
    v.replace(['\r', '\n'], " ")
}

/// What a stream message carries.
#[derive(Debug)]
pub(crate) struct Decoded {
    pub(crate) message: Message,
    /// The attempts the message had before this stream message (a copy's [`ATTEMPTS`]).
    pub(crate) before: u32,
    /// Whether this stream message is a retry copy the source wrote (a released
    /// delivery): it comes back redelivered.
    pub(crate) copy: bool,
}

/// The message a stream message carries.
pub(crate) fn decode(headers: Option<&HeaderMap>, payload: &[u8]) -> Decoded {
    let mut out = Headers::new();
    let mut id = None;
    let mut copy_id = None;
    let mut ct = None;
    let mut before = 0;
    let mut retry_copy = false;
    let mut bad_id = None;
    if let Some(h) = headers {
        for (k, values) in h.iter() {
            let name: &str = k.as_ref();
            let Some(v) = values.last().map(|v| v.as_str().to_owned()) else {
                continue;
            };
            if name.eq_ignore_ascii_case(NATS_MSG_ID) {
                id = Some(v);
            } else if name.eq_ignore_ascii_case(COPY_ID) {
                copy_id = Some(v);
            } else if name.eq_ignore_ascii_case(ATTEMPTS) {
                before = v.trim().parse().unwrap_or(0);
                retry_copy = true;
            } else if name.eq_ignore_ascii_case(CONTENT_TYPE) {
                ct = Some(v);
            } else {
                out.insert(name.to_owned(), v);
            }
        }
    }
    // A copy's own `Nats-Msg-Id` is not the message's id.
    let raw = copy_id.or(id).filter(|s| !s.is_empty());
    let id = raw.and_then(|s| match MessageId::new(s.clone()) {
        Ok(m) => Some(m),
        Err(_) => {
            bad_id = Some(s);
            None
        }
    });
    if let Some(bad) = bad_id {
        out.entry("x-justonce-bad-id".into()).or_insert(bad);
    }
    let mut message = Message::new(payload.to_vec())
        .with_message_id(id)
        .with_headers(out);
    if let Some(ct) = ct {
        message = message.with_content_type(ct);
    }
    Decoded {
        message,
        before,
        copy: retry_copy,
    }
}

/// A delivery's place, read from its ack subject
/// (`$JS.ACK.<stream>.<consumer>.<delivered>.<stream seq>.<consumer seq>.<time>.<pending>`,
/// or the longer form with a domain and an account hash first).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct AckInfo {
    pub(crate) delivered: u64,
    pub(crate) stream_seq: u64,
}

pub(crate) fn ack_info(reply: &str) -> Option<AckInfo> {
    let rest = reply.strip_prefix("$JS.ACK.")?;
    let tokens: Vec<&str> = rest.split('.').collect();
    // v1: stream, consumer, delivered, sseq, cseq, time, pending (7 tokens);
    // v2: domain, account hash, then those (9 or more).
    let base = match tokens.len() {
        7 => 0,
        n if n >= 9 => 2,
        _ => return None,
    };
    Some(AckInfo {
        delivered: tokens.get(base + 2)?.parse().ok()?,
        stream_seq: tokens.get(base + 3)?.parse().ok()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_round_trips_with_its_id_headers_and_content_type() {
        let m = Message::new("p")
            .with_id("ORD-1")
            .unwrap()
            .with_header("tenant", "acme")
            .with_content_type("application/json");
        let (h, p) = encode(&m);
        assert_eq!(h.get(NATS_MSG_ID).unwrap().as_str(), "ORD-1");
        let d = decode(Some(&h), &p);
        assert_eq!(d.message.id().unwrap().as_str(), "ORD-1");
        assert_eq!(d.message.header("tenant"), Some("acme"));
        assert_eq!(d.message.content_type(), Some("application/json"));
        assert_eq!(d.message.payload(), b"p");
        assert_eq!((d.before, d.copy), (0, false));
    }

    #[test]
    fn a_copy_keeps_the_id_apart_from_its_own_dedup_id() {
        let m = Message::new("p").with_id("ORD-1").unwrap();
        let (h, p) = encode_copy(&m, "s.c.7.1", Some(2));
        assert_eq!(h.get(NATS_MSG_ID).unwrap().as_str(), "s.c.7.1");
        let d = decode(Some(&h), &p);
        assert_eq!(d.message.id().unwrap().as_str(), "ORD-1");
        assert_eq!((d.before, d.copy), (2, true));
        let (h, p) = encode_copy(&Message::new("p"), "s.c.8.1", None);
        assert!(
            decode(Some(&h), &p).message.id().is_none(),
            "a copy of no id has none"
        );
    }

    #[test]
    fn a_message_without_headers_has_no_id() {
        let d = decode(None, b"x");
        assert!(d.message.id().is_none());
        assert_eq!(d.before, 0);
    }

    #[test]
    fn ack_subjects_of_both_forms_parse() {
        let v1 = "$JS.ACK.orders.justonce.3.100.7.1790230470084404000.42";
        assert_eq!(
            ack_info(v1),
            Some(AckInfo {
                delivered: 3,
                stream_seq: 100
            })
        );
        let v2 = "$JS.ACK.hub.szMpdrwD.orders.justonce.2.50.9.1790230470084404000.0";
        assert_eq!(
            ack_info(v2),
            Some(AckInfo {
                delivered: 2,
                stream_seq: 50
            })
        );
        assert_eq!(ack_info("_INBOX.x"), None);
    }
}
