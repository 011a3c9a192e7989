//! The fabric device's map lookup (`DeviceMap::lookup`, which is
//! `topology::Layout::lookup`) at 10, 1,000 and 1,000,000 regions.
//!
//! Each layout is synthetic: 2 MiB extents, regions of 1 to 4 extents, a gap
//! of 0 to 2 extents before roughly one region in four, spread over 4
//! servers × 2 sockets. Every iteration looks up one address from a
//! pre-generated array of random addresses inside regions, so criterion's
//! time is the time per lookup.
//!
//! - `map_lookup/<n>`: 4,096 addresses, cycled. The cache lines those
//!   lookups touch stay resident, so this measures the lookup's own work
//!   and how it grows with the number of regions (issue 8's target:
//!   1,000,000 regions within 2× of 10).
//! - `map_lookup_cold/1000000`: 4 Mi addresses over the 1,000,000-region
//!   map, so most lookups miss the caches: the figure a device whose
//!   requests spread over the whole pool would see.
//!
//! Smoke run: `cargo bench -p fabric-device --bench map_lookup -- --quick`.

use std::hint::black_box;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use proto::AccessKey;
use topology::{
    CachePolicy, Layout, LayoutEntry, PmemAddr, PmemDeviceId, RegionId, RegionIndex, ServerId,
    SocketId,
};

const EXTENT: u64 = 2 << 20;
const BASE: u64 = 1 << 32;
const WARM_ADDRESSES: usize = 4096;
const COLD_ADDRESSES: usize = 4 << 20;

/// splitmix64: a small, seeded generator, so every run measures the same maps
/// and addresses.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A value in `0..n`.
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// A synthetic map of `regions` regions.
fn layout(regions: usize, rng: &mut Rng) -> Layout {
    let servers: Vec<ServerId> = (0..4).map(|s| ServerId::new(format!("S{s}"))).collect();
    let sockets: Vec<SocketId> = (0..2).map(|s| SocketId::new(format!("{s}"))).collect();
    let device = PmemDeviceId::new("d0");
    let mut cursor = BASE;
    let entries = (0..regions)
        .map(|i| {
            if rng.below(4) == 0 {
                cursor += rng.below(3) * EXTENT;
            }
            let len = (1 + rng.below(4)) * EXTENT;
            let start = cursor;
            cursor += len;
            let server = i % servers.len();
            let socket = (i / servers.len()) % sockets.len();
            LayoutEntry {
                start: PmemAddr(start),
                len,
                region: RegionIndex(0),
                region_id: RegionId::new(format!("R{i}")),
                server: servers[server].clone(),
                server_index: server as u16,
                socket: sockets[socket].clone(),
                socket_index: socket as u16,
                device: device.clone(),
                key: AccessKey(rng.next()),
                cache: CachePolicy::WriteBack,
            }
        })
        .collect();
    Layout::from_entries(EXTENT, entries).expect("synthetic layout is valid")
}

/// `count` random addresses, each inside a random region of `layout`.
fn addresses(layout: &Layout, count: usize, rng: &mut Rng) -> Vec<PmemAddr> {
    let entries = layout.entries();
    (0..count)
        .map(|_| {
            let entry = &entries[rng.below(entries.len() as u64) as usize];
            PmemAddr(entry.start.get() + rng.below(entry.len))
        })
        .collect()
}

/// Benchmarks lookups of `addrs`, one per iteration.
fn bench_lookups(
    c: &mut Criterion,
    group: &str,
    regions: usize,
    layout: &Layout,
    addrs: &[PmemAddr],
) {
    assert!(addrs.len().is_power_of_two());
    let mask = addrs.len() - 1;
    let mut group = c.benchmark_group(group);
    group
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    group.bench_function(BenchmarkId::from_parameter(regions), |b| {
        let mut i = 0;
        b.iter(|| {
            i = (i + 1) & mask;
            let at = layout
                .lookup(black_box(addrs[i]))
                .expect("every benchmark address is mapped");
            (at.offset.region, at.offset.offset)
        });
    });
    group.finish();
}

fn map_lookup(c: &mut Criterion) {
    let mut rng = Rng(0x5eed_0008);
    for regions in [10, 1_000, 1_000_000] {
        let layout = layout(regions, &mut rng);
        let addrs = addresses(&layout, WARM_ADDRESSES, &mut rng);
        bench_lookups(c, "map_lookup", regions, &layout, &addrs);
        if regions == 1_000_000 {
            let cold = addresses(&layout, COLD_ADDRESSES, &mut rng);
            bench_lookups(c, "map_lookup_cold", regions, &layout, &cold);
        }
    }
}

criterion_group!(benches, map_lookup);
criterion_main!(benches);
