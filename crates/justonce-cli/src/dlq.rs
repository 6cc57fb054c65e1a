//! `justonce dlq`: read the dead letters of any transport, grouped by failure, and replay
//! or purge them, through `Inspect` (nothing here knows which transport it is).
//!
//! A replay keeps each message's id unless `--new-id`: a message that was in fact applied
//! before is then acked as a duplicate by the consumer's dedup, never applied twice.

use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use justonce::backend::{Transport, TransportOptions};
use justonce::{DeadLetterEntry, Inspect, Replay};
use serde_json::json;

#[derive(Args)]
pub(crate) struct DlqArgs {
    #[command(subcommand)]
    command: DlqCommand,
}

#[derive(Subcommand)]
enum DlqCommand {
    /// The dead letters grouped by failure (the reason with ids and numbers taken out).
    List(ListArgs),
    /// One dead letter: id, headers, reason, attempts, consumer, times, payload.
    Show(ShowArgs),
    /// Publish dead letters back to their queue (or --to another), keeping their ids.
    Replay(ReplayArgs),
    /// Delete dead letters.
    Purge(PurgeArgs),
}

/// Where the dead letters are.
#[derive(Args)]
struct Target {
    /// The transport: sqlite:PATH, postgres://…, amqp://…
    #[arg(
        long,
        value_name = "URL",
        env = "JUSTONCE_TRANSPORT_URL",
        hide_env_values = true
    )]
    transport: String,
    /// The queue whose dead letters these are. It must exist: nothing is created.
    #[arg(long, default_value = "orders")]
    queue: String,
}

#[derive(Args)]
struct ListArgs {
    #[command(flatten)]
    target: Target,
    /// One JSON object on stdout instead of the table.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct ShowArgs {
    #[command(flatten)]
    target: Target,
    /// The message id (or, for a message without one, `--key`).
    id: Option<String>,
    /// The dead letter's key, as `list --json` shows it.
    #[arg(long, conflicts_with = "id")]
    key: Option<String>,
    /// The payload's bytes as they are, on stdout, and nothing else.
    #[arg(long)]
    raw: bool,
    /// One JSON object on stdout.
    #[arg(long, conflicts_with = "raw")]
    json: bool,
}

/// Which dead letters: exactly one of the three.
#[derive(Args)]
#[group(required = true, multiple = false)]
struct Choice {
    /// Every dead letter of this failure group (its id, from `list`).
    #[arg(long)]
    group: Option<String>,
    /// The dead letters with this message id; repeatable.
    #[arg(long = "id")]
    ids: Vec<String>,
    /// Every dead letter of the queue.
    #[arg(long)]
    all: bool,
}

#[derive(Args)]
struct ReplayArgs {
    #[command(flatten)]
    target: Target,
    #[command(flatten)]
    choice: Choice,
    /// Another queue of the same transport to publish to (it must exist).
    #[arg(long, value_name = "QUEUE")]
    to: Option<String>,
    /// Give each message a new id, derived from the old one: it will be applied even if
    /// it was applied before.
    #[arg(long)]
    new_id: bool,
    /// Say what would be replayed, and move nothing.
    #[arg(long)]
    dry_run: bool,
    /// One JSON object on stdout.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct PurgeArgs {
    #[command(flatten)]
    target: Target,
    #[command(flatten)]
    choice: Choice,
    /// Do not ask.
    #[arg(long)]
    yes: bool,
    /// One JSON object on stdout.
    #[arg(long)]
    json: bool,
}

pub(crate) async fn run(args: DlqArgs) -> Result<()> {
    match args.command {
        DlqCommand::List(a) => list(a).await,
        DlqCommand::Show(a) => show(a).await,
        DlqCommand::Replay(a) => replay(a).await,
        DlqCommand::Purge(a) => purge(a).await,
    }
}

/// The queue's transport, opened to publish and count, creating nothing.
async fn open(t: &Target) -> Result<Arc<dyn Inspect>> {
    let opts = TransportOptions::default().create(false);
    let transport = Transport::open_publisher(&t.transport, &t.queue, &opts)
        .await
        .with_context(|| format!("opening the queue {}", t.queue))?;
    Ok(transport.inspect())
}

/// A failure group as `list` shows it.
struct Group<'a> {
    pattern: String,
    letters: Vec<&'a DeadLetterEntry>,
}

/// The failure groups, the largest first.
fn groups(entries: &[DeadLetterEntry]) -> Vec<(String, Group<'_>)> {
    let mut by_id: BTreeMap<String, Group<'_>> = BTreeMap::new();
    for e in entries {
        let g = e.group();
        by_id
            .entry(g.id)
            .or_insert_with(|| Group {
                pattern: g.pattern,
                letters: Vec::new(),
            })
            .letters
            .push(e);
    }
    let mut out: Vec<_> = by_id.into_iter().collect();
    out.sort_by_key(|(_, g)| std::cmp::Reverse(g.letters.len()));
    out
}

async fn list(a: ListArgs) -> Result<()> {
    let entries = open(&a.target).await?.dead_letter_entries().await?;
    let groups = groups(&entries);
    if a.json {
        let groups: Vec<_> = groups
            .iter()
            .map(|(id, g)| {
                let times: Vec<SystemTime> =
                    g.letters.iter().filter_map(|e| e.dead_lettered_at).collect();
                json!({
                    "group": id,
                    "reason": g.pattern,
                    "count": g.letters.len(),
                    "first": times.iter().min().map(|t| utc(*t)),
                    "last": times.iter().max().map(|t| utc(*t)),
                    "consumers": distinct(g.letters.iter().map(|e| e.letter.reason.consumer.as_str())),
                    "source_queues": distinct(g.letters.iter().map(|e| e.letter.reason.source_queue.as_str())),
                    "keys": g.letters.iter().map(|e| e.key.as_str()).collect::<Vec<_>>(),
                    "ids": g.letters.iter().map(|e| e.letter.message.id().map(|i| i.as_str())).collect::<Vec<_>>(),
                })
            })
            .collect();
        println!(
            "{}",
            json!({ "queue": a.target.queue, "dead_letters": entries.len(), "groups": groups })
        );
        return Ok(());
    }
    if entries.is_empty() {
        println!("no dead letters in {}", a.target.queue);
        return Ok(());
    }
    println!(
        "{} dead letters in {}, {} failure groups\n",
        entries.len(),
        a.target.queue,
        groups.len()
    );
    println!(
        "{:<8}  {:>6}  {:<20}  {:<20}  {:<16}  reason",
        "group", "count", "first", "last", "consumer"
    );
    for (id, g) in &groups {
        let times: Vec<SystemTime> = g
            .letters
            .iter()
            .filter_map(|e| e.dead_lettered_at)
            .collect();
        let at = |t: Option<&SystemTime>| t.map_or_else(|| "-".to_owned(), |t| utc(*t));
        println!(
            "{id:<8}  {:>6}  {:<20}  {:<20}  {:<16}  {}",
            g.letters.len(),
            at(times.iter().min()),
            at(times.iter().max()),
            distinct(g.letters.iter().map(|e| e.letter.reason.consumer.as_str())).join(","),
            g.pattern
        );
    }
    println!("\nshow one: justonce dlq show ID; replay a group: justonce dlq replay --group GROUP --dry-run");
    Ok(())
}

fn distinct<'a>(items: impl Iterator<Item = &'a str>) -> Vec<&'a str> {
    let mut v: Vec<&str> = items.filter(|s| !s.is_empty()).collect();
    v.sort_unstable();
    v.dedup();
    v
}

async fn show(a: ShowArgs) -> Result<()> {
    let entries = open(&a.target).await?.dead_letter_entries().await?;
    let found: Vec<&DeadLetterEntry> = match (&a.id, &a.key) {
        (Some(id), _) => entries
            .iter()
            .filter(|e| e.letter.message.id().is_some_and(|i| i.as_str() == id))
            .collect(),
        (None, Some(key)) => entries.iter().filter(|e| e.key == *key).collect(),
        (None, None) => bail!("say which dead letter: its message id, or --key KEY"),
    };
    let Some(e) = found.first() else {
        bail!(
            "no dead letter {} in {} ({} dead letters there; `justonce dlq list` shows them)",
            a.id.as_deref().or(a.key.as_deref()).unwrap_or_default(),
            a.target.queue,
            entries.len()
        );
    };
    let m = &e.letter.message;
    if a.raw {
        std::io::stdout().write_all(m.payload())?;
        return Ok(());
    }
    let payload = String::from_utf8_lossy(m.payload());
    let shown: String = payload.chars().take(1000).collect();
    let truncated = shown.len() < payload.len();
    if a.json {
        println!(
            "{}",
            json!({
                "key": e.key,
                "id": m.id().map(|i| i.as_str()),
                "group": e.group().id,
                "reason": e.letter.reason.error,
                "attempts": e.letter.reason.attempts,
                "consumer": e.letter.reason.consumer,
                "source_queue": e.letter.reason.source_queue,
                "dead_lettered_at": e.dead_lettered_at.map(utc),
                "replays": e.letter.replays(),
                "last_replayed_at": e.letter.replayed_at().map(utc),
                "headers": m.headers(),
                "content_type": m.content_type(),
                "payload": shown,
                "payload_truncated": truncated,
                "payload_bytes": m.payload().len(),
                "same_id_dead_letters": found.len(),
            })
        );
        return Ok(());
    }
    let r = &e.letter.reason;
    println!("id            {}", m.id().map_or("(none)", |i| i.as_str()));
    println!("key           {}", e.key);
    println!("reason        {}", r.error);
    println!("group         {} ({})", e.group().id, e.group().pattern);
    println!("attempts      {}", r.attempts);
    println!("consumer      {}", r.consumer);
    println!("source queue  {}", r.source_queue);
    if let Some(t) = e.dead_lettered_at {
        println!("dead at       {}", utc(t));
    }
    if e.letter.replays() > 0 {
        let last = e.letter.replayed_at().map_or_else(|| "?".to_owned(), utc);
        println!("replayed      {} times, last {last}", e.letter.replays());
    }
    if let Some(ct) = m.content_type() {
        println!("content type  {ct}");
    }
    println!("headers");
    for (k, v) in m.headers() {
        println!("  {k}: {v}");
    }
    println!(
        "payload ({} bytes{})",
        m.payload().len(),
        if truncated {
            ", truncated; --raw for all"
        } else {
            ""
        }
    );
    println!("{shown}");
    if found.len() > 1 {
        println!(
            "\n({} dead letters have this id; this is the oldest)",
            found.len()
        );
    }
    Ok(())
}

/// The entries `choice` picks, each once, oldest first; an id or a group that matches
/// nothing is an error.
fn chosen<'a>(entries: &'a [DeadLetterEntry], choice: &Choice) -> Result<Vec<&'a DeadLetterEntry>> {
    if choice.all {
        return Ok(entries.iter().collect());
    }
    if let Some(g) = &choice.group {
        let picked: Vec<_> = entries.iter().filter(|e| e.group().id == *g).collect();
        if picked.is_empty() {
            bail!("no dead letters in failure group {g} (`justonce dlq list` shows the groups)");
        }
        return Ok(picked);
    }
    let mut picked = Vec::new();
    for id in &choice.ids {
        let of_id: Vec<_> = entries
            .iter()
            .filter(|e| e.letter.message.id().is_some_and(|i| i.as_str() == id))
            .collect();
        if of_id.is_empty() {
            bail!("no dead letter with id {id}");
        }
        picked.extend(of_id);
    }
    picked.sort_by_key(|e| entries.iter().position(|x| std::ptr::eq(x, *e)));
    picked.dedup_by(|a, b| std::ptr::eq(*a, *b));
    Ok(picked)
}

async fn replay(a: ReplayArgs) -> Result<()> {
    let inspect = open(&a.target).await?;
    let entries = inspect.dead_letter_entries().await?;
    let picked = chosen(&entries, &a.choice)?;
    let mut r = Replay::new().new_id(a.new_id);
    if let Some(to) = &a.to {
        r = r.to(to.clone());
    }
    let target = a.to.as_deref().unwrap_or(&a.target.queue);
    if a.new_id {
        eprintln!(
            "warning: --new-id: each message gets a new id, so a message that was applied \
             before will be applied again"
        );
    }
    let keys: Vec<String> = picked.iter().map(|e| e.key.clone()).collect();
    let ids: Vec<Option<String>> = picked
        .iter()
        .map(|e| {
            e.letter
                .replay_message(&r)
                .id()
                .map(|i| i.as_str().to_owned())
        })
        .collect();
    let moved = if a.dry_run {
        0
    } else {
        inspect.replay_dead_letters(&keys, &r).await?
    };
    if a.json {
        println!(
            "{}",
            json!({
                "queue": a.target.queue,
                "to": target,
                "dry_run": a.dry_run,
                "chosen": keys.len(),
                "replayed": moved,
                "new_ids": a.new_id,
                "ids": ids,
            })
        );
    } else if a.dry_run {
        println!(
            "would replay {} dead letters of {} into {target}:",
            keys.len(),
            a.target.queue
        );
        for (e, id) in picked.iter().zip(&ids) {
            println!(
                "  {}  {}",
                id.as_deref().unwrap_or("(no id)"),
                e.letter.reason.error
            );
        }
        println!("nothing moved (--dry-run)");
    } else {
        println!(
            "replayed {moved} dead letters of {} into {target}",
            a.target.queue
        );
    }
    Ok(())
}

async fn purge(a: PurgeArgs) -> Result<()> {
    let inspect = open(&a.target).await?;
    let entries = inspect.dead_letter_entries().await?;
    let picked = chosen(&entries, &a.choice)?;
    if !a.yes {
        if !std::io::stdin().is_terminal() {
            bail!(
                "purging {} dead letters needs --yes when no one is at a terminal to say so",
                picked.len()
            );
        }
        eprint!(
            "delete {} dead letters of {} for good? [y/N] ",
            picked.len(),
            a.target.queue
        );
        let mut answer = String::new();
        std::io::stdin().read_line(&mut answer)?;
        if !matches!(answer.trim(), "y" | "Y" | "yes") {
            println!("nothing deleted");
            return Ok(());
        }
    }
    let keys: Vec<String> = picked.iter().map(|e| e.key.clone()).collect();
    let purged = inspect.purge_dead_letters(&keys).await?;
    if a.json {
        println!("{}", json!({ "queue": a.target.queue, "purged": purged }));
    } else {
        println!("deleted {purged} dead letters of {}", a.target.queue);
    }
    Ok(())
}

/// `t` as `YYYY-MM-DDTHH:MM:SSZ`.
pub(crate) fn utc(t: SystemTime) -> String {
    let secs = t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs()) as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_utc() {
        assert_eq!(utc(UNIX_EPOCH), "1970-01-01T00:00:00Z");
        let t = UNIX_EPOCH + std::time::Duration::from_secs(1_795_966_682);
        assert_eq!(utc(t), "2026-11-29T15:38:02Z");
    }
}
