//! Tests of the core through its public API.

mod conformance;
mod properties;
