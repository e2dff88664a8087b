//! TLS material and credentials on the command line: etcdctl's flags for `run`, and one
//! set per backend for `bench` and `chaos`. Every flag can also come from an environment
//! variable; a password is best given that way or in a file, since a command line is
//! visible to every user of the machine.

use std::path::PathBuf;

use clap::Args;
use fencelock::TlsConfig;
use fencelock::etcd::EtcdConfig;

/// etcd TLS and authentication, with etcdctl's names and meanings.
#[derive(Clone, Debug, Default, Args)]
pub struct EtcdSecurity {
    /// Verify the etcd servers' certificates with this CA bundle (PEM); default: the
    /// system's trust store, for https:// endpoints.
    #[arg(long, env = "FENCELOCK_ETCD_CACERT")]
    pub cacert: Option<PathBuf>,
    /// Identify with this client certificate (PEM), for etcd's --client-cert-auth.
    #[arg(long, env = "FENCELOCK_ETCD_CERT", requires = "key")]
    pub cert: Option<PathBuf>,
    /// The client certificate's private key (PEM).
    #[arg(long, env = "FENCELOCK_ETCD_KEY", requires = "cert")]
    pub key: Option<PathBuf>,
    /// The name the servers' certificates must carry, when it is not the endpoints' host.
    #[arg(long, env = "FENCELOCK_ETCD_SERVER_NAME")]
    pub server_name: Option<String>,
    /// etcd user, as `name` or `name:password` (prefer the password in
    /// FENCELOCK_ETCD_PASSWORD or --password-file).
    #[arg(long, env = "FENCELOCK_ETCD_USER")]
    pub user: Option<String>,
    /// The user's password (visible to every user of the machine on a command line: use
    /// FENCELOCK_ETCD_PASSWORD or --password-file instead).
    #[arg(long, env = "FENCELOCK_ETCD_PASSWORD", hide_env_values = true)]
    pub password: Option<String>,
    /// A file holding the user's password (its first line).
    #[arg(long, env = "FENCELOCK_ETCD_PASSWORD_FILE")]
    pub password_file: Option<PathBuf>,
}

impl EtcdSecurity {
    /// `config` with this TLS material and these credentials.
    pub fn apply(&self, mut config: EtcdConfig) -> Result<EtcdConfig, String> {
        if let Some(tls) = tls(&self.cacert, &self.cert, &self.key, &self.server_name) {
            config = config.with_tls(tls);
        }
        if let Some((user, password)) = self.credentials()? {
            config = config.with_credentials(user, password);
        }
        Ok(config)
    }

    fn credentials(&self) -> Result<Option<(String, String)>, String> {
        let Some(user) = &self.user else {
            if self.password.is_some() || self.password_file.is_some() {
                return Err("a password was given without --user".into());
            }
            return Ok(None);
        };
        let (name, inline) = match user.split_once(':') {
            Some((name, password)) => (name.to_owned(), Some(password.to_owned())),
            None => (user.clone(), None),
        };
        let from_file = match &self.password_file {
            Some(path) => Some(
                std::fs::read_to_string(path)
                    .map_err(|err| {
                        format!("cannot read the password file {}: {err}", path.display())
                    })?
                    .lines()
                    .next()
                    .unwrap_or_default()
                    .to_owned(),
            ),
            None => None,
        };
        let password = inline
            .or_else(|| self.password.clone())
            .or(from_file)
            .ok_or_else(|| {
                format!(
                    "no password for etcd user {name:?}: give it in FENCELOCK_ETCD_PASSWORD, \
                     --password-file, --password or as --user name:password"
                )
            })?;
        Ok(Some((name, password)))
    }
}

/// The environment variables [`BackendTls`] reads.
pub const ENV_VARIABLES: [&str; 10] = [
    "FENCELOCK_ETCD_CACERT",
    "FENCELOCK_ETCD_CERT",
    "FENCELOCK_ETCD_KEY",
    "FENCELOCK_ETCD_USER",
    "FENCELOCK_REDIS_CACERT",
    "FENCELOCK_REDIS_CERT",
    "FENCELOCK_REDIS_KEY",
    "FENCELOCK_POSTGRES_CACERT",
    "FENCELOCK_POSTGRES_CERT",
    "FENCELOCK_POSTGRES_KEY",
];

/// TLS for Redis servers (`rediss://` URLs; a user and password go in the URL), for
/// `run` and, flattened, for `bench` and `chaos`.
#[derive(Clone, Debug, Default, Args)]
pub struct RedisSecurity {
    /// CA bundle (PEM) for the Redis servers (rediss:// URLs; a user and password go in
    /// the URL).
    #[arg(long, env = "FENCELOCK_REDIS_CACERT")]
    pub redis_cacert: Option<PathBuf>,
    /// Client certificate (PEM) for Redis.
    #[arg(long, env = "FENCELOCK_REDIS_CERT", requires = "redis_key")]
    pub redis_cert: Option<PathBuf>,
    /// Its private key (PEM).
    #[arg(long, env = "FENCELOCK_REDIS_KEY", requires = "redis_cert")]
    pub redis_key: Option<PathBuf>,
}

impl RedisSecurity {
    /// The Redis TLS configuration, if any was given.
    pub fn tls(&self) -> Option<TlsConfig> {
        tls(&self.redis_cacert, &self.redis_cert, &self.redis_key, &None)
    }
}

/// TLS for each backend of `bench` and `chaos`, applied to the endpoints given there.
#[derive(Clone, Debug, Default, Args)]
pub struct BackendTls {
    /// CA bundle (PEM) that signs the etcd servers' certificates.
    #[arg(long, env = "FENCELOCK_ETCD_CACERT")]
    pub etcd_cacert: Option<PathBuf>,
    /// Client certificate (PEM) for etcd.
    #[arg(long, env = "FENCELOCK_ETCD_CERT", requires = "etcd_key")]
    pub etcd_cert: Option<PathBuf>,
    /// Its private key (PEM).
    #[arg(long, env = "FENCELOCK_ETCD_KEY", requires = "etcd_cert")]
    pub etcd_key: Option<PathBuf>,
    /// etcd user `name:password` (prefer FENCELOCK_ETCD_USER in the environment).
    #[arg(long, env = "FENCELOCK_ETCD_USER", hide_env_values = true)]
    pub etcd_user: Option<String>,
    #[command(flatten)]
    pub redis: RedisSecurity,
    /// CA bundle (PEM) for PostgreSQL: the connection is then TLS, verified (verify-full).
    #[arg(long, env = "FENCELOCK_POSTGRES_CACERT")]
    pub postgres_cacert: Option<PathBuf>,
    /// Client certificate (PEM) for PostgreSQL.
    #[arg(long, env = "FENCELOCK_POSTGRES_CERT", requires = "postgres_key")]
    pub postgres_cert: Option<PathBuf>,
    /// Its private key (PEM).
    #[arg(long, env = "FENCELOCK_POSTGRES_KEY", requires = "postgres_cert")]
    pub postgres_key: Option<PathBuf>,
}

impl BackendTls {
    /// `config` with the etcd TLS material and credentials.
    pub fn etcd(&self, config: EtcdConfig) -> Result<EtcdConfig, String> {
        EtcdSecurity {
            cacert: self.etcd_cacert.clone(),
            cert: self.etcd_cert.clone(),
            key: self.etcd_key.clone(),
            user: self.etcd_user.clone(),
            ..EtcdSecurity::default()
        }
        .apply(config)
    }

    /// The PostgreSQL TLS configuration, if any was given.
    pub fn postgres(&self) -> Option<TlsConfig> {
        tls(
            &self.postgres_cacert,
            &self.postgres_cert,
            &self.postgres_key,
            &None,
        )
    }

    /// The flags again, for a worker process (`chaos` passes them on).
    pub fn to_args(&self) -> Vec<String> {
        let mut args = Vec::new();
        let mut push = |flag: &str, value: &Option<PathBuf>| {
            if let Some(value) = value {
                args.push(format!("--{flag}={}", value.display()));
            }
        };
        push("etcd-cacert", &self.etcd_cacert);
        push("etcd-cert", &self.etcd_cert);
        push("etcd-key", &self.etcd_key);
        push("redis-cacert", &self.redis.redis_cacert);
        push("redis-cert", &self.redis.redis_cert);
        push("redis-key", &self.redis.redis_key);
        push("postgres-cacert", &self.postgres_cacert);
        push("postgres-cert", &self.postgres_cert);
        push("postgres-key", &self.postgres_key);
        args
    }
}

fn tls(
    cacert: &Option<PathBuf>,
    cert: &Option<PathBuf>,
    key: &Option<PathBuf>,
    server_name: &Option<String>,
) -> Option<TlsConfig> {
    if cacert.is_none() && cert.is_none() && server_name.is_none() {
        return None;
    }
    let mut tls = TlsConfig::new();
    if let Some(ca) = cacert {
        tls = tls.with_ca_file(ca);
    }
    if let (Some(cert), Some(key)) = (cert, key) {
        tls = tls.with_identity_files(cert, key);
    }
    if let Some(name) = server_name {
        tls = tls.with_server_name(name);
    }
    Some(tls)
}
