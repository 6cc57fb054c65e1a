//! The server a URL names, when it runs on this machine: the process listening on the URL's
//! port (`/proc/net/tcp*`, `/proc/*/fd`), so that `doctor` reads, and the lab restarts, that
//! server and no other (a second RabbitMQ node on 5673, a PostgreSQL 17 cluster beside the
//! machine's 15, a server in a root of its own). The process's own root (`/proc/PID/root`),
//! user, environment and programs are used: a node's `rabbitmqctl` with its node name and
//! cookie, a cluster's own `pg_ctl` as its own user. Reading another user's process needs
//! root (or that user); a URL whose host is not a loopback address names no local server.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{bail, Context as _};
use std::process::Command;

/// How long one `rabbitmqctl` or `pg_ctl` may take.
const CTL_TIMEOUT: Duration = Duration::from_secs(60);

/// The host and port a URL names, with the scheme's default port.
pub(crate) fn host_port(url: &str) -> anyhow::Result<(String, u16)> {
    let parsed = url::Url::parse(url).context("not a URL")?;
    let host = parsed
        .host_str()
        .filter(|h| !h.is_empty())
        .context("the URL names no host")?
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned();
    let port = match parsed.port() {
        Some(p) => p,
        None => match parsed.scheme() {
            "amqp" => 5672,
            "amqps" => 5671,
            "postgres" | "postgresql" => 5432,
            "mysql" | "mariadb" => 3306,
            "redis" | "rediss" => 6379,
            "nats" | "tls" => 4222,
            s => bail!("no default port for {s}:// URLs; write the port in the URL"),
        },
    };
    Ok((host, port))
}

fn is_loopback(host: &str) -> bool {
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// A process of this machine that listens on a TCP port.
#[derive(Debug)]
pub(crate) struct Process {
    pub(crate) pid: u32,
    /// Its root directory as this process sees it (`/` unless it runs in a `chroot`).
    root: PathBuf,
    /// Its program, as seen inside its root.
    exe: PathBuf,
    uid: u32,
    gid: u32,
    cmdline: Vec<String>,
    environ: Vec<(String, String)>,
}

impl Process {
    /// The process listening on the port `url` names, on a loopback host.
    pub(crate) fn for_url(url: &str) -> anyhow::Result<Self> {
        let (host, port) = host_port(url)?;
        if !is_loopback(&host) {
            bail!("{host} is not a loopback address: the server is not on this machine, or not known to be");
        }
        Self::listening_on(port)
    }

    /// The process listening on TCP `port` (any address).
    pub(crate) fn listening_on(port: u16) -> anyhow::Result<Self> {
        let mut inodes = Vec::new();
        for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
            let Ok(text) = std::fs::read_to_string(table) else {
                continue;
            };
            for line in text.lines().skip(1) {
                let f: Vec<&str> = line.split_whitespace().collect();
                let (Some(local), Some(state), Some(inode)) = (f.get(1), f.get(3), f.get(9)) else {
                    continue;
                };
                let p = local
                    .rsplit(':')
                    .next()
                    .and_then(|h| u16::from_str_radix(h, 16).ok());
                // 0A: LISTEN.
                if p == Some(port) && *state == "0A" {
                    inodes.push(format!("socket:[{inode}]"));
                }
            }
        }
        if inodes.is_empty() {
            bail!("nothing on this machine listens on port {port}");
        }
        let mut unreadable = 0usize;
        for entry in std::fs::read_dir("/proc")?.flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|s| s.parse::<u32>().ok())
            else {
                continue;
            };
            let Ok(fds) = std::fs::read_dir(entry.path().join("fd")) else {
                unreadable += 1;
                continue;
            };
            let owns = fds.flatten().any(|fd| {
                std::fs::read_link(fd.path())
                    .is_ok_and(|l| inodes.iter().any(|i| l.as_os_str() == i.as_str()))
            });
            if owns {
                return Self::read(pid);
            }
        }
        bail!(
            "a process listens on port {port}, but not one this user may see ({unreadable} processes unreadable): run as root, or as the server's user"
        )
    }

    fn read(pid: u32) -> anyhow::Result<Self> {
        use std::os::unix::fs::MetadataExt as _;
        let dir = PathBuf::from(format!("/proc/{pid}"));
        let seen = |what: &str| format!("cannot read {}/{what}", dir.display());
        let root = std::fs::read_link(dir.join("root")).with_context(|| seen("root"))?;
        let exe = std::fs::read_link(dir.join("exe")).with_context(|| seen("exe"))?;
        let exe = match exe.strip_prefix(&root) {
            Ok(inside) if root != Path::new("/") => Path::new("/").join(inside),
            _ => exe,
        };
        let meta = std::fs::metadata(&dir)?;
        let split = |bytes: Vec<u8>| -> Vec<String> {
            bytes
                .split(|b| *b == 0)
                .filter(|s| !s.is_empty())
                .map(|s| String::from_utf8_lossy(s).into_owned())
                .collect()
        };
        let cmdline = split(std::fs::read(dir.join("cmdline")).with_context(|| seen("cmdline"))?);
        let environ = split(std::fs::read(dir.join("environ")).with_context(|| seen("environ"))?)
            .into_iter()
            .filter_map(|kv| {
                kv.split_once('=')
                    .map(|(k, v)| (k.to_owned(), v.to_owned()))
            })
            .collect();
        Ok(Process {
            pid,
            root,
            exe,
            uid: meta.uid(),
            gid: meta.gid(),
            cmdline,
            environ,
        })
    }

    /// Its program's file name (`beam.smp`, `postgres`).
    pub(crate) fn program(&self) -> String {
        self.exe
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    }

    fn env(&self, key: &str) -> Option<&str> {
        self.environ
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// The value after `flag` on its command line (`-D DIR`).
    fn arg_after(&self, flag: &str) -> Option<&str> {
        let i = self.cmdline.iter().position(|a| a == flag)?;
        self.cmdline.get(i + 1).map(String::as_str)
    }

    /// A path inside its root, as this process sees it.
    fn outside(&self, inside: &Path) -> PathBuf {
        self.root.join(inside.strip_prefix("/").unwrap_or(inside))
    }

    fn in_own_root(&self) -> bool {
        self.root != Path::new("/")
    }

    /// `program` (a path inside its root) run in its root, as `user` (its owner) when given.
    fn command(&self, program: &Path, as_owner: bool) -> Command {
        let me = std::fs::metadata("/proc/self").map(|m| {
            use std::os::unix::fs::MetadataExt as _;
            m.uid()
        });
        let switch = as_owner && me.is_ok_and(|uid| uid != self.uid);
        if self.in_own_root() || switch {
            let mut c = Command::new("chroot");
            if switch {
                c.arg(format!("--userspec={}:{}", self.uid, self.gid));
            }
            c.arg(&self.root).arg(program);
            c
        } else {
            Command::new(program)
        }
    }
}

/// Runs `cmd` (a read) with a deadline; its standard output, or an error with its standard
/// error.
async fn output(cmd: Command, what: &str) -> anyhow::Result<String> {
    let mut cmd = tokio::process::Command::from(cmd);
    cmd.stdin(Stdio::null()).kill_on_drop(true);
    let out = tokio::time::timeout(CTL_TIMEOUT, cmd.output())
        .await
        .with_context(|| format!("{what} did not answer within {} s", CTL_TIMEOUT.as_secs()))?
        .with_context(|| format!("cannot run {what}"))?;
    judge(out, what)
}

/// Runs `cmd` (an action) to its end on this thread: a restart is never cut in half.
fn run_to_end(mut cmd: Command, what: &str) -> anyhow::Result<String> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("cannot run {what}"))?;
    judge(out, what)
}

/// Its output, or an error with the first line of its standard error only: `rabbitmqctl`
/// goes on with diagnostics that include a hash of the Erlang cookie, which stays out of
/// our messages.
fn judge(out: std::process::Output, what: &str) -> anyhow::Result<String> {
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let first = stderr.lines().map(str::trim).find(|l| !l.is_empty());
        bail!(
            "{what} failed ({}): {}",
            out.status,
            first.unwrap_or("no message")
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// What one `rabbitmqctl eval` reads of a node.
const NODE_FACTS: &str = "{application:get_env(rabbit, consumer_timeout), \
     [element(6, L) || L <- rabbit_networking:active_listeners(), \
      element(2, L) =:= node(), element(3, L) =:= amqp orelse element(3, L) =:= 'amqp/ssl']}.";

/// The RabbitMQ node an AMQP URL names, on this machine, and how to reach it with its own
/// `rabbitmqctl`: its node name and its home (where its Erlang cookie is).
#[derive(Debug)]
pub(crate) struct RabbitNode {
    process: Process,
    port: u16,
    /// `rabbit@localhost`.
    pub(crate) name: String,
    ctl: PathBuf,
}

/// What [`RabbitNode::facts`] read.
#[derive(Debug)]
pub(crate) struct NodeFacts {
    /// `consumer_timeout` in milliseconds; `None` when off.
    pub(crate) consumer_timeout_ms: Option<u64>,
}

impl RabbitNode {
    /// The node listening on `url`'s port; an error saying why when there is none here.
    pub(crate) fn find(url: &str) -> anyhow::Result<Self> {
        let (_, port) = host_port(url)?;
        let process = Process::for_url(url)?;
        if !process.program().starts_with("beam") {
            bail!(
                "the process listening on port {port} is {} (pid {}), not a RabbitMQ node",
                process.program(),
                process.pid
            );
        }
        let name = Self::node_name(&process)?;
        let ctl = ["/usr/lib/rabbitmq/bin/rabbitmqctl", "/usr/sbin/rabbitmqctl"]
            .iter()
            .map(PathBuf::from)
            .find(|p| process.outside(p).is_file())
            .or_else(|| {
                (!process.in_own_root())
                    .then(|| which("rabbitmqctl"))
                    .flatten()
            })
            .with_context(|| {
                format!(
                    "the node {name} runs, but no rabbitmqctl is installed beside it{}",
                    if process.in_own_root() {
                        format!(" (in {})", process.root.display())
                    } else {
                        String::new()
                    }
                )
            })?;
        Ok(RabbitNode {
            process,
            port,
            name,
            ctl,
        })
    }

    /// `RABBITMQ_NODENAME` of its environment, else `NODENAME` of its environment file,
    /// else RabbitMQ's default, `rabbit@` and the short host name.
    fn node_name(p: &Process) -> anyhow::Result<String> {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .unwrap_or_default()
            .trim()
            .split('.')
            .next()
            .unwrap_or("localhost")
            .to_owned();
        let from_file = || {
            let file = p
                .env("RABBITMQ_CONF_ENV_FILE")
                .unwrap_or("/etc/rabbitmq/rabbitmq-env.conf");
            std::fs::read_to_string(p.outside(Path::new(file)))
                .ok()?
                .lines()
                .rev()
                .find_map(|l| l.trim().strip_prefix("NODENAME="))
                .map(|v| v.trim_matches(|c| c == '"' || c == '\'').to_owned())
        };
        let name = p
            .env("RABBITMQ_NODENAME")
            .map(str::to_owned)
            .or_else(from_file)
            .unwrap_or_else(|| "rabbit".into());
        Ok(match name.contains('@') {
            true => name,
            false => format!("{name}@{host}"),
        })
    }

    /// `rabbitmqctl -n NODE ARGS…`, with the node's home (its cookie) and epmd address.
    fn ctl_command(&self, args: &[&str]) -> Command {
        let mut cmd = self.process.command(&self.ctl, false);
        cmd.arg("-n").arg(&self.name).args(args);
        for key in ["HOME", "ERL_EPMD_ADDRESS"] {
            if let Some(v) = self.process.env(key) {
                cmd.env(key, v);
            }
        }
        cmd
    }

    async fn ctl(&self, args: &[&str]) -> anyhow::Result<String> {
        let what = format!("rabbitmqctl -n {} {}", self.name, args[0]);
        output(self.ctl_command(args), &what).await
    }

    /// Reads its `consumer_timeout`, and checks that it is the node listening on the URL's
    /// port (as RabbitMQ itself says).
    pub(crate) async fn facts(&self) -> anyhow::Result<NodeFacts> {
        let text = self.ctl(&["eval", NODE_FACTS]).await?;
        // `{{ok,1800000},[5672]}` or `{undefined,[5672]}`.
        let inner = text
            .strip_prefix('{')
            .and_then(|t| t.strip_suffix('}'))
            .with_context(|| format!("cannot read what the node said: {text}"))?;
        let (timeout, ports) = inner
            .rsplit_once(",[")
            .with_context(|| format!("cannot read what the node said: {text}"))?;
        let ports: Vec<u16> = ports
            .trim_end_matches(']')
            .split(',')
            .filter_map(|p| p.trim().parse().ok())
            .collect();
        if !ports.contains(&self.port) {
            bail!(
                "the node {} says it listens for AMQP on {ports:?}, not on port {}",
                self.name,
                self.port
            );
        }
        let consumer_timeout_ms = match timeout.trim() {
            "undefined" => None,
            t => Some(
                t.trim_start_matches("{ok,")
                    .trim_end_matches('}')
                    .parse::<u64>()
                    .with_context(|| format!("cannot read consumer_timeout ({t})"))?,
            ),
        };
        Ok(NodeFacts {
            consumer_timeout_ms,
        })
    }

    /// `stop_app`, `pause`, `start_app`: every connection to the node is closed, its queues
    /// stop and come back. On a blocking thread, which the runtime waits for as it shuts
    /// down: a lab interrupted meanwhile still starts the app again.
    pub(crate) async fn restart_app(&self, pause: Duration) -> anyhow::Result<()> {
        let stop = self.ctl_command(&["stop_app"]);
        let starts: Vec<Command> = (0..START_TRIES)
            .map(|_| self.ctl_command(&["start_app"]))
            .collect();
        tokio::task::spawn_blocking(move || {
            let stopped = run_to_end(stop, "rabbitmqctl stop_app");
            std::thread::sleep(pause);
            // A node left stopped ends the run: a start_app that fails at once (CI once
            // saw exit status 69 with no message, on a loaded machine) is tried again.
            let mut started = Ok(String::new());
            for (i, start) in starts.into_iter().enumerate() {
                if i > 0 {
                    std::thread::sleep(Duration::from_secs(2));
                }
                started = run_to_end(start, "rabbitmqctl start_app");
                if started.is_ok() {
                    break;
                }
            }
            stopped.and(started).map(|_| ())
        })
        .await?
    }
}

/// How many times a RabbitMQ node's `start_app` is tried before the restart fails.
const START_TRIES: usize = 3;

fn which(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join(program))
            .find(|p| p.is_file())
    })
}

/// The PostgreSQL server a URL names, on this machine, and how to restart it: the Debian
/// cluster's `pg_ctlcluster` when `pg_lsclusters` lists its data directory, else its own
/// `pg_ctl` (beside its `postgres`), in its root, as its owner.
#[derive(Debug)]
pub(crate) struct PgServer {
    process: Process,
    /// Its data directory, as seen inside its root.
    pub(crate) data: PathBuf,
    /// `(version, name)` of the Debian cluster it is, if it is one.
    cluster: Option<(String, String)>,
}

impl PgServer {
    /// The postmaster listening on `url`'s port; an error saying why when there is none.
    pub(crate) fn find(url: &str) -> anyhow::Result<Self> {
        let (_, port) = host_port(url)?;
        let process = Process::for_url(url)?;
        if !matches!(process.program().as_str(), "postgres" | "postmaster") {
            bail!(
                "the process listening on port {port} is {} (pid {}), not PostgreSQL",
                process.program(),
                process.pid
            );
        }
        let data = process
            .arg_after("-D")
            .or_else(|| process.env("PGDATA"))
            .map(PathBuf::from)
            .with_context(|| {
                format!(
                    "the postgres listening on port {port} (pid {}) names no data directory (-D or PGDATA)",
                    process.pid
                )
            })?;
        let cluster = (!process.in_own_root())
            .then(|| debian_cluster(&data))
            .flatten();
        if cluster.is_none() {
            let pg_ctl = process.exe.with_file_name("pg_ctl");
            if !process.outside(&pg_ctl).is_file() {
                bail!(
                    "the postgres listening on port {port} is no cluster pg_lsclusters lists, \
                     and has no pg_ctl beside it ({})",
                    pg_ctl.display()
                );
            }
        }
        Ok(PgServer {
            process,
            data,
            cluster,
        })
    }

    /// What restarts it, for messages: `pg_ctlcluster 15 main` or `pg_ctl -D DIR`.
    pub(crate) fn describe(&self) -> String {
        match &self.cluster {
            Some((v, n)) => format!("pg_ctlcluster {v} {n}"),
            None => format!("pg_ctl -D {}", self.data.display()),
        }
    }

    /// Restarts it (a fast shutdown: sessions are ended, the WAL is flushed), and waits until
    /// it accepts connections again; starts it if the restart stopped midway. On a blocking
    /// thread, as [`RabbitNode::restart_app`]: it always ends with the server started.
    pub(crate) async fn restart(&self) -> anyhow::Result<()> {
        let action = |verb: &str| match &self.cluster {
            Some((version, name)) => {
                let mut c = Command::new("pg_ctlcluster");
                c.args(["--skip-systemctl-redirect", version, name, verb]);
                c
            }
            None => {
                let mut c = self
                    .process
                    .command(&self.process.exe.with_file_name("pg_ctl"), true);
                c.current_dir("/")
                    .arg(verb)
                    .arg("-D")
                    .arg(&self.data)
                    .args(["-w", "-t", "60"]);
                if verb == "restart" {
                    c.args(["-m", "fast"]);
                }
                // The server started again writes what it would have written to its
                // parent's output nowhere (its log collector, if it has one, goes on): it
                // must hold no pipe of ours, or reading pg_ctl's output waits for it.
                c.args(["-l", "/dev/null"]);
                c
            }
        };
        let (restart, start) = (action("restart"), action("start"));
        let what = self.describe();
        tokio::task::spawn_blocking(move || {
            let restarted = run_to_end(restart, &format!("{what} restart"));
            if restarted.is_err() {
                let _ = run_to_end(start, &format!("{what} start"));
            }
            restarted.map(|_| ())
        })
        .await?
    }
}

/// The Debian cluster (`pg_lsclusters`) whose data directory is `data`.
fn debian_cluster(data: &Path) -> Option<(String, String)> {
    let out = std::process::Command::new("pg_lsclusters")
        .arg("-h")
        .stdin(Stdio::null())
        .output()
        .ok()?;
    String::from_utf8_lossy(&out.stdout).lines().find_map(|l| {
        // version name port status owner data-directory log-file
        let f: Vec<&str> = l.split_whitespace().collect();
        (f.len() >= 6 && Path::new(f[5]) == data).then(|| (f[0].to_owned(), f[1].to_owned()))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_port_defaults_by_scheme() {
        assert_eq!(
            host_port("amqp://guest:guest@127.0.0.1/%2f").unwrap(),
            ("127.0.0.1".into(), 5672)
        );
        assert_eq!(
            host_port("postgres://u@[::1]:5439/db").unwrap(),
            ("::1".into(), 5439)
        );
        assert!(host_port("sqlite:/tmp/x.db").is_err());
        assert!(is_loopback("::1") && is_loopback("LOCALHOST") && is_loopback("127.0.0.2"));
        assert!(!is_loopback("db.example.com"));
    }
}
