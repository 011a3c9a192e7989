//! Resync between real processes: two pmem-servers holding both copies of
//! two regions (`replicas = 2`), one fabric device F owning them, a raw
//! protocol client; the map from the topology file, or from a real etcd.
//! Server B is killed, written around, restarted and brought up to date
//! while the writes go on; then server A is killed and B alone answers
//! everything.

mod support;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use control::ReplicaState;
use proto::request::{Repr, Target};
use proto::{AccessKey, Status};
use support::data_dir;
use testkit::{Conn, Daemon, layout};
use topology::Layout;

const REGION_LEN: u64 = 4 << 20;
const REGIONS: [&str; 2] = ["A1", "B1"];
/// 512-byte slots in a region.
const ALL_SLOTS: u64 = REGION_LEN / 512;
/// Slow enough that the resync overlaps the writes that go on meanwhile.
const RESYNC_RATE: &str = "4MiB";
/// The shared device flags, and the resync's rate.
fn device_flags() -> Vec<&'static str> {
    let mut flags = support::DEVICE_FLAGS.to_vec();
    flags.extend(["--resync-rate", RESYNC_RATE]);
    flags
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
        let (config, replicated) = support::replicated_topology(dir.path(), &["F"], "c1");
        let control = if on_etcd {
            let etcd = testkit::Etcd::start(dir.path()).unwrap_or_else(|e| panic!("etcd: {e}"));
            support::put_first_map(&etcd, replicated);
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
        match &self.control {
            Control::File => {
                testkit::pmem_server(&self.config, id, &data_dir(self.dir.path(), id), &[])
                    .unwrap_or_else(|e| panic!("pmem-server {id} did not start:\n{e}"))
            }
            Control::Etcd(etcd) => support::server_on(etcd, id, self.dir.path()),
        }
    }

    /// The state of `region`'s copy on `server` in the map in etcd.
    fn state_in_etcd(&self, region: &str, server: &str) -> Option<ReplicaState> {
        let Control::Etcd(etcd) = &self.control else {
            return None;
        };
        support::map_now(etcd).replica_set(region)?.state_on(server)
    }

    fn client(&self) -> Conn {
        support::client(&self.device, "c1")
    }

    fn pmem(&self, region: &str, offset: u64) -> Target {
        support::pmem(&self.layout, region, offset)
    }

    fn key(&self, region: &str) -> AccessKey {
        support::key(&self.layout, region)
    }

    /// The whole of `server`'s copy of `region`, from its file (past the
    /// region header).
    fn copy(&self, server: &str, region: &str) -> Vec<u8> {
        support::copy_bytes(self.dir.path(), server, region, 0, REGION_LEN as usize)
    }

    /// The sum of the device's samples of metric `name`.
    fn metric(&self, name: &str) -> f64 {
        support::metric(&self.device, name)
    }
}

/// Fabric device F, with the flags of this test.
fn device(config: &Path, control: &Control) -> Daemon {
    match control {
        Control::File => testkit::fabric_device(config, "F", &device_flags())
            .unwrap_or_else(|e| panic!("fabric-device did not start:\n{e}")),
        Control::Etcd(etcd) => support::device_on(etcd, "F", &device_flags()),
    }
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
            // takes the newer map and sends again, as pmem-client does.
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

/// The same on etcd: each mark bumps the map's epoch, and a server that
/// read the new epoch before the device answers its requests STALE_MAP
/// meanwhile; the owner sends those parts again once the server confirms
/// the device's epoch, and drops no copy for it.
#[test]
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

/// An atomic applied while B was down reaches B's exactly-once window with
/// B's resync: once A is gone and B decides, the client's retry of it
/// (same identity, its first answer lost, say) is answered from B's
/// record, not applied a second time.
#[test]
fn an_atomic_applied_while_a_copy_was_down_is_answered_from_its_record_there_once_it_decides() {
    let mut fabric = Fabric::start(false);
    let mut conn = fabric.client();
    let counter = fabric.pmem("A1", 1 << 20);
    let key = fabric.key("A1");
    let add =
        |amount: u64, seq: u64| Repr::fetch_add(counter, key, amount).with_exactly_once(0, seq);
    let first = conn.call(add(3, 1));
    assert_eq!((first.status, first.value), (Status::Ok, 0));

    // B holds A1's backup: the next atomic is applied at A (the deciding
    // copy) only.
    fabric.b.take().expect("server B").kill9();
    let missed = conn.call(add(5, 2));
    assert_eq!((missed.status, missed.value), (Status::Ok, 3));

    // B restarts and is resynced: records first, then the blocks.
    fabric.b = Some(fabric.server("B"));
    let deadline = Instant::now() + Duration::from_secs(120);
    // Both of B's copies (A1's backup, B1's primary) were lost with it.
    while fabric.metric("fabric_device_resyncs_finished_total") < 2.0 {
        assert!(
            Instant::now() < deadline,
            "B's copies not resynced after 120 s:\n{}",
            fabric.device.stderr_so_far()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    fabric
        .device
        .wait_for_log("1 exactly-once records of atomics decided while the copy did not serve");

    // A goes: B decides. The retry is answered with what the atomic first
    // returned, and the counter holds each acknowledged FETCH_ADD once.
    fabric.a.take().expect("server A").kill9();
    let again = conn.call(add(5, 2));
    assert_eq!(
        (again.status, again.value),
        (Status::Ok, 3),
        "answered from B's record; the device's log:\n{}",
        fabric.device.stderr_so_far()
    );
    let read = conn.call(Repr::read(counter, key, 8));
    assert_eq!(read.status, Status::Ok);
    assert_eq!(read.data, 8u64.to_le_bytes(), "3 + 5, each applied once");
    // A new atomic is applied there as usual.
    let next = conn.call(add(1, 3));
    assert_eq!((next.status, next.value), (Status::Ok, 8));
    assert_eq!(
        conn.call(Repr::read(counter, key, 8)).data,
        9u64.to_le_bytes()
    );
}
