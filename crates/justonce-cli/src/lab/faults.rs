//! Firing a scenario's faults: kills at random moments, pauses, the proxies' cuts, delays
//! and black holes, broker and database restarts, and the schema fault.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use justonce::backend::{StoreKind, TransportKind};

use super::proxy::{through, FaultProxy};
use super::supervisor::Worker;
use super::{FaultClass, FaultCounts};
use crate::local::{PgServer, RabbitNode};

/// The fault proxies of a scenario: in front of the broker and in front of the database
/// (none where the backend has no server: SQLite).
#[derive(Debug, Clone, Default)]
pub(crate) struct Proxies {
    pub(crate) transport: Option<Arc<FaultProxy>>,
    pub(crate) store: Option<Arc<FaultProxy>>,
}

impl Proxies {
    fn all(&self) -> Vec<Arc<FaultProxy>> {
        [&self.transport, &self.store]
            .into_iter()
            .flatten()
            .cloned()
            .collect()
    }

    /// Begins the next partition of the three kinds (those that apply, in turn) for
    /// `span`, ended in a task counted in `busy`; returns its label.
    fn partition(&self, busy: &Arc<AtomicUsize>, span: Duration, turn: u64) -> Option<String> {
        let mut kinds: Vec<(&str, &Arc<FaultProxy>, bool)> = Vec::new();
        if let Some(t) = &self.transport {
            kinds.push(("from the broker", t, false));
        }
        if let Some(s) = &self.store {
            kinds.push(("from the database", s, false));
        }
        if let Some(t) = &self.transport {
            kinds.push(("asymmetric, the workers' bytes to the broker lost", t, true));
        }
        let (what, proxy, asymmetric) = *kinds.get(turn as usize % kinds.len().max(1))?;
        let proxy = proxy.clone();
        if asymmetric {
            proxy.set_mute_up(true);
        } else {
            proxy.set_blackhole(true);
        }
        busy.fetch_add(1, Ordering::SeqCst);
        let busy = busy.clone();
        tokio::spawn(async move {
            tokio::time::sleep(span).await;
            if asymmetric {
                // What the workers sent meanwhile never arrives: the connection goes.
                proxy.cut_all();
                proxy.set_mute_up(false);
            } else {
                proxy.set_blackhole(false);
            }
            busy.fetch_sub(1, Ordering::SeqCst);
        });
        Some(format!("partition {what} {:.1}s", span.as_secs_f64()))
    }
}

/// A proxy in front of `url`'s server, and the URL through it; none when the backend has
/// no server (SQLite).
pub(crate) async fn proxied(
    url: &str,
    networked: bool,
) -> anyhow::Result<(Option<Arc<FaultProxy>>, String)> {
    if !networked {
        return Ok((None, url.to_owned()));
    }
    let probe: SocketAddr = "127.0.0.1:0".parse()?;
    let (_, hostport) = through(url, probe).context("cannot find host:port in the URL")?;
    let upstream = tokio::net::lookup_host(&hostport)
        .await?
        .next()
        .with_context(|| format!("cannot resolve {hostport}"))?;
    let proxy = Arc::new(FaultProxy::start(upstream).await?);
    let (via, _) = through(url, proxy.addr()).context("cannot rewrite the URL")?;
    Ok((Some(proxy), via))
}

impl FaultClass {
    /// Does it at its milestone; returns its label for the plot. Faults with a duration (pause, delay, black
    /// hole) end in a task of their own, counted in `busy` until they have.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn fire(
        self,
        workers: &mut [Worker],
        proxies: &Proxies,
        schema: &SchemaFault,
        busy: &Arc<AtomicUsize>,
        lease: Duration,
        own_broker: Option<&mut OwnBroker>,
        restarts: &Restarts,
        rng: &mut fastrand::Rng,
        counts: &mut FaultCounts,
    ) -> String {
        let slot = rng.usize(..workers.len());
        match self {
            FaultClass::Kill => {
                workers[slot].kill().await;
                counts.kills += 1;
                "kill (random moment)".into()
            }
            FaultClass::Pause => {
                let span = (lease * 3).max(Duration::from_secs(2));
                if workers[slot].pause(span, busy) {
                    counts.pauses += 1;
                }
                format!("pause {:.1}s", span.as_secs_f64())
            }
            FaultClass::Cut => {
                for p in proxies.all() {
                    p.cut_all();
                }
                counts.cuts += 1;
                "cut".into()
            }
            FaultClass::Delay => {
                timed(&proxies.all(), busy, Duration::from_secs(3), |p, on| {
                    p.set_delay(if on {
                        Duration::from_millis(100)
                    } else {
                        Duration::ZERO
                    })
                });
                "delay 100ms x 3s".into()
            }
            FaultClass::Blackhole => {
                let span = (lease * 3).max(Duration::from_secs(3));
                timed(&proxies.all(), busy, span, |p, on| p.set_blackhole(on));
                counts.cuts += 1;
                format!("blackhole {:.1}s", span.as_secs_f64())
            }
            FaultClass::Partition => {
                let span = (lease * 3).max(Duration::from_secs(3));
                match proxies.partition(busy, span, counts.partitions) {
                    Some(label) => {
                        counts.partitions += 1;
                        label
                    }
                    None => "partition (nothing networked)".into(),
                }
            }
            FaultClass::Failover => match own_broker {
                Some(OwnBroker::Cluster(c)) => match c.failover().await {
                    Ok(label) => {
                        counts.failovers += 1;
                        label
                    }
                    Err(e) => {
                        eprintln!("lab: the failover did not happen: {e:#}");
                        "failover (failed)".into()
                    }
                },
                _ => "failover (no cluster)".into(),
            },
            FaultClass::BrokerRestart => {
                if let Some(server) = own_broker {
                    server.kill().await;
                    tokio::time::sleep(Duration::from_secs(2)).await;
                    match server.restart().await {
                        Ok(()) => counts.broker_restarts += 1,
                        Err(e) => {
                            eprintln!("lab: the lab's {} did not come back: {e}", server.name())
                        }
                    }
                    return format!("{} restart (SIGKILL)", server.name());
                }
                if restarts.broker().await {
                    counts.broker_restarts += 1;
                }
                "broker restart".into()
            }
            FaultClass::DbRestart => {
                if restarts.databases().await {
                    counts.db_restarts += 1;
                }
                "db restart".into()
            }
            // Its faults are the upstream's (kills at the relays' and the producer's fault
            // points) and a broker restart, scheduled as such.
            FaultClass::Relay => "relay".into(),
            FaultClass::Schema => {
                let span = Duration::from_secs(4);
                match schema.rename(false).await {
                    Ok(()) => {
                        counts.schema_breaks += 1;
                        busy.fetch_add(1, Ordering::SeqCst);
                        let (busy, schema) = (busy.clone(), schema.clone());
                        tokio::spawn(async move {
                            tokio::time::sleep(span).await;
                            // The table must come back, or nothing drains; a server that is
                            // down for a while is waited for, but not for ever: a scenario
                            // whose table never returns fails on its drain, and the matrix
                            // goes on.
                            for attempt in 1..=60 {
                                match schema.rename(true).await {
                                    Ok(()) => break,
                                    Err(e) if attempt == 60 => {
                                        eprintln!("lab: the accounts table could not be renamed back; giving up: {e:#}")
                                    }
                                    Err(e) => {
                                        eprintln!(
                                            "lab: the accounts table did not come back yet: {e:#}"
                                        );
                                        tokio::time::sleep(Duration::from_millis(500)).await;
                                    }
                                }
                            }
                            busy.fetch_sub(1, Ordering::SeqCst);
                        });
                    }
                    Err(e) => eprintln!("lab: could not rename the accounts table: {e:#}"),
                }
                format!("schema {:.0}s", span.as_secs_f64())
            }
        }
    }
}

/// The deploy mistake of the `schema` fault: the accounts table renamed away, then back,
/// with a connection of the lab's own, straight to the store.
#[derive(Debug, Clone)]
pub(crate) struct SchemaFault {
    pub(crate) url: String,
    pub(crate) table: String,
}

impl SchemaFault {
    /// Renames the table away (`back` false) or back.
    async fn rename(&self, back: bool) -> anyhow::Result<()> {
        use sqlx::Connection as _;
        let away = format!("{}_away", self.table);
        let (from, to) = if back {
            (away.as_str(), self.table.as_str())
        } else {
            (self.table.as_str(), away.as_str())
        };
        match StoreKind::from_url(&self.url)? {
            StoreKind::Postgres => {
                let mut c = sqlx::PgConnection::connect(&self.url).await?;
                sqlx::query(&format!("ALTER TABLE {from} RENAME TO {to}"))
                    .execute(&mut c)
                    .await?;
                c.close().await?;
            }
            StoreKind::MySql => {
                let url = self.url.replacen("mariadb://", "mysql://", 1);
                let mut c = sqlx::MySqlConnection::connect(&url).await?;
                sqlx::query(&format!("RENAME TABLE {from} TO {to}"))
                    .execute(&mut c)
                    .await?;
                c.close().await?;
            }
            StoreKind::Sqlite | StoreKind::Redis => {
                anyhow::bail!("the schema fault needs a PostgreSQL or MariaDB store")
            }
        }
        Ok(())
    }
}

/// Turns a proxy switch on for `span`, then off, in a task counted in `busy`.
fn timed(
    proxies: &[Arc<FaultProxy>],
    busy: &Arc<AtomicUsize>,
    span: Duration,
    set: fn(&FaultProxy, bool),
) {
    for p in proxies {
        set(p, true);
    }
    busy.fetch_add(1, Ordering::SeqCst);
    let proxies = proxies.to_vec();
    let busy = busy.clone();
    tokio::spawn(async move {
        tokio::time::sleep(span).await;
        for p in &proxies {
            set(p, false);
        }
        busy.fetch_sub(1, Ordering::SeqCst);
    });
}

/// The servers the restart faults act on, found before the run from the URLs: the RabbitMQ
/// node the transport URL names, and the PostgreSQL servers the transport and store URLs
/// name ([`crate::local`]: by the port they listen on, never the machine's defaults). A run
/// that would fire a restart it has no server for does not start.
#[derive(Debug, Default)]
pub(crate) struct Restarts {
    broker: Option<RabbitNode>,
    databases: Vec<PgServer>,
}

impl Restarts {
    pub(crate) async fn resolve(
        fired: &[FaultClass],
        transport: (TransportKind, &str),
        store: (StoreKind, &str),
        own_broker: bool,
    ) -> anyhow::Result<Self> {
        let mut restarts = Restarts::default();
        if fired.contains(&FaultClass::BrokerRestart)
            && transport.0 == TransportKind::Amqp
            && !own_broker
        {
            let why = "the broker-restart fault restarts the RabbitMQ node the transport URL \
                       names, and cannot reach it";
            let node = RabbitNode::find(transport.1).context(why)?;
            // Its own rabbitmqctl answers, and the node says it listens on that port.
            node.facts().await.context(why)?;
            restarts.broker = Some(node);
        }
        if fired.contains(&FaultClass::DbRestart) {
            let urls = [
                (transport.0 == TransportKind::Postgres).then_some(transport.1),
                (store.0 == StoreKind::Postgres).then_some(store.1),
            ];
            for url in urls.into_iter().flatten() {
                let server = PgServer::find(url).context(
                    "the db-restart fault restarts the PostgreSQL server a URL names, and \
                     cannot reach it",
                )?;
                if !restarts.databases.iter().any(|d| d.data == server.data) {
                    restarts.databases.push(server);
                }
            }
        }
        Ok(restarts)
    }

    /// `stop_app`, 2 s, `start_app` on the transport's node.
    async fn broker(&self) -> bool {
        let Some(node) = &self.broker else {
            return false;
        };
        match node.restart_app(Duration::from_secs(2)).await {
            Ok(()) => true,
            Err(e) => {
                eprintln!("lab: the broker restart of {} failed: {e:#}", node.name);
                false
            }
        }
    }

    /// Restarts each database server (started again if a restart stops midway).
    async fn databases(&self) -> bool {
        let mut all = !self.databases.is_empty();
        for db in &self.databases {
            if let Err(e) = db.restart().await {
                eprintln!(
                    "lab: the database restart ({}) failed: {e:#}",
                    db.describe()
                );
                all = false;
            }
        }
        all
    }
}

/// The fault proxy in front of the lab's own tansu, made before it: a Kafka client connects
/// to the bootstrap address once, then to the address the broker advertises, so the
/// network faults reach a Kafka worker's fetches, produces and commits only through a
/// broker that advertises the proxy. The lab starts such a tansu of its own whenever it
/// fires a network fault (a cut, a delay, a black hole, a partition) or a broker restart
/// on Kafka; the broker at the URL given serves runs with none of them.
pub(crate) struct KafkaFront {
    /// The port the tansu listens on, the proxy's upstream.
    pub(crate) port: u16,
    pub(crate) proxy: Arc<FaultProxy>,
}

impl KafkaFront {
    /// The proxy, and the port behind it, for a `fired` set of faults that needs them.
    pub(crate) async fn for_faults(
        fired: &[FaultClass],
        kind: TransportKind,
    ) -> anyhow::Result<Option<Self>> {
        let needed = fired
            .iter()
            .any(|f| f.is_network() || *f == FaultClass::BrokerRestart);
        if kind != TransportKind::Kafka || !needed {
            return Ok(None);
        }
        let port = justonce_kafka::harness::free_port()?;
        let proxy = FaultProxy::start(SocketAddr::from(([127, 0, 0, 1], port))).await?;
        Ok(Some(KafkaFront {
            port,
            proxy: Arc::new(proxy),
        }))
    }
}

/// The transport of a run firing `fired` on `kind`: the lab's own server where it needs one
/// (else `given`), the URL the lab's own connections use, and the transport's fault proxy
/// with the URL the workers and the publisher use through it.
pub(crate) struct LabTransport {
    pub(crate) own: Option<OwnBroker>,
    pub(crate) url: String,
    pub(crate) proxy: Option<Arc<FaultProxy>>,
    pub(crate) workers_url: String,
}

impl LabTransport {
    pub(crate) async fn start(
        fired: &[FaultClass],
        kind: TransportKind,
        queue: &str,
        given: impl FnOnce() -> String,
    ) -> anyhow::Result<Self> {
        let front = KafkaFront::for_faults(fired, kind).await?;
        let own = OwnBroker::for_faults(fired, kind, queue, front.as_ref()).await?;
        let url = own.as_ref().map_or_else(given, OwnBroker::url);
        let (proxy, workers_url) = match front {
            // The lab's tansu advertises this proxy: every connection after the bootstrap
            // goes through it, the lab's own too.
            Some(front) => {
                let (via, _) =
                    through(&url, front.proxy.addr()).context("cannot rewrite the Kafka URL")?;
                (Some(front.proxy), via)
            }
            None => proxied(&url, kind != TransportKind::Sqlite).await?,
        };
        Ok(LabTransport {
            own,
            url,
            proxy,
            workers_url,
        })
    }
}

/// A server the lab started itself to restart it: a Redis, a NATS or a tansu, on a port
/// and directory of its own; the servers at the URLs given are never restarted.
pub(crate) enum OwnBroker {
    /// A durable `redis-server`.
    Redis(justonce_redis::harness::OwnServer),
    /// A `nats-server` with JetStream.
    Nats(justonce_nats::harness::OwnServer),
    /// A tansu (Kafka) broker with SQLite storage.
    Kafka(justonce_kafka::harness::OwnBroker),
    /// A three-node RabbitMQ cluster, behind a proxy that picks a live node.
    Cluster(Box<OwnCluster>),
}

/// The failover class's RabbitMQ cluster: three nodes of the installed `rabbitmq-server`,
/// the lab's own, and the proxy every process of the lab reaches them through.
pub(crate) struct OwnCluster {
    cluster: justonce_amqp::harness::Cluster,
    front: FaultProxy,
    /// The work queue, whose leader each failover moves.
    queue: String,
    turn: u32,
}

impl OwnCluster {
    /// Takes the work queue's leader down, in turn by SIGKILL, by a graceful stop and by
    /// stopping its app; waits until another node leads (30 s at most); starts it again.
    async fn failover(&mut self) -> anyhow::Result<String> {
        let c = &mut self.cluster;
        let before = c
            .leader(&self.queue)
            .await
            .with_context(|| format!("queue {} has no leader to fail over", self.queue))?;
        let how = self.turn % 3;
        self.turn += 1;
        match how {
            0 => c.kill(before).await,
            1 => c.stop(before).await?,
            _ => c.stop_app(before).await?,
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        let after = loop {
            match c.leader(&self.queue).await {
                Some(l) if l != before => break l,
                _ if std::time::Instant::now() > deadline => {
                    anyhow::bail!(
                        "no other node leads {} 30 s after node {} went down",
                        self.queue,
                        before + 1
                    )
                }
                _ => tokio::time::sleep(Duration::from_millis(250)).await,
            }
        };
        match how {
            2 => c.start_app(before).await?,
            _ => c.start_node(before).await?,
        }
        let what = ["SIGKILL", "stop", "stop_app"][how as usize];
        Ok(format!(
            "failover: {what} node {}, node {} leads",
            before + 1,
            after + 1
        ))
    }
}

/// With `JUSTONCE_LAB_LOGS=DIR`, the lab's tansu leaves its log there (`tansu-PORT.log`)
/// before its temporary directory goes: a stalled Kafka run has to tell a broker that
/// stopped answering from a client that stopped asking.
impl Drop for OwnBroker {
    fn drop(&mut self) {
        let (OwnBroker::Kafka(t), Some(dir)) = (&*self, super::supervisor::logs_dir()) else {
            return;
        };
        let to = dir.join(format!("tansu-{}.log", t.port()));
        if let Err(e) = std::fs::copy(t.log(), &to) {
            tracing::warn!("cannot keep the lab's tansu log in {}: {e}", to.display());
        }
    }
}

impl OwnBroker {
    /// The lab's own server for `kind`; `None` for a transport whose restarts go to the
    /// server at its URL (RabbitMQ, stopped and started as an app) or that has none.
    async fn start(
        kind: TransportKind,
        front: Option<&KafkaFront>,
    ) -> anyhow::Result<Option<Self>> {
        Ok(match kind {
            TransportKind::Redis => Some(OwnBroker::Redis(
                justonce_redis::harness::OwnServer::start_durable()
                    .await
                    .context("cannot start the lab's own redis-server (is it installed?)")?,
            )),
            TransportKind::Nats => Some(OwnBroker::Nats(
                justonce_nats::harness::OwnServer::start(1 << 20)
                    .await
                    .context("cannot start the lab's own nats-server (is it installed?)")?,
            )),
            TransportKind::Kafka => {
                use justonce_kafka::harness::OwnBroker as Tansu;
                let started = match front {
                    Some(f) => Tansu::start_behind(f.port, f.proxy.addr().to_string()).await,
                    None => Tansu::start().await,
                };
                Some(OwnBroker::Kafka(started.context(
                    "cannot start the lab's own tansu (scripts/services.sh installs it)",
                )?))
            }
            _ => None,
        })
    }

    /// The server a run with `faults` on `kind` needs of its own: the cluster for a
    /// failover (its work queue `queue`), the server to restart for a broker restart.
    /// On Kafka `front` is the fault proxy the tansu it starts advertises.
    pub(crate) async fn for_faults(
        faults: &[FaultClass],
        kind: TransportKind,
        queue: &str,
        front: Option<&KafkaFront>,
    ) -> anyhow::Result<Option<Self>> {
        if faults.contains(&FaultClass::Failover) {
            Self::cluster(queue).await.map(Some)
        } else if faults.contains(&FaultClass::BrokerRestart) || front.is_some() {
            Self::start(kind, front).await
        } else {
            Ok(None)
        }
    }

    /// The lab's own RabbitMQ cluster of three nodes, its work queue `queue`.
    async fn cluster(queue: &str) -> anyhow::Result<Self> {
        let cluster = justonce_amqp::harness::Cluster::start(3)
            .await
            .context("cannot start the lab's RabbitMQ cluster (is rabbitmq-server installed?)")?;
        let front =
            FaultProxy::start_many((0..cluster.len()).map(|i| cluster.addr(i)).collect()).await?;
        Ok(OwnBroker::Cluster(Box::new(OwnCluster {
            cluster,
            front,
            queue: queue.to_owned(),
            turn: 0,
        })))
    }

    /// Its URL.
    pub(crate) fn url(&self) -> String {
        match self {
            OwnBroker::Redis(s) => s.url(),
            OwnBroker::Nats(s) => s.url(),
            OwnBroker::Kafka(s) => s.url(),
            OwnBroker::Cluster(c) => through(&c.cluster.url(0), c.front.addr())
                .map_or_else(|| c.cluster.url(0), |(url, _)| url),
        }
    }

    /// The server's program.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            OwnBroker::Redis(_) => "redis-server",
            OwnBroker::Nats(_) => "nats-server",
            OwnBroker::Kafka(_) => "tansu",
            OwnBroker::Cluster(_) => "RabbitMQ cluster",
        }
    }

    async fn kill(&mut self) {
        match self {
            OwnBroker::Redis(s) => s.kill().await,
            OwnBroker::Nats(s) => s.kill().await,
            OwnBroker::Kafka(s) => s.kill().await,
            OwnBroker::Cluster(c) => {
                for i in 0..c.cluster.len() {
                    c.cluster.kill(i).await;
                }
            }
        }
    }

    async fn restart(&mut self) -> std::io::Result<()> {
        match self {
            OwnBroker::Redis(s) => s.restart().await,
            OwnBroker::Nats(s) => s.restart().await,
            OwnBroker::Kafka(s) => s.restart().await,
            // The nodes wait for each other's tables at boot: start them side by side.
            OwnBroker::Cluster(c) => c.cluster.start_all().await,
        }
    }
}
