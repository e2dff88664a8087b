//! A throwaway PKI for tests: a CA, server and client certificates signed by it, and the
//! bad ones every TLS error path needs (an expired server certificate, one issued for
//! another name, a CA nobody trusts), written as PEM files into a temp dir.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, date_time_ymd,
};
use tempfile::TempDir;

use super::TestkitError;
use crate::TlsConfig;

/// A certificate and its private key, as PEM files.
#[derive(Clone, Debug)]
pub struct CertPair {
    /// The certificate (PEM).
    pub cert: PathBuf,
    /// Its private key (PEM).
    pub key: PathBuf,
}

/// TLS for a test server's client port: its certificate and key, the CA it checks client
/// certificates against, and whether it requires one.
#[derive(Clone, Debug)]
pub struct ServerTls {
    /// The server's certificate (PEM file).
    pub cert: PathBuf,
    /// Its private key (PEM file).
    pub key: PathBuf,
    /// The CA that signs client certificates (PEM file).
    pub ca: PathBuf,
    /// Whether a client must present a certificate signed by `ca`.
    pub client_cert_auth: bool,
}

/// Certificates for tests; see the module docs. The files live as long as this value.
///
/// ```no_run
/// use fencelock::testkit::{EtcdCluster, TestPki};
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let pki = TestPki::generate()?;
/// let etcd = EtcdCluster::builder()
///     .tls(pki.server_tls(true), pki.client_tls("root")?) // mutual TLS
///     .start()
///     .await?;
/// let config = etcd.config("app").with_tls(pki.client_tls("locker")?);
/// # Ok(()) }
/// ```
pub struct TestPki {
    dir: TempDir,
    ca_cert: PathBuf,
    ca: Issuer<'static, KeyPair>,
    server: CertPair,
    expired_server: CertPair,
    misnamed_server: CertPair,
    untrusted_ca: PathBuf,
}

impl std::fmt::Debug for TestPki {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestPki")
            .field("dir", &self.dir.path())
            .finish_non_exhaustive()
    }
}

fn pki_error(what: &str, err: impl std::fmt::Display) -> TestkitError {
    TestkitError::Cluster(format!("test PKI: {what}: {err}"))
}

impl TestPki {
    /// Generates the CA and every certificate, valid for `127.0.0.1` and `localhost`.
    pub fn generate() -> Result<Self, TestkitError> {
        let dir = tempfile::Builder::new()
            .prefix("fencelock-pki-")
            .tempdir()
            .map_err(|e| TestkitError::io("creating the PKI temp dir", e))?;
        // Servers may run as another user (PostgreSQL as `postgres`): let them read.
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))
                .map_err(|e| TestkitError::io("chmod the PKI dir", e))?;
        }
        let (ca_params, ca_key) = new_ca("fencelock test CA")?;
        let ca_pem = ca_params
            .self_signed(&ca_key)
            .map_err(|e| pki_error("signing the CA", e))?
            .pem();
        let ca_cert = write(dir.path(), "ca.pem", &ca_pem)?;
        let ca = Issuer::new(ca_params, ca_key);

        let local = vec!["127.0.0.1".to_owned(), "localhost".to_owned()];
        let server = issue(&dir, &ca, "server", &local, Usage::Server, Validity::Now)?;
        let expired_server = issue(&dir, &ca, "expired", &local, Usage::Server, Validity::Past)?;
        let elsewhere = vec!["elsewhere.invalid".to_owned()];
        let misnamed_server = issue(
            &dir,
            &ca,
            "misnamed",
            &elsewhere,
            Usage::Server,
            Validity::Now,
        )?;

        let (other_params, other_key) = new_ca("a CA nobody trusts")?;
        let other_pem = other_params
            .self_signed(&other_key)
            .map_err(|e| pki_error("signing the other CA", e))?
            .pem();
        let untrusted_ca = write(dir.path(), "untrusted-ca.pem", &other_pem)?;
        Ok(Self {
            dir,
            ca_cert,
            ca,
            server,
            expired_server,
            misnamed_server,
            untrusted_ca,
        })
    }

    /// The CA certificate (PEM file).
    #[must_use]
    pub fn ca_cert(&self) -> &Path {
        &self.ca_cert
    }

    /// A server certificate for 127.0.0.1 and localhost, signed by the CA.
    #[must_use]
    pub fn server(&self) -> &CertPair {
        &self.server
    }

    /// A server certificate for 127.0.0.1 that expired in 2021.
    #[must_use]
    pub fn expired_server(&self) -> &CertPair {
        &self.expired_server
    }

    /// A server certificate for `elsewhere.invalid` only.
    #[must_use]
    pub fn misnamed_server(&self) -> &CertPair {
        &self.misnamed_server
    }

    /// A CA certificate that signed none of the others.
    #[must_use]
    pub fn untrusted_ca(&self) -> &Path {
        &self.untrusted_ca
    }

    /// A client certificate with common name `user` (etcd takes it as the user name),
    /// signed by the CA; a new one on every call.
    pub fn client(&self, user: &str) -> Result<CertPair, TestkitError> {
        issue(
            &self.dir,
            &self.ca,
            user,
            &[],
            Usage::Client(user),
            Validity::Now,
        )
    }

    /// A client TLS configuration: this CA, and a client certificate for `user`.
    pub fn client_tls(&self, user: &str) -> Result<TlsConfig, TestkitError> {
        let pair = self.client(user)?;
        Ok(TlsConfig::new()
            .with_ca_file(&self.ca_cert)
            .with_identity_files(pair.cert, pair.key))
    }

    /// A client TLS configuration that trusts this CA and presents no certificate.
    pub fn ca_only_tls(&self) -> TlsConfig {
        TlsConfig::new().with_ca_file(&self.ca_cert)
    }

    /// The server side: the good server certificate, this CA for clients, and whether
    /// clients must present a certificate.
    #[must_use]
    pub fn server_tls(&self, client_cert_auth: bool) -> ServerTls {
        self.server_tls_with(&self.server, client_cert_auth)
    }

    /// The server side with another certificate (an expired or misnamed one).
    #[must_use]
    pub fn server_tls_with(&self, pair: &CertPair, client_cert_auth: bool) -> ServerTls {
        ServerTls {
            cert: pair.cert.clone(),
            key: pair.key.clone(),
            ca: self.ca_cert.clone(),
            client_cert_auth,
        }
    }

    /// The directory the files are in.
    #[must_use]
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

enum Usage<'a> {
    Server,
    Client(&'a str),
}

enum Validity {
    Now,
    Past,
}

fn new_ca(name: &str) -> Result<(CertificateParams, KeyPair), TestkitError> {
    let key = KeyPair::generate().map_err(|e| pki_error("generating a key", e))?;
    let mut params =
        CertificateParams::new(Vec::<String>::new()).map_err(|e| pki_error("CA params", e))?;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    Ok((params, key))
}

fn issue(
    dir: &TempDir,
    ca: &Issuer<'static, KeyPair>,
    file: &str,
    names: &[String],
    usage: Usage<'_>,
    validity: Validity,
) -> Result<CertPair, TestkitError> {
    let key = KeyPair::generate().map_err(|e| pki_error("generating a key", e))?;
    let mut params =
        CertificateParams::new(names.to_vec()).map_err(|e| pki_error("certificate params", e))?;
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    match usage {
        Usage::Server => {
            params.distinguished_name.push(
                DnType::CommonName,
                names.first().cloned().unwrap_or_default(),
            );
            params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        }
        Usage::Client(user) => {
            params.distinguished_name.push(DnType::CommonName, user);
            params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        }
    }
    if let Validity::Past = validity {
        params.not_before = date_time_ymd(2020, 1, 1);
        params.not_after = date_time_ymd(2021, 1, 1);
    }
    let cert = params
        .signed_by(&key, ca)
        .map_err(|e| pki_error("signing a certificate", e))?;
    let unique = format!("{file}-{}", unique_suffix());
    Ok(CertPair {
        cert: write(dir.path(), &format!("{unique}.pem"), &cert.pem())?,
        key: write(
            dir.path(),
            &format!("{unique}-key.pem"),
            &key.serialize_pem(),
        )?,
    })
}

fn unique_suffix() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// Writes `pem` to `dir/name`, readable by everyone (servers may run as another user;
/// these keys protect nothing).
fn write(dir: &Path, name: &str, pem: &str) -> Result<PathBuf, TestkitError> {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join(name);
    std::fs::write(&path, pem).map_err(|e| TestkitError::io(format!("writing {name}"), e))?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644))
        .map_err(|e| TestkitError::io(format!("chmod {name}"), e))?;
    Ok(path)
}
