//! Existing servers to use instead of the local ones a command starts itself.

use clap::Args;

/// `--etcd`, `--redis`, `--redlock`, `--zookeeper`, `--postgres`: shared by `bench` and `chaos`.
#[derive(Clone, Debug, Default, Args)]
pub struct Endpoints {
    /// Existing etcd endpoints instead of a local etcd (comma-separated).
    #[arg(long, value_delimiter = ',')]
    pub etcd: Option<Vec<String>>,
    /// An existing Redis instead of a local one (redis://host:port/).
    #[arg(long)]
    pub redis: Option<String>,
    /// Existing Redis masters for Redlock instead of 3 local ones (comma-separated).
    #[arg(long, value_delimiter = ',')]
    pub redlock: Option<Vec<String>>,
    /// An existing ZooKeeper ensemble instead of the local ones (connect string,
    /// host:port[,host:port...]).
    #[arg(long)]
    pub zookeeper: Option<String>,
    /// An existing PostgreSQL instead of a local one (libpq connection string).
    #[arg(long)]
    pub postgres: Option<String>,
    /// TLS and credentials for the endpoints given.
    #[command(flatten)]
    pub tls: crate::security::BackendTls,
}
