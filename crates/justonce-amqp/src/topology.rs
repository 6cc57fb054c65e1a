//! Declaring the topology: all or nothing, and every refusal explained.
//!
//! 1. What exists is checked first, passively, one channel per check (a passive declare of
//!    something missing closes its channel, which lapin logs as an error). Under
//!    [`Declare::All`] only the exchanges the queue is bound to are checked (they may be
//!    someone else's); under [`Declare::Missing`] and [`Declare::None`], every part.
//! 2. Under [`Declare::None`] that is all: whatever is missing is an error naming it.
//! 3. Otherwise the satellites are declared (justonce's exchange, the dead-letter exchange
//!    and queue, the retry tiers), then the work queue, last, then the bindings. If a
//!    declaration is refused, the satellites this call declared are deleted again while
//!    they are empty and unused, so that a failed declare leaves nothing behind that
//!    blocks the corrected settings; the work queue, the part most likely to exist with
//!    other arguments, is never created unless everything before it was accepted. The
//!    refusal (`PRECONDITION_FAILED`) is translated into what exists, what was wanted,
//!    and the option that aligns them.

use lapin::options::{
    ExchangeDeclareOptions, ExchangeDeleteOptions, QueueBindOptions, QueueDeclareOptions,
    QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::{Channel, Connection, ExchangeKind};

use justonce_core::{Error, ErrorKind, Result};

use crate::error::amqp;
use crate::{AmqpOptions, DeadLetters, Declare, ExchangeType, QueueType};

fn s(v: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(v))
}

/// One queue or exchange of the topology.
#[derive(Debug, Clone)]
pub(crate) enum Part {
    Queue {
        name: String,
        args: FieldTable,
        /// What it is for, in the words of an error message.
        role: &'static str,
    },
    Exchange {
        name: String,
        kind: ExchangeType,
        /// An exchange of the user's that may exist already: never declared again.
        theirs: bool,
    },
}

impl Part {
    fn name(&self) -> &str {
        match self {
            Part::Queue { name, .. } | Part::Exchange { name, .. } => name,
        }
    }

    pub(crate) fn describe(&self) -> String {
        match self {
            Part::Queue { name, role, .. } => format!("{role} {name}"),
            Part::Exchange { name, .. } => format!("exchange {name}"),
        }
    }
}

fn kind(k: ExchangeType) -> ExchangeKind {
    match k {
        ExchangeType::Direct => ExchangeKind::Direct,
        ExchangeType::Topic => ExchangeKind::Topic,
        ExchangeType::Fanout => ExchangeKind::Fanout,
        ExchangeType::Headers => ExchangeKind::Headers,
    }
}

fn durable_queue(passive: bool) -> QueueDeclareOptions {
    QueueDeclareOptions {
        durable: true,
        passive,
        ..QueueDeclareOptions::default()
    }
}

fn durable_exchange(passive: bool) -> ExchangeDeclareOptions {
    ExchangeDeclareOptions {
        durable: true,
        passive,
        ..ExchangeDeclareOptions::default()
    }
}

/// The delivery limit of a quorum queue that must not have one: RabbitMQ 4.0 gives every
/// quorum queue declared without `x-delivery-limit` a limit of 20, and drops a message
/// returned more often than that when the queue has no dead-letter target. A dead letter
/// read in place (`justonce dlq list`, a worker's metrics) is returned after each read:
/// 20 reads deleted it. Not -1, which 4.0 reads as no limit and 3.10 as a limit passed at
/// the first return.
pub(crate) const NO_LIMIT: i32 = i32::MAX;

/// `x-delivery-limit` = [`NO_LIMIT`], said explicitly.
fn unlimited(args: &mut FieldTable) {
    args.insert("x-delivery-limit".into(), AMQPValue::LongInt(NO_LIMIT));
}

/// Quorum queues dead-letter at-least-once (RabbitMQ 3.10+), which needs `reject-publish`.
fn quorum(args: &mut FieldTable) {
    unlimited(args);
    args.insert("x-queue-type".into(), s("quorum"));
    args.insert("x-dead-letter-strategy".into(), s("at-least-once"));
    args.insert("x-overflow".into(), s("reject-publish"));
}

/// The parts of `opts`, in the order they are declared: the work queue last.
pub(crate) fn parts(opts: &AmqpOptions) -> Vec<Part> {
    let quorum_queue = opts.queue_type == QueueType::Quorum;
    let mut work = FieldTable::default();
    if quorum_queue {
        work.insert("x-queue-type".into(), s("quorum"));
        if opts.delivery_limit.is_none() {
            unlimited(&mut work);
        }
        if let Some(limit) = opts.delivery_limit {
            let (dlx, key) = opts.dead_letter_target();
            work.insert("x-delivery-limit".into(), AMQPValue::LongInt(limit as i32));
            work.insert("x-dead-letter-exchange".into(), s(dlx));
            work.insert("x-dead-letter-routing-key".into(), s(key));
            work.insert("x-dead-letter-strategy".into(), s("at-least-once"));
            work.insert("x-overflow".into(), s("reject-publish"));
        }
    }
    let work = Part::Queue {
        name: opts.queue.clone(),
        args: work,
        role: "work queue",
    };
    let mut out = Vec::new();
    if let Some(own) = opts.own_exchange() {
        out.push(Part::Exchange {
            name: own.to_owned(),
            kind: ExchangeType::Direct,
            theirs: false,
        });
    }
    for b in &opts.bindings {
        if !out
            .iter()
            .any(|p| matches!(p, Part::Exchange { name, .. } if *name == b.exchange))
        {
            out.push(Part::Exchange {
                name: b.exchange.clone(),
                kind: b.kind.unwrap_or(ExchangeType::Direct),
                theirs: true,
            });
        }
    }
    match &opts.dead_letters {
        DeadLetters::Declare { exchange, queue } => {
            out.push(Part::Exchange {
                name: exchange.clone(),
                kind: ExchangeType::Direct,
                theirs: false,
            });
            let mut args = FieldTable::default();
            if quorum_queue {
                args.insert("x-queue-type".into(), s("quorum"));
                unlimited(&mut args);
            }
            out.push(Part::Queue {
                name: queue.clone(),
                args,
                role: "dead-letter queue",
            });
        }
        DeadLetters::Existing { exchange, .. } => out.push(Part::Exchange {
            name: exchange.clone(),
            kind: ExchangeType::Direct,
            theirs: true,
        }),
    }
    for (delay, name) in opts.retry_delays.iter().zip(opts.retry_queues()) {
        let mut args = FieldTable::default();
        args.insert(
            "x-message-ttl".into(),
            AMQPValue::LongLongInt(delay.as_millis() as i64),
        );
        // Back to the work queue through the default exchange, which routes by queue name:
        // the tiers need no exchange of the queue's, whatever it is bound to.
        args.insert("x-dead-letter-exchange".into(), s(""));
        args.insert("x-dead-letter-routing-key".into(), s(&opts.queue));
        if quorum_queue {
            quorum(&mut args);
        }
        out.push(Part::Queue {
            name,
            args,
            role: "retry tier",
        });
    }
    out.push(work);
    out
}

/// Declares `part` durable on `ch`; `passive` only asks whether it exists (with no
/// arguments: a passive declaration compares none).
pub(crate) async fn declare_part(ch: &Channel, part: &Part, passive: bool) -> lapin::Result<()> {
    match part {
        Part::Queue { name, args, .. } => {
            let args = if passive {
                FieldTable::default()
            } else {
                args.clone()
            };
            ch.queue_declare(name.as_str().into(), durable_queue(passive), args)
                .await
                .map(|_| ())
        }
        Part::Exchange { name, kind: k, .. } => {
            ch.exchange_declare(
                name.as_str().into(),
                kind(*k),
                durable_exchange(passive),
                FieldTable::default(),
            )
            .await
        }
    }
}

/// Whether `part` exists, asked passively on a channel of its own.
pub(crate) async fn exists(conn: &Connection, part: &Part) -> Result<bool> {
    let ch = conn
        .create_channel()
        .await
        .map_err(|e| amqp("opening a channel", e))?;
    let answer = declare_part(&ch, part, true).await;
    match answer {
        Ok(()) => {
            let _ = ch.close(200, "justonce: checked".into()).await;
            Ok(true)
        }
        // 404 NOT_FOUND closes the channel.
        Err(e) if e.to_string().contains("NOT_FOUND") => Ok(false),
        Err(e) => Err(amqp(format!("checking {}", part.describe()), e)),
    }
}

/// Declares the topology of `opts` on `conn` as [`AmqpOptions::declare`] says: every
/// part, only the missing ones, or none (checking that each exists). All or nothing: a
/// refused declaration deletes what this call created, and the error says what exists,
/// what was wanted and which option aligns them. Idempotent.
pub async fn declare(conn: &Connection, opts: &AmqpOptions) -> Result<()> {
    let parts = parts(opts);
    let mut existing = Vec::with_capacity(parts.len());
    for p in &parts {
        // Under `All` justonce's own parts are declared whether or not they exist (a
        // satellite is undone only while idle, the work queue comes last): no need to ask,
        // and have lapin log a 404 on a first start.
        let theirs = matches!(p, Part::Exchange { theirs: true, .. });
        let check = theirs || opts.declare != Declare::All;
        existing.push(check && exists(conn, p).await?);
    }
    let missing: Vec<&Part> = parts
        .iter()
        .zip(&existing)
        .filter(|(_, e)| !**e)
        .map(|(p, _)| p)
        .collect();
    if opts.declare == Declare::None {
        if missing.is_empty() {
            return Ok(());
        }
        let names: Vec<String> = missing.iter().map(|p| p.describe()).collect();
        return Err(Error::config(format!(
            "the topology is declared elsewhere (Declare::None), but {} does not exist: \
             create it there, or let justonce declare what is missing (Declare::Missing)",
            names.join(", ")
        )));
    }
    let unknown: Vec<String> = opts
        .bindings
        .iter()
        .filter(|b| b.kind.is_none())
        .filter(|b| missing.iter().any(|p| p.name() == b.exchange))
        .map(|b| b.exchange.clone())
        .chain(match &opts.dead_letters {
            DeadLetters::Existing { exchange, .. }
                if missing.iter().any(|p| p.name() == exchange) =>
            {
                Some(exchange.clone())
            }
            _ => None,
        })
        .collect();
    if !unknown.is_empty() {
        return Err(Error::config(format!(
            "exchange {} does not exist: create it, or give its type so that justonce \
             declares it (AmqpOptions::bind, or --exchange NAME:TYPE)",
            unknown.join(", ")
        )));
    }

    let mut parts = parts;
    loop {
        let ch = conn
            .create_channel()
            .await
            .map_err(|e| amqp("opening a channel", e))?;
        let mut created: Vec<&Part> = Vec::new();
        let result = declare_parts(&ch, opts, &parts, &existing, &mut created).await;
        let Err((part, e)) = result else {
            let _ = ch.close(200, "justonce: declared".into()).await;
            return Ok(());
        };
        let _ = ch.close(200, "justonce: declare failed".into()).await;
        // A queue made before justonce said its limit explicitly: used as it is, and the
        // loss it risks on RabbitMQ 4 said.
        let unlimited_refused = part.and_then(|p| match p {
            Part::Queue { name, args, role }
                if args.inner().get("x-delivery-limit") == Some(&AMQPValue::LongInt(NO_LIMIT))
                    && Inequivalent::parse(&e.to_chain_string())
                        .is_some_and(|i| i.arg == "x-delivery-limit" && i.current == "none") =>
            {
                Some((name.clone(), *role))
            }
            _ => None,
        });
        if let Some((name, role)) = unlimited_refused {
            tracing::warn!(
                queue = %name,
                "{role} {name} has no x-delivery-limit: RabbitMQ 4.0 and later give it 20, and \
                 drop a message returned more often (a dead letter is returned after each read \
                 of `justonce dlq list` and of a worker's metrics). Move its messages, delete \
                 it and let justonce declare it again, or set a policy with delivery-limit"
            );
            for p in parts.iter_mut() {
                if let Part::Queue { name: n, args, .. } = p {
                    if *n == name {
                        let mut kept = FieldTable::default();
                        for (k, v) in args.inner() {
                            if k.as_str() != "x-delivery-limit" {
                                kept.insert(k.clone(), v.clone());
                            }
                        }
                        *args = kept;
                    }
                }
            }
            continue;
        }
        undo(conn, &created).await;
        return Err(match part {
            Some(part) => refused(conn, part, opts, e).await,
            None => e,
        });
    }
}

/// Declares and binds; a refused declaration answers with its part, to be explained.
async fn declare_parts<'a>(
    ch: &Channel,
    opts: &AmqpOptions,
    parts: &'a [Part],
    existing: &[bool],
    created: &mut Vec<&'a Part>,
) -> std::result::Result<(), (Option<&'a Part>, Error)> {
    for (part, &exists) in parts.iter().zip(existing) {
        let skip = exists
            && (opts.declare == Declare::Missing
                || matches!(part, Part::Exchange { theirs: true, .. }));
        if skip {
            continue;
        }
        let declared = declare_part(ch, part, false).await;
        declared.map_err(|e| {
            (
                Some(part),
                amqp(format!("declaring {}", part.describe()), e),
            )
        })?;
        if !exists {
            created.push(part);
        }
    }
    let bind = |queue: String, exchange: String, key: String| async move {
        ch.queue_bind(
            queue.as_str().into(),
            exchange.as_str().into(),
            key.as_str().into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .map_err(|e| {
            let err = amqp(
                format!("binding queue {queue} to exchange {exchange} ({key})"),
                e,
            );
            (None, err)
        })
    };
    if let Some(own) = opts.own_exchange() {
        bind(opts.queue.clone(), own.to_owned(), opts.queue.clone()).await?;
    }
    for b in &opts.bindings {
        bind(
            opts.queue.clone(),
            b.exchange.clone(),
            b.routing_key.clone(),
        )
        .await?;
    }
    if let DeadLetters::Declare { exchange, queue } = &opts.dead_letters {
        bind(queue.clone(), exchange.clone(), opts.queue.clone()).await?;
    }
    Ok(())
}

/// Deletes what a failed declaration created, newest first, best effort. Only while unused
/// and empty: a part another process started using meanwhile stays. (Quorum queues refuse
/// the `if-unused` and `if-empty` flags, so a queue's counts are read first.)
async fn undo(conn: &Connection, created: &[&Part]) {
    let Ok(ch) = conn.create_channel().await else {
        return;
    };
    for part in created.iter().rev() {
        let _ = match part {
            Part::Queue { name, .. } => {
                let idle = ch
                    .queue_declare(
                        name.as_str().into(),
                        durable_queue(true),
                        FieldTable::default(),
                    )
                    .await
                    .is_ok_and(|q| q.message_count() == 0 && q.consumer_count() == 0);
                if !idle {
                    continue;
                }
                ch.queue_delete(name.as_str().into(), QueueDeleteOptions::default())
                    .await
                    .map(|_| ())
            }
            Part::Exchange { name, .. } => {
                ch.exchange_delete(
                    name.as_str().into(),
                    ExchangeDeleteOptions {
                        if_unused: true,
                        ..ExchangeDeleteOptions::default()
                    },
                )
                .await
            }
        };
    }
    let _ = ch.close(200, "justonce: undone".into()).await;
}

/// A refused declaration of `part`, explained. RabbitMQ names the first argument that
/// differs, which for a queue of the other type is seldom `x-queue-type`: a declaration
/// with that argument alone asks about the type first.
pub(crate) async fn refused(
    conn: &Connection,
    part: &Part,
    opts: &AmqpOptions,
    err: Error,
) -> Error {
    let text = err.to_chain_string();
    if err.kind() != ErrorKind::Config || !text.contains("PRECONDITION_FAILED") {
        return err;
    }
    let mut inequivalent = Inequivalent::parse(&text);
    if let (Part::Queue { name, .. }, Some(i)) = (part, &inequivalent) {
        if i.arg != "x-queue-type" {
            if let Some(t) = type_refused(conn, name, opts.queue_type).await {
                inequivalent = Some(t);
            }
        }
    }
    let explained = match inequivalent {
        Some(i) => i.explain(part, opts),
        None => format!(
            "{} exists with other settings than justonce's, or the broker lacks a feature \
             (at-least-once dead-lettering needs RabbitMQ 3.10+ with the stream_queue feature \
             flag): align AmqpOptions with it, use it as it is (Declare::Missing), or delete it",
            part.describe()
        ),
    };
    Error::with_source(ErrorKind::Config, explained, err)
}

/// Whether the existing queue `name` is of another type than `wanted`: a declaration with
/// the type alone (classic: no argument) is refused on `x-queue-type` if so.
async fn type_refused(conn: &Connection, name: &str, wanted: QueueType) -> Option<Inequivalent> {
    let mut only_type = FieldTable::default();
    if wanted == QueueType::Quorum {
        only_type.insert("x-queue-type".into(), s("quorum"));
    }
    let ch = conn.create_channel().await.ok()?;
    match ch
        .queue_declare(name.into(), durable_queue(false), only_type)
        .await
    {
        Ok(_) => {
            let _ = ch.close(200, "justonce: probed".into()).await;
            None
        }
        Err(e) => Inequivalent::parse(&e.to_string()).filter(|i| i.arg == "x-queue-type"),
    }
}

/// RabbitMQ's `inequivalent arg 'A' for queue 'Q' in vhost 'V': received X but current is Y`.
#[derive(Debug, PartialEq, Eq)]
struct Inequivalent {
    arg: String,
    wanted: String,
    current: String,
}

impl Inequivalent {
    fn parse(text: &str) -> Option<Inequivalent> {
        let rest = text.split_once("inequivalent arg '")?.1;
        let (arg, rest) = rest.split_once('\'')?;
        let rest = rest.split_once(": received ")?.1;
        let (wanted, current) = rest.split_once(" but current is ")?;
        Some(Inequivalent {
            arg: arg.to_owned(),
            wanted: value(wanted),
            current: value(current),
        })
    }

    fn explain(&self, part: &Part, opts: &AmqpOptions) -> String {
        let what = part.describe();
        let (arg, current, wanted) = (&self.arg, &self.current, &self.wanted);
        let fix = match arg.as_str() {
            "x-queue-type" => {
                let exists_as = if current == "none" {
                    "classic"
                } else {
                    current
                };
                let queue_type = if exists_as == "classic" {
                    "Classic"
                } else {
                    "Quorum"
                };
                return format!(
                    "{what} exists as a {exists_as} queue, and justonce wanted a {} queue: set \
                     AmqpOptions::queue_type(QueueType::{queue_type}) (--queue-type {exists_as}) \
                     to use it, or delete the queue",
                    opts.queue_type.as_str()
                );
            }
            "x-delivery-limit" if current == "none" && *wanted == NO_LIMIT.to_string() => {
                return format!(
                    "{what} has no x-delivery-limit: RabbitMQ 4.0 and later give it 20, and \
                     drop a message returned more often (a dead letter is returned after each \
                     read of `justonce dlq list` and of a worker's metrics); move its \
                     messages, delete it and let justonce declare it again, or set a policy \
                     with delivery-limit"
                );
            }
            "x-delivery-limit" | "x-dead-letter-strategy" | "x-overflow" => {
                "align AmqpOptions::delivery_limit with it (None declares no limit and no \
                 dead-lettering on the queue)"
            }
            "x-dead-letter-exchange" | "x-dead-letter-routing-key" => {
                "align AmqpOptions::dead_letters / dead_letters_to with it"
            }
            "x-message-ttl" => "align AmqpOptions::retry_tiers with it (each tier holds one delay)",
            "durable" => {
                "justonce needs durable queues and exchanges: delete it and let justonce declare it"
            }
            _ => "align AmqpOptions with it",
        };
        format!(
            "{what} exists with {arg} = {current}, and justonce wanted {wanted}: {fix}, use it \
             as it is (AmqpOptions::declare(Declare::Missing), --declare missing), or delete it"
        )
    }
}

/// `the value 'quorum' of type 'longstr'` -> `quorum`; `'true'` -> `true`; `none` -> `none`.
fn value(v: &str) -> String {
    let v = v.trim();
    let v = v.strip_prefix("the value ").unwrap_or(v);
    match v.strip_prefix('\'').and_then(|r| r.split_once('\'')) {
        Some((inner, _)) => inner.to_owned(),
        None => v.to_owned(),
    }
}

#[cfg(test)]
mod tests;
