//! `justonce lab --metrics-addr`: each worker serves its metrics, and the lab scrapes every
//! worker just before it stops one (a kill at a fault point, the graceful stop at the end),
//! summing what they said. The checker holds the sums against the business data: the
//! applied deliveries must be the ledger's effects, the dead-lettered ones the dead letters.

use std::net::SocketAddr;

use serde::Serialize;

use super::supervisor::Worker;
use crate::serve::{get, sum_by};

/// What the workers' `/metrics` said, summed over the scrapes.
#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct Scraped {
    /// Deliveries the consumers received.
    pub(crate) received: u64,
    /// Of them, redeliveries.
    pub(crate) redelivered: u64,
    pub(crate) applied: u64,
    pub(crate) duplicate: u64,
    pub(crate) retry: u64,
    pub(crate) dead_letter: u64,
    pub(crate) conflict: u64,
    pub(crate) released: u64,
    pub(crate) lost: u64,
    /// Workers stopped whose metrics could not be read.
    pub(crate) failed_scrapes: u64,
    /// Workers that died unscraped (a kill at a random moment, a worker that exited): the
    /// sums then miss what they counted, and are not held against the data.
    pub(crate) unscraped: u64,
}

impl Scraped {
    /// Reads `worker`'s metrics and adds them in.
    pub(crate) async fn add(&mut self, worker: &Worker) {
        let Some(addr) = worker.metrics_addr() else {
            self.failed_scrapes += 1;
            return;
        };
        match scrape(addr).await {
            Ok(text) => self.add_text(&text),
            Err(e) => {
                eprintln!("lab: cannot scrape the worker at {addr}: {e:#}");
                self.failed_scrapes += 1;
            }
        }
    }

    fn add_text(&mut self, text: &str) {
        let total = |name: &str| -> u64 { sum_by(text, name, "").values().sum::<f64>() as u64 };
        self.received += total("justonce_deliveries_received_total");
        self.redelivered += total("justonce_redeliveries_total");
        let by = sum_by(text, "justonce_deliveries_total", "outcome");
        let n = |o: &str| by.get(o).copied().unwrap_or(0.0) as u64;
        self.applied += n("applied");
        self.duplicate += n("duplicate");
        self.retry += n("retry");
        self.dead_letter += n("dead_letter");
        self.conflict += n("conflict");
        self.released += n("released");
        self.lost += n("lost");
    }

    /// Every outcome counted.
    pub(crate) fn outcomes(&self) -> u64 {
        self.applied
            + self.duplicate
            + self.retry
            + self.dead_letter
            + self.conflict
            + self.released
            + self.lost
    }
}

async fn scrape(addr: SocketAddr) -> anyhow::Result<String> {
    let (status, body) = get(addr, "/metrics").await?;
    anyhow::ensure!(status == 200, "GET /metrics answered {status}");
    Ok(body)
}

/// The address worker `slot` listens on, from the lab's `--metrics-addr`: port P + slot, or
/// any free port where P is 0.
pub(crate) fn worker_addr(base: SocketAddr, slot: usize) -> SocketAddr {
    let mut addr = base;
    if base.port() != 0 {
        addr.set_port(base.port().saturating_add(slot as u16));
    }
    addr
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scrapes_add_up_and_workers_get_ports_of_their_own() {
        let mut s = Scraped::default();
        let text = "justonce_deliveries_received_total{a=\"x\"} 10\n\
            justonce_redeliveries_total{a=\"x\"} 2\n\
            justonce_deliveries_total{a=\"x\",outcome=\"applied\"} 7\n\
            justonce_deliveries_total{a=\"x\",outcome=\"dead_letter\"} 1\n\
            justonce_deliveries_total{a=\"x\",outcome=\"duplicate\"} 2\n";
        s.add_text(text);
        s.add_text(text);
        assert_eq!((s.received, s.redelivered, s.applied), (20, 4, 14));
        assert_eq!(s.outcomes(), 20);
        let base: SocketAddr = "127.0.0.1:9400".parse().unwrap();
        assert_eq!(worker_addr(base, 2).port(), 9402);
        assert_eq!(worker_addr("127.0.0.1:0".parse().unwrap(), 2).port(), 0);
    }
}
