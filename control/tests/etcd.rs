//! The control plane against a real etcd process: the map's epochs and
//! conflicts, liveness leases, bad input and an unreachable etcd.

use std::time::{Duration, Instant};

use control::{ControlError, ControlPlane, Endpoints, Intent, Member, Role};
use testkit::Etcd;

fn default_topology() -> String {
    std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../configs/default.toml"
    ))
    .expect("configs/default.toml")
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

#[tokio::test]
async fn two_operators_changing_the_map_at_once_one_wins_the_other_is_told() {
    let dir = tempfile::tempdir().expect("temp dir");
    let etcd = start_etcd(dir.path());
    let mut alice = plane(&etcd).await;
    let mut bob = plane(&etcd).await;
    let text = default_topology();
    assert!(matches!(
        alice.read_map().await,
        Err(ControlError::NoMap { .. })
    ));
    let first = alice.init(&text).await.expect("init");
    assert_eq!(first.map.epoch, 1);
    let again = bob.init(&text).await.expect_err("one map per pool");
    assert!(again.to_string().contains("epoch 1"), "{again}");

    // Both read epoch 1 and change it.
    let read_by_alice = alice.read_map().await.expect("read");
    let read_by_bob = bob.read_map().await.expect("read");
    assert_eq!(read_by_alice, read_by_bob);
    let alices = text.replace("name = \"default\"", "name = \"alices\"");
    let bobs = text.replace("name = \"default\"", "name = \"bobs\"");
    assert_ne!(alices, text, "the edit changes the map");
    let won = alice
        .change_map(&read_by_alice, &alices)
        .await
        .expect("alice");
    assert_eq!(won.map.epoch, 2);
    let lost = bob.change_map(&read_by_bob, &bobs).await.expect_err("bob");
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
    assert!(lost.to_string().contains("now at epoch 2"), "{lost}");
    // Nothing of Bob's change landed.
    let now = bob.read_map().await.expect("read");
    assert_eq!(now.map.topology, alices);
    assert_eq!(now.map.epoch, 2);
    // Bob reads again and retries: epoch 3.
    let retried = bob.change_map(&now, &bobs).await.expect("retry");
    assert_eq!(retried.map.epoch, 3);
}

#[tokio::test]
async fn an_invalid_map_is_refused_on_the_way_in_and_on_the_way_out() {
    let dir = tempfile::tempdir().expect("temp dir");
    let etcd = start_etcd(dir.path());
    let mut operator = plane(&etcd).await;
    let current = operator.init(&default_topology()).await.expect("init");
    // An invalid topology is never written.
    let broken = default_topology().replace("[[servers]]", "[[server]]");
    let err = operator
        .change_map(&current, &broken)
        .await
        .expect_err("refused");
    assert!(matches!(err, ControlError::InvalidMap { .. }), "{err}");
    assert_eq!(operator.read_map().await.expect("read").map.epoch, 1);
    // One put into etcd by hand: readers refuse it, naming the key.
    let key = operator.keys().map();
    etcd.ctl(&[
        "put",
        &key,
        "{\"epoch\": 9, \"topology\": \"[pool]\\nname = 7\"}",
    ])
    .expect("etcdctl put");
    let err = operator.read_map().await.expect_err("refused");
    let text = err.to_string();
    assert!(text.contains(&key) && text.contains("epoch 9"), "{text}");
    etcd.ctl(&["put", &key, "not json"]).expect("etcdctl put");
    let err = operator.read_map().await.expect_err("refused");
    assert!(matches!(err, ControlError::BadDocument { .. }), "{err}");
}

#[tokio::test]
async fn a_members_key_lives_as_long_as_its_lease() {
    let dir = tempfile::tempdir().expect("temp dir");
    let etcd = start_etcd(dir.path());
    let mut plane = plane(&etcd).await;
    let server = Member::this_process(Role::Server, "A", "127.0.0.1:9100", 1);
    let device = Member::this_process(Role::Device, "F1", "127.0.0.1:9200", 1);
    let kept = plane.register(&server, 2).await.expect("register A");
    let dropped = plane.register(&device, 1).await.expect("register F1");
    // A record that does not parse is skipped, not fatal.
    let junk = format!("{}router/x", plane.keys().members());
    etcd.ctl(&["put", &junk, "{}"]).expect("etcdctl put");
    assert_eq!(
        plane.members().await.expect("members"),
        [server.clone(), device]
    );

    // F1's process dies: its lease is no longer kept and its key expires;
    // A's is kept alive past its TTL.
    drop(dropped);
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut members = plane.members().await.expect("members");
    while members.len() > 1 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
        members = plane.members().await.expect("members");
    }
    assert_eq!(members, std::slice::from_ref(&server));
    assert!(kept.is_alive());

    // A restarted server under the same name is a new incarnation.
    kept.revoke().await.expect("revoke");
    assert!(plane.members().await.expect("members").is_empty());
    let restarted = Member::this_process(Role::Server, "A", "127.0.0.1:9100", 1);
    let _again = plane.register(&restarted, 2).await.expect("register");
    let members = plane.members().await.expect("members");
    assert_ne!(members[0].incarnation, server.incarnation);

    // The operator's intent.
    plane
        .set_intent(Role::Server, "A", Intent::Draining)
        .await
        .expect("intent");
    assert_eq!(
        plane.intents().await.expect("intents"),
        [(Role::Server, "A".to_owned(), Intent::Draining)]
    );
}

#[tokio::test]
async fn an_unreachable_etcd_is_named() {
    let port = testkit::free_loopback_port();
    let endpoints = Endpoints::parse(&format!("http://127.0.0.1:{port}")).expect("endpoint");
    let err = ControlPlane::connect(&endpoints, "test", None)
        .await
        .expect_err("nothing listens there");
    assert!(matches!(err, ControlError::Unreachable { .. }), "{err}");
    assert!(err.to_string().contains(&port.to_string()), "{err}");
}

#[test]
fn a_daemons_registration_outlives_an_etcd_restart_and_goes_with_the_daemon() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut etcd = start_etcd(dir.path());
    let endpoints = Endpoints::parse(&etcd.endpoint()).expect("endpoint");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let members = || {
        runtime.block_on(async {
            let mut plane = ControlPlane::connect(&endpoints, "test", None).await?;
            plane.members().await
        })
    };
    let member = Member::this_process(Role::Device, "F1", "127.0.0.1:9300", 4);
    let registration =
        control::Registration::start(endpoints.clone(), "test".to_owned(), None, member.clone())
            .expect("register");
    assert_eq!(members().expect("members"), std::slice::from_ref(&member));

    // etcd dies and comes back: past two lease TTLs later the record is
    // still there, kept by a new lease.
    etcd.kill();
    etcd.restart().unwrap_or_else(|e| panic!("etcd again: {e}"));
    std::thread::sleep(Duration::from_secs(
        2 * control::registration::LEASE_TTL_SECS as u64 + 1,
    ));
    assert_eq!(members().expect("members"), std::slice::from_ref(&member));

    // The daemon stops: its record goes at once.
    drop(registration);
    assert!(members().expect("members").is_empty());
}

#[test]
fn a_daemon_that_cannot_reach_etcd_fails_at_start_naming_it() {
    let port = testkit::free_loopback_port();
    let endpoints = Endpoints::parse(&format!("http://127.0.0.1:{port}")).expect("endpoint");
    let member = Member::this_process(Role::Server, "A", "127.0.0.1:1", 0);
    let err = control::Registration::start(endpoints.clone(), "test".to_owned(), None, member)
        .expect_err("nothing listens");
    assert!(err.to_string().contains(&endpoints.to_string()), "{err}");
    let err = control::load_map(&endpoints, "test", None).expect_err("nothing listens");
    assert!(matches!(err, ControlError::Unreachable { .. }), "{err}");
}
