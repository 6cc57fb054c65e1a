//! `kafka://[USER:PASSWORD@]HOST:PORT[,HOST:PORT…][?SETTINGS]`, read into the brokers,
//! TLS, SASL and the librdkafka settings passed through ([`KafkaOptions::from_url`]).
//!
//! [`KafkaOptions::from_url`]: crate::KafkaOptions::from_url

use std::path::PathBuf;

use justonce_core::{Error, Result};

use crate::options::{KafkaSasl, KafkaTls, SaslMechanism};

pub(crate) struct Parsed {
    pub(crate) brokers: String,
    pub(crate) tls: Option<KafkaTls>,
    pub(crate) sasl: Option<KafkaSasl>,
    pub(crate) client: Vec<(String, String)>,
}

/// Settings that would turn the verification of the brokers' certificates off, refused
/// wherever they come from.
pub(crate) fn unverified(key: &str, value: &str) -> Option<String> {
    let v = value.trim().to_ascii_lowercase();
    let off = match key {
        "enable.ssl.certificate.verification" => matches!(v.as_str(), "false" | "0" | "no"),
        "ssl.endpoint.identification.algorithm" => v != "https",
        _ => false,
    };
    off.then(|| {
        format!(
            "`{key}={value}` turns the verification of the brokers' certificates off, which \
             justonce does not offer: give the authority that signed them \
             (`ssl.ca.location`, KafkaTls::ca) and a broker address their certificates name"
        )
    })
}

fn decode(s: &str) -> Result<String> {
    percent_encoding::percent_decode_str(s)
        .decode_utf8()
        .map(|c| c.into_owned())
        .map_err(|_| Error::config("the user name or password of a Kafka URL is not UTF-8"))
}

pub(crate) fn parse(url: &str) -> Result<Parsed> {
    let s = url.trim();
    let rest = s.strip_prefix("kafka://");
    let rest = rest.or((!s.contains("://")).then_some(s)).ok_or_else(|| {
        Error::config(format!(
            "a Kafka URL starts with kafka:// (kafka://HOST:PORT), not `{}`",
            justonce_core::redact_url(s)
        ))
    })?;
    let (authority, query) = rest.split_once('?').unwrap_or((rest, ""));
    let authority = authority.trim_end_matches('/');
    let (userinfo, hosts) = match authority.rsplit_once('@') {
        Some((u, h)) => (Some(u), h),
        None => (None, authority),
    };
    if hosts.is_empty() || hosts.contains('/') {
        return Err(Error::config(
            "a Kafka URL names its brokers as HOST:PORT, comma-separated, and no path",
        ));
    }
    let mut user = None;
    let mut password = None;
    if let Some(u) = userinfo {
        let (name, pw) = u.split_once(':').unwrap_or((u, ""));
        user = Some(decode(name)?).filter(|n| !n.is_empty());
        password = Some(decode(pw)?).filter(|p| !p.is_empty());
    }
    let mut protocol: Option<String> = None;
    let mut mechanism = None;
    let mut tls = KafkaTls::new();
    let mut any_ssl = false;
    let mut client = Vec::new();
    for (k, v) in form_urlencoded::parse(query.as_bytes()) {
        let (k, v) = (k.trim().to_owned(), v.into_owned());
        if let Some(refusal) = unverified(&k, &v) {
            return Err(Error::config(refusal));
        }
        match k.as_str() {
            "security.protocol" => protocol = Some(v.trim().to_ascii_lowercase()),
            "sasl.mechanism" | "sasl.mechanisms" => mechanism = Some(SaslMechanism::parse(&v)?),
            "sasl.username" => user = Some(v),
            "sasl.password" => password = Some(v),
            "ssl.ca.location" => {
                any_ssl = true;
                tls = tls.ca(PathBuf::from(v));
            }
            "ssl.certificate.location" => {
                any_ssl = true;
                tls.cert = Some(PathBuf::from(v));
            }
            "ssl.key.location" => {
                any_ssl = true;
                tls.key = Some(PathBuf::from(v));
            }
            "ssl.key.password" => {
                any_ssl = true;
                tls = tls.key_password(v);
            }
            _ => client.push((k, v)),
        }
    }
    let protocol = match protocol {
        Some(p) => p,
        None if user.is_some() || password.is_some() || mechanism.is_some() => "sasl_ssl".into(),
        None if any_ssl => "ssl".into(),
        None => "plaintext".into(),
    };
    let (want_tls, want_sasl) = match protocol.as_str() {
        "plaintext" => (false, false),
        "ssl" => (true, false),
        "sasl_plaintext" => (false, true),
        "sasl_ssl" => (true, true),
        other => {
            return Err(Error::config(format!(
                "`security.protocol={other}` is not one of plaintext, ssl, sasl_plaintext, \
                 sasl_ssl"
            )))
        }
    };
    if any_ssl && !want_tls {
        return Err(Error::config(format!(
            "the Kafka URL names TLS files (ssl.*) but asks for `security.protocol={protocol}`: \
             ask for ssl or sasl_ssl"
        )));
    }
    let sasl = if want_sasl {
        let (Some(user), Some(password)) = (user, password) else {
            return Err(Error::config(format!(
                "`security.protocol={protocol}` needs a user name and a password: \
                 kafka://USER:PASSWORD@HOST:PORT (the URL from the environment or a file, \
                 never a command line)"
            )));
        };
        Some(KafkaSasl::new(
            mechanism.unwrap_or(SaslMechanism::ScramSha512),
            user,
            password,
        ))
    } else {
        if user.is_some() || password.is_some() || mechanism.is_some() {
            return Err(Error::config(format!(
                "the Kafka URL carries SASL credentials but asks for \
                 `security.protocol={protocol}`, which sends none: ask for sasl_ssl"
            )));
        }
        None
    };
    let brokers = hosts
        .split(',')
        .map(str::trim)
        .filter(|h| !h.is_empty())
        .collect::<Vec<_>>()
        .join(",");
    Ok(Parsed {
        brokers,
        tls: want_tls.then_some(tls),
        sasl,
        client,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(url: &str) -> Result<Parsed> {
        parse(url)
    }

    #[test]
    fn a_plain_url_is_plaintext_and_its_brokers_are_kept() {
        let x = p("kafka://a:9092,b:9092/").unwrap();
        assert_eq!(x.brokers, "a:9092,b:9092");
        assert!(x.tls.is_none() && x.sasl.is_none() && x.client.is_empty());
    }

    #[test]
    fn credentials_mean_sasl_over_tls_unless_said_otherwise() {
        let x = p("kafka://app:s%40cret@h:9093").unwrap();
        assert!(x.tls.is_some());
        let s = x.sasl.unwrap();
        assert_eq!(
            (s.username.as_str(), s.mechanism),
            ("app", SaslMechanism::ScramSha512)
        );
        assert!(s
            .settings()
            .contains(&("sasl.password", "s@cret".to_owned())));
        let x = p("kafka://app:pw@h:9092?security.protocol=SASL_PLAINTEXT&sasl.mechanism=plain")
            .unwrap();
        assert!(x.tls.is_none());
        assert_eq!(x.sasl.unwrap().mechanism, SaslMechanism::Plain);
    }

    #[test]
    fn ssl_files_mean_tls_and_other_settings_pass_through() {
        let x = p("kafka://h:9093?ssl.ca.location=/ca.pem&ssl.certificate.location=/c.pem&ssl.key.location=/k.pem&client.id=me").unwrap();
        let t = x.tls.unwrap();
        assert_eq!(t.ca, Some(PathBuf::from("/ca.pem")));
        assert_eq!(t.key, Some(PathBuf::from("/k.pem")));
        assert!(x.sasl.is_none());
        assert_eq!(x.client, vec![("client.id".to_owned(), "me".to_owned())]);
    }

    #[test]
    fn contradictions_and_verification_off_are_refused() {
        for bad in [
            "kafka://h:1?security.protocol=plaintext&ssl.ca.location=/ca.pem",
            "kafka://u:p@h:1?security.protocol=ssl",
            "kafka://u:p@h:1?security.protocol=plaintext",
            "kafka://h:1?security.protocol=sasl_ssl",
            "kafka://h:1?security.protocol=tls",
            "kafka://h:1?sasl.mechanism=GSSAPI",
            "kafka://h:1?ssl.endpoint.identification.algorithm=none",
            "kafka://h:1?enable.ssl.certificate.verification=false",
            "kafka://h:1/topic",
            "amqp://h:1",
        ] {
            let e = p(bad).err().unwrap_or_else(|| panic!("{bad} was taken"));
            assert!(!e.to_string().is_empty());
        }
    }

    #[test]
    fn no_refusal_repeats_the_password() {
        for bad in [
            "kafka://u:hunter2@h:1?security.protocol=ssl",
            "kafka://u:hunter2@h:1?sasl.mechanism=GSSAPI",
            "kafka://u:hunter2@h:1?security.protocol=bogus",
            "kafkaa://u:hunter2@h:1",
        ] {
            let e = p(bad).err().unwrap();
            assert!(!e.to_string().contains("hunter2"), "{e}");
        }
    }
}
