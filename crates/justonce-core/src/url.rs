//! URL redaction: nothing in justonce prints a credential (contract 9 in ARCHITECTURE.md).

/// `url` with its password replaced by `***`, for logs and error messages.
///
/// ```
/// use justonce_core::redact_url;
///
/// assert_eq!(redact_url("amqp://guest:guest@127.0.0.1:5672/%2f"), "amqp://guest:***@127.0.0.1:5672/%2f");
/// assert_eq!(redact_url("postgres://app:s3cr%40t@db/test"), "postgres://app:***@db/test");
/// assert_eq!(redact_url("sqlite:/tmp/queue.db"), "sqlite:/tmp/queue.db");
/// ```
pub fn redact_url(url: &str) -> String {
    let Some(scheme_end) = url.find("://") else {
        return url.to_owned();
    };
    let rest_start = scheme_end + 3;
    let rest = &url[rest_start..];
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let authority = &rest[..authority_end];
    let Some(at) = authority.rfind('@') else {
        return url.to_owned();
    };
    let userinfo = &authority[..at];
    let user = userinfo.split_once(':').map_or(userinfo, |(u, _)| u);
    if user.len() == userinfo.len() {
        return url.to_owned();
    }
    format!("{}{}:***{}", &url[..rest_start], user, &rest[at..])
}
