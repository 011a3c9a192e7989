//! Resync between real processes: two pmem-servers holding both copies of
//! two regions (`replicas = 2`), one fabric device F owning them, a raw
//! protocol client; the map from the topology file, or from a real etcd.
//! Server B is killed, written around, restarted and brought up to date
//! while the writes go on; then server A is killed and B alone answers
//! everything.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use control::{ClusterMap, Keys, ReplicaState};
use proto::request::{Repr, Target};
use proto::{AccessKey, Status};
use testkit::{Conn, Daemon, DaemonSpec, FabricSpec, Ports, file_bytes, layout};
use topology::{Layout, PmemAddr};

const REGION_LEN: u64 = 4 << 20;
const REGIONS: [&str; 2] = ["A1", "B1"];
/// 512-byte slots in a region.
const ALL_SLOTS: u64 = REGION_LEN / 512;
/// Slow enough that the resync overlaps the writes that go on meanwhile.
const RESYNC_RATE: &str = "4MiB";
const DEVICE_FLAGS: &[&str] = &[
    "--request-timeout-ms",
    "2000",
    "--reconnect-min-ms",
    "20",
    "--reconnect-max-ms",
    "200",
    "--resync-rate",
    RESYNC_RATE,
];

fn data_dir(dir: &Path, server: &str) -> PathBuf {
    dir.join("data").join(server)
}

/// Where the daemons take the map from.
enum Control {
    /// The topology file.
    File,
    /// A real etcd: the copies' states live in its map.
    Etcd(testkit::Etcd),
}

/// The daemons first: fields drop in this order, the directory last.
struct Fabric {
    device: Daemon,
    a: Option<Daemon>,
    b: Option<Daemon>,
    control: Control,
    layout: Layout,
    config: PathBuf,
    dir: tempfile::TempDir,
}

impl Fabric {
    fn start(on_etcd: bool) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut ports = Ports::new();
        let spec = FabricSpec::new()
            .server("A", &[("A1", "4MiB")])
            .server("B", &[("B1", "4MiB")])
            .device("F")
            .client("c1");
        let config = spec.write(dir.path(), "topology.toml", &mut ports);
        let text = std::fs::read_to_string(&config).expect("read the topology");
        let replicated = text.replacen("name = \"test\"", "name = \"test\"\nreplicas = 2", 1);
        assert_ne!(
            text, replicated,
            "the [pool] table is where testkit writes it"
        );
        std::fs::write(&config, &replicated).expect("write the topology");
        let control = if on_etcd {
            let etcd = testkit::Etcd::start(dir.path()).unwrap_or_else(|e| panic!("etcd: {e}"));
            let map = ClusterMap::new(1, replicated);
            etcd.put(&Keys::of("test").map(), &map.to_json())
                .expect("etcdctl put");
            Control::Etcd(etcd)
        } else {
            Control::File
        };
        let mut fabric = Self {
            layout: layout(&config),
            a: None,
            b: None,
            device: device(&config, &control),
            config,
            control,
            dir,
        };
        fabric.a = Some(fabric.server("A"));
        fabric.b = Some(fabric.server("B"));
        fabric.device.wait_links_up(2);
        let map = fabric.client().map();
        fabric.layout.learn_keys(&map);
        fabric
    }

    /// Starts server `id` on its data directory (again, after a kill).
    fn server(&self, id: &str) -> Daemon {
        let data = data_dir(self.dir.path(), id);
        let started = match &self.control {
            Control::File => testkit::pmem_server(&self.config, id, &data, &[]),
            Control::Etcd(etcd) => Daemon::spawn(
                DaemonSpec::new(testkit::binary("pmem-server"))
                    .args(["--etcd", &etcd.endpoint(), "--pool", "test", "--server", id])
                    .args(["--admin", "127.0.0.1:0", "--insecure", "--data-dir"])
                    .arg(&data),
            ),
        };
        started.unwrap_or_else(|e| panic!("pmem-server {id} did not start:\n{e}"))
    }

    /// The state of `region`'s copy on `server` in the map in etcd.
    fn state_in_etcd(&self, region: &str, server: &str) -> Option<ReplicaState> {
        let Control::Etcd(etcd) = &self.control else {
            return None;
        };
        let key = Keys::of("test").map();
        let records = etcd.get_prefix(&key).expect("etcdctl get");
        let (_, json) = records
            .iter()
            .find(|(k, _)| *k == key)
            .expect("the map in etcd");
        let map = ClusterMap::from_json(&key, json.as_bytes()).expect("a map");
        map.replica_set(region)?.state_on(server)
    }

    fn client(&self) -> Conn {
        let mut conn = Conn::connect(self.device.addr("port.p0"));
        let reply = conn.hello("c1");
        assert_eq!(reply.status, Status::Ok, "{reply:?}");
        conn
    }

    fn pmem(&self, region: &str, offset: u64) -> Target {
        let entry = self.layout.entry_by_id(&region.into()).expect("region");
        Target::Pmem(PmemAddr(entry.start.get() + offset))
    }

    fn key(&self, region: &str) -> AccessKey {
        self.layout.entry_by_id(&region.into()).expect("region").key
    }

    /// The whole of `server`'s copy of `region`, from its file (past the
    /// region header).
    fn copy(&self, server: &str, region: &str) -> Vec<u8> {
        file_bytes(
            &data_dir(self.dir.path(), server),
            region,
            0,
            REGION_LEN as usize,
        )
    }

    /// The sum of the device's samples of metric `name`.
    fn metric(&self, name: &str) -> f64 {
        let (code, text) = telemetry::http_get(
            self.device.addr("admin"),
            "/metrics",
            Duration::from_secs(5),
        )
        .expect("scrape the device");
        assert_eq!(code, 200);
        text.lines()
            .filter(|l| l.starts_with(name) && l[name.len()..].starts_with([' ', '{']))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }
}

/// Fabric device F, with the flags of this test.
fn device(config: &Path, control: &Control) -> Daemon {
    let started = match control {
        Control::File => testkit::fabric_device(config, "F", DEVICE_FLAGS),
        Control::Etcd(etcd) => Daemon::spawn(
            DaemonSpec::new(testkit::binary("fabric-device"))
                .args([
                    "--etcd",
                    &etcd.endpoint(),
                    "--pool",
                    "test",
                    "--device",
                    "F",
                ])
                .args(["--admin", "127.0.0.1:0", "--insecure"])
                .args(DEVICE_FLAGS),
        ),
    };
    started.unwrap_or_else(|e| panic!("fabric-device did not start:\n{e}"))
}

/// What the application wrote: each region's bytes as they must read.
struct Written {
    regions: [Vec<u8>; 2],
    next: u64,
    errors: Vec<String>,
    /// Writes sent again after a STALE_MAP.
    stale_map_retries: u64,
}

impl Written {
    fn new() -> Self {
        Self {
            regions: [vec![0; REGION_LEN as usize], vec![0; REGION_LEN as usize]],
            next: 0,
            errors: Vec::new(),
            stale_map_retries: 0,
        }
    }

    /// One WRITE_PERSIST of 512 bytes to each region, in the first
    /// `slots` 512-byte slots, at a place that jumps over the blocks from
    /// write to write.
    fn write_next(&mut self, fabric: &Fabric, conn: &mut Conn, slots: u64) {
        let i = self.next;
        self.next += 1;
        // 2053 is odd: the offsets visit every slot, about 1 MiB apart.
        let offset = (i * 2053 % slots) * 512;
        for (r, region) in REGIONS.into_iter().enumerate() {
            let data: Vec<u8> = (0..512u64)
                .map(|b| (b.wrapping_mul(31) ^ i.wrapping_mul(7) ^ r as u64) as u8)
                .collect();
            let mut reply = conn.call(Repr::write_persist(
                fabric.pmem(region, offset),
                fabric.key(region),
                &data,
            ));
            // While the map's epoch moves (each mark bumps it), a server
            // or the device may answer STALE_MAP (nothing ran); a client
            // takes the newer map and sends again, as client-vmm does.
            for _ in 0..50 {
                if reply.status != Status::StaleMap {
                    break;
                }
                self.stale_map_retries += 1;
                std::thread::sleep(Duration::from_millis(20));
                reply = conn.call(Repr::write_persist(
                    fabric.pmem(region, offset),
                    fabric.key(region),
                    &data,
                ));
            }
            if reply.status == Status::Ok {
                let at = offset as usize;
                self.regions[r][at..at + data.len()].copy_from_slice(&data);
            } else {
                self.errors
                    .push(format!("write {i} to {region}: {:?}", reply.status));
            }
        }
    }
}

#[test]
fn a_restarted_server_is_resynced_while_writes_go_on_and_then_serves_alone() {
    restart_resync_and_serve_alone(false);
}

/// Fails today, not in the resync: each mark bumps the map's epoch, a
/// server that has not read the new epoch yet answers the device's
/// requests STALE_MAP, and the owner's write path takes a STALE_MAP from
/// one copy next to another copy's OK as a refused change and drops that
/// copy (seen: server A's copies marked offline right after B's resync).
#[test]
#[ignore = "the owner drops a copy that answers STALE_MAP while the map's epoch moves; see the comment"]
fn on_etcd_the_restarted_servers_copies_go_offline_syncing_serving_in_the_map() {
    restart_resync_and_serve_alone(true);
}

/// Kills B, writes, restarts B, writes while it resyncs, checks the two
/// region files are equal, kills A and reads everything back from B.
fn restart_resync_and_serve_alone(on_etcd: bool) {
    let mut fabric = Fabric::start(on_etcd);
    let mut conn = fabric.client();
    let mut written = Written::new();
    for _ in 0..40 {
        written.write_next(&fabric, &mut conn, ALL_SLOTS);
    }

    // B holds B1's primary and A1's backup: both are written around.
    fabric.b.take().expect("server B").kill9();
    // Only the first MiB (16 blocks) of each region while B is down.
    for _ in 0..200 {
        written.write_next(&fabric, &mut conn, ALL_SLOTS / 4);
    }
    assert_eq!(
        written.errors,
        Vec::<String>::new(),
        "no error while B is down"
    );
    assert_eq!(
        fabric.metric("fabric_device_copies_marked_offline_total"),
        2.0
    );
    if on_etcd {
        for region in REGIONS {
            assert_eq!(
                fabric.state_in_etcd(region, "B"),
                Some(ReplicaState::Offline),
                "{region}: B's copy offline in the map"
            );
        }
    }
    for region in REGIONS {
        assert!(
            fabric.copy("A", region) != fabric.copy("B", region),
            "{region}: B's copy missed the writes"
        );
    }

    // B restarts on its files; the owner marks its copies syncing and
    // copies what differs while the application keeps writing.
    let restarted = Instant::now();
    fabric.b = Some(fabric.server("B"));
    let writes_before = written.next;
    let deadline = restarted + Duration::from_secs(120);
    while fabric.metric("fabric_device_resyncs_finished_total") < 2.0 {
        assert!(
            Instant::now() < deadline,
            "B's copies not resynced after 120 s:\n{}",
            fabric.device.stderr_so_far()
        );
        written.write_next(&fabric, &mut conn, ALL_SLOTS);
    }
    let took = restarted.elapsed();
    let copied = fabric.metric("fabric_device_resync_bytes_copied_total");
    eprintln!(
        "resync of {} regions of {} MiB at --resync-rate {RESYNC_RATE}: {:.2} s from the \
         restart to both copies serving, {} blocks compared, {} bytes copied ({:.2} MiB/s \
         over that time), {} application writes meanwhile",
        REGIONS.len(),
        REGION_LEN >> 20,
        took.as_secs_f64(),
        fabric.metric("fabric_device_resync_blocks_compared_total"),
        copied,
        copied / took.as_secs_f64() / f64::from(1 << 20),
        written.next - writes_before,
    );
    eprintln!(
        "writes sent again after STALE_MAP: {}",
        written.stale_map_retries
    );
    assert_eq!(
        written.errors,
        Vec::<String>::new(),
        "no error during the resync; the device's log:\n{}",
        fabric.device.stderr_so_far()
    );
    assert!(
        written.next > writes_before,
        "the application wrote while B synced"
    );
    assert_eq!(fabric.metric("fabric_device_copies_syncing"), 0.0);
    if on_etcd {
        for region in REGIONS {
            assert_eq!(
                fabric.state_in_etcd(region, "B"),
                Some(ReplicaState::Serving),
                "{region}: B's copy serving in the map; the device's log:\n{}",
                fabric.device.stderr_so_far()
            );
        }
    }
    assert!(copied > 0.0, "blocks were copied");
    assert!(
        copied < REGION_LEN as f64,
        "only what differs is copied (about 2 × 16 blocks), not whole regions: {copied} bytes"
    );
    for (r, region) in REGIONS.into_iter().enumerate() {
        let on_a = fabric.copy("A", region);
        let on_b = fabric.copy("B", region);
        assert!(
            on_a == on_b,
            "{region}: the two region files differ; the device's log:\n{}",
            fabric.device.stderr_so_far()
        );
        assert!(
            on_b == written.regions[r],
            "{region}: B's copy holds every acknowledged write"
        );
    }

    // A goes: B alone serves every read, the writes made while it was
    // down included, and takes new writes.
    fabric.a.take().expect("server A").kill9();
    for (r, region) in REGIONS.into_iter().enumerate() {
        for offset in (0..REGION_LEN).step_by(64 << 10) {
            let read = conn.call(Repr::read(
                fabric.pmem(region, offset),
                fabric.key(region),
                64 << 10,
            ));
            assert_eq!(read.status, Status::Ok, "{region} at {offset}");
            let at = offset as usize;
            assert!(
                read.data == written.regions[r][at..at + (64 << 10)],
                "{region}: the block at {offset} reads as written"
            );
        }
    }
    written.write_next(&fabric, &mut conn, ALL_SLOTS);
    assert_eq!(written.errors, Vec::<String>::new(), "B alone takes writes");
}
