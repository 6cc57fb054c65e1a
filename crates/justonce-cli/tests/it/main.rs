//! Tests of the `justonce` binary: the demo's contract, real process kills, and the lab.

mod bench;
mod dedup;
mod demo;
mod dlq;
mod kill;
mod lab;
