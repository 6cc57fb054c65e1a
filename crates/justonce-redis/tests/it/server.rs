//! A `redis-server` of the test's own, on a port and a directory of its own, killed when
//! dropped and restartable: the shared server on :6379 is never restarted.

use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, Command};

/// A `redis-server` this test started.
pub(crate) struct OwnServer {
    child: Option<Child>,
    port: u16,
    args: Vec<String>,
    _dir: tempfile::TempDir,
}

impl OwnServer {
    /// Starts `redis-server` with `args` (persistence settings) on a free port; `None`,
    /// loudly, when the binary is missing and services are not required.
    pub(crate) async fn start(args: &[&str]) -> Option<Self> {
        if which("redis-server").is_none() {
            assert!(
                std::env::var("JUSTONCE_REQUIRE_SERVICES").as_deref() != Ok("1"),
                "redis-server is not installed and JUSTONCE_REQUIRE_SERVICES=1"
            );
            eprintln!("SKIPPED: redis-server is not installed");
            return None;
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let dir = tempfile::tempdir().unwrap();
        let mut all: Vec<String> = vec![
            "--port".into(),
            port.to_string(),
            "--bind".into(),
            "127.0.0.1".into(),
            "--dir".into(),
            dir.path().display().to_string(),
            "--daemonize".into(),
            "no".into(),
        ];
        all.extend(args.iter().map(|a| a.to_string()));
        let mut server = OwnServer {
            child: None,
            port,
            args: all,
            _dir: dir,
        };
        server.spawn().await;
        Some(server)
    }

    /// `redis://127.0.0.1:PORT`.
    pub(crate) fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Kills the server (as a crash would: SIGKILL) and starts it again on the same port.
    pub(crate) async fn restart(&mut self) {
        self.kill().await;
        self.spawn().await;
    }

    async fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill().await;
        }
    }

    async fn spawn(&mut self) {
        let child = Command::new("redis-server")
            .args(&self.args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("redis-server starts");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if ping(self.port).await {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "redis-server did not answer in 10 s"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
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

fn which(bin: &str) -> Option<std::path::PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join(bin))
            .find(|p| p.is_file())
    })
}
