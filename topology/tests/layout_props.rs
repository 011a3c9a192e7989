//! Property tests of the PMEM address layout.

use proptest::prelude::*;
use proto::AccessKey;
use topology::{
    ByteSize, CachePolicy, Client, FabricDevice, FabricLink, FabricPort, Layout, LayoutEntry,
    PmemAddr, PmemDevice, PoolSettings, Region, RegionIndex, Rnic, Server, ServerNic, Socket,
    Topology,
};

const EXTENT: u64 = 2 << 20;
const EXPLICIT_SLOT: u64 = 1 << 40;

/// A region: its size in extents, and whether it gets an explicit address.
type RegionSpec = (u64, bool);

/// Builds a valid topology from nested region specs:
/// servers → sockets → devices → regions.
fn build(spec: &[Vec<Vec<Vec<RegionSpec>>>]) -> Topology {
    let mut region_no = 0u64;
    let servers: Vec<Server> = spec
        .iter()
        .enumerate()
        .map(|(si, sockets)| Server {
            id: format!("S{si}").as_str().into(),
            admin: None,
            data_dir: None,
            persistence: Default::default(),
            domain: None,
            sockets: sockets
                .iter()
                .enumerate()
                .map(|(ki, devices)| Socket {
                    id: format!("{ki}").as_str().into(),
                    devices: devices
                        .iter()
                        .enumerate()
                        .map(|(di, regions)| PmemDevice {
                            id: format!("d{di}").as_str().into(),
                            path: None,
                            regions: regions
                                .iter()
                                .map(|&(extents, explicit)| {
                                    region_no += 1;
                                    Region {
                                        id: format!("R{region_no}").as_str().into(),
                                        size: ByteSize(extents * EXTENT),
                                        address: explicit.then_some(region_no * EXPLICIT_SLOT),
                                        cache: Default::default(),
                                        replicas: None,
                                    }
                                })
                                .collect(),
                        })
                        .collect(),
                })
                .collect(),
            nics: vec![ServerNic {
                id: "n0".into(),
                socket: "0".into(),
                listen: format!("127.0.1.{}:7000", si + 1),
                transport: Default::default(),
                rdma_device: None,
            }],
        })
        .collect();
    let links = servers
        .iter()
        .map(|s| FabricLink {
            server: s.id.clone(),
            nic: "n0".into(),
        })
        .collect();
    Topology {
        pool: PoolSettings::default(),
        servers,
        fabric_devices: vec![FabricDevice {
            id: "F".into(),
            admin: None,
            ports: vec![FabricPort {
                id: "p0".into(),
                listen: "127.0.2.1:7100".into(),
                roce: None,
            }],
            links,
        }],
        clients: vec![Client {
            id: "c".into(),
            rnics: vec![Rnic {
                id: "r0".into(),
                fabric_device: "F".into(),
                port: None,
                local_addr: None,
                transport: Default::default(),
                rdma_device: None,
            }],
            allow: vec![],
        }],
        source: "generated".into(),
        overrides: Vec::new(),
    }
}

fn spec_strategy() -> impl Strategy<Value = Vec<Vec<Vec<Vec<RegionSpec>>>>> {
    let region = (1u64..8, prop::bool::weighted(0.2));
    let device = prop::collection::vec(region, 0..4);
    let socket = prop::collection::vec(device, 1..3);
    let server = prop::collection::vec(socket, 1..3);
    prop::collection::vec(server, 1..5)
}

/// The region holding `addr`, found by looking at every entry.
fn linear_lookup(layout: &Layout, addr: u64) -> Option<(u32, u64)> {
    layout
        .entries()
        .iter()
        .find(|e| addr >= e.start.get() && addr < e.start.get() + e.len)
        .map(|e| (e.region.0, addr - e.start.get()))
}

/// A synthetic layout of regions `(start, len)` in this config order.
fn synthetic(extent: u64, spans: &[(u64, u64)]) -> Layout {
    let entries = spans
        .iter()
        .enumerate()
        .map(|(i, &(start, len))| LayoutEntry {
            start: PmemAddr(start),
            len,
            region: RegionIndex(0),
            region_id: format!("R{i}").as_str().into(),
            server: "S".into(),
            server_index: 0,
            socket: "0".into(),
            socket_index: 0,
            device: "d".into(),
            key: AccessKey(i as u64),
            cache: CachePolicy::WriteBack,
        })
        .collect();
    Layout::from_entries(extent, entries).expect("synthetic regions do not overlap")
}

/// Regions `(start, len)` from `(gap, size)` pairs in `unit`s, each size
/// `tail` bytes longer, the whole shuffled by `order`.
fn spans(
    base: u64,
    unit: u64,
    tail: u64,
    shape: &[(u64, u64)],
    order: &[usize],
) -> Vec<(u64, u64)> {
    let mut cursor = base;
    let mut spans: Vec<(u64, u64)> = shape
        .iter()
        .map(|&(gap, size)| {
            let start = cursor + gap * unit;
            let len = size * unit + tail;
            cursor = start + len;
            (start, len)
        })
        .collect();
    let n = spans.len();
    for (i, &j) in order.iter().enumerate().take(n) {
        spans.swap(i, j % n);
    }
    spans
}

proptest! {
    /// Lookups in synthetic layouts agree with a linear scan whether the
    /// layout is extent-aligned and dense (looked up through the extent
    /// table) or not (binary search): lengths one byte past whole extents,
    /// starts a few bytes off, or a 1 TiB gap.
    #[test]
    fn synthetic_lookup_agrees_with_linear_scan(
        extent in prop_oneof![Just(EXTENT), 2u64..10_000],
        base in 0u64..(1 << 50),
        kind in 0u8..4,
        shape in prop::collection::vec((0u64..3, 1u64..5), 1..50),
        order in prop::collection::vec(any::<usize>(), 50),
        probes in prop::collection::vec(any::<u64>(), 16),
    ) {
        let mut spans = spans(base, extent, u64::from(kind == 1), &shape, &order);
        if kind == 2 {
            // The highest region moves 3 bytes up, off the extent grid.
            if let Some(top) = spans.iter_mut().max_by_key(|&&mut (s, _)| s) {
                top.0 += 3;
            }
        }
        if kind == 3 {
            let far = spans.iter().map(|&(s, l)| s + l).max().unwrap_or(base) + (1 << 40);
            spans.push((far, extent));
        }
        let layout = synthetic(extent, &spans);
        let mut addrs = probes;
        for &(s, len) in &spans {
            addrs.extend([s.wrapping_sub(1), s, s + len / 2, s + len - 1, s + len]);
        }
        for addr in addrs {
            let fast = layout.lookup(PmemAddr(addr)).map(|l| (l.offset.region.0, l.offset.offset));
            prop_assert_eq!(fast, linear_lookup(&layout, addr), "addr {:#x}", addr);
        }
    }

    #[test]
    fn layout_is_valid_deterministic_and_disjoint(spec in spec_strategy()) {
        let topology = build(&spec);
        prop_assert!(topology.validate().is_ok(), "{:?}", topology.validate());
        let a = Layout::new(&topology).unwrap();
        let b = Layout::new(&topology.clone()).unwrap();
        prop_assert_eq!(&a, &b);
        prop_assert_eq!(a.digest(), b.digest());
        prop_assert_eq!(a.entries().len(), topology.regions().count());

        let mut previous_end = 0;
        for entry in a.entries_by_address() {
            prop_assert!(entry.start.get() >= previous_end, "overlap at {}", entry.start);
            prop_assert_eq!(entry.start.get() % EXTENT, 0);
            previous_end = entry.end();
        }
        // Config order is kept: region indices follow the walk of the file.
        for (entry, place) in a.entries().iter().zip(topology.regions()) {
            prop_assert_eq!(&entry.region_id, &place.region.id);
            prop_assert_eq!(&entry.server, &place.server.id);
            prop_assert_eq!(&entry.socket, &place.socket.id);
        }
    }

    #[test]
    fn lookup_agrees_with_linear_scan(spec in spec_strategy(), probes in prop::collection::vec(any::<u64>(), 32)) {
        let topology = build(&spec);
        let layout = Layout::new(&topology).unwrap();
        let mut addrs: Vec<u64> = probes;
        for e in layout.entries() {
            let s = e.start.get();
            addrs.extend([s.wrapping_sub(1), s, s + 1, s + e.len / 2, e.end() - 1, e.end()]);
        }
        for addr in addrs {
            let fast = layout.lookup(PmemAddr(addr)).map(|l| (l.offset.region.0, l.offset.offset));
            prop_assert_eq!(fast, linear_lookup(&layout, addr), "addr {:#x}", addr);
            if let Some(location) = layout.lookup(PmemAddr(addr)) {
                prop_assert_eq!(layout.pmem_addr(location.offset), Some(PmemAddr(addr)));
                prop_assert_eq!(location.remaining(), location.entry.len - location.offset.offset);
            }
        }
    }
}

#[test]
fn digest_changes_with_the_layout() {
    let spec = vec![vec![vec![vec![(2, false), (3, false)]]]];
    let base = Layout::new(&build(&spec)).unwrap();
    let bigger = vec![vec![vec![vec![(2, false), (4, false)]]]];
    assert_ne!(
        base.digest(),
        Layout::new(&build(&bigger)).unwrap().digest()
    );
    let mut renamed = build(&spec);
    renamed.servers[0].id = "other".into();
    assert_ne!(base.digest(), Layout::new(&renamed).unwrap().digest());
    let mut rekeyed = Layout::new(&build(&spec)).unwrap();
    rekeyed.set_key(topology::RegionIndex(0), AccessKey(7));
    assert_eq!(
        base.digest(),
        rekeyed.digest(),
        "keys are not part of the public layout"
    );
}

#[test]
fn auto_placement_skips_explicit_regions() {
    let mut t = build(&[vec![vec![vec![(1, false), (1, false), (1, false)]]]]);
    // Pin the third region right where the second would go.
    let second_start = PoolSettings::DEFAULT_BASE_ADDRESS + EXTENT;
    t.servers[0].sockets[0].devices[0].regions[2].address = Some(second_start);
    assert!(t.validate().is_ok(), "{:?}", t.validate());
    let layout = Layout::new(&t).unwrap();
    let starts: Vec<u64> = layout.entries().iter().map(|e| e.start.get()).collect();
    assert_eq!(
        starts,
        vec![
            PoolSettings::DEFAULT_BASE_ADDRESS,
            second_start + EXTENT,
            second_start
        ]
    );
}
