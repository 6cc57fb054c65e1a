//! `JUSTONCE_LOG_FORMAT=json`: the consumer's batch and delivery spans as JSON lines, with
//! OpenTelemetry's messaging attributes and what each came to.

use std::process::{Command, Stdio};

use serde_json::Value;

#[test]
fn batches_and_deliveries_are_json_lines_with_their_outcome() {
    let out = Command::new(env!("CARGO_BIN_EXE_justonce"))
        .args(["demo", "--messages", "20", "--json"])
        .env("JUSTONCE_LOG", "justonce=debug")
        .env("JUSTONCE_LOG_FORMAT", "json")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<Value> = String::from_utf8_lossy(&out.stderr)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    let closed = |name: &str| -> Vec<&Value> {
        lines
            .iter()
            .filter(|l| l["fields"]["message"] == "close" && l["span"]["name"] == name)
            .map(|l| &l["span"])
            .collect()
    };
    let batches = closed("justonce.batch");
    assert!(!batches.is_empty(), "a line per finished batch");
    let b = batches
        .iter()
        .find(|b| b["handled"].as_u64() > Some(0))
        .expect("a batch that ran handlers");
    assert_eq!(b["messaging.system"], "sqlite");
    assert!(b["messaging.destination.name"]
        .as_str()
        .unwrap()
        .starts_with("justonce-demo-"));
    assert!(b["messaging.consumer.group.name"]
        .as_str()
        .unwrap()
        .starts_with("demo-"));
    assert!(b["acked"].is_u64() && b["duplicates"].is_u64());
    let deliveries = closed("justonce.delivery");
    let d = deliveries
        .iter()
        .find(|d| d["outcome"] == "ok")
        .expect("a delivery applied");
    assert!(d["messaging.message.id"]
        .as_str()
        .unwrap()
        .starts_with("ord-"));
    assert!(d["attempt"].as_u64() >= Some(1));
}
