//! Who may change the map, against a real etcd with authentication on:
//! the pool's operator may, a daemon may read the map and write its own
//! liveness key, a fabric device may also mark copies of replicated
//! regions, a client may only read, and a connection without credentials
//! is told which to pass.

use control::access::{self, PoolCredentials};
use control::{
    ControlError, ControlPlane, Credentials, Endpoints, Intent, Member, ReplicaState, Role,
};
use testkit::Etcd;

mod support;

use support::{config, daemon};

fn default_topology() -> String {
    config("default.toml")
}

/// An etcd with pool `test` set up for servers A, B and device F1, and
/// authentication on.
async fn secured(dir: &std::path::Path) -> (Etcd, Endpoints, PoolCredentials) {
    support::secured(dir, &["F1"]).await
}

#[tokio::test]
async fn only_the_operator_changes_the_map_and_a_daemon_writes_only_its_own_liveness_key() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (etcd, endpoints, made) = secured(dir.path()).await;

    // The operator loads and changes the map and records intents.
    let mut operator = ControlPlane::connect(&endpoints, "test", Some(&made.operator))
        .await
        .expect("operator connects");
    let first = operator.init(&default_topology()).await.expect("init");
    operator
        .set_intent(Role::Server, "B", Intent::Draining)
        .await
        .expect("operator records an intent");

    // Server A reads the map and the intents and registers itself.
    let a = daemon(&made, Role::Server, "A");
    let mut server_a = ControlPlane::connect(&endpoints, "test", Some(a))
        .await
        .expect("server A connects");
    assert_eq!(server_a.user(), Some(a.user()));
    let read = server_a.read_map().await.expect("A reads the map");
    assert_eq!(read, first);
    assert_eq!(
        server_a.intents().await.expect("A reads the intents"),
        [(Role::Server, "B".to_owned(), Intent::Draining)]
    );
    let me = Member::this_process(Role::Server, "A", "127.0.0.1:9100", 1);
    let liveness = server_a.register(&me, 5).await.expect("A registers itself");

    // It may not change the map, nor an intent, nor another daemon's
    // liveness key: each refusal names the user and what it tried.
    let err = server_a
        .change_map(&read, &default_topology())
        .await
        .expect_err("a daemon changes no map");
    let text = err.to_string();
    assert!(
        matches!(err, ControlError::PermissionDenied { .. }),
        "{text}"
    );
    assert!(
        text.contains(a.user()) && text.contains("change of the map") && text.contains("/map"),
        "{text}"
    );
    let err = server_a
        .set_intent(Role::Server, "A", Intent::Active)
        .await
        .expect_err("a daemon records no intent");
    assert!(
        matches!(err, ControlError::PermissionDenied { .. }),
        "{err}"
    );
    for (role, name) in [(Role::Server, "B"), (Role::Device, "F1")] {
        let other = Member::this_process(role, name, "127.0.0.1:9200", 1);
        let err = server_a
            .register(&other, 5)
            .await
            .expect_err("another daemon's key");
        let text = err.to_string();
        assert!(
            matches!(err, ControlError::PermissionDenied { .. }),
            "{text}"
        );
        assert!(text.contains(&format!("/members/{role}/{name}")), "{text}");
    }
    // Nothing of those landed: the map is at epoch 1, one member, A.
    assert_eq!(operator.read_map().await.expect("read").map.epoch, 1);
    assert_eq!(operator.members().await.expect("members"), [me]);
    let records = etcd
        .get_prefix(&control::Keys::of("test").members())
        .expect("etcdctl as root");
    assert_eq!(records.len(), 1, "{records:?}");
    liveness.revoke().await.expect("A revokes its own lease");

    // The operator's change lands.
    let changed = operator
        .change_map(&first, &default_topology())
        .await
        .expect("operator changes the map");
    assert_eq!(changed.map.epoch, 2);
}

#[tokio::test]
async fn a_client_reads_the_map_and_changes_nothing() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (_etcd, endpoints, made) = secured(dir.path()).await;
    let mut operator = ControlPlane::connect(&endpoints, "test", Some(&made.operator))
        .await
        .expect("operator connects");
    let first = operator.init(&default_topology()).await.expect("init");
    let root = made.root.as_ref().expect("root");
    let clients = access::secure_clients(&endpoints, "test", &["c1".to_owned()], root)
        .await
        .expect("client users");
    assert_eq!(clients.len(), 1);
    let (name, c1) = &clients[0];
    assert_eq!(name, "c1");
    assert_eq!(c1.user(), access::client_user("test", "c1"));

    let mut client = ControlPlane::connect(&endpoints, "test", Some(c1))
        .await
        .expect("the client connects");
    assert_eq!(client.read_map().await.expect("it reads the map"), first);
    let err = client
        .change_map(&first, &default_topology())
        .await
        .expect_err("a client changes no map");
    assert!(
        matches!(err, ControlError::PermissionDenied { .. }),
        "{err}"
    );
    let err = client.intents().await.expect_err("nor reads intents");
    assert!(
        matches!(err, ControlError::PermissionDenied { .. }),
        "{err}"
    );
    let me = Member::this_process(Role::Server, "A", "127.0.0.1:9100", 1);
    let err = client.register(&me, 5).await.expect_err("nor is a member");
    assert!(
        matches!(err, ControlError::PermissionDenied { .. }),
        "{err}"
    );
}

fn replicated_topology() -> String {
    config("replicated.toml")
}

#[tokio::test]
async fn a_device_marks_a_copy_offline_and_a_client_or_server_cannot() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (_etcd, endpoints, made) = secured(dir.path()).await;
    let mut operator = ControlPlane::connect(&endpoints, "test", Some(&made.operator))
        .await
        .expect("operator connects");
    let first = operator.init(&replicated_topology()).await.expect("init");
    let version = |map: &control::ClusterMap, region: &str| {
        map.replica_set(region)
            .expect("a replicated region")
            .version
    };
    assert_eq!(version(&first.map, "PA.1"), 1);
    let root = made.root.as_ref().expect("root");
    let clients = access::secure_clients(&endpoints, "test", &["c1".to_owned()], root)
        .await
        .expect("client users");

    // A client and a server may not mark a copy: nothing is written.
    let mut client = ControlPlane::connect(&endpoints, "test", Some(&clients[0].1))
        .await
        .expect("the client connects");
    let mut server =
        ControlPlane::connect(&endpoints, "test", Some(daemon(&made, Role::Server, "A")))
            .await
            .expect("server A connects");
    for plane in [&mut client, &mut server] {
        let err = plane
            .mark_copy("PA.1", "B", ReplicaState::Offline, 1)
            .await
            .expect_err("only a device marks copies");
        let text = err.to_string();
        assert!(
            matches!(err, ControlError::PermissionDenied { .. }),
            "{text}"
        );
        assert!(text.contains("change of the map"), "{text}");
    }
    assert_eq!(operator.read_map().await.expect("read").map, first.map);

    // Device F1 marks B's copy of PA.1 offline: one step of the epoch and
    // of the set's version, the other sets untouched.
    let mut device =
        ControlPlane::connect(&endpoints, "test", Some(daemon(&made, Role::Device, "F1")))
            .await
            .expect("device F1 connects");
    let epoch = device
        .mark_copy("PA.1", "B", ReplicaState::Offline, 1)
        .await
        .expect("a device marks a copy offline");
    assert_eq!(epoch, 2);
    let now = operator.read_map().await.expect("read");
    assert_eq!(now.map.epoch, 2);
    let record = now.map.replica_set("PA.1").expect("PA.1");
    assert_eq!(record.state_on("B"), Some(ReplicaState::Offline));
    assert_eq!(record.version, 2);
    assert_eq!(version(&now.map, "PB.1"), 1);
    assert_eq!(now.map.topology, first.map.topology);

    // Decided on a version that is gone: refused, nothing written.
    let err = device
        .mark_copy("PA.1", "A", ReplicaState::Offline, 1)
        .await
        .expect_err("a stale version");
    assert!(
        matches!(
            err,
            ControlError::ReplicaSetMoved {
                expected: 1,
                current: 2,
                ..
            }
        ),
        "{err}"
    );
    // The last serving copy stays: the edit's refusal, named.
    let err = device
        .mark_copy("PA.1", "A", ReplicaState::Offline, 2)
        .await
        .expect_err("the last serving copy");
    let text = format!(
        "{err}: {}",
        std::error::Error::source(&err)
            .map(ToString::to_string)
            .unwrap_or_default()
    );
    assert!(
        text.contains("region PA.1 on server A cannot be marked offline"),
        "{text}"
    );
    // Another set, changed meanwhile by the operator, does not stand in
    // the device's way.
    let read = operator.read_map().await.expect("read");
    let synced =
        control::edit::mark_replica(&read.map, "PB.2", "A", ReplicaState::Offline).expect("mark");
    operator
        .replace_map(&read, synced.map)
        .await
        .expect("operator");
    let epoch = device
        .mark_copy("PA.1", "B", ReplicaState::Syncing, 2)
        .await
        .expect("the device marks again");
    assert_eq!(epoch, 4);
    assert_eq!(operator.read_map().await.expect("read").map.epoch, 4);
}

#[tokio::test]
async fn without_or_with_wrong_credentials_etcd_says_which_to_pass() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (_etcd, endpoints, made) = secured(dir.path()).await;

    let err = ControlPlane::connect(&endpoints, "test", None)
        .await
        .expect_err("no credentials");
    let text = err.to_string();
    assert!(
        matches!(err, ControlError::NeedsCredentials { .. }),
        "{text}"
    );
    for needed in [
        "--etcd-credentials",
        control::CREDENTIALS_ENV,
        "operator.etcd",
        &endpoints.to_string(),
    ] {
        assert!(text.contains(needed), "{needed:?} in {text}");
    }

    let wrong = Credentials::new(made.operator.user(), "not-the-password");
    let err = ControlPlane::connect(&endpoints, "test", Some(&wrong))
        .await
        .expect_err("wrong password");
    assert!(matches!(err, ControlError::AuthFailed { .. }), "{err}");
    assert!(err.to_string().contains(made.operator.user()), "{err}");

    // A second set-up without root's credentials is refused; with them it
    // adds another pool's users.
    let err = access::secure(&endpoints, "other", &[], None)
        .await
        .expect_err("root exists");
    assert!(matches!(err, ControlError::AlreadySecured { .. }), "{err}");
    let other = access::secure(&endpoints, "other", &[], made.root.as_ref())
        .await
        .expect("root adds a pool");
    let mut theirs = ControlPlane::connect(&endpoints, "other", Some(&other.operator))
        .await
        .expect("the other pool's operator");
    theirs.init(&default_topology()).await.expect("init other");
    // Pools do not reach into each other: reading the other pool's map is
    // refused at connect.
    let err = ControlPlane::connect(&endpoints, "other", Some(&made.operator))
        .await
        .expect_err("another pool's map");
    assert!(
        matches!(err, ControlError::PermissionDenied { .. }),
        "{err}"
    );
}

#[test]
fn a_daemons_registration_with_credentials_outlives_an_etcd_restart() {
    let dir = tempfile::tempdir().expect("temp dir");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let (mut etcd, endpoints, made) = runtime.block_on(secured(dir.path()));
    let f1 = daemon(&made, Role::Device, "F1").clone();
    let member = Member::this_process(Role::Device, "F1", "127.0.0.1:9300", 1);
    let registration = control::Registration::start(
        endpoints.clone(),
        "test".to_owned(),
        Some(f1),
        member.clone(),
    )
    .expect("register");
    let members = || {
        runtime.block_on(async {
            let mut plane = ControlPlane::connect(&endpoints, "test", Some(&made.operator)).await?;
            plane.members().await
        })
    };
    assert_eq!(members().expect("members"), std::slice::from_ref(&member));

    // etcd loses every token when it restarts: the registration signs in
    // again and its record comes back under a new lease.
    etcd.restart().unwrap_or_else(|e| panic!("etcd again: {e}"));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let now = members().expect("members");
        if now == std::slice::from_ref(&member) {
            // Still there past a lease's life: kept by a live lease.
            std::thread::sleep(std::time::Duration::from_secs(
                control::registration::LEASE_TTL_SECS as u64 + 1,
            ));
            if members().expect("members") == std::slice::from_ref(&member) {
                break;
            }
        }
        assert!(
            std::time::Instant::now() < deadline,
            "F1 never registered again: {now:?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    drop(registration);
    assert!(members().expect("members").is_empty());
}
