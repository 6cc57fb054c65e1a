//! How the runtime's long-running parts (a consumer's batch loops, a relay's loops) run
//! their tasks: until a shutdown, or the first task that ends on its own; then every task
//! is told to stop, each finishes what it has in hand, and the first error is the answer.

use std::future::Future;
use std::time::Duration;

use justonce_core::{Error, ErrorKind, Result};
use tokio::sync::watch;
use tokio::task::JoinSet;

/// Tasks that share one stop signal.
pub(crate) struct Supervisor {
    stop_tx: watch::Sender<bool>,
    stop_rx: watch::Receiver<bool>,
    set: JoinSet<Result<()>>,
}

impl Supervisor {
    pub(crate) fn new() -> Self {
        let (stop_tx, stop_rx) = watch::channel(false);
        Supervisor {
            stop_tx,
            stop_rx,
            set: JoinSet::new(),
        }
    }

    /// Spawns `task` with the stop signal: it must return soon once the signal is `true`.
    pub(crate) fn spawn<F>(&mut self, task: impl FnOnce(watch::Receiver<bool>) -> F)
    where
        F: Future<Output = Result<()>> + Send + 'static,
    {
        self.set.spawn(task(self.stop_rx.clone()));
    }

    /// Runs the tasks until `shutdown` resolves or one of them ends, signals stop, and
    /// waits for all; answers the first error. `what` names them in a panic's error.
    pub(crate) async fn run_until(
        mut self,
        what: &'static str,
        shutdown: impl Future<Output = ()>,
    ) -> Result<()> {
        let flatten = |res: std::result::Result<Result<()>, tokio::task::JoinError>| {
            res.map_err(|e| Error::with_source(ErrorKind::Internal, format!("{what} failed"), e))?
        };
        tokio::pin!(shutdown);
        let mut first_error = None;
        tokio::select! {
            _ = &mut shutdown => {}
            Some(res) = self.set.join_next() => first_error = flatten(res).err(),
        }
        let _ = self.stop_tx.send(true);
        while let Some(res) = self.set.join_next().await {
            if let Err(e) = flatten(res) {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}

/// Sleeps `d`, or less when `stop` turns true; answers whether it did.
pub(crate) async fn sleep_or_stop(d: Duration, stop: &mut watch::Receiver<bool>) -> bool {
    tokio::select! {
        _ = tokio::time::sleep(d) => {}
        _ = stop.wait_for(|s| *s) => {}
    }
    *stop.borrow()
}
