//! Tests of the runtime through its public API: the rules of DESIGN.md on the in-memory
//! backends, and bad input on the embedded SQLite default.

mod amqp;
mod rules;
mod sqlite;
mod strategies;
mod support;
