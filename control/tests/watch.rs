//! Following the map against a real etcd process: changes arrive, invalid
//! maps are refused, a watch behind a compaction and a watch across an
//! etcd restart recover.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use control::{ControlPlane, Endpoints, MapUpdate, MapVersion, MapWatch, WatchObserver};
use testkit::Etcd;

/// How long a test waits for something the watcher should do soon (a bound
/// on a wait, not a measurement).
const PATIENCE: Duration = Duration::from_secs(60);

fn default_topology() -> String {
    std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../configs/default.toml"
    ))
    .expect("configs/default.toml")
}

/// A copy of the default map with the pool's extent size changed, so each
/// epoch's text differs and can be told apart.
fn variant(n: u32) -> String {
    default_topology().replace("[pool]\n", &format!("[pool]\n# variant {n}\n"))
}

#[derive(Default)]
struct Counting {
    ready: AtomicU64,
    restarts: AtomicU64,
    errors: AtomicU64,
}

impl WatchObserver for Counting {
    fn update_ready(&self) {
        self.ready.fetch_add(1, Ordering::Relaxed);
    }
    fn watch_restarted(&self) {
        self.restarts.fetch_add(1, Ordering::Relaxed);
    }
    fn etcd_error(&self) {
        self.errors.fetch_add(1, Ordering::Relaxed);
    }
}

struct Fixture {
    _dir: tempfile::TempDir,
    etcd: Etcd,
    endpoints: Endpoints,
    runtime: tokio::runtime::Runtime,
}

impl Fixture {
    fn new() -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let etcd = Etcd::start(dir.path()).unwrap_or_else(|e| panic!("etcd: {e}"));
        let endpoints = Endpoints::parse(&etcd.endpoint()).expect("endpoint");
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        Self {
            _dir: dir,
            etcd,
            endpoints,
            runtime,
        }
    }

    fn plane(&self) -> ControlPlane {
        self.runtime
            .block_on(ControlPlane::connect(&self.endpoints, "test", None))
            .expect("connect")
    }

    /// Loads the first map; its version.
    fn init(&self) -> MapVersion {
        let map = self
            .runtime
            .block_on(self.plane().init(&default_topology()))
            .expect("init");
        MapVersion {
            epoch: map.map.epoch,
            revision: map.revision,
        }
    }

    /// One operator change to `text`; the new epoch.
    fn change(&self, text: &str) -> u64 {
        self.runtime
            .block_on(async {
                let mut plane = ControlPlane::connect(&self.endpoints, "test", None).await?;
                let current = plane.read_map().await?;
                plane.change_map(&current, text).await.map(|m| m.map.epoch)
            })
            .expect("change")
    }

    fn watch(&self, from: MapVersion, observer: Arc<Counting>) -> MapWatch {
        MapWatch::start(
            self.endpoints.clone(),
            "test",
            None,
            from,
            control::REREAD_PERIOD,
            observer,
        )
        .expect("watch")
    }
}

/// Waits for the watcher to hand over epoch `epoch`; every map handed
/// over on the way must be older.
fn wait_for_epoch(watch: &MapWatch, epoch: u64) -> MapUpdate {
    let deadline = Instant::now() + PATIENCE;
    while Instant::now() < deadline {
        if let Some(update) = watch.wait(Duration::from_millis(200)) {
            assert!(update.version.epoch <= epoch, "{:?}", update.version);
            if update.version.epoch == epoch {
                return update;
            }
        }
    }
    panic!("the watcher never handed over epoch {epoch}");
}

#[test]
fn every_change_reaches_the_watcher_and_invalid_maps_are_refused() {
    let fixture = Fixture::new();
    let first = fixture.init();
    let observer = Arc::new(Counting::default());
    let watch = fixture.watch(first, Arc::clone(&observer));
    assert_eq!(fixture.change(&variant(2)), 2);
    let update = wait_for_epoch(&watch, 2);
    assert_eq!(update.topology.servers.len(), 2);
    assert!(update.version.revision > first.revision);
    // The daemon's loop is woken for it (just after it was handed over).
    let deadline = Instant::now() + PATIENCE;
    while observer.ready.load(Ordering::Relaxed) == 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(observer.ready.load(Ordering::Relaxed) >= 1);

    // By hand: a document that is no map, then a map whose topology is
    // invalid, then one whose epoch goes back. None is handed over.
    let key = fixture.plane().keys().map();
    fixture.etcd.put(&key, "not json").expect("put");
    let broken = control::ClusterMap::new(3, variant(3).replace("extent_size", "extent_sizes"));
    fixture.etcd.put(&key, &broken.to_json()).expect("put");
    let backwards = control::ClusterMap::new(1, variant(4));
    fixture.etcd.put(&key, &backwards.to_json()).expect("put");
    // A valid epoch 3 after them is what arrives next: the refused ones
    // never did.
    let good = control::ClusterMap::new(3, variant(5));
    fixture.etcd.put(&key, &good.to_json()).expect("put");
    let update = wait_for_epoch(&watch, 3);
    assert!(update.topology.source.contains("epoch 3"));
    assert!(watch.latest().is_none(), "nothing after epoch 3");
    assert_eq!(observer.errors.load(Ordering::Relaxed), 0);
}

#[test]
fn a_watcher_behind_a_compaction_recovers_by_reading_the_map_again() {
    let fixture = Fixture::new();
    let first = fixture.init();
    // The watcher is stopped while the map changes twice and etcd compacts
    // its history past what the watcher knows.
    assert_eq!(fixture.change(&variant(2)), 2);
    assert_eq!(fixture.change(&variant(3)), 3);
    let status = fixture.etcd.ctl(&["get", "/", "--prefix", "-w", "json"]);
    let revision = status
        .as_deref()
        .ok()
        .and_then(|text| {
            let at = text.find("\"revision\":")? + "\"revision\":".len();
            text[at..]
                .split(|c: char| !c.is_ascii_digit())
                .next()?
                .parse::<i64>()
                .ok()
        })
        .expect("the store's revision");
    fixture
        .etcd
        .ctl(&["compact", &revision.to_string()])
        .expect("compact");
    // It resumes from where it was: etcd no longer has that history.
    let observer = Arc::new(Counting::default());
    let watch = fixture.watch(first, Arc::clone(&observer));
    let update = wait_for_epoch(&watch, 3);
    assert!(update.version.revision > first.revision);
    assert!(observer.restarts.load(Ordering::Relaxed) >= 1);
    // And it follows on from there.
    assert_eq!(fixture.change(&variant(4)), 4);
    wait_for_epoch(&watch, 4);
}

#[test]
fn a_watcher_outlives_an_etcd_restart_and_sees_the_changes_after_it() {
    let mut fixture = Fixture::new();
    let first = fixture.init();
    let observer = Arc::new(Counting::default());
    let watch = fixture.watch(first, Arc::clone(&observer));
    assert_eq!(fixture.change(&variant(2)), 2);
    wait_for_epoch(&watch, 2);

    fixture.etcd.kill();
    // The watcher notices (an error counted) while etcd is away.
    let deadline = Instant::now() + PATIENCE;
    while observer.errors.load(Ordering::Relaxed) == 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(observer.errors.load(Ordering::Relaxed) >= 1);
    assert!(watch.latest().is_none(), "no map while etcd is down");
    fixture
        .etcd
        .restart()
        .unwrap_or_else(|e| panic!("etcd again: {e}"));
    assert_eq!(fixture.change(&variant(3)), 3);
    wait_for_epoch(&watch, 3);
    assert!(observer.restarts.load(Ordering::Relaxed) >= 1);
}
