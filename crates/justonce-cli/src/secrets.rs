//! URLs that carry passwords, kept out of command lines.
//!
//! Every URL flag (`--transport`, `--store`, `--claims`) is also read from the environment
//! (`JUSTONCE_TRANSPORT_URL`, `JUSTONCE_STORE_URL`, `JUSTONCE_CLAIMS_URL`, clap's `env`)
//! and from a file (`--transport-file PATH`, or `JUSTONCE_TRANSPORT_URL_FILE`, as container
//! secrets are mounted), in that order of precedence: flag, file, variable. A file is read
//! here, before the arguments are parsed, into the variable clap reads, so that every
//! command takes it the same way. A URL with a password typed as a flag still works, and
//! [`warn_about_command_line`] says where it can be read and what to do instead.
//!
//! The lab, the bench and `lab --worker` pass URLs to their child processes in these
//! variables, never as arguments.

use std::ffi::OsString;

/// One URL flag: its name and the variables that give it.
pub(crate) struct UrlFlag {
    /// `--transport`.
    pub(crate) flag: &'static str,
    /// `JUSTONCE_TRANSPORT_URL`.
    pub(crate) var: &'static str,
    /// `JUSTONCE_TRANSPORT_URL_FILE`.
    pub(crate) file_var: &'static str,
}

/// Every URL flag of the command.
pub(crate) const URL_FLAGS: [UrlFlag; 3] = [
    UrlFlag {
        flag: "--transport",
        var: "JUSTONCE_TRANSPORT_URL",
        file_var: "JUSTONCE_TRANSPORT_URL_FILE",
    },
    UrlFlag {
        flag: "--store",
        var: "JUSTONCE_STORE_URL",
        file_var: "JUSTONCE_STORE_URL_FILE",
    },
    UrlFlag {
        flag: "--claims",
        var: "JUSTONCE_CLAIMS_URL",
        file_var: "JUSTONCE_CLAIMS_URL_FILE",
    },
];

/// The value of `flag` in `args` (`--flag VALUE` or `--flag=VALUE`), the last one given.
fn flag_value(args: &[OsString], flag: &str) -> Option<String> {
    let mut found = None;
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let arg = arg.to_string_lossy();
        if arg == "--" {
            break;
        }
        if arg == flag {
            found = it.next().map(|v| v.to_string_lossy().into_owned());
        } else if let Some(v) = arg.strip_prefix(flag).and_then(|r| r.strip_prefix('=')) {
            found = Some(v.to_owned());
        }
    }
    found
}

/// Reads each URL file named by `--X-file PATH` or `JUSTONCE_X_URL_FILE` into
/// `JUSTONCE_X_URL`, where clap finds it when the flag itself is not given. Runs before
/// anything else, while the process has one thread.
pub(crate) fn read_url_files(args: &[OsString]) -> anyhow::Result<()> {
    for f in &URL_FLAGS {
        let file_flag = format!("{}-file", f.flag);
        let file = flag_value(args, &file_flag)
            .map(|path| (path, file_flag.clone()))
            .or_else(|| {
                std::env::var(f.file_var)
                    .ok()
                    .filter(|p| !p.is_empty())
                    .map(|path| (path, f.file_var.to_owned()))
            });
        let Some((path, from)) = file else { continue };
        let text = std::fs::read_to_string(&path)
            .map_err(|e| anyhow::anyhow!("cannot read the URL file {path} ({from}): {e}"))?;
        let url = text.trim();
        if url.is_empty() || url.lines().count() != 1 {
            anyhow::bail!("the URL file {path} ({from}) must hold one URL on one line");
        }
        // Safe to set: main calls this first, before the runtime's threads exist.
        std::env::set_var(f.var, url);
    }
    Ok(())
}

/// URL flags that are only ever typed (no file form), warned of like the others.
const WARNED_TOO: [(&str, &str); 2] = [
    ("--tls-transport", "JUSTONCE_TLS_TRANSPORT_URL"),
    ("--tls-store", "JUSTONCE_TLS_STORE_URL"),
];

/// Warns, on stderr, of each URL flag whose value carries a password or a secret query
/// parameter: a command line is readable by every user of the machine (`ps`,
/// `/proc/PID/cmdline`) and kept in the shell's history.
pub(crate) fn warn_about_command_line(args: &[OsString]) {
    for f in &URL_FLAGS {
        let Some(url) = flag_value(args, f.flag) else {
            continue;
        };
        if justonce::redact_url(&url) != url {
            eprintln!(
                "warning: {} {} carries a secret on the command line, where every user of \
                 this machine can read it and the shell's history keeps it; give it in the \
                 environment ({}) or in a file ({}-file PATH or {})",
                f.flag,
                justonce::redact_url(&url),
                f.var,
                f.flag,
                f.file_var
            );
        }
    }
    for (flag, var) in WARNED_TOO {
        if let Some(url) = flag_value(args, flag).filter(|u| justonce::redact_url(u) != *u) {
            eprintln!(
                "warning: {flag} {} carries a secret on the command line, where every user \
                 of this machine can read it and the shell's history keeps it; give it in \
                 the environment ({var})",
                justonce::redact_url(&url)
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &[&str]) -> Vec<OsString> {
        s.iter().map(OsString::from).collect()
    }

    #[test]
    fn a_flag_is_found_in_both_spellings_and_not_after_a_double_dash() {
        let a = args(&["justonce", "demo", "--store", "x://a", "--transport=y://b"]);
        assert_eq!(flag_value(&a, "--store").as_deref(), Some("x://a"));
        assert_eq!(flag_value(&a, "--transport").as_deref(), Some("y://b"));
        assert_eq!(flag_value(&a, "--claims"), None);
        let a = args(&["justonce", "lab", "--", "--store", "x://a"]);
        assert_eq!(flag_value(&a, "--store"), None);
        // --store-file is not --store.
        let a = args(&["justonce", "lab", "--store-file", "/run/secrets/db"]);
        assert_eq!(flag_value(&a, "--store"), None);
        assert_eq!(
            flag_value(&a, "--store-file").as_deref(),
            Some("/run/secrets/db")
        );
    }
}
