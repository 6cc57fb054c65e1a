//! `--metrics-addr`: a worker's Prometheus metrics checked against its ledger, its probes
//! following its health, and the lab's scrapes held against the business data.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

fn justonce(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_justonce"))
        .args(args)
        .output()
        .expect("the justonce binary runs")
}

/// `GET path`: the status and the body.
fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_owned();
    (status, body)
}

/// The sum of the samples of `name` in Prometheus text, those with `label` only when given.
fn sample(text: &str, name: &str, label: Option<&str>) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")) || l.starts_with(&format!("{name} ")))
        .filter(|l| label.is_none_or(|want| l.contains(want)))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum()
}

/// Starts a worker serving its metrics on a free port; answers it and the port.
fn worker(transport: &str, store: &str) -> (Child, SocketAddr) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_justonce"))
        .args(["worker", "--transport", transport, "--store", store])
        .args(["--metrics-addr", "127.0.0.1:0", "--metrics-poll-secs", "1"])
        .args(["--backoff-max-ms", "400", "--lease-ms", "500"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("worker starts");
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let addr = loop {
        let line = lines
            .next()
            .expect("the worker says where it listens")
            .unwrap();
        if let Some(a) = line.strip_prefix("justonce-metrics listening on ") {
            break a.trim().parse().unwrap();
        }
    };
    // Keep reading, so that the worker never blocks on a full pipe.
    std::thread::spawn(move || lines.for_each(drop));
    (child, addr)
}

/// Polls until `check` holds, or panics after `secs` with the last metrics.
fn until(addr: SocketAddr, secs: u64, what: &str, check: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let (_, text) = get(addr, "/metrics");
        if check(&text) {
            return text;
        }
        assert!(Instant::now() < deadline, "{what} within {secs} s:\n{text}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A pool that waits for the worker's write lock.
async fn pool(url: &str) -> sqlx::SqlitePool {
    let opts: sqlx::sqlite::SqliteConnectOptions = url.parse().unwrap();
    sqlx::SqlitePool::connect_with(opts.busy_timeout(Duration::from_secs(20)))
        .await
        .unwrap()
}

async fn count(url: &str, sql: &str) -> i64 {
    let pool = pool(url).await;
    let n = sqlx::query_scalar(sql).fetch_one(&pool).await.unwrap();
    pool.close().await;
    n
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_serves_metrics_that_match_its_ledger_and_probes_that_follow_its_health() {
    let dir = tempfile::tempdir().unwrap();
    let transport = format!("sqlite:{}", dir.path().join("q.db").display());
    let store = format!("sqlite:{}", dir.path().join("s.db").display());
    let published = justonce(&[
        "publish",
        "--transport",
        &transport,
        "--queue",
        "orders",
        "--messages",
        "4000",
    ]);
    assert!(published.status.success(), "{published:?}");
    let (mut child, addr) = worker(&transport, &store);

    // Drained: every delivery received has its outcome, and nothing is left to receive.
    let outcome = |o: &str| format!("outcome=\"{o}\"");
    let text = until(addr, 120, "the queue drains", |t| {
        let received = sample(t, "justonce_deliveries_received_total", None);
        received >= 4000.0 && sample(t, "justonce_deliveries_total", None) == received
    });
    std::thread::sleep(Duration::from_millis(1500)); // the gauges' next read
    let text = until(addr, 10, "the gauges are read", |t| {
        sample(t, "justonce_dedup_records", None)
            >= sample(
                &text,
                "justonce_deliveries_total",
                Some(&outcome("applied")),
            )
    });
    let ledger = count(&store, "SELECT COUNT(*) FROM jo_demo_ledger").await;
    let dedup = count(&store, "SELECT COUNT(*) FROM jo_demo_dedup").await;
    let dead = count(&transport, "SELECT COUNT(*) FROM jo_dead_letter").await;
    let received = sample(&text, "justonce_deliveries_received_total", None);
    assert_eq!(
        sample(
            &text,
            "justonce_deliveries_total",
            Some(&outcome("applied"))
        ),
        ledger as f64,
        "applied deliveries are the ledger's rows"
    );
    assert!(ledger > 3900, "{ledger}");
    assert_eq!(
        sample(
            &text,
            "justonce_deliveries_total",
            Some(&outcome("dead_letter"))
        ),
        dead as f64
    );
    assert!(dead >= 1, "the plan's poison is dead-lettered");
    assert!(
        sample(
            &text,
            "justonce_deliveries_total",
            Some(&outcome("duplicate"))
        ) > 0.0,
        "the plan publishes some orders twice"
    );
    assert_eq!(
        sample(&text, "justonce_dead_letters", None),
        dead as f64,
        "the dead-letter gauge reads the queue"
    );
    assert_eq!(sample(&text, "justonce_dedup_records", None), dedup as f64);
    assert!(
        text.contains("messaging_system=\"sqlite\"")
            && text.contains("messaging_destination_name=\"orders\"")
            && text.contains("messaging_consumer_group_name=\"payments\""),
        "OpenTelemetry's messaging attributes label the series"
    );
    let handled = sample(&text, "justonce_handler_duration_seconds_count", None);
    let applied = sample(
        &text,
        "justonce_deliveries_total",
        Some(&outcome("applied")),
    );
    assert!(
        handled >= applied && handled <= received,
        "a handler run per applied delivery, and for poison that reached the handler: {handled}"
    );
    assert!(received >= 4000.0);
    // Every series the example dashboard reads is one the worker serves.
    let dashboard = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../docs/grafana/justonce.json"
    ))
    .unwrap();
    let mut names: Vec<&str> = dashboard
        .match_indices("justonce_")
        .map(|(at, _)| {
            let rest = &dashboard[at..];
            let end = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            &rest[..end]
        })
        .collect();
    names.sort_unstable();
    names.dedup();
    assert!(names.len() >= 10, "{names:?}");
    for name in names {
        assert!(
            text.contains(&format!("{name}{{")),
            "the dashboard reads {name}, which is not served"
        );
    }
    assert_eq!(get(addr, "/healthz"), (200, "ok\n".into()));
    assert_eq!(get(addr, "/readyz"), (200, "ready\n".into()));
    assert_eq!(get(addr, "/nope").0, 404);

    // A deploy mistake: the dedup table renamed away. The next delivery's batch fails and
    // the worker pauses: not ready, and says why. The table back, it is ready again.
    let pool = pool(&store).await;
    sqlx::query("ALTER TABLE jo_demo_dedup RENAME TO jo_demo_dedup_away")
        .execute(&pool)
        .await
        .unwrap();
    let again = justonce(&[
        "publish",
        "--transport",
        &transport,
        "--queue",
        "orders",
        "--messages",
        "1",
    ]);
    assert!(again.status.success(), "{again:?}");
    let deadline = Instant::now() + Duration::from_secs(30);
    let (status, why) = loop {
        let r = get(addr, "/readyz");
        if r.0 != 200 || Instant::now() > deadline {
            break r;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(status, 503, "{why}");
    assert!(why.contains("pausing"), "{why}");
    let failed = until(addr, 10, "the failed batch is counted", |t| {
        sample(t, "justonce_batches_failed_total", None) >= 1.0
    });
    assert!(
        sample(
            &failed,
            "justonce_deliveries_total",
            Some(&outcome("released"))
        ) >= 1.0
    );
    sqlx::query("ALTER TABLE jo_demo_dedup_away RENAME TO jo_demo_dedup")
        .execute(&pool)
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while get(addr, "/readyz").0 != 200 {
        assert!(
            Instant::now() < deadline,
            "ready again once the table is back"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    child.kill().unwrap();
    child.wait().unwrap();
}

/// The lab scrapes each worker before it stops it and holds the sums against the business
/// data (a kill at a fault point and a pause included); `--keep` leaves the run's dead
/// letters, and `justonce dlq list` groups the plan's poison by reason.
#[test]
fn the_lab_s_scraped_counts_match_its_data_and_dlq_groups_its_poison() {
    let out = justonce(&[
        "lab",
        "--json",
        "--workers",
        "2",
        "--lease-ms",
        "500",
        "--messages",
        "4000",
        "--faults",
        "pause",
        "--kills",
        "1",
        "--metrics-addr",
        "127.0.0.1:0",
        "--keep",
    ]);
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!("{e}: {}", String::from_utf8_lossy(&out.stderr));
    });
    let kept = &r["kept"];
    let dir = kept["transport"]
        .as_str()
        .and_then(|t| t.strip_prefix("sqlite:"))
        .map(|p| std::path::Path::new(p).parent().unwrap().to_owned())
        .expect("the SQLite default keeps its directory");
    let _cleanup = Cleanup(dir);
    assert!(out.status.success(), "{r}");
    assert_eq!(r["verdict"], "pass", "{r}");
    let m = &r["metrics"];
    let n = |v: &serde_json::Value, k: &str| v[k].as_u64().unwrap_or_else(|| panic!("{k} in {v}"));
    assert_eq!((n(m, "failed_scrapes"), n(m, "unscraped")), (0, 0), "{r}");
    assert!(
        n(&r["faults"], "kills") >= 1 && n(&r["faults"], "pauses") >= 1,
        "{r}"
    );
    assert_eq!(n(m, "applied"), n(&r, "effects"), "{r}");
    assert!(n(m, "received") >= n(&r, "deliveries"), "{r}");
    assert!(n(m, "redelivered") >= n(&r, "redeliveries"), "{r}");
    let dead = n(m, "dead_letter") + n(m, "conflict");
    assert!(dead >= 1 && dead >= n(&r, "dead_lettered"), "{r}");

    let list = justonce(&[
        "dlq",
        "list",
        "--transport",
        kept["transport"].as_str().unwrap(),
        "--queue",
        kept["queue"].as_str().unwrap(),
        "--json",
    ]);
    assert!(list.status.success(), "{list:?}");
    let list: serde_json::Value = serde_json::from_slice(&list.stdout).unwrap();
    assert_eq!(list["dead_letters"].as_u64(), Some(dead), "{list}");
    let groups = list["groups"].as_array().unwrap();
    let counted: u64 = groups.iter().map(|g| n(g, "count")).sum();
    assert_eq!(counted, dead, "{list}");
    for g in groups {
        let reason = g["reason"].as_str().unwrap();
        assert!(
            !reason.chars().any(|c| c.is_ascii_digit()),
            "ids and numbers are taken out of a group's reason: {reason}"
        );
    }
}

/// Removes a directory the lab kept.
struct Cleanup(std::path::PathBuf);

impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
