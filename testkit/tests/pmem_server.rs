//! The kit against a real daemon: `binary` builds pmem-server from another
//! package's tests, and the fabrics `FabricSpec` writes are ones it serves.

use proto::Status;
use proto::request::Repr;
use testkit::{Conn, FabricSpec, Ports, at, key, layout, pmem_server, write_topology};

#[test]
fn built_pmem_server_starts_answers_and_stops() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_topology(dir.path(), &[("R1", "4MiB"), ("R2", "2MiB")]);
    let layout = layout(&config);
    let server = pmem_server(&config, "S", &dir.path().join("data"), &[]).unwrap();
    assert_eq!(server.field("server"), "S");
    assert!(!server.field("mode").is_empty());
    assert_ne!(server.addr("admin").port(), 0);

    let mut conn = Conn::connect(server.addr("nic.n0"));
    let hello = conn.hello("c");
    assert_eq!(
        (hello.status, hello.data.as_slice()),
        (Status::Ok, &b"S"[..])
    );
    let map = conn.map();
    assert_eq!(map.digest, layout.digest());
    assert_eq!(map.entries.len(), 2);
    let reply = conn.call(Repr::write_persist(
        at(1, 64),
        key(server.addr("nic.n0"), 1),
        b"kit",
    ));
    assert_eq!(reply.status, Status::Ok);
    assert_eq!(
        conn.call(Repr::read(at(1, 64), key(server.addr("nic.n0"), 1), 3))
            .data,
        b"kit"
    );

    let (status, stderr) = server.terminate();
    assert!(status.success(), "{status:?}\n{stderr}");
    assert!(stderr.contains("stopped cleanly"), "{stderr}");
}

#[test]
fn servers_of_a_written_fabric_listen_where_it_says() {
    let dir = tempfile::tempdir().unwrap();
    let mut ports = Ports::new();
    let config = FabricSpec::new()
        .server("A", &[("PA.1", "2MiB"), ("PA.2", "2MiB")])
        .server("B", &[("PB.1", "2MiB"), ("PB.2", "2MiB")])
        .device("F")
        .client("c")
        .sockets_per_server(2)
        .write(dir.path(), "fabric.toml", &mut ports);
    let layout = layout(&config);
    for id in ["A", "B"] {
        let server = pmem_server(&config, id, &dir.path().join(id), &[]).unwrap();
        for nic in ["n0", "n1"] {
            let addr = ports.server_nic(id, nic);
            assert_eq!(server.addr(&format!("nic.{nic}")), addr);
            let mut conn = Conn::connect(addr);
            assert_eq!(conn.hello("c").data, id.as_bytes(), "{id}/{nic}");
            assert_eq!(conn.map().digest, layout.digest());
        }
    }
}
