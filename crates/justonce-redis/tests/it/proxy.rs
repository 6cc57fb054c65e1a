//! A TCP proxy that can lose a reply: armed, it takes the next bytes the server sends, does
//! not pass them on, and closes the client's connection. The command ran; its caller
//! never hears so. That is an ambiguous reply, made on purpose. It can also drop a request
//! that carries given bytes, and close that connection: the command never ran.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A proxy to one upstream address.
pub(crate) struct LossyProxy {
    port: u16,
    armed: Arc<AtomicBool>,
    lost: Arc<AtomicUsize>,
    drop_request: Arc<Mutex<Option<Vec<u8>>>>,
    task: tokio::task::JoinHandle<()>,
}

impl LossyProxy {
    /// Listens on a free port, forwarding to `upstream`.
    pub(crate) async fn start(upstream: String) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let armed = Arc::new(AtomicBool::new(false));
        let lost = Arc::new(AtomicUsize::new(0));
        let drop_request = Arc::new(Mutex::new(None));
        let (a, l, d) = (armed.clone(), lost.clone(), drop_request.clone());
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = TcpStream::connect(&upstream).await else {
                    continue;
                };
                tokio::spawn(pipe(client, server, a.clone(), l.clone(), d.clone()));
            }
        });
        LossyProxy {
            port,
            armed,
            lost,
            drop_request,
            task,
        }
    }

    /// `redis://127.0.0.1:PORT`.
    pub(crate) fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Loses the next reply, and closes that connection.
    pub(crate) fn lose_next_reply(&self) {
        self.armed.store(true, Ordering::SeqCst);
    }

    /// Drops the next request that carries `bytes` (it never reaches the server), and
    /// closes that connection.
    pub(crate) fn drop_next_request_with(&self, bytes: &[u8]) {
        *self.drop_request.lock().unwrap() = Some(bytes.to_vec());
    }

    /// Replies lost so far.
    pub(crate) fn lost(&self) -> usize {
        self.lost.load(Ordering::SeqCst)
    }
}

impl Drop for LossyProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn pipe(
    client: TcpStream,
    server: TcpStream,
    armed: Arc<AtomicBool>,
    lost: Arc<AtomicUsize>,
    drop_request: Arc<Mutex<Option<Vec<u8>>>>,
) {
    let (mut cr, mut cw) = client.into_split();
    let (mut sr, mut sw) = server.into_split();
    let up = tokio::spawn(async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match cr.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    let drop_it = {
                        let mut d = drop_request.lock().unwrap();
                        let hit = d
                            .as_deref()
                            .is_some_and(|p| buf[..n].windows(p.len()).any(|w| w == p));
                        if hit {
                            *d = None;
                        }
                        hit
                    };
                    if drop_it {
                        // Dropping the write half and returning closes the server side;
                        // the reader below then closes the client's.
                        return;
                    }
                    if sw.write_all(&buf[..n]).await.is_err() {
                        return;
                    }
                }
            }
        }
    });
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match sr.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if armed.swap(false, Ordering::SeqCst) {
                    lost.fetch_add(1, Ordering::SeqCst);
                    break;
                }
                if cw.write_all(&buf[..n]).await.is_err() {
                    break;
                }
            }
        }
    }
    up.abort();
    let _ = cw.shutdown().await;
}
