//! The source: a member of the consumer group, receiving from its partitions.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc as std_mpsc, Arc};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use justonce_core::{
    DeadLetter, DeadLetterReason, Delivery, Error, ErrorKind, Message, Position, PositionsIn,
    Publisher, Receipt, Result, Source, TransactionalAck,
};
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::{Offset, TopicPartitionList};
use tokio::sync::{mpsc, Mutex as AsyncMutex};
use tracing::debug;

use crate::client::{base, millis, Client};
use crate::error::{blocking, kafka};
use crate::options::{KafkaOptions, Start};
use crate::poll::{self, lock, Command, Ctx, Shared};
use crate::state::{Fresh, State, Token};

/// How often a waiting receive looks at retries that came due.
const TICK: Duration = Duration::from_millis(50);

/// Once a receive has records, how long it waits for the next fetch response: records
/// published together may come in two responses, a moment apart.
const FETCH_GAP: Duration = Duration::from_millis(25);

/// A Kafka topic as a justonce source: a member of the consumer group
/// [`KafkaOptions::group`], receiving from the partitions the group assigns it.
///
/// Kafka keeps no per-record state: a consumer has a position per partition. The source
/// keeps in memory the records it handed out and not yet finished; a partition's
/// position is the first of them. Acks move it: with the positions in Kafka, a
/// synchronous offset commit after each ack; with the positions in a store
/// ([`KafkaOptions::positions_in`]), the runtime writes them in the batch's transaction
/// ([`KafkaSource::acks_in`]) and Kafka's committed offsets follow as a hint for tools.
/// A retry waits in memory and holds its partition's position back; a dead letter goes
/// to the dead-letter topic, its delivery report awaited, before the position passes it.
///
/// What the source holds is lost with its process: a restarted worker, or the worker the
/// group gives the partitions to, reads again from the position, and the dedup records
/// absorb what had been applied. Attempts are counted in memory, so they start over
/// after a restart.
#[derive(Clone)]
pub struct KafkaSource {
    inner: Arc<Inner>,
}

struct Inner {
    client: Client,
    shared: Arc<Shared>,
    /// Taken by [`KafkaSource::close`], so that the poll thread holds the last reference
    /// and destroys the consumer before the close returns.
    consumer: std::sync::Mutex<Option<Arc<BaseConsumer<Ctx>>>>,
    rx: AsyncMutex<mpsc::Receiver<Fresh>>,
    commands: std::sync::Mutex<std_mpsc::Sender<Command>>,
    /// Serializes offset commits, and the last committed per partition.
    committed: AsyncMutex<std::collections::HashMap<i32, i64>>,
    /// With the positions in a store: the largest position known to be written there,
    /// per partition (by a committed transaction, or by [`KafkaSource::commit`]).
    stored: std::sync::Mutex<std::collections::HashMap<i32, i64>>,
    stop: Arc<AtomicBool>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

impl std::fmt::Debug for KafkaSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaSource")
            .field("opts", &self.inner.client.opts)
            .finish_non_exhaustive()
    }
}

/// What a fetch asks the broker for at most: room for two of the largest records (tansu
/// 0.6.0 never answers a record whose key and value reach the limit).
fn fetch_max_bytes(max_message_bytes: usize) -> usize {
    max_message_bytes.max(1 << 20) * 2
}

/// The largest answer the consumer takes. A broker may answer a fetch with more than it
/// was asked for: tansu 0.6.0 counts only the records' keys and values against the fetch's
/// limit, not their headers and framing, so an answer of small records with headers can be
/// several times the limit (8.7 MB for 4 MB asked, seen in the lab). An answer over this
/// is dropped by librdkafka, which fetches the same offsets again, gets the same answer,
/// and never moves on: a partition read no further, silently. The bound is a ceiling, not
/// an allocation (each answer's buffer is its own size).
fn receive_max_bytes(max_message_bytes: usize) -> usize {
    (fetch_max_bytes(max_message_bytes) * 32 + (1 << 20)).min(i32::MAX as usize)
}

impl KafkaSource {
    /// Connects, makes the topics unless they exist, and joins the consumer group.
    /// Partitions are assigned a moment later; until then a receive finds nothing.
    pub async fn connect(opts: KafkaOptions) -> Result<Self> {
        let client = Client::connect(opts).await?;
        let o = client.opts.clone();
        let offsets: BaseConsumer = base(&o)?
            .set("group.id", &o.group)
            .set("enable.auto.commit", "false")
            .create()
            .map_err(|e| kafka("creating the Kafka consumer", e))?;
        let shared = Arc::new(Shared {
            state: std::sync::Mutex::new(State::default()),
            topic: o.topic.clone(),
            group: o.group.clone(),
            start: o.start,
            positions: o.positions.clone(),
            runtime: tokio::runtime::Handle::current(),
            timeout: o.request_timeout,
            offsets,
        });
        let mut config = base(&o)?;
        let session = o.session_timeout.max(Duration::from_secs(1));
        config
            .set("group.id", &o.group)
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("isolation.level", "read_committed")
            .set(
                "auto.offset.reset",
                match o.start {
                    Start::Earliest => "earliest",
                    Start::Latest => "latest",
                },
            )
            .set("session.timeout.ms", millis(session))
            .set("heartbeat.interval.ms", millis(session / 4))
            .set("queued.max.messages.kbytes", "16384")
            // librdkafka fetches ahead up to 100,000 records a partition by default, and
            // keeps each answer's buffer while one of its records waits: ten times what
            // the source's own channel holds is ahead enough.
            .set(
                "queued.min.messages",
                o.prefetch
                    .saturating_mul(10)
                    .clamp(1_000, 100_000)
                    .to_string(),
            )
            // A fetch answers after at most this long even with nothing new: tansu does
            // not answer a waiting fetch when a record comes, so librdkafka's 500 ms
            // default made every record published to an idle topic wait half a second.
            .set("fetch.wait.max.ms", "50")
            .set(
                "fetch.max.bytes",
                fetch_max_bytes(o.max_message_bytes).to_string(),
            )
            .set(
                "receive.message.max.bytes",
                receive_max_bytes(o.max_message_bytes).to_string(),
            );
        let consumer: BaseConsumer<Ctx> = config
            .create_with_context(Ctx(shared.clone()))
            .map_err(|e| kafka("creating the Kafka consumer", e))?;
        match &o.assignment {
            None => consumer
                .subscribe(&[&o.topic])
                .map_err(|e| kafka(format!("subscribing to `{}`", o.topic), e))?,
            Some(parts) => {
                if let Some(p) = parts.iter().find(|p| **p < 0) {
                    return Err(Error::config(format!(
                        "partition {p} of `{}`: partitions are numbered from 0",
                        o.topic
                    )));
                }
                // The stored positions are read off the runtime (the poll thread's
                // reader blocks on it).
                let (s, list) = (shared.clone(), parts.clone());
                let tpl = tokio::task::spawn_blocking(move || poll::from_stored(&s, &list))
                    .await
                    .map_err(|e| {
                        Error::with_source(ErrorKind::Resource, "reading the positions", e)
                    })?;
                consumer
                    .assign(&tpl)
                    .map_err(|e| kafka(format!("assigning partitions of `{}`", o.topic), e))?;
                tracing::info!(topic = %o.topic, partitions = ?parts, "partitions assigned by hand");
            }
        }
        let consumer = Arc::new(consumer);
        let (tx, rx) = mpsc::channel(o.prefetch);
        let (commands, command_rx) = std_mpsc::channel();
        let stop = Arc::new(AtomicBool::new(false));
        {
            let (consumer, shared, stop) = (consumer.clone(), shared.clone(), stop.clone());
            std::thread::Builder::new()
                .name(format!("justonce-kafka-{}", o.topic))
                .spawn(move || poll::run(consumer, shared, tx, command_rx, stop))
                .map_err(|e| {
                    Error::with_source(ErrorKind::Resource, "starting the Kafka poll thread", e)
                })?;
        }
        Ok(KafkaSource {
            inner: Arc::new(Inner {
                client,
                shared,
                consumer: std::sync::Mutex::new(Some(consumer)),
                rx: AsyncMutex::new(rx),
                commands: std::sync::Mutex::new(commands),
                committed: AsyncMutex::new(Default::default()),
                stored: std::sync::Mutex::new(Default::default()),
                stop,
            }),
        })
    }

    /// The options it was connected with.
    pub fn options(&self) -> &KafkaOptions {
        &self.inner.client.opts
    }

    /// A publisher on the same producer (it joins no group).
    pub fn publisher(&self) -> crate::KafkaPublisher {
        crate::KafkaPublisher {
            client: self.inner.client.clone(),
        }
    }

    pub(crate) fn client(&self) -> &Client {
        &self.inner.client
    }

    /// The partitions the group has assigned to this source now.
    pub fn assigned(&self) -> Vec<i32> {
        lock(&self.inner.shared.state).assigned()
    }

    /// Acks in a store's transaction `Tx`: the positions move in the batch's transaction
    /// (`Consumer::with_transactional_ack`), so records are read again if and only if
    /// their effects rolled back. `positions` must be the store's positions table the
    /// source reads ([`KafkaOptions::positions_in`]); a source whose positions are in
    /// Kafka is refused.
    pub fn acks_in<Tx, P>(&self, positions: P) -> Result<OffsetsAck<Tx>>
    where
        P: PositionsIn<Tx> + 'static,
        Tx: Send + 'static,
    {
        if self.inner.shared.positions.is_none() {
            return Err(Error::config(
                "this Kafka source keeps its positions in Kafka: connect it with \
                 KafkaOptions::positions_in(the store's positions) to ack in the store's \
                 transaction",
            ));
        }
        Ok(OffsetsAck {
            source: self.clone(),
            positions: Arc::new(positions),
            written: std::sync::Mutex::new(Default::default()),
        })
    }

    fn token(r: &Receipt) -> Result<&Token> {
        r.downcast_ref::<Token>().ok_or_else(|| {
            Error::new(
                ErrorKind::Internal,
                "a receipt from another transport was settled on a Kafka source",
            )
        })
    }

    fn tokens<'a>(receipts: &[&'a Receipt]) -> Result<Vec<&'a Token>> {
        receipts.iter().map(|r| Self::token(r)).collect()
    }

    /// Commits `positions` to the group's offsets: waited for with the positions in
    /// Kafka, sent and not waited for when they are only a hint. A commit the group
    /// refuses (the partition went to another member) is let go: the new owner reads
    /// again from the last commit, and the dedup records absorb what comes twice.
    async fn commit(&self, positions: Vec<Position>) -> Result<()> {
        if positions.is_empty() {
            return Ok(());
        }
        let i = &self.inner;
        if let Some(store) = &i.shared.positions {
            // Past records finished outside a transaction that wrote their position (a
            // dead letter, the tail of a batch behind another's): written here.
            let ahead: Vec<Position> = {
                let stored = i.stored.lock().unwrap_or_else(|e| e.into_inner());
                positions
                    .iter()
                    .filter(|p| stored.get(&p.partition).is_none_or(|o| *o < p.offset))
                    .copied()
                    .collect()
            };
            if !ahead.is_empty() {
                store.save(&i.shared.group, &i.shared.topic, &ahead).await?;
                self.stored_at(&ahead);
            }
        }
        let hint = i.shared.positions.is_some();
        let mut last = i.committed.lock().await;
        let mut tpl = TopicPartitionList::new();
        for p in &positions {
            if last.get(&p.partition).is_some_and(|o| *o >= p.offset) {
                continue;
            }
            tpl.add_partition_offset(&i.shared.topic, p.partition, Offset::Offset(p.offset))
                .map_err(|e| kafka("an offset to commit", e))?;
        }
        if tpl.count() == 0 {
            return Ok(());
        }
        let Some(consumer) = i.consumer.lock().unwrap_or_else(|e| e.into_inner()).clone() else {
            return Ok(()); // closed
        };
        let mode = if hint {
            CommitMode::Async
        } else {
            CommitMode::Sync
        };
        let result = blocking("committing offsets", move || consumer.commit(&tpl, mode)).await?;
        match result {
            Ok(()) => {
                for p in positions {
                    let o = last.entry(p.partition).or_insert(p.offset);
                    *o = (*o).max(p.offset);
                }
                Ok(())
            }
            Err(e) if hint => {
                debug!(error = %e, "committing the offsets hint failed");
                Ok(())
            }
            Err(e) => {
                use rdkafka::error::RDKafkaErrorCode as C;
                match e.rdkafka_error_code() {
                    Some(
                        C::IllegalGeneration
                        | C::UnknownMemberId
                        | C::RebalanceInProgress
                        | C::State
                        | C::UnknownPartition,
                    ) => {
                        debug!(error = %e, "an offset commit for partitions this worker no longer holds");
                        Ok(())
                    }
                    _ => Err(kafka("committing the consumer's offsets", e)),
                }
            }
        }
    }

    /// Sends a command to the poll thread and waits for its answer (none if it stopped).
    async fn command(&self, make: impl FnOnce(tokio::sync::oneshot::Sender<()>) -> Command) {
        let (done, wait) = tokio::sync::oneshot::channel();
        let sent = self
            .inner
            .commands
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .send(make(done));
        if sent.is_ok() {
            let _ = wait.await;
        }
    }

    /// Leaves the group, stops fetching and destroys the consumer; the source receives
    /// nothing after (a receive fails with [`ErrorKind::Closed`]). Publishing goes on.
    pub async fn close(&self) {
        let mine = self
            .inner
            .consumer
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        drop(mine);
        self.command(Command::Stop).await;
    }

    /// Records `positions` as written to the store.
    fn stored_at(&self, positions: &[Position]) {
        let mut stored = self.inner.stored.lock().unwrap_or_else(|e| e.into_inner());
        for p in positions {
            let o = stored.entry(p.partition).or_insert(p.offset);
            *o = (*o).max(p.offset);
        }
    }

    fn fresh(&self, f: Fresh) -> Option<Delivery> {
        lock(&self.inner.shared.state).accept(f)
    }

    fn closed() -> Error {
        Error::new(ErrorKind::Closed, "the Kafka poll thread stopped")
    }
}

#[async_trait]
impl Source for KafkaSource {
    fn queue(&self) -> &str {
        &self.inner.shared.topic
    }

    fn system(&self) -> &'static str {
        "kafka"
    }

    async fn receive(&self, max: usize, wait: Duration) -> Result<Vec<Delivery>> {
        let deadline = tokio::time::Instant::now() + wait;
        let mut out = lock(&self.inner.shared.state).redos(max, Instant::now());
        let mut rx = self.inner.rx.lock().await;
        loop {
            while out.len() < max {
                match rx.try_recv() {
                    Ok(f) => out.extend(self.fresh(f)),
                    Err(mpsc::error::TryRecvError::Empty) => break,
                    Err(mpsc::error::TryRecvError::Disconnected) => return Err(Self::closed()),
                }
            }
            let now = tokio::time::Instant::now();
            if out.len() >= max || (out.is_empty() && now >= deadline) {
                return Ok(out);
            }
            let until = if out.is_empty() {
                deadline.min(now + TICK)
            } else {
                now + FETCH_GAP
            };
            match tokio::time::timeout_at(until, rx.recv()).await {
                Ok(Some(f)) => out.extend(self.fresh(f)),
                Ok(None) => return Err(Self::closed()),
                Err(_) if !out.is_empty() => return Ok(out),
                Err(_) => {}
            }
            if out.len() < max {
                let more = lock(&self.inner.shared.state).redos(max - out.len(), Instant::now());
                out.extend(more);
            }
        }
    }

    async fn ack(&self, receipts: &[&Receipt]) -> Result<()> {
        let tokens = Self::tokens(receipts)?;
        let moved = lock(&self.inner.shared.state).finish(&tokens, false);
        self.commit(moved).await
    }

    async fn nack(&self, receipt: &Receipt, delay: Duration) -> Result<()> {
        let t = Self::token(receipt)?;
        lock(&self.inner.shared.state).retry(t, Instant::now() + delay);
        Ok(())
    }

    /// Hands deliveries back to be received again at once, their attempts not counted;
    /// also deliveries acked in a transaction that did not commit.
    async fn release(&self, receipts: &[&Receipt]) -> Result<()> {
        let tokens = Self::tokens(receipts)?;
        let mut state = lock(&self.inner.shared.state);
        for t in tokens {
            state.release(t);
        }
        Ok(())
    }

    async fn dead_letter(&self, delivery: &Delivery, reason: &DeadLetterReason) -> Result<()> {
        let t = Self::token(&delivery.receipt)?;
        if !lock(&self.inner.shared.state).is_out(t) {
            return Ok(()); // stale: its partition went to another worker, which decides
        }
        let letter = DeadLetter::new(delivery.message.clone(), reason.clone());
        self.inner
            .client
            .write_dead(t.partition, t.offset, &letter.message)
            .await?;
        let moved = lock(&self.inner.shared.state).finish(&[t], false);
        self.commit(moved).await
    }

    /// Forgets what this source holds and reads each of its partitions again from the
    /// stored position, as a restarted process would.
    async fn abandon(&self) {
        self.command(Command::Reset).await;
    }

    /// The group's session timeout: how long a worker that stopped keeps its partitions.
    fn redelivery_delay(&self) -> Duration {
        self.inner.client.opts.session_timeout
    }
}

#[async_trait]
impl Publisher for KafkaSource {
    async fn publish(&self, message: &Message) -> Result<()> {
        self.inner
            .client
            .publish_all(std::slice::from_ref(message))
            .await
    }

    async fn publish_batch(&self, messages: &[Message]) -> Result<()> {
        self.inner.client.publish_all(messages).await
    }
}

/// Acks of a [`KafkaSource`] written in a store's transaction `Tx`: the positions of the
/// batch's partitions, in the store's positions table ([`KafkaSource::acks_in`]).
pub struct OffsetsAck<Tx> {
    source: KafkaSource,
    positions: Arc<dyn PositionsIn<Tx>>,
    /// What each transaction not yet known to have committed wrote, by the hand-out of
    /// its first receipt.
    written: std::sync::Mutex<std::collections::HashMap<u64, Vec<Position>>>,
}

impl<Tx> std::fmt::Debug for OffsetsAck<Tx> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OffsetsAck").finish_non_exhaustive()
    }
}

#[async_trait]
impl<Tx: Send + 'static> TransactionalAck<Tx> for OffsetsAck<Tx> {
    async fn ack_in(&self, tx: &mut Tx, receipts: &[&Receipt]) -> Result<()> {
        let tokens = KafkaSource::tokens(receipts)?;
        if tokens.is_empty() {
            return Ok(());
        }
        let moved = lock(&self.source.inner.shared.state).ack_in_tx(&tokens);
        let moved = moved.map_err(|stale| {
            Error::new(
                ErrorKind::Busy,
                format!(
                    "{stale} of {} deliveries are no longer this worker's (their partition was \
                     reassigned or read again): the batch is rolled back, to be applied once by \
                     their new holder",
                    tokens.len()
                ),
            )
        })?;
        let s = &self.source.inner.shared;
        self.positions
            .save_in(tx, &s.group, &s.topic, &moved)
            .await?;
        let mut written = self.written.lock().unwrap_or_else(|e| e.into_inner());
        if written.len() > 10_000 {
            written.clear(); // transactions that rolled back: their receipts were released
        }
        written.insert(tokens[0].hand, moved);
        Ok(())
    }

    async fn committed(&self, receipts: &[&Receipt]) {
        let Ok(tokens) = KafkaSource::tokens(receipts) else {
            return;
        };
        let Some(first) = tokens.first() else { return };
        let wrote = self
            .written
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&first.hand);
        if let Some(wrote) = wrote {
            self.source.stored_at(&wrote);
        }
        let moved = lock(&self.source.inner.shared.state).finish(&tokens, true);
        if let Err(e) = self.source.commit(moved).await {
            debug!(error = %e, "moving positions past records finished after a commit failed; the next batch's transaction moves them");
        }
    }
}
