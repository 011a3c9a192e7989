//! Memory a tenant gets is its own, on an authenticated fabric of real
//! daemons: an allocation never shows what a previous owner wrote (the
//! server zeroes an extent as its key is installed), and only the owner
//! frees or removes its allocations and named objects, whether the other
//! client asks through `pmemctl` or speaks the protocol directly to the
//! servers (or through its fabric device) to skip the client library.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use pmem_client::records::{self, PtEntry};
use proto::Status;
use proto::hello::Role;
use proto::request::{Repr, Target};
use testkit::{Conn, Daemon, FabricSpec, Ports};
use topology::secrets::{Principal, write_key};
use topology::{Layout, MetaLayout, PmemAddr, VirtAddr};

const SECRET: &str = "TOP-SECRET-PASSWORD";
const C1_KEY: [u8; 32] = [0xC1; 32];
const C2_KEY: [u8; 32] = [0xC2; 32];

/// Servers A and B, device F, clients c1 and c2, 2 MiB extents and keys
/// for everyone. A1 keeps two extents for metadata, B1 one: five data
/// extents in all.
struct Fabric {
    _dir: tempfile::TempDir,
    config: PathBuf,
    secrets: PathBuf,
    ports: Ports,
    servers: Vec<Daemon>,
    _device: Daemon,
}

impl Fabric {
    fn start() -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut spec = FabricSpec::new()
            .server("A", &[("A1", "8MiB")])
            .server("B", &[("B1", "8MiB")])
            .device("F")
            .client("c1")
            .client("c2")
            .allocator("");
        spec.extent_size = "2MiB".to_owned();
        let mut ports = Ports::new();
        let config = spec.write(dir.path(), "topology.toml", &mut ports);
        let secrets = dir.path().join("secrets");
        write_key(&secrets, Principal::Device("F"), &[0x11; 32]).expect("key");
        write_key(&secrets, Principal::Client("c1"), &C1_KEY).expect("key");
        write_key(&secrets, Principal::Client("c2"), &C2_KEY).expect("key");
        let with_secrets = ["--secrets", secrets.to_str().expect("path")];
        let servers = ["A", "B"]
            .iter()
            .map(|s| {
                testkit::pmem_server(&config, s, &dir.path().join(s), &with_secrets)
                    .unwrap_or_else(|e| panic!("pmem-server {s} did not start:\n{e}"))
            })
            .collect();
        let device = testkit::fabric_device(&config, "F", &with_secrets)
            .unwrap_or_else(|e| panic!("fabric-device did not start:\n{e}"));
        device.wait_links_up(2);
        let fabric = Self {
            _dir: dir,
            config,
            secrets,
            ports,
            servers,
            _device: device,
        };
        fabric.ok("c1", &["format"]);
        fabric
    }

    /// Runs pmemctl as `client`.
    fn run(&self, client: &str, args: &[&str]) -> std::process::Output {
        Command::new(env!("CARGO_BIN_EXE_pmemctl"))
            .arg("--config")
            .arg(&self.config)
            .arg("--secrets")
            .arg(&self.secrets)
            .args(["--client", client, "--op-timeout-ms", "10000"])
            .args(args)
            .output()
            .expect("run pmemctl")
    }

    /// Runs pmemctl as `client`; it must succeed; returns its stdout.
    fn ok(&self, client: &str, args: &[&str]) -> String {
        let out = self.run(client, args);
        assert!(
            out.status.success(),
            "pmemctl --client {client} {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Runs pmemctl as `client`; it must fail; returns its stderr.
    fn refused(&self, client: &str, args: &[&str]) -> String {
        let out = self.run(client, args);
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
        stderr
    }

    /// Allocates `size` bytes as `client` (named `name`); the address.
    fn alloc(&self, client: &str, size: &str, name: Option<&str>) -> u64 {
        let mut args = vec!["alloc", size];
        if let Some(name) = name {
            args.extend(["--name", name]);
        }
        last_addr(&self.ok(client, &args))
    }

    /// A raw connection to server `server`, authenticated as client c2.
    fn c2_at_server(&self, server: &str) -> Conn {
        let mut conn = Conn::connect(self.ports.server_nic(server, "n0"));
        conn.authenticate(Role::Client, "c2", C2_KEY)
            .expect("c2 proves its key to the server");
        conn
    }

    /// A raw connection to device F's client port, authenticated as c2.
    fn c2_at_device(&self) -> Conn {
        let mut conn = Conn::connect(self.ports.device_port("F", "p0"));
        conn.authenticate(Role::Client, "c2", C2_KEY)
            .expect("c2 proves its key to the device");
        conn
    }

    fn layout(&self) -> Layout {
        testkit::layout(&self.config)
    }

    fn metrics(&self, server: usize) -> String {
        telemetry::http_get(
            self.servers[server].addr("admin"),
            "/metrics",
            Duration::from_secs(5),
        )
        .expect("metrics")
        .1
    }
}

/// The address at the end of `alloc`'s line.
fn last_addr(line: &str) -> u64 {
    let word = line.split_whitespace().last().expect("an address");
    u64::from_str_radix(word.trim_start_matches("0x"), 16).expect("hex address")
}

/// The bytes of a `pmemctl read` hex dump.
fn dumped(text: &str) -> Vec<u8> {
    text.lines()
        .flat_map(|line| {
            line.split_whitespace()
                .skip(1)
                .take_while(|w| w.len() == 2 && !w.starts_with('|'))
                .filter_map(|w| u8::from_str_radix(w, 16).ok())
                .collect::<Vec<_>>()
        })
        .collect()
}

fn meta(layout: &Layout) -> &MetaLayout {
    layout.meta().expect("the pool has an allocator")
}

#[test]
fn an_allocation_after_another_tenants_free_reads_zeroes() {
    let fabric = Fabric::start();
    // The steps: c1 keeps a secret in 2 MiB and removes it.
    let secret = fabric.alloc("c1", "2MiB", Some("secret"));
    fabric.ok(
        "c1",
        &["write", &format!("{secret:#x}"), SECRET, "--persist"],
    );
    let back = fabric.ok("c1", &["read", &format!("{secret:#x}"), "19"]);
    assert_eq!(dumped(&back), SECRET.as_bytes(), "{back}");
    // Where the secret lives, as the page table says (c2 may read it).
    let layout = fabric.layout();
    let meta = meta(&layout);
    let index = records::vextent_of(meta, VirtAddr(secret)).expect("in the page table");
    let server = |region| layout.entry(region).expect("region").server.to_string();
    let mut raw = fabric.c2_at_server(&server(meta.meta_region().region));
    let meta_key = raw.region_key(meta.meta_region().region.0);
    let entry_at = Target::Pmem(meta.page_table_entry(index));
    let read = raw.call(Repr::read(entry_at, meta_key, 32));
    let pmem = PtEntry::decode(&read.data).expect("entry").pmem;
    fabric.ok("c1", &["rm", "secret"]);

    // Freed, the extent opens to no key: not even the region key reads it.
    let region = layout.lookup(PmemAddr(pmem)).expect("extent").offset.region;
    let mut at_extent = fabric.c2_at_server(&server(region));
    let region_key = at_extent.region_key(region.0);
    let peek = at_extent.call(Repr::read(Target::Pmem(PmemAddr(pmem)), region_key, 19));
    assert_eq!(peek.status, Status::AccessDenied, "{:?}", peek.data);

    // c2 takes every extent there is: one of them held the secret.
    let mut taken = Vec::new();
    loop {
        let out = fabric.run("c2", &["alloc", "2MiB"]);
        if !out.status.success() {
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(stderr.contains("out of memory"), "{stderr}");
            break;
        }
        taken.push(last_addr(&String::from_utf8_lossy(&out.stdout)));
    }
    assert_eq!(taken.len(), 5, "every data extent");
    for at in taken {
        let text = fabric.ok("c2", &["read", &format!("{at:#x}"), "64"]);
        let bytes = dumped(&text);
        assert_eq!(bytes.len(), 64, "{text}");
        assert!(
            bytes.iter().all(|&b| b == 0),
            "c2's new allocation at {at:#x} shows old bytes:\n{text}"
        );
    }
    let zeroed: f64 = (0..2)
        .filter_map(|s| {
            telemetry::metric_sum(&fabric.metrics(s), "pmem_server_extents_zeroed_total", "")
        })
        .sum();
    assert_eq!(zeroed, 6.0, "one zeroing per allocation");
}

#[test]
fn only_the_owner_frees_or_removes_even_through_raw_requests() {
    let fabric = Fabric::start();
    let plain = fabric.alloc("c1", "2MiB", None);
    let named = fabric.alloc("c1", "2MiB", Some("doc"));
    for at in [plain, named] {
        fabric.ok(
            "c1",
            &["write", &format!("{at:#x}"), "c1-data", "--persist"],
        );
    }
    let ls = fabric.ok("c2", &["ls"]);
    assert!(
        ls.lines()
            .any(|l| l.starts_with("doc") && l.contains(" c1 ")),
        "{ls}"
    );

    // Through pmemctl: refused, saying whose it is.
    let stderr = fabric.refused("c2", &["free", &format!("{plain:#x}")]);
    assert!(stderr.contains("belongs to client number 0"), "{stderr}");
    assert!(stderr.contains("run it as c1 (`--client c1`)"), "{stderr}");
    let stderr = fabric.refused("c2", &["rm", "doc"]);
    assert!(
        stderr.contains("named object \"doc\" belongs to client number 0"),
        "{stderr}"
    );

    // Speaking the protocol directly, with every key c2's grants give it.
    let layout = fabric.layout();
    let meta = meta(&layout);
    let meta_server = layout
        .entry(meta.meta_region().region)
        .expect("metadata region")
        .server
        .to_string();
    let mut raw = fabric.c2_at_server(&meta_server);
    let meta_key = raw.region_key(meta.meta_region().region.0);
    let index = records::vextent_of(meta, VirtAddr(plain)).expect("in the page table");
    let entry_at = meta.page_table_entry(index);
    let read = raw.call(Repr::read(Target::Pmem(entry_at), meta_key, 32));
    assert_eq!(read.status, Status::Ok, "c2 may read the page table");
    let entry = PtEntry::decode(&read.data).expect("a page-table entry");
    assert_eq!(entry.control.owner, 0, "c1's");
    let live = entry.control.encode();
    let free = entry.control.with_state(records::EntryState::Free).encode();
    let stolen = records::Control {
        owner: 1,
        ..entry.control
    }
    .encode();
    let denied = |conn: &mut Conn, req: Repr<'_>, what: &str| {
        assert_eq!(conn.call(req).status, Status::AccessDenied, "{what}");
    };
    let target = Target::Pmem(entry_at);
    denied(
        &mut raw,
        Repr::compare_swap(target, meta_key, live, free),
        "CAS of c1's page-table entry to FREE",
    );
    denied(
        &mut raw,
        Repr::compare_swap(target, meta_key, live, stolen),
        "CAS of c1's page-table entry to owner c2",
    );
    denied(
        &mut raw,
        Repr::atomic_write(target, meta_key, free),
        "ATOMIC_WRITE over c1's page-table entry",
    );
    denied(
        &mut raw,
        Repr::fetch_add(target, meta_key, 1),
        "FETCH_ADD on c1's page-table entry",
    );
    denied(
        &mut raw,
        Repr::write(target, meta_key, &[0u8; 32]),
        "WRITE over c1's page-table entry",
    );
    let body = Target::Pmem(PmemAddr(entry_at.get() + 8));
    denied(
        &mut raw,
        Repr::write(body, meta_key, &[0u8; 16]),
        "WRITE over the PMEM address and key of c1's entry",
    );

    // Its name entry: not removed, not renamed.
    let slot = (0..meta.names())
        .find(|&s| {
            let at = meta.name_entry(s);
            let r = raw.call(Repr::read(Target::Pmem(at), meta_key, 128));
            records::NameEntry::decode(&r.data).is_some_and(|e| e.name == "doc")
        })
        .expect("doc's name entry");
    let name_at = meta.name_entry(slot);
    let r = raw.call(Repr::read(Target::Pmem(name_at), meta_key, 128));
    let doc = records::NameEntry::decode(&r.data).expect("name entry");
    let removing = records::NameEntry {
        state: records::NameState::Removing,
        ..doc.clone()
    };
    denied(
        &mut raw,
        Repr::compare_swap(
            Target::Pmem(name_at),
            meta_key,
            doc.control(),
            removing.control(),
        ),
        "CAS of c1's name entry to REMOVING",
    );
    let mut renamed = doc.clone();
    renamed.name = "mine-now".to_owned();
    denied(
        &mut raw,
        Repr::write(Target::Pmem(name_at), meta_key, &renamed.encode()),
        "WRITE renaming c1's object",
    );
    denied(
        &mut raw,
        Repr::write(
            Target::Pmem(PmemAddr(name_at.get() + 32)),
            meta_key,
            b"mine-now",
        ),
        "WRITE over the name bytes",
    );

    // The extent itself, on whichever server holds it: its key stays, its
    // bitmap bit stays set.
    let located = layout.lookup(PmemAddr(entry.pmem)).expect("extent");
    let region = *meta.region(located.offset.region).expect("region");
    let extent = located.offset.offset / meta.extent_size();
    let mut at_extent = fabric.c2_at_server(&located.entry.server.to_string());
    let region_key = at_extent.region_key(region.region.0);
    let key_at = Target::Pmem(region.at(region.key_offset(extent)));
    denied(
        &mut at_extent,
        Repr::compare_swap(key_at, region_key, entry.key.get(), 0),
        "CAS of c1's extent key to 0",
    );
    denied(
        &mut at_extent,
        Repr::atomic_write(key_at, region_key, records::owned_key(1, 7).get()),
        "ATOMIC_WRITE of a key of c2's over c1's",
    );
    let word_at = Target::Pmem(region.at(region.bitmap_offset() + extent / 64 * 8));
    let word = at_extent.call(Repr::read(word_at, region_key, 8));
    let word = records::word_at(&word.data, 0).expect("bitmap word");
    assert_ne!(word & 1 << (extent % 64), 0, "allocated");
    denied(
        &mut at_extent,
        Repr::compare_swap(word_at, region_key, word, word & !(1 << (extent % 64))),
        "CAS clearing c1's bitmap bit",
    );

    // Through the fabric device, which stamps c2's number: the same.
    let mut via_device = fabric.c2_at_device();
    denied(
        &mut via_device,
        Repr::compare_swap(target, meta_key, live, free),
        "CAS through the device",
    );

    // Nothing changed: c1 still reads its data, c2 its refusals.
    let after = raw.call(Repr::read(Target::Pmem(entry_at), meta_key, 32));
    assert_eq!(PtEntry::decode(&after.data), Some(entry));
    for at in [plain, named] {
        let text = fabric.ok("c1", &["read", &format!("{at:#x}"), "7"]);
        assert_eq!(dumped(&text), b"c1-data", "{text}");
    }
    let not_owner: f64 = (0..2)
        .filter_map(|s| {
            telemetry::metric_sum(
                &fabric.metrics(s),
                "pmem_server_denied_requests_total",
                "reason=\"not_owner\"",
            )
        })
        .sum();
    assert!(not_owner >= 12.0, "refusals counted: {not_owner}");

    // A reservation c1 left when it crashed: c2's scrub may not reclaim it
    // and says so; c1's own scrub (c1 started again) does.
    let crashed = (0..meta.page_table_entries())
        .rev()
        .find(|&i| {
            let r = raw.call(Repr::read(
                Target::Pmem(meta.page_table_entry(i)),
                meta_key,
                32,
            ));
            PtEntry::decode(&r.data).is_some_and(|e| e.control.state == records::EntryState::Free)
        })
        .expect("a free page-table entry");
    let at = Target::Pmem(meta.page_table_entry(crashed));
    let mut c1 = Conn::connect(fabric.ports.server_nic(&meta_server, "n0"));
    c1.authenticate(Role::Client, "c1", C1_KEY)
        .expect("c1 proves its key");
    let r = c1.call(Repr::read(at, meta_key, 32));
    let was = PtEntry::decode(&r.data).expect("entry").control;
    let reserved = records::Control {
        state: records::EntryState::Reserved,
        owner: 0,
        generation: was.generation + 1,
        ..was
    };
    let claimed = c1.call(Repr::compare_swap(
        at,
        meta_key,
        was.encode(),
        reserved.encode(),
    ));
    assert_eq!((claimed.status, claimed.value), (Status::Ok, was.encode()));
    let scrubbed = fabric.ok("c2", &["scrub"]);
    assert!(
        scrubbed.contains("records of other clients, left for their owners to scrub: 1"),
        "{scrubbed}"
    );
    let scrubbed = fabric.ok("c1", &["scrub"]);
    assert!(
        scrubbed.contains("page-table entries of allocations cut short, freed: 1"),
        "{scrubbed}"
    );
    assert_eq!(fabric.ok("c2", &["scrub"]), "pool is consistent\n");

    // The owner frees and removes.
    fabric.ok("c1", &["free", &format!("{plain:#x}")]);
    fabric.ok("c1", &["rm", "doc"]);
    assert_eq!(fabric.ok("c2", &["ls"]), "no named objects\n");
}

/// Small objects come from slabs of the client that takes them: another
/// client can neither free one through `pmemctl` nor change the slab's
/// header or bitmaps by speaking the protocol with the slab's key (read
/// from the page table), while the owner frees it.
#[test]
fn only_the_owner_frees_a_small_object_even_through_raw_requests() {
    let fabric = Fabric::start();
    let mine = fabric.alloc("c1", "100", None);
    let theirs = fabric.alloc("c2", "100", None);
    let layout = fabric.layout();
    let meta = meta(&layout);
    let slab_of = |vaddr: u64| records::vextent_of(meta, VirtAddr(vaddr)).expect("mapped");
    assert_ne!(
        slab_of(mine),
        slab_of(theirs),
        "each client has slabs of its own"
    );

    let stderr = fabric.refused("c2", &["free", &format!("{mine:#x}")]);
    assert!(stderr.contains("belongs to client number 0"), "{stderr}");

    // c2 reads the slab's page-table entry (and so its key) and speaks to
    // the slab's server directly.
    let meta_server = layout
        .entry(meta.meta_region().region)
        .expect("metadata region")
        .server
        .to_string();
    let mut raw = fabric.c2_at_server(&meta_server);
    let meta_key = raw.region_key(meta.meta_region().region.0);
    let read = raw.call(Repr::read(
        Target::Pmem(meta.page_table_entry(slab_of(mine))),
        meta_key,
        32,
    ));
    let slab = PtEntry::decode(&read.data).expect("a page-table entry");
    assert_eq!(slab.control.kind, records::EntryKind::Slab);
    assert!(records::key_is_slab(slab.key.get()), "its key marks a slab");
    let located = layout.lookup(PmemAddr(slab.pmem)).expect("slab extent");
    let mut at_slab = fabric.c2_at_server(&located.entry.server.to_string());
    let word = |conn: &mut Conn, offset: u64| {
        let r = conn.call(Repr::read(
            Target::Pmem(PmemAddr(slab.pmem + offset)),
            slab.key,
            8,
        ));
        assert_eq!(r.status, Status::Ok, "c2 may read with the slab's key");
        records::word_at(&r.data, 0).expect("a word")
    };
    let classes = records::Classes::new(meta.extent_size());
    let class = classes.class_of(100).expect("a small class");
    let shape = classes.slab(class);
    let slot = shape
        .slot_at(mine - records::vbase_of(meta, slab_of(mine)).get())
        .expect("an object's start");
    let live_at = shape.live() + slot / 64 * 8;
    let live = word(&mut at_slab, live_at);
    assert_ne!(live & 1 << (slot % 64), 0, "c1's object is live");
    let header = word(&mut at_slab, 0);
    let denied = |conn: &mut Conn, req: Repr<'_>, what: &str| {
        assert_eq!(conn.call(req).status, Status::AccessDenied, "{what}");
    };
    let at = |offset: u64| Target::Pmem(PmemAddr(slab.pmem + offset));
    denied(
        &mut at_slab,
        Repr::compare_swap(at(live_at), slab.key, live, live & !(1 << (slot % 64))),
        "CAS clearing c1's live bit",
    );
    denied(
        &mut at_slab,
        Repr::fetch_add(at(0), slab.key, (1u64 << 32).wrapping_neg()),
        "FETCH_ADD taking a seat back from c1's slab header",
    );
    denied(
        &mut at_slab,
        Repr::write(at(0), slab.key, &[0u8; 64]),
        "WRITE over c1's slab header",
    );
    denied(
        &mut at_slab,
        Repr::atomic_write(at(records::SlabShape::CLAIMED), slab.key, 0),
        "ATOMIC_WRITE over c1's claimed bitmap",
    );
    assert_eq!(word(&mut at_slab, live_at), live, "the live bit stays");
    assert_eq!(word(&mut at_slab, 0), header, "the header stays");

    // Each owner frees its own.
    fabric.ok("c1", &["free", &format!("{mine:#x}")]);
    fabric.ok("c2", &["free", &format!("{theirs:#x}")]);
}
