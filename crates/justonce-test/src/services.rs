//! Tests on shared services: ask first, keep to names of your own.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

/// Whether the service at `addr` (`host:port`) answers, for tests that need a real one.
///
/// When it does not: with `JUSTONCE_REQUIRE_SERVICES=1` (as `.ci/run` sets) this panics, so
/// the test fails; without it, it prints a loud line saying the test skipped and returns
/// `false`, and the caller returns early.
pub fn service_available(name: &str, addr: &str) -> bool {
    use std::net::{TcpStream, ToSocketAddrs};
    let up = addr
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .is_some_and(|a| TcpStream::connect_timeout(&a, Duration::from_secs(2)).is_ok());
    if up {
        return true;
    }
    if std::env::var("JUSTONCE_REQUIRE_SERVICES").is_ok_and(|v| v == "1") {
        panic!("{name} is not reachable at {addr} and JUSTONCE_REQUIRE_SERVICES=1: start it (see DEVELOPERS.md)");
    }
    eprintln!("SKIPPED: {name} is not reachable at {addr}; this test did not run (set JUSTONCE_REQUIRE_SERVICES=1 to make it fail instead)");
    false
}

/// A name no other test run uses at the same time (`prefix_PID_NANOS_N`), for the tables,
/// queues and streams a test creates on a shared service.
///
/// ```
/// let a = justonce_test::unique_name("jo_t");
/// assert!(a.starts_with("jo_t_") && justonce_core::validate_identifier(&a).is_ok());
/// ```
pub fn unique_name(prefix: &str) -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("{prefix}_{}_{nanos:x}_{n}", std::process::id())
}

/// What a backend's test does once its rule passed: drop the tables it made.
type Cleanup = Box<dyn FnOnce() -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;

/// A backend for one rule's test, what must live as long as it (a temporary directory
/// holding its SQLite file), and what to do once the rule passed (drop its tables on a
/// shared server).
pub struct Backend<T> {
    value: T,
    keep: Option<Box<dyn Send + Sync>>,
    cleanup: Option<Cleanup>,
}

impl<T> Backend<T> {
    /// A backend that needs nothing kept.
    pub fn new(value: T) -> Self {
        Backend {
            value,
            keep: None,
            cleanup: None,
        }
    }

    /// Keeps `guard` (a `tempfile::TempDir`) until the test ends.
    pub fn keeping(mut self, guard: impl Send + Sync + 'static) -> Self {
        self.keep = Some(Box::new(guard));
        self
    }

    /// Runs `cleanup` once the rule passed (a failed rule leaves its tables to look at).
    pub fn cleaning_up<F, Fut>(mut self, cleanup: F) -> Self
    where
        F: FnOnce() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        self.cleanup = Some(Box::new(move || Box::pin(cleanup())));
        self
    }

    /// The backend.
    pub fn value(&self) -> &T {
        &self.value
    }

    /// The rule passed: clean up, then let go of what was kept.
    pub async fn finish(mut self) {
        if let Some(cleanup) = self.cleanup.take() {
            cleanup().await;
        }
        drop(self.keep.take());
    }
}

/// The root of Debian 13's servers that `scripts/debian13.sh install` builds (RabbitMQ 4.0,
/// NATS 2.10, Redis 8.0, Valkey 8.1, PostgreSQL 17, MariaDB 11.8), with `/proc` mounted in
/// it: `JUSTONCE_DEBIAN13_ROOT`, else `~/.cache/justonce/debian13`. `None` when it is
/// missing, said on stderr; with JUSTONCE_REQUIRE_SERVICES=1 its absence fails the test
/// instead. A harness makes its servers' directories in the root's own `/tmp`.
pub fn debian13_root() -> Option<std::path::PathBuf> {
    let root = std::env::var_os("JUSTONCE_DEBIAN13_ROOT")
        .map(std::path::PathBuf::from)
        .or_else(|| {
            let cache = std::env::var_os("XDG_CACHE_HOME")
                .map(std::path::PathBuf::from)
                .or_else(|| {
                    std::env::var_os("HOME").map(|h| std::path::PathBuf::from(h).join(".cache"))
                })?;
            Some(cache.join("justonce").join("debian13"))
        })?;
    let ready = root.join(".justonce-ready").is_file();
    let proc = root.join("proc/self").exists();
    if ready && proc {
        return Some(root);
    }
    let why = if ready {
        "its /proc is not mounted (scripts/debian13.sh install mounts it)"
    } else {
        "it is not built (scripts/debian13.sh install)"
    };
    assert!(
        std::env::var("JUSTONCE_REQUIRE_SERVICES").as_deref() != Ok("1"),
        "Debian 13's servers at {}: {why}, and JUSTONCE_REQUIRE_SERVICES=1",
        root.display()
    );
    eprintln!("SKIPPED: Debian 13's servers at {}: {why}", root.display());
    None
}
