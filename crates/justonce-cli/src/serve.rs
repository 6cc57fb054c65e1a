//! `--metrics-addr`: one HTTP listener for Prometheus and the orchestrator. `GET /metrics`
//! is the Prometheus text of everything the process records through the `metrics` facade;
//! `GET /healthz` answers 200 while the process runs; `GET /readyz` answers 200 when the
//! process is ready for work (a worker: its consumer runs, no worker of it pauses after a
//! failed batch, its breaker is closed) and 503 with the reason otherwise.
//!
//! Beside what the consumer records, a worker reads two gauges from its transport and
//! store every `--metrics-poll-secs`: dead letters by failure group and dedup records.

use std::collections::{BTreeMap, BTreeSet};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use anyhow::Context as _;
use http_body_util::{BodyExt as _, Full};
use hyper::body::Bytes;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use justonce::{Inspect, InspectStore};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

/// Whether the process is ready, or why not.
pub(crate) type Ready = Arc<dyn Fn() -> Result<(), String> + Send + Sync>;

/// The buckets of every `_seconds` histogram, in seconds: a handler's milliseconds to a
/// batch stuck for a minute.
const BUCKETS: [f64; 14] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0, 60.0,
];

/// The line a process prints on stderr once it listens (the lab reads the port from it).
pub(crate) const LISTENING: &str = "justonce-metrics listening on";

/// Installs the Prometheus recorder and serves it on `addr`; answers the bound address
/// (`addr` may have port 0). Call before the consumers are built.
pub(crate) async fn serve(addr: SocketAddr, ready: Ready) -> anyhow::Result<SocketAddr> {
    let recorder = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), &BUCKETS)
        .context("the histogram buckets")?
        .build_recorder();
    let handle = recorder.handle();
    metrics::set_global_recorder(recorder)
        .map_err(|e| anyhow::anyhow!("a metrics recorder is installed already: {e}"))?;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("--metrics-addr {addr}: cannot listen there"))?;
    let bound = listener.local_addr()?;
    let upkeep = handle.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(5)).await;
            upkeep.run_upkeep();
        }
    });
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            };
            let (handle, ready) = (handle.clone(), ready.clone());
            let service = hyper::service::service_fn(move |req| {
                let answer = answer(&req, &handle, &ready);
                async move { Ok::<_, Infallible>(answer) }
            });
            tokio::spawn(
                hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service),
            );
        }
    });
    eprintln!("{LISTENING} {bound}");
    Ok(bound)
}

fn answer<B>(req: &Request<B>, handle: &PrometheusHandle, ready: &Ready) -> Response<Full<Bytes>> {
    let reply = |status: StatusCode, kind: &'static str, body: String| {
        let mut r = Response::new(Full::new(Bytes::from(body)));
        *r.status_mut() = status;
        r.headers_mut().insert(
            hyper::header::CONTENT_TYPE,
            hyper::header::HeaderValue::from_static(kind),
        );
        r
    };
    const TEXT: &str = "text/plain; charset=utf-8";
    if req.method() != hyper::Method::GET {
        return reply(StatusCode::METHOD_NOT_ALLOWED, TEXT, "GET only\n".into());
    }
    match req.uri().path() {
        "/metrics" => reply(
            StatusCode::OK,
            "text/plain; version=0.0.4; charset=utf-8",
            handle.render(),
        ),
        "/healthz" => reply(StatusCode::OK, TEXT, "ok\n".into()),
        "/readyz" => match ready() {
            Ok(()) => reply(StatusCode::OK, TEXT, "ready\n".into()),
            Err(why) => reply(StatusCode::SERVICE_UNAVAILABLE, TEXT, format!("{why}\n")),
        },
        _ => reply(
            StatusCode::NOT_FOUND,
            TEXT,
            "not found: /metrics, /healthz and /readyz are served\n".into(),
        ),
    }
}

/// Every `every`, sets the gauges of what the transport and the store hold: dead letters of
/// `queue` by failure group, and the dedup records of each consumer with the age of the
/// oldest. A read that fails is logged and tried again next time.
pub(crate) fn poll_gauges(
    every: Duration,
    queue: String,
    transport: Arc<dyn Inspect>,
    store: Arc<dyn InspectStore>,
) {
    tokio::spawn(async move {
        let mut seen: BTreeSet<(String, String)> = BTreeSet::new();
        loop {
            match transport.dead_letter_entries().await {
                Ok(entries) => {
                    let mut now: BTreeMap<(String, String), f64> = BTreeMap::new();
                    for e in &entries {
                        let g = e.group();
                        let reason: String = g.pattern.chars().take(120).collect();
                        *now.entry((g.id, reason)).or_default() += 1.0;
                    }
                    // A group that was replayed or purged away reads 0, not its last count.
                    for key in &seen {
                        now.entry(key.clone()).or_default();
                    }
                    for ((group, reason), n) in &now {
                        metrics::gauge!("justonce_dead_letters", "messaging.destination.name" => queue.clone(), "failure_group" => group.clone(), "reason" => reason.clone()).set(*n);
                    }
                    seen = now.into_keys().collect();
                }
                Err(e) => {
                    tracing::warn!(error = %e.to_chain_string(), "metrics: cannot read the dead letters")
                }
            }
            match store.dedup_stats().await {
                Ok(stats) => {
                    for c in stats {
                        let group = c.consumer.clone();
                        metrics::gauge!("justonce_dedup_records", "messaging.consumer.group.name" => group.clone()).set(c.records as f64);
                        let age = c
                            .oldest
                            .and_then(|t| SystemTime::now().duration_since(t).ok())
                            .map_or(0.0, |d| d.as_secs_f64());
                        metrics::gauge!("justonce_dedup_oldest_record_age_seconds", "messaging.consumer.group.name" => group).set(age);
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e.to_chain_string(), "metrics: cannot read the dedup records")
                }
            }
            tokio::time::sleep(every).await;
        }
    });
}

/// `GET path` of `addr`: the status and the body.
pub(crate) async fn get(addr: SocketAddr, path: &str) -> anyhow::Result<(u16, String)> {
    let stream = tokio::time::timeout(Duration::from_secs(5), tokio::net::TcpStream::connect(addr))
        .await
        .with_context(|| format!("connecting to {addr}: timed out"))?
        .with_context(|| format!("connecting to {addr}"))?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(conn);
    let req = Request::get(path)
        .header(hyper::header::HOST, addr.to_string())
        .body(Full::new(Bytes::new()))?;
    let res = tokio::time::timeout(Duration::from_secs(10), sender.send_request(req))
        .await
        .with_context(|| format!("GET {path} of {addr}: timed out"))??;
    let status = res.status().as_u16();
    let body = res.into_body().collect().await?.to_bytes();
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

/// The samples of the Prometheus text `text` whose name is `name`, summed by the value of
/// label `by` (the empty string where a sample has none).
pub(crate) fn sum_by(text: &str, name: &str, by: &str) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let (series, value) = match line.rsplit_once(' ') {
            Some(p) => p,
            None => continue,
        };
        let (metric, labels) = match series.split_once('{') {
            Some((m, rest)) => (m, rest.trim_end_matches('}')),
            None => (series, ""),
        };
        if metric != name {
            continue;
        }
        let Ok(value) = value.parse::<f64>() else {
            continue;
        };
        let key = labels
            .split("\",")
            .filter_map(|kv| kv.split_once("=\""))
            .find(|(k, _)| *k == by)
            .map_or(String::new(), |(_, v)| v.trim_end_matches('"').to_owned());
        *out.entry(key).or_default() += value;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prometheus_text_is_summed_by_a_label() {
        let text = "# TYPE justonce_deliveries_total counter\n\
            justonce_deliveries_total{messaging_system=\"sqlite\",outcome=\"applied\"} 7\n\
            justonce_deliveries_total{messaging_system=\"rabbitmq\",outcome=\"applied\"} 3\n\
            justonce_deliveries_total{messaging_system=\"sqlite\",outcome=\"retry\"} 2\n\
            justonce_deliveries_received_total{messaging_system=\"sqlite\"} 12\n";
        let by = sum_by(text, "justonce_deliveries_total", "outcome");
        assert_eq!(by.get("applied"), Some(&10.0));
        assert_eq!(by.get("retry"), Some(&2.0));
        let all = sum_by(text, "justonce_deliveries_received_total", "outcome");
        assert_eq!(all.get(""), Some(&12.0));
    }
}
