//! What the lab and its processes (workers, the producer, relays) say to each other, in one
//! place: the environment variable that gives a process its fault point, and the stderr
//! lines the lab acts on.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::Context as _;
use justonce::FaultPoint;

/// The environment variable that makes a process pause at a fault point:
/// `POINT:MS[:BATCH]`, POINT one of a worker's `after-ack`, `before-commit`, `after-commit`,
/// a relay's `after-confirm` or the producer's `after-enqueue`.
pub(crate) const FAULT_PAUSE_ENV: &str = "JUSTONCE_FAULT_PAUSE";

/// A worker's line once it consumes; the lab starts its publisher after every worker's.
pub(crate) const READY: &str = "justonce-worker ready";

/// The start of a worker's line at its fault point (`justonce-fault-point POINT batch=N`).
pub(crate) const AT_FAULT_POINT: &str = "justonce-fault-point";

/// A point where a process of the lab can be made to wait for its SIGKILL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LabPoint {
    /// A worker's, in its batch.
    Consumer(FaultPoint),
    /// A relay's: its pass's publishes confirmed, not yet marked sent.
    AfterConfirm,
    /// The producer's: a chunk of orders and their outbox rows committed.
    AfterEnqueue,
}

impl LabPoint {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            LabPoint::Consumer(p) => p.as_str(),
            LabPoint::AfterConfirm => "after-confirm",
            LabPoint::AfterEnqueue => "after-enqueue",
        }
    }
}

/// What [`FAULT_PAUSE_ENV`] says: pause `pause` at `point`, of every batch (pass, chunk) or
/// of the `only`-th one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FaultPause {
    pub(crate) point: LabPoint,
    pub(crate) pause: Duration,
    pub(crate) only: Option<u64>,
}

impl FaultPause {
    /// Reads `POINT:MS[:BATCH]`.
    pub(crate) fn parse(spec: &str) -> anyhow::Result<Self> {
        let mut parts = spec.split(':');
        let (Some(point), Some(ms)) = (parts.next(), parts.next()) else {
            anyhow::bail!("{FAULT_PAUSE_ENV} must be POINT:MS[:BATCH]");
        };
        let only = parts
            .next()
            .map(|b| b.parse::<u64>())
            .transpose()
            .with_context(|| format!("{FAULT_PAUSE_ENV}: BATCH must be a number"))?;
        let point = point_named(point).with_context(|| {
            format!("unknown fault point `{point}`: use after-ack, before-commit, after-commit, after-confirm or after-enqueue")
        })?;
        let ms: u64 = ms
            .parse()
            .with_context(|| format!("{FAULT_PAUSE_ENV}: MS must be a number"))?;
        Ok(FaultPause {
            point,
            pause: Duration::from_millis(ms),
            only,
        })
    }

    /// The value of [`FAULT_PAUSE_ENV`] that [`FaultPause::parse`] reads back.
    pub(crate) fn to_env(self) -> String {
        let mut s = format!("{}:{}", self.point.as_str(), self.pause.as_millis());
        if let Some(n) = self.only {
            s.push_str(&format!(":{n}"));
        }
        s
    }
}

/// A process's side of [`FAULT_PAUSE_ENV`]: it counts the times it passes the point (with
/// work in hand) and, at the one asked for, says so on stderr and waits for the lab's
/// SIGKILL. The workers', the relays' and the producer's hooks all call it.
#[derive(Debug)]
pub(crate) struct Pauser {
    at: FaultPause,
    reached: AtomicU64,
}

impl Pauser {
    /// From [`FAULT_PAUSE_ENV`]: none when it is not set.
    pub(crate) fn from_env() -> anyhow::Result<Option<Self>> {
        let Ok(spec) = std::env::var(FAULT_PAUSE_ENV) else {
            return Ok(None);
        };
        Ok(Some(Pauser {
            at: FaultPause::parse(&spec)?,
            reached: AtomicU64::new(0),
        }))
    }

    /// The process is at `point` with `work` items (a batch, a pass's rows, a chunk's
    /// orders); passes without work are not counted.
    pub(crate) async fn at(&self, point: LabPoint, work: u64) {
        if point != self.at.point || work == 0 {
            return;
        }
        let n = self.reached.fetch_add(1, Ordering::Relaxed) + 1;
        if self.at.only.is_some_and(|only| only != n) {
            return;
        }
        {
            use std::io::Write as _;
            let mut err = std::io::stderr().lock();
            let _ = writeln!(err, "{}", at_fault_point(point, work));
            let _ = err.flush();
        }
        tokio::time::sleep(self.at.pause).await;
    }
}

/// The fault point of that name.
fn point_named(name: &str) -> Option<LabPoint> {
    [
        LabPoint::Consumer(FaultPoint::AfterAck),
        LabPoint::Consumer(FaultPoint::BeforeCommit),
        LabPoint::Consumer(FaultPoint::AfterCommit),
        LabPoint::AfterConfirm,
        LabPoint::AfterEnqueue,
    ]
    .into_iter()
    .find(|p| p.as_str() == name)
}

/// The line a process prints at its fault point.
pub(crate) fn at_fault_point(point: LabPoint, batch: u64) -> String {
    format!("{AT_FAULT_POINT} {} batch={batch}", point.as_str())
}

/// What a worker's stderr line tells the lab.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Said {
    /// It consumes.
    Ready,
    /// It waits at its fault point.
    AtFaultPoint,
    /// It handed a batch back for a schema error (a `kind=schema` log line).
    SchemaPause,
    /// Anything else.
    Other,
}

/// What the consumer logs with a batch it handed back on a schema error.
const SCHEMA_KIND: &str = "kind=schema";

/// Whether a worker's stderr line is about the schema: the consumer's pause on it
/// (`kind=schema`), or the database's word for a missing table (PostgreSQL's "does not
/// exist", MariaDB's "doesn't exist") in an error a worker exits with.
pub(crate) fn about_schema(line: &str) -> bool {
    line.contains(SCHEMA_KIND) || line.contains("does not exist") || line.contains("doesn't exist")
}

/// Reads one stderr line of a worker.
pub(crate) fn said(line: &str) -> Said {
    if line.starts_with(AT_FAULT_POINT) {
        Said::AtFaultPoint
    } else if line.starts_with(READY) {
        Said::Ready
    } else if line.contains(SCHEMA_KIND) {
        // The consumer's own line for a batch handed back on the schema: it pauses.
        Said::SchemaPause
    } else {
        Said::Other
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fault_pause_reads_back_what_the_lab_writes() {
        for spec in [
            "after-commit:600000:3",
            "before-commit:1000",
            "after-ack:0:1",
            "after-confirm:600000:2",
            "after-enqueue:600000:3",
        ] {
            assert_eq!(FaultPause::parse(spec).unwrap().to_env(), spec);
        }
        for bad in [
            "after-commit",
            "later:10",
            "after-commit:soon",
            "after-commit:10:x",
        ] {
            assert!(FaultPause::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_lab_reads_the_lines_the_worker_prints() {
        assert_eq!(
            said(&at_fault_point(
                LabPoint::Consumer(FaultPoint::AfterCommit),
                3
            )),
            Said::AtFaultPoint
        );
        assert_eq!(said(READY), Said::Ready);
        assert_eq!(
            said("ERROR justonce: batch failed kind=schema error=relation missing"),
            Said::SchemaPause
        );
        assert_eq!(said("INFO something else"), Said::Other);
    }
}
