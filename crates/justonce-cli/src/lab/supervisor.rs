//! The worker processes of a scenario: how one is started, read, killed and stopped.

use std::process::Stdio;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use justonce::{FaultPoint, Semantics};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::mpsc;

use super::protocol::{said, FaultPause, LabPoint, Said, FAULT_PAUSE_ENV};

/// Deliveries per worker batch: small, so that the workers' transactions, which pay into the
/// same 100 accounts, deadlock each other less often.
const BATCH: usize = 20;
/// The workers' longest pause after failed batches. A pausing worker on RabbitMQ still holds
/// the deliveries it prefetched, so the drain waits longer than this before it calls the
/// pipeline quiet.
const BACKOFF_MAX: Duration = Duration::from_secs(2);

/// Waits until every worker has said it is consuming; fault-point marks that arrive
/// meanwhile are dropped (their workers are gone or will be replaced).
pub(crate) async fn wait_ready(
    marks: &mut mpsc::UnboundedReceiver<Mark>,
    workers: &[Worker],
) -> anyhow::Result<()> {
    let mut ready = 0;
    let deadline = Instant::now() + Duration::from_secs(60);
    while ready < workers.len() {
        match tokio::time::timeout_at(deadline.into(), marks.recv()).await {
            Ok(Some(Mark::Ready)) => ready += 1,
            Ok(Some(Mark::FaultPoint(..))) => {}
            _ => {
                let tails = tails(workers);
                bail!(
                    "the workers did not start within 60 s:\n{}",
                    tails.join("\n")
                );
            }
        }
    }
    Ok(())
}

/// How to start a worker.
pub(crate) struct WorkerSpec {
    pub(crate) exe: std::path::PathBuf,
    pub(crate) transport: String,
    pub(crate) store: String,
    pub(crate) queue: String,
    pub(crate) consumer: String,
    pub(crate) tables: String,
    pub(crate) semantics: Semantics,
    pub(crate) lease: Duration,
    /// The RabbitMQ topology flags.
    pub(crate) topology: Vec<String>,
    /// `--ack-in-transaction`: on Kafka, the positions in the store.
    pub(crate) positions_in_store: bool,
    /// On Kafka, the workers in all: slot i reads the partitions p with p mod K = i,
    /// assigned by hand (tansu 0.6 keeps a killed member in the group for good).
    pub(crate) kafka_workers: Option<usize>,
    /// Batches handed back for a schema error, as the workers logged them.
    pub(crate) schema_pauses: Arc<std::sync::atomic::AtomicU64>,
    /// `--metrics-addr`: where the workers serve their metrics (port + slot).
    pub(crate) metrics: Option<std::net::SocketAddr>,
}

/// Partitions of the lab's topic on Kafka (the transport's default).
pub(crate) const KAFKA_PARTITIONS: usize = justonce::kafka::DEFAULT_PARTITIONS as usize;

impl WorkerSpec {
    /// Starts a worker in `slot`; with `kill`, it stops at that point of its n-th batch and
    /// says so on stderr, where a reader task passes it on as `(slot, generation)`.
    pub(crate) fn spawn(
        &self,
        slot: usize,
        generation: u64,
        kill: Option<(FaultPoint, u32)>,
        marks: mpsc::UnboundedSender<Mark>,
    ) -> anyhow::Result<Worker> {
        let mut cmd = Command::new(&self.exe);
        // The URLs go in the environment, never on a command line (crate::secrets).
        cmd.arg("worker")
            .env("JUSTONCE_TRANSPORT_URL", &self.transport)
            .env("JUSTONCE_STORE_URL", &self.store)
            .args([
                "--queue",
                &self.queue,
                "--consumer",
                &self.consumer,
                "--tables",
                &self.tables,
            ])
            // A slot's name outlives its worker: the replacement of a killed worker takes the
            // entries it held back at once (on a Redis stream; elsewhere the name is unused).
            .args(["--consumer-name", &format!("{}-w{slot}", self.consumer)])
            .args([
                "--semantics",
                self.semantics.as_str(),
                "--batch-size",
                &BATCH.to_string(),
            ])
            .args([
                "--lease-ms",
                &self.lease.as_millis().to_string(),
                "--audit",
                "--no-setup",
            ])
            .args(["--backoff-max-ms", &BACKOFF_MAX.as_millis().to_string()])
            .args(self.positions_in_store.then_some("--ack-in-transaction"))
            .args(self.kafka_workers.into_iter().flat_map(|k| {
                let mine: Vec<String> = (0..KAFKA_PARTITIONS)
                    .filter(|p| p % k == slot)
                    .map(|p| p.to_string())
                    .collect();
                ["--kafka-partitions".to_owned(), mine.join(",")]
            }))
            .args(self.metrics.into_iter().flat_map(|base| {
                let addr = super::scrape::worker_addr(base, slot).to_string();
                // The lab reads the dead letters itself; the workers leave them alone.
                [
                    "--metrics-addr".to_owned(),
                    addr,
                    "--metrics-poll-secs".into(),
                    "0".into(),
                ]
            }))
            .args(&self.topology);
        Worker::start(
            cmd,
            "a worker",
            slot,
            generation,
            kill.map(|(p, n)| (LabPoint::Consumer(p), n)),
            marks,
            self.schema_pauses.clone(),
        )
    }
}

impl Worker {
    /// Starts `cmd` (a worker, the producer, a relay) in `slot`; with `kill`, it stops at
    /// that point the n-th time there and says so on stderr, where a reader task passes it
    /// on as `(slot, generation)`.
    pub(crate) fn start(
        mut cmd: Command,
        what: &str,
        slot: usize,
        generation: u64,
        kill: Option<(LabPoint, u32)>,
        marks: mpsc::UnboundedSender<Mark>,
        schema_pauses: Arc<std::sync::atomic::AtomicU64>,
    ) -> anyhow::Result<Worker> {
        cmd.stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        match kill {
            Some((point, n)) => {
                let pause = FaultPause {
                    point,
                    pause: Duration::from_secs(600),
                    only: Some(u64::from(n)),
                };
                cmd.env(FAULT_PAUSE_ENV, pause.to_env())
            }
            None => cmd.env_remove(FAULT_PAUSE_ENV),
        };
        let mut child = cmd
            .spawn()
            .with_context(|| format!("cannot start {what} process"))?;
        let stderr = child.stderr.take().context("the child's stderr")?;
        let tail = Arc::new(Mutex::new(Vec::<String>::new()));
        let tail2 = tail.clone();
        let metrics = Arc::new(Mutex::new(None));
        let metrics2 = metrics.clone();
        // JUSTONCE_LAB_LOGS=DIR keeps every line each process wrote, one file per start,
        // for a run that has to be looked at afterwards (the tail above holds 20 lines).
        let mut keep = logs_dir().and_then(|dir| {
            let name = format!("{}-{slot}-{generation}.log", what.replace(' ', "-"));
            std::fs::File::create(dir.join(name)).ok()
        });
        let reader = tokio::spawn(async move {
            let mut lines = BufReader::new(stderr).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                if let Some(f) = keep.as_mut() {
                    use std::io::Write as _;
                    let _ = writeln!(f, "{line}");
                }
                match said(&line) {
                    Said::SchemaPause => {
                        schema_pauses.fetch_add(1, Ordering::SeqCst);
                    }
                    Said::AtFaultPoint => {
                        let _ = marks.send(Mark::FaultPoint(slot, generation));
                    }
                    Said::Ready => {
                        let _ = marks.send(Mark::Ready);
                    }
                    Said::Other => {
                        if let Some(addr) = line.strip_prefix(crate::serve::LISTENING) {
                            *metrics2.lock().unwrap_or_else(|e| e.into_inner()) =
                                addr.trim().parse().ok();
                        }
                    }
                }
                let mut t = tail2.lock().unwrap_or_else(|e| e.into_inner());
                t.push(line);
                let n = t.len();
                if n > 20 {
                    t.drain(..n - 20);
                }
            }
        });
        Ok(Worker {
            child,
            generation,
            kill_point: kill.map(|(p, _)| p),
            tail,
            reader,
            metrics,
            group: false,
            killed: false,
        })
    }

    /// Starts `cmd` (the publisher, a user's command) with no fault point: nothing it says
    /// is acted on, its last lines are kept.
    pub(crate) fn start_plain(
        cmd: Command,
        what: &str,
        slot: usize,
        generation: u64,
    ) -> anyhow::Result<Worker> {
        let (marks, _) = mpsc::unbounded_channel();
        Worker::start(cmd, what, slot, generation, None, marks, Arc::default())
    }

    /// Starts `cmd` (a user's command under `sh -c`, which may fork) as a process group of
    /// its own: its kills, pauses and SIGTERM reach every process it started, and a group
    /// still running when the worker is dropped is killed.
    pub(crate) fn start_group(
        mut cmd: Command,
        what: &str,
        slot: usize,
        generation: u64,
    ) -> anyhow::Result<Worker> {
        cmd.process_group(0);
        let mut w = Worker::start_plain(cmd, what, slot, generation)?;
        w.group = true;
        Ok(w)
    }
}

/// The last stderr lines of each worker, for an error message.
pub(crate) fn tails(workers: &[Worker]) -> Vec<String> {
    workers.iter().map(Worker::tail).collect()
}

/// What a worker says on stderr that the lab acts on.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Mark {
    /// It is consuming.
    Ready,
    /// It stopped at its fault point: kill it now. `(slot, generation)`.
    FaultPoint(usize, u64),
}

/// A running process of the lab: a worker, the producer or a relay.
pub(crate) struct Worker {
    pub(crate) child: Child,
    pub(crate) generation: u64,
    pub(crate) kill_point: Option<LabPoint>,
    tail: Arc<Mutex<Vec<String>>>,
    /// The task reading its stderr into `tail`; it ends at the process's last line.
    reader: tokio::task::JoinHandle<()>,
    /// Where it serves its metrics, once it has said so.
    metrics: Arc<Mutex<Option<std::net::SocketAddr>>>,
    /// Its signals go to its process group ([`Worker::start_group`]).
    group: bool,
    /// The lab killed it ([`Worker::kill`]): its exit is not one of its own.
    pub(crate) killed: bool,
}

impl Worker {
    /// The last lines the process wrote on stderr.
    pub(crate) fn tail(&self) -> String {
        let t = self.tail.lock().unwrap_or_else(|e| e.into_inner());
        format!(
            "  [{}]\n    {}",
            self.pid().map_or("exited".into(), |p| p.to_string()),
            t.join("\n    ")
        )
    }

    /// The last lines of a process that exited, once its stderr is read to the end (at
    /// most a second after the exit).
    pub(crate) async fn last_words(&mut self) -> String {
        let _ = tokio::time::timeout(Duration::from_secs(1), &mut self.reader).await;
        self.tail()
    }

    /// Whether the last thing it said before it exited was about the schema (a table that
    /// does not exist): an exit the schema fault must never cause. An exit for any other
    /// reason (it could not connect during a cut or a partition) is a restart a
    /// supervisor makes, not a schema failure.
    pub(crate) fn exited_on_schema(&self) -> bool {
        let t = self.tail.lock().unwrap_or_else(|e| e.into_inner());
        t.iter()
            .rev()
            .take(2)
            .any(|l| super::protocol::about_schema(l))
    }

    pub(crate) fn metrics_addr(&self) -> Option<std::net::SocketAddr> {
        *self.metrics.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// What its signals are sent to: its pid, or `-PGID` for a group; none once it exited.
    fn target(&self) -> Option<String> {
        let pid = self.pid()?;
        Some(if self.group {
            format!("-{pid}")
        } else {
            pid.to_string()
        })
    }

    /// SIGKILL, and wait for it; its exit then counts as the lab's, not its own.
    pub(crate) async fn kill(&mut self) {
        self.killed = true;
        if let Some(t) = self.target() {
            send_signal(&t, "KILL");
        }
        let _ = self.child.wait().await;
    }

    /// SIGSTOP, then SIGCONT after `span`, in a task counted in `busy`; false if it had
    /// exited already.
    pub(crate) fn pause(&self, span: Duration, busy: &Arc<AtomicUsize>) -> bool {
        let Some(t) = self.target() else {
            return false;
        };
        send_signal(&t, "STOP");
        busy.fetch_add(1, Ordering::SeqCst);
        let busy = busy.clone();
        tokio::spawn(async move {
            tokio::time::sleep(span).await;
            send_signal(&t, "CONT");
            busy.fetch_sub(1, Ordering::SeqCst);
        });
        true
    }

    /// SIGTERM: finish the batch in flight, commit, ack, exit; SIGKILL after 15 s.
    pub(crate) async fn terminate(&mut self) {
        if let Some(t) = self.target() {
            // A paused worker takes its SIGTERM only once it runs again.
            send_signal(&t, "CONT");
            send_signal(&t, "TERM");
        }
        if tokio::time::timeout(Duration::from_secs(15), self.child.wait())
            .await
            .is_err()
        {
            self.kill().await;
        }
    }
}

impl Drop for Worker {
    /// `kill_on_drop` reaches the process the lab started; a group is killed whole.
    fn drop(&mut self) {
        if let (true, Some(t)) = (self.group, self.target()) {
            send_signal(&t, "KILL");
        }
    }
}

/// Sends a signal with kill(1) (the workspace forbids `unsafe`, so no libc::kill) to
/// `target`: a pid, or `-PGID` for a process group.
fn send_signal(target: &str, name: &str) {
    let _ = std::process::Command::new("kill")
        .arg(format!("-{name}"))
        .arg("--")
        .arg(target)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

/// `JUSTONCE_LAB_LOGS=DIR`: where a run leaves whole logs (each process's, its own
/// broker's) to be read after it.
pub(crate) fn logs_dir() -> Option<std::path::PathBuf> {
    std::env::var_os("JUSTONCE_LAB_LOGS").map(Into::into)
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn exited(script: &str) -> Worker {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", script]);
        let mut w = Worker::start_plain(cmd, "test", 0, 0).unwrap();
        w.child.wait().await.unwrap();
        w.last_words().await;
        w
    }

    /// A worker that could not connect during a cut is restarted, not counted against
    /// the schema fault; one whose last words were a missing table is (a NATS lab line
    /// failed with "2 workers exited instead of pausing" for two exits of the first kind).
    #[tokio::test]
    async fn only_an_exit_on_a_missing_table_is_the_schema_faults() {
        let net = exited(
            "echo 'paused: kind=schema relation x does not exist' >&2; \
             echo 'ready' >&2; echo 'ok' >&2; \
             echo 'error: cannot connect to NATS at nats://127.0.0.1:1: IO error' >&2; exit 1",
        )
        .await;
        assert!(!net.exited_on_schema());
        let schema =
            exited("echo 'error: relation \"jo_lab_accounts\" does not exist' >&2; exit 1").await;
        assert!(schema.exited_on_schema());
    }
}
