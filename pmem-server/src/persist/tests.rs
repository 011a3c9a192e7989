//! Tests of [`PmemMap`] over every mode this machine can run.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use tempfile::TempDir;
use topology::CachePolicy;

use super::{PersistError, PersistMode, PersistPolicy, PmemMap};

const PAGE: usize = 4096;
const LINE: usize = 64;
const CACHE_POLICIES: [CachePolicy; 2] = [CachePolicy::WriteBack, CachePolicy::NonTemporal];

/// A zero-filled file of `len` bytes in `dir`.
fn region_file(dir: &TempDir, name: &str, len: u64) -> PathBuf {
    let path = dir.path().join(name);
    let file = std::fs::File::create(&path).expect("create region file");
    file.set_len(len).expect("size region file");
    path
}

/// Every way this build and machine can map `path`, labelled: msync, DAX
/// when the filesystem has it, the DAX code paths over a plain shared mapping
/// (so they run on any x86_64 machine), and libpmem with the feature.
fn all_maps(path: &Path) -> Vec<(&'static str, PmemMap)> {
    let mut maps = vec![(
        "msync",
        PmemMap::open(path, &PersistPolicy::Msync).expect("msync map"),
    )];
    if cfg!(target_arch = "x86_64") {
        maps.push((
            "dax-code-paths",
            PmemMap::open_dax_without_map_sync(path).expect("shared map"),
        ));
    }
    if let Ok(map) = PmemMap::open(path, &PersistPolicy::Dax) {
        maps.push(("dax", map));
    }
    if cfg!(feature = "libpmem") {
        maps.push((
            "libpmem",
            PmemMap::open(path, &PersistPolicy::Libpmem).expect("libpmem map"),
        ));
    }
    maps
}

fn whole(map: &PmemMap) -> Vec<u8> {
    let mut contents = vec![0; map.len()];
    map.read(0, &mut contents).expect("read whole mapping");
    contents
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) | 1)
        .collect()
}

#[test]
fn auto_picks_dax_or_msync_and_forced_dax_explains_failure() {
    let dir = TempDir::new().expect("temp dir");
    let path = region_file(&dir, "auto", 1 << 20);
    let auto = PmemMap::open(&path, &PersistPolicy::Auto).expect("auto map");
    assert!(matches!(auto.mode(), PersistMode::Dax | PersistMode::Msync));
    assert_eq!(auto.len(), 1 << 20);
    assert!(!auto.is_empty());

    match PmemMap::open(&path, &PersistPolicy::Dax) {
        Ok(dax) => {
            assert_eq!(dax.mode(), PersistMode::Dax);
            assert_eq!(auto.mode(), PersistMode::Dax);
        }
        Err(PersistError::DaxUnsupported {
            path: reported,
            source,
        }) => {
            assert_eq!(reported, path);
            let errno = source.raw_os_error();
            assert!(
                errno == Some(libc::EOPNOTSUPP)
                    || errno == Some(libc::EINVAL)
                    || source.kind() == io::ErrorKind::Unsupported,
                "unexpected cause {source:?}"
            );
            assert_eq!(auto.mode(), PersistMode::Msync);
            let message = PersistError::DaxUnsupported {
                path: reported,
                source,
            }
            .to_string();
            assert!(message.contains(&*path.to_string_lossy()), "{message}");
        }
        Err(other) => panic!("forced DAX failed unexpectedly: {other:?}"),
    }
}

#[test]
fn forced_msync_and_libpmem_policies() {
    let dir = TempDir::new().expect("temp dir");
    let path = region_file(&dir, "forced", 3 * PAGE as u64);
    let map = PmemMap::open(&path, &PersistPolicy::Msync).expect("msync map");
    assert_eq!(map.mode(), PersistMode::Msync);
    assert_eq!(map.path(), path);
    let libpmem = PmemMap::open(&path, &PersistPolicy::Libpmem);
    if cfg!(feature = "libpmem") {
        let map = libpmem.expect("libpmem map");
        assert_eq!(map.mode(), PersistMode::Libpmem);
        assert_eq!(map.len(), 3 * PAGE);
    } else {
        assert!(
            matches!(libpmem, Err(PersistError::LibpmemDisabled)),
            "{libpmem:?}"
        );
    }
}

#[test]
fn empty_and_missing_files_are_refused() {
    let dir = TempDir::new().expect("temp dir");
    let empty = region_file(&dir, "empty", 0);
    let missing = dir.path().join("missing");
    for configured in topology::Persistence::ALL {
        let policy = PersistPolicy::from(configured);
        let libpmem = configured == topology::Persistence::Libpmem;
        match PmemMap::open(&empty, &policy) {
            Err(PersistError::EmptyFile { path }) => assert_eq!(path, empty),
            Err(PersistError::LibpmemDisabled) => assert!(libpmem),
            other => panic!("{configured}: empty file gave {other:?}"),
        }
        match PmemMap::open(&missing, &policy) {
            Err(PersistError::Map { path, source }) => {
                assert_eq!(path, missing);
                assert_eq!(source.kind(), io::ErrorKind::NotFound);
            }
            Err(PersistError::LibpmemDisabled) => assert!(libpmem),
            other => panic!("{configured}: missing file gave {other:?}"),
        }
    }
}

#[test]
fn round_trips_at_unaligned_offsets_and_lengths() {
    const LEN: usize = 4 * PAGE;
    let dir = TempDir::new().expect("temp dir");
    let path = region_file(&dir, "round-trip", LEN as u64);
    let offsets = [
        0,
        1,
        LINE - 1,
        LINE,
        LINE + 3,
        2 * LINE - 5,
        PAGE - 100,
        PAGE - 1,
        PAGE,
        PAGE + 7,
        2 * PAGE - LINE - 1,
        LEN - 200,
        LEN - 1,
    ];
    for (label, map) in all_maps(&path) {
        let mut model = whole(&map);
        let mut seed = 0u8;
        for cache in CACHE_POLICIES {
            for &offset in &offsets {
                for len in 1..=200usize {
                    if offset + len > LEN {
                        continue;
                    }
                    seed = seed.wrapping_add(1);
                    let data = pattern(len, seed);
                    // Persist a sample only: msync makes each one slow.
                    if len % 50 == 0 {
                        map.write_persist(offset, &data, cache)
                            .expect("write_persist");
                    } else {
                        map.write(offset, &data, cache).expect("write");
                    }
                    model[offset..offset + len].copy_from_slice(&data);
                    let mut back = vec![0; len];
                    map.read(offset, &mut back).expect("read");
                    assert_eq!(back, data, "{label} {cache:?} offset {offset} len {len}");
                }
                // Nothing outside the written ranges changed.
                assert_eq!(
                    whole(&map),
                    model,
                    "{label} {cache:?} after offset {offset}"
                );
            }
        }
        map.persist_all().expect("persist_all");
    }
}

#[test]
fn empty_accesses_are_allowed_up_to_the_end() {
    let dir = TempDir::new().expect("temp dir");
    let path = region_file(&dir, "empty-access", PAGE as u64);
    for (label, map) in all_maps(&path) {
        for offset in [0, 1, PAGE - 1, PAGE] {
            map.read(offset, &mut []).expect(label);
            map.write(offset, &[], CachePolicy::NonTemporal)
                .expect(label);
            map.write_persist(offset, &[], CachePolicy::WriteBack)
                .expect(label);
            map.persist(offset, 0).expect(label);
        }
    }
}

#[test]
fn persists_ranges_at_both_ends() {
    const LEN: usize = 8 * PAGE;
    let dir = TempDir::new().expect("temp dir");
    let path = region_file(&dir, "ends", LEN as u64);
    for (label, map) in all_maps(&path) {
        for (offset, len) in [
            (0, 1),
            (0, LINE),
            (0, PAGE + 1),
            (0, LEN),
            (1, LEN - 1),
            (LEN - 1, 1),
            (LEN - 7, 7),
            (LEN - PAGE - 3, PAGE + 3),
            (LEN - LINE, LINE),
        ] {
            map.write(offset, &pattern(len, 9), CachePolicy::WriteBack)
                .expect("write");
            map.persist(offset, len)
                .unwrap_or_else(|e| panic!("{label}: persist({offset}, {len}): {e}"));
        }
        map.persist_all().expect("persist_all");
    }
}

#[test]
fn out_of_bounds_and_overflow_are_rejected_without_touching_memory() {
    const LEN: usize = 2 * PAGE;
    let dir = TempDir::new().expect("temp dir");
    let path = region_file(&dir, "bounds", LEN as u64);
    for (label, map) in all_maps(&path) {
        let before = whole(&map);
        let cases: [(usize, usize); 8] = [
            (LEN, 1),
            (LEN + 1, 0),
            (LEN - 1, 2),
            (0, LEN + 1),
            (usize::MAX, 1),
            (usize::MAX - 3, 8),
            (usize::MAX, 0),
            (PAGE, usize::MAX - PAGE + 1),
        ];
        for (offset, len) in cases {
            let expect_oob = |result: Result<(), PersistError>, what: &str| match result {
                Err(PersistError::OutOfBounds {
                    offset: o,
                    len: l,
                    map_len,
                }) => {
                    assert_eq!((o, l, map_len), (offset, len, LEN), "{label} {what}");
                }
                other => panic!("{label} {what}({offset}, {len}) gave {other:?}"),
            };
            expect_oob(map.persist(offset, len), "persist");
            // Buffers cannot be usize::MAX long; check those paths with the
            // lengths a buffer can have.
            if len <= 2 * LEN {
                let src = vec![0xEEu8; len];
                for cache in CACHE_POLICIES {
                    expect_oob(map.write(offset, &src, cache), "write");
                    expect_oob(map.write_persist(offset, &src, cache), "write_persist");
                }
                let mut dst = vec![0x11u8; len];
                expect_oob(map.read(offset, &mut dst), "read");
                assert!(dst.iter().all(|&b| b == 0x11), "{label}: read filled dst");
            }
        }
        assert_eq!(whole(&map), before, "{label}: rejected writes changed data");
    }
}

#[test]
fn atomic_word_must_be_aligned_and_inside() {
    const LEN: usize = PAGE;
    let dir = TempDir::new().expect("temp dir");
    let path = region_file(&dir, "atomic-bounds", LEN as u64);
    for (label, map) in all_maps(&path) {
        for offset in [1, 4, 7, 12, LEN - 4, usize::MAX] {
            assert!(
                matches!(map.atomic_u64(offset), Err(PersistError::Misaligned { offset: o }) if o == offset),
                "{label}: offset {offset}"
            );
        }
        for offset in [LEN, LEN + 8, usize::MAX - 7] {
            assert!(
                matches!(
                    map.atomic_u64(offset),
                    Err(PersistError::OutOfBounds { offset: o, len: 8, map_len: LEN }) if o == offset
                ),
                "{label}: offset {offset}"
            );
        }
        let last = map.atomic_u64(LEN - 8).expect("last word");
        last.store(0x0102_0304_0506_0708, Ordering::SeqCst);
        map.persist(LEN - 8, 8).expect("persist word");
        let mut bytes = [0u8; 8];
        map.read(LEN - 8, &mut bytes).expect("read word");
        assert_eq!(u64::from_ne_bytes(bytes), 0x0102_0304_0506_0708, "{label}");
        // The maps share one file: start from a known value.
        let first = map.atomic_u64(0).expect("first word");
        first.store(0, Ordering::SeqCst);
        assert_eq!(
            first.compare_exchange(0, 5, Ordering::SeqCst, Ordering::SeqCst),
            Ok(0)
        );
        assert_eq!(
            first.compare_exchange(0, 6, Ordering::SeqCst, Ordering::SeqCst),
            Err(5)
        );
    }
}

#[test]
fn concurrent_fetch_add_sums_exactly() {
    const THREADS: u64 = 2;
    const ADDS: u64 = 100_000;
    let dir = TempDir::new().expect("temp dir");
    let path = region_file(&dir, "fetch-add", PAGE as u64);
    for (label, map) in all_maps(&path) {
        let offset = 64;
        // The maps share one file: start from zero.
        map.atomic_u64(offset)
            .expect("word")
            .store(0, Ordering::SeqCst);
        std::thread::scope(|scope| {
            for _ in 0..THREADS {
                scope.spawn(|| {
                    let word = map.atomic_u64(offset).expect("word");
                    for _ in 0..ADDS {
                        word.fetch_add(1, Ordering::AcqRel);
                    }
                });
            }
        });
        map.persist(offset, 8).expect("persist");
        let total = map.atomic_u64(offset).expect("word").load(Ordering::SeqCst);
        assert_eq!(total, THREADS * ADDS, "{label}");
        let mut neighbours = [0u8; 16];
        map.read(offset - 8, &mut neighbours[..8])
            .expect("read before");
        map.read(offset + 8, &mut neighbours[8..])
            .expect("read after");
        assert_eq!(neighbours, [0; 16], "{label}");
    }
}

#[test]
fn concurrent_disjoint_writes_all_land() {
    const THREADS: usize = 4;
    const SLICE: usize = 3 * PAGE + 17;
    let dir = TempDir::new().expect("temp dir");
    let path = region_file(&dir, "disjoint", (THREADS * SLICE) as u64);
    for (label, map) in all_maps(&path) {
        std::thread::scope(|scope| {
            for t in 0..THREADS {
                let map = &map;
                scope.spawn(move || {
                    let cache = CACHE_POLICIES[t % 2];
                    let mut offset = t * SLICE;
                    let end = offset + SLICE;
                    let mut round = 0u8;
                    while offset < end {
                        let len = (37 + 13 * usize::from(round)).min(end - offset);
                        map.write(offset, &pattern(len, t as u8), cache)
                            .expect("write");
                        offset += len;
                        round = round.wrapping_add(1);
                    }
                    map.persist(t * SLICE, SLICE).expect("persist");
                });
            }
        });
        let contents = whole(&map);
        for t in 0..THREADS {
            let slice = &contents[t * SLICE..(t + 1) * SLICE];
            let mut offset = 0;
            let mut round = 0u8;
            while offset < SLICE {
                let len = (37 + 13 * usize::from(round)).min(SLICE - offset);
                assert_eq!(
                    &slice[offset..offset + len],
                    &pattern(len, t as u8)[..],
                    "{label} thread {t}"
                );
                offset += len;
                round = round.wrapping_add(1);
            }
        }
    }
}

/// write_persist, drop the map, read the file back: the bytes reached the
/// file (the page cache, at least; msync then put them on the disk).
#[test]
fn write_persist_survives_unmapping() {
    const LEN: usize = 5 * PAGE;
    let dir = TempDir::new().expect("temp dir");
    let path = region_file(&dir, "durable", LEN as u64);
    let writes = [
        (0, 100),
        (PAGE - 3, 10),
        (2 * PAGE + 5, PAGE + 1),
        (LEN - 33, 33),
    ];
    let mut expected = vec![0u8; LEN];
    let policies: &[PersistPolicy] = if cfg!(feature = "libpmem") {
        &[
            PersistPolicy::Msync,
            PersistPolicy::Auto,
            PersistPolicy::Libpmem,
        ]
    } else {
        &[PersistPolicy::Msync, PersistPolicy::Auto]
    };
    for (round, policy) in policies.iter().enumerate() {
        for cache in CACHE_POLICIES {
            let map = PmemMap::open(&path, policy).expect("map");
            for (i, &(offset, len)) in writes.iter().enumerate() {
                let data = pattern(len, (round * 16 + i) as u8 + cache as u8 * 8);
                map.write_persist(offset, &data, cache)
                    .expect("write_persist");
                expected[offset..offset + len].copy_from_slice(&data);
            }
            drop(map);
            let on_file = std::fs::read(&path).expect("read file");
            assert_eq!(on_file, expected, "{policy:?} {cache:?}");
            let reopened = PmemMap::open(&path, policy).expect("reopen");
            assert_eq!(whole(&reopened), expected, "{policy:?} {cache:?} reopened");
        }
    }
}

#[cfg(feature = "libpmem")]
#[test]
fn libpmem_reports_pmem_as_forced() {
    let dir = TempDir::new().expect("temp dir");
    let path = region_file(&dir, "libpmem-force", PAGE as u64);
    let map = PmemMap::open(&path, &PersistPolicy::Libpmem).expect("libpmem map");
    assert_eq!(map.mode(), PersistMode::Libpmem);
    let is_pmem = map.libpmem_is_pmem().expect("libpmem mapping");
    match std::env::var("PMEM_IS_PMEM_FORCE").as_deref() {
        Ok("1") => assert!(is_pmem),
        Ok("0") => assert!(!is_pmem),
        _ => {}
    }
}

/// Times 4 KiB `write_persist` in every available mode. Run with
/// `cargo test --release -p pmem-server --lib persist_latency -- --ignored --nocapture`
/// (add `--features libpmem` and `PMEM_IS_PMEM_FORCE=1` for libpmem).
#[test]
#[ignore = "measurement; prints figures"]
fn persist_latency_4k() {
    const ITERATIONS: usize = 2000;
    const WARMUP: usize = 100;
    const SIZE: usize = 4096;
    const FILE: usize = 16 << 20;
    let dir = TempDir::new().expect("temp dir");
    // A fully written (not sparse) and synced file, so no iteration pays
    // for block allocation.
    let path = dir.path().join("latency");
    std::fs::write(&path, vec![0x5Au8; FILE]).expect("write file");
    std::fs::File::open(&path)
        .and_then(|f| f.sync_all())
        .expect("sync file");
    let data = pattern(SIZE, 42);
    println!(
        "4 KiB write_persist, {ITERATIONS} iterations, {} MiB file in {}",
        FILE >> 20,
        dir.path().display()
    );
    println!(
        "{:<60} {:>10} {:>10} {:>10}",
        "mode / cache policy", "p50", "p90", "p99"
    );
    for (label, map) in all_maps(&path) {
        let label = match label {
            "dax-code-paths" => "dax code paths on page cache (NOT durable)",
            "libpmem" if std::env::var("PMEM_IS_PMEM_FORCE").as_deref() == Ok("1") => {
                "libpmem, PMEM_IS_PMEM_FORCE=1 (NOT durable)"
            }
            other => other,
        };
        for cache in CACHE_POLICIES {
            let mut samples: Vec<Duration> = Vec::with_capacity(ITERATIONS);
            for i in 0..WARMUP + ITERATIONS {
                // Walk the file page by page (then wrap), aligned.
                let offset = (i * SIZE) % FILE;
                let start = Instant::now();
                map.write_persist(offset, &data, cache)
                    .expect("write_persist");
                let elapsed = start.elapsed();
                if i >= WARMUP {
                    samples.push(elapsed);
                }
            }
            samples.sort_unstable();
            let at = |q: f64| samples[((samples.len() as f64 * q) as usize).min(samples.len() - 1)];
            println!(
                "{:<60} {:>10.1?} {:>10.1?} {:>10.1?}",
                format!("{label} / {cache:?}"),
                at(0.50),
                at(0.90),
                at(0.99)
            );
        }
    }
}

/// The file's bytes, which in the emulated domain are the durable image.
fn durable(path: &Path) -> Vec<u8> {
    std::fs::read(path).expect("read the durable image")
}

#[test]
fn emulated_keeps_persisted_lines_and_loses_the_rest() {
    let dir = TempDir::new().expect("temp dir");
    let path = region_file(&dir, "emulated", 2 * PAGE as u64);
    let domain = super::PowerDomain::new();
    let map = PmemMap::open(&path, &PersistPolicy::Emulated(domain.clone())).expect("map");
    assert_eq!(map.mode(), PersistMode::Emulated);
    map.write(0, &[1; 100], CachePolicy::WriteBack)
        .expect("write");
    map.write(PAGE, &[2; 8], CachePolicy::WriteBack)
        .expect("write");
    assert_eq!(durable(&path), vec![0; 2 * PAGE], "stores stay volatile");
    // Persisting one byte writes back its whole line, and only that line.
    map.persist(10, 1).expect("persist");
    let image = durable(&path);
    assert_eq!(image[..LINE], [1; LINE]);
    assert_eq!(
        image[LINE..100],
        [0; 100 - LINE],
        "the next line is not flushed"
    );
    assert_eq!(image[PAGE..PAGE + 8], [0; 8]);
    map.write_persist(PAGE + 8, &[3; 8], CachePolicy::NonTemporal)
        .expect("write_persist");
    assert_eq!(durable(&path)[PAGE..PAGE + 16], [[2; 8], [3; 8]].concat());
    assert_eq!(domain.steps(), 2);
    // What a read returns is the volatile view; unmapping loses the rest,
    // as a power cut does.
    assert_eq!(whole(&map)[64..100], [1; 36]);
    drop(map);
    let reopened =
        PmemMap::open(&path, &PersistPolicy::Emulated(super::PowerDomain::new())).expect("reopen");
    assert_eq!(
        whole(&reopened)[64..100],
        [0; 36],
        "unpersisted bytes are lost"
    );
    assert_eq!(
        whole(&reopened)[..LINE],
        [1; LINE],
        "persisted bytes are kept"
    );
}

#[test]
fn emulated_power_cut_stops_persisting() {
    let dir = TempDir::new().expect("temp dir");
    let path = region_file(&dir, "cut", PAGE as u64);
    let domain = super::PowerDomain::new();
    let map = PmemMap::open(&path, &PersistPolicy::Emulated(domain.clone())).expect("map");
    domain.cut_after(1, None);
    map.write_persist(0, &[7; 8], CachePolicy::WriteBack)
        .expect("first step");
    assert!(domain.is_on());
    map.write_persist(8, &[8; 8], CachePolicy::WriteBack)
        .expect("after the cut persists succeed and do nothing");
    assert!(!domain.is_on());
    assert_eq!(domain.steps(), 1);
    let image = durable(&path);
    assert_eq!(image[..8], [7; 8]);
    assert_eq!(image[8..16], [0; 8], "persisted after the power went off");
}

#[test]
fn emulated_eviction_writes_back_whole_words_of_dirty_lines_only() {
    const WORDS: usize = PAGE / 8;
    let dir = TempDir::new().expect("temp dir");
    let path = region_file(&dir, "evict", 2 * PAGE as u64);
    let domain = super::PowerDomain::new();
    let map = PmemMap::open(&path, &PersistPolicy::Emulated(domain.clone())).expect("map");
    for word in 0..WORDS {
        let value = u64::MAX - word as u64;
        map.write(word * 8, &value.to_le_bytes(), CachePolicy::WriteBack)
            .expect("write");
    }
    // A second page whose stores were all persisted, then overwritten by
    // atomics that were not.
    map.write_persist(PAGE, &[5; PAGE], CachePolicy::WriteBack)
        .expect("write_persist");
    for word in 0..WORDS {
        let atomic = map.atomic_u64(PAGE + word * 8).expect("word");
        atomic.store(u64::MAX, Ordering::SeqCst);
    }
    domain.cut_now(Some(42));
    let image = durable(&path);
    let mut evicted = 0;
    for (word, bytes) in image[..PAGE].chunks(8).enumerate() {
        let value = u64::from_le_bytes(bytes.try_into().expect("8 bytes"));
        match value {
            0 => {}
            v if v == u64::MAX - word as u64 => evicted += 1,
            torn => panic!("word {word} is torn: {torn:#x}"),
        }
    }
    assert!(
        evicted > WORDS / 4 && evicted < 3 * WORDS / 4,
        "{evicted} of {WORDS}"
    );
    for (word, bytes) in image[PAGE..].chunks(8).enumerate() {
        assert!(
            bytes == [5; 8] || bytes == [0xff; 8],
            "atomic word {word} is torn: {bytes:?}"
        );
    }
}

/// Dirty page-cache pages of `file`, from cachestat(2) (Linux 6.5).
fn dirty_pages(path: &Path) -> u64 {
    use std::os::fd::AsRawFd;
    #[repr(C)]
    struct Range {
        off: u64,
        len: u64,
    }
    #[repr(C)]
    #[derive(Default)]
    struct Stat {
        cache: u64,
        dirty: u64,
        writeback: u64,
        evicted: u64,
        recently_evicted: u64,
    }
    const SYS_CACHESTAT: libc::c_long = 451;
    let file = std::fs::File::open(path).expect("open for cachestat");
    let range = Range { off: 0, len: 0 };
    let mut stat = Stat::default();
    // SAFETY: cachestat reads `range` and writes `stat`, both live and laid
    // out as the kernel's structs; the descriptor is open.
    let rc = unsafe {
        libc::syscall(
            SYS_CACHESTAT,
            file.as_raw_fd(),
            &raw const range,
            &raw mut stat,
            0,
        )
    };
    assert_eq!(
        rc,
        0,
        "cachestat(2) failed: {} (this test needs Linux 6.5 or later)",
        io::Error::last_os_error()
    );
    stat.dirty + stat.writeback
}

/// The flush of the msync (and libpmem-on-files) mechanism is observable:
/// pages written through the mapping are dirty in the page cache, which a
/// power cut loses, until persist writes them to the disk.
#[test]
fn msync_persist_leaves_no_dirty_pages() {
    let dir = TempDir::new().expect("temp dir");
    let path = region_file(&dir, "dirty", 8 * PAGE as u64);
    let mut policies = vec![PersistPolicy::Msync];
    if cfg!(feature = "libpmem") && std::env::var("PMEM_IS_PMEM_FORCE").as_deref() != Ok("1") {
        policies.push(PersistPolicy::Libpmem);
    }
    for policy in policies {
        let map = PmemMap::open(&path, &policy).expect("map");
        map.write(PAGE + 5, &pattern(3 * PAGE, 9), CachePolicy::WriteBack)
            .expect("write");
        assert!(
            dirty_pages(&path) >= 3,
            "{policy:?}: the write dirtied pages"
        );
        map.persist(PAGE + 5, 3 * PAGE).expect("persist");
        assert_eq!(
            dirty_pages(&path),
            0,
            "{policy:?}: persist left dirty pages"
        );
        map.write_persist(0, &pattern(100, 3), CachePolicy::NonTemporal)
            .expect("write_persist");
        assert_eq!(
            dirty_pages(&path),
            0,
            "{policy:?}: write_persist left dirty pages"
        );
    }
}

#[test]
fn the_power_cut_exit_status_is_the_one_tests_expect() {
    assert_eq!(super::POWER_CUT_EXIT, testkit::EMULATED_POWER_CUT_EXIT);
}
