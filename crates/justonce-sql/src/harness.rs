//! Database servers of one's own, for tests (feature `harness`): a PostgreSQL cluster made
//! by `initdb`, or a MariaDB made by `mariadb-install-db`, in a temporary directory, on a
//! free port of 127.0.0.1, with a password, and TLS when asked for; killed and deleted when
//! dropped. The machine's own servers are never touched.
//!
//! PostgreSQL refuses to run as root: under root the cluster belongs to the `postgres`
//! user, and its programs run through `runuser`. MariaDB runs as the user that starts it.

use std::io;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::process::{Child, Command};

/// The password of the superuser `postgres` (PostgreSQL) or of the user `app` (MariaDB) on
/// a server of one's own.
pub const PASSWORD: &str = "jo-harness-pw-7f3a";

/// The user that a server with TLS and a client CA lets in by its certificate alone
/// (`cert` in `pg_hba.conf`): a client certificate whose common name is this.
pub const CERT_USER: &str = "jo_cert";

/// What the server presents and trusts: its certificate and key, and the authority whose
/// client certificates it accepts. PEM files.
#[derive(Debug, Clone)]
pub struct ServerTls {
    /// The server's certificate.
    pub cert: PathBuf,
    /// The server's key.
    pub key: PathBuf,
    /// The authority of the client certificates it accepts.
    pub client_ca: PathBuf,
}

/// A `postgres` process this program started, on a cluster of its own.
pub struct OwnPostgres {
    child: Option<Child>,
    port: u16,
    dir: tempfile::TempDir,
    /// Its programs' directory, as seen inside `root`.
    bin: PathBuf,
    /// The root its PostgreSQL is installed in (`chroot`), when not the machine's.
    root: Option<PathBuf>,
}

impl OwnPostgres {
    /// The directory of PostgreSQL's programs: `$JUSTONCE_PG_BIN`, else the newest
    /// `/usr/lib/postgresql/*/bin` that has `initdb`; `None` when there is none.
    pub fn bin_dir() -> Option<PathBuf> {
        if let Some(dir) = std::env::var_os("JUSTONCE_PG_BIN") {
            return Some(PathBuf::from(dir));
        }
        let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
            .ok()?
            .flatten()
            .filter_map(|e| {
                let version = e.file_name().to_str()?.parse().ok()?;
                let bin = e.path().join("bin");
                bin.join("initdb").is_file().then_some((version, bin))
            })
            .collect();
        found.sort();
        found.pop().map(|(_, bin)| bin)
    }

    /// Whether `initdb` and `postgres` are installed.
    pub fn installed() -> bool {
        Self::bin_dir().is_some()
    }

    /// Makes a cluster (superuser `postgres`, password [`PASSWORD`], SCRAM over TCP) and
    /// starts it on a free port of 127.0.0.1. With `tls`, `ssl = on` with that certificate,
    /// [`CERT_USER`] may log in by a client certificate of `tls.client_ca`, and `postgres`
    /// in plaintext too; without it, the server speaks plaintext only.
    pub async fn start(tls: Option<&ServerTls>) -> io::Result<Self> {
        let bin = Self::bin_dir()
            .ok_or_else(|| io::Error::other("PostgreSQL's initdb is not installed"))?;
        Self::start_with(tls, bin, None).await
    }

    /// [`OwnPostgres::start`] without TLS, with the newest PostgreSQL installed in `root`, a
    /// Debian root of another release (`scripts/debian13.sh`: PostgreSQL 17), run with
    /// `chroot` as the root's `postgres` user, its directory in the root's own `/tmp`.
    pub async fn start_in(root: &Path) -> io::Result<Self> {
        let newest = std::fs::read_dir(root.join("usr/lib/postgresql"))?
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
            .max()
            .ok_or_else(|| {
                io::Error::other(format!("no PostgreSQL is installed in {}", root.display()))
            })?;
        let bin = PathBuf::from(format!("/usr/lib/postgresql/{newest}/bin"));
        Self::start_with(None, bin, Some(root.to_owned())).await
    }

    async fn start_with(
        tls: Option<&ServerTls>,
        bin: PathBuf,
        root: Option<PathBuf>,
    ) -> io::Result<Self> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let dir = match &root {
            Some(root) => tempfile::Builder::new()
                .prefix("justonce-pg-")
                .tempdir_in(root.join("tmp"))?,
            None => tempfile::Builder::new().prefix("justonce-pg-").tempdir()?,
        };
        let root_ref = root.as_deref();
        // Paths as the server's programs see them.
        let inside = |p: &Path| match root_ref {
            Some(r) => Path::new("/").join(p.strip_prefix(r).unwrap_or(p)),
            None => p.to_owned(),
        };
        let data = dir.path().join("data");
        let pwfile = dir.path().join("pw");
        std::fs::write(&pwfile, PASSWORD)?;
        hand_over(root_ref, &inside(dir.path()))?;
        hand_over(root_ref, &inside(&pwfile))?;
        let (data_in, pwfile_in) = (inside(&data), inside(&pwfile));
        run(
            root_ref,
            &bin,
            "initdb",
            &[
                "-D".as_ref(),
                data_in.as_os_str(),
                "-U".as_ref(),
                "postgres".as_ref(),
                "--auth-local=trust".as_ref(),
                "--auth-host=scram-sha-256".as_ref(),
                "--pwfile".as_ref(),
                pwfile_in.as_os_str(),
                "--no-sync".as_ref(),
                "-E".as_ref(),
                "UTF8".as_ref(),
            ],
        )
        .await?;
        let mut conf = format!(
            "\nport = {port}\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '{}'\n\
             fsync = off\nsynchronous_commit = off\nfull_page_writes = off\n",
            inside(dir.path()).display()
        );
        let mut hba = "local all all trust\n".to_owned();
        match tls {
            Some(tls) => {
                for (from, to) in [
                    (&tls.cert, "server.crt"),
                    (&tls.key, "server.key"),
                    (&tls.client_ca, "client-ca.crt"),
                ] {
                    let path = data.join(to);
                    std::fs::copy(from, &path)?;
                    hand_over(root_ref, &inside(&path))?;
                }
                conf.push_str(
                    "ssl = on\nssl_cert_file = 'server.crt'\nssl_key_file = 'server.key'\n\
                     ssl_ca_file = 'client-ca.crt'\n",
                );
                // Plaintext too, with a password, as servers that let clients choose do:
                // what TLS costs is measured on one server.
                hba.push_str(&format!(
                    "hostssl all {CERT_USER} 127.0.0.1/32 cert\n\
                     hostssl all all 127.0.0.1/32 scram-sha-256\n\
                     hostnossl all postgres 127.0.0.1/32 scram-sha-256\n"
                ));
            }
            None => {
                conf.push_str("ssl = off\n");
                hba.push_str("host all all 127.0.0.1/32 scram-sha-256\n");
            }
        }
        append(&data.join("postgresql.conf"), &conf)?;
        std::fs::write(data.join("pg_hba.conf"), hba)?;
        let mut server = OwnPostgres {
            child: None,
            port,
            dir,
            bin,
            root,
        };
        server.spawn().await?;
        if tls.is_some() {
            server
                .psql(&format!(
                    "CREATE USER {CERT_USER}; GRANT ALL ON SCHEMA public TO {CERT_USER}"
                ))
                .await?;
        }
        Ok(server)
    }

    /// The port it listens on, on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `postgres://postgres:PASSWORD@127.0.0.1:PORT/postgres` followed by `query` (say
    /// `?sslmode=verify-full&sslrootcert=…`).
    pub fn url(&self, query: &str) -> String {
        format!(
            "postgres://postgres:{PASSWORD}@127.0.0.1:{}/postgres{query}",
            self.port
        )
    }

    /// Runs `sql` as the superuser, over the server's Unix socket.
    pub async fn psql(&self, sql: &str) -> io::Result<()> {
        let socket = self.inside(self.dir.path());
        let socket = socket.as_os_str();
        let port = self.port.to_string();
        run(
            self.root.as_deref(),
            &self.bin,
            "psql",
            &[
                "-h".as_ref(),
                socket,
                "-p".as_ref(),
                port.as_ref(),
                "-U".as_ref(),
                "postgres".as_ref(),
                "-d".as_ref(),
                "postgres".as_ref(),
                "-v".as_ref(),
                "ON_ERROR_STOP=1".as_ref(),
                "-c".as_ref(),
                sql.as_ref(),
            ],
        )
        .await
    }

    /// `path` as the server's programs see it: under the root, without the root's prefix.
    fn inside(&self, path: &Path) -> PathBuf {
        match &self.root {
            Some(root) => Path::new("/").join(path.strip_prefix(root).unwrap_or(path)),
            None => path.to_owned(),
        }
    }

    async fn spawn(&mut self) -> io::Result<()> {
        let data = self.inside(&self.dir.path().join("data"));
        let log = std::fs::File::create(self.dir.path().join("postgres.log"))?;
        let child = command(self.root.as_deref(), &self.bin, "postgres")
            .arg("-D")
            .arg(&data)
            .stdout(Stdio::null())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()?;
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let ready = command(self.root.as_deref(), &self.bin, "pg_isready")
                .args(["-q", "-h", "127.0.0.1", "-p", &self.port.to_string()])
                .status()
                .await
                .is_ok_and(|s| s.success());
            if ready {
                return Ok(());
            }
            if let Some(Some(status)) = self.child.as_mut().map(|c| c.try_wait().ok().flatten()) {
                return Err(io::Error::other(format!(
                    "postgres on port {} exited with {status}: {}",
                    self.port,
                    self.log()
                )));
            }
            if Instant::now() >= deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("postgres on port {} did not answer in 30 s", self.port),
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("postgres.log")).unwrap_or_default()
    }
}

impl Drop for OwnPostgres {
    fn drop(&mut self) {
        if let Some(c) = self.child.as_mut() {
            let _ = c.start_kill();
        }
        // A postmaster that `pg_ctl restart` started (the lab's db-restart fault) is not the
        // child: its pid file names it. SIGQUIT is an immediate shutdown.
        let pid = std::fs::read_to_string(self.dir.path().join("data/postmaster.pid"))
            .ok()
            .and_then(|t| t.lines().next()?.trim().parse::<u32>().ok());
        if let Some(pid) = pid {
            let _ = std::process::Command::new("kill")
                .args(["-QUIT", &pid.to_string()])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
    }
}

fn is_root() -> bool {
    use std::os::unix::fs::MetadataExt as _;
    // `/proc/self` belongs to the process's effective user.
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

/// A PostgreSQL program; under root, as the `postgres` user; in `root` (`chroot`, as that
/// root's `postgres` user) when given.
fn command(root: Option<&Path>, bin: &Path, program: &str) -> Command {
    if let Some(root) = root {
        let mut c = Command::new("chroot");
        c.arg(root)
            .args(["runuser", "-u", "postgres", "--"])
            .arg(bin.join(program));
        return c;
    }
    if is_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(bin.join(program));
        c
    } else {
        Command::new(bin.join(program))
    }
}

async fn run(
    root: Option<&Path>,
    bin: &Path,
    program: &str,
    args: &[&std::ffi::OsStr],
) -> io::Result<()> {
    let out = command(root, bin, program).args(args).output().await?;
    if !out.status.success() {
        return Err(io::Error::other(format!(
            "{program} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(())
}

/// Under root, gives `path` to the `postgres` user, who runs the server: the one of `root`
/// (and `path` as seen inside it) when given.
fn hand_over(root: Option<&Path>, path: &Path) -> io::Result<()> {
    if !is_root() {
        return Ok(());
    }
    let mut chown = std::process::Command::new("chroot");
    chown.arg(root.unwrap_or(Path::new("/")));
    let out = chown
        .arg("chown")
        .arg("postgres:postgres")
        .arg(path)
        .output()?;
    if !out.status.success() {
        return Err(io::Error::other(format!(
            "chown postgres {}: {}",
            path.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(())
}

fn append(path: &Path, text: &str) -> io::Result<()> {
    use std::io::Write as _;
    std::fs::OpenOptions::new()
        .append(true)
        .open(path)?
        .write_all(text.as_bytes())
}

/// A `mariadbd` process this program started, on a data directory of its own, with the
/// database `test`, the user `app` (password [`PASSWORD`], every privilege) and, with TLS,
/// the user [`CERT_USER`], who needs no password but a client certificate whose subject is
/// `/CN=jo_cert` (`REQUIRE SUBJECT`).
pub struct OwnMariaDb {
    child: Option<Child>,
    port: u16,
    dir: tempfile::TempDir,
}

impl OwnMariaDb {
    /// Whether `mariadbd` and `mariadb-install-db` are installed.
    pub fn installed() -> bool {
        Path::new("/usr/sbin/mariadbd").is_file() && which("mariadb-install-db").is_some()
    }

    /// Makes a data directory and starts `mariadbd` on a free port of 127.0.0.1; with
    /// `tls`, it presents `tls.cert` and accepts client certificates of `tls.client_ca`.
    pub async fn start(tls: Option<&ServerTls>) -> io::Result<Self> {
        let install = which("mariadb-install-db")
            .ok_or_else(|| io::Error::other("mariadb-install-db is not installed"))?;
        Self::start_with(tls, None, install).await
    }

    /// [`OwnMariaDb::start`] without TLS, with the MariaDB installed in `root`, a Debian
    /// root of another release (`scripts/debian13.sh`: MariaDB 11.8), run with `chroot`,
    /// its directory in the root's own `/tmp`. Its compiled-in defaults apply (no
    /// configuration file is read).
    pub async fn start_in(root: &Path) -> io::Result<Self> {
        Self::start_with(
            None,
            Some(root),
            PathBuf::from("/usr/bin/mariadb-install-db"),
        )
        .await
    }

    async fn start_with(
        tls: Option<&ServerTls>,
        root: Option<&Path>,
        install: PathBuf,
    ) -> io::Result<Self> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let dir = match root {
            Some(root) => tempfile::Builder::new()
                .prefix("justonce-mariadb-")
                .tempdir_in(root.join("tmp"))?,
            None => tempfile::Builder::new()
                .prefix("justonce-mariadb-")
                .tempdir()?,
        };
        // Paths as the server's programs see them.
        let inside = |p: &Path| match root {
            Some(r) => Path::new("/").join(p.strip_prefix(r).unwrap_or(p)),
            None => p.to_owned(),
        };
        let program = |name: &Path| match root {
            Some(r) => {
                let mut c = Command::new("chroot");
                c.arg(r).arg(name);
                c
            }
            None => Command::new(name),
        };
        let data = inside(&dir.path().join("data"));
        // A temporary directory of its own: two bootstraps at once in /tmp collide on
        // their temporary tables ("Could not remove temporary table").
        std::fs::create_dir(dir.path().join("tmp"))?;
        let tmp = inside(&dir.path().join("tmp"));
        let out = program(&install)
            .arg("--no-defaults")
            .arg(format!("--datadir={}", data.display()))
            .arg(format!("--tmpdir={}", tmp.display()))
            .env("TMPDIR", &tmp)
            .args([
                "--user=root",
                "--auth-root-authentication-method=normal",
                "--skip-test-db",
            ])
            .output()
            .await?;
        if !out.status.success() {
            return Err(io::Error::other(format!(
                "mariadb-install-db failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        let mut args = vec![
            "--no-defaults".to_owned(),
            format!("--datadir={}", data.display()),
            format!("--port={port}"),
            "--bind-address=127.0.0.1".into(),
            format!("--socket={}", inside(&dir.path().join("sock")).display()),
            format!("--pid-file={}", inside(&dir.path().join("pid")).display()),
            format!("--tmpdir={}", tmp.display()),
            "--user=root".into(),
            "--skip-name-resolve".into(),
            "--innodb-flush-log-at-trx-commit=0".into(),
        ];
        if let Some(tls) = tls {
            args.push(format!("--ssl-cert={}", tls.cert.display()));
            args.push(format!("--ssl-key={}", tls.key.display()));
            args.push(format!("--ssl-ca={}", tls.client_ca.display()));
        }
        let log = std::fs::File::create(dir.path().join("mariadb.log"))?;
        let child = program(Path::new("/usr/sbin/mariadbd"))
            .args(&args)
            .stdout(Stdio::null())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()?;
        let mut server = OwnMariaDb {
            child: Some(child),
            port,
            dir,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while server.sql("SELECT 1").await.is_err() {
            if let Some(Some(status)) = server.child.as_mut().map(|c| c.try_wait().ok().flatten()) {
                return Err(io::Error::other(format!(
                    "mariadbd on port {port} exited with {status}: {}",
                    server.log()
                )));
            }
            if Instant::now() >= deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("mariadbd on port {port} did not answer in 30 s"),
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        server
            .sql(&format!(
                "CREATE DATABASE test; CREATE USER 'app'@'%' IDENTIFIED BY '{PASSWORD}'; \
                 GRANT ALL ON *.* TO 'app'@'%';"
            ))
            .await?;
        if tls.is_some() {
            server
                .sql(&format!(
                    "CREATE USER '{CERT_USER}'@'%' REQUIRE SUBJECT '/CN={CERT_USER}'; \
                     GRANT ALL ON test.* TO '{CERT_USER}'@'%';"
                ))
                .await?;
        }
        Ok(server)
    }

    /// The port it listens on, on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `mysql://app:PASSWORD@127.0.0.1:PORT/test` followed by `query` (say
    /// `?ssl-mode=VERIFY_IDENTITY&ssl-ca=…`).
    pub fn url(&self, query: &str) -> String {
        format!("mysql://app:{PASSWORD}@127.0.0.1:{}/test{query}", self.port)
    }

    /// Runs `sql` as root, over the server's Unix socket.
    pub async fn sql(&self, sql: &str) -> io::Result<()> {
        let out = Command::new("mariadb")
            .arg("--no-defaults")
            .arg(format!(
                "--socket={}",
                self.dir.path().join("sock").display()
            ))
            .args(["-uroot", "-e", sql])
            .output()
            .await?;
        if !out.status.success() {
            return Err(io::Error::other(format!(
                "mariadb -e failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        Ok(())
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("mariadb.log")).unwrap_or_default()
    }
}

impl Drop for OwnMariaDb {
    fn drop(&mut self) {
        if let Some(c) = self.child.as_mut() {
            let _ = c.start_kill();
        }
    }
}

/// `name` on the `PATH`.
fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(name))
            .find(|p| p.is_file())
    })
}
