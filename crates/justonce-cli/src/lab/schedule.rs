//! The plan of a scenario's faults, from its seed: which kills land at a fault point and
//! which at a random moment, and at which share of the orders delivered every other fault
//! fires. Pure: the same seed makes the same plan.

use justonce::{FaultPoint, Semantics};

use super::FaultClass;

/// Where a kill lands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KillAt {
    /// At a fault point of the runtime, announced by the worker.
    Point(FaultPoint),
    /// Whenever the schedule says, wherever the worker is.
    Random,
}

/// `n` kills: at the fault points that matter for `semantics` in turn (between commit and
/// ack, before the commit; after the early ack for at-most-once), every fourth at a random
/// moment instead. With the ack inside the transaction (`acks_in_tx`: a Kafka consumer's
/// positions in the store) a kill after the commit redelivers nothing, so the first kill
/// (a matrix line's only one) is before the commit.
pub(crate) fn kills(n: u32, semantics: Semantics, acks_in_tx: bool) -> Vec<KillAt> {
    use FaultPoint::{AfterAck, AfterCommit, BeforeCommit};
    let points = if semantics == Semantics::AtMostOnce {
        [AfterAck, BeforeCommit, AfterAck]
    } else if acks_in_tx {
        [BeforeCommit, AfterCommit, BeforeCommit]
    } else {
        [AfterCommit, BeforeCommit, AfterCommit]
    };
    (0..n as usize)
        .map(|i| {
            if i % 4 == 3 {
                KillAt::Random
            } else {
                KillAt::Point(points[i % points.len()])
            }
        })
        .collect()
}

/// The fault points of `kills`, in order: the workers carry them one after the other.
pub(crate) fn points(kills: &[KillAt]) -> Vec<FaultPoint> {
    kills
        .iter()
        .filter_map(|k| match k {
            KillAt::Point(p) => Some(*p),
            KillAt::Random => None,
        })
        .collect()
}

/// When everything but the point kills fires: the random kills (as `FaultClass::Kill`) and
/// the other `faults`, shuffled by `rng`, at shares of the orders delivered spread evenly
/// over 10%–70%, the schema fault first: the renamed table must meet work still to do (on
/// a fast transport, at 55% the workers had taken every order before the rename, and the
/// run proved nothing). Latest first, so that the drain loop pops the next one off the end.
pub(crate) fn milestones(
    kills: &[KillAt],
    faults: &[FaultClass],
    rng: &mut fastrand::Rng,
) -> Vec<(f64, FaultClass)> {
    let mut events: Vec<FaultClass> = kills
        .iter()
        .filter(|k| **k == KillAt::Random)
        .map(|_| FaultClass::Kill)
        .chain(faults.iter().copied().filter(|f| *f != FaultClass::Kill))
        .collect();
    rng.shuffle(&mut events);
    events.sort_by_key(|e| *e != FaultClass::Schema); // stable: the rest stay shuffled
    let n = events.len().max(1) as f64;
    let mut schedule: Vec<(f64, FaultClass)> = events
        .into_iter()
        .enumerate()
        .map(|(i, e)| (0.1 + 0.6 * (i as f64 + 0.5) / n, e))
        .collect();
    schedule.reverse();
    schedule
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kills_take_the_fault_points_in_turn_and_every_fourth_is_random() {
        use FaultPoint::{AfterAck, AfterCommit, BeforeCommit};
        use KillAt::{Point, Random};
        assert_eq!(
            kills(5, Semantics::EffectivelyOnce, false),
            [
                Point(AfterCommit),
                Point(BeforeCommit),
                Point(AfterCommit),
                Random,
                Point(BeforeCommit)
            ]
        );
        assert_eq!(
            kills(2, Semantics::AtMostOnce, false),
            [Point(AfterAck), Point(BeforeCommit)]
        );
        assert_eq!(points(&kills(4, Semantics::AtLeastOnce, false)).len(), 3);
        // With the ack in the transaction a kill after the commit redelivers nothing: a
        // matrix line's one kill is before it.
        assert_eq!(
            kills(2, Semantics::EffectivelyOnce, true),
            [Point(BeforeCommit), Point(AfterCommit)]
        );
    }

    #[test]
    fn milestones_are_spread_over_the_run_once_each_and_follow_the_seed() {
        let k = kills(4, Semantics::EffectivelyOnce, false);
        let faults = [
            FaultClass::Pause,
            FaultClass::Cut,
            FaultClass::Kill,
            FaultClass::Schema,
        ];
        let plan = |seed| milestones(&k, &faults, &mut fastrand::Rng::with_seed(seed));
        let m = plan(7);
        // One random kill, and every fault but `Kill` (point kills are not scheduled).
        assert_eq!(m.len(), 4);
        assert_eq!(m.iter().filter(|(_, f)| *f == FaultClass::Kill).count(), 1);
        assert!(m.iter().all(|(at, _)| (0.1..=0.7).contains(at)), "{m:?}");
        assert!(m.windows(2).all(|w| w[0].0 > w[1].0), "latest first: {m:?}");
        assert_eq!(
            m.last().map(|e| e.1),
            Some(FaultClass::Schema),
            "the schema fault first"
        );
        let orders: std::collections::HashSet<Vec<FaultClass>> = (0..20)
            .map(|seed| plan(seed).into_iter().map(|e| e.1).collect())
            .collect();
        assert!(orders.len() > 1, "the rest still shuffled");
        assert_eq!(m, plan(7), "the same seed, the same plan");
        assert!(milestones(&[], &[], &mut fastrand::Rng::with_seed(1)).is_empty());
    }
}
