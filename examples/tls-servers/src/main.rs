//! RabbitMQ and PostgreSQL servers of one's own, each with a plaintext listener and a TLS
//! one (certificates made here, a CA of their own), and passwords: what a production link
//! looks like, on this machine, beside the shared services it never touches.
//!
//! ```sh
//! cargo run -p tls-servers            # prints: source /tmp/justonce-pki-…/env
//! source /tmp/justonce-pki-…/env      # JUSTONCE_{,TLS_}{TRANSPORT,STORE}_URL, mode 0600
//! cargo run --release -- demo         # over verified TLS: JUSTONCE_TLS_* as the URLs
//! cargo run --release -- bench --variants bare,at-least-once,effectively-once \
//!     --batch 1,100 --concurrency 1 --msg-bytes 1000 --repeats 5   # TLS / plaintext
//! ```
//!
//! The servers stop, and their files go, on Ctrl-C.

use justonce_amqp::harness::{Cluster, NodeTls};
use justonce_sql::harness::{OwnPostgres, ServerTls};
use justonce_test::tls::Pki;

/// The RabbitMQ user's password on the node of this tool.
const MQ_PASSWORD: &str = "tls-servers-mq-pw";

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let pki = Pki::new();
    let (cert, key) = pki.server();
    let ca = pki.ca();
    eprintln!("tls-servers: starting PostgreSQL (initdb) and a RabbitMQ node (about 15 s)");
    let pg = OwnPostgres::start(Some(&ServerTls {
        cert: cert.clone(),
        key: key.clone(),
        client_ca: ca.clone(),
    }))
    .await?;
    let node = Cluster::start_tls(&NodeTls {
        cert,
        key,
        ca: ca.clone(),
    })
    .await?;
    node.add_user("app", MQ_PASSWORD).await?;
    let amqp_port = node.addr(0).port();
    let amqps = node
        .amqps_url(0)
        .ok_or("the node has no TLS listener")?
        .replacen("amqps://", &format!("amqps://app:{MQ_PASSWORD}@"), 1);
    let env = [
        (
            "JUSTONCE_TRANSPORT_URL",
            format!("amqp://app:{MQ_PASSWORD}@127.0.0.1:{amqp_port}/%2f"),
        ),
        (
            "JUSTONCE_TLS_TRANSPORT_URL",
            format!("{amqps}?cacertfile={}", ca.display()),
        ),
        ("JUSTONCE_STORE_URL", pg.url("?sslmode=disable")),
        (
            "JUSTONCE_TLS_STORE_URL",
            pg.url(&format!(
                "?sslmode=verify-full&sslrootcert={}",
                ca.display()
            )),
        ),
        ("JUSTONCE_PG_PLAIN_URL", pg.url("?sslmode=disable")),
        (
            "JUSTONCE_PG_TLS_URL",
            pg.url(&format!(
                "?sslmode=verify-full&sslrootcert={}",
                ca.display()
            )),
        ),
    ];
    let file = pki.dir().join("env");
    let text: String = env
        .iter()
        .map(|(k, v)| format!("export {k}='{v}'\n"))
        .collect();
    std::fs::write(&file, text)?;
    {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600))?;
    }
    println!("source {}", file.display());
    eprintln!("tls-servers: running; Ctrl-C stops them and removes their files");
    tokio::signal::ctrl_c().await?;
    drop((node, pg));
    Ok(())
}
