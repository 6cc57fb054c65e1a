use std::future::Future;
use std::sync::Mutex;

use justonce_core::{
    outgoing_id, Delivery, Disposition, Error, ErrorKind, Message, MessageId, Result,
};

/// A message a handler sent, with its ordering key.
pub(crate) type Outgoing = (Option<String>, Message);

/// What a handler knows about the delivery it is handling.
#[derive(Debug)]
pub struct Context<'a> {
    pub(crate) delivery: &'a Delivery,
    pub(crate) consumer: &'a str,
    pub(crate) id: Option<&'a MessageId>,
    pub(crate) token: Option<u64>,
    pub(crate) result: Mutex<Option<Vec<u8>>>,
    /// Messages sent, with their ordering keys, enqueued once the handler returns `Ok`;
    /// `None` when the consumer has no outbox.
    pub(crate) outgoing: Option<Mutex<Vec<Outgoing>>>,
}

impl<'a> Context<'a> {
    /// The message.
    pub fn message(&self) -> &'a Message {
        &self.delivery.message
    }

    /// Which delivery of the message this is, 1 for the first.
    pub fn attempt(&self) -> u32 {
        self.delivery.attempt
    }

    /// Whether the transport delivered this message before.
    pub fn redelivered(&self) -> bool {
        self.delivery.redelivered
    }

    /// The consumer's name.
    pub fn consumer(&self) -> &'a str {
        self.consumer
    }

    /// The message's id as the consumer's [`IdStrategy`](justonce_core::IdStrategy) derived it.
    pub fn message_id(&self) -> Option<&'a MessageId> {
        self.id
    }

    /// A key that is the same on every delivery of this message to this consumer:
    /// `consumer/message-id`. Hand it to effects that accept an idempotency key
    /// (payment APIs, mail services). `None` when the message has no id.
    pub fn idempotency_key(&self) -> Option<String> {
        self.id.map(|id| format!("{}/{}", self.consumer, id))
    }

    /// The fencing token of this delivery's claim
    /// ([`Idempotency::Claim`](crate::Idempotency::Claim) only). It grows on every takeover:
    /// an effect that remembers the highest token it has seen can refuse a stale holder.
    pub fn fencing_token(&self) -> Option<u64> {
        self.token
    }

    /// Stores a result with the completed claim; a later duplicate gets it back in
    /// [`Handler::on_duplicate`].
    pub fn set_result(&self, result: impl Into<Vec<u8>>) {
        *self.result.lock().unwrap_or_else(|e| e.into_inner()) = Some(result.into());
    }

    /// Sends `message` through the consumer's outbox
    /// ([`Consumer::with_outbox`](crate::Consumer::with_outbox)): it is written in the
    /// batch's transaction once the handler returns [`Disposition::Ok`], and leaves, by
    /// the outbox's relay, only after that transaction commits. A handler that fails, or
    /// whose message is retried or dead-lettered, sends nothing.
    ///
    /// Its id is replaced by [`outgoing_id`]`(consumer, incoming id, ordinal)`, the
    /// ordinal counting this handler run's sends from 0: a handler that runs again for
    /// the same message sends the same ids, so the next consumer's dedup absorbs every
    /// copy. Returns that id.
    ///
    /// Fails when the consumer has no outbox ([`ErrorKind::Config`], which fails the batch
    /// rather than the message) or the incoming message has no id.
    pub fn send(&self, message: Message) -> Result<MessageId> {
        self.push(None, message)
    }

    /// As [`Context::send`], in the order of `key`: the relay publishes the messages of one
    /// ordering key in the order they were committed.
    pub fn send_keyed(&self, key: impl Into<String>, message: Message) -> Result<MessageId> {
        self.push(Some(key.into()), message)
    }

    fn push(&self, key: Option<String>, message: Message) -> Result<MessageId> {
        let Some(outgoing) = &self.outgoing else {
            return Err(Error::config(format!(
                "consumer `{}` has no outbox to send through: give it one with \
                 Consumer::with_outbox",
                self.consumer
            )));
        };
        let incoming = self.id.ok_or_else(|| {
            Error::new(
                ErrorKind::InvalidInput,
                "a message without an id cannot send: the ids of what it sends derive from it",
            )
        })?;
        let mut out = outgoing.lock().unwrap_or_else(|e| e.into_inner());
        let id = outgoing_id(self.consumer, incoming, out.len() as u32);
        out.push((key, message.with_message_id(Some(id.clone()))));
        Ok(id)
    }

    pub(crate) fn take_outgoing(&self) -> Vec<Outgoing> {
        self.outgoing.as_ref().map_or_else(Vec::new, |o| {
            std::mem::take(&mut *o.lock().unwrap_or_else(|e| e.into_inner()))
        })
    }

    pub(crate) fn take_result(&self) -> Option<Vec<u8>> {
        self.result.lock().unwrap_or_else(|e| e.into_inner()).take()
    }
}

/// The business logic of a consumer.
///
/// It receives the store's open transaction: every write made through it commits together
/// with the dedup record, or not at all. It returns a [`Disposition`]; an `Err` that is the
/// message's fault is turned into one by [`Disposition::from_error`] (transient errors
/// retry, the rest dead-letter), and any other fails the batch, which goes back to the
/// queue while the consumer pauses.
///
/// Implement it with plain `async fn`s; the futures must be `Send` (hold no `!Send` value,
/// such as a `std::sync::MutexGuard`, across an `.await`).
///
/// ```no_run
/// use justonce::{Context, Disposition, Handler, Result};
/// use justonce::sql::SqliteTx;
///
/// struct Credit;
///
/// #[derive(serde::Deserialize)]
/// struct Payment { account: i64, cents: i64 }
///
/// impl Handler<SqliteTx> for Credit {
///     async fn handle(&self, cx: &Context<'_>, tx: &mut SqliteTx) -> Result<Disposition> {
///         let p: Payment = cx.message().decode_json()?;
///         sqlx::query("UPDATE accounts SET balance = balance + ? WHERE id = ?")
///             .bind(p.cents)
///             .bind(p.account)
///             .execute(&mut **tx)
///             .await?;
///         Ok(Disposition::Ok)
///     }
/// }
/// ```
pub trait Handler<Tx: Send>: Send + Sync + 'static {
    /// Handles one message inside `tx`.
    fn handle(
        &self,
        cx: &Context<'_>,
        tx: &mut Tx,
    ) -> impl Future<Output = Result<Disposition>> + Send;

    /// The row this message's handler will lock first (an account, an order), if it locks
    /// one: the runtime runs each batch in the order of these keys, so that every consumer
    /// (another process, another batch of this one) takes its locks in the same order, and
    /// two batches that touch the same rows wait for each other instead of deadlocking.
    /// Messages with one key keep their order; those with none come first. The default
    /// names none.
    ///
    /// ```
    /// use justonce::{Context, Disposition, Handler, Message, Result};
    /// # use justonce::memory::MemoryTx;
    /// #[derive(serde::Deserialize)]
    /// struct Payment { account: i64 }
    ///
    /// struct Credit;
    ///
    /// impl Handler<MemoryTx> for Credit {
    ///     fn lock_key(&self, message: &Message) -> Option<String> {
    ///         let p: Payment = message.decode_json().ok()?; // a bad payload is the handler's to reject
    ///         Some(format!("account:{:020}", p.account))
    ///     }
    ///     async fn handle(&self, cx: &Context<'_>, tx: &mut MemoryTx) -> Result<Disposition> {
    ///         # let _ = (cx, tx);
    ///         // UPDATE accounts SET balance = balance + $1 WHERE id = $2 ...
    ///         Ok(Disposition::Ok)
    ///     }
    /// }
    /// ```
    fn lock_key(&self, message: &Message) -> Option<String> {
        let _ = message;
        None
    }

    /// Called instead of [`Handler::handle`] for a message whose claim completed before,
    /// with the result stored then ([`Idempotency::Claim`](crate::Idempotency::Claim) only).
    /// The default does nothing; the delivery is acked either way.
    fn on_duplicate(
        &self,
        cx: &Context<'_>,
        result: Option<&[u8]>,
    ) -> impl Future<Output = ()> + Send {
        let _ = (cx, result);
        async {}
    }
}
