//! Every kind of bad input gets its status or closes only its own connection,
//! while a second connection keeps working.

use std::net::SocketAddr;

use proto::request::Repr;
use proto::{AccessKey, Message, Opcode, Status};
use testkit::{Conn, Daemon, at, key, pmem_server_with, write_topology};

/// This package's daemon, built with the features of the test run.
const PMEM_SERVER: &str = env!("CARGO_BIN_EXE_pmem-server");

struct Fixture {
    _dir: tempfile::TempDir,
    /// The region's key, from the server's MAP.
    key: AccessKey,
    server: Daemon,
    /// The server's data address (NIC n0).
    data: SocketAddr,
    bystander: Conn,
}

impl Fixture {
    fn new() -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let config = write_topology(dir.path(), &[("R1", "4MiB")]);
        let server = pmem_server_with(PMEM_SERVER, &config, "S", &dir.path().join("data"), &[])
            .expect("server starts");
        let data = server.addr("nic.n0");
        let key = key(data, 0);
        let mut bystander = Conn::connect(data);
        bystander.call(Repr::write(at(0, 0), key, b"still here"));
        Self {
            _dir: dir,
            key,
            server,
            data,
            bystander,
        }
    }

    fn key(&self) -> AccessKey {
        self.key
    }

    /// The second connection still gets served.
    fn bystander_works(&mut self) {
        let reply = self.bystander.call(Repr::read(at(0, 0), self.key, 10));
        assert_eq!(reply.status, Status::Ok);
        assert_eq!(reply.data, b"still here");
        assert!(self.server.is_running());
    }
}

/// A well-formed READ frame, to be damaged by the tests.
fn read_frame(key: AccessKey) -> Vec<u8> {
    Message::Request(Repr::read(at(0, 0), key, 8))
        .encode_to_vec(99)
        .expect("encode")
}

#[test]
fn wrong_key_is_access_denied() {
    let mut f = Fixture::new();
    let mut conn = Conn::connect(f.data);
    for req in [
        Repr::read(at(0, 0), AccessKey(f.key().get() ^ 1), 8),
        Repr::write(at(0, 0), AccessKey::NONE, b"x"),
        Repr::fetch_add(at(0, 8), AccessKey(f.key().get().wrapping_add(1)), 1),
        Repr::flush(at(0, 0), AccessKey(12345), 8),
    ] {
        assert_eq!(conn.call(req).status, Status::AccessDenied, "{req:?}");
    }
    f.bystander_works();
    assert_eq!(
        f.bystander.call(Repr::read(at(0, 0), f.key(), 10)).data,
        b"still here",
        "the denied write changed nothing"
    );
}

#[test]
fn out_of_range_addresses_touch_nothing() {
    let mut f = Fixture::new();
    let mut conn = Conn::connect(f.data);
    let size = 4u64 << 20;
    let k = f.key();
    let cases = [
        (Repr::read(at(0, size), k, 1), Status::OutOfBounds),
        (Repr::read(at(0, size - 4), k, 8), Status::OutOfBounds),
        (Repr::read(at(0, u64::MAX - 2), k, 8), Status::OutOfBounds),
        (Repr::write(at(0, size - 1), k, b"ab"), Status::OutOfBounds),
        (Repr::flush(at(0, size), k, 1), Status::OutOfBounds),
        (Repr::fetch_add(at(0, size), k, 1), Status::OutOfBounds),
        (Repr::read(at(7, 0), k, 1), Status::Unmapped),
    ];
    for (req, want) in cases {
        assert_eq!(conn.call(req).status, want, "{req:?}");
    }
    // The last byte is still reachable.
    assert_eq!(
        conn.call(Repr::write(at(0, size - 1), k, b"z")).status,
        Status::Ok
    );
    f.bystander_works();
}

#[test]
fn misaligned_atomics_are_bad_requests() {
    let mut f = Fixture::new();
    let mut conn = Conn::connect(f.data);
    for offset in [1, 4, 7, 12] {
        assert_eq!(
            conn.call(Repr::fetch_add(at(0, offset), f.key(), 1)).status,
            Status::BadRequest
        );
        assert_eq!(
            conn.call(Repr::compare_swap(at(0, offset), f.key(), 0, 1))
                .status,
            Status::BadRequest
        );
    }
    f.bystander_works();
}

#[test]
fn unknown_opcode_is_unsupported_and_the_connection_stays() {
    let mut f = Fixture::new();
    let mut conn = Conn::connect(f.data);
    let mut frame = read_frame(f.key());
    frame[3] = 0x7f;
    conn.send_raw(&frame);
    let reply = conn.recv();
    assert_eq!((reply.tag, reply.status), (99, Status::Unsupported));
    // The same connection keeps working.
    assert_eq!(
        conn.call(Repr::read(at(0, 0), f.key(), 10)).data,
        b"still here"
    );
    f.bystander_works();
}

#[test]
fn body_that_lies_about_its_payload_is_a_bad_request() {
    let mut f = Fixture::new();
    let mut conn = Conn::connect(f.data);
    // A WRITE whose length field says 100 but carries 10 bytes.
    let mut frame = Message::Request(Repr::write(at(0, 0), f.key(), &[9; 10]))
        .encode_to_vec(5)
        .unwrap();
    frame[16 + 24..16 + 28].copy_from_slice(&100u32.to_le_bytes());
    conn.send_raw(&frame);
    let reply = conn.recv();
    assert_eq!((reply.tag, reply.status), (5, Status::BadRequest));
    // A body shorter than the request header.
    let mut short = read_frame(f.key());
    short.truncate(16 + 20);
    short[4..8].copy_from_slice(&20u32.to_le_bytes());
    conn.send_raw(&short);
    assert_eq!(conn.recv().status, Status::BadRequest);
    f.bystander_works();
    assert_eq!(
        f.bystander.call(Repr::read(at(0, 0), f.key(), 10)).data,
        b"still here"
    );
}

#[test]
fn broken_framing_closes_only_that_connection() {
    let mut f = Fixture::new();
    type Damage = fn(&mut Vec<u8>);
    let damage: [(&str, Damage); 3] = [
        ("wrong magic", |frame| frame[0] = b'X'),
        ("wrong version", |frame| frame[2] = 9),
        ("oversize claim", |frame| {
            frame[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
        }),
    ];
    for (what, damage) in damage {
        let mut conn = Conn::connect(f.data);
        let mut frame = read_frame(f.key());
        damage(&mut frame);
        conn.send_raw(&frame);
        assert_eq!(
            conn.try_recv(),
            None,
            "{what}: the server closes the connection"
        );
        f.bystander_works();
    }
}

#[test]
fn truncated_frame_then_hangup_is_harmless() {
    let mut f = Fixture::new();
    {
        let mut conn = Conn::connect(f.data);
        let frame = Message::Request(Repr::write(at(0, 0), f.key(), &[0xee; 4096]))
            .encode_to_vec(1)
            .unwrap();
        conn.send_raw(&frame[..frame.len() / 2]);
    }
    f.bystander_works();
    assert_eq!(
        f.bystander.call(Repr::read(at(0, 0), f.key(), 10)).data,
        b"still here",
        "half a write is never applied"
    );
}

#[test]
fn garbage_bytes_never_crash_the_server() {
    let mut f = Fixture::new();
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    for _ in 0..50 {
        let mut conn = Conn::connect(f.data);
        let mut frame = read_frame(f.key());
        // Flip a few bytes of the body, keeping the header valid half the time.
        for _ in 0..4 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let pos = (seed % frame.len() as u64) as usize;
            if pos >= 8 || seed & 1 == 0 {
                frame[pos] ^= (seed >> 8) as u8 | 1;
            }
        }
        conn.send_raw(&frame);
        conn.stream
            .set_read_timeout(Some(std::time::Duration::from_millis(200)))
            .unwrap();
        let mut buf = [0u8; 256];
        let _ = std::io::Read::read(&mut conn.stream, &mut buf);
    }
    f.bystander_works();
}

#[test]
fn responses_sent_to_the_server_are_ignored() {
    let mut f = Fixture::new();
    let mut conn = Conn::connect(f.data);
    conn.send(&proto::error_response(Opcode::Read, Status::Ok));
    conn.send(&Message::Ping(1));
    let reply = conn.recv();
    assert_eq!(reply.opcode, Opcode::Pong, "only the PING is answered");
    f.bystander_works();
}
