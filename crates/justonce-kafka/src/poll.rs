//! The poll thread: it owns the group membership. librdkafka serves rebalances inside
//! `poll`, and an assignment must seek to positions read from the store before the
//! first fetch, so the thread blocks on that read (it is not a runtime thread). Records
//! go to the source through a bounded channel. When it is full the thread waits for room
//! and polls now and then, so the group does not take it for dead; the records it polls
//! meanwhile wait in the thread. Only when as many wait as the channel holds does it pause
//! its partitions: librdkafka drops what it prefetched for a paused partition and fetches
//! it again on resume, which costs a fetch per batch if done at every full channel.

use std::collections::{HashMap, VecDeque};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc as std_mpsc, Arc, Mutex};
use std::time::Duration;

use justonce_core::Positions;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, Rebalance};
use rdkafka::message::Message as _;
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use tokio::sync::mpsc;
use tracing::{debug, info, warn};

use crate::codec;
use crate::options::Start;
use crate::state::{Fresh, State};

/// What the source asks of the poll thread.
pub(crate) enum Command {
    /// Forget what is held and read each assigned partition again from its stored
    /// position, as a restarted process would; answer when done.
    Reset(tokio::sync::oneshot::Sender<()>),
    /// Leave the group and stop fetching, then stop; answer when done. tansu 0.6 (its
    /// SQLite storage) dies when a topic is deleted between the storage calls of a fetch
    /// of it.
    Stop(tokio::sync::oneshot::Sender<()>),
}

/// What the poll thread and the source share.
pub(crate) struct Shared {
    pub(crate) state: Mutex<State>,
    pub(crate) topic: String,
    pub(crate) group: String,
    pub(crate) start: Start,
    pub(crate) positions: Option<Arc<dyn Positions>>,
    pub(crate) runtime: tokio::runtime::Handle,
    pub(crate) timeout: Duration,
    /// A consumer of the group that never joins it: reads the committed offsets (the
    /// rebalance callback cannot use the consumer it runs in).
    pub(crate) offsets: BaseConsumer,
}

pub(crate) fn lock(state: &Mutex<State>) -> std::sync::MutexGuard<'_, State> {
    state.lock().unwrap_or_else(|e| e.into_inner())
}

/// The consumer's context: an assignment starts at the stored positions (librdkafka
/// assigns the list this callback wrote the offsets into).
pub(crate) struct Ctx(pub(crate) Arc<Shared>);

impl ClientContext for Ctx {}

impl ConsumerContext for Ctx {
    fn pre_rebalance(&self, _: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        let s = &self.0;
        match rebalance {
            Rebalance::Assign(tpl) => {
                let mut elements = tpl.elements_for_topic(&s.topic);
                let parts: Vec<i32> = elements.iter().map(|e| e.partition()).collect();
                let starts = starts(s, &parts);
                let mut state = lock(&s.state);
                for e in &mut elements {
                    let (offset, number) = starts[&e.partition()];
                    state.assign(e.partition(), number);
                    if let Err(err) = e.set_offset(offset) {
                        warn!(error = %err, "setting a partition's start failed");
                    }
                }
                drop(state);
                info!(topic = %s.topic, group = %s.group, partitions = ?parts, "partitions assigned");
            }
            Rebalance::Revoke(tpl) => {
                let mut state = lock(&s.state);
                for e in tpl.elements_for_topic(&s.topic) {
                    state.revoke(e.partition());
                }
                drop(state);
                info!(topic = %s.topic, group = %s.group, "partitions revoked");
            }
            Rebalance::Error(e) => {
                warn!(error = %e, "a rebalance failed; every partition is let go");
                let mut state = lock(&s.state);
                for p in state.assigned() {
                    state.revoke(p);
                }
            }
        }
    }
}

/// Where each of `parts` starts: the stored position, or the start the options name. With
/// positions in a store that cannot be read now, Kafka's committed offsets (never past
/// the store's: they are committed after it) or the earliest record: read again, never
/// skipped.
fn starts(s: &Shared, parts: &[i32]) -> HashMap<i32, (Offset, Option<i64>)> {
    let fallback = match s.start {
        Start::Earliest => Offset::Beginning,
        Start::Latest => Offset::End,
    };
    let mut out: HashMap<i32, (Offset, Option<i64>)> =
        parts.iter().map(|p| (*p, (fallback, None))).collect();
    if parts.is_empty() {
        return out;
    }
    if let Some(positions) = &s.positions {
        let load = || {
            catch_unwind(AssertUnwindSafe(|| {
                s.runtime.block_on(async {
                    tokio::time::timeout(s.timeout, positions.load(&s.group, &s.topic, parts)).await
                })
            }))
        };
        match load() {
            Ok(Ok(Ok(stored))) => {
                for p in stored {
                    out.insert(p.partition, (Offset::Offset(p.offset), Some(p.offset)));
                }
                return out;
            }
            Ok(Ok(Err(e))) => {
                warn!(error = %e.to_chain_string(), "reading the stored positions failed; reading from Kafka's committed offsets (records may come again, never skipped)")
            }
            _ => warn!("reading the stored positions timed out; reading from Kafka's committed offsets (records may come again, never skipped)"),
        }
        out.values_mut()
            .for_each(|v| *v = (Offset::Beginning, None));
    }
    let mut tpl = TopicPartitionList::new();
    for p in parts {
        let _ = tpl.add_partition(&s.topic, *p);
    }
    match s.offsets.committed_offsets(tpl, s.timeout) {
        Ok(c) => {
            for e in c.elements_for_topic(&s.topic) {
                if let Offset::Offset(o) = e.offset() {
                    out.insert(e.partition(), (Offset::Offset(o), Some(o)));
                }
            }
        }
        Err(e) => warn!(error = %e, "reading the group's committed offsets failed"),
    }
    out
}

/// While the source is full, how long the thread waits for room before it polls (to serve
/// the group: rebalances, the poll interval).
const FULL_WAIT: Duration = Duration::from_millis(100);

/// Runs until `stop` or until the source's receiver is gone.
pub(crate) fn run(
    consumer: Arc<BaseConsumer<Ctx>>,
    shared: Arc<Shared>,
    tx: mpsc::Sender<Fresh>,
    commands: std_mpsc::Receiver<Command>,
    stop: Arc<AtomicBool>,
) {
    // The records polled while the source was full, at most as many as it holds; past
    // that the partitions are paused until they are handed over.
    let most = tx.max_capacity();
    let mut held: VecDeque<Fresh> = VecDeque::new();
    let mut paused = false;
    let mut errors = Errors::default();
    while !stop.load(Ordering::Relaxed) && !tx.is_closed() {
        while let Ok(cmd) = commands.try_recv() {
            match cmd {
                Command::Reset(done) => {
                    reset(&consumer, &shared);
                    held.clear();
                    let _ = done.send(());
                }
                Command::Stop(done) => {
                    consumer.unsubscribe();
                    // The revocation is served by a poll; the close (when this is the
                    // last reference) leaves the group.
                    let _ = consumer.poll(Duration::from_millis(100));
                    drop(consumer);
                    let _ = done.send(());
                    return;
                }
            }
        }
        while let Some(f) = held.pop_front() {
            match tx.try_send(f) {
                Ok(()) => {}
                Err(mpsc::error::TrySendError::Full(f)) => {
                    held.push_front(f);
                    break;
                }
                Err(mpsc::error::TrySendError::Closed(_)) => return,
            }
        }
        // Tried again at every turn until every partition is resumed: a partition left
        // paused is never fetched again.
        if held.is_empty() && paused && pause(&consumer, false) {
            paused = false;
        }
        let wait = if held.is_empty() {
            Duration::from_millis(100)
        } else {
            // Full: wait for room (and hand the next record over), then poll once
            // without waiting.
            let room = shared
                .runtime
                .block_on(async { tokio::time::timeout(FULL_WAIT, tx.reserve()).await });
            match room {
                Ok(Ok(permit)) => {
                    if let Some(f) = held.pop_front() {
                        permit.send(f);
                    }
                    continue;
                }
                Ok(Err(_)) => return, // the source is gone
                Err(_) => {}
            }
            if held.len() >= most {
                // Again each time: a partition assigned since is not paused yet.
                pause(&consumer, true);
                paused = true;
            }
            Duration::ZERO
        };
        match consumer.poll(wait) {
            None => {}
            Some(Err(e)) => errors.saw(&e),
            Some(Ok(m)) => {
                let epoch = lock(&shared.state).epoch(m.partition());
                let Some(epoch) = epoch else { continue };
                held.push_back(Fresh {
                    partition: m.partition(),
                    offset: m.offset(),
                    epoch,
                    message: codec::decode(m.headers(), m.payload()),
                });
            }
        }
    }
    debug!(topic = %shared.topic, "the poll thread stops");
}

/// The consumer's errors, as `poll` gives them, said at warn: each error at most once
/// every [`ERROR_REPEAT`], with how often it came meanwhile. Most pass (a broker
/// restarting, a connection cut, which alternate two errors); one that does not is the
/// only sign of a partition read no further, so it must not be a debug line.
#[derive(Default)]
struct Errors {
    /// By error: when it was last said, and how often it came since.
    said: HashMap<String, (std::time::Instant, u64)>,
}

/// How often an error that goes on is said again.
const ERROR_REPEAT: Duration = Duration::from_secs(30);

impl Errors {
    fn saw(&mut self, e: &rdkafka::error::KafkaError) {
        let text = e.to_string();
        match self.say(&text, std::time::Instant::now()) {
            Some(0) => warn!(error = %text, "the Kafka consumer failed"),
            Some(repeats) => warn!(error = %text, repeats, "the Kafka consumer still fails"),
            None => {}
        }
    }

    /// Whether `text` is to be said at `now`, and how often it came since it last was.
    fn say(&mut self, text: &str, now: std::time::Instant) -> Option<u64> {
        let Some((since, repeats)) = self.said.get_mut(text) else {
            if self.said.len() >= 64 {
                self.said.clear(); // errors vary without bound only if their texts do
            }
            self.said.insert(text.to_owned(), (now, 0));
            return Some(0);
        };
        *repeats += 1;
        if now.duration_since(*since) < ERROR_REPEAT {
            return None;
        }
        let n = *repeats;
        *since = now;
        *repeats = 0;
        Some(n)
    }
}

/// Pauses (or resumes) the assigned partitions; answers whether every one was.
///
/// librdkafka answers success for the call and writes each partition's own error into
/// the list: a partition missing from the client's metadata for a moment (a broker
/// restarting answers that the topic is unknown) is skipped with `_UNKNOWN_PARTITION`.
/// A resume skipped so left the partition paused for good, and its worker idle with
/// every record still to read (the Kafka + PostgreSQL soak's stall, docs/reliability.md).
fn pause(consumer: &BaseConsumer<Ctx>, on: bool) -> bool {
    let Ok(a) = consumer.assignment() else {
        return false;
    };
    let r = if on {
        consumer.pause(&a)
    } else {
        consumer.resume(&a)
    };
    if let Err(e) = r {
        debug!(error = %e, "pausing or resuming partitions failed");
        return false;
    }
    if unsettled(&a).count() == 0 {
        return true;
    }
    if !on {
        warn!(partitions = ?a, "resuming partitions failed; trying again");
    }
    false
}

/// The entries of `tpl` librdkafka wrote an error into, at their offsets.
fn unsettled(tpl: &TopicPartitionList) -> TopicPartitionList {
    let mut out = TopicPartitionList::new();
    for e in tpl.elements().iter().filter(|e| e.error().is_err()) {
        let _ = out.add_partition_offset(e.topic(), e.partition(), e.offset());
    }
    out
}

/// How long [`reset`] tries again a seek librdkafka skipped for a partition.
const SEEK_RETRY: Duration = Duration::from_secs(30);

/// [`Command::Reset`]: each assigned partition read again from its stored position. A
/// partition whose seek librdkafka skipped (written into the list, not answered) would be
/// read on from where its fetches were, past records handed out before the reset: its
/// seek is tried again until it takes.
fn reset(consumer: &BaseConsumer<Ctx>, s: &Shared) {
    let parts = lock(&s.state).assigned();
    if parts.is_empty() {
        return;
    }
    let mut tpl = from_stored(s, &parts);
    let patience = SEEK_RETRY.max(s.timeout);
    let deadline = std::time::Instant::now() + patience;
    loop {
        let again = match consumer.seek_partitions(tpl.clone(), s.timeout) {
            Ok(done) => {
                let again = unsettled(&done);
                if again.count() == 0 {
                    return;
                }
                warn!(partitions = ?done, "seeking to the stored positions failed; trying again");
                again
            }
            Err(e) => {
                warn!(error = %e, "seeking to the stored positions failed; trying again");
                tpl
            }
        };
        if std::time::Instant::now() >= deadline {
            warn!("seeking to the stored positions failed for {patience:?}; the partitions are read on from where they were");
            return;
        }
        // librdkafka's own threads refresh the metadata meanwhile; a poll here could
        // take a record of a partition already sought, and lose it.
        std::thread::sleep(Duration::from_millis(200));
        tpl = again;
    }
}

/// `parts` taken anew in the state (a new epoch each), and where each starts ([`starts`]):
/// the list to seek to or to assign. Blocks on the store: off the runtime.
pub(crate) fn from_stored(s: &Shared, parts: &[i32]) -> TopicPartitionList {
    let starts = starts(s, parts);
    let mut tpl = TopicPartitionList::new();
    let mut state = lock(&s.state);
    for p in parts {
        let (offset, number) = starts[p];
        state.assign(*p, number);
        let _ = tpl.add_partition_offset(&s.topic, *p, offset);
    }
    tpl
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two errors that alternate while a broker restarts are each said once, then again
    /// with their counts once [`ERROR_REPEAT`] has passed.
    #[test]
    fn each_error_is_said_once_a_period_even_when_they_alternate() {
        let mut errors = Errors::default();
        let t0 = std::time::Instant::now();
        let (down, cut) = ("all brokers down", "transport failure");
        assert_eq!(errors.say(down, t0), Some(0));
        assert_eq!(errors.say(cut, t0), Some(0));
        for i in 1..=5 {
            let t = t0 + Duration::from_secs(i);
            assert_eq!(errors.say(down, t), None);
            assert_eq!(errors.say(cut, t), None);
        }
        let later = t0 + ERROR_REPEAT;
        assert_eq!(
            errors.say(down, later),
            Some(6),
            "five folded, and this one"
        );
        assert_eq!(errors.say(down, later), None);
        assert_eq!(errors.say(cut, later), Some(6));
    }
}
