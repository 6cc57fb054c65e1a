//! A message to AMQP and back: properties and headers out, a `Message` in, the attempt a
//! delivery is, and the reason of a dead letter read back. Pure, tested below without a
//! broker.

use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::BasicProperties;

use justonce_core::{DeadLetter, DeadLetterReason, Headers, Message, MessageId};

/// The header counting the attempts a message made before it went through a retry tier.
/// Quorum queues count requeues themselves in `x-delivery-count`; classic queues and retry
/// tiers do not, and `x-death` is never relied on.
pub const ATTEMPTS_HEADER: &str = "x-justonce-attempts";

/// A message as AMQP properties: persistent (delivery mode 2), `message_id` set from the
/// message's id, its headers, plus `extra` headers.
pub(crate) fn properties(m: &Message, extra: &[(String, String)]) -> BasicProperties {
    let mut headers = FieldTable::default();
    for (k, v) in m
        .headers()
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .chain(extra.iter().map(|(k, v)| (k.as_str(), v.as_str())))
    {
        headers.insert(k.into(), AMQPValue::LongString(LongString::from(v)));
    }
    let mut p = BasicProperties::default()
        .with_delivery_mode(2)
        .with_headers(headers);
    if let Some(id) = m.id() {
        p = p.with_message_id(id.as_str().into());
    }
    if let Some(ct) = m.content_type() {
        p = p.with_content_type(ct.into());
    }
    p
}

/// A header's value as text, for the header types a producer sets (strings, integers,
/// booleans); `None` for the others (tables, arrays, bytes).
fn header_text(v: &AMQPValue) -> Option<String> {
    Some(match v {
        AMQPValue::LongString(s) => String::from_utf8_lossy(s.as_bytes()).into_owned(),
        AMQPValue::ShortString(s) => s.as_str().to_owned(),
        AMQPValue::LongLongInt(n) => n.to_string(),
        AMQPValue::LongInt(n) => n.to_string(),
        AMQPValue::LongUInt(n) => n.to_string(),
        AMQPValue::ShortInt(n) => n.to_string(),
        AMQPValue::Boolean(b) => b.to_string(),
        _ => return None,
    })
}

fn header_count(headers: Option<&FieldTable>, key: &str) -> u32 {
    headers
        .and_then(|h| h.inner().get(key))
        .and_then(header_text)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// Which attempt a delivery is: the attempts made before a retry tier
/// ([`ATTEMPTS_HEADER`]), plus the broker's requeues (a quorum queue's `x-delivery-count`;
/// on a classic queue, one if the broker marked it redelivered), plus this one.
pub(crate) fn attempt(properties: &BasicProperties, redelivered: bool) -> u32 {
    let headers = properties.headers().as_ref();
    let before = header_count(headers, ATTEMPTS_HEADER);
    let requeues = match header_count(headers, "x-delivery-count") {
        0 if redelivered => 1,
        n => n,
    };
    before + requeues + 1
}

/// The message a delivery carries: payload, id (an invalid `message_id` is no id), the
/// headers that are text, content type.
pub(crate) fn message(properties: &BasicProperties, data: &[u8]) -> Message {
    let mut headers = Headers::new();
    if let Some(table) = properties.headers() {
        for (k, v) in table.inner() {
            if let Some(text) = header_text(v) {
                headers.insert(k.as_str().to_owned(), text);
            }
        }
    }
    let id = properties
        .message_id()
        .as_ref()
        .and_then(|s| MessageId::new(s.as_str()).ok());
    let mut m = Message::new(data.to_vec())
        .with_message_id(id)
        .with_headers(headers);
    if let Some(ct) = properties.content_type() {
        m = m.with_content_type(ct.as_str());
    }
    m
}

/// A dead letter read back: its reason from our headers or, for one the broker dead-lettered
/// itself (a quorum queue's delivery limit), from the broker's `x-first-death-*` headers.
pub(crate) fn dead_letter(message: Message) -> DeadLetter {
    let h = message.headers();
    let reason = DeadLetterReason::from_headers(h).unwrap_or_else(|| DeadLetterReason {
        error: format!(
            "dead-lettered by the broker: {}",
            h.get("x-first-death-reason")
                .map_or("no reason given", |r| r.as_str())
        ),
        attempts: h
            .get("x-delivery-count")
            .and_then(|n| n.parse().ok())
            .unwrap_or(0),
        source_queue: h.get("x-first-death-queue").cloned().unwrap_or_default(),
        consumer: String::new(),
    });
    DeadLetter { message, reason }
}

/// When a dead letter died: its `timestamp` property, which the source sets when it
/// dead-letters (the broker's own dead letters have none).
pub(crate) fn timestamp(properties: &BasicProperties) -> Option<std::time::SystemTime> {
    properties
        .timestamp()
        .map(|s| std::time::UNIX_EPOCH + std::time::Duration::from_secs(s))
}

/// A replayed message without what the broker wrote on its way to the dead letters
/// (`x-death`, `x-first-death-*`, `x-last-death-*`, `x-delivery-count`) or the attempts
/// before a retry tier: it starts over as a new publish.
pub(crate) fn for_replay(m: Message) -> Message {
    let mut headers = m.headers().clone();
    headers.retain(|k, _| {
        !(k == "x-death"
            || k.starts_with("x-first-death-")
            || k.starts_with("x-last-death-")
            || k == "x-delivery-count"
            || k == ATTEMPTS_HEADER)
    });
    m.with_headers(headers)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_replay_starts_over_without_the_brokers_history() {
        let m = Message::new("p")
            .with_header("x-delivery-count", "4")
            .with_header("x-first-death-reason", "delivery_limit")
            .with_header(ATTEMPTS_HEADER, "3")
            .with_header("x-justonce-replays", "1")
            .with_header("tenant", "acme");
        let keys: Vec<String> = for_replay(m).headers().keys().cloned().collect();
        assert_eq!(keys, ["tenant", "x-justonce-replays"]);
    }

    fn with_headers(pairs: &[(&str, AMQPValue)]) -> BasicProperties {
        let mut t = FieldTable::default();
        for (k, v) in pairs {
            t.insert((*k).into(), v.clone());
        }
        BasicProperties::default().with_headers(t)
    }

    #[test]
    fn a_message_goes_out_and_comes_back_whole() {
        let m = Message::new("payload")
            .with_id("ORD-1")
            .unwrap()
            .with_header("tenant", "acme")
            .with_content_type("application/json");
        let p = properties(&m, &[("x-extra".into(), "1".into())]);
        assert_eq!(p.delivery_mode(), &Some(2), "persistent");
        let back = message(&p, m.payload());
        assert_eq!(back.id(), m.id());
        assert_eq!(back.payload(), b"payload");
        assert_eq!(back.header("tenant"), Some("acme"));
        assert_eq!(back.header("x-extra"), Some("1"));
        assert_eq!(back.content_type(), Some("application/json"));
    }

    #[test]
    fn an_invalid_or_missing_message_id_is_no_id() {
        let p = BasicProperties::default().with_message_id("".into());
        assert!(message(&p, b"x").id().is_none());
        assert!(message(&BasicProperties::default(), b"x").id().is_none());
    }

    #[test]
    fn headers_of_any_scalar_type_are_text_and_the_rest_is_left_out() {
        let p = with_headers(&[
            ("long", AMQPValue::LongLongInt(7)),
            ("int", AMQPValue::LongInt(-3)),
            ("flag", AMQPValue::Boolean(true)),
            ("short", AMQPValue::ShortString("s".into())),
            ("table", AMQPValue::FieldTable(FieldTable::default())),
        ]);
        let m = message(&p, b"");
        assert_eq!(
            (
                m.header("long"),
                m.header("int"),
                m.header("flag"),
                m.header("short")
            ),
            (Some("7"), Some("-3"), Some("true"), Some("s"))
        );
        assert_eq!(m.header("table"), None);
    }

    #[test]
    fn the_attempt_counts_tiers_requeues_and_this_delivery() {
        let cases = [
            (vec![], false, 1, "a first delivery"),
            (vec![], true, 2, "a classic queue's redelivery"),
            (
                vec![("x-delivery-count", AMQPValue::LongLongInt(3))],
                true,
                4,
                "a quorum queue counts requeues",
            ),
            (
                vec![(ATTEMPTS_HEADER, AMQPValue::LongString("2".into()))],
                false,
                3,
                "back from a retry tier",
            ),
            (
                vec![
                    (ATTEMPTS_HEADER, AMQPValue::LongString("2".into())),
                    ("x-delivery-count", AMQPValue::LongInt(1)),
                ],
                true,
                4,
                "a tier, then a requeue",
            ),
        ];
        for (headers, redelivered, want, what) in cases {
            assert_eq!(
                attempt(&with_headers(&headers), redelivered),
                want,
                "{what}"
            );
        }
    }

    #[test]
    fn a_dead_letter_keeps_our_reason_or_takes_the_brokers() {
        let ours = DeadLetterReason {
            error: "invalid input: test".into(),
            attempts: 2,
            source_queue: "orders".into(),
            consumer: "billing".into(),
        };
        let extra: Vec<(String, String)> = ours.to_headers().into_iter().collect();
        let p = properties(&Message::new("x").with_id("m").unwrap(), &extra);
        let back = dead_letter(message(&p, b"x"));
        assert_eq!(back.reason.error, "invalid input: test");
        assert_eq!(back.reason.consumer, "billing");

        let brokers = with_headers(&[
            (
                "x-first-death-reason",
                AMQPValue::LongString("delivery_limit".into()),
            ),
            (
                "x-first-death-queue",
                AMQPValue::LongString("orders".into()),
            ),
            ("x-delivery-count", AMQPValue::LongLongInt(20)),
        ]);
        let back = dead_letter(message(&brokers, b"x"));
        assert_eq!(
            back.reason.error,
            "dead-lettered by the broker: delivery_limit"
        );
        assert_eq!(
            (back.reason.attempts, back.reason.source_queue.as_str()),
            (20, "orders")
        );
    }
}
