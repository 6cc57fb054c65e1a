//! Certificates for TLS tests, made by the test (rcgen): a certificate authority of its
//! own, a server certificate for `127.0.0.1` and `localhost`, client certificates, and a
//! second authority that the servers do not trust, with a server certificate of its own.
//! PEM files in a temporary directory, deleted with the [`Pki`].
//!
//! ```
//! let pki = justonce_test::tls::Pki::new();
//! let ca = std::fs::read_to_string(pki.ca()).unwrap();
//! assert!(ca.starts_with("-----BEGIN CERTIFICATE-----"));
//! let (cert, key) = pki.client("app");
//! assert!(cert.exists() && key.exists());
//! ```

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

/// A certificate authority of the test's own and what it signed, as PEM files.
pub struct Pki {
    dir: tempfile::TempDir,
    issuer: Issuer<'static, KeyPair>,
}

impl Default for Pki {
    fn default() -> Self {
        Self::new()
    }
}

impl Pki {
    /// Makes the authority (`ca.pem`), the server's certificate and key (`server.pem`,
    /// `server.key`), and another authority (`other-ca.pem`) with a server certificate for
    /// the same names (`other-server.pem`, `other-server.key`).
    pub fn new() -> Self {
        let dir = tempfile::Builder::new()
            .prefix("justonce-pki-")
            .tempdir()
            .expect("a temporary directory for the certificates");
        let (issuer, ca) = authority("justonce test CA");
        write(dir.path(), "ca.pem", &ca);
        let (other, other_ca) = authority("another CA");
        write(dir.path(), "other-ca.pem", &other_ca);
        let pki = Pki { dir, issuer };
        let (cert, key) = leaf(&pki.issuer, "localhost", true);
        write(pki.dir.path(), "server.pem", &cert);
        write(pki.dir.path(), "server.key", &key);
        let (cert, key) = leaf(&other, "localhost", true);
        write(pki.dir.path(), "other-server.pem", &cert);
        write(pki.dir.path(), "other-server.key", &key);
        pki
    }

    /// The directory that holds every file.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The authority's certificate: what a client trusts.
    pub fn ca(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    /// An authority that signed none of the server's certificates.
    pub fn other_ca(&self) -> PathBuf {
        self.dir.path().join("other-ca.pem")
    }

    /// The server's certificate (for `127.0.0.1` and `localhost`) and key, signed by
    /// [`Pki::ca`].
    pub fn server(&self) -> (PathBuf, PathBuf) {
        (self.file("server.pem"), self.file("server.key"))
    }

    /// A server certificate and key for the same names, signed by [`Pki::other_ca`].
    pub fn other_server(&self) -> (PathBuf, PathBuf) {
        (self.file("other-server.pem"), self.file("other-server.key"))
    }

    /// A client certificate whose common name is `name` (the user a server that
    /// authenticates by certificate takes it for), and its key, signed by [`Pki::ca`].
    pub fn client(&self, name: &str) -> (PathBuf, PathBuf) {
        let (cert, key) = leaf(&self.issuer, name, false);
        let stem = format!("client-{name}");
        write(self.dir.path(), &format!("{stem}.pem"), &cert);
        write(self.dir.path(), &format!("{stem}.key"), &key);
        (
            self.file(&format!("{stem}.pem")),
            self.file(&format!("{stem}.key")),
        )
    }

    /// A server certificate for the same names as [`Pki::server`], signed by
    /// [`Pki::ca`], that expires in `days` days (a certificate an operator must renew).
    pub fn server_expiring_in(&self, days: i64) -> (PathBuf, PathBuf) {
        let (cert, key) = leaf_until(
            &self.issuer,
            "localhost",
            true,
            Some(time::OffsetDateTime::now_utc() + time::Duration::days(days)),
        );
        write(self.dir.path(), "server-soon.pem", &cert);
        write(self.dir.path(), "server-soon.key", &key);
        (self.file("server-soon.pem"), self.file("server-soon.key"))
    }

    fn file(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}

fn authority(name: &str) -> (Issuer<'static, KeyPair>, String) {
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("no names");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let key = KeyPair::generate().expect("a key");
    let cert = params.self_signed(&key).expect("a self-signed authority");
    (Issuer::new(params, key), cert.pem())
}

/// A certificate signed by `issuer`: a server's for `127.0.0.1` and `name`, or a client's
/// whose common name is `name`; and its key, PKCS#8 PEM.
fn leaf(issuer: &Issuer<'static, KeyPair>, name: &str, server: bool) -> (String, String) {
    leaf_until(issuer, name, server, None)
}

/// [`leaf`], valid until `not_after` when given.
fn leaf_until(
    issuer: &Issuer<'static, KeyPair>,
    name: &str,
    server: bool,
    not_after: Option<time::OffsetDateTime>,
) -> (String, String) {
    let names = if server {
        vec!["127.0.0.1".to_owned(), name.to_owned()]
    } else {
        Vec::new()
    };
    let mut params = CertificateParams::new(names).expect("valid names");
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![if server {
        ExtendedKeyUsagePurpose::ServerAuth
    } else {
        ExtendedKeyUsagePurpose::ClientAuth
    }];
    if let Some(at) = not_after {
        params.not_before = time::OffsetDateTime::now_utc() - time::Duration::days(1);
        params.not_after = at;
    }
    let key = KeyPair::generate().expect("a key");
    let cert = params
        .signed_by(&key, issuer)
        .expect("a signed certificate");
    (cert.pem(), key.serialize_pem())
}

fn write(dir: &Path, name: &str, pem: &str) {
    let path = dir.join(name);
    std::fs::write(&path, pem).expect("writing a certificate");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        // Servers refuse a key that others can read.
        let _ = std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600));
    }
}
