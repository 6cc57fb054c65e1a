//! What a source and a publisher share: the configuration, the idempotent producer, the
//! topics' check and creation.

use std::sync::Arc;
use std::time::Duration;

use justonce_core::{Error, ErrorKind, Result};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::{ClientConfig, RDKafkaLogLevel};
use rdkafka::error::RDKafkaErrorCode;
use rdkafka::producer::FutureProducer;
use rdkafka::producer::Producer as _;
use tracing::debug;

use crate::error::{blocking, kafka};
use crate::options::{KafkaOptions, GUARDED};

/// Headroom over the largest record for the record's framing.
const FRAMING: usize = 64 << 10;

/// The configuration every client starts from: the brokers, then the user's settings.
pub(crate) fn base(opts: &KafkaOptions) -> Result<ClientConfig> {
    security_compiled_in(opts, cfg!(feature = "tls"))?;
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", &opts.brokers)
        .set("socket.timeout.ms", millis(opts.request_timeout))
        .set("log_level", "2")
        .set("security.protocol", opts.security_protocol());
    for (k, v) in opts.tls.iter().flat_map(|t| t.settings()) {
        c.set(k, v);
    }
    for (k, v) in opts.sasl.iter().flat_map(|s| s.settings()) {
        c.set(k, v);
    }
    // librdkafka's log lines bypass tracing (stderr, or the `log` crate), so
    // every broker disconnect printed `%3|…|FAIL|…` lines between a program's own. What
    // they say reaches justonce as errors (a publish's, a poll's, a connect's), so only
    // critical lines are printed unless the user asks for more with `log_level` (the
    // setting holds from the client's start, the level set after it from then on).
    let mut level = RDKafkaLogLevel::Critical;
    for (k, v) in &opts.client {
        if GUARDED.contains(&k.as_str()) {
            return Err(Error::config(format!(
                "the librdkafka setting `{k}` is justonce's own (its guarantees rest on it); \
                 use KafkaOptions instead"
            )));
        }
        if SECURITY.contains(&k.as_str()) {
            return Err(Error::config(format!(
                "the librdkafka setting `{k}` is set by KafkaOptions::tls and \
                 KafkaOptions::sasl (or the URL's settings of the same name), so that a link \
                 asked to be TLS never runs without it"
            )));
        }
        if let Some(refusal) = crate::url::unverified(k, v) {
            return Err(Error::config(refusal));
        }
        if k == "log_level" {
            level = match v.trim().parse::<u8>() {
                Ok(0) => RDKafkaLogLevel::Emerg,
                Ok(1) => RDKafkaLogLevel::Alert,
                Ok(2) => RDKafkaLogLevel::Critical,
                Ok(3) => RDKafkaLogLevel::Error,
                Ok(4) => RDKafkaLogLevel::Warning,
                Ok(5) => RDKafkaLogLevel::Notice,
                Ok(6) => RDKafkaLogLevel::Info,
                Ok(7) => RDKafkaLogLevel::Debug,
                _ => {
                    return Err(Error::config(format!(
                        "librdkafka's `log_level` is 0 to 7, not `{v}`"
                    )))
                }
            };
        }
        c.set(k, v);
    }
    // For a diagnosis where the program cannot be changed (a lab's workers, say):
    // librdkafka's debug contexts (`fetch,topic`), printed on stderr.
    if let Ok(contexts) = std::env::var(DEBUG_ENV) {
        c.set("debug", contexts);
        level = RDKafkaLogLevel::Debug;
    }
    c.set_log_level(level);
    Ok(c)
}

/// librdkafka settings that only [`KafkaOptions::tls`] and [`KafkaOptions::sasl`] set.
const SECURITY: &[&str] = &[
    "security.protocol",
    "sasl.mechanism",
    "sasl.mechanisms",
    "sasl.username",
    "sasl.password",
    "ssl.ca.location",
    "ssl.certificate.location",
    "ssl.key.location",
    "ssl.key.password",
];

/// Refuses, before librdkafka is asked, what this build cannot do: TLS and SCRAM need
/// librdkafka built with OpenSSL (the feature `tls`).
fn security_compiled_in(opts: &KafkaOptions, tls_built: bool) -> Result<()> {
    use crate::options::SaslMechanism;
    let scram = opts
        .sasl
        .as_ref()
        .is_some_and(|s| s.mechanism != SaslMechanism::Plain);
    if tls_built || (opts.tls.is_none() && !scram) {
        return Ok(());
    }
    let what = if opts.tls.is_some() {
        format!("TLS (security.protocol={})", opts.security_protocol())
    } else {
        "SASL SCRAM".to_owned()
    };
    Err(Error::config(format!(
        "the Kafka link asks for {what}, and this build of justonce has no Kafka TLS: build \
         with the feature `kafka-tls` of justonce (`tls` of justonce-kafka; librdkafka with \
         the system's OpenSSL, libssl-dev to build). Nothing was sent in plaintext"
    )))
}

/// A client's context that keeps the last error librdkafka reported of its own (a TLS
/// handshake refused, a SASL authentication failed, every broker down), for the error of
/// a connect that found no broker.
#[derive(Default, Clone)]
pub(crate) struct Seen {
    last: Arc<std::sync::Mutex<Option<String>>>,
}

impl Seen {
    /// The last error librdkafka reported, if any.
    pub(crate) fn last(&self) -> Option<String> {
        self.last.lock().ok().and_then(|l| l.clone())
    }
}

impl rdkafka::ClientContext for Seen {
    fn error(&self, error: rdkafka::error::KafkaError, reason: &str) {
        debug!(%error, reason, "librdkafka");
        // librdkafka 2.12 reports "1/1 brokers are down" after the handshake or login
        // that failed: the earlier error is the one that says why.
        let generic = error.rdkafka_error_code() == Some(RDKafkaErrorCode::AllBrokersDown);
        if let Ok(mut l) = self.last.lock() {
            if !(generic && l.is_some()) {
                *l = Some(reason.to_owned());
            }
        }
    }
}

/// The environment variable naming librdkafka debug contexts (`fetch,topic,metadata`) for
/// every client justonce makes.
pub(crate) const DEBUG_ENV: &str = "JUSTONCE_KAFKA_DEBUG";

pub(crate) fn millis(d: Duration) -> String {
    d.as_millis().max(1).to_string()
}

/// The producer's configuration: idempotent, every in-sync replica acking.
pub(crate) fn producer_config(opts: &KafkaOptions) -> Result<ClientConfig> {
    let mut c = base(opts)?;
    c.set("enable.idempotence", "true")
        .set("acks", "all")
        .set(
            "message.max.bytes",
            (opts.max_message_bytes + FRAMING).to_string(),
        )
        .set("message.timeout.ms", millis(opts.request_timeout))
        .set("linger.ms", "2");
    Ok(c)
}

/// The clients a source and a publisher share.
#[derive(Clone)]
pub(crate) struct Client {
    pub(crate) opts: Arc<KafkaOptions>,
    pub(crate) producer: FutureProducer<Seen>,
    /// What the producer's librdkafka last reported of its own.
    pub(crate) seen: Seen,
    pub(crate) admin: Arc<AdminClient<DefaultClientContext>>,
    /// A consumer of the group that never joins it, made at its first use: reads the
    /// group's committed offsets for the tools.
    pub(crate) group_reader: Arc<std::sync::OnceLock<rdkafka::consumer::BaseConsumer>>,
}

impl Client {
    /// The producer and an admin client, the brokers reached and the topics there (made
    /// when missing, with [`KafkaOptions::create`]).
    pub(crate) async fn connect(opts: KafkaOptions) -> Result<Client> {
        check(&opts)?;
        let seen = Seen::default();
        let producer: FutureProducer<Seen> = producer_config(&opts)?
            .create_with_context(seen.clone())
            .map_err(|e| kafka("creating the Kafka producer", e))?;
        let admin: AdminClient<DefaultClientContext> = base(&opts)?
            .create()
            .map_err(|e| kafka("creating the Kafka admin client", e))?;
        let client = Client {
            opts: Arc::new(opts),
            producer,
            seen,
            admin: Arc::new(admin),
            group_reader: Arc::new(std::sync::OnceLock::new()),
        };
        client.topology().await?;
        Ok(client)
    }

    /// The partitions of `topic`: `None` when the brokers do not have it.
    pub(crate) async fn partitions_of(&self, topic: &str) -> Result<Option<Vec<i32>>> {
        let producer = self.producer.clone();
        let timeout = self.opts.request_timeout.min(Duration::from_secs(10));
        let t = topic.to_owned();
        let brokers = self.opts.brokers.clone();
        let seen = self.seen.clone();
        let tls = self.opts.tls.is_some();
        let md = blocking("reading Kafka metadata", move || {
            producer.client().fetch_metadata(Some(&t), timeout)
        })
        .await?
        .map_err(|e| {
            Error::with_source(
                ErrorKind::Connect,
                match seen.last() {
                    Some(why) => format!(
                        "cannot reach Kafka at {brokers} (no metadata within {timeout:?}): \
                         {why}{}",
                        hint(&why)
                    ),
                    None if tls => format!(
                        "cannot reach Kafka at {brokers} (no metadata within {timeout:?}; is \
                         the port the brokers' TLS listener? A plaintext one never answers \
                         the TLS handshake)"
                    ),
                    None => {
                        format!("cannot reach Kafka at {brokers} (no metadata within {timeout:?})")
                    }
                },
                e,
            )
        })?;
        let Some(t) = md.topics().iter().find(|t| t.name() == topic) else {
            return Ok(None);
        };
        match t.error() {
            None => Ok(Some(t.partitions().iter().map(|p| p.id()).collect())),
            Some(e) if RDKafkaErrorCode::from(e) == RDKafkaErrorCode::UnknownTopicOrPartition => {
                Ok(None)
            }
            Some(e) => Err(Error::new(
                crate::error::kind_of(e.into()),
                format!(
                    "Kafka reports topic `{topic}` as {:?}",
                    RDKafkaErrorCode::from(e)
                ),
            )),
        }
    }

    /// The topic and the dead-letter topic, checked, and made when missing.
    async fn topology(&self) -> Result<()> {
        let o = &self.opts;
        let mut missing = Vec::new();
        for (topic, partitions) in [(&o.topic, o.partitions), (&o.dead_topic, 1)] {
            match self.partitions_of(topic).await? {
                Some(p) if !p.is_empty() => {}
                _ => missing.push((topic.clone(), partitions)),
            }
        }
        if missing.is_empty() {
            return Ok(());
        }
        if !o.create {
            let names: Vec<&str> = missing.iter().map(|(t, _)| t.as_str()).collect();
            return Err(Error::config(format!(
                "Kafka at {} has no topic {} (create it, or connect with KafkaOptions::create(true))",
                o.brokers,
                names.join(" and no topic ")
            )));
        }
        let new: Vec<NewTopic<'_>> = missing
            .iter()
            .map(|(t, p)| NewTopic::new(t, *p, TopicReplication::Fixed(1)))
            .collect();
        let opts = AdminOptions::new().operation_timeout(Some(o.request_timeout));
        let results = self
            .admin
            .create_topics(&new, &opts)
            .await
            .map_err(|e| kafka("creating Kafka topics", e))?;
        for r in results {
            match r {
                Ok(t) => debug!(topic = %t, "created"),
                Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
                Err((t, code)) => {
                    return Err(Error::new(
                        crate::error::kind_of(code),
                        format!("creating topic `{t}` failed: {code}"),
                    ))
                }
            }
        }
        // Metadata catches up with a creation in a moment; a publish before it would
        // find no partition.
        for _ in 0..50 {
            let mut all = true;
            for (t, _) in &missing {
                all &= self.partitions_of(t).await?.is_some_and(|p| !p.is_empty());
            }
            if all {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Err(Error::new(
            ErrorKind::Timeout,
            "created topics did not show in Kafka's metadata within 5 s",
        ))
    }
}

/// What to change, for the failures librdkafka reports in its own words.
fn hint(why: &str) -> &'static str {
    let w = why.to_ascii_lowercase();
    if w.contains("certificate verify failed") || w.contains("could not be verified") {
        " (the brokers' certificate is not signed by the authority given: ssl.ca.location, \
         KafkaTls::ca; or the system's roots)"
    } else if w.contains("ssl handshake failed") || w.contains("wrong version number") {
        " (is the port the brokers' TLS listener, and does it take this client's certificate?)"
    } else if w.contains("authentication") || w.contains("sasl") {
        " (check the user name, the password and the SASL mechanism)"
    } else if w.contains("disconnected") || w.contains("connection refused") {
        " (is the broker up, and does the port speak what security.protocol says?)"
    } else {
        ""
    }
}

/// Options that cannot work, refused before anything connects.
fn check(o: &KafkaOptions) -> Result<()> {
    for t in [&o.topic, &o.dead_topic] {
        let ok = !t.is_empty()
            && t.len() <= 249
            && t.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
            && t != "."
            && t != "..";
        if !ok {
            return Err(Error::config(format!(
                "`{t}` is not a Kafka topic name (letters, digits, `.`, `_` and `-`, at most 249)"
            )));
        }
    }
    if o.topic == o.dead_topic {
        return Err(Error::config(
            "the dead-letter topic must not be the topic itself",
        ));
    }
    if o.group.is_empty() {
        return Err(Error::config("the consumer group must not be empty"));
    }
    if o.partitions < 1 {
        return Err(Error::config("a topic needs at least one partition"));
    }
    if o.brokers.is_empty() {
        return Err(Error::config("no Kafka brokers given"));
    }
    if o.brokers.contains(['@', '?', '/']) {
        return Err(Error::config(
            "KafkaOptions::new takes HOST:PORT,…: a URL with credentials or settings is read \
             by KafkaOptions::from_url",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_names_and_guarded_settings_are_refused() {
        assert!(check(&KafkaOptions::new("127.0.0.1:9092", "orders")).is_ok());
        assert!(check(&KafkaOptions::new("127.0.0.1:9092", "or ders")).is_err());
        assert!(check(&KafkaOptions::new("127.0.0.1:9092", "o").dead_topic("o")).is_err());
        let o = KafkaOptions::new("127.0.0.1:9092", "orders").client("acks", "1");
        let e = base(&o).expect_err("acks is guarded");
        assert!(e.to_string().contains("acks"), "{e}");
        let o = KafkaOptions::new("127.0.0.1:9092", "orders").client("security.protocol", "ssl");
        assert!(
            base(&o).is_err(),
            "security.protocol is KafkaOptions::tls's"
        );
        let o = KafkaOptions::new("127.0.0.1:9092", "orders")
            .client("enable.ssl.certificate.verification", "false");
        assert!(base(&o).is_err(), "verification stays on");
        let o = KafkaOptions::new("kafka://u:p@127.0.0.1:9092", "orders");
        assert!(
            check(&o).is_err(),
            "a URL with credentials goes to from_url"
        );
    }

    #[test]
    fn a_build_without_tls_refuses_what_needs_it_and_says_which_feature() {
        use crate::{KafkaSasl, KafkaTls, SaslMechanism};
        let plain = KafkaOptions::new("h:1", "t");
        assert!(security_compiled_in(&plain, false).is_ok());
        let sasl_plain = plain
            .clone()
            .sasl(KafkaSasl::new(SaslMechanism::Plain, "u", "hunter2"));
        assert!(security_compiled_in(&sasl_plain, false).is_ok());
        for o in [
            plain.clone().tls(KafkaTls::new()),
            plain.sasl(KafkaSasl::new(SaslMechanism::ScramSha256, "u", "hunter2")),
        ] {
            let e = security_compiled_in(&o, false).expect_err("no OpenSSL in this build");
            let e = e.to_string();
            assert!(e.contains("kafka-tls") && !e.contains("hunter2"), "{e}");
            assert!(security_compiled_in(&o, true).is_ok());
        }
    }
}
