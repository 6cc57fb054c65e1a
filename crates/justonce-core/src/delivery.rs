//! A message as handed to a consumer, with what it takes to settle it.

use std::any::Any;
use std::fmt;

use crate::Message;

/// The transport's handle for settling one delivery (ack, nack, dead-letter).
///
/// Opaque to the runtime; each transport puts its own token inside (a row and lease
/// number, a delivery tag and channel, an ack subject) and takes it back out.
pub struct Receipt(Box<dyn Any + Send + Sync>);

impl Receipt {
    /// Wraps a transport's token.
    pub fn new<T: Any + Send + Sync>(token: T) -> Self {
        Receipt(Box::new(token))
    }

    /// The token, if it is a `T`.
    pub fn downcast_ref<T: Any>(&self) -> Option<&T> {
        self.0.downcast_ref()
    }
}

impl fmt::Debug for Receipt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Receipt(..)")
    }
}

/// One delivery of a message: the same message may be delivered many times.
#[derive(Debug)]
pub struct Delivery {
    /// The message.
    pub message: Message,
    /// Which delivery this is, counted by the transport: 1 for the first.
    pub attempt: u32,
    /// Whether the transport says it delivered this message before.
    pub redelivered: bool,
    /// The handle that settles this delivery.
    pub receipt: Receipt,
}
