//! URLs with passwords kept off the command line: every URL flag is also read from its
//! environment variable and from a file (`--store-file`, `JUSTONCE_STORE_URL_FILE`); a
//! password typed as a flag works, with a warning that names the safer ways; nothing the
//! command prints shows it.

use std::process::{Command, Output};

use crate::demo::postgres_url;

/// The shared server trusts loopback, so it lets in any password: a URL with one works.
const SECRET: &str = "pw-9c41-not-shown";

fn with_password(url: &str) -> String {
    url.replacen(
        "postgres://postgres@",
        &format!("postgres://postgres:{SECRET}@"),
        1,
    )
}

fn justonce(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_justonce"));
    cmd.args(args);
    for var in [
        "JUSTONCE_TRANSPORT_URL",
        "JUSTONCE_STORE_URL",
        "JUSTONCE_CLAIMS_URL",
        "JUSTONCE_TRANSPORT_URL_FILE",
        "JUSTONCE_STORE_URL_FILE",
        "JUSTONCE_CLAIMS_URL_FILE",
    ] {
        cmd.env_remove(var);
    }
    cmd.envs(env.iter().copied());
    cmd.output().expect("the justonce binary runs")
}

/// Everything the command printed, checked for the password.
fn printed(out: &Output) -> String {
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!all.contains(SECRET), "the password was printed: {all}");
    all
}

const DEMO: [&str; 3] = ["demo", "--messages", "20"];

#[test]
fn a_store_url_comes_from_the_environment_a_file_or_the_command_line_with_a_warning() {
    let Some(pg) = postgres_url() else { return };
    let url = with_password(&pg);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("store-url");
    std::fs::write(&file, format!("{url}\n")).unwrap();
    let file = file.to_str().unwrap();

    // On the command line: it works, and says where else to put it.
    let out = justonce(&[&DEMO[..], &["--store", &url]].concat(), &[]);
    let all = printed(&out);
    assert!(out.status.success(), "{all}");
    assert!(all.contains("postgres"), "{all}");
    assert!(
        all.contains("warning: --store")
            && all.contains("JUSTONCE_STORE_URL")
            && all.contains("--store-file"),
        "{all}"
    );

    // In the environment, or in a file named by a flag or a variable: no warning.
    for (args, env) in [
        (vec![], vec![("JUSTONCE_STORE_URL", url.as_str())]),
        (vec!["--store-file", file], vec![]),
        (vec![], vec![("JUSTONCE_STORE_URL_FILE", file)]),
    ] {
        let out = justonce(&[&DEMO[..], &args].concat(), &env);
        let all = printed(&out);
        assert!(out.status.success(), "{args:?} {env:?}: {all}");
        assert!(!all.contains("warning"), "{args:?} {env:?}: {all}");
        assert!(all.contains("effectively-once"), "{all}");
    }
}

#[test]
fn a_url_file_that_is_missing_or_meant_for_no_flag_is_a_clear_error() {
    let out = justonce(
        &[&DEMO[..], &["--store-file", "/nonexistent/db-url"]].concat(),
        &[],
    );
    let all = printed(&out);
    assert!(!out.status.success());
    assert!(
        all.contains("cannot read the URL file /nonexistent/db-url (--store-file)"),
        "{all}"
    );

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("claims-url");
    std::fs::write(&file, "sqlite:claims.db").unwrap();
    let queue = format!("sqlite:{}", dir.path().join("q.db").display());
    let out = justonce(
        &[
            "dlq",
            "list",
            "--transport",
            &queue,
            "--queue",
            "x",
            "--claims-file",
            file.to_str().unwrap(),
        ],
        &[],
    );
    let all = printed(&out);
    assert_eq!(out.status.code(), Some(2), "{all}");
    assert!(all.contains("takes no --claims"), "{all}");
}
