//! `justonce doctor` on RabbitMQ: every part of the topology justonce would declare, asked
//! of the broker without creating anything. A part that exists is declared again with
//! justonce's settings on a channel of its own, which the broker refuses when they differ
//! (a classic queue that is not durable, one of another type) and accepts as a no-op when
//! they agree. The dead letters must have an exchange and a queue to go to: dead-lettering
//! into a missing exchange drops the message, and RabbitMQ's own dead-lettering has no
//! publisher confirms to tell anyone (the source article's blind spot).

use justonce_core::{Check, Result};
use lapin::options::ConfirmSelectOptions;
use lapin::Connection;

use crate::connection::close_quietly;
use crate::error::amqp;
use crate::topology::{declare_part, exists, parts, refused, Part};
use crate::{AmqpOptions, QueueType};

/// Checks the topology `opts` describes on the broker at `url`, creating nothing; one
/// [`Check`] per part, and one for publisher confirms. An unreachable broker is an error.
pub async fn check(url: &str, opts: &AmqpOptions) -> Result<Vec<Check>> {
    opts.validate()?;
    let conn = crate::connect(url, &opts.tls).await?;
    let out = checks(&conn, opts).await;
    close_quietly(&conn, 200, "justonce doctor").await;
    out
}

/// The link a part serves, as the doctor's table names it.
fn link(part: &Part, opts: &AmqpOptions) -> &'static str {
    match part {
        Part::Queue { role, .. } => match *role {
            "work queue" => "work queue",
            "dead-letter queue" => "dead letters",
            _ => "retry tiers",
        },
        Part::Exchange { name, .. } if name == opts.dead_letter_target().0 => "dead letters",
        Part::Exchange { theirs: true, .. } => "bound exchange",
        Part::Exchange { .. } => "publish exchange",
    }
}

async fn checks(conn: &Connection, opts: &AmqpOptions) -> Result<Vec<Check>> {
    let mut out = Vec::new();
    let kind = match opts.queue_type {
        QueueType::Quorum => "quorum",
        QueueType::Classic => "classic",
    };
    let mut parts = parts(opts);
    // The work queue first, then what it needs.
    let rank = |p: &Part| match link(p, opts) {
        "work queue" => 0,
        "publish exchange" | "bound exchange" => 1,
        "dead letters" => 2,
        _ => 3,
    };
    parts.sort_by_key(|p| rank(p));
    for part in parts {
        let link = link(&part, opts);
        let what = part.describe();
        if !exists(conn, &part).await? {
            out.push(missing(link, &what));
            continue;
        }
        if matches!(part, Part::Exchange { theirs: true, .. }) {
            // Someone else's: its settings are theirs.
            out.push(Check::pass(link, format!("{what} exists")));
            continue;
        }
        let ch = conn
            .create_channel()
            .await
            .map_err(|e| amqp("opening a channel", e))?;
        match declare_part(&ch, &part, false).await {
            Ok(()) => {
                let _ = ch.close(200, "justonce: checked".into()).await;
                let detail = match part {
                    Part::Queue { .. } => {
                        format!("{what} exists, durable {kind}, as justonce declares it")
                    }
                    Part::Exchange { .. } => {
                        format!("{what} exists, durable, as justonce declares it")
                    }
                };
                out.push(Check::pass(link, detail));
            }
            Err(e) => {
                let err = amqp(format!("declaring {what}"), e);
                if err.to_chain_string().contains("inequivalent arg 'durable'") {
                    out.push(Check::fail(
                        link,
                        format!(
                            "{what} is not durable: the broker deletes it, with every message \
                             in it, when it restarts"
                        ),
                        "delete it once it is empty and let justonce declare it durable \
                         (`--declare missing`); a quorum queue (`--queue-type quorum`) also \
                         survives the loss of a node",
                    ));
                } else {
                    let explained = refused(conn, &part, opts, err).await;
                    out.push(Check::warn(
                        link,
                        explained.to_string(),
                        "align the options with what exists, or use it as it is",
                    ));
                }
            }
        }
    }
    let ch = conn
        .create_channel()
        .await
        .map_err(|e| amqp("opening a channel", e))?;
    out.push(
        match ch.confirm_select(ConfirmSelectOptions::default()).await {
            Ok(()) => {
                let _ = ch.close(200, "justonce: checked".into()).await;
                Check::pass(
                    "publisher confirms",
                    "the broker confirms publishes on this vhost; justonce's publisher sends \
                     every message persistent (delivery_mode 2) and waits for its confirm, \
                     publishing again what was not confirmed (a duplicate the dedup absorbs)",
                )
            }
            Err(e) => Check::fail(
                "publisher confirms",
                format!("confirm mode was refused: {e}"),
                "publishes cannot be made safe on this broker: enable confirms",
            ),
        },
    );
    Ok(out)
}

fn missing(link: &'static str, what: &str) -> Check {
    match link {
        "dead letters" => Check::fail(
            link,
            format!(
                "{what} does not exist: dead letters sent there are dropped, and RabbitMQ's \
                 own dead-lettering (x-dead-letter-exchange) has no publisher confirms, so \
                 nothing would tell you"
            ),
            "let justonce declare what is missing (`--declare missing`), or create it where \
             your topology lives",
        ),
        "retry tiers" => Check::warn(
            link,
            format!("{what} does not exist: a delayed retry has nowhere to wait"),
            "let justonce declare what is missing (`--declare missing`)",
        ),
        _ => Check::fail(
            link,
            format!("{what} does not exist"),
            "start a consumer with `--declare all` or `--declare missing`, or create it where \
             your topology lives",
        ),
    }
}
