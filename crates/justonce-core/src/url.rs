//! URL redaction: nothing in justonce prints a credential (contract 9 in ARCHITECTURE.md).

/// Query keys whose values are secrets: masked by [`redact_url`] wherever they appear.
const SECRET_KEYS: &[&str] = &[
    "password",
    "pass",
    "passwd",
    "pwd",
    "sslpassword",
    "token",
    "auth_token",
    "secret",
    "nkey",
    "seed",
    "sasl.password",
    "sasl_password",
    "ssl.key.password",
];

/// `url` with its password, and the value of every secret query parameter (`password=`,
/// `sslpassword=`, `token=`, `sasl.password=`, …), replaced by `***`, for logs and error
/// messages.
///
/// ```
/// use justonce_core::redact_url;
///
/// assert_eq!(redact_url("amqp://guest:guest@127.0.0.1:5672/%2f"), "amqp://guest:***@127.0.0.1:5672/%2f");
/// assert_eq!(redact_url("postgres://app:s3cr%40t@db/test"), "postgres://app:***@db/test");
/// assert_eq!(redact_url("sqlite:/tmp/queue.db"), "sqlite:/tmp/queue.db");
/// assert_eq!(
///     redact_url("postgres://app@db/test?sslmode=verify-full&password=s3cret"),
///     "postgres://app@db/test?sslmode=verify-full&password=***"
/// );
/// assert_eq!(redact_url("nats://h:4222?token=t0k3n#x"), "nats://h:4222?token=***#x");
/// assert_eq!(redact_url("nats://t0k3n@h:4222"), "nats://***@h:4222");
/// ```
pub fn redact_url(url: &str) -> String {
    let (url, fragment) = url.split_at(url.find('#').unwrap_or(url.len()));
    let (head, query) = match url.split_once('?') {
        Some((head, query)) => (head, Some(query)),
        None => (url, None),
    };
    let mut out = redact_userinfo(head);
    if let Some(query) = query {
        out.push('?');
        for (i, pair) in query.split('&').enumerate() {
            if i > 0 {
                out.push('&');
            }
            match pair.split_once('=') {
                Some((key, _)) if SECRET_KEYS.iter().any(|k| key.eq_ignore_ascii_case(k)) => {
                    out.push_str(key);
                    out.push_str("=***");
                }
                _ => out.push_str(pair),
            }
        }
    }
    out.push_str(fragment);
    out
}

/// `url` (no query) with the password of its user info replaced by `***`.
fn redact_userinfo(url: &str) -> String {
    let Some(scheme_end) = url.find("://") else {
        return url.to_owned();
    };
    let rest_start = scheme_end + 3;
    let rest = &url[rest_start..];
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let authority = &rest[..authority_end];
    let Some(at) = authority.rfind('@') else {
        return url.to_owned();
    };
    let userinfo = &authority[..at];
    let user = userinfo.split_once(':').map_or(userinfo, |(u, _)| u);
    if user.len() == userinfo.len() {
        // A NATS URL's user without a password is a token.
        let scheme = &url[..scheme_end];
        if scheme.eq_ignore_ascii_case("nats") || scheme.eq_ignore_ascii_case("tls") {
            return format!("{}***{}", &url[..rest_start], &rest[at..]);
        }
        return url.to_owned();
    }
    format!("{}{}:***{}", &url[..rest_start], user, &rest[at..])
}
