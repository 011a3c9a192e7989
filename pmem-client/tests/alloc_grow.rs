//! The allocator on a pool that grows, against real daemons: a pool
//! formatted on servers A and B opens on a layout that appends server C,
//! C's region headers are formatted exactly once by two racing allocators,
//! allocations go to C once A and B are full, and everything allocated
//! before still reads back. A superblock of an older format is refused by
//! its version.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use pmem_client::{AllocError, Allocator, Growth, Placement, Pool};
use proto::Status;
use proto::request::{Repr, Target};
use testkit::{Conn, Daemon, FabricSpec, Ports};
use topology::records::{FORMAT_VERSION, sb};
use topology::{EnvOverrides, PmemAddr, RegionId, ServerId, Topology, VirtAddr};

const EXTENT: u64 = 1 << 20;

/// Servers A and B, and C when `grown`; the page table's size is set, as a
/// pool meant to grow must.
fn spec(grown: bool) -> FabricSpec {
    let mut spec = FabricSpec::new()
        .server("A", &[("A1", "8MiB")])
        .server("B", &[("B1", "8MiB")]);
    if grown {
        spec = spec.server("C", &[("C1", "8MiB"), ("C2", "8MiB")]);
    }
    spec.device("F1")
        .client("c0")
        .client("c1")
        .allocator("page_table_entries = 256")
}

/// The daemons of one topology file, data kept under `dir/<server>`.
struct Daemons {
    servers: Vec<Daemon>,
    device: Daemon,
}

impl Daemons {
    fn start(config: &Path, servers: &[&str], dir: &Path) -> Self {
        let started = testkit::pmem_servers(config, servers, dir);
        let device = testkit::fabric_device(config, "F1", &[])
            .unwrap_or_else(|e| panic!("fabric-device:\n{e}"));
        device.wait_links_up(started.len());
        Self {
            servers: started,
            device,
        }
    }

    fn stop(self) {
        self.device.terminate();
        for server in self.servers {
            server.terminate();
        }
    }
}

fn pool(config: &Path, client: &str) -> Pool {
    let topology = Topology::load_with(config, &EnvOverrides::None).expect("topology");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match Pool::builder(topology.clone(), client)
            .op_timeout(Duration::from_secs(20))
            .connect()
        {
            Ok(pool) => return pool,
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(50)),
            Err(e) => panic!("{}", pmem_client::error_chain(&e)),
        }
    }
}

fn attach(pool: &Pool) -> Result<Allocator, AllocError> {
    pool.block_on(Allocator::attach(pool.handle().clone()))
}

fn must<T>(what: &str, result: Result<T, AllocError>) -> T {
    result.unwrap_or_else(|e| panic!("{what}: {}", pmem_client::error_chain(&e)))
}

/// An allocation's contents: its address, then its tag.
fn pattern(tag: u8, vaddr: VirtAddr) -> Vec<u8> {
    let mut out = vec![tag; 4096];
    out[..8].copy_from_slice(&vaddr.get().to_le_bytes());
    out
}

/// Allocates one extent at a time until the pool says it is full; writes
/// each one's pattern.
fn fill(pool: &Pool, alloc: &Allocator, tag: u8) -> Vec<VirtAddr> {
    let mut out = Vec::new();
    loop {
        match pool.block_on(alloc.alloc(EXTENT)) {
            Ok(vaddr) => {
                pool.write_persist(vaddr, &pattern(tag, vaddr))
                    .expect("write an allocation");
                out.push(vaddr);
            }
            Err(AllocError::OutOfMemory { .. }) => return out,
            Err(e) => panic!("alloc: {}", pmem_client::error_chain(&e)),
        }
    }
}

/// Extents used per region id.
fn used(pool: &Pool, alloc: &Allocator) -> Vec<(String, u64)> {
    must("usage", pool.block_on(alloc.usage()))
        .regions
        .into_iter()
        .map(|r| (r.region, r.used))
        .collect()
}

fn ids(names: &[&str]) -> Vec<RegionId> {
    names.iter().map(|&n| RegionId::from(n)).collect()
}

#[test]
fn a_pool_formatted_on_two_servers_grows_onto_a_third() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut ports = Ports::new();
    let small: PathBuf = spec(false).write(dir.path(), "ab.toml", &mut ports);
    let daemons = Daemons::start(&small, &["A", "B"], dir.path());

    // Formatted on A and B, filled: A1 keeps 2 extents for metadata, B1 1.
    let p0 = pool(&small, "c0");
    let a0 = must(
        "format",
        p0.block_on(Allocator::format(p0.handle().clone(), false)),
    );
    let before = fill(&p0, &a0, 0xA0);
    assert_eq!(before.len(), 6 + 7, "every data extent of A1 and B1");
    drop((a0, p0));
    daemons.stop();

    // The same servers and data, plus C, on a layout that appends C's regions.
    let grown = spec(true).write(dir.path(), "abc.toml", &mut ports);
    let daemons = Daemons::start(&grown, &["A", "B", "C"], dir.path());
    let (p0, p1) = (pool(&grown, "c0"), pool(&grown, "c1"));
    let a0 = must("attach to the grown pool", attach(&p0));
    let a1 = must("attach to the grown pool", attach(&p1));

    // Both take up the new layout at once: each of C's headers is formatted
    // by exactly one of them; the other finds it formatted or being formatted.
    let (g0, g1): (Growth, Growth) = std::thread::scope(|s| {
        let t0 = s.spawn(|| must("refresh c0", p0.block_on(a0.refresh())));
        let t1 = s.spawn(|| must("refresh c1", p1.block_on(a1.refresh())));
        (t0.join().expect("c0"), t1.join().expect("c1"))
    });
    for region in ids(&["C1", "C2"]) {
        let formatters = [&g0, &g1]
            .iter()
            .filter(|g| g.formatted.contains(&region))
            .count();
        assert_eq!(formatters, 1, "{region} formatted once: {g0:?} {g1:?}");
        let other = if g0.formatted.contains(&region) {
            &g1
        } else {
            &g0
        };
        assert!(
            other.joined.contains(&region) || other.waiting.contains(&region),
            "{region}: {other:?}"
        );
    }
    for g in [&g0, &g1] {
        assert!(g.joined.starts_with(&ids(&["A1", "B1"])), "{g:?}");
        assert!(g.withdrawn.is_empty(), "{g:?}");
    }
    // A region left waiting is joined by the next refresh, not formatted again.
    for (p, a, g) in [(&p0, &a0, &g0), (&p1, &a1, &g1)] {
        let again = must("refresh again", p.block_on(a.refresh()));
        assert!(again.formatted.is_empty(), "{again:?}");
        assert_eq!(again.joined, g.waiting, "{again:?}");
    }

    // A and B are full, so allocations go to C: round-robin, and placed.
    let on_c = fill(&p0, &a0, 0xC0);
    assert_eq!(on_c.len(), 7 + 7, "every data extent of C1 and C2");
    assert_eq!(
        used(&p0, &a0),
        [("A1", 6), ("B1", 7), ("C1", 7), ("C2", 7)]
            .map(|(r, n)| (r.to_owned(), n))
            .to_vec()
    );
    let err = p1
        .block_on(a1.alloc_with(EXTENT, &Placement::Server(ServerId::from("C"))))
        .expect_err("C is full too");
    assert!(matches!(err, AllocError::OutOfMemory { .. }), "{err}");
    must("free on C", p0.block_on(a0.free(on_c[0])));
    let placed = must(
        "alloc placed on C",
        p1.block_on(a1.alloc_with(EXTENT, &Placement::Server(ServerId::from("C")))),
    );
    p1.write_persist(placed, &pattern(0xC1, placed))
        .expect("write on C");

    // Everything allocated before the pool grew, and since, reads back.
    for &vaddr in &before {
        assert_eq!(p1.read(vaddr, 4096).expect("read"), pattern(0xA0, vaddr));
    }
    for &vaddr in &on_c[1..] {
        assert_eq!(p1.read(vaddr, 4096).expect("read"), pattern(0xC0, vaddr));
    }
    assert_eq!(p0.read(placed, 4096).expect("read"), pattern(0xC1, placed));

    // A superblock of the previous format is refused by its version.
    let layout = p0.layout();
    let meta = layout.meta().expect("allocator");
    let mut raw = Conn::connect(ports.server_nic("A", "n0"));
    raw.hello("c0");
    let key = raw.region_key(meta.meta_region().region.0);
    let version_at = PmemAddr(meta.superblock().get() + sb::VERSION);
    let old = (FORMAT_VERSION - 1).to_le_bytes();
    let reply = raw.call(Repr::write(Target::Pmem(version_at), key, &old));
    assert_eq!(reply.status, Status::Ok);
    let err = attach(&p1).expect_err("an older format is refused");
    let message = err.to_string();
    assert!(
        matches!(err, AllocError::OtherFormatVersion { found, .. } if found == FORMAT_VERSION - 1),
        "{message}"
    );
    assert!(
        message.contains(&format!("metadata format version {}", FORMAT_VERSION - 1))
            && message.contains("pmemctl format --force"),
        "{message}"
    );
    daemons.stop();
}
