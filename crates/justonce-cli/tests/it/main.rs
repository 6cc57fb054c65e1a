//! Tests of the `justonce` binary: the demo's contract and real process kills.

mod demo;
mod kill;
