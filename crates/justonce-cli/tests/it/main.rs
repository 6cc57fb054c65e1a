//! Tests of the `justonce` binary: the demo's contract, real process kills, the lab, and
//! the operator's tools.

mod bench;
mod dedup;
mod demo;
mod dlq;
mod doctor;
mod kill;
mod lab;
mod logs;
mod metrics;
mod outbox;
mod own_servers;
mod secrets;
mod tls;
mod tool;
