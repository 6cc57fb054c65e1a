//! Tests of the SQL backends through their public API. PostgreSQL and MariaDB run the same
//! conformance suites as SQLite, against the real servers.

#[cfg(any(feature = "postgres", feature = "mysql"))]
mod backend;
mod inspect;
#[cfg(feature = "mysql")]
mod mysql;
#[cfg(feature = "postgres")]
mod postgres;
mod sqlite;
#[cfg(all(feature = "postgres", feature = "mysql"))]
mod versions;

/// Built without a backend's feature, its tests are not compiled: say so, and fail where
/// services are required.
#[test]
fn every_backend_is_compiled_in() {
    let missing: Vec<&str> = [
        ("postgres", cfg!(feature = "postgres")),
        ("mysql", cfg!(feature = "mysql")),
    ]
    .into_iter()
    .filter(|(_, on)| !on)
    .map(|(name, _)| name)
    .collect();
    if missing.is_empty() {
        return;
    }
    let text = format!(
        "the {missing:?} tests were not compiled: run `cargo test --workspace` (or --all-features)"
    );
    assert!(
        std::env::var("JUSTONCE_REQUIRE_SERVICES").map_or(true, |v| v != "1"),
        "{text}"
    );
    eprintln!("SKIPPED: {text}");
}
