//! Tests of the runtime through its public API: the runtime's contracts (ARCHITECTURE.md) on the in-memory
//! backends, and bad input on the embedded SQLite default.

mod amqp;
mod environment;
mod interleavings;
mod metrics;
#[cfg(feature = "mysql")]
mod mysql_tls;
mod outbox;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "postgres")]
mod postgres_tls;
mod relay;
mod replay;
mod rules;
mod sqlite;
mod strategies;
mod support;

/// Built without the `postgres` feature, the PostgreSQL tests are not compiled: say so, and
/// fail where services are required.
#[test]
fn the_postgres_tests_are_compiled_in() {
    if cfg!(feature = "postgres") {
        return;
    }
    let text = "the PostgreSQL runtime tests were not compiled: run `cargo test --workspace`";
    assert!(
        std::env::var("JUSTONCE_REQUIRE_SERVICES").map_or(true, |v| v != "1"),
        "{text}"
    );
    eprintln!("SKIPPED: {text}");
}
