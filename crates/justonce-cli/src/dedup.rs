//! `justonce dedup`: what a store's dedup records and claims say, through `InspectStore`
//! and `InspectClaims` (nothing here knows which database it is).

use std::time::{Duration, SystemTime};

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use justonce::consumer::Explanation;
use justonce::{
    ClaimRecord, ClaimRecordState, ConflictPolicy, DedupKey, DedupRecord, Fingerprint,
    InspectClaims, MessageId,
};
use serde_json::{json, Value};

use crate::dlq::utc;

#[derive(Args)]
pub(crate) struct DedupArgs {
    #[command(subcommand)]
    command: DedupCommand,
}

#[derive(Subcommand)]
enum DedupCommand {
    /// Records per consumer, the oldest, and what a retention would keep.
    Stats(StatsArgs),
    /// One key: its record (when, with which payload) and its claim.
    Show(KeyArgs),
    /// Whether a delivery of a payload would be applied, acked as a duplicate, or
    /// dead-lettered as a conflict, and why.
    Explain(ExplainArgs),
    /// Free a claim whose holder will not finish it: its token is raised, so the holder's
    /// completion is refused and the next delivery takes it.
    Release(ReleaseArgs),
    /// Run the retention purge now.
    Purge(PurgeArgs),
}

/// Where the records are.
#[derive(Args)]
struct Store {
    /// The store: sqlite:PATH (the file must exist), postgres://…, mysql://…
    #[arg(
        long,
        value_name = "URL",
        env = "JUSTONCE_STORE_URL",
        hide_env_values = true
    )]
    store: String,
    /// The dedup table.
    #[arg(long, default_value = "jo_dedup")]
    dedup_table: String,
    /// The claim store, when the consumer uses claims: its URL (on SQLite a file of its
    /// own; on a server, by default, the store's database).
    #[arg(
        long,
        value_name = "URL",
        env = "JUSTONCE_CLAIMS_URL",
        hide_env_values = true
    )]
    claims: Option<String>,
    /// The claims table on a server.
    #[arg(long, default_value = "jo_claims")]
    claims_table: String,
    /// One JSON object on stdout.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct StatsArgs {
    #[command(flatten)]
    store: Store,
    /// The consumers' retention in seconds, to say what the purge will delete.
    #[arg(long, value_name = "SECS")]
    retention_secs: Option<u64>,
}

#[derive(Args)]
struct KeyArgs {
    #[command(flatten)]
    store: Store,
    /// The consumer's name.
    consumer: String,
    /// The message id.
    id: String,
}

#[derive(Args)]
struct ExplainArgs {
    #[command(flatten)]
    key: KeyArgs,
    /// The payload a delivery would carry, as a file (`-` for stdin).
    #[arg(long, value_name = "FILE")]
    payload: String,
    /// The consumer's conflict policy (`DedupOptions::on_conflict`): what a payload other
    /// than the recorded one's becomes.
    #[arg(long, value_enum, default_value = "dead-letter")]
    on_conflict: OnConflict,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum OnConflict {
    DeadLetter,
    Ignore,
}

#[derive(Args)]
struct ReleaseArgs {
    #[command(flatten)]
    key: KeyArgs,
}

#[derive(Args)]
struct PurgeArgs {
    #[command(flatten)]
    store: Store,
    /// Delete the records older than this many seconds.
    #[arg(long, value_name = "SECS")]
    retention_secs: u64,
}

pub(crate) async fn run(args: DedupArgs) -> Result<()> {
    match args.command {
        DedupCommand::Stats(a) => stats(a).await,
        DedupCommand::Show(a) => show(a).await,
        DedupCommand::Explain(a) => explain(a).await,
        DedupCommand::Release(a) => release(a).await,
        DedupCommand::Purge(a) => purge(a).await,
    }
}

fn age(t: SystemTime) -> String {
    let secs = SystemTime::now()
        .duration_since(t)
        .unwrap_or_default()
        .as_secs();
    match secs {
        s if s < 120 => format!("{s} s"),
        s if s < 7200 => format!("{} min", s / 60),
        s if s < 172_800 => format!("{} h", s / 3600),
        s => format!("{} d", s / 86_400),
    }
}

async fn stats(a: StatsArgs) -> Result<()> {
    let store = justonce::backend::inspect_store(&a.store.store, &a.store.dedup_table).await?;
    let stats = store.dedup_stats().await?;
    let horizon = a
        .retention_secs
        .map(|s| SystemTime::now() - Duration::from_secs(s));
    if a.store.json {
        let consumers: Vec<Value> = stats
            .iter()
            .map(|s| {
                json!({
                    "consumer": s.consumer,
                    "records": s.records,
                    "oldest": s.oldest.map(utc),
                    "oldest_past_retention": horizon.zip(s.oldest).map(|(h, o)| o < h),
                })
            })
            .collect();
        println!(
            "{}",
            json!({
                "table": a.store.dedup_table,
                "retention_secs": a.retention_secs,
                "purge_horizon": horizon.map(utc),
                "consumers": consumers,
            })
        );
        return Ok(());
    }
    if stats.is_empty() {
        println!("no dedup records in {}", a.store.dedup_table);
        return Ok(());
    }
    println!("{:<24}  {:>10}  oldest", "consumer", "records");
    for s in &stats {
        let oldest = s.oldest.map_or_else(
            || "-".to_owned(),
            |t| format!("{} ({} ago)", utc(t), age(t)),
        );
        println!("{:<24}  {:>10}  {oldest}", s.consumer, s.records);
    }
    match horizon {
        Some(h) => println!(
            "\nwith a retention of {} s, the purge deletes records from before {}",
            a.retention_secs.unwrap_or_default(),
            utc(h)
        ),
        None => println!(
            "\n--retention-secs N says what the purge deletes; it must exceed the redelivery horizon"
        ),
    }
    Ok(())
}

/// The message id of one key, its record and its claim.
async fn lookup(k: &KeyArgs) -> Result<(MessageId, Option<DedupRecord>, Option<ClaimRecord>)> {
    let id = MessageId::new(k.id.clone()).context("the message id")?;
    let key = DedupKey {
        consumer: &k.consumer,
        message_id: &id,
    };
    let store = justonce::backend::inspect_store(&k.store.store, &k.store.dedup_table).await?;
    let record = store.dedup_record(key).await?;
    let claim = match claims(&k.store).await? {
        Some(c) => c.claim_record(key).await?,
        None => None,
    };
    Ok((id, record, claim))
}

async fn claims(s: &Store) -> Result<Option<std::sync::Arc<dyn InspectClaims>>> {
    let Some(url) = &s.claims else {
        return Ok(None);
    };
    Ok(Some(
        justonce::backend::inspect_claims(url, &s.claims_table).await?,
    ))
}

fn claim_json(c: &ClaimRecord) -> Value {
    let (state, lease_left_ms, completed_at) = match &c.state {
        ClaimRecordState::InProgress { lease_left } => {
            ("in_progress", Some(lease_left.as_millis() as u64), None)
        }
        ClaimRecordState::Released => ("released", None, None),
        ClaimRecordState::Completed { at } => ("completed", None, at.map(utc)),
    };
    json!({
        "state": state,
        "fence": c.token,
        "lease_left_ms": lease_left_ms,
        "completed_at": completed_at,
        "fingerprint": c.fingerprint.to_hex(),
        "result": c.result.as_ref().map(|r| String::from_utf8_lossy(r).into_owned()),
    })
}

fn claim_text(c: &ClaimRecord) -> String {
    let state = match &c.state {
        ClaimRecordState::InProgress { lease_left } if lease_left.is_zero() => {
            "in progress, lease run out (the next delivery takes it over)".to_owned()
        }
        ClaimRecordState::InProgress { lease_left } => {
            format!(
                "in progress, {:.1} s left on the lease",
                lease_left.as_secs_f64()
            )
        }
        ClaimRecordState::Released => "released (the next delivery takes it)".to_owned(),
        ClaimRecordState::Completed { at } => format!(
            "completed {}",
            at.map_or_else(String::new, |t| format!("at {}", utc(t)))
        ),
    };
    let result = c.result.as_ref().map_or_else(
        || "none".to_owned(),
        |r| String::from_utf8_lossy(r).into_owned(),
    );
    format!("{state}; fence {}; result {result}", c.token)
}

async fn show(a: KeyArgs) -> Result<()> {
    let (_, record, claim) = lookup(&a).await?;
    if a.store.json {
        println!(
            "{}",
            json!({
                "consumer": a.consumer,
                "id": a.id,
                "recorded": record.is_some(),
                "recorded_at": record.as_ref().and_then(|r| r.recorded_at).map(utc),
                "fingerprint": record.as_ref().map(|r| r.fingerprint.to_hex()),
                "claim": claim.as_ref().map(claim_json),
            })
        );
        return Ok(());
    }
    match &record {
        Some(r) => println!(
            "{} of {}: applied{}, payload fingerprint {}",
            a.id,
            a.consumer,
            r.recorded_at
                .map_or_else(String::new, |t| format!(" at {}", utc(t))),
            r.fingerprint.to_hex()
        ),
        None => println!("{} of {}: no dedup record", a.id, a.consumer),
    }
    if let Some(c) = &claim {
        println!("claim: {}", claim_text(c));
    } else if a.store.claims.is_some() {
        println!("claim: none");
    }
    Ok(())
}

async fn explain(a: ExplainArgs) -> Result<()> {
    let payload = if a.payload == "-" {
        let mut buf = Vec::new();
        std::io::Read::read_to_end(&mut std::io::stdin(), &mut buf)?;
        buf
    } else {
        std::fs::read(&a.payload).with_context(|| format!("reading {}", a.payload))?
    };
    let fp = Fingerprint::of(&payload);
    let (id, record, claim) = lookup(&a.key).await?;
    let policy = match a.on_conflict {
        OnConflict::DeadLetter => ConflictPolicy::DeadLetter,
        OnConflict::Ignore => ConflictPolicy::Ignore,
    };
    // The runtime's own rules (`justonce::consumer::explain`), not a copy of them.
    let Explanation { outcome, why } =
        justonce::consumer::explain(&id, record.as_ref(), claim.as_ref(), fp, policy);
    if a.key.store.json {
        println!(
            "{}",
            json!({ "consumer": a.key.consumer, "id": a.key.id, "outcome": outcome.as_str(), "why": why, "fingerprint": fp.to_hex() })
        );
    } else {
        println!("{outcome}: {why}");
    }
    Ok(())
}

async fn release(a: ReleaseArgs) -> Result<()> {
    let k = &a.key;
    let Some(claims) = claims(&k.store).await? else {
        bail!("--claims URL: the claim store whose claim to free");
    };
    let id = MessageId::new(k.id.clone()).context("the message id")?;
    let key = DedupKey {
        consumer: &k.consumer,
        message_id: &id,
    };
    let freed = claims.force_release(key).await?;
    if k.store.json {
        println!(
            "{}",
            json!({ "consumer": k.consumer, "id": k.id, "released": freed.is_some(), "fence": freed })
        );
        return Ok(());
    }
    match freed {
        Some(token) => println!(
            "released {} of {}: fence now {token}; the holder's completion will be refused, and the next delivery takes it",
            k.id, k.consumer
        ),
        None => bail!("{} of {} holds no claim in progress: nothing to release", k.id, k.consumer),
    }
    Ok(())
}

async fn purge(a: PurgeArgs) -> Result<()> {
    let store = justonce::backend::inspect_store(&a.store.store, &a.store.dedup_table).await?;
    let retention = Duration::from_secs(a.retention_secs);
    let mut deleted = 0;
    loop {
        let n = store.purge_records(retention, 10_000).await?;
        deleted += n;
        if n == 0 {
            break;
        }
    }
    if a.store.json {
        println!(
            "{}",
            json!({ "table": a.store.dedup_table, "deleted": deleted })
        );
    } else {
        println!(
            "deleted {deleted} records older than {} s from {}",
            a.retention_secs, a.store.dedup_table
        );
    }
    Ok(())
}
