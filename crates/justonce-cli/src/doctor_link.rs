//! `justonce doctor`'s look at each link: whether it is TLS, what the handshake verified
//! (the chain, the host name), and when the server's certificate expires; a plaintext link
//! to an address beyond loopback warns.
//!
//! The probe opens a connection of its own and speaks only what comes before TLS: nothing
//! for `amqps://` and `rediss://`, PostgreSQL's `SSLRequest`, NATS's `INFO` line. Its
//! verifier records what the system's roots and the URL's authority (`cacertfile`,
//! `tls_ca`, `sslrootcert`) say of the certificate, and lets the handshake end, so that a
//! failure is reported, not only refused. MariaDB upgrades inside its own handshake: its
//! link is judged from `ssl-mode`, and the connection of the store's checks verifies it.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use justonce::Check;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};

const LINK: &str = "link";

/// Days of validity left under which the certificate's expiry warns.
const EXPIRY_WARN_DAYS: i64 = 30;

/// How a URL asks to be reached.
#[derive(Debug, PartialEq)]
enum Asked {
    /// No TLS.
    Plain,
    /// TLS where the server offers it, unverified, else plaintext (`sslmode=prefer`, the
    /// default of libpq and sqlx; MariaDB's `PREFERRED`).
    Preferred,
    /// TLS without verification (`sslmode=require`, `ssl-mode=REQUIRED`).
    Unverified,
    /// TLS with the chain verified, and the host name unless `chain_only`.
    Verified { chain_only: bool },
}

/// What comes before the TLS handshake.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Preamble {
    None,
    Postgres,
    Nats,
    /// Not probed: MariaDB's TLS starts inside its handshake.
    Unprobed,
}

struct Target {
    host: String,
    port: u16,
    asked: Asked,
    preamble: Preamble,
    /// The authority the URL names, beside the system's roots.
    ca: Option<std::path::PathBuf>,
    /// What to write to ask for verified TLS, for the fix of a plaintext link.
    how: &'static str,
}

fn target(url: &str) -> Option<Target> {
    if url.trim_start().starts_with("kafka://") {
        return kafka_target(url);
    }
    let parsed = url::Url::parse(url).ok()?;
    let q = |key: &str| {
        parsed
            .query_pairs()
            .find(|(k, _)| k.eq_ignore_ascii_case(key))
            .map(|(_, v)| v.into_owned())
    };
    let host = parsed.host_str()?.trim_matches(['[', ']']).to_owned();
    let (port, asked, preamble, ca, how) = match parsed.scheme() {
        "amqp" => (
            5672,
            Asked::Plain,
            Preamble::None,
            None,
            "amqps://HOST:5671/VHOST?cacertfile=CA",
        ),
        "amqps" => (
            5671,
            Asked::Verified { chain_only: false },
            Preamble::None,
            q("cacertfile"),
            "",
        ),
        "redis" => (
            6379,
            Asked::Plain,
            Preamble::None,
            None,
            "rediss://HOST:PORT?tls_ca=CA",
        ),
        "rediss" => (
            6379,
            Asked::Verified { chain_only: false },
            Preamble::None,
            q("tls_ca"),
            "",
        ),
        "nats" | "tls" => {
            let tls = parsed.scheme() == "tls"
                || q("tls_required").is_some_and(|v| v == "true")
                || q("tls_ca").is_some()
                || q("tls_cert").is_some();
            let asked = if tls {
                Asked::Verified { chain_only: false }
            } else {
                Asked::Plain
            };
            (
                4222,
                asked,
                Preamble::Nats,
                q("tls_ca"),
                "tls://HOST:4222?tls_ca=CA",
            )
        }
        "postgres" | "postgresql" => {
            let mode = q("sslmode").unwrap_or_else(|| "prefer".into());
            let asked = match mode.as_str() {
                "require" => Asked::Unverified,
                "verify-ca" => Asked::Verified { chain_only: true },
                "verify-full" => Asked::Verified { chain_only: false },
                "prefer" => Asked::Preferred,
                _ => Asked::Plain,
            };
            (
                5432,
                asked,
                Preamble::Postgres,
                q("sslrootcert"),
                "?sslmode=verify-full&sslrootcert=CA",
            )
        }
        "mysql" | "mariadb" => {
            let mode = q("ssl-mode").unwrap_or_else(|| "PREFERRED".into());
            let asked = match mode.to_ascii_uppercase().as_str() {
                "REQUIRED" => Asked::Unverified,
                "VERIFY_CA" => Asked::Verified { chain_only: true },
                "VERIFY_IDENTITY" => Asked::Verified { chain_only: false },
                "PREFERRED" => Asked::Preferred,
                _ => Asked::Plain,
            };
            (
                3306,
                asked,
                Preamble::Unprobed,
                q("ssl-ca"),
                "?ssl-mode=VERIFY_IDENTITY&ssl-ca=CA",
            )
        }
        _ => return None,
    };
    Some(Target {
        host,
        port: parsed.port().unwrap_or(port),
        asked,
        preamble,
        ca: ca.map(Into::into),
        how,
    })
}

/// A Kafka URL's first broker, TLS as its settings say (librdkafka verifies the chain and
/// the host name: `ssl.endpoint.identification.algorithm=https`, which justonce keeps).
fn kafka_target(url: &str) -> Option<Target> {
    let o = justonce::kafka::KafkaOptions::from_url(url, "doctor").ok()?;
    let first = o.brokers.split(',').next()?.trim();
    let (host, port) = match first.rsplit_once(':') {
        Some((h, p)) => (h, p.parse().ok()?),
        None => (first, 9092),
    };
    let asked = if o.tls.is_some() {
        Asked::Verified { chain_only: false }
    } else {
        Asked::Plain
    };
    Some(Target {
        host: host.trim_matches(['[', ']']).to_owned(),
        port,
        asked,
        preamble: Preamble::None,
        ca: o.tls.and_then(|t| t.ca),
        how: "kafka://HOST:PORT?security.protocol=ssl&ssl.ca.location=CA",
    })
}

fn loopback(host: &str) -> bool {
    host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// The link check of `url`; `None` for an embedded SQLite file, which has no link.
pub(crate) async fn check(url: &str) -> Option<Check> {
    let t = target(url)?;
    let at = format!("{}:{}", t.host, t.port);
    let plain = |t: &Target| {
        if loopback(&t.host) {
            Check::pass(
                LINK,
                format!("plaintext to {at}, on this machine (loopback)"),
            )
        } else {
            Check::warn(
                LINK,
                format!(
                    "plaintext to {at}, beyond this machine: whoever is on the path reads the \
                     data and the password"
                ),
                format!("ask for verified TLS: {}", t.how),
            )
        }
    };
    if t.asked == Asked::Plain {
        return Some(plain(&t));
    }
    if t.asked == Asked::Preferred {
        let offered = t.preamble == Preamble::Postgres
            && tokio::time::timeout(Duration::from_secs(5), probe(&t))
                .await
                .is_ok_and(|seen| seen.is_ok());
        if !offered && t.preamble == Preamble::Postgres {
            return Some(plain(&t));
        }
        return Some(Check::warn(
            LINK,
            format!(
                "{} with {at}: TLS only because the server offers it, the server not \
                 verified, and plaintext where it offers none",
                if offered {
                    "encrypted"
                } else {
                    "maybe encrypted"
                }
            ),
            format!("ask for verified TLS: {}", t.how),
        ));
    }
    if t.preamble == Preamble::Unprobed {
        let what = match t.asked {
            Asked::Unverified => "encrypted, the server not verified (ssl-mode=REQUIRED)",
            Asked::Verified { chain_only: true } => "TLS, the chain verified (VERIFY_CA)",
            _ => "TLS, the chain and the host name verified (VERIFY_IDENTITY)",
        };
        return Some(Check::pass(
            LINK,
            format!(
                "{what} by the store's own connection; its certificate's expiry is not read \
                 here (MariaDB's TLS starts inside its handshake)"
            ),
        ));
    }
    Some(
        match tokio::time::timeout(Duration::from_secs(5), probe(&t)).await {
            Err(_) => Check::fail(
                LINK,
                format!("no TLS handshake with {at} within 5 s"),
                "check that the port is the server's TLS port",
            ),
            Ok(Err(e)) => Check::fail(
                LINK,
                format!("TLS with {at} failed: {e}"),
                "check that the port is the server's TLS port and that it offers TLS",
            ),
            Ok(Ok(seen)) => judge(&t, &at, seen),
        },
    )
}

/// What the handshake saw.
struct Seen {
    version: String,
    /// The verifier's answer: `Ok`, or why the certificate was not trusted.
    verdict: Result<(), String>,
    /// Days until the server's certificate expires (negative: expired), and the date.
    expiry: Option<(i64, String)>,
}

fn judge(t: &Target, at: &str, seen: Seen) -> Check {
    let roots = match &t.ca {
        Some(ca) => format!("{} and the system's roots", ca.display()),
        None => "the system's roots".into(),
    };
    let expiry = match &seen.expiry {
        Some((days, date)) => format!("; the certificate is valid until {date} ({days} days)"),
        None => String::new(),
    };
    match (&t.asked, &seen.verdict) {
        (Asked::Unverified, verdict) => Check::warn(
            LINK,
            format!(
                "{} to {at}, encrypted but the server not verified (it {}){expiry}",
                seen.version,
                match verdict {
                    Ok(()) => format!("would pass against {roots}"),
                    Err(e) => format!("would fail: {e}"),
                }
            ),
            format!("verify it: {}", t.how_verified()),
        ),
        (Asked::Verified { .. }, Err(e))
            if !(matches!(t.asked, Asked::Verified { chain_only: true })
                && e.contains("NotValidForName")) =>
        {
            Check::fail(
                LINK,
                format!(
                    "{} to {at}: the server's certificate is not trusted ({e}) against {roots}",
                    seen.version
                ),
                "name the authority that signed it (cacertfile=, tls_ca=, sslrootcert=), or \
                 fix the server's certificate",
            )
        }
        (Asked::Verified { chain_only }, _) => {
            let what = if *chain_only {
                "the chain verified against"
            } else {
                "the chain and the host name verified against"
            };
            let text = format!("{} to {at}, {what} {roots}{expiry}", seen.version);
            match seen.expiry {
                Some((days, _)) if days < 0 => {
                    Check::fail(LINK, text, "the server's certificate has expired: renew it")
                }
                Some((days, _)) if days < EXPIRY_WARN_DAYS => Check::warn(
                    LINK,
                    text,
                    format!("renew the server's certificate: it expires in {days} days"),
                ),
                _ => Check::pass(LINK, text),
            }
        }
        (Asked::Plain | Asked::Preferred, _) => {
            unreachable!("plaintext and preferred links are judged before")
        }
    }
}

impl Target {
    fn how_verified(&self) -> &'static str {
        match self.preamble {
            Preamble::Postgres => "sslmode=verify-full&sslrootcert=CA",
            _ => "ssl-mode=VERIFY_IDENTITY&ssl-ca=CA",
        }
    }
}

/// Records what the real verifier says, and lets the handshake end.
#[derive(Debug)]
struct Recorder {
    inner: Arc<dyn ServerCertVerifier>,
    verdict: Mutex<Option<Result<(), String>>>,
    end_entity: Mutex<Option<Vec<u8>>>,
}

impl ServerCertVerifier for Recorder {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let verdict = self
            .inner
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
            .map(|_| ())
            .map_err(|e| {
                format!("{e:?}")
                    .replace("InvalidCertificate(", "")
                    .replace(')', "")
            });
        *lock(&self.verdict) = Some(verdict);
        *lock(&self.end_entity) = Some(end_entity.to_vec());
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

async fn probe(t: &Target) -> anyhow::Result<Seen> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_native_certs::load_native_certs().certs {
        let _ = roots.add(cert);
    }
    if let Some(ca) = &t.ca {
        let pem =
            std::fs::read(ca).map_err(|e| anyhow::anyhow!("cannot read {}: {e}", ca.display()))?;
        for cert in rustls::pki_types::CertificateDer::pem_slice_iter(&pem) {
            roots.add(cert.map_err(|e| anyhow::anyhow!("{}: {e}", ca.display()))?)?;
        }
    }
    let inner = rustls::client::WebPkiServerVerifier::builder_with_provider(
        Arc::new(roots),
        provider.clone(),
    )
    .build()?;
    let recorder = Arc::new(Recorder {
        inner,
        verdict: Mutex::new(None),
        end_entity: Mutex::new(None),
    });
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .dangerous()
        .with_custom_certificate_verifier(recorder.clone())
        .with_no_client_auth();
    let mut tcp = tokio::net::TcpStream::connect((t.host.as_str(), t.port)).await?;
    match t.preamble {
        Preamble::Postgres => {
            tcp.write_all(&[0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f]).await?;
            let mut answer = [0u8; 1];
            tcp.read_exact(&mut answer).await?;
            if answer[0] != b'S' {
                anyhow::bail!("the server speaks no TLS (it answered the SSLRequest with 'N')");
            }
        }
        Preamble::Nats => {
            let mut line = String::new();
            tokio::io::BufReader::new(&mut tcp)
                .read_line(&mut line)
                .await?;
            if !line.contains("\"tls_required\":true") && !line.contains("\"tls_available\":true") {
                anyhow::bail!("the server speaks no TLS (its INFO offers none)");
            }
        }
        Preamble::None | Preamble::Unprobed => {}
    }
    let name = ServerName::try_from(t.host.clone())?;
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await?;
    let version = tls
        .get_ref()
        .1
        .protocol_version()
        .map_or("TLS".into(), |v| match v {
            rustls::ProtocolVersion::TLSv1_3 => "TLS 1.3".to_owned(),
            rustls::ProtocolVersion::TLSv1_2 => "TLS 1.2".to_owned(),
            other => format!("{other:?}"),
        });
    let verdict = lock(&recorder.verdict)
        .take()
        .unwrap_or_else(|| Err("no certificate was presented".into()));
    let expiry = lock(&recorder.end_entity).take().and_then(|der| {
        let (_, cert) = x509_parser::parse_x509_certificate(&der).ok()?;
        let not_after = cert.validity().not_after;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .ok()?
            .as_secs() as i64;
        let days = (not_after.timestamp() - now).div_euclid(86_400);
        Some((days, not_after.to_datetime().date().to_string()))
    });
    Ok(Seen {
        version,
        verdict,
        expiry,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_scheme_says_what_it_asks_for() {
        let t = target("postgres://app@db.example.com/shop?sslmode=verify-full&sslrootcert=/ca")
            .unwrap();
        assert_eq!(t.asked, Asked::Verified { chain_only: false });
        assert_eq!((t.host.as_str(), t.port), ("db.example.com", 5432));
        assert_eq!(t.ca, Some("/ca".into()));
        assert_eq!(
            target("postgres://app@db/shop").unwrap().asked,
            Asked::Preferred
        );
        assert_eq!(
            target("postgres://app@db/shop?sslmode=disable")
                .unwrap()
                .asked,
            Asked::Plain
        );
        assert_eq!(
            target("postgres://app@db/shop?sslmode=require")
                .unwrap()
                .asked,
            Asked::Unverified
        );
        assert_eq!(
            target("amqps://mq:5671/%2f").unwrap().asked,
            Asked::Verified { chain_only: false }
        );
        assert_eq!(target("nats://n:4222").unwrap().asked, Asked::Plain);
        assert_eq!(
            target("nats://n:4222?tls_required=true").unwrap().asked,
            Asked::Verified { chain_only: false }
        );
        assert_eq!(
            target("mysql://a@m/t?ssl-mode=VERIFY_CA").unwrap().asked,
            Asked::Verified { chain_only: true }
        );
        let k = target("kafka://app:pw@b1.example.com:9093,b2:9093?ssl.ca.location=/ca").unwrap();
        assert_eq!(k.asked, Asked::Verified { chain_only: false });
        assert_eq!((k.host.as_str(), k.port), ("b1.example.com", 9093));
        assert_eq!(k.ca, Some("/ca".into()));
        assert_eq!(target("kafka://k:9092").unwrap().asked, Asked::Plain);
        assert!(target("sqlite:queue.db").is_none());
        assert!(loopback("127.0.0.1") && loopback("::1") && loopback("localhost"));
        assert!(!loopback("db.example.com"));
    }

    #[tokio::test]
    async fn plaintext_beyond_loopback_warns() {
        let c = check("postgres://app@db.example.com/shop?sslmode=disable")
            .await
            .unwrap();
        assert_eq!(c.status, justonce::CheckStatus::Warn, "{c:?}");
        assert!(c.detail.contains("plaintext"), "{c:?}");
        let c = check("redis://127.0.0.1:6379").await.unwrap();
        assert_eq!(c.status, justonce::CheckStatus::Pass, "{c:?}");
    }
}
