//! A RabbitMQ cluster of one's own on loopback, for tests and fault labs (feature
//! `harness`): N nodes of the installed `rabbitmq-server`, each with a node name, AMQP and
//! distribution ports, a data directory and an Erlang cookie of its own, joined into one
//! cluster. A node can be SIGKILLed, stopped gracefully, restarted as an app, and started
//! again on its own data; the leader of a quorum queue can be asked for. Every node still
//! running is SIGKILLed when the cluster is dropped. The node the machine runs (`rabbit@…`
//! on :5672) is never touched.

use std::io;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::process::Command;

/// How long a node may take to boot.
const BOOT: Duration = Duration::from_secs(120);

/// One node of a [`Cluster`].
#[derive(Debug)]
struct Node {
    name: String,
    amqp: u16,
    /// The TLS listener's port, when the node has one.
    amqps: Option<u16>,
    dist: u16,
    dir: PathBuf,
    up: bool,
}

/// What a node's TLS listener presents and trusts: PEM files.
#[derive(Debug, Clone)]
pub struct NodeTls {
    /// The node's certificate.
    pub cert: PathBuf,
    /// The node's key.
    pub key: PathBuf,
    /// The authority of the client certificates it accepts.
    pub ca: PathBuf,
}

/// A cluster of RabbitMQ nodes this program started.
#[derive(Debug)]
pub struct Cluster {
    nodes: Vec<Node>,
    home: PathBuf,
    /// The root its RabbitMQ is installed in (`chroot`), when not the machine's.
    root: Option<PathBuf>,
    /// Removed when the cluster is dropped.
    _dir: tempfile::TempDir,
}

/// Where the RabbitMQ scripts are: Debian's `/usr/lib/rabbitmq/bin` (the `/usr/sbin`
/// wrappers switch to the `rabbitmq` user, whose cookie and directories are the machine
/// node's), else the `PATH`.
fn script(name: &str) -> Option<PathBuf> {
    let debian = Path::new("/usr/lib/rabbitmq/bin").join(name);
    if debian.is_file() {
        return Some(debian);
    }
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join(name))
            .find(|p| p.is_file())
    })
}

/// The deprecated features of RabbitMQ 4.0, each denied (4.3 denies them by default):
/// a node of another root starts with these, so that the tests on it fail if justonce uses
/// one.
const DENY_DEPRECATED: &str = "deprecated_features.permit.transient_nonexcl_queues = false\n\
     deprecated_features.permit.global_qos = false\n\
     deprecated_features.permit.queue_master_locator = false\n\
     deprecated_features.permit.classic_queue_mirroring = false\n\
     deprecated_features.permit.ram_node_type = false\n";

/// Where Debian installs RabbitMQ's scripts, inside a root.
const DEBIAN_SCRIPTS: &str = "/usr/lib/rabbitmq/bin";

/// `name`, run inside `root` (`chroot`) when given, else the machine's.
fn command(root: Option<&Path>, name: &str) -> io::Result<Command> {
    match root {
        Some(root) => {
            let inside = Path::new(DEBIAN_SCRIPTS).join(name);
            if !root
                .join(inside.strip_prefix("/").unwrap_or(&inside))
                .is_file()
            {
                return Err(io::Error::other(format!(
                    "{name} is not installed in {}",
                    root.display()
                )));
            }
            let mut c = Command::new("chroot");
            c.arg(root).arg(inside);
            Ok(c)
        }
        None => script(name)
            .map(Command::new)
            .ok_or_else(|| io::Error::other(format!("{name} is not installed"))),
    }
}

fn free_port() -> io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

impl Cluster {
    /// Whether `rabbitmq-server` and `rabbitmqctl` are installed.
    pub fn installed() -> bool {
        script("rabbitmq-server").is_some() && script("rabbitmqctl").is_some()
    }

    /// Starts `n` nodes on free loopback ports and joins them to the first; returns once
    /// every node runs the `rabbit` app in the cluster (about 10 s a node on two cores).
    pub async fn start(n: usize) -> io::Result<Self> {
        Self::start_with(n, None, None, "").await
    }

    /// [`Cluster::start`] with `conf` (lines of `rabbitmq.conf`, say `consumer_timeout =
    /// 45000`) added to every node's configuration, and the RabbitMQ of `root` when given
    /// (as [`Cluster::start_in`]).
    pub async fn start_configured(n: usize, root: Option<&Path>, conf: &str) -> io::Result<Self> {
        Self::start_with(n, None, root, conf).await
    }

    /// [`Cluster::start`] with the RabbitMQ installed in `root`, a Debian root of another
    /// release (`scripts/debian13.sh`: RabbitMQ 4.0), run with `chroot`, the nodes' data
    /// directories in the root's own `/tmp`, and every deprecated feature denied (as 4.3
    /// denies them by default). The root needs `/proc` mounted (the script mounts it).
    pub async fn start_in(root: &Path, n: usize) -> io::Result<Self> {
        Self::start_with(n, None, Some(root), "").await
    }

    /// The version of RabbitMQ the first node runs (`rabbitmqctl version`).
    pub async fn version(&self) -> io::Result<String> {
        Ok(self.ctl_output(0, &["version"]).await?.trim().to_owned())
    }

    /// One node, like [`Cluster::start`], with a TLS listener beside its plaintext one
    /// ([`Cluster::amqps_url`]): it presents `tls.cert`, asks clients for a certificate of
    /// `tls.ca` (not requiring one), and logs in by certificate (`EXTERNAL`, the common
    /// name as user name: the `rabbitmq_auth_mechanism_ssl` plugin) as well as by
    /// password.
    pub async fn start_tls(tls: &NodeTls) -> io::Result<Self> {
        Self::start_with(1, Some(tls), None, "").await
    }

    async fn start_with(
        n: usize,
        tls: Option<&NodeTls>,
        root: Option<&Path>,
        extra: &str,
    ) -> io::Result<Self> {
        if n == 0 {
            return Err(io::Error::other("a cluster needs at least one node"));
        }
        // A root's servers see its own /tmp: their directories are made there.
        let dir = match root {
            Some(root) => tempfile::Builder::new()
                .prefix("justonce-rabbit-")
                .tempdir_in(root.join("tmp"))?,
            None => tempfile::Builder::new()
                .prefix("justonce-rabbit-")
                .tempdir()?,
        };
        let home = dir.path().to_owned();
        let cookie: String = (0..24).map(|_| fastrand::uppercase()).collect();
        let cookie_file = home.join(".erlang.cookie");
        std::fs::write(&cookie_file, cookie)?;
        {
            use std::os::unix::fs::PermissionsExt as _;
            std::fs::set_permissions(&cookie_file, std::fs::Permissions::from_mode(0o400))?;
        }
        let tag = format!("{}{}", std::process::id(), fastrand::u32(..));
        let mut nodes = Vec::with_capacity(n);
        for i in 1..=n {
            let node_dir = home.join(format!("node{i}"));
            std::fs::create_dir_all(&node_dir)?;
            let amqp = free_port()?;
            let dist = free_port()?;
            let mut conf =
                format!("listeners.tcp.default = 127.0.0.1:{amqp}\nloopback_users = none\n");
            if root.is_some() {
                // What RabbitMQ 4.3 denies by default, denied now: justonce must use none.
                conf.push_str(DENY_DEPRECATED);
            }
            conf.push_str(extra);
            if !extra.ends_with('\n') {
                conf.push('\n');
            }
            let mut plugins = "[].\n";
            let amqps = match tls {
                Some(tls) => {
                    let port = free_port()?;
                    conf.push_str(&format!(
                        "listeners.ssl.default = 127.0.0.1:{port}\n\
                         ssl_options.cacertfile = {}\nssl_options.certfile = {}\n\
                         ssl_options.keyfile = {}\nssl_options.verify = verify_peer\n\
                         ssl_options.fail_if_no_peer_cert = false\n\
                         auth_mechanisms.1 = PLAIN\nauth_mechanisms.2 = AMQPLAIN\n\
                         auth_mechanisms.3 = EXTERNAL\nssl_cert_login_from = common_name\n",
                        tls.ca.display(),
                        tls.cert.display(),
                        tls.key.display()
                    ));
                    plugins = "[rabbitmq_auth_mechanism_ssl].\n";
                    Some(port)
                }
                None => None,
            };
            std::fs::write(node_dir.join("rabbitmq.conf"), conf)?;
            std::fs::write(node_dir.join("env.conf"), "")?;
            std::fs::write(node_dir.join("enabled_plugins"), plugins)?;
            nodes.push(Node {
                name: format!("justonce{tag}n{i}@localhost"),
                amqp,
                amqps,
                dist,
                dir: node_dir,
                up: false,
            });
        }
        let mut cluster = Cluster {
            nodes,
            home,
            root: root.map(Path::to_owned),
            _dir: dir,
        };
        cluster.start_all().await?;
        let first = cluster.nodes[0].name.clone();
        for i in 1..n {
            cluster.ctl(i, &["stop_app"]).await?;
            cluster.ctl(i, &["join_cluster", &first]).await?;
            cluster.ctl(i, &["start_app"]).await?;
        }
        Ok(cluster)
    }

    /// Nodes in the cluster.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether it has no node (never: [`Cluster::start`] refuses 0).
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// `amqp://guest:guest@127.0.0.1:PORT/%2f` of node `i`.
    pub fn url(&self, i: usize) -> String {
        format!("amqp://guest:guest@127.0.0.1:{}/%2f", self.nodes[i].amqp)
    }

    /// `amqps://127.0.0.1:PORT/%2f` of node `i`'s TLS listener ([`Cluster::start_tls`]).
    pub fn amqps_url(&self, i: usize) -> Option<String> {
        self.nodes[i]
            .amqps
            .map(|port| format!("amqps://127.0.0.1:{port}/%2f"))
    }

    /// Adds the user `name` with `password` and every permission on `/`.
    pub async fn add_user(&self, name: &str, password: &str) -> io::Result<()> {
        self.ctl(0, &["add_user", name, password]).await?;
        self.ctl(0, &["set_permissions", "-p", "/", name, ".*", ".*", ".*"])
            .await
    }

    /// The AMQP address of node `i`.
    pub fn addr(&self, i: usize) -> std::net::SocketAddr {
        std::net::SocketAddr::from(([127, 0, 0, 1], self.nodes[i].amqp))
    }

    /// SIGKILLs node `i`'s Erlang VM, as a crash or a lost machine would.
    pub async fn kill(&mut self, i: usize) {
        if let Some(pid) = self.pid(i) {
            sigkill(pid);
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline && self.answers(i) {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        self.nodes[i].up = false;
    }

    /// Stops node `i` gracefully (`rabbitmqctl stop`: its queues hand over leadership, its
    /// connections are closed by the server) and waits until it has halted.
    pub async fn stop(&mut self, i: usize) -> io::Result<()> {
        self.ctl(i, &["stop"]).await?;
        self.nodes[i].up = false;
        Ok(())
    }

    /// Stops the `rabbit` app of node `i` (`stop_app`): the VM stays up, every connection
    /// to the node is closed, its queue members stop. [`Cluster::start_app`] brings it back.
    pub async fn stop_app(&mut self, i: usize) -> io::Result<()> {
        self.ctl(i, &["stop_app"]).await?;
        self.nodes[i].up = false;
        Ok(())
    }

    /// Starts the `rabbit` app of node `i` again after [`Cluster::stop_app`].
    pub async fn start_app(&mut self, i: usize) -> io::Result<()> {
        self.ctl(i, &["start_app"]).await?;
        self.nodes[i].up = true;
        Ok(())
    }

    /// Starts node `i` again on its own data (after [`Cluster::kill`] or [`Cluster::stop`]);
    /// it rejoins the cluster by itself.
    pub async fn start_node(&mut self, i: usize) -> io::Result<()> {
        self.launch(i).await?;
        self.await_boot(i).await
    }

    /// Starts every node that is down side by side (a node waits at boot for the others'
    /// tables, so one at a time may never finish), and waits for each.
    pub async fn start_all(&mut self) -> io::Result<()> {
        let down: Vec<usize> = (0..self.nodes.len())
            .filter(|i| !self.nodes[*i].up)
            .collect();
        for &i in &down {
            self.launch(i).await?;
        }
        for &i in &down {
            self.await_boot(i).await?;
        }
        Ok(())
    }

    /// The node leading quorum queue `queue` of the default vhost, asked of a running node;
    /// `None` while it has no leader or no node answers.
    pub async fn leader(&self, queue: &str) -> Option<usize> {
        for i in (0..self.nodes.len()).filter(|i| self.nodes[*i].up) {
            let Ok(out) = self
                .ctl_output(
                    i,
                    &["list_queues", "-q", "--no-table-headers", "name", "leader"],
                )
                .await
            else {
                continue;
            };
            for line in out.lines() {
                let mut cols = line.split('\t');
                if cols.next() == Some(queue) {
                    let leader = cols.next().unwrap_or("").trim();
                    return self.nodes.iter().position(|n| n.name == leader);
                }
            }
            return None;
        }
        None
    }

    fn pid(&self, i: usize) -> Option<u32> {
        std::fs::read_to_string(self.nodes[i].dir.join("pid"))
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    fn answers(&self, i: usize) -> bool {
        std::net::TcpStream::connect_timeout(&self.addr(i), Duration::from_millis(200)).is_ok()
    }

    /// `path` as the servers see it: under the root, without the root's prefix.
    fn inside(&self, path: &Path) -> PathBuf {
        match &self.root {
            Some(root) => Path::new("/").join(path.strip_prefix(root).unwrap_or(path)),
            None => path.to_owned(),
        }
    }

    async fn launch(&mut self, i: usize) -> io::Result<()> {
        let mut server = command(self.root.as_deref(), "rabbitmq-server")?;
        let node = &self.nodes[i];
        let d = &node.dir;
        // A killed node leaves its pid file behind; a new one is written once it runs.
        let _ = std::fs::remove_file(d.join("pid"));
        let at = |p: PathBuf| self.inside(&p);
        let status = server
            .arg("-detached")
            .current_dir(d)
            .env("HOME", self.inside(&self.home))
            .env("RABBITMQ_CONF_ENV_FILE", at(d.join("env.conf")))
            .env("RABBITMQ_NODENAME", &node.name)
            .env("RABBITMQ_NODE_IP_ADDRESS", "127.0.0.1")
            .env("RABBITMQ_NODE_PORT", node.amqp.to_string())
            .env("RABBITMQ_DIST_PORT", node.dist.to_string())
            .env("RABBITMQ_CONFIG_FILE", at(d.join("rabbitmq.conf")))
            .env(
                "RABBITMQ_ENABLED_PLUGINS_FILE",
                at(d.join("enabled_plugins")),
            )
            .env("RABBITMQ_MNESIA_BASE", at(d.join("mnesia")))
            .env("RABBITMQ_LOG_BASE", at(d.join("log")))
            .env("RABBITMQ_PID_FILE", at(d.join("pid")))
            .env(
                "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS",
                "-kernel inet_dist_use_interface {127,0,0,1}",
            )
            .env("ERL_EPMD_ADDRESS", "127.0.0.1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .await?;
        if !status.success() {
            return Err(io::Error::other(format!(
                "rabbitmq-server -detached for {} failed ({status})",
                node.name
            )));
        }
        Ok(())
    }

    async fn await_boot(&mut self, i: usize) -> io::Result<()> {
        let deadline = Instant::now() + BOOT;
        // `await_startup` needs the node's pid file, which the detached start writes late.
        while self.pid(i).is_none() {
            if Instant::now() > deadline {
                return Err(io::Error::other(format!(
                    "{} did not start within {} s; see {}",
                    self.nodes[i].name,
                    BOOT.as_secs(),
                    self.nodes[i].dir.join("log").display()
                )));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        // The node registers with epmd a moment after its pid file appears.
        loop {
            let left = deadline
                .saturating_duration_since(Instant::now())
                .as_secs()
                .max(1);
            match self
                .ctl(i, &["await_startup", "--timeout", &left.to_string()])
                .await
            {
                Ok(()) => break,
                Err(e) if Instant::now() > deadline => return Err(e),
                Err(_) => tokio::time::sleep(Duration::from_millis(500)).await,
            }
        }
        self.nodes[i].up = true;
        Ok(())
    }

    async fn ctl(&self, i: usize, args: &[&str]) -> io::Result<()> {
        self.ctl_output(i, args).await.map(|_| ())
    }

    async fn ctl_output(&self, i: usize, args: &[&str]) -> io::Result<String> {
        let out = command(self.root.as_deref(), "rabbitmqctl")?
            .arg("-n")
            .arg(&self.nodes[i].name)
            .args(args)
            .env("HOME", self.inside(&self.home))
            .env("ERL_EPMD_ADDRESS", "127.0.0.1")
            .stdin(Stdio::null())
            .output()
            .await?;
        if !out.status.success() {
            return Err(io::Error::other(format!(
                "rabbitmqctl -n {} {}: {}",
                self.nodes[i].name,
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for i in 0..self.nodes.len() {
            if let Some(pid) = self.pid(i) {
                sigkill(pid);
            }
        }
    }
}

/// SIGKILL with kill(1) (the workspace forbids `unsafe`, so no libc::kill).
fn sigkill(pid: u32) {
    let _ = std::process::Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}
