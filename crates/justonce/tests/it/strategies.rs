//! The idempotency methods, each on the embedded SQLite default: two consumers receiving
//! the same message at the same time produce exactly one effect.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use justonce::sql::{
    SqliteClaimStore, SqliteQueue, SqliteQueueOptions, SqliteStateGuard, SqliteStore, SqliteTx,
    SqliteVersionGuard,
};
use justonce::{
    Consumer, ConsumerOptions, Context, Disposition, Handler, Idempotency, Message, Publisher,
    Result, StateMachine,
};
use sqlx::SqlitePool;

#[derive(Debug, Clone, Copy, PartialEq)]
enum Method {
    DedupTable,
    UniqueKey,
    StateMachine,
    Version,
    Claim,
}

impl Method {
    fn idempotency(self) -> Idempotency {
        match self {
            Method::DedupTable => Idempotency::DedupTable,
            Method::UniqueKey => Idempotency::UniqueKey,
            Method::StateMachine | Method::Version => Idempotency::Guard,
            Method::Claim => Idempotency::Claim,
        }
    }
}

/// A payment whose effect is a ledger row (or, for claims, a call to an "external API"
/// that records every call with its idempotency key and fencing token).
struct Pay {
    method: Method,
    api: SqlitePool,
    state: SqliteStateGuard,
    version: SqliteVersionGuard,
    fail_first: bool,
    duplicates_seen: Arc<Mutex<Vec<Option<Vec<u8>>>>>,
}

impl Handler<SqliteTx> for Pay {
    async fn handle(&self, cx: &Context<'_>, tx: &mut SqliteTx) -> Result<Disposition> {
        if self.fail_first && cx.attempt() == 1 {
            return Ok(Disposition::retry_after(
                Duration::from_millis(10),
                "card network timeout",
            ));
        }
        let order = cx.message().id().unwrap().as_str().to_owned();
        match self.method {
            Method::DedupTable => {}
            Method::UniqueKey => {
                sqlx::query("INSERT INTO orders_unique (order_id) VALUES (?)")
                    .bind(&order)
                    .execute(&mut **tx)
                    .await?;
            }
            Method::StateMachine => {
                if let Some(done) = self
                    .state
                    .transition(tx, &order, "PAID")
                    .await?
                    .to_disposition()
                {
                    return Ok(done);
                }
            }
            Method::Version => {
                if let Some(done) = self.version.bump(tx, &order, 0).await?.to_disposition(0) {
                    return Ok(done);
                }
            }
            Method::Claim => {
                // Slow enough that the second delivery arrives while the claim is held.
                tokio::time::sleep(Duration::from_millis(100)).await;
                sqlx::query("INSERT INTO api_calls (idempotency_key, token) VALUES (?, ?)")
                    .bind(cx.idempotency_key())
                    .bind(cx.fencing_token().map(|t| t as i64))
                    .execute(&self.api)
                    .await?;
                cx.set_result(format!("charged {order}"));
                return Ok(Disposition::Ok);
            }
        }
        sqlx::query("INSERT INTO ledger (order_id) VALUES (?)")
            .bind(&order)
            .execute(&mut **tx)
            .await?;
        Ok(Disposition::Ok)
    }

    async fn on_duplicate(&self, _cx: &Context<'_>, result: Option<&[u8]>) {
        self.duplicates_seen
            .lock()
            .unwrap()
            .push(result.map(<[u8]>::to_vec));
    }
}

struct Fixture {
    _dir: tempfile::TempDir,
    queue: SqliteQueue,
    store: SqliteStore,
    claims: Arc<SqliteClaimStore>,
    api: SqlitePool,
}

async fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let url = |f: &str| format!("sqlite:{}", dir.path().join(f).display());
    let mut qopts = SqliteQueueOptions::default();
    qopts.poll_interval = Duration::from_millis(10);
    let queue = SqliteQueue::open_with(&url("q.db"), "pay", qopts)
        .await
        .unwrap();
    let store = SqliteStore::open(&url("s.db")).await.unwrap();
    sqlx::raw_sql(
        "CREATE TABLE ledger (order_id TEXT NOT NULL);
         CREATE TABLE orders_unique (order_id TEXT PRIMARY KEY);
         CREATE TABLE orders (order_id TEXT PRIMARY KEY, status TEXT NOT NULL, version INTEGER NOT NULL);
         INSERT INTO orders VALUES ('ord-1', 'PENDING', 0);",
    )
    .execute(store.pool())
    .await
    .unwrap();
    // Claims in a file of their own: on SQLite a claim in the store's file would wait for
    // the batch transaction's write lock.
    let claims = Arc::new(SqliteClaimStore::open(&url("claims.db")).await.unwrap());
    let api = SqliteStore::open(&url("api.db"))
        .await
        .unwrap()
        .pool()
        .clone();
    sqlx::query("CREATE TABLE api_calls (idempotency_key TEXT NOT NULL, token INTEGER)")
        .execute(&api)
        .await
        .unwrap();
    Fixture {
        _dir: dir,
        queue,
        store,
        claims,
        api,
    }
}

fn consumer(
    f: &Fixture,
    method: Method,
    fail_first: bool,
    seen: &Arc<Mutex<Vec<Option<Vec<u8>>>>>,
) -> Consumer<SqliteStore, Pay> {
    let mut opts = ConsumerOptions::new("billing");
    opts.dedup.idempotency = method.idempotency();
    opts.batching.size = 1;
    opts.batching.linger = Duration::ZERO;
    opts.batching.receive_wait = Duration::from_millis(50);
    opts.dedup.claim_lease = Duration::from_secs(30);
    opts.retry.backoff_base = Duration::from_millis(20);
    opts.retry.backoff_max = Duration::from_millis(50);
    let machine = StateMachine::new([("PENDING", "PAID"), ("PAID", "SHIPPED")]).unwrap();
    let pay = Pay {
        method,
        api: f.api.clone(),
        state: SqliteStateGuard::new("orders", "order_id", "status", machine).unwrap(),
        version: SqliteVersionGuard::new("orders", "order_id", "version").unwrap(),
        fail_first,
        duplicates_seen: seen.clone(),
    };
    Consumer::new(opts, f.queue.clone(), f.store.clone(), pay)
        .unwrap()
        .with_claims(f.claims.clone())
        .unwrap()
}

async fn effects(f: &Fixture, method: Method) -> i64 {
    let (sql, pool) = match method {
        Method::Claim => ("SELECT COUNT(*) FROM api_calls", &f.api),
        _ => ("SELECT COUNT(*) FROM ledger", f.store.pool()),
    };
    sqlx::query_scalar(sql).fetch_one(pool).await.unwrap()
}

async fn drain(c: &Consumer<SqliteStore, Pay>, q: &SqliteQueue) {
    let q = q.clone();
    c.run_until(async move {
        while q.stats().await.unwrap().pending > 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_consumers_receiving_one_message_at_once_apply_it_once_with_every_method() {
    for method in [
        Method::DedupTable,
        Method::UniqueKey,
        Method::StateMachine,
        Method::Version,
        Method::Claim,
    ] {
        let f = fixture().await;
        let msg = Message::new(r#"{"amount":5}"#).with_id("ord-1").unwrap();
        f.queue.publish_batch(&[msg.clone(), msg]).await.unwrap();
        let seen = Arc::default();
        let (a, b) = (
            consumer(&f, method, false, &seen),
            consumer(&f, method, false, &seen),
        );
        let (ra, rb) = tokio::join!(a.run_once(), b.run_once());
        let (ra, rb) = (ra.unwrap(), rb.unwrap());
        assert_eq!(
            ra.received + rb.received,
            2,
            "{method:?}: each consumer got one copy"
        );
        if method == Method::Claim {
            assert_eq!(
                ra.retried + rb.retried,
                1,
                "{method:?}: the copy met a held claim and was retried, not acked"
            );
        }
        drain(&a, &f.queue).await;
        assert_eq!(
            effects(&f, method).await,
            1,
            "{method:?}: exactly one effect"
        );
        if method == Method::Claim {
            assert_eq!(
                *seen.lock().unwrap(),
                [Some(b"charged ord-1".to_vec())],
                "the duplicate got the stored result"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_claim_is_released_so_the_retry_runs_with_a_higher_token() {
    let f = fixture().await;
    f.queue
        .publish(&Message::new("{}").with_id("ord-1").unwrap())
        .await
        .unwrap();
    let seen = Arc::default();
    let c = consumer(&f, Method::Claim, true, &seen);
    drain(&c, &f.queue).await;
    let calls: Vec<(String, i64)> = sqlx::query_as("SELECT idempotency_key, token FROM api_calls")
        .fetch_all(&f.api)
        .await
        .unwrap();
    assert_eq!(
        calls,
        [("billing/ord-1".to_string(), 2)],
        "one call, by the second holder"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_unique_violation_is_a_duplicate_only_for_the_unique_key_method() {
    for (method, dead_letters) in [(Method::UniqueKey, 0), (Method::DedupTable, 1)] {
        let f = fixture().await;
        sqlx::query("INSERT INTO orders_unique VALUES ('ord-1')")
            .execute(f.store.pool())
            .await
            .unwrap();
        if method == Method::DedupTable {
            // Its handler writes only the ledger: make that write hit the same unique index.
            sqlx::query("CREATE TRIGGER t AFTER INSERT ON ledger BEGIN INSERT INTO orders_unique VALUES (NEW.order_id); END")
                .execute(f.store.pool())
                .await
                .unwrap();
        }
        f.queue
            .publish(&Message::new("{}").with_id("ord-1").unwrap())
            .await
            .unwrap();
        drain(&consumer(&f, method, false, &Arc::default()), &f.queue).await;
        let letters = f.queue.dead_letters().await.unwrap();
        assert_eq!(letters.len(), dead_letters, "{method:?}: {letters:?}");
        assert_eq!(
            effects(&f, method).await,
            0,
            "{method:?}: the violating write rolled back"
        );
    }
}
