//! TLS settings shared by every backend: which CA to trust, which identity to present,
//! which name to expect; read from PEM files or given as PEM bytes.
//!
//! Files are read and checked when a client connects, so that an unreadable or malformed
//! file is reported with its path, as [`LockError::InvalidConfig`], before anything is
//! sent. What goes wrong during the handshake itself (an unknown CA, an expired or
//! misnamed certificate, a client certificate the server requires and did not get, a
//! plaintext server) is [`LockError::Tls`]. Private keys never appear in `Debug` output,
//! error messages or tracing fields.

use std::fmt;
use std::path::PathBuf;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use crate::{Backend, LockError};

/// PEM material: a file read when connecting, or bytes given directly.
#[derive(Clone)]
pub enum Pem {
    /// A file, read (and checked) when connecting; its path appears in errors.
    File(PathBuf),
    /// PEM bytes given directly.
    Bytes(Vec<u8>),
}

impl fmt::Debug for Pem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::File(path) => f.debug_tuple("File").field(path).finish(),
            // Key material stays out of logs; the length says whether something is there.
            Self::Bytes(bytes) => write!(f, "Bytes(<{} bytes>)", bytes.len()),
        }
    }
}

impl Pem {
    fn describe(&self) -> String {
        match self {
            Self::File(path) => path.display().to_string(),
            Self::Bytes(_) => "the PEM bytes given".into(),
        }
    }

    fn read(&self, what: &str, backend: Backend) -> Result<Vec<u8>, LockError> {
        match self {
            Self::File(path) => std::fs::read(path).map_err(|err| LockError::InvalidConfig {
                backend,
                reason: format!("cannot read the {what} file {}: {err}", path.display()),
            }),
            Self::Bytes(bytes) => Ok(bytes.clone()),
        }
    }
}

/// How to secure a connection; see the module documentation.
///
/// ```
/// use fencelock::TlsConfig;
///
/// let tls = TlsConfig::new()
///     .with_ca_file("/etc/etcd/ca.pem")
///     .with_identity_files("/etc/etcd/client.pem", "/etc/etcd/client-key.pem")
///     .with_server_name("etcd.internal");
/// // The key's path may show in logs; key bytes never do.
/// let from_bytes = TlsConfig::new().with_identity_pem(b"-----BEGIN CERTIFICATE-----".to_vec(), b"secret".to_vec());
/// assert!(!format!("{from_bytes:?}").contains("secret"));
/// ```
#[derive(Clone, Debug, Default)]
#[must_use]
pub struct TlsConfig {
    ca: Option<Pem>,
    identity: Option<(Pem, Pem)>,
    server_name: Option<String>,
}

impl TlsConfig {
    /// No CA (the system's trust store is used), no client identity.
    pub fn new() -> Self {
        Self::default()
    }

    /// Trusts the CA certificates in this PEM file (instead of the system's trust store).
    pub fn with_ca_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.ca = Some(Pem::File(path.into()));
        self
    }

    /// Trusts the CA certificates in these PEM bytes.
    pub fn with_ca_pem(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.ca = Some(Pem::Bytes(pem.into()));
        self
    }

    /// Presents this client certificate and private key (mutual TLS), from PEM files.
    pub fn with_identity_files(
        mut self,
        certificate: impl Into<PathBuf>,
        key: impl Into<PathBuf>,
    ) -> Self {
        self.identity = Some((Pem::File(certificate.into()), Pem::File(key.into())));
        self
    }

    /// Presents this client certificate and private key, as PEM bytes.
    pub fn with_identity_pem(
        mut self,
        certificate: impl Into<Vec<u8>>,
        key: impl Into<Vec<u8>>,
    ) -> Self {
        self.identity = Some((Pem::Bytes(certificate.into()), Pem::Bytes(key.into())));
        self
    }

    /// Expects the server's certificate to be valid for `name`, when it differs from the
    /// host in the endpoint (an IP address, a load balancer's name).
    pub fn with_server_name(mut self, name: impl Into<String>) -> Self {
        self.server_name = Some(name.into());
        self
    }

    /// The name the server's certificate must be valid for, if set.
    #[must_use]
    pub fn server_name(&self) -> Option<&str> {
        self.server_name.as_deref()
    }

    /// Reads and checks every file: each must hold what it should, in PEM.
    pub(crate) fn load(&self, backend: Backend) -> Result<LoadedTls, LockError> {
        let ca = match &self.ca {
            Some(pem) => {
                let bytes = pem.read("CA certificate", backend)?;
                check_certificates(&bytes, pem, "CA certificate", backend)?;
                Some(bytes)
            }
            None => None,
        };
        let identity = match &self.identity {
            Some((certificate, key)) => {
                let cert_bytes = certificate.read("client certificate", backend)?;
                check_certificates(&cert_bytes, certificate, "client certificate", backend)?;
                let key_bytes = key.read("client key", backend)?;
                if PrivateKeyDer::from_pem_slice(&key_bytes).is_err() {
                    return Err(LockError::InvalidConfig {
                        backend,
                        reason: format!(
                            "no private key in PEM format in {} (the client key)",
                            key.describe()
                        ),
                    });
                }
                Some((cert_bytes, key_bytes))
            }
            None => None,
        };
        Ok(LoadedTls {
            ca,
            identity,
            server_name: self.server_name.clone(),
        })
    }
}

fn check_certificates(
    bytes: &[u8],
    pem: &Pem,
    what: &str,
    backend: Backend,
) -> Result<(), LockError> {
    let parsed: Result<Vec<CertificateDer<'_>>, _> =
        CertificateDer::pem_slice_iter(bytes).collect();
    match parsed {
        Ok(certificates) if !certificates.is_empty() => Ok(()),
        Ok(_) => Err(LockError::InvalidConfig {
            backend,
            reason: format!(
                "no certificate in PEM format in {} (the {what})",
                pem.describe()
            ),
        }),
        Err(err) => Err(LockError::InvalidConfig {
            backend,
            reason: format!("malformed PEM in {} (the {what}): {err}", pem.describe()),
        }),
    }
}

/// TLS material read and checked, ready for a client library.
#[derive(Clone)]
pub(crate) struct LoadedTls {
    pub(crate) ca: Option<Vec<u8>>,
    pub(crate) identity: Option<(Vec<u8>, Vec<u8>)>,
    pub(crate) server_name: Option<String>,
}

/// A handshake failure, from anywhere in an error's source chain, as a message a person
/// can act on; `None` if the error is not about TLS.
pub(crate) fn describe_tls_failure(err: &(dyn std::error::Error + 'static)) -> Option<String> {
    let mut current: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(error) = current {
        if let Some(rustls) = error.downcast_ref::<rustls::Error>() {
            return Some(describe_rustls(rustls));
        }
        // Some libraries (redis-rs) hand out their cause behind an `Arc`, whose `source()`
        // skips it: look inside.
        let shared = error
            .downcast_ref::<std::sync::Arc<dyn std::error::Error + Send + Sync>>()
            .map(|arc| &**arc as &(dyn std::error::Error + 'static));
        for candidate in [Some(error), shared].into_iter().flatten() {
            if let Some(rustls) = candidate.downcast_ref::<rustls::Error>() {
                return Some(describe_rustls(rustls));
            }
            // `io::Error::source()` skips a custom error too: take it out.
            if let Some(io) = candidate.downcast_ref::<std::io::Error>() {
                if let Some(rustls) = io.get_ref().and_then(|e| e.downcast_ref::<rustls::Error>()) {
                    return Some(describe_rustls(rustls));
                }
            }
        }
        current = error.source();
    }
    None
}

/// A server name as a person writes it.
fn name_of(name: &rustls::pki_types::ServerName<'_>) -> String {
    use rustls::pki_types::ServerName;
    match name {
        ServerName::DnsName(dns) => dns.as_ref().to_owned(),
        ServerName::IpAddress(ip) => std::net::IpAddr::from(*ip).to_string(),
        other => format!("{other:?}"),
    }
}

fn describe_rustls(err: &rustls::Error) -> String {
    use rustls::{AlertDescription, CertificateError, Error};
    match err {
        Error::InvalidCertificate(cert) => {
            let why = match cert {
                CertificateError::UnknownIssuer => "unknown CA: the server's certificate is not \
                     signed by a trusted CA (configure the CA certificate: --cacert)"
                    .to_owned(),
                CertificateError::Expired | CertificateError::ExpiredContext { .. } => {
                    "the server's certificate has expired".to_owned()
                }
                CertificateError::NotValidYet | CertificateError::NotValidYetContext { .. } => {
                    "the server's certificate is not valid yet".to_owned()
                }
                CertificateError::NotValidForNameContext {
                    expected,
                    presented,
                } => format!(
                    "the server's certificate is not valid for {} (it names {}); set the \
                     expected server name if it differs from the endpoint's host",
                    name_of(expected),
                    presented.join(", ")
                ),
                CertificateError::NotValidForName => "the server's certificate is not valid \
                     for the endpoint's host; set the expected server name"
                    .to_owned(),
                other => format!("{other:?}"),
            };
            format!("certificate verify failed: {why}")
        }
        Error::AlertReceived(
            alert @ (AlertDescription::CertificateRequired
            | AlertDescription::HandshakeFailure
            | AlertDescription::BadCertificate
            | AlertDescription::UnknownCA
            | AlertDescription::CertificateUnknown),
        ) => format!(
            "the server refused the handshake ({alert:?}): it requires a client certificate \
             it trusts (--cert and --key)"
        ),
        Error::AlertReceived(AlertDescription::CertificateExpired) => {
            "the server refused the handshake: the client certificate has expired".to_owned()
        }
        Error::InvalidMessage(_) | Error::InappropriateMessage { .. } => "the server does not \
             speak TLS (a plaintext endpoint? use a plaintext URL, or turn TLS on at the \
             server)"
            .to_owned(),
        other => format!("TLS handshake failed: {other}"),
    }
}

impl LoadedTls {
    /// A rustls client configuration from this material (PostgreSQL's connector).
    pub(crate) fn rustls_config(
        &self,
        backend: Backend,
    ) -> Result<rustls::ClientConfig, LockError> {
        let invalid = |reason: String| LockError::InvalidConfig { backend, reason };
        let mut roots = rustls::RootCertStore::empty();
        match &self.ca {
            Some(ca) => {
                for certificate in CertificateDer::pem_slice_iter(ca) {
                    let certificate =
                        certificate.map_err(|err| invalid(format!("malformed CA PEM: {err}")))?;
                    roots
                        .add(certificate)
                        .map_err(|err| invalid(format!("unusable CA certificate: {err}")))?;
                }
            }
            None => {
                let native = rustls_native_certs::load_native_certs();
                for certificate in native.certs {
                    let _ = roots.add(certificate);
                }
            }
        }
        let builder = rustls::ClientConfig::builder().with_root_certificates(roots);
        match &self.identity {
            Some((certificate, key)) => {
                let chain: Vec<CertificateDer<'static>> =
                    CertificateDer::pem_slice_iter(certificate)
                        .collect::<Result<_, _>>()
                        .map_err(|err| {
                            invalid(format!("malformed client certificate PEM: {err}"))
                        })?;
                let key = PrivateKeyDer::from_pem_slice(key)
                    .map_err(|_| invalid("malformed client key PEM".into()))?;
                builder
                    .with_client_auth_cert(chain, key)
                    .map_err(|err| invalid(format!("unusable client certificate or key: {err}")))
            }
            None => Ok(builder.with_no_client_auth()),
        }
    }
}

/// Performs a TLS handshake with `address` (`host:port`) as the client library would (ALPN
/// `alpn`), then waits briefly for the server's first word: a server that rejects the
/// client after the handshake (TLS 1.3 sends "certificate required" only then) says so
/// there. Returns what went wrong, in words, or `None` if the handshake and the first read
/// raised nothing about TLS. Used to explain a connection that failed without a TLS error
/// (the client library saw only a broken pipe or a closed connection).
#[cfg(any(feature = "etcd", feature = "redis"))]
pub(crate) async fn diagnose(
    address: &str,
    tls: &LoadedTls,
    alpn: &[u8],
    backend: Backend,
    limit: std::time::Duration,
) -> Option<String> {
    use tokio::io::AsyncReadExt;
    let mut config = tls.rustls_config(backend).ok()?;
    if !alpn.is_empty() {
        config.alpn_protocols = vec![alpn.to_vec()];
    }
    let host = tls.server_name.clone().or_else(|| {
        address
            .rsplit_once(':')
            .map(|(host, _)| host.trim_matches(['[', ']']).to_owned())
    })?;
    let name = rustls::pki_types::ServerName::try_from(host).ok()?;
    let attempt = async {
        let stream = tokio::net::TcpStream::connect(address).await.ok()?;
        let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config));
        let handshake = tokio::time::timeout(limit / 2, connector.connect(name, stream)).await;
        let mut stream = match handshake {
            Ok(Ok(stream)) => stream,
            Ok(Err(err)) => {
                return describe_tls_failure(&err).or_else(|| {
                    // Closed on our client hello: a plaintext server that could not read it.
                    matches!(
                        err.kind(),
                        std::io::ErrorKind::UnexpectedEof | std::io::ErrorKind::ConnectionReset
                    )
                    .then(|| {
                        format!(
                            "{address} closed the connection during the TLS handshake: a \
                             plaintext endpoint? (use a plaintext URL, or turn TLS on at the \
                             server)"
                        )
                    })
                });
            }
            // Connected, but no answer to the client hello: a plaintext server waits for
            // a request it can read.
            Err(_) => {
                return Some(format!(
                    "{address} did not answer the TLS handshake within {:?}: a plaintext \
                     endpoint? (use a plaintext URL, or turn TLS on at the server)",
                    limit / 2
                ));
            }
        };
        let mut byte = [0u8; 1];
        match tokio::time::timeout(limit / 4, stream.read(&mut byte)).await {
            Ok(Err(err)) => describe_tls_failure(&err),
            _ => None,
        }
    };
    tokio::time::timeout(limit, attempt).await.ok().flatten()
}

/// Whether the server at `address` (`host:port`) answers a TLS handshake: used to tell a
/// plaintext client that its endpoint wants TLS. Any certificate will do here.
#[cfg(any(feature = "etcd", feature = "redis"))]
pub(crate) async fn speaks_tls(address: &str, limit: std::time::Duration) -> bool {
    let Some((host, _)) = address.rsplit_once(':') else {
        return false;
    };
    let Ok(name) =
        rustls::pki_types::ServerName::try_from(host.trim_matches(['[', ']']).to_owned())
    else {
        return false;
    };
    // No trusted roots: a TLS server's certificate is then "unknown", which is all we ask.
    let config = rustls::ClientConfig::builder()
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth();
    let attempt = async {
        let stream = tokio::net::TcpStream::connect(address).await.ok()?;
        let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config));
        Some(match connector.connect(name, stream).await {
            Ok(_) => true,
            Err(err) => {
                let inner = err
                    .get_ref()
                    .and_then(|e| e.downcast_ref::<rustls::Error>());
                matches!(inner, Some(rustls::Error::InvalidCertificate(_)))
            }
        })
    };
    tokio::time::timeout(limit, attempt)
        .await
        .ok()
        .flatten()
        .unwrap_or(false)
}

/// One server as a client configuration names it, for [`explain`].
#[cfg(any(feature = "etcd", feature = "redis"))]
pub(crate) struct Endpoint {
    /// `host:port`.
    pub(crate) address: String,
    /// Whether the client means to speak TLS to it.
    pub(crate) tls: bool,
    /// What to call it in a message (its URL without credentials).
    pub(crate) shown: String,
}

/// Why first contact with these endpoints failed, when TLS is the reason: a TLS client
/// the server rejects (or that reaches a plaintext server), or a plaintext client talking
/// to a TLS server. Looks at each endpoint in turn, within `limit` in all.
#[cfg(any(feature = "etcd", feature = "redis"))]
pub(crate) async fn explain(
    endpoints: &[Endpoint],
    tls: Option<&LoadedTls>,
    alpn: &[u8],
    backend: Backend,
    limit: std::time::Duration,
) -> Option<String> {
    let per_endpoint = limit / u32::try_from(endpoints.len().max(1)).unwrap_or(1);
    for endpoint in endpoints {
        match (endpoint.tls, tls) {
            (true, Some(tls)) => {
                let diagnosis = diagnose(&endpoint.address, tls, alpn, backend, per_endpoint).await;
                if diagnosis.is_some() {
                    return diagnosis;
                }
            }
            (true, None) => {}
            (false, _) => {
                if speaks_tls(&endpoint.address, per_endpoint).await {
                    return Some(format!(
                        "{} expects TLS: use a TLS URL (https://, rediss://) and the server's \
                         CA (--cacert)",
                        endpoint.shown
                    ));
                }
            }
        }
    }
    None
}

/// Runs `attempt`, a client's first contact with a server. If it fails with an error that
/// does not say why (unavailable, timed out, or another backend error), or has not
/// finished by half of `timeout`, `explain` (a TLS handshake of our own) may tell what the
/// server objects to: that is then the error, as [`LockError::Tls`]. Client libraries
/// often see only a closed connection, or nothing at all, when TLS is what is wrong.
#[cfg(any(feature = "etcd", feature = "redis"))]
pub(crate) async fn first_contact<T, E>(
    backend: Backend,
    timeout: std::time::Duration,
    attempt: impl std::future::Future<Output = Result<T, LockError>>,
    explain: impl Fn(std::time::Duration) -> E,
) -> Result<T, LockError>
where
    E: std::future::Future<Output = Option<String>>,
{
    let started = tokio::time::Instant::now();
    let failure = |reason| LockError::Tls {
        backend,
        operation: "connect",
        reason,
    };
    // Boxed: these futures are large, and a caller's stack need not carry them.
    let mut attempt = Box::pin(attempt);
    let mut late = Box::pin(async {
        tokio::time::sleep(timeout / 2).await;
        explain(timeout / 2).await
    });
    let outcome = tokio::select! {
        outcome = &mut attempt => outcome,
        Some(reason) = &mut late => return Err(failure(reason)),
    };
    match outcome {
        Err(err) if err.is_unavailable() || matches!(err, LockError::Backend { .. }) => {
            let left = timeout.saturating_sub(started.elapsed());
            match Box::pin(explain(left)).await {
                Some(reason) => Err(failure(reason)),
                None => Err(err),
            }
        }
        outcome => outcome,
    }
}
