//! Running a tool command of the binary (`dlq`, `dedup`) and reading its `--json`.

use std::process::{Command, Output, Stdio};

use serde_json::Value;

/// `justonce COMMAND ARGS…`, with no stdin (as in CI).
pub(crate) fn run(command: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_justonce"))
        .arg(command)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

/// The JSON a successful command printed.
pub(crate) fn json(out: &Output) -> Value {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}
