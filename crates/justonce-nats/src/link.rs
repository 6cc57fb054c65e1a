//! How a client reaches a NATS server: the address, how it logs in, and the TLS it
//! insists on, from the URL and from [`NatsOptions::connect`].
//!
//! URLs, as NATS users write them: `nats://host:4222`, `nats://user:password@host:4222`,
//! `nats://TOKEN@host:4222` (a user with no password is a token), and `tls://host:4222`
//! (TLS required). What NATS URLs have no syntax for is a query parameter, the same names
//! as the fields of [`NatsConnect`]: `creds_file`, `nkey_file`, `tls_ca`, `tls_cert`,
//! `tls_key`, `tls_required=true`. async-nats ignores the credentials of a URL: they are
//! taken out here and handed to it.

use std::path::PathBuf;

use justonce_core::{redact_url, Error, Result};

/// How the client logs in, beyond a user, password or token in the URL, and the TLS it
/// insists on. Paths, never secrets themselves; `Debug` shows them as they are.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct NatsConnect {
    /// A `.creds` file (a user JWT and its nkey seed, as `nsc` writes them).
    pub creds_file: Option<PathBuf>,
    /// A file holding an nkey seed (`SU…`): the server knows its public key.
    pub nkey_file: Option<PathBuf>,
    /// The authority (PEM) that signed the server's certificate, trusted beside the
    /// system's roots.
    pub tls_ca: Option<PathBuf>,
    /// A client certificate (PEM), for a server that verifies its clients; with
    /// [`NatsConnect::tls_key`].
    pub tls_cert: Option<PathBuf>,
    /// The client certificate's key (PEM).
    pub tls_key: Option<PathBuf>,
    /// TLS or no connection, even on a `nats://` URL (a `tls://` URL, a CA or a client
    /// certificate asks for it too).
    pub tls_required: bool,
}

impl NatsConnect {
    /// Whether anything here or in the URL asks for TLS.
    fn wants_tls(&self, scheme: &str) -> bool {
        self.tls_required
            || scheme == "tls"
            || self.tls_ca.is_some()
            || self.tls_cert.is_some()
            || self.tls_key.is_some()
    }
}

/// A URL taken apart: the server address async-nats gets, the login it carries, and the
/// URL's query merged over the options' [`NatsConnect`].
pub(crate) struct Link {
    addr: String,
    scheme: String,
    user: Option<(String, Option<String>)>,
    connect: NatsConnect,
}

impl Link {
    pub(crate) fn parse(url: &str, connect: &NatsConnect) -> Result<Link> {
        let bad = |why: &str| {
            Error::config(format!(
                "`{}` is not a NATS URL ({why}): use nats://[USER:PASSWORD@]HOST:4222 or \
                 tls://HOST:4222",
                redact_url(url)
            ))
        };
        let parsed = url::Url::parse(url.trim()).map_err(|e| bad(&e.to_string()))?;
        let scheme = parsed.scheme().to_owned();
        if scheme != "nats" && scheme != "tls" {
            return Err(bad("the scheme must be nats or tls"));
        }
        let host = parsed.host_str().ok_or_else(|| bad("no host"))?;
        let addr = format!("{scheme}://{host}:{}", parsed.port().unwrap_or(4222));
        let decode = |s: &str| {
            percent_encoding::percent_decode_str(s)
                .decode_utf8_lossy()
                .into_owned()
        };
        let user = (!parsed.username().is_empty())
            .then(|| (decode(parsed.username()), parsed.password().map(decode)));
        let mut connect = connect.clone();
        for (key, value) in parsed.query_pairs() {
            let path = || Some(PathBuf::from(value.as_ref()));
            match key.as_ref() {
                "creds_file" => connect.creds_file = path(),
                "nkey_file" => connect.nkey_file = path(),
                "tls_ca" => connect.tls_ca = path(),
                "tls_cert" => connect.tls_cert = path(),
                "tls_key" => connect.tls_key = path(),
                "tls_required" => {
                    connect.tls_required = match value.as_ref() {
                        "true" | "1" | "yes" => true,
                        "false" | "0" | "no" => false,
                        _ => return Err(bad("tls_required is true or false")),
                    }
                }
                other => {
                    return Err(bad(&format!(
                        "unknown parameter `{other}`; known: creds_file, nkey_file, tls_ca, \
                         tls_cert, tls_key, tls_required"
                    )))
                }
            }
        }
        if connect.tls_cert.is_some() != connect.tls_key.is_some() {
            return Err(bad("a client certificate needs both tls_cert and tls_key"));
        }
        let logins = [
            user.is_some(),
            connect.creds_file.is_some(),
            connect.nkey_file.is_some(),
        ];
        if logins.iter().filter(|&&l| l).count() > 1 {
            return Err(bad(
                "one way of logging in: a user and password or token in the URL, a creds file \
                 or an nkey file",
            ));
        }
        Ok(Link {
            addr,
            scheme,
            user,
            connect,
        })
    }

    /// The address to connect to, without credentials or query.
    pub(crate) fn addr(&self) -> &str {
        &self.addr
    }

    /// `options` with the login and the TLS this link asks for.
    pub(crate) async fn apply(
        &self,
        mut options: async_nats::ConnectOptions,
        url: &str,
    ) -> Result<async_nats::ConnectOptions> {
        let file = |what: &str, path: &PathBuf, e: std::io::Error| {
            Error::config(format!(
                "cannot read the NATS {what} {} (for {}): {e}",
                path.display(),
                redact_url(url)
            ))
        };
        match &self.user {
            Some((user, Some(password))) => {
                options = options.user_and_password(user.clone(), password.clone());
            }
            Some((token, None)) => options = options.token(token.clone()),
            None => {}
        }
        if let Some(path) = &self.connect.creds_file {
            options = options
                .credentials_file(path)
                .await
                .map_err(|e| file("creds file", path, e))?;
        }
        if let Some(path) = &self.connect.nkey_file {
            let seed = std::fs::read_to_string(path).map_err(|e| file("nkey file", path, e))?;
            options = options.nkey(seed.trim().to_owned());
        }
        if let Some(ca) = &self.connect.tls_ca {
            options = options.add_root_certificates(ca.clone());
        }
        if let (Some(cert), Some(key)) = (&self.connect.tls_cert, &self.connect.tls_key) {
            options = options.add_client_certificate(cert.clone(), key.clone());
        }
        if self.connect.wants_tls(&self.scheme) {
            options = options.require_tls(true);
        }
        Ok(options)
    }

    /// Whether the connection must be TLS, for the error that says so.
    pub(crate) fn wants_tls(&self) -> bool {
        self.connect.wants_tls(&self.scheme)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_and_parameters_come_out_of_the_url() {
        let link = Link::parse(
            "nats://app:p%40ss@127.0.0.1:4223?tls_ca=/ca.pem",
            &NatsConnect::default(),
        )
        .unwrap();
        assert_eq!(link.addr(), "nats://127.0.0.1:4223");
        assert_eq!(link.user, Some(("app".into(), Some("p@ss".into()))));
        assert_eq!(link.connect.tls_ca, Some(PathBuf::from("/ca.pem")));
        assert!(link.wants_tls());

        let link = Link::parse("nats://t0k3n@host", &NatsConnect::default()).unwrap();
        assert_eq!(link.addr(), "nats://host:4222");
        assert_eq!(link.user, Some(("t0k3n".into(), None)));
        assert!(!link.wants_tls());
        assert!(Link::parse("tls://host:4222", &NatsConnect::default())
            .unwrap()
            .wants_tls());
    }

    #[test]
    fn a_bad_url_is_refused_without_its_secrets() {
        for (url, why) in [
            ("redis://app:s3cret@host", "the scheme"),
            (
                "nats://app:s3cret@host?creds=/x",
                "unknown parameter `creds`",
            ),
            (
                "nats://app:s3cret@host?tls_cert=/c.pem",
                "both tls_cert and tls_key",
            ),
            (
                "nats://app:s3cret@host?nkey_file=/k",
                "one way of logging in",
            ),
            ("nats://app:s3cret@host?tls_required=maybe", "true or false"),
        ] {
            let e = Link::parse(url, &NatsConnect::default()).err().unwrap();
            let text = format!("{e:#} {e:?}");
            assert!(text.contains(why), "{url}: {text}");
            assert!(!text.contains("s3cret"), "{url}: {text}");
        }
    }
}
