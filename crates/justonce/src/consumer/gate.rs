//! The batches of one consumer that name the same lock keys run one after the other.
//!
//! Batches in lock order (`Handler::lock_key`) that share a row wait for each other in the
//! database anyway: the later one holds its transaction, its connection and every row it
//! locked before the shared one while it waits. On a hot set of rows, where nearly every
//! pair of batches shares one, `concurrency(4)` then ran at 0.67 of `concurrency(1)` on
//! the PostgreSQL queue. The gate makes the later batch wait here instead, before its
//! `BEGIN`, holding nothing: batches that share no key still run side by side, so the same
//! default serves a spread set (every batch at once) and a hot set (one at a time, with the
//! next one's receive and the last one's acks beside it).
//!
//! A batch waits only for batches that entered before it (first come, first served), so
//! no two wait for each other and none waits forever behind later ones. Batches whose
//! messages name no key pass at once: the store's turns keep those apart.

use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

/// The keys of the batches in flight, in the order they entered.
#[derive(Debug, Default)]
pub(crate) struct Gate {
    held: Mutex<Held>,
    left: Notify,
}

#[derive(Debug, Default)]
struct Held {
    next: u64,
    /// (ticket, the batch's keys, sorted and without repeats).
    batches: Vec<(u64, Arc<[String]>)>,
}

impl Held {
    /// Whether a batch that entered before `ticket` holds one of `keys`.
    fn blocked(&self, ticket: u64, keys: &[String]) -> bool {
        self.batches
            .iter()
            .take_while(|(t, _)| *t < ticket)
            .any(|(_, theirs)| share(theirs, keys))
    }
}

/// Whether two sorted lists share an item.
fn share(a: &[String], b: &[String]) -> bool {
    let (mut i, mut j) = (0, 0);
    while i < a.len() && j < b.len() {
        match a[i].cmp(&b[j]) {
            std::cmp::Ordering::Less => i += 1,
            std::cmp::Ordering::Greater => j += 1,
            std::cmp::Ordering::Equal => return true,
        }
    }
    false
}

/// A batch's place at the gate: it leaves when dropped.
#[derive(Debug)]
pub(crate) struct Pass<'a> {
    gate: &'a Gate,
    ticket: Option<u64>,
}

impl Drop for Pass<'_> {
    fn drop(&mut self) {
        let Some(ticket) = self.ticket else { return };
        let mut held = self.gate.held.lock().unwrap_or_else(|p| p.into_inner());
        held.batches.retain(|(t, _)| *t != ticket);
        drop(held);
        self.gate.left.notify_waiters();
    }
}

impl Gate {
    /// Waits until no batch that entered before this one holds one of `keys` (sorted, no
    /// repeats); the batch holds them until the pass is dropped. No keys: passes at once.
    pub(crate) async fn enter(&self, keys: Vec<String>) -> Pass<'_> {
        if keys.is_empty() {
            return Pass {
                gate: self,
                ticket: None,
            };
        }
        let keys: Arc<[String]> = keys.into();
        let ticket = {
            let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
            let ticket = held.next;
            held.next += 1;
            held.batches.push((ticket, keys.clone()));
            ticket
        };
        // The pass exists before the first wait, so that a batch dropped while it waits
        // (a shutdown) leaves the gate too.
        let pass = Pass {
            gate: self,
            ticket: Some(ticket),
        };
        loop {
            let left = self.left.notified();
            tokio::pin!(left);
            // Registered before the look, so that a batch leaving in between wakes this one.
            left.as_mut().enable();
            if !self
                .held
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .blocked(ticket, &keys)
            {
                return pass;
            }
            left.await;
        }
    }

    /// How many batches are at the gate, waiting or through it.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.held.lock().unwrap().batches.len()
    }
}

/// A batch's lock keys as the gate takes them, from the keys of its messages in the order
/// `receive_batch` sorted them (`None` first): without the messages that name none, and
/// without repeats.
pub(crate) fn keys(sorted: impl IntoIterator<Item = Option<String>>) -> Vec<String> {
    let mut keys: Vec<String> = sorted.into_iter().flatten().collect();
    keys.dedup();
    keys
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn k(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn sorted_lists_share_an_item_only_when_they_do() {
        assert!(share(&k(&["a", "c", "e"]), &k(&["b", "e"])));
        assert!(!share(&k(&["a", "c", "e"]), &k(&["b", "d", "f"])));
        assert!(!share(&k(&[]), &k(&["a"])));
        assert_eq!(
            keys([None, Some("a".into()), Some("b".into()), Some("b".into())]),
            k(&["a", "b"])
        );
    }

    #[tokio::test]
    async fn a_batch_waits_only_for_an_earlier_one_that_shares_a_key() {
        let gate = Arc::new(Gate::default());
        let first = gate.enter(k(&["a", "b"])).await;
        // Shares no key: through at once.
        let apart = tokio::time::timeout(Duration::from_secs(1), gate.enter(k(&["c"])))
            .await
            .expect("a batch with other keys waited");
        // Shares "b": waits until the first leaves.
        let g = gate.clone();
        let later = tokio::spawn(async move {
            let _pass = g.enter(k(&["b", "z"])).await;
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!later.is_finished(), "a batch sharing a key did not wait");
        assert_eq!(gate.len(), 3);
        drop(first);
        tokio::time::timeout(Duration::from_secs(1), later)
            .await
            .expect("the waiting batch was not woken when the first left")
            .unwrap();
        drop(apart);
        assert_eq!(gate.len(), 0);
    }

    #[tokio::test]
    async fn no_keys_pass_at_once_and_a_later_batch_never_blocks_an_earlier_one() {
        let gate = Arc::new(Gate::default());
        let _a = gate.enter(k(&["x"])).await;
        let _none = tokio::time::timeout(Duration::from_millis(100), gate.enter(vec![]))
            .await
            .expect("a batch without keys waited");
        assert_eq!(gate.len(), 1);
        // b waits for a; c (after b, sharing only with b) waits for b, not the other way round.
        let g = gate.clone();
        let b = tokio::spawn(async move {
            let _p = g.enter(k(&["x", "y"])).await;
            tokio::time::sleep(Duration::from_millis(20)).await;
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        let g = gate.clone();
        let c = tokio::spawn(async move {
            let _p = g.enter(k(&["y"])).await;
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!b.is_finished() && !c.is_finished());
        drop(_a);
        tokio::time::timeout(Duration::from_secs(1), async {
            b.await.unwrap();
            c.await.unwrap();
        })
        .await
        .expect("the batches behind the first did not run in turn");
    }
}
