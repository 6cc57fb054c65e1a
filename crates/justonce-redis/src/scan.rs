//! The purges: one pass over a prefix's keys with `SCAN`, each page handed to a script
//! that deletes what is old enough by the server's clock.

use std::time::Duration;

use justonce_core::Result;
use redis::aio::ConnectionManager;
use redis::Script;

use crate::error::redis;

/// Scans the keys matching `pattern` once, running `script` (KEYS: a page of keys;
/// ARGV[1]: the age in ms; answers how many it deleted) on each page, until `batch`
/// deletions or the end of the keyspace.
pub(crate) async fn purge(
    conn: &ConnectionManager,
    pattern: &str,
    script: &Script,
    retention: Duration,
    batch: u32,
) -> Result<u64> {
    let mut conn = conn.clone();
    let age = retention.as_millis() as u64;
    let mut cursor: u64 = 0;
    let mut purged = 0u64;
    loop {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(500)
            .query_async(&mut conn)
            .await
            .map_err(|e| redis("scanning for old records", e))?;
        let room = u64::from(batch).saturating_sub(purged) as usize;
        for chunk in keys.chunks(room.max(1)) {
            if purged >= u64::from(batch) {
                return Ok(purged);
            }
            let room = (u64::from(batch) - purged) as usize;
            let mut call = script.prepare_invoke();
            for k in chunk.iter().take(room) {
                call.key(k);
            }
            call.arg(age);
            let n: u64 = call
                .invoke_async(&mut conn)
                .await
                .map_err(|e| redis("purging old records", e))?;
            purged += n;
        }
        if next == 0 || purged >= u64::from(batch) {
            return Ok(purged);
        }
        cursor = next;
    }
}
