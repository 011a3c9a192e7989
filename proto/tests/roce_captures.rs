//! Every RoCEv2 packet recorded between two stock Linux RDMA stacks (see
//! `captures/README.md`) parses, its ICRC verifies, and re-emitting the
//! parsed representation gives back the same bytes.

use std::path::{Path, PathBuf};

use pcap_file::pcap::PcapReader;
use std::collections::{BTreeMap, VecDeque};
use std::net::Ipv4Addr;
use std::time::Instant;

use proto::roce::rc::{BufferMemory, Path as QpPath, QpConfig, QueuePair};
use proto::roce::{Datagram, Opcode, datagram, packet};

/// The IPv4 datagrams of a capture's RoCEv2 frames (other traffic skipped).
pub fn roce_datagrams(path: &Path) -> Vec<Vec<u8>> {
    let file = std::fs::File::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut reader = PcapReader::new(file).expect("pcap header");
    let mut out = Vec::new();
    while let Some(packet) = reader.next_packet() {
        let packet = packet.expect("pcap record");
        assert_eq!(
            packet.data.len() as u32,
            packet.orig_len,
            "{}: a truncated frame cannot be checked",
            path.display()
        );
        let Ok(ip) = datagram::ethernet_payload(&packet.data) else {
            continue;
        };
        // UDP to 4791 only: byte 9 is the IPv4 protocol, 22..24 the UDP destination port.
        if ip.len() >= 28 && ip[9] == 17 && ip[22..24] == [0x12, 0xB7] {
            let total = usize::from(u16::from_be_bytes([ip[2], ip[3]]));
            out.push(ip[..total].to_vec());
        }
    }
    out
}

pub fn captures() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/captures");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("captures folder")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "pcap"))
        .collect();
    files.sort();
    files
}

#[test]
fn every_captured_packet_parses_verifies_and_re_emits_byte_for_byte() {
    let mut total = 0;
    let mut opcodes = std::collections::BTreeMap::<String, usize>::new();
    for path in captures() {
        let datagrams = roce_datagrams(&path);
        assert!(!datagrams.is_empty(), "{} holds no RoCEv2", path.display());
        for (i, bytes) in datagrams.iter().enumerate() {
            let checked = Datagram::new_checked(bytes)
                .unwrap_or_else(|e| panic!("{} packet {i}: {e}", path.display()));
            let repr = datagram::Repr::parse(&checked)
                .unwrap_or_else(|e| panic!("{} packet {i}: {e}", path.display()));
            let mut again = vec![0; repr.buffer_len()];
            repr.emit(&mut again).expect("emit");
            assert_eq!(&again, bytes, "{} packet {i}: {repr}", path.display());
            *opcodes
                .entry(repr.transport.bth.opcode.to_string())
                .or_default() += 1;
            total += 1;
        }
    }
    eprintln!("{total} captured RoCEv2 packets checked: {opcodes:?}");
    assert!(opcodes.contains_key(Opcode::ReadRequest.name()));
    assert!(opcodes.contains_key(Opcode::AtomicWrite.name()));
}

#[test]
fn a_flipped_bit_anywhere_fails_the_icrc_or_a_checksum() {
    let path = captures()
        .into_iter()
        .find(|p| p.ends_with("atomic-write.pcap"))
        .expect("atomic-write.pcap");
    let original = &roce_datagrams(&path)[0];
    // The IP checksum covers TOS and TTL, and the UDP checksum (zero in rxe's
    // packets) turns wrong when flipped; only the BTH's reserved byte (28 + 4)
    // is masked out of the ICRC and covered by nothing else.
    let unprotected = 28 + 4;
    for byte in 0..original.len() {
        let mut bytes = original.clone();
        bytes[byte] ^= 0x01;
        let accepted = Datagram::new_checked(&bytes).is_ok();
        assert_eq!(accepted, byte == unprotected, "byte {byte} flipped");
    }
}

/// A captured datagram with its parsed form.
struct Captured {
    bytes: Vec<u8>,
    repr: datagram::Repr<'static>,
}

fn parse_capture(path: &Path) -> Vec<Captured> {
    roce_datagrams(path)
        .into_iter()
        .map(|bytes| {
            // Leak so the parsed form can borrow: a test process, a few MB.
            let bytes: &'static [u8] = Vec::leak(bytes);
            let d = Datagram::new_checked(bytes).expect("checked");
            Captured {
                bytes: bytes.to_vec(),
                repr: datagram::Repr::parse(&d).expect("parsed"),
            }
        })
        .collect()
}

/// One endpoint of a capture, re-enacted by our responder.
struct Endpoint {
    qp: QueuePair,
    memory: BufferMemory,
    /// Our responses not yet matched against the capture's.
    ours: VecDeque<Vec<u8>>,
}

/// Builds our responder for the endpoint at `ip` from what the capture
/// shows of it: its QP number, its peer's, its UDP source port and TTL,
/// the first PSN it was sent, and its memory where a response reveals it
/// (the first READ response or atomic original at each address).
fn endpoint(capture: &[Captured], ip: Ipv4Addr) -> Option<Endpoint> {
    let to_it = capture
        .iter()
        .find(|c| c.repr.ip.dst == ip && c.repr.transport.bth.opcode.is_request())?;
    let from_it = capture.iter().find(|c| c.repr.ip.src == ip)?;
    let mut config = QpConfig::new(
        to_it.repr.transport.bth.dest_qp,
        from_it.repr.transport.bth.dest_qp,
        QpPath {
            local_ip: ip,
            remote_ip: to_it.repr.ip.src,
            src_port: from_it.repr.src_port,
            dscp: from_it.repr.ip.dscp,
            ttl: from_it.repr.ip.ttl,
        },
    );
    config.recv_psn = to_it.repr.transport.bth.psn;
    // The applications kept receives posted for every SEND they were sent.
    config.max_recv_wr = 1 << 16;
    let (va, rkey) = capture
        .iter()
        .filter(|c| c.repr.ip.dst == ip)
        .find_map(|c| {
            let t = &c.repr.transport;
            t.reth
                .map(|r| (r.va, r.rkey))
                .or(t.atomic_eth.map(|a| (a.va, a.rkey)))
        })
        .unwrap_or((0, 0));
    let base = va & !0xFFF;
    let mut memory = BufferMemory::new(base, rkey, 1 << 20);
    // Memory contents the capture reveals: answers to requests at known addresses.
    let mut requests = BTreeMap::new();
    let mut known = std::collections::BTreeSet::new();
    for (index, c) in capture.iter().enumerate() {
        let t = &c.repr.transport;
        if c.repr.ip.dst == ip && t.bth.opcode.is_request() {
            requests.entry(t.bth.psn.get()).or_insert((index, *t));
        } else if c.repr.ip.src == ip {
            let Some(&(req_index, req)) = requests.get(&t.bth.psn.get()) else {
                continue;
            };
            let (at, bytes) = match (t.bth.opcode, req.reth, req.atomic_eth) {
                (Opcode::ReadResponseOnly | Opcode::ReadResponseFirst, Some(r), _)
                    if req.bth.opcode == Opcode::ReadRequest =>
                {
                    (
                        r.va,
                        read_response_data(&capture[index..], ip, req.bth.psn, r.dma_len),
                    )
                }
                (Opcode::AtomicAcknowledge, _, Some(a)) => {
                    (a.va, t.atomic_ack.unwrap_or(0).to_ne_bytes().to_vec())
                }
                _ => continue,
            };
            if known.insert(at) && !bytes.is_empty() {
                let off = (at - base) as usize;
                if memory.bytes.get(off..off + bytes.len()).is_some()
                    && !written_before(&capture[..req_index], ip)
                {
                    memory.bytes[off..off + bytes.len()].copy_from_slice(&bytes);
                }
            }
        }
    }
    let mut qp = QueuePair::new(config).expect("config from capture");
    for wr_id in 0..config.max_recv_wr as u64 {
        qp.post_recv(wr_id, 1 << 20).expect("receive");
    }
    Some(Endpoint {
        qp,
        memory,
        ours: VecDeque::new(),
    })
}

/// The data of the READ response that starts at `psn`: its packets' payloads in PSN order.
fn read_response_data(from: &[Captured], ip: Ipv4Addr, psn: proto::roce::Psn, len: u32) -> Vec<u8> {
    let mut data = Vec::new();
    let mut next = psn;
    for c in from.iter().filter(|c| c.repr.ip.src == ip) {
        let t = &c.repr.transport;
        if t.bth.psn == next && !t.bth.opcode.is_request() {
            data.extend_from_slice(t.payload);
            next = next.next();
            if data.len() >= len as usize {
                break;
            }
        }
    }
    data
}

/// Whether `earlier` writes to the endpoint (then its memory is what our
/// responder wrote, not a preset).
fn written_before(earlier: &[Captured], ip: Ipv4Addr) -> bool {
    earlier.iter().any(|c| {
        c.repr.ip.dst == ip
            && matches!(
                c.repr.transport.bth.opcode,
                Opcode::WriteFirst
                    | Opcode::WriteOnly
                    | Opcode::WriteOnlyImm
                    | Opcode::AtomicWrite
                    | Opcode::CompareSwap
                    | Opcode::FetchAdd
            )
    })
}

/// Frames (numbered from 1, as tshark does) that the loss captures hold
/// but the receiver never got: a bridge rule dropped them after the capture
/// point (see `captures/README.md`).
const DROPPED: [(&str, usize); 3] = [
    ("loss.pcap", 12),
    ("loss-read.pcap", 23),
    ("loss-timeout.pcap", 47),
];

/// Feeds every request of a capture to our responder at its destination
/// and checks each response the capture holds against ours: the same
/// transport fields (PSN, opcode, AETH syndrome and MSN, payload, atomic
/// original) and, with the capture's IP header fields around it, the same
/// bytes, ICRC included. Returns the number of responses matched.
fn replay(path: &Path) -> usize {
    let capture = parse_capture(path);
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let dropped = DROPPED
        .iter()
        .find(|(file, _)| *file == name)
        .map(|&(_, frame)| frame - 1);
    let mut endpoints: BTreeMap<Ipv4Addr, Endpoint> = BTreeMap::new();
    let now = Instant::now();
    let mut matched = 0;
    let mut buf = Vec::new();
    for (index, c) in capture.iter().enumerate() {
        let t = &c.repr.transport;
        if t.bth.opcode.is_request() {
            if Some(index) == dropped {
                continue;
            }
            let ip = c.repr.ip.dst;
            let e = endpoints
                .entry(ip)
                .or_insert_with(|| endpoint(&capture, ip).expect("endpoint"));
            e.qp.handle_datagram(now, &c.bytes);
            e.qp.execute_with(&mut e.memory);
            while e.qp.poll_transmit(now, &mut buf) {
                e.ours.push_back(buf.clone());
            }
        } else {
            let Some(e) = endpoints.get_mut(&c.repr.ip.src) else {
                panic!(
                    "{}: a response from an endpoint that got no request",
                    path.display()
                );
            };
            let ours = e.ours.pop_front().unwrap_or_else(|| {
                panic!(
                    "{}: the capture has a response we did not send: {}",
                    path.display(),
                    c.repr
                )
            });
            let checked = Datagram::new_checked(&ours).expect("our datagram");
            let our_transport = packet::Repr::parse(&checked.transport).expect("our packet");
            assert_eq!(
                &our_transport,
                t,
                "{}: ours {} vs captured {}",
                path.display(),
                our_transport,
                c.repr
            );
            let again = datagram::Repr {
                ip: c.repr.ip,
                src_port: c.repr.src_port,
                udp_checksum: c.repr.udp_checksum,
                transport: our_transport,
            };
            let mut bytes = vec![0; again.buffer_len()];
            again.emit(&mut bytes).expect("emit");
            assert!(bytes == c.bytes, "{}: bytes of {}", path.display(), c.repr);
            matched += 1;
        }
    }
    for (ip, e) in &endpoints {
        assert!(
            e.ours.is_empty(),
            "{}: {ip} sent {} responses the capture lacks",
            path.display(),
            e.ours.len()
        );
    }
    matched
}

#[test]
fn our_responder_answers_captured_requests_exactly_as_linux_rxe_did() {
    let mut total = 0;
    for path in captures() {
        let n = replay(&path);
        eprintln!(
            "{}: {n} responses matched",
            path.file_name().unwrap_or_default().to_string_lossy()
        );
        total += n;
    }
    assert!(total > 2000, "only {total} responses matched");
}

#[test]
#[ignore = "prints a capture; run by hand with ROCE_DUMP=file.pcap"]
fn dump() {
    let name = std::env::var("ROCE_DUMP").unwrap_or_else(|_| "read.pcap".into());
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/captures")
        .join(name);
    for (i, c) in parse_capture(&path).iter().enumerate() {
        let r = &c.repr;
        let payload = &r.transport.payload[..r.transport.payload.len().min(16)];
        println!("{i}: {r} ident={} payload={payload:02x?}", r.ip.ident);
    }
}

#[test]
fn linux_rxe_takes_a_flush_only_with_its_own_icrc_and_answers_with_an_empty_read_response() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/quirks/rxe-flush.pcap");
    let datagrams = roce_datagrams(&path);
    assert_eq!(datagrams.len(), 2, "{}", path.display());
    let (flush, answer) = (&datagrams[0], &datagrams[1]);
    assert_eq!(flush[28], u8::from(Opcode::Flush));
    // The standard ICRC is not what rxe put on the wire…
    assert!(matches!(
        Datagram::new_checked(flush),
        Err(proto::roce::Error::BadIcrc { .. })
    ));
    // …its own variant is.
    let carried = u32::from_le_bytes(flush[flush.len() - 4..].try_into().expect("4 bytes"));
    let body = &flush[..flush.len() - 4];
    assert_eq!(proto::roce::icrc::ipv4_rxe_flush(body, 20), Some(carried));
    assert_ne!(proto::roce::icrc::ipv4(body, 20), Some(carried));
    // rxe answers a FLUSH like a READ of nothing, with a standard ICRC.
    let checked = Datagram::new_checked(answer).expect("rxe's answer verifies");
    let repr = datagram::Repr::parse(&checked).expect("parses");
    assert_eq!(repr.transport.bth.opcode, Opcode::ReadResponseOnly);
    assert!(repr.transport.payload.is_empty());
}
