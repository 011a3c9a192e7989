//! Replicated regions on real daemons: every server creates and serves the
//! files of every copy it holds, its own regions and its backups; a
//! single-copy topology's servers hold exactly what they always did.

use std::path::{Path, PathBuf};

use proto::Status;
use proto::request::Repr;
use testkit::{Conn, FabricSpec, Ports, at, file_bytes, key, layout, pmem_server_with};

/// This package's daemon, built with the features of the test run.
const PMEM_SERVER: &str = env!("CARGO_BIN_EXE_pmem-server");

/// Three servers with one region each; `replicas` lines added to `[pool]`.
fn write_topology(dir: &Path, pool_lines: &str) -> PathBuf {
    let spec = FabricSpec::new()
        .server("A", &[("PA.1", "4MiB")])
        .server("B", &[("PB.1", "4MiB")])
        .server("C", &[("PC.1", "4MiB")])
        .device("F")
        .client("c1");
    let path = spec.write(dir, "topology.toml", &mut Ports::new());
    let text = std::fs::read_to_string(&path).expect("topology");
    let text = text.replacen("[pool]\n", &format!("[pool]\n{pool_lines}\n"), 1);
    std::fs::write(&path, text).expect("rewrite topology");
    path
}

/// The region files in `dir`, sorted (the exactly-once window's file is
/// no region's).
fn region_files(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("data dir")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|name| name.ends_with(".pmem") && name != "exactly-once.pmem")
        .collect();
    names.sort();
    names
}

#[test]
fn each_server_creates_and_serves_the_files_of_every_copy_it_holds() {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = write_topology(dir.path(), "replicas = 2");
    let data = |id: &str| dir.path().join("data").join(id);
    let servers: Vec<_> = ["A", "B", "C"]
        .iter()
        .map(|id| {
            pmem_server_with(PMEM_SERVER, &config, id, &data(id), &[])
                .unwrap_or_else(|e| panic!("pmem-server {id}: {e}"))
        })
        .collect();
    // Backups go to the next server: A's region to B, B's to C, C's to A.
    assert_eq!(region_files(&data("A")), ["PA.1.pmem", "PC.1.pmem"]);
    assert_eq!(region_files(&data("B")), ["PA.1.pmem", "PB.1.pmem"]);
    assert_eq!(region_files(&data("C")), ["PB.1.pmem", "PC.1.pmem"]);
    // A backup is the region's size, like its primary.
    let len = |path: PathBuf| std::fs::metadata(path).expect("file").len();
    assert_eq!(
        len(data("B").join("PA.1.pmem")),
        len(data("A").join("PA.1.pmem"))
    );

    // B serves its backup of PA.1 as region PA.1 (same index and offsets):
    // a write there lands in B's copy, not in A's.
    let pa1 = layout(&config)
        .entry_by_id(&"PA.1".into())
        .expect("PA.1")
        .region;
    let b = servers[1].addr("nic.n0");
    let block = vec![0x5a; 4096];
    let mut conn = Conn::connect(b);
    let reply = conn.call(Repr::write_persist(at(pa1.0, 8192), key(b, pa1.0), &block));
    assert_eq!(reply.status, Status::Ok);
    assert_eq!(file_bytes(&data("B"), "PA.1", 8192, 4096), block);
    assert_eq!(file_bytes(&data("A"), "PA.1", 8192, 4096), vec![0; 4096]);
    // A region B holds no copy of is not served there, even with the key
    // of its primary.
    let pc1 = layout(&config)
        .entry_by_id(&"PC.1".into())
        .expect("PC.1")
        .region;
    let c = servers[2].addr("nic.n0");
    let reply = conn.call(Repr::read(at(pc1.0, 0), key(c, pc1.0), 64));
    assert_eq!(reply.status, Status::Unmapped);

    // Restarted, a server keeps both copies' data.
    let mut servers = servers;
    servers.remove(1).kill9();
    let b = pmem_server_with(PMEM_SERVER, &config, "B", &data("B"), &[]).expect("restart B");
    let addr = b.addr("nic.n0");
    let reply = Conn::connect(addr).call(Repr::read(at(pa1.0, 8192), key(addr, pa1.0), 4096));
    assert_eq!(reply.status, Status::Ok);
    assert_eq!(reply.data, block);
}

#[test]
fn a_single_copy_topology_holds_only_its_own_regions() {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = write_topology(dir.path(), "");
    for id in ["A", "B", "C"] {
        let data = dir.path().join("data").join(id);
        let _server = pmem_server_with(PMEM_SERVER, &config, id, &data, &[])
            .unwrap_or_else(|e| panic!("pmem-server {id}: {e}"));
        assert_eq!(region_files(&data), [format!("P{id}.1.pmem")]);
    }
}
