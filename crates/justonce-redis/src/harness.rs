//! A `redis-server` of one's own, for tests and fault labs (feature `harness`): on a free
//! port and a directory of its own, killed when dropped, restartable as after a crash.
//! The shared server a machine runs is never touched.

use std::io;
use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, Command};

/// A `redis-server` process this program started.
pub struct OwnServer {
    child: Option<Child>,
    port: u16,
    /// The program and its first arguments: `redis-server`, or `chroot ROOT valkey-server`.
    program: Vec<String>,
    args: Vec<String>,
    /// Listening on TLS only: ready when the port accepts, since a plaintext `PING` would
    /// not be answered.
    tls: bool,
    /// Removed when the server is dropped.
    _dir: tempfile::TempDir,
}

impl OwnServer {
    /// Whether `redis-server` is on the `PATH`.
    pub fn installed() -> bool {
        std::env::var_os("PATH").is_some_and(|paths| {
            std::env::split_paths(&paths).any(|p| p.join("redis-server").is_file())
        })
    }

    /// Starts `redis-server` with `args` (persistence settings, say `--appendonly yes`) on
    /// a free port of 127.0.0.1 and a temporary directory, and waits until it answers.
    pub async fn start(args: &[&str]) -> io::Result<Self> {
        let mut server = Self::prepare("--port", args, None)?;
        server.spawn().await?;
        Ok(server)
    }

    /// [`OwnServer::start`] with `program` (`redis-server` or `valkey-server`) installed in
    /// `root`, a Debian root of another release (`scripts/debian13.sh`: Redis 8.0, Valkey
    /// 8.1), run with `chroot`, its directory in the root's own `/tmp`.
    pub async fn start_in(
        root: &std::path::Path,
        program: &str,
        args: &[&str],
    ) -> io::Result<Self> {
        let mut server = Self::prepare("--port", args, Some((root, program)))?;
        server.spawn().await?;
        Ok(server)
    }

    /// A server on a free port (`listen` names how: `--port` or `--tls-port`), not started.
    fn prepare(
        listen: &str,
        args: &[&str],
        root: Option<(&std::path::Path, &str)>,
    ) -> io::Result<Self> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let (dir, program, inside) = match root {
            Some((root, program)) => {
                let dir = tempfile::Builder::new()
                    .prefix("justonce-redis-")
                    .tempdir_in(root.join("tmp"))?;
                let inside = std::path::Path::new("/")
                    .join(dir.path().strip_prefix(root).unwrap_or(dir.path()));
                let program = vec![
                    "chroot".to_owned(),
                    root.display().to_string(),
                    program.to_owned(),
                ];
                (dir, program, inside)
            }
            None => {
                let dir = tempfile::Builder::new()
                    .prefix("justonce-redis-")
                    .tempdir()?;
                let inside = dir.path().to_owned();
                (dir, vec!["redis-server".to_owned()], inside)
            }
        };
        let mut all: Vec<String> = vec![
            listen.into(),
            port.to_string(),
            "--bind".into(),
            "127.0.0.1".into(),
            "--dir".into(),
            inside.display().to_string(),
            "--daemonize".into(),
            "no".into(),
        ];
        all.extend(args.iter().map(|a| a.to_string()));
        if listen == "--tls-port" {
            all.extend(["--port".into(), "0".into()]);
        }
        Ok(OwnServer {
            child: None,
            port,
            program,
            args: all,
            tls: listen == "--tls-port",
            _dir: dir,
        })
    }

    /// [`OwnServer::start`] as the guide says a Redis that keeps claims must run: an
    /// append-only file synced at every write, no snapshots.
    pub async fn start_durable() -> io::Result<Self> {
        Self::start(&[
            "--save",
            "",
            "--appendonly",
            "yes",
            "--appendfsync",
            "always",
        ])
        .await
    }

    /// Starts `redis-server` listening on TLS only, on a free port of 127.0.0.1, with
    /// `args` (`--tls-cert-file`, `--tls-key-file`, `--tls-ca-cert-file`,
    /// `--tls-auth-clients`, a `--user` or a `--requirepass`), and waits until the port
    /// accepts connections.
    pub async fn start_tls(args: &[&str]) -> io::Result<Self> {
        let mut server = Self::prepare("--tls-port", args, None)?;
        server.spawn().await?;
        Ok(server)
    }

    /// The port it listens on, on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:PORT` (`rediss://` for a server of [`OwnServer::start_tls`]).
    pub fn url(&self) -> String {
        let scheme = if self.tls { "rediss" } else { "redis" };
        format!("{scheme}://127.0.0.1:{}", self.port)
    }

    /// Kills the server (SIGKILL, as a crash would) and starts it again on the same port
    /// and directory: it comes back with what its persistence settings kept.
    pub async fn restart(&mut self) -> io::Result<()> {
        self.kill().await;
        self.spawn().await
    }

    /// Kills the server; [`OwnServer::restart`] or drop after.
    pub async fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill().await;
        }
    }

    async fn spawn(&mut self) -> io::Result<()> {
        let child = Command::new(&self.program[0])
            .args(&self.program[1..])
            .args(&self.args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()?;
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while !(if self.tls {
            tokio::net::TcpStream::connect(("127.0.0.1", self.port))
                .await
                .is_ok()
        } else {
            ping(self.port).await
        }) {
            if let Some(Some(status)) = self.child.as_mut().map(|c| c.try_wait().ok().flatten()) {
                return Err(io::Error::other(format!(
                    "redis-server on port {} exited with {status}",
                    self.port
                )));
            }
            if Instant::now() >= deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("redis-server on port {} did not answer in 10 s", self.port),
                ));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(())
    }
}

impl Drop for OwnServer {
    fn drop(&mut self) {
        if let Some(c) = self.child.as_mut() {
            let _ = c.start_kill();
        }
    }
}

async fn ping(port: u16) -> bool {
    let Ok(mut s) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await else {
        return false;
    };
    if s.write_all(b"PING\r\n").await.is_err() {
        return false;
    }
    let mut buf = [0u8; 7];
    matches!(
        tokio::time::timeout(Duration::from_secs(1), s.read_exact(&mut buf)).await,
        Ok(Ok(_)) if &buf == b"+PONG\r\n"
    )
}
