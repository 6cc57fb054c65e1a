//! What a run measures with: the clock of publishes and commits (latency, progress), the
//! process's CPU time and peak RSS, percentiles.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::bail;
use justonce::{CommitObserver, Delivery, Message};
use tokio::sync::Notify;

/// When each message was published, and the commits seen so far.
#[derive(Default)]
pub(crate) struct Clock {
    pub(crate) sent: Mutex<HashMap<String, Instant>>,
    pub(crate) latencies_ms: Mutex<Vec<f64>>,
    pub(crate) committed: AtomicU64,
    pub(crate) progress: Notify,
}

impl Clock {
    pub(crate) fn sent(&self, messages: &[Message]) {
        let now = Instant::now();
        let mut sent = self.sent.lock().unwrap_or_else(|e| e.into_inner());
        for m in messages {
            if let Some(id) = m.id() {
                sent.insert(id.as_str().to_owned(), now);
            }
        }
    }

    pub(crate) fn committed<'a>(&self, ids: impl Iterator<Item = &'a str>) {
        let now = Instant::now();
        let mut n = 0;
        {
            let mut sent = self.sent.lock().unwrap_or_else(|e| e.into_inner());
            let mut lat = self.latencies_ms.lock().unwrap_or_else(|e| e.into_inner());
            for id in ids {
                n += 1;
                if let Some(t) = sent.remove(id) {
                    lat.push(now.duration_since(t).as_secs_f64() * 1e3);
                }
            }
        }
        self.committed.fetch_add(n, Ordering::SeqCst);
        self.progress.notify_waiters();
    }

    pub(crate) async fn wait_for(&self, target: u64, limit: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + limit;
        while self.committed.load(Ordering::SeqCst) < target {
            if Instant::now() > deadline {
                bail!(
                    "only {} of {target} messages committed after {limit:?}",
                    self.committed.load(Ordering::SeqCst)
                );
            }
            let notified = self.progress.notified();
            if self.committed.load(Ordering::SeqCst) >= target {
                break;
            }
            let _ = tokio::time::timeout(Duration::from_millis(50), notified).await;
        }
        Ok(())
    }
}

/// Tells the clock what each batch committed.
pub(crate) struct CommitClock(pub(crate) Arc<Clock>);

impl CommitObserver for CommitClock {
    fn committed(&self, batch: &[&Delivery]) {
        self.0.committed(
            batch
                .iter()
                .filter_map(|d| d.message.id())
                .map(|i| i.as_str()),
        );
    }
}

/// Process CPU time (user + system) so far, from `/proc/self/stat` (clock ticks of 10 ms).
pub(crate) fn cpu_seconds() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return f64::NAN;
    };
    // The command name may hold spaces: count fields after its closing parenthesis.
    let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
        return f64::NAN;
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<f64>().ok());
    // utime and stime are fields 14 and 15 of stat(5); `rest` starts at field 3.
    match (ticks(11), ticks(12)) {
        (Some(u), Some(s)) => (u + s) / 100.0,
        _ => f64::NAN,
    }
}

/// Peak resident set size of this process in MiB (`VmHWM`).
pub(crate) fn peak_rss_mb() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        })
        .map_or(f64::NAN, |kb| kb / 1024.0)
}

pub(crate) fn percentile(sorted: &[f64], p: usize) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[(sorted.len() * p / 100).min(sorted.len() - 1)]
}

/// The median of the finite values of `v`; NaN when there are none.
pub(crate) fn median(mut v: Vec<f64>) -> f64 {
    v.retain(|x| x.is_finite());
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let m = v.len() / 2;
    if v.len() % 2 == 1 {
        v[m]
    } else {
        (v[m - 1] + v[m]) / 2.0
    }
}
