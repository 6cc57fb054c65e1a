//! The verdict of a scenario, from what its data says: lost and duplicated effects, the
//! balances, redeliveries, the dead letters, the schema fault's pauses, the backlog. Pure:
//! tested below as a table.

use std::collections::HashSet;

use justonce::DeadLetter;

use super::scrape::Scraped;

/// What the checker read after the drain.
#[derive(Debug, Clone, Default)]
pub(crate) struct Findings {
    pub(crate) lost: u64,
    pub(crate) duplicate_effects: u64,
    /// The balances add up to the ledger.
    pub(crate) consistent: bool,
    pub(crate) redeliveries: u64,
    /// Dead letters of well-formed orders, and their reasons.
    pub(crate) good_dead: Vec<String>,
    /// Messages still on the transport.
    pub(crate) backlog: u64,
    /// With the schema fault: renames, pauses the workers logged, workers that exited.
    pub(crate) schema: Option<(u64, u64, u64)>,
    /// With `--metrics-addr`: what the workers' metrics said, and what the data says.
    pub(crate) metrics: Option<Counted>,
    /// With the relay class: what happened upstream of the broker.
    pub(crate) relay: Option<Upstream>,
}

/// The relay class's findings: the kills it made, the duplicates the broker delivered
/// (from the audit table) and what the outbox still holds.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Upstream {
    pub(crate) relay_kills: u64,
    pub(crate) producer_kills: u64,
    pub(crate) broker_duplicates: u64,
    /// Rows pending or dead in the outbox after the drain.
    pub(crate) outbox_left: u64,
    /// The broker drops a publish of an id it stored within a window
    /// (`TransportKind::drops_republished_ids`): the relays' re-sends may never reach a
    /// consumer, and a run with no duplicate delivered still shows them absorbed.
    pub(crate) broker_drops_resends: bool,
}

/// The workers' metrics beside the data they must agree with.
#[derive(Debug, Clone, Default)]
pub(crate) struct Counted {
    pub(crate) scraped: Scraped,
    /// Rows in the ledger.
    pub(crate) effects: u64,
    /// Deliveries in the audit table (a lower bound: a worker that cannot write there still
    /// consumes).
    pub(crate) deliveries: u64,
    /// Dead letters on the transport, each copy counted.
    pub(crate) dead_letters: u64,
}

/// Where the metrics disagree with the data. Deliveries received but never counted to an
/// outcome are allowed: a worker killed at a fault point received its batch and never
/// settled it (its redelivery is counted again). Nothing is held against the data when a
/// worker died unscraped.
fn metrics_disagree(c: &Counted) -> Vec<String> {
    let s = &c.scraped;
    let mut why = Vec::new();
    if s.failed_scrapes > 0 {
        why.push(format!("{} worker scrapes failed", s.failed_scrapes));
    }
    if s.unscraped > 0 || s.failed_scrapes > 0 {
        return why;
    }
    if s.applied != c.effects {
        why.push(format!(
            "the metrics count {} deliveries applied, the ledger holds {} effects",
            s.applied, c.effects
        ));
    }
    if s.dead_letter + s.conflict != c.dead_letters {
        why.push(format!(
            "the metrics count {} deliveries dead-lettered, the transport holds {} dead letters",
            s.dead_letter + s.conflict,
            c.dead_letters
        ));
    }
    if s.received < c.deliveries {
        why.push(format!(
            "the metrics count {} deliveries received, fewer than the {} of the audit table",
            s.received, c.deliveries
        ));
    }
    if s.outcomes() > s.received {
        why.push(format!(
            "the metrics count {} outcomes for {} deliveries received",
            s.outcomes(),
            s.received
        ));
    }
    why
}

/// The reasons of the dead letters whose id is not one of the `poison` orders.
pub(crate) fn good_dead(letters: &[DeadLetter], poison: &HashSet<&str>) -> Vec<String> {
    letters
        .iter()
        .filter(|d| {
            d.message
                .id()
                .is_some_and(|id| !poison.contains(id.as_str()))
        })
        .map(|d| d.reason.error.clone())
        .collect()
}

/// Why the scenario failed; empty when it passed.
pub(crate) fn why(f: &Findings) -> Vec<String> {
    let mut why = Vec::new();
    let good_dead = f.good_dead.len();
    if good_dead > 0 && f.lost == 0 {
        why.push(format!(
            "{good_dead} well-formed orders dead-lettered (and applied all the same)"
        ));
    }
    if f.lost > 0 {
        why.push(format!("{} orders lost", f.lost));
        // Well-formed orders in the dead-letter queue are not silently lost: say why.
        if good_dead > 0 {
            let mut reasons = f.good_dead.clone();
            reasons.sort();
            reasons.dedup();
            why.push(format!(
                "{good_dead} of them dead-lettered: {}",
                reasons.join(" / ")
            ));
        }
    }
    if f.duplicate_effects > 0 {
        why.push(format!("{} duplicate effects", f.duplicate_effects));
    }
    if !f.consistent {
        why.push("balances do not add up to the ledger".to_owned());
    }
    if f.redeliveries == 0 {
        why.push("the faults caused no redelivery: the run proves nothing".to_owned());
    }
    if let Some((breaks, pauses, exits)) = f.schema {
        if breaks == 0 {
            why.push("the accounts table was never renamed away".to_owned());
        } else if pauses == 0 {
            why.push("no worker met the renamed table: the run proves nothing".to_owned());
        }
        if exits > 0 {
            why.push(format!(
                "{exits} workers exited instead of pausing until the table came back"
            ));
        }
    }
    if f.backlog > 0 {
        why.push(format!("{} messages never drained", f.backlog));
    }
    if let Some(u) = f.relay {
        if u.relay_kills == 0 {
            why.push("no relay was killed between its confirm and its mark".to_owned());
        }
        if u.producer_kills == 0 {
            why.push("the producer was never killed after its commit".to_owned());
        }
        if u.relay_kills > 0 && u.broker_duplicates == 0 && !u.broker_drops_resends {
            why.push("the broker delivered no duplicate: the run proves nothing".to_owned());
        }
        if u.outbox_left > 0 {
            why.push(format!("{} rows left in the outbox", u.outbox_left));
        }
    }
    if let Some(c) = &f.metrics {
        why.extend(metrics_disagree(c));
    }
    why
}

#[cfg(test)]
mod tests {
    use justonce::{DeadLetterReason, Message};

    use super::*;

    fn passing() -> Findings {
        Findings {
            consistent: true,
            redeliveries: 3,
            ..Findings::default()
        }
    }

    /// A change to a passing run, and what the verdict must then say.
    type Case = (fn(&mut Findings), &'static str);

    #[test]
    fn on_a_broker_that_drops_resent_ids_no_duplicate_delivered_is_not_a_failure() {
        let mut f = passing();
        f.relay = Some(Upstream {
            relay_kills: 2,
            producer_kills: 1,
            broker_duplicates: 0,
            outbox_left: 0,
            broker_drops_resends: true,
        });
        assert!(why(&f).is_empty(), "{:?}", why(&f));
        f.relay = Some(Upstream {
            broker_drops_resends: false,
            ..f.relay.unwrap()
        });
        assert!(why(&f).iter().any(|w| w.contains("proves nothing")));
    }

    #[test]
    fn a_clean_run_passes_and_each_finding_fails_it_with_its_sentence() {
        assert!(why(&passing()).is_empty());
        let relayed = Upstream {
            relay_kills: 2,
            producer_kills: 1,
            broker_duplicates: 40,
            outbox_left: 0,
            broker_drops_resends: false,
        };
        let cases: [Case; 14] = [
            (|f| f.lost = 2, "2 orders lost"),
            (|f| f.duplicate_effects = 1, "1 duplicate effects"),
            (|f| f.consistent = false, "balances do not add up"),
            (|f| f.redeliveries = 0, "the run proves nothing"),
            (|f| f.backlog = 5, "5 messages never drained"),
            (
                |f| f.good_dead = vec!["conflict".into()],
                "1 well-formed orders dead-lettered",
            ),
            (
                |f| {
                    f.lost = 1;
                    f.good_dead = vec!["b".into(), "a".into(), "a".into()]
                },
                "3 of them dead-lettered: a / b",
            ),
            (|f| f.schema = Some((0, 0, 0)), "never renamed away"),
            (
                |f| f.schema = Some((1, 0, 0)),
                "no worker met the renamed table",
            ),
            (|f| f.schema = Some((1, 4, 2)), "2 workers exited"),
            (
                |f| {
                    f.relay = Some(Upstream {
                        relay_kills: 0,
                        producer_kills: 1,
                        ..Upstream::default()
                    })
                },
                "no relay was killed",
            ),
            (
                |f| {
                    f.relay = Some(Upstream {
                        relay_kills: 1,
                        producer_kills: 0,
                        broker_duplicates: 3,
                        outbox_left: 0,
                        broker_drops_resends: false,
                    })
                },
                "the producer was never killed",
            ),
            (
                |f| {
                    f.relay = Some(Upstream {
                        relay_kills: 2,
                        producer_kills: 1,
                        ..Upstream::default()
                    })
                },
                "the broker delivered no duplicate",
            ),
            (
                |f| {
                    f.relay = Some(Upstream {
                        relay_kills: 2,
                        producer_kills: 1,
                        broker_duplicates: 9,
                        outbox_left: 4,
                        broker_drops_resends: false,
                    })
                },
                "4 rows left in the outbox",
            ),
        ];
        for (change, want) in cases {
            let mut f = passing();
            change(&mut f);
            let said = why(&f).join("; ");
            assert!(said.contains(want), "{said:?} should say {want:?}");
        }
        let mut f = passing();
        f.schema = Some((1, 4, 0));
        assert!(
            why(&f).is_empty(),
            "a schema run that paused and came back passes"
        );
        let mut f = passing();
        f.relay = Some(relayed);
        assert!(
            why(&f).is_empty(),
            "a relay run with kills and broker duplicates passes"
        );
    }

    #[test]
    fn metrics_that_disagree_with_the_data_fail_the_run_unless_a_worker_died_unscraped() {
        let agreeing = Counted {
            scraped: Scraped {
                received: 120,
                redelivered: 20,
                applied: 100,
                duplicate: 10,
                dead_letter: 4,
                conflict: 1,
                ..Scraped::default()
            },
            effects: 100,
            deliveries: 120,
            dead_letters: 5,
        };
        let with = |c: &Counted| {
            let mut f = passing();
            f.metrics = Some(c.clone());
            why(&f).join("; ")
        };
        assert_eq!(with(&agreeing), "");
        let mut c = agreeing.clone();
        c.effects = 101;
        assert!(with(&c).contains("100 deliveries applied, the ledger holds 101"));
        let mut c = agreeing.clone();
        c.dead_letters = 7;
        assert!(with(&c).contains("5 deliveries dead-lettered, the transport holds 7"));
        let mut c = agreeing.clone();
        c.deliveries = 121;
        assert!(with(&c).contains("fewer than the 121 of the audit table"));
        let mut c = agreeing.clone();
        c.scraped.retry = 11;
        assert!(with(&c).contains("126 outcomes for 120 deliveries"));
        // A worker killed at a random moment took its counts with it: nothing to hold.
        let mut c = agreeing;
        c.effects = 150;
        c.scraped.unscraped = 1;
        assert_eq!(with(&c), "");
        c.scraped.failed_scrapes = 1;
        assert!(with(&c).contains("1 worker scrapes failed"));
    }

    #[test]
    fn only_well_formed_orders_count_as_wrongly_dead_lettered() {
        let letter = |id: Option<&str>, error: &str| {
            DeadLetter::new(
                match id {
                    Some(id) => Message::new("{}").with_id(id).unwrap(),
                    None => Message::new("{}"),
                },
                DeadLetterReason {
                    error: error.into(),
                    attempts: 1,
                    source_queue: "q".into(),
                    consumer: "c".into(),
                },
            )
        };
        let letters = [
            letter(Some("poison-1"), "bad json"),
            letter(Some("ORD-1"), "conflict"),
            letter(None, "no id"),
        ];
        let poison: HashSet<&str> = ["poison-1"].into_iter().collect();
        assert_eq!(good_dead(&letters, &poison), ["conflict"]);
    }
}
