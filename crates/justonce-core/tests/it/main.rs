//! Tests of the core through its public API.

mod properties;
