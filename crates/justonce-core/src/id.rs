//! Where a message's id comes from.
//!
//! | source | strength | weakness |
//! |---|---|---|
//! | the message-id header/property ([`IdStrategy::Header`], default) | set by the producer, seen by every tool | a producer that makes a new UUID per attempt defeats dedup |
//! | a business field ([`IdStrategy::Field`]) | retries carry the same business id | the field must be unique per effect |
//! | a content hash ([`IdStrategy::ContentHash`]) | identical payloads dedup with no producer help | two genuinely equal requests become one |
//!
//! A message for which the strategy finds no id is never deduplicated against others: the
//! consumer dead-letters it (contract 4 in ARCHITECTURE.md).

use sha2::{Digest, Sha256};

use crate::{Error, ErrorKind, Message, MessageId, Result};

/// The version of the content-hash key format; part of every derived key.
pub const CONTENT_HASH_VERSION: &str = "v1";

/// How a consumer finds a message's id.
///
/// ```
/// use justonce_core::{IdStrategy, Message};
///
/// let a = Message::new(r#"{"order_id":"ORD-7","amount":5}"#);
/// let b = Message::new(r#"{ "amount": 5, "order_id": "ORD-7" }"#);
/// let field = IdStrategy::field("/order_id");
/// assert_eq!(field.derive(&a)?.unwrap().as_str(), "ORD-7");
/// let hash = IdStrategy::content_hash("orders");
/// assert_eq!(hash.derive(&a)?, hash.derive(&b)?, "key order and whitespace do not matter");
/// assert!(hash.derive(&a)?.unwrap().as_str().starts_with("sha256:v1:orders:"));
/// assert_eq!(IdStrategy::Header.derive(&a)?, None, "no id header: no id");
/// # Ok::<(), justonce_core::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum IdStrategy {
    /// The id the message carries (AMQP `message_id`, a `Nats-Msg-Id` header, the queue's column).
    #[default]
    Header,
    /// A field of the JSON payload, by JSON pointer (RFC 6901), such as `/order_id`.
    Field {
        /// The JSON pointer.
        pointer: String,
    },
    /// `sha256:v1:NAMESPACE:HEX` over the canonical JSON of the payload: object keys
    /// sorted, no insignificant whitespace. The algorithm, version and namespace are part of
    /// the key, so changing the strategy never silently collides with old keys.
    ContentHash {
        /// Keeps the keys of different message types apart.
        namespace: String,
    },
}

impl IdStrategy {
    /// [`IdStrategy::Field`] at `pointer`.
    pub fn field(pointer: impl Into<String>) -> Self {
        IdStrategy::Field {
            pointer: pointer.into(),
        }
    }

    /// [`IdStrategy::ContentHash`] in `namespace`.
    pub fn content_hash(namespace: impl Into<String>) -> Self {
        IdStrategy::ContentHash {
            namespace: namespace.into(),
        }
    }

    /// Checks the strategy's own settings.
    pub fn validate(&self) -> Result<()> {
        match self {
            IdStrategy::Header => Ok(()),
            IdStrategy::Field { pointer } if pointer.starts_with('/') => Ok(()),
            IdStrategy::Field { pointer } => Err(Error::config(format!(
                "id field `{pointer}` is not a JSON pointer: write it like /order_id"
            ))),
            IdStrategy::ContentHash { namespace } => {
                let ok = !namespace.is_empty()
                    && namespace.len() <= 64
                    && namespace
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
                if ok {
                    Ok(())
                } else {
                    Err(Error::config(format!(
                        "content-hash namespace `{namespace}` is invalid: use 1-64 characters of A-Z a-z 0-9 . _ -"
                    )))
                }
            }
        }
    }

    /// The message's id under this strategy; `Ok(None)` when it has none, an error when
    /// the payload cannot give one (not JSON).
    pub fn derive(&self, message: &Message) -> Result<Option<MessageId>> {
        match self {
            IdStrategy::Header => Ok(message.id().cloned()),
            IdStrategy::Field { pointer } => {
                let value: serde_json::Value = parse(message)?;
                Ok(match value.pointer(pointer) {
                    Some(serde_json::Value::String(s)) => MessageId::new(s.as_str()).ok(),
                    Some(serde_json::Value::Number(n)) => MessageId::new(n.to_string()).ok(),
                    _ => None,
                })
            }
            IdStrategy::ContentHash { namespace } => {
                let value: serde_json::Value = parse(message)?;
                let mut canonical = Vec::with_capacity(message.payload().len());
                canonical_json(&value, &mut canonical);
                let digest = Sha256::digest(&canonical);
                let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
                MessageId::new(format!("sha256:{CONTENT_HASH_VERSION}:{namespace}:{hex}")).map(Some)
            }
        }
    }

    /// A short name (`header`, `field:/order_id`, `content-hash:orders`).
    pub fn describe(&self) -> String {
        match self {
            IdStrategy::Header => "header".into(),
            IdStrategy::Field { pointer } => format!("field:{pointer}"),
            IdStrategy::ContentHash { namespace } => format!("content-hash:{namespace}"),
        }
    }
}

fn parse(message: &Message) -> Result<serde_json::Value> {
    serde_json::from_slice(message.payload()).map_err(|e| {
        Error::with_source(
            ErrorKind::Decode,
            format!("payload is not JSON, so no id can be derived from it ({e})"),
            e,
        )
    })
}

/// Writes `value` as canonical JSON: object keys sorted by their UTF-8 bytes, no
/// whitespace, strings and numbers as serde_json writes them.
///
/// ```
/// let v: serde_json::Value = serde_json::from_str(r#"{ "b": [1, {"d": 2, "c": 3}], "a": "x" }"#).unwrap();
/// let mut out = Vec::new();
/// justonce_core::canonical_json(&v, &mut out);
/// assert_eq!(out, br#"{"a":"x","b":[1,{"c":3,"d":2}]}"#);
/// ```
pub fn canonical_json(value: &serde_json::Value, out: &mut Vec<u8>) {
    use serde_json::Value;
    match value {
        Value::Object(map) => {
            let mut entries: Vec<_> = map.iter().collect();
            entries.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
            out.push(b'{');
            for (i, (k, v)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                out.extend_from_slice(Value::String(k.clone()).to_string().as_bytes());
                out.push(b':');
                canonical_json(v, out);
            }
            out.push(b'}');
        }
        Value::Array(items) => {
            out.push(b'[');
            for (i, v) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                canonical_json(v, out);
            }
            out.push(b']');
        }
        scalar => out.extend_from_slice(scalar.to_string().as_bytes()),
    }
}
