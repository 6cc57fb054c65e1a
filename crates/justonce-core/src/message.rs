//! Messages and their identity.

use std::collections::BTreeMap;
use std::fmt;

use sha2::{Digest, Sha256};

use crate::{Error, ErrorKind, Result};

/// The longest message id accepted, in bytes.
pub const MAX_MESSAGE_ID_BYTES: usize = 255;

/// A message id: never empty, at most [`MAX_MESSAGE_ID_BYTES`] bytes.
///
/// A message without a usable id carries `None` (see [`Message::id`]); it is never
/// deduplicated against other such messages (contract 4 in ARCHITECTURE.md).
///
/// ```
/// use justonce_core::MessageId;
///
/// let id = MessageId::new("ORD-123").unwrap();
/// assert_eq!(id.as_str(), "ORD-123");
/// assert!(MessageId::new("").is_err());
/// assert!(MessageId::new("   ").is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MessageId(String);

impl MessageId {
    /// Validates and wraps an id.
    pub fn new(id: impl Into<String>) -> Result<Self> {
        let id = id.into();
        if id.trim().is_empty() {
            return Err(Error::new(ErrorKind::InvalidInput, "message id is empty"));
        }
        if id.len() > MAX_MESSAGE_ID_BYTES {
            return Err(Error::new(
                ErrorKind::InvalidInput,
                format!(
                    "message id is {} bytes, longer than {MAX_MESSAGE_ID_BYTES}",
                    id.len()
                ),
            ));
        }
        Ok(MessageId(id))
    }

    /// The id as a string slice.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for MessageId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A stable digest of a payload: the same id with another fingerprint is a conflict,
/// not a duplicate (contract 5 in ARCHITECTURE.md).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint([u8; 16]);

impl Fingerprint {
    /// The first 128 bits of the SHA-256 of `bytes`.
    pub fn of(bytes: &[u8]) -> Self {
        let digest = Sha256::digest(bytes);
        let mut out = [0u8; 16];
        out.copy_from_slice(&digest[..16]);
        Fingerprint(out)
    }

    /// The 32 lowercase hex digits of the fingerprint.
    pub fn to_hex(&self) -> String {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut s = String::with_capacity(32);
        for b in self.0 {
            s.push(char::from(DIGITS[usize::from(b >> 4)]));
            s.push(char::from(DIGITS[usize::from(b & 0xf)]));
        }
        s
    }

    /// Parses the output of [`Fingerprint::to_hex`].
    pub fn from_hex(hex: &str) -> Option<Self> {
        if hex.len() != 32 {
            return None;
        }
        let mut out = [0u8; 16];
        for (i, byte) in out.iter_mut().enumerate() {
            *byte = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
        }
        Some(Fingerprint(out))
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fingerprint({})", self.to_hex())
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

/// Message headers: string keys and values, ordered for stable output.
pub type Headers = BTreeMap<String, String>;

/// A message as published and as delivered: id, payload bytes, headers, content type.
///
/// ```
/// use justonce_core::Message;
///
/// #[derive(serde::Serialize, serde::Deserialize, PartialEq, Debug)]
/// struct Order { order_id: String, amount: i64 }
///
/// let order = Order { order_id: "ORD-1".into(), amount: 250 };
/// let msg = Message::json(&order)?.with_id("ORD-1")?.with_header("tenant", "acme");
/// assert_eq!(msg.id().unwrap().as_str(), "ORD-1");
/// assert_eq!(msg.decode_json::<Order>()?, order);
/// # Ok::<(), justonce_core::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    id: Option<MessageId>,
    payload: Vec<u8>,
    headers: Headers,
    content_type: Option<String>,
}

impl Message {
    /// A message with this payload, no id, no headers.
    pub fn new(payload: impl Into<Vec<u8>>) -> Self {
        Message {
            id: None,
            payload: payload.into(),
            headers: Headers::new(),
            content_type: None,
        }
    }

    /// A message whose payload is `value` as JSON, content type `application/json`.
    pub fn json<T: serde::Serialize>(value: &T) -> Result<Self> {
        let payload = serde_json::to_vec(value).map_err(|e| {
            Error::with_source(
                ErrorKind::InvalidInput,
                "value cannot be encoded as JSON",
                e,
            )
        })?;
        Ok(Message::new(payload).with_content_type("application/json"))
    }

    /// Sets the id; an empty or overlong id is an error.
    pub fn with_id(mut self, id: impl Into<String>) -> Result<Self> {
        self.id = Some(MessageId::new(id)?);
        Ok(self)
    }

    /// Sets the id from an optional, already validated id.
    pub fn with_message_id(mut self, id: Option<MessageId>) -> Self {
        self.id = id;
        self
    }

    /// Adds a header.
    pub fn with_header(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.insert(key.into(), value.into());
        self
    }

    /// Replaces all headers.
    pub fn with_headers(mut self, headers: Headers) -> Self {
        self.headers = headers;
        self
    }

    /// Sets the content type.
    pub fn with_content_type(mut self, content_type: impl Into<String>) -> Self {
        self.content_type = Some(content_type.into());
        self
    }

    /// The id, or `None` when the message arrived without a usable one.
    pub fn id(&self) -> Option<&MessageId> {
        self.id.as_ref()
    }

    /// The payload bytes.
    pub fn payload(&self) -> &[u8] {
        &self.payload
    }

    /// The headers.
    pub fn headers(&self) -> &Headers {
        &self.headers
    }

    /// One header's value.
    pub fn header(&self, key: &str) -> Option<&str> {
        self.headers.get(key).map(String::as_str)
    }

    /// The content type, if set.
    pub fn content_type(&self) -> Option<&str> {
        self.content_type.as_deref()
    }

    /// The payload's [`Fingerprint`].
    pub fn fingerprint(&self) -> Fingerprint {
        Fingerprint::of(&self.payload)
    }

    /// Decodes the payload as JSON; failure is a permanent [`ErrorKind::Decode`] error,
    /// which the runtime dead-letters without retrying.
    pub fn decode_json<'a, T: serde::Deserialize<'a>>(&'a self) -> Result<T> {
        serde_json::from_slice(&self.payload).map_err(|e| {
            Error::with_source(ErrorKind::Decode, "payload is not the expected JSON", e)
        })
    }
}
