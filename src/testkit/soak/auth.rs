//! The soak's etcd runs with auth on: the clients log in as a user whose one role may
//! read and write the namespace, so the nemesis can take the write permission away and
//! give it back (a release refused, a join refused) while everything else goes on. The
//! recorder and the nemesis are root.

use etcd_client::{Client, ConnectOptions, Permission};

use crate::testkit::{EtcdCluster, TestkitError};

/// The clients' role.
pub(crate) const ROLE: &str = "soak-clients";
/// The clients' user and password.
pub(crate) const USER: &str = "soak";
pub(crate) const PASSWORD: &str = "soak-pw";
const ROOT_PASSWORD: &str = "soak-root-pw";

/// Turns auth on: root, and [`USER`] with [`ROLE`] (read and write on `namespace/`).
/// Returns a root client.
pub(crate) async fn enable(cluster: &EtcdCluster, namespace: &str) -> Result<Client, TestkitError> {
    let failed = |what: &str, err: etcd_client::Error| {
        TestkitError::Cluster(format!("soak auth: {what}: {err}"))
    };
    let mut admin = cluster.client().await?;
    admin
        .user_add("root", ROOT_PASSWORD, None)
        .await
        .map_err(|e| failed("root user", e))?;
    admin
        .user_grant_role("root", "root")
        .await
        .map_err(|e| failed("root role", e))?;
    admin
        .role_add(ROLE)
        .await
        .map_err(|e| failed("clients' role", e))?;
    restore_write(&mut admin, namespace)
        .await
        .map_err(|e| failed("clients' permission", e))?;
    admin
        .user_add(USER, PASSWORD, None)
        .await
        .map_err(|e| failed("clients' user", e))?;
    admin
        .user_grant_role(USER, ROLE)
        .await
        .map_err(|e| failed("clients' user's role", e))?;
    admin
        .auth_enable()
        .await
        .map_err(|e| failed("auth enable", e))?;
    // Refreshing its token: a member the nemesis restarted forgets the simple tokens it
    // issued, and the recorder and the nemesis must go on through it.
    let options = ConnectOptions::new()
        .with_user("root", ROOT_PASSWORD)
        .with_auto_token_refresh(true);
    Ok(Client::connect(cluster.endpoints(), Some(options)).await?)
}

/// [`ROLE`] may read and write `namespace/` (again).
pub(crate) async fn restore_write(
    admin: &mut Client,
    namespace: &str,
) -> Result<(), etcd_client::Error> {
    admin
        .role_grant_permission(
            ROLE,
            Permission::read_write(format!("{namespace}/")).with_prefix(),
        )
        .await
        .map(drop)
}
