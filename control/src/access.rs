//! Who may do what under a pool's prefix, with etcd's own users and roles:
//!
//! - `root`, which etcd requires before it turns authentication on, may do
//!   everything (it sets the others up);
//! - the pool's **operator** (`pmem-fabric.<pool>.operator`) may read and
//!   write everything under the pool's prefix: the map and the intents;
//! - each **daemon** (`pmem-fabric.<pool>.<role>.<name>`) may read the map
//!   and the intents, and write its own liveness key
//!   `members/<role>/<name>`; a **fabric device** may also write the map
//!   key (and nothing else of the operator's), which its code uses only to
//!   mark copies of replicated regions
//!   ([`crate::ControlPlane::mark_copy`]) and take over the regions of
//!   a dead owner ([`crate::ownership`]), and read the liveness records;
//!   etcd cannot limit a write to a
//!   part of a document, so this is trust in the device, said in
//!   `docs/security.md`;
//! - anyone else, nothing (etcd refuses requests without a user once
//!   authentication is on).
//!
//! [`secure`] makes these users and roles with fresh random passwords and
//! turns authentication on; [`PoolCredentials::write_to`] writes one
//! credentials file per user for the operator to hand out.

use std::path::{Path, PathBuf};

use etcd_client::{Client, ConnectOptions, Permission};

use crate::credentials::Credentials;
use crate::endpoints::Endpoints;
use crate::error::ControlError;
use crate::keys::Keys;
use crate::member::Role;

/// etcd's superuser, which must exist before authentication is turned on.
pub const ROOT_USER: &str = "root";

/// The etcd user (and role) of the pool's operator.
pub fn operator_user(pool: &str) -> String {
    format!("pmem-fabric.{pool}.operator")
}

/// The etcd user (and role) of daemon `name` in `role`.
pub fn daemon_user(pool: &str, role: Role, name: &str) -> String {
    format!("pmem-fabric.{pool}.{role}.{name}")
}

/// The credentials file of the operator in a folder [`PoolCredentials`]
/// wrote.
pub fn operator_file(dir: &Path) -> PathBuf {
    dir.join("operator.etcd")
}

/// The credentials file of daemon `name` in `role` in such a folder.
pub fn daemon_file(dir: &Path, role: Role, name: &str) -> PathBuf {
    dir.join(format!("{role}.{name}.etcd"))
}

/// The etcd user (and role) of client `name`: it may read the map only.
pub fn client_user(pool: &str, name: &str) -> String {
    format!("pmem-fabric.{pool}.client.{name}")
}

/// The credentials file of client `name` in such a folder.
pub fn client_file(dir: &Path, name: &str) -> PathBuf {
    dir.join(format!("client.{name}.etcd"))
}

/// The root's credentials file in such a folder.
pub fn root_file(dir: &Path) -> PathBuf {
    dir.join("root.etcd")
}

/// Every user [`secure`] made for a pool, with its password.
#[derive(Debug, Clone)]
pub struct PoolCredentials {
    /// etcd's root; `None` when it existed already (its credentials were
    /// given).
    pub root: Option<Credentials>,
    /// The pool's operator.
    pub operator: Credentials,
    /// Each daemon's user.
    pub daemons: Vec<(Role, String, Credentials)>,
}

impl PoolCredentials {
    /// Writes one owner-only file per user into `dir` (`root.etcd`,
    /// `operator.etcd`, `<role>.<name>.etcd`); returns the files.
    pub fn write_to(&self, dir: &Path) -> Result<Vec<PathBuf>, ControlError> {
        let mut files = Vec::new();
        let mut write = |path: PathBuf, creds: &Credentials| {
            creds.write(&path)?;
            files.push(path);
            Ok::<(), ControlError>(())
        };
        if let Some(root) = &self.root {
            write(root_file(dir), root)?;
        }
        write(operator_file(dir), &self.operator)?;
        for (role, name, creds) in &self.daemons {
            write(daemon_file(dir, *role, name), creds)?;
        }
        Ok(files)
    }
}

/// A fresh random password: 32 hexadecimal digits.
fn fresh_password() -> Result<String, ControlError> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).map_err(|e| ControlError::Runtime {
        source: std::io::Error::other(format!("no random numbers for a password: {e}")),
    })?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// Whether etcd refused because the user or role exists already.
fn already_exists(err: &etcd_client::Error) -> bool {
    err.to_string().contains("already exists")
}

/// What a daemon's role may touch: read the map and the intents, write its
/// own liveness key; a fabric device may also write the map, to mark the
/// copies of the regions it orders ([`crate::ControlPlane::mark_copy`])
/// and to take over a dead owner's regions ([`crate::ownership`]), and
/// read the liveness records (whether that owner's lease is gone).
fn daemon_permissions(keys: &Keys, role: Role, name: &str) -> Vec<Permission> {
    let map = match role {
        Role::Device => Permission::read_write(keys.map()),
        Role::Server => Permission::read(keys.map()),
    };
    let mut permissions = vec![
        map,
        Permission::read(keys.intents()).with_prefix(),
        Permission::read_write(keys.member(role, name)),
    ];
    if role == Role::Device {
        // Whether a region's owner still holds its lease, before taking
        // the region over (`crate::ownership`).
        permissions.push(Permission::read(keys.members()).with_prefix());
    }
    permissions
}

/// Makes (or refreshes) the users and roles of pool `pool` for its
/// `daemons`, each with a fresh password, and turns etcd's authentication
/// on. Without `root`, etcd must not have authentication on yet: a root
/// user is made with a fresh password. With `root`, its credentials are
/// used (another pool's set-up turned authentication on already).
pub async fn secure(
    endpoints: &Endpoints,
    pool: &str,
    daemons: &[(Role, String)],
    root: Option<&Credentials>,
) -> Result<PoolCredentials, ControlError> {
    let keys = Keys::of(pool);
    let mut options = ConnectOptions::new();
    if let Some(root) = root {
        options = options.with_user(root.user(), root.password());
    }
    let mut client = Client::connect(endpoints.urls(), Some(options))
        .await
        .map_err(|source| ControlError::Unreachable {
            endpoints: endpoints.clone(),
            source,
        })?;
    let step = |what: &'static str| move |source| ControlError::Etcd { what, source };
    let new_root = match root {
        Some(_) => None,
        None => {
            let creds = Credentials::new(ROOT_USER, fresh_password()?);
            client
                .user_add(creds.user(), creds.password(), None)
                .await
                .map_err(|source| {
                    // With authentication on, an anonymous request is
                    // refused before etcd even looks for the user.
                    let text = source.to_string();
                    if already_exists(&source) || text.contains("user name is empty") {
                        ControlError::AlreadySecured {
                            endpoints: endpoints.clone(),
                        }
                    } else {
                        step("root user set-up")(source)
                    }
                })?;
            client
                .user_grant_role(ROOT_USER, ROOT_USER)
                .await
                .map_err(step("root role grant"))?;
            Some(creds)
        }
    };
    let operator = Credentials::new(operator_user(pool), fresh_password()?);
    add_user(
        &mut client,
        &operator,
        &[Permission::read_write(keys.prefix()).with_prefix()],
    )
    .await?;
    let mut users = Vec::new();
    for (role, name) in daemons {
        let creds = Credentials::new(daemon_user(pool, *role, name), fresh_password()?);
        add_user(&mut client, &creds, &daemon_permissions(&keys, *role, name)).await?;
        users.push((*role, name.clone(), creds));
    }
    client
        .auth_enable()
        .await
        .map_err(step("enabling authentication"))?;
    Ok(PoolCredentials {
        root: new_root,
        operator,
        daemons: users,
    })
}

/// [`secure`], for callers without async code of their own.
pub fn secure_blocking(
    endpoints: &Endpoints,
    pool: &str,
    daemons: &[(Role, String)],
    root: Option<&Credentials>,
) -> Result<PoolCredentials, ControlError> {
    crate::blocking::runtime()?.block_on(secure(endpoints, pool, daemons, root))
}

/// Makes (or refreshes) a user for each of pool `pool`'s `clients`, each
/// with a fresh password, as `root` (authentication is on already): a
/// client may read the map, to open the pool and follow it, and nothing
/// else. Returns each client's name and credentials.
pub async fn secure_clients(
    endpoints: &Endpoints,
    pool: &str,
    clients: &[String],
    root: &Credentials,
) -> Result<Vec<(String, Credentials)>, ControlError> {
    let keys = Keys::of(pool);
    let options = ConnectOptions::new().with_user(root.user(), root.password());
    let mut client = Client::connect(endpoints.urls(), Some(options))
        .await
        .map_err(|source| ControlError::Unreachable {
            endpoints: endpoints.clone(),
            source,
        })?;
    let mut users = Vec::new();
    for name in clients {
        let creds = Credentials::new(client_user(pool, name), fresh_password()?);
        add_user(&mut client, &creds, &[Permission::read(keys.map())]).await?;
        users.push((name.clone(), creds));
    }
    Ok(users)
}

/// Makes `creds`'s user with a role of the same name holding `grants`;
/// a user or role that exists already keeps its name and gets the new
/// password and grants.
async fn add_user(
    client: &mut Client,
    creds: &Credentials,
    grants: &[Permission],
) -> Result<(), ControlError> {
    let failed = |what: &'static str| {
        let user = creds.user().to_owned();
        move |source| ControlError::UserSetup { user, what, source }
    };
    match client.user_add(creds.user(), creds.password(), None).await {
        Ok(_) => {}
        Err(e) if already_exists(&e) => {
            client
                .user_change_password(creds.user(), creds.password())
                .await
                .map_err(failed("password change"))?;
        }
        Err(e) => return Err(failed("creation")(e)),
    }
    match client.role_add(creds.user()).await {
        Ok(_) => {}
        Err(e) if already_exists(&e) => {}
        Err(e) => return Err(failed("role creation")(e)),
    }
    for grant in grants {
        client
            .role_grant_permission(creds.user(), grant.clone())
            .await
            .map_err(failed("permission grant"))?;
    }
    client
        .user_grant_role(creds.user(), creds.user())
        .await
        .map_err(failed("role grant"))?;
    Ok(())
}
