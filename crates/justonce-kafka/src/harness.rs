//! A tansu broker of one's own, for tests and fault labs (feature `harness`): on a free
//! port of 127.0.0.1 and a data directory of its own (SQLite storage), killed when
//! dropped, restartable as after a crash, its storage repaired where tansu 0.6.0 needs it
//! ([`STORAGE_REPAIRS`]). The shared broker a machine runs is never touched.

use std::io;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::process::{Child, Command};

/// The tansu version `scripts/services.sh` installs.
pub const TANSU_VERSION: &str = "0.6.0";

/// A tansu broker process this program started.
pub struct OwnBroker {
    child: Option<Child>,
    port: u16,
    /// What it tells clients to connect to: `127.0.0.1:port` unless started behind a
    /// proxy ([`OwnBroker::start_behind`]).
    advertised: String,
    dir: tempfile::TempDir,
}

impl OwnBroker {
    /// Whether the tansu binary is found ([`tansu_binary`]).
    pub fn installed() -> bool {
        tansu_binary().is_some()
    }

    /// Starts tansu on a free port of 127.0.0.1 with a temporary data directory, and waits
    /// until it answers.
    pub async fn start() -> io::Result<Self> {
        let port = free_port()?;
        Self::start_behind(port, format!("127.0.0.1:{port}")).await
    }

    /// Starts tansu on `port` of 127.0.0.1 ([`free_port`] finds one), telling clients to
    /// connect to `advertised` (`host:port`): a fault proxy in front of it, say. A Kafka
    /// client connects to the bootstrap address once, then to the address each broker
    /// advertises: a proxy in front of the bootstrap address alone carries only that first
    /// connection, never a fetch or a produce.
    pub async fn start_behind(port: u16, advertised: impl Into<String>) -> io::Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("justonce-tansu-")
            .tempdir()?;
        let mut broker = OwnBroker {
            child: None,
            port,
            advertised: advertised.into(),
            dir,
        };
        broker.spawn().await?;
        Ok(broker)
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `127.0.0.1:PORT`.
    pub fn brokers(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// `kafka://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("kafka://127.0.0.1:{}", self.port)
    }

    /// The broker's SQLite storage file.
    pub fn storage(&self) -> PathBuf {
        self.dir.path().join("tansu.db")
    }

    /// Where the broker writes its log (every start appends). Its filter is `warn` unless
    /// `JUSTONCE_TANSU_LOG` gives another (`RUST_LOG` syntax: `info,tansu_storage=debug`),
    /// so that a test's own `RUST_LOG` does not flood it.
    pub fn log(&self) -> PathBuf {
        self.dir.path().join("tansu.log")
    }

    /// Kills the broker (SIGKILL, as a crash would) and starts it again on the same port
    /// and data directory.
    pub async fn restart(&mut self) -> io::Result<()> {
        self.kill().await;
        self.spawn().await
    }

    /// Kills the broker; [`OwnBroker::restart`] or drop after.
    pub async fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill().await;
        }
    }

    async fn spawn(&mut self) -> io::Result<()> {
        let bin = tansu_binary().ok_or_else(|| io::Error::other("tansu is not installed"))?;
        let listener = format!("tcp://127.0.0.1:{}", self.port);
        let advertised = format!("tcp://{}", self.advertised);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log())?;
        let child = Command::new(bin)
            .arg("broker")
            .arg("--listener-url")
            .arg(&listener)
            .arg("--advertised-listener-url")
            .arg(&advertised)
            .arg("--storage-engine")
            .arg("sqlite://tansu.db")
            .current_dir(self.dir.path())
            .env(
                "RUST_LOG",
                std::env::var("JUSTONCE_TANSU_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .stdin(Stdio::null())
            // tansu logs to stdout.
            .stdout(log.try_clone()?)
            .stderr(log)
            .kill_on_drop(true)
            .spawn()?;
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        while !answers(self.port).await {
            if let Some(Some(status)) = self.child.as_mut().map(|c| c.try_wait().ok().flatten()) {
                return Err(io::Error::other(format!(
                    "tansu on port {} exited with {status} (log: {})",
                    self.port,
                    self.log().display()
                )));
            }
            if Instant::now() >= deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("tansu on port {} did not answer in 20 s", self.port),
                ));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        repair_storage(&self.storage()).await
    }
}

/// What the harness, and `scripts/services.sh` for the machine's broker, add to tansu
/// 0.6.0's SQLite storage once it has made its tables (`tansu_repairs.sql`, which says
/// why): the index `justonce_header_record` on record headers, and the trigger
/// `justonce_topic_delete_one`, which keeps a topic deletion to its topic. No-ops when
/// already there.
pub const STORAGE_REPAIRS: &str = include_str!("tansu_repairs.sql");

/// Runs [`STORAGE_REPAIRS`] on the storage at `db`, once tansu has made its tables.
async fn repair_storage(db: &Path) -> io::Result<()> {
    use sqlx::ConnectOptions as _;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let tried = async {
            let mut conn = sqlx::sqlite::SqliteConnectOptions::new()
                .filename(db)
                .busy_timeout(Duration::from_secs(5))
                .connect()
                .await?;
            sqlx::raw_sql(STORAGE_REPAIRS).execute(&mut conn).await?;
            sqlx::Connection::close(conn).await
        }
        .await;
        match tried {
            Ok(()) => return Ok(()),
            // The broker answers before its tables are made.
            Err(_) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            Err(e) => {
                return Err(io::Error::other(format!(
                    "cannot repair tansu's storage in {}: {e}",
                    db.display()
                )))
            }
        }
    }
}

impl Drop for OwnBroker {
    fn drop(&mut self) {
        if let Some(c) = self.child.as_mut() {
            let _ = c.start_kill();
        }
    }
}

/// The tansu binary: `$JUSTONCE_TANSU`, else where `scripts/services.sh` installs it
/// (`$XDG_CACHE_HOME` or `~/.cache`, then `justonce/tansu-VERSION/bin/tansu`), else
/// `tansu` on the `PATH`.
pub fn tansu_binary() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("JUSTONCE_TANSU") {
        return Some(PathBuf::from(p)).filter(|p| p.is_file());
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")));
    let cached = cache.map(|c| {
        c.join("justonce")
            .join(format!("tansu-{TANSU_VERSION}"))
            .join("bin")
            .join("tansu")
    });
    let on_path = std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join("tansu"))
            .find(|p| p.is_file())
    });
    cached.filter(|p| p.is_file()).or(on_path)
}

/// A port of 127.0.0.1 free now, for [`OwnBroker::start_behind`].
pub fn free_port() -> io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// Whether the broker at `port` accepts a connection.
async fn answers(port: u16) -> bool {
    tokio::time::timeout(
        Duration::from_millis(500),
        tokio::net::TcpStream::connect(("127.0.0.1", port)),
    )
    .await
    .is_ok_and(|r| r.is_ok())
}
