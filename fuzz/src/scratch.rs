//! A pmem-server executor over scratch region files, made once per fuzzing
//! process: server `S` of a one-server topology (regions `R1`, 4 MiB, and
//! `R2`, 2 MiB; fabric device `F`; client `c`), its files in a folder on
//! tmpfs (`/dev/shm` when there is one), made durable with msync.
//!
//! The executor lives as long as the process, so what one input writes (data,
//! exactly-once windows, rotated keys) is there for the next, as on a
//! server that has run for a while; inputs read the keys they need afresh.
//! Its folder, `pmem-fabric-fuzz-PID-SETUP`, outlives the process (nothing
//! runs at exit, and a crash aborts); the next fuzzing process removes the
//! folders of processes that are gone.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use arbitrary::Arbitrary;
use pmem_server::persist::PersistPolicy;
use pmem_server::{Executor, OpenedServer, ServerConfig};
use proto::AccessKey;
use topology::secrets::{Principal, write_key};
use topology::{RegionIndex, ServerId, Topology};

/// Key of fabric device `F` on a gated server.
pub const DEVICE_KEY: [u8; 32] = [0x42; 32];
/// Key of client `c` (number 0) on a gated server.
pub const CLIENT_KEY: [u8; 32] = [0x17; 32];
/// Name of the operator on a gated server.
pub const OPERATOR: &str = "op";
/// Key of operator [`OPERATOR`] on a gated server.
pub const OPERATOR_KEY: [u8; 32] = [0x99; 32];
/// Regions of the server; index 2 names no region.
pub const REGIONS: u32 = 2;

/// Which server an input runs against.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Arbitrary)]
pub enum Setup {
    /// No authentication: every peer is answered.
    Open,
    /// No authentication, and a pool with an allocator: allocated extents
    /// open only with their own key (the key table in each region's first
    /// extent).
    Allocator,
    /// `--secrets`: device `F`, client `c` (granted the first MiB of `R1`
    /// read-write and the third read-only) and operator [`OPERATOR`] may
    /// connect after proving their keys.
    Gated,
}

/// A server opened in a scratch folder.
#[derive(Debug)]
pub struct Scratch {
    /// The opened server.
    pub opened: OpenedServer,
}

impl Scratch {
    /// The executor.
    pub fn exec(&self) -> &Executor {
        &self.opened.exec
    }

    /// The key that opens region `index` now (keys rotate), or a key that
    /// opens nothing for a region the server does not have.
    pub fn region_key(&self, index: u32) -> AccessKey {
        self.exec()
            .region(RegionIndex(index))
            .map_or(AccessKey(u64::MAX), |r| r.key())
    }

    /// The PMEM address where region `index` starts (0 for no region).
    pub fn region_start(&self, index: u32) -> u64 {
        self.exec()
            .region(RegionIndex(index))
            .map_or(0, |r| r.entry.start.0)
    }
}

/// The server of `setup`, opened on first use.
///
/// # Panics
///
/// When the scratch server cannot be made (no temporary folder, a topology
/// the server refuses): the fuzz target cannot run at all.
pub fn scratch(setup: Setup) -> &'static Scratch {
    static OPEN: OnceLock<Scratch> = OnceLock::new();
    static ALLOCATOR: OnceLock<Scratch> = OnceLock::new();
    static GATED: OnceLock<Scratch> = OnceLock::new();
    let cell = match setup {
        Setup::Open => &OPEN,
        Setup::Allocator => &ALLOCATOR,
        Setup::Gated => &GATED,
    };
    cell.get_or_init(|| open(setup))
}

/// Start of the scratch folders' names.
const PREFIX: &str = "pmem-fabric-fuzz-";

/// Removes the scratch folders in `parent` of fuzzing processes that are
/// gone.
fn remove_stale(parent: &Path) {
    let Ok(entries) = fs::read_dir(parent) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let pid = name
            .to_str()
            .and_then(|n| n.strip_prefix(PREFIX))
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<u32>().ok());
        if let Some(pid) = pid
            && !Path::new("/proc").join(pid.to_string()).exists()
        {
            let _ = fs::remove_dir_all(entry.path());
        }
    }
}

/// This process's empty scratch folder for `setup`.
fn folder(setup: Setup) -> PathBuf {
    let shm = Path::new("/dev/shm");
    let parent = if shm.is_dir() {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    };
    remove_stale(&parent);
    let dir = parent.join(format!("{PREFIX}{}-{setup:?}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir)
        .unwrap_or_else(|e| panic!("cannot make the scratch folder {}: {e}", dir.display()));
    dir
}

fn open(setup: Setup) -> Scratch {
    let dir = folder(setup);
    let path = testkit::write_topology(&dir, &[("R1", "4MiB"), ("R2", "2MiB")]);
    let mut text = std::fs::read_to_string(&path).expect("read the scratch topology");
    // Client `c` is the last table of the file.
    text.push_str(
        "allow = [{ region = \"R1\", size = \"1MiB\" }, \
         { region = \"R1\", offset = \"2MiB\", size = \"1MiB\", access = \"read\" }]\n",
    );
    if setup == Setup::Allocator {
        text.push_str("\n[pool.allocator]\n");
    }
    std::fs::write(&path, text).expect("write the scratch topology");
    let topology = Topology::load(&path).expect("load the scratch topology");
    let secrets = (setup == Setup::Gated).then(|| {
        let secrets = dir.join("secrets");
        write_key(&secrets, Principal::Device("F"), &DEVICE_KEY).expect("device key");
        write_key(&secrets, Principal::Client("c"), &CLIENT_KEY).expect("client key");
        write_key(&secrets, Principal::Operator(OPERATOR), &OPERATOR_KEY).expect("operator key");
        secrets
    });
    let config = ServerConfig {
        topology,
        server: ServerId::new("S"),
        data_dir: dir.join("data"),
        admin: "127.0.0.1:0".parse().expect("an address"),
        persistence: PersistPolicy::Msync,
        format: true,
        create_missing: Vec::new(),
        reset_exactly_once: false,
        max_connections: 1,
        max_unproven: 1,
        timeouts: Default::default(),
        secrets,
        transport: None,
    };
    let opened = OpenedServer::open(&config).expect("open the scratch server");
    Scratch { opened }
}
