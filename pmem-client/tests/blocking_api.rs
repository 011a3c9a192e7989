//! The library from blocking code against real daemons: the blocking
//! allocator, compare-and-swap's outcome, the batch helpers, `read_into`
//! and the u64 helpers, and what each operation's durability promise means
//! when a server loses its power.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use pmem_client::{
    AllocError, Batch, BlockingAllocator, Completion, Placement, Pool, PoolError, error_chain,
};
use testkit::{Daemon, FabricSpec, Ports};
use topology::{EnvOverrides, Topology, VirtAddr};

/// One server with two regions, one fabric device, two clients, an
/// allocator.
struct Fabric {
    dir: tempfile::TempDir,
    config: PathBuf,
    server: Option<Daemon>,
    device: Option<Daemon>,
}

impl Fabric {
    /// Starts the daemons; `extra` goes to the server.
    fn start(extra: &[&str]) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let config = FabricSpec::new()
            .server("A", &[("A1", "16MiB"), ("A2", "16MiB")])
            .device("F1")
            .client("c0")
            .client("c1")
            .allocator("page_table_entries = 256")
            .write(dir.path(), "topology.toml", &mut Ports::new());
        let mut fabric = Self {
            dir,
            config,
            server: None,
            device: None,
        };
        fabric.boot(extra);
        fabric
    }

    /// Starts server A on its data directory and the device, and waits for
    /// the device's link to A.
    fn boot(&mut self, extra: &[&str]) {
        let data = self.dir.path().join("A");
        let server = testkit::pmem_server(&self.config, "A", &data, extra)
            .unwrap_or_else(|e| panic!("pmem-server A:\n{e}"));
        let device = testkit::fabric_device(&self.config, "F1", &[])
            .unwrap_or_else(|e| panic!("fabric-device F1:\n{e}"));
        device.wait_links_up(1);
        self.server = Some(server);
        self.device = Some(device);
    }

    /// Kills both daemons with SIGKILL: the server persists nothing more.
    fn kill(&mut self) {
        if let Some(server) = self.server.take() {
            server.kill9();
        }
        if let Some(device) = self.device.take() {
            device.kill9();
        }
    }

    fn pool(&self, client: &str) -> Pool {
        self.pool_with(client, false)
    }

    /// A pool whose atomics persist their word when `persistent_atomics`.
    fn pool_with(&self, client: &str, persistent_atomics: bool) -> Pool {
        let topology = Topology::load_with(&self.config, &EnvOverrides::None).expect("topology");
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            match Pool::builder(topology.clone(), client)
                .op_timeout(Duration::from_secs(20))
                .persistent_atomics(persistent_atomics)
                .connect()
            {
                Ok(pool) => return pool,
                Err(_) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(50))
                }
                Err(e) => panic!("client {client}: {}", error_chain(&e)),
            }
        }
    }
}

fn formatted(pool: &Pool) -> BlockingAllocator {
    BlockingAllocator::format(pool, false).unwrap_or_else(|e| panic!("{}", error_chain(&e)))
}

#[test]
fn the_blocking_allocator_allocates_shares_and_frees() {
    let fabric = Fabric::start(&[]);
    let p0 = fabric.pool("c0");
    let a0 = formatted(&p0);
    assert!(
        matches!(
            BlockingAllocator::format(&p0, false),
            Err(AllocError::AlreadyFormatted { .. })
        ),
        "a second format without force is refused"
    );

    // Small and large, anywhere and placed; fresh memory reads zeroes.
    let small = a0.alloc(100).expect("alloc 100 B");
    let large = a0
        .alloc_with(3 << 20, &Placement::Server("A".into()))
        .expect("alloc 3 MiB on A");
    assert_ne!(small, large);
    assert_eq!(p0.read(large + (3 << 20) - 8, 8).expect("read"), [0; 8]);
    p0.write_persist(small, b"small object").expect("write");
    assert_eq!(p0.read(small, 12).expect("read"), b"small object");

    // A named object, found by the other client through its own allocator.
    let orders = a0.alloc_named("orders", 4096).expect("alloc_named");
    p0.write_persist(orders, b"order 1").expect("write");
    assert!(matches!(
        a0.alloc_named_with("orders", 64, &Placement::RoundRobin),
        Err(AllocError::NameExists(name)) if name == "orders"
    ));
    let p1 = fabric.pool("c1");
    let a1 = p1.allocator().expect("attach c1");
    assert_eq!(a1.open("orders").expect("open"), (orders, 4096));
    assert_eq!(p1.read(orders, 7).expect("read"), b"order 1");
    let names: Vec<String> = a1
        .list()
        .expect("list")
        .into_iter()
        .map(|o| o.name)
        .collect();
    assert_eq!(names, ["orders"]);
    assert!(
        matches!(a1.remove("orders"), Err(AllocError::NotOwner { .. })),
        "only the creator removes a name"
    );

    // Freed memory is gone for everyone holding its translation.
    a0.free(large).expect("free");
    assert!(matches!(a0.free(large), Err(AllocError::DoubleFree { .. })));
    assert!(matches!(
        p0.read(large, 8),
        Err(PoolError::UseAfterFree { .. } | PoolError::AccessDenied { .. })
    ));
    a0.remove("orders").expect("remove");
    assert!(matches!(
        a1.open("orders"),
        Err(AllocError::NameNotFound(_))
    ));

    // The allocator keeps the runtime and connections it shares with the
    // pool: it works after the pool value is dropped.
    drop(p0);
    let again = a0.alloc(3 << 20).expect("alloc after the pool was dropped");
    a0.free(again).expect("free after the pool was dropped");
    a0.free(small).expect("free the small object");
    let usage = a0.usage().expect("usage");
    assert_eq!(
        usage.slabs, 1,
        "the client keeps its emptied slab for the next small object: {usage:?}"
    );
    a0.trim().expect("trim");
    let usage = a0.usage().expect("usage");
    assert_eq!(
        (
            usage.regions.iter().map(|r| r.used).sum::<u64>(),
            usage.slabs
        ),
        (0, 0),
        "every extent is free again (trim retired the emptied slab): {usage:?}"
    );
    assert!(a0.scrub().expect("scrub").is_clean());
}

/// Words of one fresh allocation, each on a cache line of its own.
fn words(pool: &Pool, count: u64) -> (BlockingAllocator, Vec<VirtAddr>) {
    let alloc = formatted(pool);
    let base = alloc.alloc(1 << 20).expect("alloc");
    (alloc, (0..count).map(|i| base + 64 * i).collect())
}

#[test]
fn compare_and_swap_says_whether_it_swapped_and_u64_helpers_round_trip() {
    let fabric = Fabric::start(&[]);
    let pool = fabric.pool("c0");
    let (_alloc, w) = words(&pool, 4);

    assert_eq!(pool.compare_and_swap(w[0], 0, 5).expect("cas"), Ok(0));
    assert_eq!(pool.compare_and_swap(w[0], 0, 7).expect("cas"), Err(5));
    assert_eq!(
        pool.read_u64(w[0]).expect("read_u64"),
        5,
        "the failed CAS left it"
    );
    assert_eq!(pool.compare_and_swap(w[0], 5, 7).expect("cas"), Ok(5));
    assert_eq!(pool.fetch_add(w[0], 3).expect("faa"), 7);
    assert_eq!(pool.read_u64(w[0]).expect("read_u64"), 10);

    // Little-endian, unaligned, through read_into as well.
    let odd = w[1] + 3;
    pool.write_u64(odd, 0x0102_0304_0506_0708)
        .expect("write_u64");
    assert_eq!(pool.read_u64(odd).expect("read_u64"), 0x0102_0304_0506_0708);
    let mut bytes = [0xffu8; 10];
    pool.read_into(w[1] + 2, &mut bytes).expect("read_into");
    assert_eq!(bytes, [0, 8, 7, 6, 5, 4, 3, 2, 1, 0]);
    assert!(matches!(
        pool.compare_and_swap(odd, 0, 1),
        Err(PoolError::Misaligned { .. })
    ));
}

#[test]
fn read_into_fills_a_buffer_across_extents() {
    let fabric = Fabric::start(&[]);
    let pool = fabric.pool("c0");
    let alloc = formatted(&pool);
    // Three extents (2 MiB each) of one allocation: reads cross them.
    let base = alloc.alloc(5 << 20).expect("alloc");
    let at = base + (2 << 20) - 1000;
    let data: Vec<u8> = (0..(2u32 << 20) + 3000).map(|i| (i % 251) as u8).collect();
    pool.write(at, &data).expect("write");
    let mut buf = vec![0u8; data.len()];
    pool.read_into(at, &mut buf).expect("read_into");
    assert!(buf == data, "read_into returns what was written");
    assert_eq!(pool.read(at, data.len() as u64).expect("read"), data);
    let mut empty = [0u8; 0];
    pool.read_into(at, &mut empty).expect("an empty read");
    let mut past = [0u8; 16];
    assert!(
        pool.read_into(base + (6 << 20), &mut past).is_err(),
        "past the allocation"
    );
}

#[test]
fn batch_helpers_run_compare_and_swap_atomic_write_and_flush() {
    let fabric = Fabric::start(&[]);
    let pool = fabric.pool("c0");
    let (_alloc, w) = words(&pool, 4);
    pool.atomic_write(w[2], 1).expect("atomic_write");

    let mut batch = Batch::new();
    batch
        .compare_and_swap(w[0], 0, 9)
        .compare_and_swap(w[2], 0, 9)
        .atomic_write(w[1], 42)
        .fetch_add(w[3], 2)
        .flush(w[0], 4 * 64);
    assert_eq!(batch.len(), 5);
    let done: Vec<Completion> = pool
        .submit(batch)
        .into_iter()
        .map(|r| r.expect("batch operation"))
        .collect();
    assert_eq!(
        done,
        [
            Completion::CompareAndSwap(Ok(0)),
            Completion::CompareAndSwap(Err(1)),
            Completion::Done,
            Completion::Old(0),
            Completion::Done,
        ]
    );
    let after: Vec<u64> = w
        .iter()
        .map(|&at| pool.read_u64(at).expect("read"))
        .collect();
    assert_eq!(after, [9, 42, 1, 2]);
}

/// What survives a power cut of the server (the emulated persistence
/// domain: killing it loses every store that was not persisted), for each
/// operation, as their doc comments say.
#[test]
fn only_what_was_persisted_or_flushed_survives_a_power_cut() {
    let mut fabric = Fabric::start(&["--persistence", "emulated"]);
    let (written, persisted, flushed, atomic, atomic_flushed, batched, durable_atomics) = {
        let pool = fabric.pool("c0");
        let (_alloc, w) = words(&pool, 8);
        pool.write_u64(w[0], 0xaa).expect("write");
        pool.write_persist(w[1], &0xbbu64.to_le_bytes())
            .expect("write_persist");
        pool.write_u64(w[2], 0xcc).expect("write");
        pool.flush(w[2], 8).expect("flush");
        assert_eq!(pool.compare_and_swap(w[3], 0, 0xdd).expect("cas"), Ok(0));
        assert_eq!(pool.fetch_add(w[4], 0xee).expect("faa"), 0);
        pool.flush(w[4], 8).expect("flush");
        let mut batch = Batch::new();
        batch.write_persist(w[5], 0xffu64.to_le_bytes());
        assert!(pool.submit(batch).into_iter().all(|r| r.is_ok()));
        // A pool with persistent atomics: durable without a FLUSH.
        let persistent = fabric.pool_with("c1", true);
        assert_eq!(
            persistent.compare_and_swap(w[6], 0, 0x11).expect("cas"),
            Ok(0)
        );
        persistent.atomic_write(w[7], 0x22).expect("atomic_write");
        // Everything is visible before the cut.
        let seen: Vec<u64> = w
            .iter()
            .map(|&at| pool.read_u64(at).expect("read"))
            .collect();
        assert_eq!(seen, [0xaa, 0xbb, 0xcc, 0xdd, 0xee, 0xff, 0x11, 0x22]);
        (w[0], w[1], w[2], w[3], w[4], w[5], [w[6], w[7]])
    };
    fabric.kill();
    fabric.boot(&["--persistence", "emulated"]);
    let pool = fabric.pool("c0");
    let _alloc = pool.allocator().expect("the allocation survived");
    let read = |at| pool.read_u64(at).expect("read after the cut");
    assert_eq!(read(written), 0, "a WRITE without FLUSH is lost");
    assert_eq!(read(persisted), 0xbb, "WRITE_PERSIST is durable");
    assert_eq!(read(flushed), 0xcc, "WRITE then FLUSH is durable");
    assert_eq!(read(atomic), 0, "an atomic without FLUSH is lost");
    assert_eq!(
        read(atomic_flushed),
        0xee,
        "an atomic then FLUSH is durable"
    );
    assert_eq!(read(batched), 0xff, "a batch's write_persist is durable");
    assert_eq!(
        durable_atomics.map(read),
        [0x11, 0x22],
        "with persistent_atomics, atomics are durable without a FLUSH"
    );
}
