use async_trait::async_trait;

use justonce_core::{Delivery, Disposition, Message, Result};

/// What a handler knows about the delivery it is handling.
#[derive(Debug)]
pub struct Context<'a> {
    pub(crate) delivery: &'a Delivery,
    pub(crate) consumer: &'a str,
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

    /// A key that is the same on every delivery of this message to this consumer:
    /// `consumer/message-id`. Hand it to effects that accept an idempotency key
    /// (payment APIs, mail services). `None` when the message has no id.
    pub fn idempotency_key(&self) -> Option<String> {
        self.message()
            .id()
            .map(|id| format!("{}/{}", self.consumer, id))
    }
}

/// The business logic of a consumer.
///
/// It receives the store's open transaction: every write made through it commits together
/// with the dedup record, or not at all. It returns a [`Disposition`]; an `Err` is turned
/// into one by [`Disposition::from_error`] (transient errors retry, the rest dead-letter).
///
/// ```no_run
/// use justonce::{async_trait, Context, Disposition, Handler, Result};
/// use justonce::sql::SqliteTx;
///
/// struct Credit;
///
/// #[derive(serde::Deserialize)]
/// struct Payment { account: i64, cents: i64 }
///
/// #[async_trait]
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
#[async_trait]
pub trait Handler<Tx: Send>: Send + Sync + 'static {
    /// Handles one message inside `tx`.
    async fn handle(&self, cx: &Context<'_>, tx: &mut Tx) -> Result<Disposition>;
}
