//! A `nats-server` of one's own, for tests and fault labs (feature `harness`): JetStream on
//! a free port and a store directory of its own, killed when dropped, restartable as
//! after a crash. The shared server a machine runs is never touched.

use std::io;
use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::process::{Child, Command};

/// A `nats-server` process this program started.
pub struct OwnServer {
    child: Option<Child>,
    port: u16,
    /// The root its `nats-server` is installed in (`chroot`), when not the machine's.
    root: Option<std::path::PathBuf>,
    /// Its configuration file, as the server sees it (inside its root).
    config_inside: std::path::PathBuf,
    /// Whether a client with no credentials and no TLS may connect (the readiness probe).
    open: bool,
    /// Removed when the server is dropped.
    _dir: tempfile::TempDir,
}

impl OwnServer {
    /// Whether `nats-server` is found: `$JUSTONCE_NATS_SERVER`, the `PATH`, `/usr/sbin`.
    pub fn installed() -> bool {
        binary().is_some()
    }

    /// Starts `nats-server` with JetStream on a free port of 127.0.0.1 and a temporary
    /// store directory, with `max_payload` (bytes; the server's default is 1 MiB), and
    /// waits until it answers.
    pub async fn start(max_payload: usize) -> io::Result<Self> {
        Self::start_with(max_payload, "").await
    }

    /// [`OwnServer::start`] with `extra` appended to its configuration file: an
    /// `authorization` block, a `tls` block. A server that asks its clients to log in or
    /// to speak TLS is ready when its port accepts connections.
    pub async fn start_with(max_payload: usize, extra: &str) -> io::Result<Self> {
        Self::start_from(None, max_payload, extra).await
    }

    /// [`OwnServer::start`] with the `nats-server` installed in `root`, a Debian root of
    /// another release (`scripts/debian13.sh`: NATS 2.10), run with `chroot`, its store in
    /// the root's own `/tmp`.
    pub async fn start_in(root: &std::path::Path, max_payload: usize) -> io::Result<Self> {
        Self::start_from(Some(root), max_payload, "").await
    }

    async fn start_from(
        root: Option<&std::path::Path>,
        max_payload: usize,
        extra: &str,
    ) -> io::Result<Self> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        // A root's server sees its own /tmp: its directory is made there.
        let dir = match root {
            Some(root) => tempfile::Builder::new()
                .prefix("justonce-nats-")
                .tempdir_in(root.join("tmp"))?,
            None => tempfile::Builder::new()
                .prefix("justonce-nats-")
                .tempdir()?,
        };
        let inside = |p: std::path::PathBuf| match root {
            Some(root) => std::path::Path::new("/").join(p.strip_prefix(root).unwrap_or(&p)),
            None => p,
        };
        let config = dir.path().join("nats.conf");
        let store = inside(dir.path().join("store"));
        std::fs::write(
            &config,
            format!(
                "listen: \"127.0.0.1:{port}\"\nmax_payload: {max_payload}\n\
                 jetstream {{\n  store_dir: \"{}\"\n}}\n{extra}\n",
                store.display()
            ),
        )?;
        let mut server = OwnServer {
            child: None,
            port,
            root: root.map(Into::into),
            config_inside: inside(config),
            open: extra.is_empty(),
            _dir: dir,
        };
        server.spawn().await?;
        Ok(server)
    }

    /// The port it listens on, on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `nats://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// Kills the server (SIGKILL, as a crash would) and starts it again on the same port
    /// and store directory: it comes back with what it had written to disk.
    pub async fn restart(&mut self) -> io::Result<()> {
        self.kill().await;
        self.spawn().await
    }

    /// `nats-server`: the root's (run with `chroot`) or the machine's.
    fn command(&self) -> io::Result<Command> {
        match &self.root {
            Some(root) => {
                let mut c = Command::new("chroot");
                c.arg(root).arg("/usr/sbin/nats-server");
                Ok(c)
            }
            None => {
                Ok(Command::new(binary().ok_or_else(|| {
                    io::Error::other("nats-server is not installed")
                })?))
            }
        }
    }

    /// The server's version (`nats-server --version`: `nats-server: v2.10.27`).
    pub async fn version(&self) -> io::Result<String> {
        let mut c = self.command()?;
        let out = c.arg("--version").output().await?;
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
    }

    /// Kills the server; [`OwnServer::restart`] or drop after.
    pub async fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill().await;
        }
    }

    async fn spawn(&mut self) -> io::Result<()> {
        let mut command = self.command()?;
        let child = command
            .arg("-c")
            .arg(&self.config_inside)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()?;
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while !(if self.open {
            answers(self.port).await
        } else {
            tokio::net::TcpStream::connect(("127.0.0.1", self.port))
                .await
                .is_ok()
        }) {
            if let Some(Some(status)) = self.child.as_mut().map(|c| c.try_wait().ok().flatten()) {
                return Err(io::Error::other(format!(
                    "nats-server on port {} exited with {status}",
                    self.port
                )));
            }
            if Instant::now() >= deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("nats-server on port {} did not answer in 10 s", self.port),
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

/// `$JUSTONCE_NATS_SERVER` (another version's binary: Debian 13's is
/// `~/.cache/justonce/debian13/usr/sbin/nats-server`), else `nats-server` on the `PATH` or
/// in `/usr/sbin`.
fn binary() -> Option<std::path::PathBuf> {
    if let Some(p) = std::env::var_os("JUSTONCE_NATS_SERVER") {
        return Some(std::path::PathBuf::from(p)).filter(|p| p.is_file());
    }
    let mut dirs: Vec<std::path::PathBuf> = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    dirs.push("/usr/sbin".into());
    dirs.into_iter()
        .map(|d| d.join("nats-server"))
        .find(|p| p.is_file())
}

/// Whether the server at `port` sends its `INFO` line, with JetStream ready.
async fn answers(port: u16) -> bool {
    let Ok(client) = async_nats::ConnectOptions::new()
        .connection_timeout(Duration::from_millis(500))
        .connect(format!("nats://127.0.0.1:{port}"))
        .await
    else {
        return false;
    };
    // JetStream answers its API once it has read its store.
    matches!(
        client.request("$JS.API.INFO", "".into()).await,
        Ok(m) if !m.payload.is_empty() && !m.payload.windows(7).any(|w| w == b"\"error\"")
    )
}
