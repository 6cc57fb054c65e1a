use lapin::options::{ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::{Channel, ExchangeKind};

use justonce_core::{Error, ErrorKind, Result};

use crate::error::amqp;
use crate::{AmqpOptions, QueueType};

fn s(v: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(v))
}

fn durable() -> QueueDeclareOptions {
    QueueDeclareOptions {
        durable: true,
        ..QueueDeclareOptions::default()
    }
}

/// Declares the work exchange and queue, the dead-letter exchange and queue, and the retry
/// tiers of `opts`. Idempotent: declaring the same topology again changes nothing; declaring
/// it with other arguments fails with an error that names the queue.
pub async fn declare(channel: &Channel, opts: &AmqpOptions) -> Result<()> {
    let x = ExchangeDeclareOptions {
        durable: true,
        ..ExchangeDeclareOptions::default()
    };
    for exchange in [opts.exchange(), opts.dead_letter_exchange()] {
        channel
            .exchange_declare(
                exchange.as_str().into(),
                ExchangeKind::Direct,
                x,
                FieldTable::default(),
            )
            .await
            .map_err(|e| amqp(format!("declaring exchange {exchange}"), e))?;
    }

    let mut work = FieldTable::default();
    let mut dead = FieldTable::default();
    if opts.queue_type == QueueType::Quorum {
        work.insert("x-queue-type".into(), s("quorum"));
        dead.insert("x-queue-type".into(), s("quorum"));
        if let Some(limit) = opts.delivery_limit {
            work.insert("x-delivery-limit".into(), AMQPValue::LongInt(limit as i32));
            work.insert(
                "x-dead-letter-exchange".into(),
                s(&opts.dead_letter_exchange()),
            );
            work.insert("x-dead-letter-routing-key".into(), s(&opts.queue));
            // At-least-once dead-lettering (RabbitMQ 3.10+, feature flag stream_queue).
            work.insert("x-dead-letter-strategy".into(), s("at-least-once"));
            work.insert("x-overflow".into(), s("reject-publish"));
        }
    }
    let declare_queue = |name: String, args: FieldTable| async move {
        channel
            .queue_declare(name.as_str().into(), durable(), args)
            .await
            .map_err(|e| {
                let mut err = amqp(format!("declaring queue {name}"), e);
                if err.kind() == ErrorKind::Config {
                    err = Error::with_source(
                        ErrorKind::Config,
                        format!(
                        "queue {name} exists with other arguments, or the broker lacks a feature \
                         (at-least-once dead-lettering needs RabbitMQ 3.10+ with the stream_queue \
                         feature flag enabled): delete the queue or align AmqpOptions"
                    ),
                        err,
                    );
                }
                err
            })
    };
    declare_queue(opts.dead_letter_queue(), dead).await?;
    declare_queue(opts.queue.clone(), work).await?;
    let bind = QueueBindOptions::default();
    channel
        .queue_bind(
            opts.dead_letter_queue().as_str().into(),
            opts.dead_letter_exchange().as_str().into(),
            opts.queue.as_str().into(),
            bind,
            FieldTable::default(),
        )
        .await
        .map_err(|e| amqp("binding the dead-letter queue", e))?;
    channel
        .queue_bind(
            opts.queue.as_str().into(),
            opts.exchange().as_str().into(),
            opts.queue.as_str().into(),
            bind,
            FieldTable::default(),
        )
        .await
        .map_err(|e| amqp("binding the work queue", e))?;

    for delay in &opts.retry_delays {
        let mut args = FieldTable::default();
        args.insert(
            "x-message-ttl".into(),
            AMQPValue::LongLongInt(delay.as_millis() as i64),
        );
        args.insert("x-dead-letter-exchange".into(), s(&opts.exchange()));
        args.insert("x-dead-letter-routing-key".into(), s(&opts.queue));
        declare_queue(
            format!("{}.retry.{}ms", opts.queue, delay.as_millis()),
            args,
        )
        .await?;
    }
    Ok(())
}
