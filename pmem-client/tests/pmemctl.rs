//! `pmemctl` against a real fabric: two PMEM servers, two fabric devices,
//! one client with an RNIC on each device; and the allocator commands on
//! the same fabric with `[pool.allocator]` and a second client.

use std::path::{Path, PathBuf};
use std::process::Command;

use pmem_client::{StaticTranslator, VIRT_BASE};
use testkit::{Daemon, FabricSpec, Ports};
use topology::{EnvOverrides, Layout, Topology};

const DEVICES: [&str; 2] = ["F1", "F2"];
const SERVERS: [&str; 2] = ["A", "B"];

fn spec() -> FabricSpec {
    FabricSpec::new()
        .server("A", &[("A1", "4MiB"), ("A2", "4MiB")])
        .server("B", &[("B1", "4MiB")])
        .device(DEVICES[0])
        .device(DEVICES[1])
        .client("c1")
}

/// The same fabric with an allocator (1 MiB extents) and a second client.
fn alloc_spec() -> FabricSpec {
    FabricSpec::new()
        .server("A", &[("A1", "8MiB"), ("A2", "4MiB")])
        .server("B", &[("B1", "8MiB")])
        .device(DEVICES[0])
        .device(DEVICES[1])
        .client("c1")
        .client("c2")
        .allocator("")
}

/// A topology written but nothing started.
struct Setup {
    dir: tempfile::TempDir,
    config: PathBuf,
}

impl Setup {
    fn new() -> Self {
        Self::with(&spec())
    }

    fn with(spec: &FabricSpec) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let config = spec.write(dir.path(), "topology.toml", &mut Ports::new());
        Self { dir, config }
    }

    /// Starts the servers and devices and waits until every device has its
    /// links to both servers up.
    fn start(self) -> Fabric {
        let servers = testkit::pmem_servers(&self.config, &SERVERS, self.dir.path());
        let devices: Vec<Daemon> = DEVICES
            .iter()
            .map(|id| {
                testkit::fabric_device(&self.config, id, &[])
                    .unwrap_or_else(|e| panic!("fabric-device {id} did not start:\n{e}"))
            })
            .collect();
        for device in &devices {
            device.wait_links_up(SERVERS.len());
        }
        let topology =
            Topology::load_with(&self.config, &EnvOverrides::None).expect("load the topology");
        let layout = Layout::new(&topology).expect("the layout");
        Fabric {
            setup: self,
            layout,
            _servers: servers,
            _devices: devices,
        }
    }
}

/// A running fabric.
struct Fabric {
    setup: Setup,
    layout: Layout,
    _servers: Vec<Daemon>,
    _devices: Vec<Daemon>,
}

impl Fabric {
    fn path(&self, name: &str) -> PathBuf {
        self.setup.dir.path().join(name)
    }

    /// `(id, virtual start, length)` of each region, in virtual order, as
    /// the client library lays them out.
    fn regions(&self) -> Vec<(String, u64, u64)> {
        StaticTranslator::new(&self.layout)
            .region_ranges()
            .map(|(index, start, len)| {
                let entry = self.layout.entry(index).expect("a region of the layout");
                (entry.region_id.to_string(), start.get(), len)
            })
            .collect()
    }

    fn run(&self, args: &[&str]) -> Run {
        self.run_as("c1", args)
    }

    fn run_as(&self, client: &str, args: &[&str]) -> Run {
        pmemctl(&self.setup.config, client, args)
    }

    /// Runs a command that must succeed and returns its stdout.
    fn ok(&self, args: &[&str]) -> String {
        self.ok_as("c1", args)
    }

    /// Runs a command as `client` that must succeed and returns its stdout.
    fn ok_as(&self, client: &str, args: &[&str]) -> String {
        let run = self.run_as(client, args);
        assert_eq!(
            run.code,
            Some(0),
            "pmemctl --client {client} {args:?} failed: {run:?}"
        );
        run.stdout
    }
}

/// What one pmemctl run did.
#[derive(Debug)]
struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl Run {
    /// Checks a failure: exit status `code`, exactly one stderr line in
    /// pmemctl's format, no panic; returns the line.
    fn error_line(&self, code: i32) -> &str {
        assert_eq!(self.code, Some(code), "{self:?}");
        assert!(!self.stderr.contains("panicked"), "{self:?}");
        let lines: Vec<&str> = self.stderr.lines().collect();
        assert_eq!(lines.len(), 1, "one line on stderr: {self:?}");
        assert!(lines[0].starts_with("pmemctl: error: "), "{self:?}");
        lines[0]
    }
}

fn pmemctl(config: &Path, client: &str, args: &[&str]) -> Run {
    let output = Command::new(env!("CARGO_BIN_EXE_pmemctl"))
        .arg("--config")
        .arg(config)
        .args(["--client", client, "--op-timeout-ms", "10000"])
        .args(args)
        .output()
        .expect("run pmemctl");
    Run {
        code: output.status.code(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

/// Deterministic pseudo-random bytes (xorshift64).
fn noise(len: usize, mut state: u64) -> Vec<u8> {
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 24) as u8
        })
        .collect()
}

#[test]
fn writes_and_reads_back_across_region_boundaries() {
    let fabric = Setup::new().start();
    let regions = fabric.regions();
    assert_eq!(regions.len(), 3, "{regions:?}");
    assert_eq!(regions[0].1, VIRT_BASE, "the space starts at VIRT_BASE");

    // 300 KiB from 100 KiB before the end of the first region (A1 -> A2,
    // same server), then 100 KiB before the end of the second (A2 -> B1,
    // across servers).
    for (i, (_, start, len)) in regions.iter().take(2).enumerate() {
        let addr = start + len - (100 << 10);
        let data = noise(300 << 10, 0x9e37_79b9_7f4a_7c15 + i as u64);
        let input = fabric.path(&format!("in{i}.bin"));
        let output = fabric.path(&format!("out{i}.bin"));
        std::fs::write(&input, &data).unwrap();
        let at = format!("{addr:#x}");
        let wrote = fabric.ok(&["write", &at, &format!("@{}", input.display()), "--persist"]);
        assert_eq!(
            wrote,
            format!(
                "wrote 307200 bytes at {at}..{:#x}, persisted\n",
                addr + (300 << 10)
            )
        );
        let read = fabric.ok(&["read", &at, "300KiB", "--out", output.to_str().unwrap()]);
        assert!(read.starts_with("read 307200 bytes at "), "{read}");
        let back = std::fs::read(&output).unwrap();
        assert_eq!(back.len(), data.len());
        assert!(
            back == data,
            "the bytes read back differ from the ones written at {at}"
        );
    }

    // The same range again, written with a size expression, read back in a
    // hex dump.
    let second = regions[1].1;
    assert_eq!(second, VIRT_BASE + fabric.layout.entries()[0].len);
    fabric.ok(&["write", "1TiB+4MiB-8", "hello, pmemctl!\u{1}"]);
    let dump = fabric.ok(&["read", &format!("{:#x}", second - 8), "0x20"]);
    let lines: Vec<&str> = dump.lines().collect();
    let want_first = format!(
        "{:#x}  68 65 6c 6c 6f 2c 20 70  6d 65 6d 63 74 6c 21 01  |hello, pmemctl!.|",
        second - 8
    );
    assert_eq!(lines.len(), 2, "{dump}");
    assert_eq!(lines[0], want_first);
    assert!(
        lines[1].starts_with(&format!("{:#x}  ", second + 8)),
        "{dump}"
    );
    assert!(lines[1].ends_with('|'), "{dump}");
    assert_eq!(lines[1].len(), lines[0].len(), "a full line: {dump}");

    // A short read pads the hex columns so the gutter lines up.
    let short = fabric.ok(&["read", "1TiB+4MiB-8", "3"]);
    assert_eq!(
        short,
        format!(
            "{:#x}  68 65 6c {}  |hel|\n",
            second - 8,
            " ".repeat(3 * 5 + 1 + 3 * 8 - 1)
        )
    );
}

#[test]
fn atomics_map_and_stat() {
    let fabric = Setup::new().start();
    let regions = fabric.regions();
    let word = format!("{:#x}", regions[2].1 + 64);

    assert_eq!(
        fabric.ok(&["faa", &word, "5"]),
        "old value 0 (0x0), new value 5 (0x5)\n"
    );
    assert_eq!(
        fabric.ok(&["faa", &word, "0x10"]),
        "old value 5 (0x5), new value 21 (0x15)\n"
    );
    assert_eq!(
        fabric.ok(&["cas", &word, "21", "100"]),
        "swapped: old value 21 (0x15), now 100 (0x64)\n"
    );
    // A compare-and-swap that did not swap is no success: status 3, and
    // the word keeps its value.
    let run = fabric.run(&["cas", &word, "21", "7"]);
    assert_eq!(
        run.error_line(3),
        format!(
            "pmemctl: error: compare-and-swap at {word} did not swap: the word holds 100 \
             (0x64), not the expected 21 (0x15)"
        )
    );
    assert!(run.stdout.is_empty(), "{run:?}");
    assert_eq!(
        fabric.ok(&["faa", &word, "-1"]),
        "old value 100 (0x64), new value 99 (0x63)\n"
    );
    let dump = fabric.ok(&["read", &word, "8"]);
    assert!(dump.contains("  63 00 00 00 00 00 00 00 "), "{dump}");
    assert_eq!(
        fabric.ok(&["flush", &word, "8"]),
        format!("flushed 8 bytes at {word}..{:#x}\n", regions[2].1 + 72)
    );

    let map = fabric.ok(&["map"]);
    for (id, start, len) in &regions {
        let entry = fabric
            .layout
            .entry_by_id(&id.as_str().into())
            .expect("region");
        let row = map
            .lines()
            .find(|l| l.split_whitespace().next() == Some(id.as_str()))
            .unwrap_or_else(|| panic!("no row for {id}:\n{map}"));
        let cells: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(
            cells,
            [
                id.as_str(),
                entry.server.as_str(),
                entry.socket.as_str(),
                &format!("{start:#x}..{:#x}", start + len),
                &format!("{:#x}..{:#x}", entry.start.get(), entry.end()),
                "4MiB",
            ],
            "{map}"
        );
    }
    for (rnic, device) in [("r0", "F1"), ("r1", "F2")] {
        let row = map
            .lines()
            .find(|l| l.split_whitespace().next() == Some(rnic))
            .unwrap_or_else(|| panic!("no path row for {rnic}:\n{map}"));
        let cells: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(cells.len(), 6, "{map}");
        assert_eq!(cells[1], "tcp", "{map}");
        assert_eq!(cells[2], device, "{map}");
        assert_eq!(cells[4], "up", "{map}");
    }

    let stat = fabric.ok(&["stat"]);
    assert!(stat.contains("client c1"), "{stat}");
    for counter in ["requests", "retries", "failovers", "reconnects"] {
        assert!(
            stat.lines().any(|l| l.starts_with(counter)),
            "no {counter}:\n{stat}"
        );
    }
    assert!(stat.contains("paths: 2 of 2 up"), "{stat}");
    // Each server's persistence comes from its /metrics, at the admin
    // address the topology gives (this test's servers have none there).
    let servers = stat
        .split("servers (from their /metrics)")
        .nth(1)
        .unwrap_or_else(|| panic!("{stat}"));
    for server in ["A", "B"] {
        assert!(
            servers
                .lines()
                .any(|l| l.starts_with(server) && l.ends_with("no admin address")),
            "{stat}"
        );
    }
}

#[test]
fn errors_are_one_line_and_never_panics() {
    let setup = Setup::new();
    let config = setup.config.clone();

    // Nothing runs yet: no device can be reached.
    let run = pmemctl(&config, "c1", &["--connect-timeout-ms", "500", "map"]);
    let line = run.error_line(1);
    assert!(line.contains("no fabric device could be reached"), "{line}");
    assert!(line.contains("c1"), "{line}");

    // A word where a number goes is "not a number".
    let run = pmemctl(&config, "c1", &["faa", "1TiB", "abc"]);
    assert_eq!(run.code, Some(2), "{run:?}");
    assert!(run.stderr.contains("\"abc\" is not a number"), "{run:?}");

    // Garbage addresses and numbers are usage errors.
    for args in [
        &["read", "zebra", "16"][..],
        &["read", "1TiB+", "16"],
        &["read", "", "16"],
        &["read", "1TiB", "12 parsecs"],
        &["faa", "1TiB", "--"],
        &["cas", "1TiB", "1"],
        &["frobnicate"],
    ] {
        let run = pmemctl(&config, "c1", args);
        assert_eq!(run.code, Some(2), "{args:?}: {run:?}");
        assert!(!run.stderr.contains("panicked"), "{args:?}: {run:?}");
    }

    // A topology file that is not there.
    let missing_config = setup.dir.path().join("nope.toml");
    let run = pmemctl(&missing_config, "c1", &["map"]);
    let line = run.error_line(1);
    assert!(line.contains("nope.toml"), "{line}");

    // A data file that is not there, before anything connects.
    let missing = setup.dir.path().join("missing-file");
    let run = pmemctl(
        &config,
        "c1",
        &["write", "1TiB", &format!("@{}", missing.display())],
    );
    let line = run.error_line(1);
    assert!(line.contains(&missing.display().to_string()), "{line}");

    let fabric = setup.start();

    let run = fabric.run(&["write", "1TiB", &format!("@{}", missing.display())]);
    let line = run.error_line(1);
    assert!(line.contains("missing-file"), "{line}");

    // A client the topology does not have.
    let run = pmemctl(&config, "c9", &["read", "1TiB", "16"]);
    let line = run.error_line(1);
    assert!(line.contains("c9"), "{line}");

    // Below the virtual space, and past its end.
    let run = fabric.run(&["read", "0x1000", "16"]);
    let line = run.error_line(1);
    assert!(line.contains("0x1000"), "{line}");
    assert!(line.contains("not mapped"), "{line}");
    let end = fabric.regions().last().map(|r| r.1 + r.2).expect("regions");
    let run = fabric.run(&["write", &format!("{:#x}", end - 4), "12345678"]);
    run.error_line(1);
    let run = fabric.run(&["read", "0", "16"]);
    assert!(run.error_line(1).contains("0x0"), "{run:?}");

    // Misaligned atomics are refused by the library, not a panic.
    let run = fabric.run(&["faa", "1TiB+3", "1"]);
    run.error_line(1);

    // Allocator commands on a pool without an allocator.
    for args in [&["alloc", "64"][..], &["format"], &["df"]] {
        let run = fabric.run(args);
        let line = run.error_line(1);
        assert!(
            line.contains("pool \"test\" has no allocator: add a [pool.allocator] table"),
            "{args:?}: {line}"
        );
    }

    // The fabric still works after all that.
    fabric.ok(&["read", "1TiB", "16"]);
}

/// The address a pmemctl line ends with (`alloc` and `open` put it last).
fn last_addr(line: &str) -> u64 {
    let word = line.split_whitespace().last().unwrap_or_default();
    u64::from_str_radix(word.trim_start_matches("0x"), 16)
        .unwrap_or_else(|e| panic!("no address at the end of {line:?}: {e}"))
}

/// The cells of the `df` row whose first cell is `first`.
fn df_row(df: &str, first: &str) -> Vec<String> {
    df.lines()
        .map(|l| l.split_whitespace().map(str::to_owned).collect::<Vec<_>>())
        .find(|cells| cells.first().map(String::as_str) == Some(first))
        .unwrap_or_else(|| panic!("no {first} row in\n{df}"))
}

/// (used, free) extents of the `df` total row.
fn df_total(df: &str) -> (u64, u64) {
    let cells = df_row(df, "total");
    let number = |i: usize| cells[i].parse::<u64>().expect("a count");
    assert_eq!(number(2), number(3) + number(4), "{df}");
    (number(3), number(4))
}

#[test]
fn allocator_session_format_alloc_ls_df_free_scrub() {
    let fabric = Setup::with(&alloc_spec()).start();

    // Not formatted yet: allocating says what to do.
    let run = fabric.run(&["alloc", "64"]);
    let line = run.error_line(1);
    assert!(line.contains("allocate 64 bytes: "), "{line}");
    assert!(
        line.contains("pool \"test\" is not formatted (run `pmemctl format`)"),
        "{line}"
    );

    let formatted = fabric.ok(&["format"]);
    assert!(
        formatted.starts_with("formatted pool \"test\": "),
        "{formatted}"
    );
    assert!(
        formatted.contains(" extents of 1MiB free in 3 regions"),
        "{formatted}"
    );
    let df = fabric.ok(&["df"]);
    let (used, capacity) = df_total(&df);
    assert_eq!(used, 0, "{df}");
    assert!(capacity >= 10, "{df}");
    assert!(
        formatted.contains(&format!(": {capacity} extents of 1MiB")),
        "{formatted}\n{df}"
    );
    assert!(df.contains("slabs: none"), "{df}");

    // A named object of three extents, created by c2, spread over both
    // servers.
    let line = fabric.ok_as("c2", &["alloc", "3MiB", "--name", "orders"]);
    assert!(
        line.starts_with("allocated 3145728 bytes (3MiB) as \"orders\" at 0x"),
        "{line}"
    );
    let orders = last_addr(&line);
    assert!(orders >= VIRT_BASE, "{line}");

    let ls = fabric.ok(&["ls"]);
    let header: Vec<&str> = ls
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(
        header,
        ["NAME", "ADDRESS", "SIZE", "OWNER", "EXTENTS"],
        "{ls}"
    );
    let row: Vec<&str> = ls
        .lines()
        .find(|l| l.starts_with("orders "))
        .unwrap_or_else(|| panic!("no orders row:\n{ls}"))
        .split_whitespace()
        .collect();
    assert_eq!(
        row[..4],
        ["orders", &format!("{orders:#x}"), "3MiB", "c2"],
        "{ls}"
    );
    let places: Vec<&str> = row[4].split(',').collect();
    let count: usize = places
        .iter()
        .map(|p| {
            p.split_once('*')
                .map_or(1, |(_, n)| n.parse().expect("a count"))
        })
        .sum();
    assert_eq!(count, 3, "three extents: {ls}");
    assert!(
        places.iter().any(|p| p.starts_with("A/A")) && places.iter().any(|p| p.starts_with("B/B1")),
        "round-robin over both servers: {ls}"
    );

    let df = fabric.ok(&["df"]);
    assert_eq!(df_total(&df), (3, capacity - 3), "{df}");
    let used: u64 = ["A1", "A2", "B1"]
        .iter()
        .map(|region| {
            let row = df
                .lines()
                .map(|l| l.split_whitespace().collect::<Vec<_>>())
                .find(|cells| cells.get(1) == Some(region))
                .unwrap_or_else(|| panic!("no {region} row:\n{df}"));
            row[3].parse::<u64>().expect("used extents")
        })
        .sum();
    assert_eq!(used, 3, "{df}");

    // c1 opens it and uses it across an extent boundary.
    let opened = fabric.ok(&["open", "orders"]);
    assert_eq!(
        opened,
        format!("\"orders\": 3145728 bytes (3MiB) at {orders:#x}\n")
    );
    let at = format!("{:#x}", orders + (1 << 20) - 8);
    let wrote = fabric.ok(&["write", &at, "orders across extents", "--persist"]);
    assert!(wrote.starts_with("wrote 21 bytes at "), "{wrote}");
    let dump = fabric.ok_as("c2", &["read", &at, "21"]);
    assert!(dump.contains("|orders across ex|\n"), "{dump}");
    assert!(dump.ends_with("|tents|\n"), "{dump}");

    // Only its creator removes it.
    let run = fabric.run(&["rm", "orders"]);
    let line = run.error_line(1);
    assert!(
        line.contains("named object \"orders\" belongs to client number 1"),
        "{line}"
    );
    assert!(line.ends_with("run it as c2 (`--client c2`)"), "{line}");
    let removed = fabric.ok_as("c2", &["rm", "orders"]);
    assert_eq!(removed, "removed \"orders\"\n");
    let run = fabric.run(&["read", &at, "8"]);
    let line = run.error_line(1);
    assert!(line.contains("use after free"), "{line}");
    let run = fabric.run(&["open", "orders"]);
    let line = run.error_line(1);
    assert!(line.contains("no named object \"orders\""), "{line}");
    assert!(line.contains("`pmemctl ls`"), "{line}");
    assert_eq!(fabric.ok(&["ls"]), "no named objects\n");
    let df = fabric.ok(&["df"]);
    assert_eq!(df_total(&df), (0, capacity), "all free again: {df}");

    // A small object from a slab, freed twice.
    let line = fabric.ok(&["alloc", "64"]);
    assert!(line.starts_with("allocated 64 bytes at 0x"), "{line}");
    let small = format!("{:#x}", last_addr(&line));
    let df = fabric.ok(&["df"]);
    assert!(
        df.contains("slabs: 1 (1MiB in extents), 1 object in use (64 bytes)"),
        "{df}"
    );
    assert_eq!(fabric.ok(&["free", &small]), format!("freed {small}\n"));
    let run = fabric.run(&["free", &small]);
    let line = run.error_line(1);
    assert!(line.contains("double free"), "{line}");
    assert!(line.contains(&small), "{line}");

    // Placement: a server the pool does not have, then one it has.
    let run = fabric.run(&["alloc", "2MiB", "--server", "Z"]);
    let line = run.error_line(1);
    assert!(
        line.contains("placement: the pool has no region on server Z"),
        "{line}"
    );
    let line = fabric.ok(&["alloc", "2MiB", "--server", "B", "--name", "pinned"]);
    assert!(line.contains("as \"pinned\""), "{line}");
    let ls = fabric.ok(&["ls"]);
    assert!(
        ls.lines()
            .any(|l| l.starts_with("pinned ") && l.ends_with(" B/B1*2")),
        "{ls}"
    );
    let run = fabric.run(&["alloc", "1MiB", "--name", "pinned"]);
    let line = run.error_line(1);
    assert!(
        line.contains("a named object \"pinned\" already exists"),
        "{line}"
    );

    // Formatting again is refused, with what to do about it.
    let run = fabric.run(&["format"]);
    let line = run.error_line(1);
    assert!(
        line.contains(
            "pool \"test\" is already formatted; formatting again frees everything in it"
        ),
        "{line}"
    );
    assert!(line.ends_with("add --force to format it anyway"), "{line}");
    assert!(
        fabric.ok(&["ls"]).contains("pinned"),
        "format refused kept the data"
    );

    assert_eq!(fabric.ok(&["scrub"]), "pool is consistent\n");

    // --force wipes everything.
    fabric.ok(&["format", "--force"]);
    assert_eq!(fabric.ok(&["ls"]), "no named objects\n");
    assert_eq!(df_total(&fabric.ok(&["df"])), (0, capacity));
}

#[test]
fn an_invalid_topology_is_listed_once() {
    let setup = Setup::new();
    let text = std::fs::read_to_string(&setup.config).expect("the topology");
    let broken = setup.dir.path().join("broken.toml");
    std::fs::write(&broken, text.replacen("\"4MiB\"", "\"4MB\"", 1)).expect("write");
    let run = pmemctl(&broken, "c1", &["map"]);
    assert_eq!(run.code, Some(1), "{run:?}");
    assert_eq!(
        run.stderr
            .matches("is not a multiple of the extent size")
            .count(),
        1,
        "{run:?}"
    );
    assert_eq!(
        run.stderr.matches("did you mean 4MiB?").count(),
        1,
        "{run:?}"
    );
    assert!(run.stderr.starts_with("pmemctl: error: "), "{run:?}");
}

#[test]
fn an_allocation_without_room_says_how_much_there_is() {
    let fabric = Setup::with(&alloc_spec()).start();
    fabric.ok(&["format"]);
    let df = fabric.ok(&["df"]);
    // `pool "test": N of M extents free (FREE of TOTAL), …`
    let free = df
        .split_once(" free (")
        .and_then(|(_, rest)| rest.split_once(" of "))
        .map(|(free, _)| free.to_owned())
        .unwrap_or_else(|| panic!("no free bytes in\n{df}"));
    let run = fabric.run(&["alloc", "1GiB"]);
    let line = run.error_line(1);
    assert!(
        line.contains(&format!(
            "cannot allocate 1GiB: out of memory, 1GiB requested, {free} free in the pool"
        )),
        "{line}"
    );
    assert!(
        line.contains("`pmemctl df` shows what is free where"),
        "{line}"
    );
    assert!(!line.contains("page table"), "{line}");
    // Nothing was taken.
    assert_eq!(fabric.ok(&["df"]), df);
}
