//! Claim / lease: for an effect no transaction covers (an email, a third-party API). The
//! consumer claims the message with a lease and a fencing token, the effect gets a stable
//! idempotency key, and a completed claim stores its result for later duplicates.
//!
//! Weaker than a transaction: if the holder dies after the effect and before completing,
//! another holder runs the effect again after the lease; the effect must accept the key.
//!
//! `cargo run -p example-claim`

use std::sync::{Arc, Mutex};

use justonce::sql::{SqliteClaimStore, SqliteQueue, SqliteStore, SqliteTx};
use justonce::{
    Consumer, ConsumerOptions, Context, Disposition, Error, Handler, Idempotency, Message,
    Publisher, Result,
};

/// Stands in for a mail service that accepts an idempotency key.
#[derive(Default)]
struct Mailer {
    sent: Mutex<Vec<(String, u64)>>,
}

struct SendReceipt {
    mailer: Arc<Mailer>,
}

impl Handler<SqliteTx> for SendReceipt {
    async fn handle(&self, cx: &Context<'_>, _tx: &mut SqliteTx) -> Result<Disposition> {
        let key = cx.idempotency_key().unwrap_or_default(); // "mailer/RCPT-1", same on every delivery
        let token = cx.fencing_token().unwrap_or_default();
        self.mailer
            .sent
            .lock()
            .map_err(|e| Error::config(e.to_string()))?
            .push((key, token));
        cx.set_result("queued as mail-7781");
        Ok(Disposition::Ok)
    }

    async fn on_duplicate(&self, cx: &Context<'_>, result: Option<&[u8]>) {
        let result = result.map(String::from_utf8_lossy).unwrap_or_default();
        println!(
            "duplicate of {:?}: already done ({result})",
            cx.message_id().map(|i| i.as_str())
        );
    }
}

#[tokio::main]
async fn main() -> Result<()> {
    let dir = tempfile::tempdir().map_err(|e| Error::config(e.to_string()))?;
    let url = |f: &str| format!("sqlite:{}", dir.path().join(f).display());
    let queue = SqliteQueue::open(&url("queue.db"), "receipts").await?;
    let store = SqliteStore::open(&url("app.db")).await?;
    let claims = SqliteClaimStore::open(&url("claims.db")).await?; // a file of its own

    let receipt = Message::new(r#"{"to":"ada@example.com"}"#).with_id("RCPT-1")?;
    queue.publish(&receipt).await?;
    queue.publish(&receipt).await?;

    let mailer = Arc::new(Mailer::default());
    let opts = ConsumerOptions::new("mailer")
        .idempotency(Idempotency::Claim)
        .batch_size(1);
    let consumer = Consumer::new(
        opts,
        queue.clone(),
        store,
        SendReceipt {
            mailer: mailer.clone(),
        },
    )?
    .with_claims(Arc::new(claims))?;
    while queue.stats().await?.pending > 0 {
        consumer.run_once().await?;
    }

    let sent = mailer
        .sent
        .lock()
        .map_err(|e| Error::config(e.to_string()))?
        .clone();
    println!("mails sent: {sent:?}");
    if sent.len() != 1 {
        return Err(Error::config(format!(
            "expected one mail, got {}",
            sent.len()
        )));
    }
    Ok(())
}
