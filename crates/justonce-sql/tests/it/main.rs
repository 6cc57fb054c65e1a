//! Tests of the SQL backends through their public API.

mod sqlite;
