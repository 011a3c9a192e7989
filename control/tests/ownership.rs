//! A region's owner taken over by a fabric device, against a real etcd with
//! authentication on: one transaction against the region's version (a
//! stale version loses, nothing written), the deciding copy kept serving
//! and the others syncing, and the liveness record a device looks at
//! before it takes over.

use control::access::PoolCredentials;
use control::ownership::{Takeover, device_registered, take_over_blocking};
use control::{ControlPlane, Credentials, Endpoints, Member, ReplicaState, Role};

mod support;

use support::{config, secured};

fn replicated_topology() -> String {
    config("replicated.toml")
}

fn device(made: &PoolCredentials, name: &str) -> Credentials {
    support::daemon(made, Role::Device, name).clone()
}

/// Runs a blocking control call off the async test's thread.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f).await.expect("blocking call")
}

/// `device` takes `region` over from `version` on, as a fabric device's
/// takeover thread does.
async fn take(
    endpoints: &Endpoints,
    creds: &Credentials,
    device: &'static str,
    region: &'static str,
    version: u64,
) -> Takeover {
    let (e, creds) = (endpoints.clone(), creds.clone());
    blocking(move || {
        take_over_blocking(&e, "test", Some(&creds), device, &[(region, version)], &[])
    })
    .await
    .expect("etcd answers")
    .remove(0)
    .expect("decided")
}

#[tokio::test]
async fn a_device_takes_a_region_over_in_one_transaction_and_a_stale_version_loses() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (_etcd, endpoints, made) = secured(dir.path(), &["A", "B"]).await;
    let mut operator = ControlPlane::connect(&endpoints, "test", Some(&made.operator))
        .await
        .expect("operator connects");
    let first = operator.init(&replicated_topology()).await.expect("init");
    let record = first.map.replica_set("PA.1").expect("PA.1").clone();
    assert_eq!((record.owner.as_str(), record.version), ("A", 1));
    assert_eq!(record.serving(), 2);

    // An operator's mark moves the record first: B decided on version 1
    // and loses, nothing written.
    let read = operator.read_map().await.expect("read");
    let marked =
        control::edit::mark_replica(&read.map, "PA.1", "B", ReplicaState::Syncing).expect("mark");
    operator
        .replace_map(&read, marked.map)
        .await
        .expect("operator marks");
    let b = device(&made, "B");
    let lost = take(&endpoints, &b, "B", "PA.1", 1).await;
    assert_eq!(
        lost,
        Takeover::Lost {
            owner: "A".into(),
            version: 2
        }
    );
    let unchanged = operator.read_map().await.expect("read");
    assert_eq!(unchanged.map.epoch, 2);
    assert_eq!(unchanged.map.replica_set("PA.1").expect("PA.1").owner, "A");

    // On the version it reads now, B takes over: owner, version and epoch
    // in one step; the deciding copy (A's, the first serving) stays
    // serving, B's stays syncing, the other regions are untouched.
    let taken = take(&endpoints, &b, "B", "PA.1", 2).await;
    let Takeover::Taken { epoch, note, .. } = taken else {
        panic!("not taken: {taken:?}");
    };
    assert_eq!(epoch, 3);
    assert!(note.contains("owner A -> B"), "{note}");
    let now = operator.read_map().await.expect("read");
    let pa1 = now.map.replica_set("PA.1").expect("PA.1");
    assert_eq!((pa1.owner.as_str(), pa1.version), ("B", 3));
    assert_eq!(pa1.state_on("A"), Some(ReplicaState::Serving));
    assert_eq!(pa1.state_on("B"), Some(ReplicaState::Syncing));
    for other in ["PA.2", "PB.1", "PB.2"] {
        assert_eq!(now.map.replica_set(other), first.map.replica_set(other));
    }

    // The deposed owner, still on version 2, cannot take it back.
    let stale = take(&endpoints, &device(&made, "A"), "A", "PA.1", 2).await;
    assert_eq!(
        stale,
        Takeover::Lost {
            owner: "B".into(),
            version: 3
        }
    );
    assert_eq!(operator.read_map().await.expect("read").map, now.map);

    // A region whose every serving copy but the deciding one resyncs: the
    // takeover of PB.1 (owner A) by B turns A's serving copy syncing.
    let taken = take(&endpoints, &b, "B", "PB.1", 1).await;
    assert!(
        matches!(taken, Takeover::Taken { epoch: 4, .. }),
        "{taken:?}"
    );
    let pb1 = operator.read_map().await.expect("read");
    let pb1 = pb1.map.replica_set("PB.1").expect("PB.1");
    assert_eq!(pb1.owner, "B");
    assert_eq!(pb1.state_on("B"), Some(ReplicaState::Serving));
    assert_eq!(pb1.state_on("A"), Some(ReplicaState::Syncing));
}

#[tokio::test]
async fn a_device_sees_whether_another_device_holds_its_liveness_lease() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (_etcd, endpoints, made) = secured(dir.path(), &["A", "B"]).await;
    let mut operator = ControlPlane::connect(&endpoints, "test", Some(&made.operator))
        .await
        .expect("operator connects");
    operator.init(&replicated_topology()).await.expect("init");
    let b = device(&made, "B");
    let registered = |who: &'static str| {
        let (e, creds) = (endpoints.clone(), b.clone());
        blocking(move || device_registered(&e, "test", Some(&creds), who))
    };
    assert!(!registered("A").await.expect("B reads the members"));
    let mut a = ControlPlane::connect(&endpoints, "test", Some(&device(&made, "A")))
        .await
        .expect("A connects");
    let member = Member::this_process(Role::Device, "A", "127.0.0.1:9300", 1);
    let lease = a.register(&member, 5).await.expect("A registers");
    assert!(registered("A").await.expect("B reads the members"));
    lease.revoke().await.expect("revoke");
    assert!(!registered("A").await.expect("B reads the members"));
}

/// The race of an owner and its deciding copy's server dying at once: B's
/// takeover still reached server A (its process was being torn down), so
/// A's copy kept deciding and B's went syncing. B, as a device (its own
/// etcd user), then moves the role in a second transaction against the
/// takeover's version: A's copy offline, B's serving. A second attempt,
/// on a record that moved on, writes nothing.
#[tokio::test]
async fn after_a_takeover_kept_a_dead_copy_deciding_the_new_owner_moves_the_role() {
    use control::deciding::{DecidingError, DecidingMove, DecidingOutcome, move_deciding_blocking};
    let dir = tempfile::tempdir().expect("temp dir");
    let (_etcd, endpoints, made) = secured(dir.path(), &["A", "B"]).await;
    let mut operator = ControlPlane::connect(&endpoints, "test", Some(&made.operator))
        .await
        .expect("operator connects");
    operator.init(&replicated_topology()).await.expect("init");
    let b = device(&made, "B");
    let taken = take(&endpoints, &b, "B", "PA.1", 1).await;
    let Takeover::Taken {
        version,
        deciding,
        syncing,
        ..
    } = taken
    else {
        panic!("not taken: {taken:?}");
    };
    assert_eq!(
        (deciding.as_str(), syncing.as_slice()),
        ("A", &["B".to_owned()][..])
    );
    let before = operator.read_map().await.expect("read");

    let moving = |version: u64| {
        let (e, creds) = (endpoints.clone(), b.clone());
        blocking(move || {
            move_deciding_blocking(
                &e,
                "test",
                Some(&creds),
                &DecidingMove {
                    region: "PA.1",
                    takeover_version: version,
                    dead: "A",
                    reachable: &["B"],
                    was_serving: &["B"],
                },
            )
        })
    };
    let moved = moving(version).await.expect("etcd answers");
    let DecidingOutcome::Moved { epoch, note } = moved else {
        panic!("not moved: {moved:?}");
    };
    assert_eq!(epoch, before.map.epoch + 1);
    assert!(note.contains("to B"), "{note}");
    let now = operator.read_map().await.expect("read");
    let pa1 = now.map.replica_set("PA.1").expect("PA.1");
    assert_eq!((pa1.owner.as_str(), pa1.version), ("B", version + 1));
    assert_eq!(pa1.state_on("A"), Some(ReplicaState::Offline));
    assert_eq!(pa1.state_on("B"), Some(ReplicaState::Serving));
    for other in ["PA.2", "PB.1", "PB.2"] {
        assert_eq!(now.map.replica_set(other), before.map.replica_set(other));
    }

    // Again on the takeover's version: the record moved on, nothing written.
    let again = moving(version).await.expect("etcd answers");
    assert!(
        matches!(
            again,
            DecidingOutcome::Refused(DecidingError::Moved { current, .. }) if current == version + 1
        ),
        "{again:?}"
    );
    assert_eq!(operator.read_map().await.expect("read").map, now.map);
}
