//! What a Redis server keeps, and what it may throw away: read at connect, logged when it
//! weakens the guarantee, and answered to `justonce doctor` as checks.

use std::collections::HashMap;

use justonce_core::{Check, Result};
use redis::aio::ConnectionManager;

use crate::error::redis;

/// A Redis server's settings that decide what survives a restart or memory pressure, read
/// with `INFO` (and `CONFIG GET` where the server allows it; managed services often do
/// not).
///
/// ```no_run
/// # async fn run() -> justonce_core::Result<()> {
/// let claims = justonce_redis::RedisClaimStore::connect("redis://127.0.0.1:6379").await?;
/// for warning in claims.server().warnings() {
///     eprintln!("{warning}");
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ServerSettings {
    /// `redis_version`.
    pub version: String,
    /// `run_id`: new at every start of the server.
    pub run_id: String,
    /// Whether the append-only file is on (`appendonly yes`).
    pub aof: bool,
    /// `appendfsync` (`always`, `everysec`, `no`), when `CONFIG GET` answered.
    pub appendfsync: Option<String>,
    /// The snapshot rules (`save`; empty: none), when `CONFIG GET` answered.
    pub save: Option<String>,
    /// `maxmemory` in bytes (0: no limit).
    pub maxmemory: u64,
    /// `maxmemory-policy`.
    pub maxmemory_policy: String,
}

/// The commands a Redis stream sends, from its scripts or directly, that a server may lack:
/// `XAUTOCLAIM` came with Redis 6.2, and a managed service may rename or disable any
/// command (`rename-command`). Valkey has them all.
pub(crate) const STREAM_COMMANDS: &[&str] = &[
    "XAUTOCLAIM",
    "XCLAIM",
    "XPENDING",
    "XREADGROUP",
    "XACK",
    "XADD",
    "XDEL",
    "XTRIM",
    "XGROUP",
    "XINFO",
    "EVALSHA",
];

/// Checks with `COMMAND INFO` (the server's own list, not its version) that the server has
/// every one of `commands`: a missing one is a configuration error naming it, at connect,
/// not a failure in the middle of a script later. A server that refuses `COMMAND` itself
/// (renamed, or not allowed to this user) is not checked.
pub(crate) async fn require_commands(
    conn: &mut ConnectionManager,
    what: &str,
    commands: &[&str],
) -> Result<()> {
    let reply: redis::RedisResult<redis::Value> = redis::cmd("COMMAND")
        .arg("INFO")
        .arg(commands)
        .query_async(conn)
        .await;
    let Ok(redis::Value::Array(infos)) = reply else {
        tracing::debug!("COMMAND INFO is not answered: the server's commands are not checked");
        return Ok(());
    };
    let missing: Vec<&str> = commands
        .iter()
        .zip(&infos)
        .filter(|(_, info)| matches!(info, redis::Value::Nil))
        .map(|(c, _)| *c)
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    Err(justonce_core::Error::config(format!(
        "{what} needs the command{} {} that this server does not have (renamed or disabled \
         in its configuration, or a server older than Redis 6.2): `COMMAND INFO` answers \
         nothing for {}",
        if missing.len() == 1 { "" } else { "s" },
        missing.join(", "),
        if missing.len() == 1 { "it" } else { "them" },
    )))
}

impl ServerSettings {
    pub(crate) async fn read(conn: &mut ConnectionManager) -> Result<Self> {
        let info: String = redis::cmd("INFO")
            .arg("server")
            .arg("persistence")
            .arg("memory")
            .query_async(conn)
            .await
            .map_err(|e| redis("reading the server's INFO", e))?;
        let fields: HashMap<&str, &str> = info
            .lines()
            .filter_map(|l| l.trim_end().split_once(':'))
            .collect();
        let get = |k: &str| fields.get(k).map(|v| v.to_string()).unwrap_or_default();
        // Refused where CONFIG is renamed or not allowed: then those two stay unknown.
        let config: Option<HashMap<String, String>> = redis::cmd("CONFIG")
            .arg("GET")
            .arg("save")
            .arg("appendfsync")
            .query_async(conn)
            .await
            .ok();
        let config = config.unwrap_or_default();
        Ok(ServerSettings {
            version: get("redis_version"),
            run_id: get("run_id"),
            aof: get("aof_enabled") == "1",
            appendfsync: config.get("appendfsync").cloned(),
            save: config.get("save").cloned(),
            maxmemory: get("maxmemory").parse().unwrap_or(0),
            maxmemory_policy: get("maxmemory_policy"),
        })
    }

    /// Whether a restart of the server forgets every key: no append-only file and no
    /// snapshots (`None`: the snapshot rules could not be read).
    pub fn keeps_nothing(&self) -> Option<bool> {
        if self.aof {
            return Some(false);
        }
        self.save.as_ref().map(|s| s.trim().is_empty())
    }

    /// Whether the server may delete keys before their expiry to free memory: a policy
    /// other than `noeviction` with a memory limit set.
    pub fn may_evict(&self) -> bool {
        self.maxmemory_policy != "noeviction" && self.maxmemory > 0
    }

    /// What these settings mean for claims kept on this server, as the doctor's links:
    /// durability across a restart, and eviction.
    pub fn checks(&self) -> Vec<Check> {
        let durability = match (self.keeps_nothing(), self.appendfsync.as_deref()) {
            (Some(true), _) => Check::warn(
                "redis durability",
                "the server keeps nothing on disk (no append-only file, no snapshots): a \
                 restart forgets every claim and dedup key, and a message delivered again \
                 after it has its effect again",
                "set `appendonly yes` and `appendfsync always` (`everysec` risks the last \
                 second's completions in a crash)",
            ),
            (Some(false), Some("always")) => Check::pass(
                "redis durability",
                "append-only file, synced at every write (`appendfsync always`)",
            ),
            (Some(false), fsync) if self.aof => Check::warn(
                "redis durability",
                format!(
                    "append-only file synced `{}`: a crash of the server can lose the last \
                     second's completions, whose messages then have their effects again",
                    fsync.unwrap_or("unknown")
                ),
                "set `appendfsync always`",
            ),
            (Some(false), _) => Check::warn(
                "redis durability",
                format!(
                    "snapshots only (`save {}`): a crash loses every completion since the last \
                     snapshot",
                    self.save.as_deref().unwrap_or_default()
                ),
                "set `appendonly yes` and `appendfsync always`",
            ),
            (None, _) => Check::warn(
                "redis durability",
                "no append-only file, and the snapshot rules cannot be read (`CONFIG GET` \
                 refused): a restart may forget claims",
                "set `appendonly yes` and `appendfsync always`",
            ),
        };
        let eviction = if self.may_evict() {
            Check::warn(
                "redis eviction",
                format!(
                    "`maxmemory-policy {}` with `maxmemory {}`: under memory pressure the \
                     server deletes keys before their expiry, and a message delivered again \
                     after its claim was evicted has its effect again",
                    self.maxmemory_policy, self.maxmemory
                ),
                "set `maxmemory-policy noeviction` (writes then fail when memory is full, \
                 and the consumer pauses instead of forgetting)",
            )
        } else if self.maxmemory_policy != "noeviction" {
            Check::pass(
                "redis eviction",
                format!(
                    "`maxmemory-policy {}`, but no `maxmemory` limit: nothing is evicted \
                     today (set `noeviction` before setting a limit)",
                    self.maxmemory_policy
                ),
            )
        } else {
            Check::pass(
                "redis eviction",
                "`maxmemory-policy noeviction`: keys live until their expiry",
            )
        };
        vec![durability, eviction]
    }

    /// The checks that are not a pass, as one line each: what the server does, and what
    /// to set.
    pub fn warnings(&self) -> Vec<String> {
        self.checks()
            .into_iter()
            .filter(|c| c.status != justonce_core::CheckStatus::Pass)
            .map(|c| format!("{}: {}; {}", c.link, c.detail, c.fix.unwrap_or_default()))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> ServerSettings {
        ServerSettings {
            version: "7.0.15".into(),
            run_id: "r".into(),
            aof: false,
            appendfsync: Some("everysec".into()),
            save: Some(String::new()),
            maxmemory: 0,
            maxmemory_policy: "noeviction".into(),
        }
    }

    #[test]
    fn a_server_that_keeps_nothing_or_may_evict_is_a_warning() {
        let s = settings();
        assert_eq!(s.keeps_nothing(), Some(true));
        assert_eq!(s.warnings().len(), 1, "{:?}", s.warnings());
        assert!(s.warnings()[0].contains("keeps nothing"));

        let aof_always = ServerSettings {
            aof: true,
            appendfsync: Some("always".into()),
            ..settings()
        };
        assert!(aof_always.warnings().is_empty());

        let aof_everysec = ServerSettings {
            aof: true,
            ..settings()
        };
        assert!(aof_everysec.warnings()[0].contains("last second"));

        let evicting = ServerSettings {
            aof: true,
            appendfsync: Some("always".into()),
            maxmemory: 1 << 30,
            maxmemory_policy: "volatile-lru".into(),
            ..settings()
        };
        assert!(evicting.may_evict());
        assert!(evicting.warnings()[0].contains("noeviction"));

        let unknown = ServerSettings {
            save: None,
            ..settings()
        };
        assert_eq!(unknown.keeps_nothing(), None);
        assert!(unknown.warnings()[0].contains("cannot be read"));
    }
}
