//! A tansu broker of one's own, for tests and fault labs (feature `harness`): on a free
//! port of 127.0.0.1 and a data directory of its own (SQLite storage), killed when
//! dropped, restartable as after a crash, its storage repaired where tansu 0.6.0 needs it
//! ([`STORAGE_REPAIRS`]). The shared broker a machine runs is never touched.
//!
//! tansu 0.6.0 serves no TLS (it refuses `--cert` with `--key`, and its broker makes a TLS
//! acceptor it never uses): [`TlsFront`] is a TLS terminator of the test's
//! own in front of it, the broker advertising the front's address. Its SASL is its own:
//! `--authentication` with users made by `tansu user create` ([`OwnBroker::start_with`]).

use std::io;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
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
    /// Clients must authenticate (SASL).
    authentication: bool,
    dir: tempfile::TempDir,
}

/// A SCRAM user of a broker started with [`OwnBroker::start_with`].
#[derive(Debug, Clone, Copy)]
pub enum Scram {
    /// SCRAM-SHA-256.
    Sha256,
    /// SCRAM-SHA-512.
    Sha512,
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
            authentication: false,
            dir,
        };
        broker.spawn().await?;
        Ok(broker)
    }

    /// [`OwnBroker::start_behind`], then, with `users` made (`tansu user create`),
    /// restarted with SASL required (`--authentication`). tansu 0.6.0 checks a SCRAM
    /// user's password and takes any PLAIN password: a wrong password is refused only by
    /// SCRAM.
    pub async fn start_with(
        port: u16,
        advertised: impl Into<String>,
        users: &[(&str, &str, Scram)],
    ) -> io::Result<Self> {
        let mut broker = Self::start_behind(port, advertised).await?;
        let bin = tansu_binary().ok_or_else(|| io::Error::other("tansu is not installed"))?;
        for (name, password, mechanism) in users {
            let out = Command::new(&bin)
                .args(["user", "create", "--broker"])
                .arg(format!("tcp://127.0.0.1:{port}"))
                .arg("--mechanism")
                .arg(match mechanism {
                    Scram::Sha256 => "scram256",
                    Scram::Sha512 => "scram512",
                })
                .args([name, password])
                .stdin(Stdio::null())
                .output()
                .await?;
            if !out.status.success() {
                return Err(io::Error::other(format!(
                    "tansu user create {name} failed: {}",
                    String::from_utf8_lossy(&out.stderr).replace(password, "***")
                )));
            }
        }
        broker.authentication = true;
        broker.restart().await?;
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
            .args(self.authentication.then_some("--authentication"))
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

/// A TLS terminator of the test's own: takes TLS on a port of 127.0.0.1 with a server
/// certificate, optionally requires a client certificate signed by a given authority, and
/// carries each connection's bytes to a plaintext port (a tansu broker that advertises
/// the front's address: [`OwnBroker::start_behind`]). Stops when dropped.
pub struct TlsFront {
    port: u16,
    task: tokio::task::JoinHandle<()>,
}

impl TlsFront {
    /// Listens on `port` of 127.0.0.1 with the PEM certificate chain `cert` and key `key`,
    /// and carries every connection to `127.0.0.1:upstream`. With `client_ca`, a client
    /// must present a certificate it signed.
    pub async fn start(
        port: u16,
        cert: &Path,
        key: &Path,
        client_ca: Option<&Path>,
        upstream: u16,
    ) -> io::Result<Self> {
        use rustls::pki_types::pem::PemObject as _;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let bad = |what: &str, e: &dyn std::fmt::Display| io::Error::other(format!("{what}: {e}"));
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let chain = CertificateDer::pem_file_iter(cert)
            .and_then(|c| c.collect::<Result<Vec<_>, _>>())
            .map_err(|e| bad("the front's certificate", &e))?;
        let key = PrivateKeyDer::from_pem_file(key).map_err(|e| bad("the front's key", &e))?;
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| bad("TLS versions", &e))?;
        let builder = match client_ca {
            None => builder.with_no_client_auth(),
            Some(ca) => {
                let mut roots = rustls::RootCertStore::empty();
                for c in CertificateDer::pem_file_iter(ca).map_err(|e| bad("the client CA", &e))? {
                    roots
                        .add(c.map_err(|e| bad("the client CA", &e))?)
                        .map_err(|e| bad("the client CA", &e))?;
                }
                let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                    Arc::new(roots),
                    provider,
                )
                .build()
                .map_err(|e| bad("the client verifier", &e))?;
                builder.with_client_cert_verifier(verifier)
            }
        };
        let config = builder
            .with_single_cert(chain, key)
            .map_err(|e| bad("the front's certificate", &e))?;
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
        let port = listener.local_addr()?.port();
        let task = tokio::spawn(async move {
            let mut conns = tokio::task::JoinSet::new();
            while let Ok((socket, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                conns.spawn(async move {
                    let Ok(mut tls) = acceptor.accept(socket).await else {
                        return;
                    };
                    let Ok(mut up) = tokio::net::TcpStream::connect(("127.0.0.1", upstream)).await
                    else {
                        return;
                    };
                    let _ = tokio::io::copy_bidirectional(&mut tls, &mut up).await;
                });
                while conns.try_join_next().is_some() {}
            }
        });
        Ok(TlsFront { port, task })
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }
}

impl Drop for TlsFront {
    fn drop(&mut self) {
        self.task.abort();
    }
}
