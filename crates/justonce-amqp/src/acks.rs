//! Which acks settle a set of delivery tags: one `multiple` ack over the oldest run, single
//! acks for the rest. Pure, tested below without a broker.

use std::collections::BTreeSet;

/// The acks that settle `wanted`, tags of the current channel: a `multiple` ack up to the
/// last tag of the longest run of the oldest outstanding tags that are all wanted, then a
/// single ack for each other wanted tag. Takes them out of `outstanding`. A tag that is not
/// outstanding (acked already) is skipped: acking a tag the broker no longer knows closes
/// the channel, and a `multiple` ack must never cover a tag that is not wanted.
pub(crate) fn plan(
    outstanding: &mut BTreeSet<u64>,
    wanted: impl IntoIterator<Item = u64>,
) -> (Option<u64>, Vec<u64>) {
    let wanted: BTreeSet<u64> = wanted
        .into_iter()
        .filter(|t| outstanding.contains(t))
        .collect();
    let mut upto = None;
    for t in outstanding.iter() {
        if wanted.contains(t) {
            upto = Some(*t);
        } else {
            break;
        }
    }
    for t in &wanted {
        outstanding.remove(t);
    }
    let singles = wanted
        .into_iter()
        .filter(|t| upto.is_none_or(|u| *t > u))
        .collect();
    (upto, singles)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Outstanding, wanted -> multiple up to, singles, outstanding after.
    type Case = (
        &'static [u64],
        &'static [u64],
        Option<u64>,
        &'static [u64],
        &'static [u64],
    );

    #[test]
    fn the_oldest_run_goes_in_one_multiple_ack_and_nothing_else_is_covered() {
        let cases: [Case; 6] = [
            (&[1, 2, 3, 4, 5], &[1, 2, 3], Some(3), &[], &[4, 5]),
            (&[1, 2, 3, 4, 5], &[2, 3], None, &[2, 3], &[1, 4, 5]),
            (&[1, 2, 3, 4, 5], &[4, 1, 2], Some(2), &[4], &[3, 5]),
            (&[1, 2, 3], &[9], None, &[], &[1, 2, 3]),
            (&[1, 2, 3], &[1, 1, 2, 2], Some(2), &[], &[3]),
            (&[], &[1], None, &[], &[]),
        ];
        for (out, wanted, upto, singles, after) in cases {
            let mut outstanding: BTreeSet<u64> = out.iter().copied().collect();
            let (m, s) = plan(&mut outstanding, wanted.iter().copied());
            assert_eq!(
                (m, s.as_slice()),
                (upto, singles),
                "outstanding {out:?}, wanted {wanted:?}"
            );
            assert_eq!(outstanding.into_iter().collect::<Vec<_>>(), after);
        }
    }
}
