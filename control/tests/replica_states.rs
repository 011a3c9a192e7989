//! Replica states in the map, against a real etcd process: recorded at
//! init, changed one transaction at a time against the map's revision,
//! carried over by map changes, and refused when they do not match.

use control::edit::mark_replica;
use control::{ClusterMap, ControlError, ControlPlane, Endpoints, ReplicaState};
use testkit::Etcd;

fn default_topology() -> String {
    std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../configs/default.toml"
    ))
    .expect("configs/default.toml")
}

/// The default topology with two copies of every region.
fn replicated() -> String {
    default_topology().replace("name = \"default\"", "name = \"default\"\nreplicas = 2")
}

async fn plane(etcd: &Etcd) -> ControlPlane {
    let endpoints = Endpoints::parse(&etcd.endpoint()).expect("endpoint");
    ControlPlane::connect(&endpoints, "test", None)
        .await
        .expect("connect")
}

fn start_etcd(dir: &std::path::Path) -> Etcd {
    Etcd::start(dir).unwrap_or_else(|e| panic!("etcd: {e}"))
}

fn state(map: &ClusterMap, region: &str, server: &str) -> ReplicaState {
    map.replica_set(region)
        .and_then(|r| r.state_on(server))
        .unwrap_or_else(|| panic!("no copy of {region} on {server}: {map:?}"))
}

#[tokio::test]
async fn two_operators_marking_replicas_at_once_one_wins_the_other_is_told() {
    let dir = tempfile::tempdir().expect("temp dir");
    let etcd = start_etcd(dir.path());
    let mut alice = plane(&etcd).await;
    let mut bob = plane(&etcd).await;
    let first = alice.init(&replicated()).await.expect("init");
    assert_eq!(first.map.replica_sets.len(), 4);
    let read = alice.read_map().await.expect("read");
    assert_eq!(state(&read.map, "PA.1", "B"), ReplicaState::Serving);
    assert_eq!(read.map.replica_set("PA.1").expect("PA.1").version, 1);

    // Both read epoch 1; each marks another copy.
    let by_alice = alice.read_map().await.expect("read");
    let by_bob = bob.read_map().await.expect("read");
    let offline = mark_replica(&by_alice.map, "PA.1", "B", ReplicaState::Offline).expect("mark");
    let won = alice
        .replace_map(&by_alice, offline.map)
        .await
        .expect("alice");
    assert_eq!(won.map.epoch, 2);
    let syncing = mark_replica(&by_bob.map, "PB.1", "A", ReplicaState::Syncing).expect("mark");
    let lost = bob
        .replace_map(&by_bob, syncing.map)
        .await
        .expect_err("bob");
    assert!(
        matches!(
            lost,
            ControlError::Conflict {
                expected: 1,
                current: 2
            }
        ),
        "{lost}"
    );
    assert!(lost.to_string().contains("nothing was written"), "{lost}");

    // Etcd holds Alice's change and nothing of Bob's.
    let now = bob.read_map().await.expect("read");
    assert_eq!(state(&now.map, "PA.1", "B"), ReplicaState::Offline);
    assert_eq!(state(&now.map, "PB.1", "A"), ReplicaState::Serving);
    assert_eq!(now.map.replica_set("PA.1").expect("PA.1").version, 2);
    assert_eq!(now.map.replica_set("PB.1").expect("PB.1").version, 1);

    // Bob reads again and retries: epoch 3, both changes there.
    let again = mark_replica(&now.map, "PB.1", "A", ReplicaState::Syncing).expect("mark");
    let retried = bob.replace_map(&now, again.map).await.expect("retry");
    assert_eq!(retried.map.epoch, 3);
    let last = alice.read_map().await.expect("read");
    assert_eq!(state(&last.map, "PA.1", "B"), ReplicaState::Offline);
    assert_eq!(state(&last.map, "PB.1", "A"), ReplicaState::Syncing);
    assert_eq!(last.map.replica_set("PB.1").expect("PB.1").version, 2);

    // A map whose epoch skips is refused before anything is written.
    let mut skipping = mark_replica(&last.map, "PB.1", "A", ReplicaState::Serving)
        .expect("mark")
        .map;
    skipping.epoch += 1;
    let err = alice
        .replace_map(&last, skipping)
        .await
        .expect_err("skipped epoch");
    assert!(matches!(err, ControlError::EpochNotNext { .. }), "{err}");
    assert_eq!(alice.read_map().await.expect("read").map.epoch, 3);
}

#[tokio::test]
async fn map_changes_keep_the_copies_states_and_new_copies_start_syncing() {
    let dir = tempfile::tempdir().expect("temp dir");
    let etcd = start_etcd(dir.path());
    let mut operator = plane(&etcd).await;
    let single = operator.init(&default_topology()).await.expect("init");
    assert!(single.map.replica_sets.is_empty());

    // Replicating existing regions: their new copies lack the data.
    let read = operator.read_map().await.expect("read");
    let two = operator
        .change_map(&read, &replicated())
        .await
        .expect("replicate");
    assert_eq!(two.map.epoch, 2);
    for (region, primary, backup) in [("PA.1", "A", "B"), ("PB.2", "B", "A")] {
        assert_eq!(state(&two.map, region, primary), ReplicaState::Serving);
        assert_eq!(state(&two.map, region, backup), ReplicaState::Syncing);
    }

    // The resync's end, then an unrelated change: the states stay.
    let read = operator.read_map().await.expect("read");
    let served = mark_replica(&read.map, "PA.1", "B", ReplicaState::Serving).expect("mark");
    operator
        .replace_map(&read, served.map)
        .await
        .expect("serving");
    let read = operator.read_map().await.expect("read");
    let renamed = replicated().replace("id = \"c2\"", "id = \"c3\"");
    let changed = operator.change_map(&read, &renamed).await.expect("change");
    assert_eq!(changed.map.epoch, 4);
    assert_eq!(state(&changed.map, "PA.1", "B"), ReplicaState::Serving);
    assert_eq!(state(&changed.map, "PA.2", "B"), ReplicaState::Syncing);
    assert_eq!(changed.map.replica_set("PA.1").expect("PA.1").version, 2);
    let stored = operator.read_map().await.expect("read");
    assert_eq!(stored.map, changed.map);
}

#[tokio::test]
async fn a_replicated_map_without_states_put_by_hand_is_refused() {
    let dir = tempfile::tempdir().expect("temp dir");
    let etcd = start_etcd(dir.path());
    let mut operator = plane(&etcd).await;
    let key = operator.keys().map();
    let bare = ClusterMap {
        epoch: 1,
        topology: replicated(),
        replica_sets: Vec::new(),
    };
    etcd.put(&key, &bare.to_json()).expect("etcdctl put");
    let err = operator.read_map().await.expect_err("no states");
    let text = err.to_string();
    assert!(text.contains(&format!("etcd {key} (epoch 1)")), "{text}");
    assert!(
        text.contains("region PA.1 has 2 copies but replica_sets has no record of their states"),
        "{text}"
    );
}

/// A daemon without an async loop marks a copy offline, then syncing when
/// its server is back, then serving once it is up to date; an offline copy
/// is never marked serving without the sync.
#[test]
fn a_copy_goes_offline_syncing_and_serving_through_the_blocking_marks() {
    use control::copy_marks::{MarkCopyError, StateMarked, mark_copy_state, read_copy_states};

    let dir = tempfile::tempdir().expect("temp dir");
    let etcd = start_etcd(dir.path());
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async { plane(&etcd).await.init(&replicated()).await.expect("init") });
    let endpoints = Endpoints::parse(&etcd.endpoint()).expect("endpoint");
    let mark = |state| mark_copy_state(&endpoints, "test", None, "PA.1", "B", state);
    let copy_state = || {
        let (sets, epoch) = read_copy_states(&endpoints, "test", None).expect("read");
        let set = sets.iter().find(|s| s.region == "PA.1").expect("PA.1");
        (set.state_on("B").expect("a copy on B"), set.version, epoch)
    };

    assert_eq!(
        mark(ReplicaState::Offline).expect("offline"),
        StateMarked::Written { epoch: 2 }
    );
    let refused = mark(ReplicaState::Serving).expect_err("offline to serving");
    assert!(matches!(refused, MarkCopyError::Edit { .. }), "{refused}");
    assert!(
        refused.to_string().contains("PA.1 on server B serving"),
        "{refused}"
    );
    assert_eq!(
        copy_state(),
        (ReplicaState::Offline, 2, 2),
        "nothing written"
    );

    assert_eq!(
        mark(ReplicaState::Syncing).expect("syncing"),
        StateMarked::Written { epoch: 3 }
    );
    assert_eq!(
        mark(ReplicaState::Syncing).expect("again"),
        StateMarked::Already
    );
    assert_eq!(
        mark(ReplicaState::Serving).expect("serving"),
        StateMarked::Written { epoch: 4 }
    );
    assert_eq!(copy_state(), (ReplicaState::Serving, 4, 4));
}
