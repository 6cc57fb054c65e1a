//! What a source holds in memory: per assigned partition, the records handed out and not
//! yet finished, and from them the partition's position. Pure: the source and its poll
//! thread lock it; nothing here does I/O.
//!
//! A partition's position (the offset of the next record to read after a restart) is the
//! first record still held, or the offset after the last record received when none is.
//! A record is held from the moment it is received until it is acked, acked in a
//! transaction that committed, or dead-lettered; a retry waits in memory, holding the
//! position back, and records behind it go on.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::time::Instant;

use justonce_core::{Delivery, Message, Position, Receipt};

/// A receipt's token: the record and the hand-out it was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Token {
    pub(crate) partition: i32,
    pub(crate) offset: i64,
    pub(crate) hand: u64,
}

/// A record fetched by the poll thread, with the partition epoch it was fetched in.
#[derive(Debug)]
pub(crate) struct Fresh {
    pub(crate) partition: i32,
    pub(crate) offset: i64,
    pub(crate) epoch: u64,
    pub(crate) message: Message,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Hold {
    /// Handed out, not settled.
    Out,
    /// Acked in a transaction not known to have committed.
    InTx,
    /// To be handed out again now (released).
    Ready,
    /// To be handed out again once due (a retry).
    Waiting(Instant),
}

#[derive(Debug)]
struct Slot {
    hand: u64,
    attempt: u32,
    message: Message,
    hold: Hold,
}

/// One assigned partition.
#[derive(Debug)]
pub(crate) struct Part {
    /// Bumped on each assignment and reset: records fetched before belong to no one.
    pub(crate) epoch: u64,
    /// The offset after the last record received; `None` before the first when the start
    /// was not a number (the earliest or latest record).
    next: Option<i64>,
    held: BTreeMap<i64, Slot>,
}

impl Part {
    fn position(&self) -> Option<i64> {
        self.held.keys().next().copied().or(self.next)
    }
}

/// The source's memory.
#[derive(Debug, Default)]
pub(crate) struct State {
    parts: HashMap<i32, Part>,
    /// Deliveries made of each record still in play, across resets in this process.
    tries: HashMap<(i32, i64), u32>,
    /// Records to hand out again (released or retried).
    redo: VecDeque<(i32, i64)>,
    hands: u64,
    epochs: u64,
}

impl State {
    /// A partition assigned, or reset: what was held of it is forgotten, and reading
    /// starts at `start` (`None`: the earliest or latest record). Answers its epoch.
    pub(crate) fn assign(&mut self, partition: i32, start: Option<i64>) -> u64 {
        self.epochs += 1;
        self.parts.insert(
            partition,
            Part {
                epoch: self.epochs,
                next: start,
                held: BTreeMap::new(),
            },
        );
        self.redo.retain(|(p, _)| *p != partition);
        if let Some(start) = start {
            forget_below(&mut self.tries, partition, start);
        }
        self.epochs
    }

    /// A partition revoked: its receipts are stale from now on.
    pub(crate) fn revoke(&mut self, partition: i32) {
        self.parts.remove(&partition);
        self.redo.retain(|(p, _)| *p != partition);
        self.tries.retain(|(p, _), _| *p != partition);
    }

    /// The partitions assigned.
    pub(crate) fn assigned(&self) -> Vec<i32> {
        let mut p: Vec<i32> = self.parts.keys().copied().collect();
        p.sort_unstable();
        p
    }

    /// The epoch of a partition, if assigned.
    pub(crate) fn epoch(&self, partition: i32) -> Option<u64> {
        self.parts.get(&partition).map(|p| p.epoch)
    }

    fn hand(&mut self) -> u64 {
        self.hands += 1;
        self.hands
    }

    /// A fetched record as a delivery, or `None` when it belongs to an earlier epoch or
    /// was received already.
    pub(crate) fn accept(&mut self, f: Fresh) -> Option<Delivery> {
        let hand = self.hand();
        let part = self.parts.get_mut(&f.partition)?;
        if part.epoch != f.epoch || part.next.is_some_and(|n| f.offset < n) {
            return None;
        }
        let first = part.next.is_none();
        part.next = Some(f.offset + 1);
        if first {
            // Started at the earliest or the latest record: this one is where reading began.
            forget_below(&mut self.tries, f.partition, f.offset);
        }
        let tries = self.tries.entry((f.partition, f.offset)).or_insert(0);
        *tries += 1;
        let attempt = *tries;
        part.held.insert(
            f.offset,
            Slot {
                hand,
                attempt,
                message: f.message.clone(),
                hold: Hold::Out,
            },
        );
        Some(delivery(
            f.message,
            attempt,
            attempt > 1,
            f.partition,
            f.offset,
            hand,
        ))
    }

    /// Up to `max` records released or due again, handed out anew.
    pub(crate) fn redos(&mut self, max: usize, now: Instant) -> Vec<Delivery> {
        let mut out = Vec::new();
        let mut keep = VecDeque::new();
        while let Some((p, o)) = self.redo.pop_front() {
            if out.len() >= max {
                keep.push_back((p, o));
                continue;
            }
            self.hands += 1;
            let hand = self.hands;
            let Some(slot) = self
                .parts
                .get_mut(&p)
                .and_then(|part| part.held.get_mut(&o))
            else {
                continue;
            };
            match slot.hold {
                Hold::Ready => {}
                Hold::Waiting(due) if due <= now => {}
                Hold::Waiting(_) => {
                    keep.push_back((p, o));
                    continue;
                }
                Hold::Out | Hold::InTx => continue,
            }
            slot.hold = Hold::Out;
            slot.hand = hand;
            let attempt = slot.attempt;
            out.push(delivery(slot.message.clone(), attempt, true, p, o, hand));
            self.tries.insert((p, o), attempt);
        }
        self.redo = keep;
        out
    }

    fn slot(&mut self, t: &Token) -> Option<&mut Slot> {
        self.parts
            .get_mut(&t.partition)?
            .held
            .get_mut(&t.offset)
            .filter(|s| s.hand == t.hand)
    }

    /// Finishes the records of `tokens` that are out (or, with `in_tx`, acked in a
    /// transaction); answers the positions of the partitions that moved.
    pub(crate) fn finish(&mut self, tokens: &[&Token], in_tx: bool) -> Vec<Position> {
        let mut touched = HashSet::new();
        for t in tokens {
            let ok = self
                .slot(t)
                .is_some_and(|s| s.hold == Hold::Out || (in_tx && s.hold == Hold::InTx));
            if ok {
                if let Some(part) = self.parts.get_mut(&t.partition) {
                    part.held.remove(&t.offset);
                }
                self.tries.remove(&(t.partition, t.offset));
                touched.insert(t.partition);
            }
        }
        self.positions(touched)
    }

    fn positions(&self, partitions: impl IntoIterator<Item = i32>) -> Vec<Position> {
        let mut out: Vec<Position> = partitions
            .into_iter()
            .filter_map(|p| {
                let offset = self.parts.get(&p)?.position()?;
                Some(Position {
                    partition: p,
                    offset,
                })
            })
            .collect();
        out.sort();
        out
    }

    /// Marks the records of `tokens` acked in a transaction, if every one is out; answers
    /// the positions that transaction moves its partitions to (each partition's first
    /// record held by anything else), or how many were not out.
    pub(crate) fn ack_in_tx(&mut self, tokens: &[&Token]) -> Result<Vec<Position>, usize> {
        let stale = tokens
            .iter()
            .filter(|t| !self.slot(t).is_some_and(|s| s.hold == Hold::Out))
            .count();
        if stale > 0 {
            return Err(stale);
        }
        let mut mine: HashMap<i32, HashSet<i64>> = HashMap::new();
        for t in tokens {
            mine.entry(t.partition).or_default().insert(t.offset);
            if let Some(s) = self.slot(t) {
                s.hold = Hold::InTx;
            }
        }
        let mut out: Vec<Position> = mine
            .into_iter()
            .filter_map(|(p, offsets)| {
                let part = self.parts.get(&p)?;
                let offset = part
                    .held
                    .keys()
                    .find(|o| !offsets.contains(o))
                    .copied()
                    .or(part.next)?;
                Some(Position {
                    partition: p,
                    offset,
                })
            })
            .collect();
        out.sort();
        Ok(out)
    }

    /// A retry: handed out again once `due`, its attempt counted. False when stale.
    pub(crate) fn retry(&mut self, t: &Token, due: Instant) -> bool {
        let Some(slot) = self.slot(t).filter(|s| s.hold == Hold::Out) else {
            return false;
        };
        slot.attempt += 1;
        slot.hold = Hold::Waiting(due);
        let attempt = slot.attempt;
        self.tries.insert((t.partition, t.offset), attempt);
        self.redo.push_back((t.partition, t.offset));
        true
    }

    /// A release: handed out again now with the same attempt (also of a record acked in
    /// a transaction that did not commit).
    pub(crate) fn release(&mut self, t: &Token) {
        let Some(slot) = self
            .slot(t)
            .filter(|s| matches!(s.hold, Hold::Out | Hold::InTx))
        else {
            return;
        };
        slot.hold = Hold::Ready;
        let before = slot.attempt.saturating_sub(1);
        self.tries.insert((t.partition, t.offset), before);
        self.redo.push_back((t.partition, t.offset));
    }

    /// Whether `t` is out (a dead letter may be written for it).
    pub(crate) fn is_out(&mut self, t: &Token) -> bool {
        self.slot(t).is_some_and(|s| s.hold == Hold::Out)
    }
}

fn delivery(
    message: Message,
    attempt: u32,
    redelivered: bool,
    partition: i32,
    offset: i64,
    hand: u64,
) -> Delivery {
    Delivery {
        message,
        attempt,
        redelivered,
        receipt: Receipt::new(Token {
            partition,
            offset,
            hand,
        }),
    }
}

/// Drops from `tries` the delivery counts of `partition`'s records before `offset`: reading
/// starts there, so they are not received again in this epoch (committed by a transaction
/// of the one before, say), and their counts would stay for as long as the process lives.
/// A function of the map, not of `State`: `accept` calls it while it holds a partition.
fn forget_below(tries: &mut HashMap<(i32, i64), u32>, partition: i32, offset: i64) {
    tries.retain(|(p, o), _| *p != partition || *o >= offset);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn fresh(s: &State, p: i32, o: i64) -> Fresh {
        Fresh {
            partition: p,
            offset: o,
            epoch: s.epoch(p).unwrap(),
            message: Message::new(format!("m{o}")),
        }
    }

    fn tok(d: &Delivery) -> Token {
        *d.receipt.downcast_ref::<Token>().unwrap()
    }

    #[test]
    fn the_position_waits_for_the_first_record_held() {
        let mut s = State::default();
        s.assign(0, Some(10));
        let a = s.accept(fresh(&s, 0, 10)).unwrap();
        let b = s.accept(fresh(&s, 0, 11)).unwrap();
        assert_eq!(
            s.finish(&[&tok(&b)], false),
            [Position {
                partition: 0,
                offset: 10
            }]
        );
        assert_eq!(
            s.finish(&[&tok(&a)], false),
            [Position {
                partition: 0,
                offset: 12
            }]
        );
        assert!(
            s.finish(&[&tok(&a)], false).is_empty(),
            "finishing twice moves nothing"
        );
    }

    #[test]
    fn records_of_an_earlier_epoch_or_already_received_are_dropped() {
        let mut s = State::default();
        s.assign(0, None);
        let old = fresh(&s, 0, 5);
        s.assign(0, Some(5));
        assert!(s.accept(old).is_none(), "fetched before the reset");
        assert!(s.accept(fresh(&s, 0, 5)).is_some());
        assert!(s.accept(fresh(&s, 0, 5)).is_none(), "received already");
        assert!(s
            .accept(Fresh {
                partition: 9,
                offset: 0,
                epoch: 1,
                message: Message::new("x")
            })
            .is_none());
    }

    #[test]
    fn a_transaction_moves_past_its_own_records_only() {
        let mut s = State::default();
        s.assign(0, Some(0));
        let d: Vec<_> = (0..3).map(|o| s.accept(fresh(&s, 0, o)).unwrap()).collect();
        let (t0, t1, t2) = (tok(&d[0]), tok(&d[1]), tok(&d[2]));
        assert_eq!(
            s.ack_in_tx(&[&t1]).unwrap(),
            [Position {
                partition: 0,
                offset: 0
            }]
        );
        assert_eq!(
            s.ack_in_tx(&[&t0]).unwrap(),
            [Position {
                partition: 0,
                offset: 1
            }],
            "t1's transaction may not have committed"
        );
        assert_eq!(s.ack_in_tx(&[&t0]), Err(1), "not out any more");
        s.release(&t1); // its transaction failed
        let again = s.redos(10, Instant::now());
        assert_eq!(again.len(), 1);
        assert_eq!(again[0].attempt, 1, "a release counts no attempt");
        s.finish(&[&t0], true);
        assert_eq!(
            s.finish(&[&tok(&again[0]), &t2], false),
            [Position {
                partition: 0,
                offset: 3
            }]
        );
    }

    #[test]
    fn a_reset_past_records_forgets_their_delivery_counts() {
        let mut s = State::default();
        s.assign(0, Some(0));
        s.assign(1, Some(0));
        for o in 0..3 {
            s.accept(fresh(&s, 0, o)).unwrap();
        }
        s.accept(fresh(&s, 1, 0)).unwrap();
        // Offsets 0 and 1 were committed by a transaction of the old epoch.
        s.assign(0, Some(2));
        let mut kept: Vec<_> = s.tries.keys().copied().collect();
        kept.sort_unstable();
        assert_eq!(kept, [(0, 2), (1, 0)], "only what can be read again");
        assert_eq!(s.accept(fresh(&s, 0, 2)).unwrap().attempt, 2);
        // Reading from the earliest or latest record: where it began is the first accepted.
        s.assign(1, None);
        s.accept(fresh(&s, 1, 4)).unwrap();
        let mut kept: Vec<_> = s.tries.keys().copied().collect();
        kept.sort_unstable();
        assert_eq!(kept, [(0, 2), (1, 4)]);
    }

    #[test]
    fn a_retry_waits_its_delay_and_counts_an_attempt() {
        let mut s = State::default();
        s.assign(1, Some(0));
        let d = s.accept(fresh(&s, 1, 0)).unwrap();
        let now = Instant::now();
        assert!(s.retry(&tok(&d), now + Duration::from_secs(5)));
        assert!(s.redos(10, now).is_empty());
        let again = s.redos(10, now + Duration::from_secs(5));
        assert_eq!(again[0].attempt, 2);
        assert!(!s.retry(&tok(&d), now), "the first receipt is stale");
        s.assign(1, Some(0));
        let third = s.accept(fresh(&s, 1, 0)).unwrap();
        assert_eq!(third.attempt, 3, "attempts survive a reset");
        s.revoke(1);
        assert!(s.finish(&[&tok(&third)], false).is_empty());
    }
}
