//! A message as a Kafka record's headers and value, and back; pure.
//!
//! The message id travels in the header `Justonce-Id`, the content type in
//! `Content-Type`, every other header under its own name. A record has no id of its own
//! that a broker would deduplicate by (the idempotent producer drops only the retries of
//! one producer session): the consumer's dedup record absorbs every other duplicate.

use justonce_core::{Headers, Message, MessageId};
use rdkafka::message::{Header, OwnedHeaders};

/// The message id.
pub(crate) const ID: &str = "Justonce-Id";
const CONTENT_TYPE: &str = "Content-Type";
/// Set on a delivered message whose record had no value (a tombstone).
pub(crate) const NO_VALUE: &str = "x-justonce-no-value";
/// Set on a delivered message whose id header was not a valid id.
pub(crate) const BAD_ID: &str = "x-justonce-bad-id";

/// The headers of `m` as justonce publishes it.
pub(crate) fn headers(m: &Message) -> OwnedHeaders {
    let mut h = OwnedHeaders::new_with_capacity(m.headers().len() + 2);
    if let Some(id) = m.id() {
        h = h.insert(Header {
            key: ID,
            value: Some(id.as_str()),
        });
    }
    if let Some(ct) = m.content_type() {
        h = h.insert(Header {
            key: CONTENT_TYPE,
            value: Some(ct),
        });
    }
    for (k, v) in m.headers() {
        if is_reserved(k) {
            continue;
        }
        h = h.insert(Header {
            key: k.as_str(),
            value: Some(v.as_str()),
        });
    }
    h
}

/// The bytes a record of `m` takes on the wire, about: payload, headers and key.
pub(crate) fn size(m: &Message) -> usize {
    let id = m.id().map_or(0, |i| i.as_str().len());
    let headers: usize = m.headers().iter().map(|(k, v)| k.len() + v.len() + 2).sum();
    m.payload().len() + headers + 2 * id + m.content_type().map_or(0, str::len) + 64
}

fn is_reserved(k: &str) -> bool {
    [ID, CONTENT_TYPE].iter().any(|r| r.eq_ignore_ascii_case(k))
}

/// The message a record carries.
pub(crate) fn decode<H: rdkafka::message::Headers>(
    headers: Option<&H>,
    value: Option<&[u8]>,
) -> Message {
    let mut out = Headers::new();
    let mut id = None;
    let mut ct = None;
    if let Some(h) = headers {
        for header in h.iter() {
            let Some(v) = header.value else { continue };
            let v = String::from_utf8_lossy(v).into_owned();
            if header.key.eq_ignore_ascii_case(ID) {
                id = Some(v);
            } else if header.key.eq_ignore_ascii_case(CONTENT_TYPE) {
                ct = Some(v);
            } else {
                out.insert(header.key.to_owned(), v);
            }
        }
    }
    let id = id
        .filter(|s| !s.is_empty())
        .and_then(|s| match MessageId::new(s.clone()) {
            Ok(id) => Some(id),
            Err(_) => {
                out.entry(BAD_ID.into()).or_insert(s);
                None
            }
        });
    if value.is_none() {
        out.insert(NO_VALUE.into(), "true".into());
    }
    let mut message = Message::new(value.unwrap_or_default().to_vec())
        .with_message_id(id)
        .with_headers(out);
    if let Some(ct) = ct {
        message = message.with_content_type(ct);
    }
    message
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
        let h = headers(&m);
        let d = decode(Some(&h), Some(b"p"));
        assert_eq!(d.id().unwrap().as_str(), "ORD-1");
        assert_eq!(d.header("tenant"), Some("acme"));
        assert_eq!(d.content_type(), Some("application/json"));
        assert_eq!(d.payload(), b"p");
        assert!(size(&m) > 1);
    }

    #[test]
    fn a_record_without_headers_or_value_has_no_id_and_says_so() {
        let d = decode::<OwnedHeaders>(None, None);
        assert!(d.id().is_none());
        assert_eq!(d.header(NO_VALUE), Some("true"));
        assert!(d.payload().is_empty());
    }
}
