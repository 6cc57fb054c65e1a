//! Where a scenario's orders come from: a publisher process that publishes them itself
//! (every class but `relay`), or, for the `relay` class, a producer process that places them
//! through a producer outbox and relay processes that publish the outbox (confirm, then
//! mark). The relays are killed at their fault point between a confirm and its mark, the
//! producer right after one of its commits, and each is started again.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::bail;
use tokio::process::Command;
use tokio::sync::mpsc;

use super::protocol::LabPoint;
use super::supervisor::{Mark, Worker};
use super::FaultCounts;

/// Relay processes of the `relay` class.
const RELAYS: usize = 2;
/// A relay's lease: a killed relay's rows go out again once it has run out.
const RELAY_LEASE: Duration = Duration::from_secs(3);
/// Pause of the producer between its transactions: it places orders for a few seconds, so
/// that the relays and the broker's restart overlap it.
const PRODUCER_PACE_MS: u64 = 100;

/// What starts the upstream processes.
pub(crate) struct UpstreamSpec<'a> {
    pub(crate) exe: &'a Path,
    /// The URLs the processes use (through the fault proxies).
    pub(crate) transport: &'a str,
    pub(crate) store: &'a str,
    pub(crate) queue: &'a str,
    /// The tables' prefix (the outbox is `{prefix}_outbox`).
    pub(crate) tables: &'a str,
    pub(crate) messages: u64,
    pub(crate) seed: u64,
    pub(crate) topology: Vec<String>,
    /// The publisher's chunks of orders, and its pause after each: spread over the run, so
    /// that faults that take seconds each (a failover) land while orders still arrive.
    pub(crate) pace: (usize, Duration),
}

/// The running upstream of a scenario.
pub(crate) enum Upstream {
    Publisher { child: Box<Worker>, done: bool },
    Outbox(Box<Relayed>),
}

impl Upstream {
    /// Starts a publisher process; what it says on stderr is kept for an error message.
    pub(crate) fn publisher(s: &UpstreamSpec<'_>) -> anyhow::Result<Self> {
        let mut cmd = Command::new(s.exe);
        cmd.args(["publish", "--queue", s.queue])
            .env("JUSTONCE_TRANSPORT_URL", s.transport)
            .args(["--messages", &s.messages.to_string()])
            .args(["--seed", &s.seed.to_string()])
            .args(["--chunk", &s.pace.0.to_string()])
            .args(["--pace-ms", &s.pace.1.as_millis().to_string()])
            .args(&s.topology);
        let child = Worker::start_plain(cmd, "publisher", 0, 0)?;
        Ok(Upstream::Publisher {
            child: Box::new(child),
            done: false,
        })
    }

    /// Starts the producer and the relays of the `relay` class; `kills` relays die at
    /// their fault point (at least two), and the producer once.
    pub(crate) fn relayed(
        s: &UpstreamSpec<'_>,
        kills: u32,
        rng: &mut fastrand::Rng,
    ) -> anyhow::Result<Self> {
        let (marks_tx, marks) = mpsc::unbounded_channel();
        let mut r = Relayed {
            exe: s.exe.to_owned(),
            producer_args: producer_args(s),
            relay_args: relay_args(s),
            transport: s.transport.to_owned(),
            store: s.store.to_owned(),
            producer: None,
            produced: false,
            relays: Vec::new(),
            marks_tx,
            marks,
            relay_kills_left: kills.max(2),
            generation: 0,
        };
        let chunk = rng.u32(2..=4);
        r.producer = Some(r.start(PRODUCER, Some((LabPoint::AfterEnqueue, chunk)))?);
        for slot in 0..RELAYS {
            let kill = r.relay_kill(rng);
            let relay = r.start(slot, kill)?;
            r.relays.push(relay);
        }
        Ok(Upstream::Outbox(Box::new(r)))
    }

    /// Kills whoever waits at its fault point and starts it again; notes a producer that
    /// has finished. Labels of the kills, for the plot.
    pub(crate) async fn tend(
        &mut self,
        rng: &mut fastrand::Rng,
        counts: &mut FaultCounts,
    ) -> anyhow::Result<Vec<String>> {
        match self {
            Upstream::Publisher { child, done } => {
                if !*done {
                    if let Ok(Some(status)) = child.child.try_wait() {
                        if !status.success() {
                            bail!(
                                "the publisher process failed ({status}); it said:\n{}",
                                child.last_words().await
                            );
                        }
                        *done = true;
                    }
                }
                Ok(Vec::new())
            }
            Upstream::Outbox(r) => r.tend(rng, counts).await,
        }
    }

    /// Everything is published (a publisher), or placed in the outbox (the producer).
    pub(crate) fn done(&self) -> bool {
        match self {
            Upstream::Publisher { done, .. } => *done,
            Upstream::Outbox(r) => r.produced,
        }
    }

    /// Stops every process: the relays gracefully, so they mark what they sent.
    pub(crate) async fn stop(&mut self) {
        match self {
            Upstream::Publisher { child, .. } => {
                let _ = child.child.start_kill();
            }
            Upstream::Outbox(r) => {
                if let Some(p) = &mut r.producer {
                    p.kill().await;
                }
                for relay in &mut r.relays {
                    relay.terminate().await;
                }
            }
        }
    }

    /// The last stderr lines of the relays and the producer.
    pub(crate) fn tails(&self) -> Vec<String> {
        match self {
            Upstream::Publisher { child, .. } => vec![child.tail()],
            Upstream::Outbox(r) => super::supervisor::tails(&r.relays)
                .into_iter()
                .chain(r.producer.iter().map(Worker::tail))
                .collect(),
        }
    }
}

/// The producer's slot in the marks (the relays take 0..RELAYS).
const PRODUCER: usize = usize::MAX;

/// The producer and the relays.
pub(crate) struct Relayed {
    exe: std::path::PathBuf,
    producer_args: Vec<String>,
    relay_args: Vec<String>,
    /// The URLs, passed in the environment (crate::secrets).
    transport: String,
    store: String,
    /// None once it has finished.
    producer: Option<Worker>,
    produced: bool,
    relays: Vec<Worker>,
    marks_tx: mpsc::UnboundedSender<Mark>,
    marks: mpsc::UnboundedReceiver<Mark>,
    relay_kills_left: u32,
    generation: u64,
}

impl Relayed {
    /// Starts the producer (`slot` [`PRODUCER`]) or a relay.
    fn start(&mut self, slot: usize, kill: Option<(LabPoint, u32)>) -> anyhow::Result<Worker> {
        self.generation += 1;
        let (args, what) = if slot == PRODUCER {
            (&self.producer_args, "the producer")
        } else {
            (&self.relay_args, "a relay")
        };
        let mut cmd = Command::new(&self.exe);
        cmd.args(args)
            .env("JUSTONCE_TRANSPORT_URL", &self.transport)
            .env("JUSTONCE_STORE_URL", &self.store);
        Worker::start(
            cmd,
            what,
            slot,
            self.generation,
            kill,
            self.marks_tx.clone(),
            Arc::default(),
        )
    }

    /// The next relay's kill point: at its first to fourth pass, while kills are left.
    fn relay_kill(&mut self, rng: &mut fastrand::Rng) -> Option<(LabPoint, u32)> {
        (self.relay_kills_left > 0).then(|| {
            self.relay_kills_left -= 1;
            (LabPoint::AfterConfirm, rng.u32(1..=4))
        })
    }

    async fn tend(
        &mut self,
        rng: &mut fastrand::Rng,
        counts: &mut FaultCounts,
    ) -> anyhow::Result<Vec<String>> {
        let mut labels = Vec::new();
        while let Ok(mark) = self.marks.try_recv() {
            let Mark::FaultPoint(slot, generation) = mark else {
                continue;
            };
            if slot == PRODUCER {
                let Some(p) = self
                    .producer
                    .as_mut()
                    .filter(|p| p.generation == generation)
                else {
                    continue;
                };
                p.kill().await;
                counts.producer_kills += 1;
                labels.push("kill producer after-enqueue".to_owned());
                self.producer = Some(self.start(PRODUCER, None)?);
            } else if self.relays[slot].generation == generation {
                self.relays[slot].kill().await;
                counts.relay_kills += 1;
                labels.push("kill relay after-confirm".to_owned());
                let kill = self.relay_kill(rng);
                self.relays[slot] = self.start(slot, kill)?;
            }
        }
        if let Some(p) = &mut self.producer {
            if let Ok(Some(status)) = p.child.try_wait() {
                if !status.success() {
                    bail!("the producer process failed ({status}):\n{}", p.tail());
                }
                self.producer = None;
                self.produced = true;
            }
        }
        for slot in 0..self.relays.len() {
            if let Ok(Some(status)) = self.relays[slot].child.try_wait() {
                // A relay exits on its own only when it cannot start (a service down):
                // start it again, as a supervisor would.
                eprintln!(
                    "lab: a relay exited ({status}); starting it again:\n{}",
                    self.relays[slot].tail()
                );
                let kill = self.relays[slot].kill_point.map(|p| (p, rng.u32(1..=4)));
                self.relays[slot] = self.start(slot, kill)?;
            }
        }
        Ok(labels)
    }
}

fn producer_args(s: &UpstreamSpec<'_>) -> Vec<String> {
    let mut a: Vec<String> = ["produce", "--tables", s.tables].map(String::from).into();
    a.extend(["--messages".into(), s.messages.to_string()]);
    a.extend(["--seed".into(), s.seed.to_string()]);
    a.extend(["--pace-ms".into(), PRODUCER_PACE_MS.to_string()]);
    a
}

fn relay_args(s: &UpstreamSpec<'_>) -> Vec<String> {
    let mut a: Vec<String> = ["outbox", "relay"].map(String::from).into();
    a.extend(["--table".into(), format!("{}_outbox", s.tables)]);
    a.extend(["--queue".into(), s.queue.to_owned()]);
    a.extend(["--lease-ms".into(), RELAY_LEASE.as_millis().to_string()]);
    a.extend(["--poll-ms".into(), "100".into()]);
    // A relay that moves rows into a PostgreSQL queue of its own database has no window
    // between a publish and its mark, the one this class kills in: it publishes.
    a.push("--publish".into());
    a.extend(s.topology.iter().cloned());
    a
}
