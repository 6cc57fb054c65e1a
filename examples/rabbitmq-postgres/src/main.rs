//! Orders that producers publish to an existing topic exchange (`shop`, routing keys
//! `order.created`), applied once to business tables in PostgreSQL, whatever RabbitMQ
//! redelivers and however often a producer re-sends.
//!
//! `cargo run -p rabbitmq-postgres` (RabbitMQ and PostgreSQL on their default local ports,
//! or `AMQP_URL` and `DATABASE_URL`); stop it with Ctrl-C. The README has a producer.
//!
//! `-- --at-least-once` runs it deliberately without its dedup records: a redelivery or a
//! re-sent order is applied again. It is there for `justonce lab --worker` to catch (the
//! README shows both runs); never run a consumer this way where effects must happen once.

use justonce::amqp::{AmqpOptions, AmqpSource, ExchangeType};
use justonce::sql::{PgStore, PgTx};
use justonce::{
    Consumer, ConsumerOptions, Context, Disposition, Handler, Message, Result, Semantics,
};
use serde::Deserialize;

/// What the producers publish, as JSON. A message that does not decode (a missing field, a
/// wrong type) is dead-lettered at once with serde's reason; it never reaches the tables.
#[derive(Debug, Deserialize)]
struct OrderCreated {
    order_id: String,
    account: i64,
    amount_cents: i64,
}

/// Credits the account and writes a ledger row, in the transaction that also holds the
/// dedup record: both commit, or neither.
struct Billing;

impl Handler<PgTx> for Billing {
    /// Batches take their account locks in account order: two consumer processes never
    /// deadlock over two accounts.
    fn lock_key(&self, message: &Message) -> Option<String> {
        let order: OrderCreated = message.decode_json().ok()?;
        Some(format!("{:020}", order.account))
    }

    async fn handle(&self, cx: &Context<'_>, tx: &mut PgTx) -> Result<Disposition> {
        let order: OrderCreated = cx.message().decode_json()?;
        let updated = sqlx::query("UPDATE accounts SET balance = balance + $1 WHERE id = $2")
            .bind(order.amount_cents)
            .bind(order.account)
            .execute(&mut **tx)
            .await?
            .rows_affected();
        if updated == 0 {
            return Ok(Disposition::dead_letter(format!(
                "invalid input: no account {}",
                order.account
            )));
        }
        sqlx::query("INSERT INTO ledger (order_id, account, amount_cents) VALUES ($1, $2, $3)")
            .bind(&order.order_id)
            .bind(order.account)
            .bind(order.amount_cents)
            .execute(&mut **tx)
            .await?;
        Ok(Disposition::Ok)
    }
}

#[tokio::main]
async fn main() -> Result<()> {
    // justonce logs through `tracing`: without a subscriber it prints nothing. (sqlx logs
    // every server notice, such as "relation already exists, skipping", at info.)
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,sqlx=warn"));
    tracing_subscriber::fmt().with_env_filter(filter).init();
    let amqp = std::env::var("AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into());
    let db = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());

    let store = PgStore::open(&db).await?;
    // Your migrations would own these. Were they missing, the consumer would pause and say
    // so, leaving every order in the queue, and go on once they exist.
    for ddl in [
        "CREATE TABLE IF NOT EXISTS accounts (id BIGINT PRIMARY KEY, balance BIGINT NOT NULL)",
        "CREATE TABLE IF NOT EXISTS ledger (order_id TEXT NOT NULL, account BIGINT NOT NULL,
                                             amount_cents BIGINT NOT NULL)",
        "INSERT INTO accounts SELECT g, 0 FROM generate_series(1, 100) g ON CONFLICT DO NOTHING",
    ] {
        sqlx::query(ddl).execute(store.pool()).await?;
    }

    // The work queue `billing`, bound to the topic exchange `shop` (declared topic if it does
    // not exist yet), with its dead-letter queue and retry tiers of its own.
    let options = AmqpOptions::new("billing").bind("shop", ExchangeType::Topic, "order.*");
    let source = AmqpSource::connect(&amqp, options).await?;

    let mut consumer = ConsumerOptions::new("billing");
    if std::env::args().any(|a| a == "--at-least-once") {
        eprintln!("--at-least-once: no dedup records; duplicates will be applied again");
        consumer = consumer.semantics(Semantics::AtLeastOnce);
    }
    Consumer::new(consumer, source, store, Billing)?
        .run_until(justonce::shutdown_signal()) // Ctrl-C: finish the batch, commit, ack, exit
        .await
}
