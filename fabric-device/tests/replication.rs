//! Replicated regions between real pmem-servers and a real fabric device:
//! two servers, `replicas = 2` (each server holds the other's regions as
//! backups), one device F that owns every region, raw protocol clients.

mod support;

use std::collections::HashMap;

use proto::request::{Repr, Target};
use proto::{AccessKey, Status};
use support::{DEVICE_FLAGS, data_dir};
use testkit::{Conn, Daemon, layout};
use topology::Layout;

struct Fabric {
    dir: tempfile::TempDir,
    layout: Layout,
    servers: HashMap<String, Daemon>,
    device: Daemon,
}

impl Fabric {
    /// Servers A (region A1) and B (region B1), two copies of each.
    fn start() -> Self {
        Self::start_with(DEVICE_FLAGS)
    }

    /// As [`Fabric::start`], the device started with `device_flags`.
    fn start_with(device_flags: &[&str]) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let (config, _) = support::replicated_topology(dir.path(), &["F"], "c1");
        let servers = ["A", "B"]
            .into_iter()
            .map(|id| {
                let daemon = testkit::pmem_server(&config, id, &data_dir(dir.path(), id), &[])
                    .unwrap_or_else(|e| panic!("pmem-server {id} did not start:\n{e}"));
                (id.to_owned(), daemon)
            })
            .collect();
        let device = testkit::fabric_device(&config, "F", device_flags)
            .unwrap_or_else(|e| panic!("fabric-device did not start:\n{e}"));
        device.wait_links_up(2);
        let mut fabric = Self {
            layout: layout(&config),
            dir,
            servers,
            device,
        };
        let map = fabric.client().map();
        fabric.layout.learn_keys(&map);
        fabric
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

    /// `len` bytes at `offset` of `server`'s copy of `region`, from its file.
    fn copy_bytes(&self, server: &str, region: &str, offset: u64, len: usize) -> Vec<u8> {
        support::copy_bytes(self.dir.path(), server, region, offset, len)
    }

    fn metric(&self, name: &str) -> f64 {
        support::metric(&self.device, name)
    }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(29) ^ seed)
        .collect()
}

#[test]
fn writes_and_atomics_through_the_owner_land_in_both_servers_files() {
    let fabric = Fabric::start();
    let mut conn = fabric.client();
    for (i, region) in ["A1", "B1"].into_iter().enumerate() {
        let data = pattern(5000, i as u8);
        let reply = conn.call(Repr::write_persist(
            fabric.pmem(region, 8192),
            fabric.key(region),
            &data,
        ));
        assert_eq!(reply.status, Status::Ok, "{region}: {reply:?}");
        for add in [3u64, 4, 5] {
            let reply = conn.call(Repr::fetch_add(
                fabric.pmem(region, 64),
                fabric.key(region),
                add,
            ));
            assert_eq!(reply.status, Status::Ok, "{region}: {reply:?}");
        }
        let swapped = conn.call(Repr::compare_swap(
            fabric.pmem(region, 128),
            fabric.key(region),
            0,
            77,
        ));
        assert_eq!((swapped.status, swapped.value), (Status::Ok, 0));
        let read = conn.call(Repr::read(
            fabric.pmem(region, 8192),
            fabric.key(region),
            5000,
        ));
        assert!(read.data == data, "{region}: read back what was written");
        for server in ["A", "B"] {
            assert!(
                fabric.copy_bytes(server, region, 8192, 5000) == data,
                "{region}: server {server}'s copy holds the write"
            );
            let counter = fabric.copy_bytes(server, region, 64, 8);
            assert_eq!(
                u64::from_le_bytes(counter.try_into().unwrap()),
                12,
                "{region}: server {server}'s copy holds the sum of the FETCH_ADDs"
            );
            let word = fabric.copy_bytes(server, region, 128, 8);
            assert_eq!(u64::from_le_bytes(word.try_into().unwrap()), 77);
        }
    }
    assert_eq!(
        fabric.metric("fabric_device_copies_marked_offline_total"),
        0.0
    );
    assert!(fabric.metric("fabric_device_replica_writes_total") >= 4.0);
}

#[test]
fn a_server_killed_while_writing_costs_no_write_and_the_survivor_has_them_all() {
    let mut fabric = Fabric::start();
    let mut conn = fabric.client();
    const WRITES: u64 = 300;
    let mut errors = Vec::new();
    for i in 0..WRITES {
        if i == WRITES / 3 {
            // Server B holds B1's primary (its deciding copy) and A1's backup.
            fabric.servers.remove("B").expect("server B").kill9();
        }
        for region in ["A1", "B1"] {
            let value = (i + 1) * 1000 + u64::from(region == "B1");
            let reply = conn.call(Repr::write_persist(
                fabric.pmem(region, i * 8),
                fabric.key(region),
                &value.to_le_bytes(),
            ));
            if reply.status != Status::Ok {
                errors.push((region, i, reply.status));
            }
            let counter = conn.call(Repr::fetch_add(
                fabric.pmem(region, 1 << 20),
                fabric.key(region),
                1,
            ));
            if counter.status != Status::Ok {
                errors.push((region, i, counter.status));
            }
        }
    }
    assert_eq!(errors, [], "the application sees no error");
    for region in ["A1", "B1"] {
        for i in 0..WRITES {
            let value = (i + 1) * 1000 + u64::from(region == "B1");
            let on_a = fabric.copy_bytes("A", region, i * 8, 8);
            assert_eq!(
                u64::from_le_bytes(on_a.try_into().unwrap()),
                value,
                "{region}: write {i} is in server A's copy"
            );
            let read = conn.call(Repr::read(
                fabric.pmem(region, i * 8),
                fabric.key(region),
                8,
            ));
            assert_eq!(read.status, Status::Ok);
            assert_eq!(
                read.data,
                value.to_le_bytes(),
                "{region}: write {i} reads back"
            );
        }
        let counter = fabric.copy_bytes("A", region, 1 << 20, 8);
        assert_eq!(
            u64::from_le_bytes(counter.try_into().unwrap()),
            WRITES,
            "{region}: every FETCH_ADD applied once on the survivor"
        );
    }
    assert_eq!(
        fabric.metric("fabric_device_copies_marked_offline_total"),
        2.0,
        "B's copies of A1 and B1"
    );
}

/// A server that stops answering (SIGSTOP: its connections stay open and
/// silent, as a powered-off machine's do) holds its copies' operations for
/// the device's copy timeout, not its request timeout: the request timeout
/// here is longer than the client's patience (`testkit::conn::IO_TIMEOUT`),
/// so an operation still waiting on the frozen server would fail the test.
/// A1's first write meets its silent backup, B1's first FETCH_ADD its
/// silent deciding copy (decided again at A); everything is answered from
/// server A's copies.
#[test]
fn a_frozen_servers_copies_are_dropped_at_the_copy_timeout_and_nothing_fails() {
    let fabric = Fabric::start_with(&[
        "--request-timeout-ms",
        "120000",
        "--copy-timeout-ms",
        "300",
        "--reconnect-min-ms",
        "20",
        "--reconnect-max-ms",
        "200",
    ]);
    let mut conn = fabric.client();
    // Server B holds B1's primary (its deciding copy) and A1's backup.
    let frozen = &fabric.servers["B"];
    frozen.signal(libc::SIGSTOP);
    let data = pattern(512, 9);
    let write = |conn: &mut Conn, region: &str| {
        let reply = conn.call(Repr::write_persist(
            fabric.pmem(region, 4096),
            fabric.key(region),
            &data,
        ));
        assert_eq!(reply.status, Status::Ok, "{region}: {reply:?}");
    };
    let add = |conn: &mut Conn, region: &str| {
        let added = conn.call(Repr::fetch_add(
            fabric.pmem(region, 64),
            fabric.key(region),
            5,
        ));
        assert_eq!((added.status, added.value), (Status::Ok, 0), "{region}");
    };
    write(&mut conn, "A1");
    add(&mut conn, "A1");
    add(&mut conn, "B1");
    write(&mut conn, "B1");
    for region in ["A1", "B1"] {
        let read = conn.call(Repr::read(
            fabric.pmem(region, 4096),
            fabric.key(region),
            512,
        ));
        assert_eq!(read.status, Status::Ok, "{region}");
        assert!(read.data == data, "{region}: read back what was written");
        assert!(
            fabric.copy_bytes("A", region, 4096, 512) == data,
            "{region}: server A's copy holds the write"
        );
        let counter = fabric.copy_bytes("A", region, 64, 8);
        assert_eq!(
            u64::from_le_bytes(counter.try_into().unwrap()),
            5,
            "{region}: the FETCH_ADD applied once on server A's copy"
        );
    }
    assert_eq!(
        fabric.metric("fabric_device_copies_marked_offline_total"),
        2.0,
        "B's copies of A1 and B1"
    );
    frozen.signal(libc::SIGCONT);
}
