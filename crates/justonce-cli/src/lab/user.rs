//! `justonce lab --worker CMD`: the lab on the user's own consumer. The workers are the
//! user's program, started K times with the transport and store URLs in their environment
//! (through the lab's fault proxies); the lab publishes orders in the user's format, some
//! of them twice with the same id (a producer's re-send), kills, pauses and cuts the
//! workers as it does its own, and judges the effects with the user's query: every order
//! must have exactly one effect.
//!
//! The protocol, for a program to be run this way:
//! - `JUSTONCE_TRANSPORT_URL` and `JUSTONCE_STORE_URL` are where to consume and where to
//!   write; `JUSTONCE_WORKER` is the worker's slot (0, 1, …). The command runs under
//!   `sh -c`, so `AMQP_URL=$JUSTONCE_TRANSPORT_URL my-consumer` maps them to the program's
//!   own names.
//! - The command is a process group of its own: a kill or a pause reaches every process
//!   it started. SIGTERM asks it to stop; 15 s later it gets SIGKILL.
//! - The orders arrive on `--queue` (RabbitMQ: on `--exchange` with the first
//!   `--routing-key`), each with its message id set to the order's id.
//! - `--effects-sql` returns one row per effect or per order: `(id, count)`, the order's
//!   id and how many times its effect was applied. Orders of other runs are ignored.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use justonce::backend::{StoreKind, TransportKind};
use justonce::Message;
use serde::Serialize;
use tokio::process::Command;

use super::faults::{proxied, LabTransport, Proxies, Restarts, SchemaFault};
use super::supervisor::{tails, Worker};
use super::{FaultClass, FaultCounts, LabArgs};
use crate::bus::Bus;
use crate::publish::retry;

/// The payload when no `--publish-template` is given: the `rabbitmq-postgres` example's.
pub(crate) const DEFAULT_TEMPLATE: &str =
    r#"{"order_id":"{{id}}","account":{{account}},"amount_cents":{{amount}}}"#;
/// Why a Redis store cannot be judged.
const NEEDS_SQL: &str = "--effects-sql needs a SQL store (sqlite:, postgres://, mysql://)";
/// Share of the orders published a second time with the same id.
const RESEND_SHARE: f64 = 0.05;
/// How long the effects must stay the same, with every order applied, before the lab stops.
const QUIET: Duration = Duration::from_secs(5);
/// How long the effects may stay the same, with orders missing, before the lab gives up.
const STALL: Duration = Duration::from_secs(120);

/// What `--worker` runs against, from the lab's arguments.
pub(crate) struct UserLab<'a> {
    args: &'a LabArgs,
    command: &'a str,
    transport: String,
    store: String,
    t_kind: TransportKind,
    s_kind: StoreKind,
    queue: &'a str,
    effects_sql: &'a str,
    template: String,
    faults: Vec<FaultClass>,
}

/// What one run on the user's consumer found, as `--json` prints it.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct WorkerReport {
    pub(crate) scenario: &'static str,
    pub(crate) command: String,
    pub(crate) transport: String,
    pub(crate) store: String,
    pub(crate) seed: u64,
    pub(crate) messages: u64,
    pub(crate) workers: usize,
    pub(crate) faults: FaultCounts,
    /// Effects of this run's orders, as the user's query counted them.
    pub(crate) effects: u64,
    pub(crate) lost: u64,
    pub(crate) duplicate_effects: u64,
    /// Workers that exited without being killed (and were started again).
    pub(crate) worker_exits: u64,
    pub(crate) seconds: f64,
    pub(crate) verdict: &'static str,
    pub(crate) why: String,
}

/// One order of the run.
#[derive(Debug, Clone)]
struct Order {
    id: String,
    payload: String,
    twice: bool,
}

/// The payload of order `n` with id `id`: `{{id}}`, `{{n}}`, `{{account}}` (1 to 100) and
/// `{{amount}}` (1 to 9) replaced.
fn render(template: &str, id: &str, n: u64) -> String {
    template
        .replace("{{id}}", id)
        .replace("{{n}}", &n.to_string())
        .replace("{{account}}", &(n % 100 + 1).to_string())
        .replace("{{amount}}", &(n % 9 + 1).to_string())
}

/// Lost orders (no effect) and duplicate effects (beyond each order's first) among `ids`,
/// from the counts the user's query returned.
fn judge<'a>(ids: impl IntoIterator<Item = &'a str>, counts: &HashMap<String, u64>) -> (u64, u64) {
    let (mut lost, mut dup) = (0, 0);
    for id in ids {
        match counts.get(id).copied().unwrap_or(0) {
            0 => lost += 1,
            n => dup += n - 1,
        }
    }
    (lost, dup)
}

/// A connection to the store, for the user's query.
enum Effects {
    Pg(sqlx::PgPool),
    My(sqlx::MySqlPool),
    Lite(sqlx::SqlitePool),
}

impl Effects {
    async fn connect(url: &str, kind: StoreKind) -> anyhow::Result<Self> {
        use sqlx::pool::PoolOptions;
        use std::str::FromStr as _;
        Ok(match kind {
            StoreKind::Postgres => {
                Effects::Pg(PoolOptions::new().max_connections(1).connect(url).await?)
            }
            StoreKind::MySql => Effects::My(
                PoolOptions::new()
                    .max_connections(1)
                    .connect(&url.replacen("mariadb://", "mysql://", 1))
                    .await?,
            ),
            // The store may not exist yet: the workers create their tables when they start.
            StoreKind::Sqlite => Effects::Lite(
                PoolOptions::new()
                    .max_connections(1)
                    .connect_with(
                        sqlx::sqlite::SqliteConnectOptions::from_str(url)?.create_if_missing(true),
                    )
                    .await?,
            ),
            StoreKind::Redis => bail!(NEEDS_SQL),
        })
    }

    /// The user's query, as `id -> count` (a row per effect adds up).
    async fn counts(&self, sql: &str, prefix: &str) -> anyhow::Result<HashMap<String, u64>> {
        fn row<R: sqlx::Row>(r: &R) -> anyhow::Result<(String, i64)>
        where
            for<'a> String: sqlx::Decode<'a, R::Database> + sqlx::Type<R::Database>,
            for<'a> i64: sqlx::Decode<'a, R::Database> + sqlx::Type<R::Database>,
            for<'a> i32: sqlx::Decode<'a, R::Database> + sqlx::Type<R::Database>,
            usize: sqlx::ColumnIndex<R>,
        {
            if r.len() != 2 {
                bail!(
                    "--effects-sql must return two columns, (id, count); it returned {}",
                    r.len()
                );
            }
            let id = r
                .try_get::<String, _>(0usize)
                .or_else(|_| r.try_get::<i64, _>(0usize).map(|n| n.to_string()))
                .context("the first column of --effects-sql is not a text or integer id")?;
            let n = r
                .try_get::<i64, _>(1usize)
                .or_else(|_| r.try_get::<i32, _>(1usize).map(i64::from))
                .context("the second column of --effects-sql is not an integer count")?;
            Ok((id, n))
        }
        // One query, three pool types: the same lines for each.
        macro_rules! fetch {
            ($pool:expr) => {
                sqlx::query(sql)
                    .fetch_all($pool)
                    .await?
                    .iter()
                    .map(row)
                    .collect::<anyhow::Result<Vec<_>>>()?
            };
        }
        let rows = match self {
            Effects::Pg(p) => fetch!(p),
            Effects::My(p) => fetch!(p),
            Effects::Lite(p) => fetch!(p),
        };
        let mut out = HashMap::new();
        for (id, n) in rows {
            if id.starts_with(prefix) {
                *out.entry(id).or_insert(0) += n.max(0) as u64;
            }
        }
        Ok(out)
    }
}

impl<'a> UserLab<'a> {
    /// Checks the arguments of a `--worker` run.
    pub(crate) fn new(args: &'a LabArgs, command: &'a str) -> anyhow::Result<Self> {
        let (Some(transport), Some(store)) = (&args.transport, &args.store) else {
            bail!("--worker needs --transport and --store: the URLs your consumer is given");
        };
        let queue = args
            .queue
            .as_deref()
            .context("--worker needs --queue: where the lab publishes the orders")?;
        let effects_sql = args.effects_sql.as_deref().context(
            "--worker needs --effects-sql: a query returning (order id, count of its effects)",
        )?;
        let t_kind = TransportKind::from_url(transport)?;
        let s_kind = StoreKind::from_url(store)?;
        if s_kind == StoreKind::Redis {
            bail!(NEEDS_SQL);
        }
        let template = match &args.publish_template {
            Some(path) => std::fs::read_to_string(path)
                .with_context(|| format!("cannot read --publish-template {}", path.display()))?,
            None => DEFAULT_TEMPLATE.to_owned(),
        };
        let networked = t_kind != TransportKind::Sqlite || s_kind != StoreKind::Sqlite;
        let faults = if args.faults.is_empty() {
            [FaultClass::Kill, FaultClass::Pause, FaultClass::Cut]
                .into_iter()
                .filter(|f| *f != FaultClass::Cut || networked)
                .collect()
        } else {
            args.faults.clone()
        };
        for f in &faults {
            if matches!(f, FaultClass::Schema | FaultClass::Relay) {
                bail!(
                    "the {} fault needs the lab's own pipeline; with --worker: kill, pause, cut, delay, blackhole, broker-restart, db-restart, failover",
                    f.as_str()
                );
            }
            f.must_apply(t_kind, s_kind)?;
        }
        Ok(UserLab {
            args,
            command,
            transport: transport.clone(),
            store: store.clone(),
            t_kind,
            s_kind,
            queue,
            effects_sql,
            template,
            faults,
        })
    }

    pub(crate) async fn run(&self, progress: bool) -> anyhow::Result<WorkerReport> {
        let args = self.args;
        let LabTransport {
            own: mut own_broker,
            url: transport,
            proxy: t_proxy,
            workers_url: worker_transport,
        } = LabTransport::start(&self.faults, self.t_kind, self.queue, || {
            self.transport.clone()
        })
        .await?;
        let restarts = Restarts::resolve(
            &self.faults,
            (self.t_kind, &transport),
            (self.s_kind, &self.store),
            own_broker.is_some(),
        )
        .await?;
        let effects = Effects::connect(&self.store, self.s_kind)
            .await
            .context("the lab cannot reach the store for --effects-sql")?;
        let run_id = format!("{:08x}", fastrand::u32(..));
        let prefix = format!("lab-{run_id}-");

        let mut rng = fastrand::Rng::with_seed(args.seed);
        let orders: Vec<Order> = (0..args.messages)
            .map(|n| {
                let id = format!("{prefix}{n:07}");
                Order {
                    payload: render(&self.template, &id, n),
                    id,
                    twice: rng.f64() < RESEND_SHARE,
                }
            })
            .collect();
        let resends = orders.iter().filter(|o| o.twice).count() as u64;

        let (s_proxy, worker_store) =
            proxied(&self.store, self.s_kind != StoreKind::Sqlite).await?;
        let proxies = Proxies {
            transport: t_proxy,
            store: s_proxy,
        };
        let spawn = |slot: usize, generation: u64| -> anyhow::Result<Worker> {
            let mut cmd = Command::new("sh");
            // Its stdout (where many loggers write) joins its stderr, which the lab keeps
            // the tail of, and writes whole with JUSTONCE_LAB_LOGS=DIR.
            cmd.arg("-c")
                .arg(format!("exec 1>&2\n{}", self.command))
                .env("JUSTONCE_TRANSPORT_URL", &worker_transport)
                .env("JUSTONCE_STORE_URL", &worker_store)
                .env("JUSTONCE_WORKER", slot.to_string());
            Worker::start_group(cmd, "user worker", slot, generation)
        };
        // Dropped on any way out, each still-running group is killed with its worker.
        let mut workers = (0..args.workers)
            .map(|slot| spawn(slot, 0))
            .collect::<anyhow::Result<Vec<_>>>()?;

        // The publisher: paced, so that the faults land while orders flow. It connects
        // straight to the broker (the proxies are the workers'), and waits for the queue the
        // workers declare.
        let publisher = {
            let (transport, queue, topology) = (
                transport.clone(),
                self.queue.to_owned(),
                args.topology.clone(),
            );
            let orders = orders.clone();
            let per_tick = (args.rate / 10).max(1) as usize;
            tokio::spawn(async move {
                let sink = retry(Duration::from_secs(60), "connect", || {
                    Bus::open_publisher(&transport, &queue, &topology)
                })
                .await?;
                let mut tick = tokio::time::interval(Duration::from_millis(100));
                for chunk in orders.chunks(per_tick) {
                    tick.tick().await;
                    let first: Vec<Message> =
                        chunk.iter().map(message).collect::<anyhow::Result<_>>()?;
                    let again: Vec<Message> = chunk
                        .iter()
                        .filter(|o| o.twice)
                        .map(message)
                        .collect::<anyhow::Result<_>>()?;
                    retry(Duration::from_secs(120), "publish", || {
                        sink.publish(&first, &again)
                    })
                    .await?;
                }
                anyhow::Ok(())
            })
        };

        let bar = super::progress_bar(progress, args.messages, "lab --worker".into());

        let started = Instant::now();
        let every = Duration::from_millis(args.fault_every_ms);
        let mut counts = FaultCounts {
            duplicate_publishes: resends,
            ..FaultCounts::default()
        };
        let busy = Arc::new(AtomicUsize::new(0));
        let schema = SchemaFault {
            url: self.store.clone(),
            table: String::new(),
        };
        let mut next_fault = 0usize;
        let mut last_fault = Instant::now();
        let mut worker_exits = 0u64;
        let mut generation = 0u64;
        let mut published: Option<anyhow::Result<()>> = None;
        let mut last_seen = (u64::MAX, Instant::now());
        let mut publisher = Some(publisher);
        let mut failing_since: Option<Instant> = None;
        loop {
            for (slot, w) in workers.iter_mut().enumerate() {
                if let Ok(Some(status)) = w.child.try_wait() {
                    // A kill of the lab's was counted where it was done.
                    if !w.killed {
                        worker_exits += 1;
                    }
                    if worker_exits > 3 * args.workers as u64 + 10 {
                        bail!(
                            "the worker command keeps exiting ({status}); it said:\n{}",
                            w.tail()
                        );
                    }
                    generation += 1;
                    *w = spawn(slot, generation)?;
                }
            }
            if let Some(p) = publisher.take_if(|p| p.is_finished()) {
                let r = p.await.context("the lab's publisher")?;
                if let Err(e) = &r {
                    eprintln!("lab: the lab's publisher gave up: {e:#}");
                }
                published = Some(r);
            }
            let done_publishing = published.is_some();
            let faults_left = !done_publishing || counts.kills < u64::from(args.kills);
            if faults_left && last_fault.elapsed() >= every {
                let class = self.faults[next_fault % self.faults.len()];
                next_fault += 1;
                // A killed worker is started again above, at the next turn of the loop.
                class
                    .fire(
                        &mut workers,
                        &proxies,
                        &schema,
                        &busy,
                        args.lease(),
                        own_broker.as_mut(),
                        &restarts,
                        &mut rng,
                        &mut counts,
                    )
                    .await;
                last_fault = Instant::now();
            }

            let now = match effects.counts(self.effects_sql, &prefix).await {
                Ok(now) => {
                    failing_since = None;
                    now
                }
                // The database may be restarting, or cut off by a fault of the lab's own.
                Err(e) => {
                    let since = *failing_since.get_or_insert_with(Instant::now);
                    if since.elapsed() > STALL / 2 {
                        return Err(e.context(format!(
                            "--effects-sql has failed for {} s",
                            (STALL / 2).as_secs()
                        )));
                    }
                    tokio::time::sleep(Duration::from_millis(250)).await;
                    continue;
                }
            };
            let total: u64 = now.values().sum();
            bar.set_position(now.len() as u64);
            bar.set_message(counts.progress());
            if total != last_seen.0 {
                last_seen = (total, Instant::now());
            }
            let settled = done_publishing && !faults_left && busy.load(Ordering::SeqCst) == 0;
            let all = now.len() as u64 >= args.messages;
            if settled && all && last_seen.1.elapsed() >= QUIET {
                break;
            }
            if settled && last_seen.1.elapsed() >= STALL {
                eprintln!(
                    "lab: no effect for {} s with orders missing; the workers said:\n{}",
                    STALL.as_secs(),
                    tails(&workers).join("\n")
                );
                break;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        bar.finish_and_clear();
        for w in &mut workers {
            w.terminate().await;
        }

        let counted = effects.counts(self.effects_sql, &prefix).await?;
        let (lost, duplicate_effects) = judge(orders.iter().map(|o| o.id.as_str()), &counted);
        let mut why = Vec::new();
        if let Some(Err(e)) = &published {
            why.push(format!("the lab could not publish every order: {e:#}"));
        }
        if lost > 0 {
            why.push(format!("{lost} orders have no effect"));
        }
        if duplicate_effects > 0 {
            why.push(format!("{duplicate_effects} duplicate effects"));
        }
        if counts.kills == 0 && self.faults.contains(&FaultClass::Kill) {
            why.push("no worker was killed: the run proves nothing about crashes".into());
        }
        Ok(WorkerReport {
            scenario: "worker",
            command: self.command.to_owned(),
            transport: self.t_kind.as_str().into(),
            store: self.s_kind.as_str().into(),
            seed: args.seed,
            messages: args.messages,
            workers: args.workers,
            faults: counts,
            effects: counted.values().sum(),
            lost,
            duplicate_effects,
            worker_exits,
            seconds: started.elapsed().as_secs_f64(),
            verdict: if why.is_empty() { "pass" } else { "fail" },
            why: why.join("; "),
        })
    }
}

/// The message of an order: its payload, with its id as the message id.
fn message(o: &Order) -> anyhow::Result<Message> {
    Ok(Message::new(o.payload.clone())
        .with_content_type("application/json")
        .with_id(o.id.as_str())?)
}

/// The run's one-screen summary.
pub(crate) fn table(r: &WorkerReport) -> String {
    let f = &r.faults;
    format!(
        "justonce lab --worker '{}': transport {}, store {}, {} orders ({} published twice), {} workers, seed {}\n\
         faults done: {} kills, {} pauses, {} cuts, {} broker restarts, {} database restarts\n\n\
         {:>8} {:>6} {:>10} {:>12} {:>8}\n\
         {:>8} {:>6} {:>10} {:>12} {:>8.1}\n\n\
         verdict: {}{}\n",
        r.command,
        r.transport,
        r.store,
        r.messages,
        f.duplicate_publishes,
        r.workers,
        r.seed,
        f.kills,
        f.pauses,
        f.cuts,
        f.broker_restarts,
        f.db_restarts,
        "effects",
        "lost",
        "duplicate",
        "worker exits",
        "seconds",
        r.effects,
        r.lost,
        r.duplicate_effects,
        r.worker_exits,
        r.seconds,
        r.verdict.to_uppercase(),
        if r.why.is_empty() {
            String::new()
        } else {
            format!(" ({})", r.why)
        }
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_template_takes_the_order_and_the_judge_counts_from_the_query() {
        let p = render(DEFAULT_TEMPLATE, "lab-1-0000042", 42);
        assert_eq!(
            p,
            r#"{"order_id":"lab-1-0000042","account":43,"amount_cents":7}"#
        );
        let counts: HashMap<String, u64> =
            [("a".into(), 1), ("b".into(), 3), ("d".into(), 0)].into();
        // a once, b twice too many, c and d never.
        assert_eq!(judge(["a", "b", "c", "d"], &counts), (2, 2));
    }
}
