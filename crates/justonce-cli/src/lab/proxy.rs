//! A TCP fault proxy on loopback: workers talk to the broker or the database through it, and
//! the lab cuts every connection, adds delay, or black-holes traffic for a while.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// The proxy's switches, shared by its connection tasks.
#[derive(Debug, Default)]
struct Switches {
    /// Bumped to cut every open connection.
    cuts: AtomicU64,
    /// Added to every chunk forwarded, in milliseconds.
    delay_ms: AtomicU64,
    /// While set, nothing is forwarded and new connections hang: a network black hole.
    blackhole: AtomicBool,
    /// While set, what the clients send is held (what the server sends still arrives): an
    /// asymmetric partition.
    mute_up: AtomicBool,
}

/// A listening proxy to one upstream address (or the first live one of several). Dropping
/// it stops accepting; open connections end with their peers.
#[derive(Debug)]
pub(crate) struct FaultProxy {
    addr: SocketAddr,
    switches: Arc<Switches>,
    cut_tx: watch::Sender<u64>,
    accept: JoinHandle<()>,
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.cut_all();
    }
}

impl FaultProxy {
    /// Listens on an ephemeral loopback port and forwards to `upstream`.
    pub(crate) async fn start(upstream: SocketAddr) -> std::io::Result<Self> {
        Self::start_many(vec![upstream]).await
    }

    /// As [`FaultProxy::start`], to the first of `upstreams` that accepts, starting at the
    /// next one for each new connection: a load balancer in front of a cluster, whose
    /// clients reconnect to a live node when theirs goes down.
    pub(crate) async fn start_many(upstreams: Vec<SocketAddr>) -> std::io::Result<Self> {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
        let addr = listener.local_addr()?;
        let switches = Arc::new(Switches::default());
        let (cut_tx, cut_rx) = watch::channel(0u64);
        let accept = tokio::spawn(accept_loop(
            listener,
            Arc::new(upstreams),
            switches.clone(),
            cut_rx,
        ));
        Ok(FaultProxy {
            addr,
            switches,
            cut_tx,
            accept,
        })
    }

    /// Where clients connect.
    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Closes every open connection at once (both directions); new ones are accepted.
    pub(crate) fn cut_all(&self) {
        let n = self.switches.cuts.fetch_add(1, Ordering::SeqCst) + 1;
        let _ = self.cut_tx.send(n);
    }

    /// Delays every forwarded chunk by `delay` (zero: none).
    pub(crate) fn set_delay(&self, delay: Duration) {
        self.switches
            .delay_ms
            .store(delay.as_millis() as u64, Ordering::SeqCst);
    }

    /// Starts or ends a black hole: bytes are held, not forwarded, and not refused.
    pub(crate) fn set_blackhole(&self, on: bool) {
        self.switches.blackhole.store(on, Ordering::SeqCst);
    }

    /// Starts or ends an asymmetric partition: the clients' bytes are held, the server's
    /// still forwarded.
    pub(crate) fn set_mute_up(&self, on: bool) {
        self.switches.mute_up.store(on, Ordering::SeqCst);
    }
}

async fn accept_loop(
    listener: TcpListener,
    upstreams: Arc<Vec<SocketAddr>>,
    switches: Arc<Switches>,
    cut_rx: watch::Receiver<u64>,
) {
    let mut next = 0usize;
    loop {
        let Ok((client, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let switches = switches.clone();
        let cut_rx = cut_rx.clone();
        let upstreams = upstreams.clone();
        let first = next;
        next = next.wrapping_add(1);
        tokio::spawn(async move {
            while switches.blackhole.load(Ordering::SeqCst) {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let mut server = None;
            for k in 0..upstreams.len() {
                let upstream = upstreams[(first + k) % upstreams.len()];
                if let Ok(s) = TcpStream::connect(upstream).await {
                    server = Some(s);
                    break;
                }
            }
            let Some(server) = server else {
                return; // the client sees the connection close, as with a refused upstream
            };
            let _ = client.set_nodelay(true);
            let _ = server.set_nodelay(true);
            let (cr, cw) = client.into_split();
            let (sr, sw) = server.into_split();
            let up = pipe(cr, sw, true, switches.clone(), cut_rx.clone());
            let down = pipe(sr, cw, false, switches, cut_rx);
            // Either direction ending (or a cut) ends both: a dropped half closes its socket.
            tokio::select! {
                _ = up => {}
                _ = down => {}
            }
        });
    }
}

/// Copies `from` to `to` (`up`: from the client to the server) until either closes or the
/// connection is cut.
async fn pipe(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    up: bool,
    switches: Arc<Switches>,
    mut cut_rx: watch::Receiver<u64>,
) {
    // Marks the current generation seen: `changed` then fires only on a cut after this one.
    let born = *cut_rx.borrow_and_update();
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = tokio::select! {
            r = from.read(&mut buf) => match r {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            },
            _ = cut_rx.changed() => return,
        };
        loop {
            if *cut_rx.borrow() != born {
                return;
            }
            let held = switches.blackhole.load(Ordering::SeqCst)
                || (up && switches.mute_up.load(Ordering::SeqCst));
            if !held {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let delay = switches.delay_ms.load(Ordering::SeqCst);
        if delay > 0 {
            tokio::time::sleep(Duration::from_millis(delay)).await;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

/// `url` with its `host:port` replaced by `addr`, and the original `host:port`.
pub(crate) fn through(url: &str, addr: SocketAddr) -> Option<(String, String)> {
    let (scheme, rest) = url.split_once("://")?;
    let (authority, path) = match rest.find(['/', '?', '#']) {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    let (userinfo, hostport) = match authority.rsplit_once('@') {
        Some((u, h)) => (Some(u), h),
        None => (None, authority),
    };
    let user = userinfo.map(|u| format!("{u}@")).unwrap_or_default();
    Some((
        format!("{scheme}://{user}{addr}{path}"),
        hostport.to_owned(),
    ))
}

#[cfg(test)]
mod tests {
    use super::through;

    #[test]
    fn urls_are_pointed_at_the_proxy() {
        let addr = "127.0.0.1:4000".parse().unwrap();
        assert_eq!(
            through("mysql://root:secret@127.0.0.1:3306/test", addr).unwrap(),
            (
                "mysql://root:secret@127.0.0.1:4000/test".into(),
                "127.0.0.1:3306".into()
            )
        );
        assert_eq!(
            through("postgres://postgres@localhost:5432/test", addr).unwrap(),
            (
                "postgres://postgres@127.0.0.1:4000/test".into(),
                "localhost:5432".into()
            )
        );
        assert_eq!(
            through("rediss://app:pw@cache:6380?tls_ca=/ca.pem", addr).unwrap(),
            (
                "rediss://app:pw@127.0.0.1:4000?tls_ca=/ca.pem".into(),
                "cache:6380".into()
            )
        );
        assert_eq!(through("sqlite:/tmp/x.db", addr), None);
    }
}
