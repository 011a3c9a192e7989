//! RoCEv2 packets checked against tools nobody here wrote:
//!
//! - scapy (`scapy.contrib.roce`, with its own ICRC code), both ways:
//!   packets scapy builds must check and parse to the intended fields, and
//!   scapy must compute the same ICRC, checksums and lengths for the
//!   datagrams we emit (`tests/scapy_roce.py` is the scapy side);
//! - Wireshark's InfiniBand dissector (tshark), which must read every RC
//!   opcode we emit with the intended fields and without expert info.
//!
//! `scripts/test.sh` installs both; when one is missing, the test fails and
//! names what to install.

use std::io::{ErrorKind, Write};
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use pcap_file::DataLink;
use pcap_file::pcap::{PcapHeader, PcapPacket, PcapWriter};
use proto::roce::datagram::{self, IpFields};
use proto::roce::{Datagram, Opcode, Psn, aeth, atomic_eth, bth, feth, packet, reth};

const INSTALL_SCAPY: &str = "python3 and scapy (`python3 -m pip install scapy`)";
const INSTALL_TSHARK: &str = "tshark (Debian package `tshark`)";

/// Runs a tool nobody here wrote and returns its standard output; fails
/// the test, naming what to install, when it is missing or fails.
fn run(program: &str, args: &[&str], input: Option<&str>, install: &str) -> String {
    let mut child = match Command::new(program)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    {
        Ok(child) => child,
        Err(e) if e.kind() == ErrorKind::NotFound => {
            panic!("`{program}` is not installed: install {install}")
        }
        Err(e) => panic!("cannot start `{program}`: {e}"),
    };
    if let Some(input) = input {
        let mut stdin = child.stdin.take().expect("stdin");
        stdin.write_all(input.as_bytes()).expect("write stdin");
    }
    drop(child.stdin.take());
    let out = child.wait_with_output().expect("wait for the tool");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !stderr.contains("No module named 'scapy"),
        "scapy is not installed: install {install}"
    );
    assert!(
        out.status.success(),
        "`{program} {}` failed ({}); it needs {install}\n{stdout}\n{stderr}",
        args.join(" "),
        out.status
    );
    stdout
}

fn scapy(mode: &str, input: Option<&str>) -> String {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/scapy_roce.py");
    let script = script.to_str().expect("UTF-8 path");
    run("python3", &[script, mode], input, INSTALL_SCAPY)
}

fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn from_hex(hex: &str) -> Vec<u8> {
    assert!(hex.len().is_multiple_of(2), "odd hex length");
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex digit"))
        .collect()
}

/// `N` bytes counting up from `start`, wrapping.
const fn counting<const N: usize>(start: u8) -> [u8; N] {
    let mut out = [0; N];
    let mut i = 0;
    while i < N {
        out[i] = start.wrapping_add(i as u8);
        i += 1;
    }
    out
}

static ATOMIC_WRITE_VALUE: [u8; 8] = counting(1);
static READ_RESPONSE: [u8; 61] = counting(0);
static MTU_PAYLOAD: [u8; 1024] = counting(0);

const VA: u64 = 0x5555_0000_1000;
const RKEY: u32 = 0x2BE;
const QPN: u32 = 0x11;

fn ip(ident: u16, tos: u8) -> IpFields {
    IpFields {
        src: Ipv4Addr::new(10, 77, 0, 2),
        dst: Ipv4Addr::new(10, 77, 0, 1),
        dscp: tos >> 2,
        ecn: tos & 0x3,
        ident,
        dont_frag: true,
        ttl: 64,
    }
}

fn bth(opcode: Opcode, psn: u32, ack_req: bool) -> bth::Repr {
    bth::Repr {
        opcode,
        solicited: false,
        migration: false,
        pkey: bth::DEFAULT_PKEY,
        dest_qp: QPN,
        ack_req,
        psn: Psn::new(psn),
    }
}

fn ack(syndrome: u8, msn: u32) -> Option<aeth::Repr> {
    Some(aeth::Repr {
        syndrome: aeth::Syndrome::from(syndrome),
        msn,
    })
}

/// What each packet `scapy_roce.py build` prints must parse to.
fn scapy_built(name: &str) -> Option<datagram::Repr<'static>> {
    let request = |opcode, psn| packet::Repr::new(bth(opcode, psn, true));
    let response = |opcode, psn| packet::Repr::new(bth(opcode, psn, false));
    let reth = |va, dma_len| {
        Some(reth::Repr {
            va,
            rkey: RKEY,
            dma_len,
        })
    };
    let atomic = |va, swap_add, compare| {
        Some(atomic_eth::Repr {
            va,
            rkey: RKEY,
            swap_add,
            compare,
        })
    };
    let (transport, tos, udp_checksum) = match name {
        "read_request" => (
            packet::Repr {
                reth: reth(VA, 4096),
                ..request(Opcode::ReadRequest, 1)
            },
            0,
            false,
        ),
        "write_only" => (
            packet::Repr {
                reth: reth(VA, 5),
                payload: b"hello",
                ..request(Opcode::WriteOnly, 2)
            },
            0,
            false,
        ),
        "write_only_imm" => (
            packet::Repr {
                reth: reth(VA + 0x40, 6),
                immdt: Some(0xBEEF),
                payload: b"imm!!!",
                ..request(Opcode::WriteOnlyImm, 3)
            },
            0,
            false,
        ),
        "send_only" => {
            let mut send = request(Opcode::SendOnly, 4);
            send.bth.solicited = true;
            send.payload = b"odd-length!";
            (send, 0, false)
        }
        "send_only_udp_checksum" => (
            packet::Repr {
                payload: b"with a UDP checksum",
                ..request(Opcode::SendOnly, 5)
            },
            0,
            true,
        ),
        "send_only_inv" => (
            packet::Repr {
                ieth: Some(0x1234),
                payload: b"inv",
                ..request(Opcode::SendOnlyInv, 6)
            },
            0,
            false,
        ),
        "compare_swap" => (
            packet::Repr {
                atomic_eth: atomic(VA + 0x1000, 9, 7),
                ..request(Opcode::CompareSwap, 7)
            },
            0,
            false,
        ),
        // DSCP 26 (AF31), ECN ECT(0).
        "fetch_add" => (
            packet::Repr {
                atomic_eth: atomic(VA + 0x1008, 1, 0),
                ..request(Opcode::FetchAdd, 8)
            },
            0x6A,
            false,
        ),
        "flush" => (
            packet::Repr {
                feth: Some(feth::Repr {
                    placement: feth::PLACEMENT_PERSISTENT,
                    selectivity: feth::SELECT_RANGE,
                }),
                reth: reth(VA, 64),
                ..request(Opcode::Flush, 9)
            },
            0,
            false,
        ),
        "atomic_write" => (
            packet::Repr {
                reth: reth(VA + 0x2000, 8),
                payload: &ATOMIC_WRITE_VALUE,
                ..request(Opcode::AtomicWrite, 10)
            },
            0,
            false,
        ),
        "ack" => (
            packet::Repr {
                aeth: ack(0x1F, 3),
                ..response(Opcode::Acknowledge, 11)
            },
            0,
            false,
        ),
        "nak_sequence" => (
            packet::Repr {
                aeth: ack(0x60, 3),
                ..response(Opcode::Acknowledge, 12)
            },
            0,
            false,
        ),
        "rnr_nak" => (
            packet::Repr {
                aeth: ack(0x20 | 14, 3),
                ..response(Opcode::Acknowledge, 13)
            },
            0,
            false,
        ),
        "atomic_ack" => (
            packet::Repr {
                aeth: ack(0x1F, 4),
                atomic_ack: Some(0x0102_0304_0506_0708),
                ..response(Opcode::AtomicAcknowledge, 14)
            },
            0,
            false,
        ),
        "read_response_only" => (
            packet::Repr {
                aeth: ack(0x1F, 5),
                payload: &READ_RESPONSE,
                ..response(Opcode::ReadResponseOnly, 15)
            },
            0,
            false,
        ),
        "read_response_middle" => (
            packet::Repr {
                payload: &MTU_PAYLOAD,
                ..response(Opcode::ReadResponseMiddle, 16)
            },
            0,
            false,
        ),
        _ => return None,
    };
    let psn = transport.bth.psn.get() as u16;
    Some(datagram::Repr {
        ip: ip(100 + psn, tos),
        src_port: 49441,
        udp_checksum,
        transport,
    })
}

#[test]
fn packets_scapy_builds_check_and_parse_to_the_intended_fields() {
    let listing = scapy("build", None);
    let mut seen = Vec::new();
    for line in listing.lines().filter(|l| !l.trim().is_empty()) {
        let (name, hex) = line.split_once(' ').expect("NAME HEX");
        let frame = from_hex(hex.trim());
        let ip = datagram::ethernet_payload(&frame).unwrap_or_else(|e| panic!("{name}: {e}"));
        let checked = Datagram::new_checked(ip).unwrap_or_else(|e| panic!("{name}: {e}"));
        let repr = datagram::Repr::parse(&checked).unwrap_or_else(|e| panic!("{name}: {e}"));
        let expected = scapy_built(name).unwrap_or_else(|| panic!("unexpected packet {name}"));
        assert_eq!(repr, expected, "{name}");
        // And we emit the very bytes scapy did.
        let mut again = vec![0; repr.buffer_len()];
        repr.emit(&mut again).expect("emit");
        assert_eq!(to_hex(&again), to_hex(&ip[..checked.total_len]), "{name}");
        seen.push(name.to_owned());
    }
    eprintln!(
        "scapy built {} packets; all checked and parsed: {seen:?}",
        seen.len()
    );
    assert_eq!(seen.len(), 16, "{listing}");
}

/// One datagram of every RC opcode, with realistic headers: a full 1 KiB
/// MTU payload for FIRST and MIDDLE packets, odd-sized (so padded) payloads
/// for the others that carry one, and an 8-byte value for ATOMIC_WRITE.
/// Every other datagram has a UDP checksum, and DSCP and ECN vary.
fn every_opcode() -> Vec<datagram::Repr<'static>> {
    let mut out = Vec::new();
    for byte in 0..=u8::MAX {
        let opcode = Opcode::from(byte);
        let Some(layout) = opcode.layout() else {
            continue;
        };
        let payload: &'static [u8] = if !layout.payload {
            &[]
        } else if opcode == Opcode::AtomicWrite {
            &ATOMIC_WRITE_VALUE
        } else if !opcode.ends_message() {
            &MTU_PAYLOAD
        } else {
            &MTU_PAYLOAD[..13 + usize::from(byte) * 2]
        };
        let index = out.len() as u32;
        let psn = 0xFF_FFF0 + index * 3;
        let transport = packet::Repr {
            feth: layout.feth.then_some(feth::Repr {
                placement: feth::PLACEMENT_PERSISTENT,
                selectivity: feth::SELECT_RANGE,
            }),
            reth: layout.reth.then_some(reth::Repr {
                va: VA + u64::from(byte) * 0x100,
                rkey: RKEY,
                dma_len: if opcode == Opcode::Flush {
                    4096
                } else {
                    payload.len().max(64) as u32
                },
            }),
            atomic_eth: layout.atomic_eth.then_some(atomic_eth::Repr {
                va: VA + 0x2000,
                rkey: RKEY,
                swap_add: 0x1111_2222_3333_4444,
                compare: 0x5555_6666_7777_8888,
            }),
            aeth: layout.aeth.then_some(aeth::Repr {
                syndrome: aeth::Syndrome::Ack {
                    credits: aeth::UNLIMITED_CREDITS,
                },
                msn: 0x12_3456 + index,
            }),
            atomic_ack: layout.atomic_ack_eth.then_some(0x0102_0304_0506_0708),
            immdt: layout.immdt.then_some(0xBEEF_0000 + index),
            ieth: layout.ieth.then_some(0x2BE),
            payload,
            ..packet::Repr::new(bth::Repr {
                solicited: opcode.is_request() && opcode.ends_message(),
                ..bth(opcode, psn & 0xFF_FFFF, opcode.is_request())
            })
        };
        out.push(datagram::Repr {
            ip: ip(0x4000 + index as u16, (index as u8 % 4) | 0x68),
            src_port: 49152 + index as u16,
            udp_checksum: index % 2 == 1,
            transport,
        });
    }
    out
}

fn emit(repr: &datagram::Repr<'_>) -> Vec<u8> {
    let mut bytes = vec![0; repr.buffer_len()];
    repr.emit(&mut bytes).expect("emit");
    bytes
}

#[test]
fn scapy_computes_the_icrc_checksums_and_lengths_we_carry() {
    let packets = every_opcode();
    assert_eq!(packets.len(), 25, "every RC opcode");
    // FLUSH (0x1C), ATOMIC_WRITE (0x1D) and SEND_*_WITH_INVALIDATE are not
    // in scapy's opcode table: scapy keeps the number and computes the ICRC
    // over the bytes after the BTH as raw bytes (see scapy_roce.py).
    let input: String = packets
        .iter()
        .map(|repr| {
            let opcode = repr.transport.bth.opcode;
            format!(
                "{} {} {}\n",
                opcode.name(),
                u8::from(opcode),
                to_hex(&emit(repr))
            )
        })
        .collect();
    let out = scapy("check", Some(&input));
    assert_eq!(out.trim(), format!("ok {}", packets.len()));
    eprintln!("scapy agrees on all {} datagrams we emitted", packets.len());
}

/// tshark's `-T fields` columns, in this order.
const TSHARK_FIELDS: [&str; 22] = [
    "frame.number",
    "frame.protocols",
    "udp.dstport",
    "infiniband.bth.opcode",
    "infiniband.bth.se",
    "infiniband.bth.padcnt",
    "infiniband.bth.destqp",
    "infiniband.bth.a",
    "infiniband.bth.psn",
    "infiniband.reth.va",
    "infiniband.reth.r_key",
    "infiniband.reth.dmalen",
    "infiniband.atomiceth.swapdt",
    "infiniband.atomiceth.cmpdt",
    "infiniband.aeth.syndrome",
    "infiniband.aeth.msn",
    "infiniband.atomicacketh.origremdt",
    "infiniband.immdt",
    "infiniband.ieth",
    "data.data",
    "infiniband.invariant.crc",
    "_ws.expert",
];

/// The headers Wireshark 4.0 does not decode for FLUSH and ATOMIC_WRITE.
const TSHARK_HEADERS: [&str; 9] = [
    "infiniband.reth.va",
    "infiniband.atomiceth.swapdt",
    "infiniband.aeth.syndrome",
    "infiniband.atomicacketh.origremdt",
    "infiniband.immdt",
    "infiniband.ieth",
    "data.data",
    "infiniband.invariant.crc",
    "infiniband.reth.dmalen",
];

/// What tshark must show for one of our datagrams, field by field
/// (`None`: not checked), in tshark's own formatting.
fn tshark_expects(repr: &datagram::Repr<'_>, bytes: &[u8]) -> Vec<(&'static str, String)> {
    let t = &repr.transport;
    let opcode = t.bth.opcode;
    let flag = |b: bool| if b { "1" } else { "0" }.to_owned();
    let mut want = vec![
        ("frame.protocols", String::new()),
        ("udp.dstport", "4791".to_owned()),
        ("infiniband.bth.opcode", u8::from(opcode).to_string()),
        ("infiniband.bth.se", flag(t.bth.solicited)),
        ("infiniband.bth.padcnt", t.pad().to_string()),
        ("infiniband.bth.destqp", format!("{:#08x}", t.bth.dest_qp)),
        ("infiniband.bth.a", flag(t.bth.ack_req)),
        ("infiniband.bth.psn", t.bth.psn.get().to_string()),
        ("_ws.expert", String::new()),
    ];
    // Wireshark 4.0 knows neither FLUSH (0x1C) nor ATOMIC_WRITE (0x1D) from
    // IBTA 1.5: it names them "Unknown (28)" and "Unknown (29)" and shows
    // everything after the BTH as one block of "Unknown/Vendor Specific
    // Data", ICRC included. Exactly that is accepted for those two.
    if matches!(opcode, Opcode::Flush | Opcode::AtomicWrite) {
        want[0].1 = "eth:ethertype:ip:udp:infiniband".to_owned();
        want.extend(TSHARK_HEADERS.iter().map(|h| (*h, String::new())));
        return want;
    }
    // A payload goes to the `data` dissector, pad bytes included.
    let mut padded = t.payload.to_vec();
    padded.resize(t.payload.len() + usize::from(t.pad()), 0);
    want[0].1 = if padded.is_empty() {
        "eth:ethertype:ip:udp:infiniband"
    } else {
        "eth:ethertype:ip:udp:infiniband:data"
    }
    .to_owned();
    want.push(("data.data", to_hex(&padded)));
    // The AtomicETH's address and key show as the RETH's fields.
    let (va, rkey) = match (t.reth, t.atomic_eth) {
        (Some(r), _) => (Some(r.va), Some(r.rkey)),
        (_, Some(a)) => (Some(a.va), Some(a.rkey)),
        _ => (None, None),
    };
    let text = |v: Option<String>| v.unwrap_or_default();
    let twice = |v: u32| {
        let hex = to_hex(&v.to_be_bytes());
        format!("{hex},{hex}")
    };
    want.extend([
        ("infiniband.reth.va", text(va.map(|v| format!("{v:#018x}")))),
        (
            "infiniband.reth.r_key",
            text(rkey.map(|k| format!("{k:#010x}"))),
        ),
        (
            "infiniband.reth.dmalen",
            text(t.reth.map(|r| r.dma_len.to_string())),
        ),
        (
            "infiniband.atomiceth.swapdt",
            text(t.atomic_eth.map(|a| a.swap_add.to_string())),
        ),
        (
            "infiniband.atomiceth.cmpdt",
            text(t.atomic_eth.map(|a| a.compare.to_string())),
        ),
        (
            "infiniband.aeth.syndrome",
            text(t.aeth.map(|a| u8::from(a.syndrome).to_string())),
        ),
        (
            "infiniband.aeth.msn",
            text(t.aeth.map(|a| a.msn.to_string())),
        ),
        (
            "infiniband.atomicacketh.origremdt",
            text(t.atomic_ack.map(|v| v.to_string())),
        ),
        // Wireshark 4.0 adds ImmDt and IETH to the tree twice.
        ("infiniband.immdt", text(t.immdt.map(twice))),
        ("infiniband.ieth", text(t.ieth.map(twice))),
    ]);
    // tshark shows the ICRC's four wire bytes as a big-endian number.
    let wire = &bytes[bytes.len() - packet::ICRC_LEN..];
    let icrc = u32::from_be_bytes([wire[0], wire[1], wire[2], wire[3]]);
    want.push(("infiniband.invariant.crc", format!("{icrc:#010x}")));
    want
}

#[test]
fn tshark_dissects_every_opcode_we_emit_as_intended() {
    let packets = every_opcode();
    let datagrams: Vec<Vec<u8>> = packets.iter().map(emit).collect();
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("ours.pcap");
    let file = std::fs::File::create(&path).expect("create pcap");
    let header = PcapHeader {
        datalink: DataLink::ETHERNET,
        ..PcapHeader::default()
    };
    let mut writer = PcapWriter::with_header(file, header).expect("pcap header");
    for (i, bytes) in datagrams.iter().enumerate() {
        // A made-up Ethernet II header (locally administered MACs, IPv4).
        let mut frame = vec![
            0x52, 0x54, 0x00, 0x77, 0x00, 0x01, 0x52, 0x54, 0x00, 0x77, 0x00, 0x02, 0x08, 0x00,
        ];
        frame.extend_from_slice(bytes);
        let ts = Duration::from_millis(i as u64);
        writer
            .write_packet(&PcapPacket::new(ts, frame.len() as u32, &frame))
            .expect("write packet");
    }
    drop(writer);

    // UDP 4791 is dissected as RoCEv2 by default; say so anyway.
    let mut args = vec!["-o", "infiniband.rroce.port:4791"];
    // Payloads are offered to heuristic upper-layer dissectors (RPC over
    // RDMA, SMB Direct, …), which take our counting bytes for their own
    // headers and call them malformed. The InfiniBand layer is what is
    // checked here, so they are turned off and payloads show as `data`.
    for upper in [
        "rpcordma",
        "smb_direct",
        "smc",
        "nvme-rdma",
        "lnet",
        "iser",
        "infiniband_sdp",
        "fcoib",
        "eoib",
    ] {
        args.extend(["--disable-protocol", upper]);
    }
    let pcap = path.to_str().expect("UTF-8 path");
    args.extend(["-r", pcap, "-T", "fields", "-E", "separator=;"]);
    for field in TSHARK_FIELDS {
        args.extend(["-e", field]);
    }
    let out = run("tshark", &args, None, INSTALL_TSHARK);

    let rows: Vec<Vec<&str>> = out.lines().map(|l| l.split(';').collect()).collect();
    assert_eq!(rows.len(), packets.len(), "one line per packet:\n{out}");
    for (i, (row, (repr, bytes))) in rows.iter().zip(packets.iter().zip(&datagrams)).enumerate() {
        assert_eq!(row.len(), TSHARK_FIELDS.len(), "{row:?}");
        assert_eq!(row[0], (i + 1).to_string(), "{row:?}");
        let opcode = repr.transport.bth.opcode;
        for (name, want) in tshark_expects(repr, bytes) {
            let at = TSHARK_FIELDS
                .iter()
                .position(|f| *f == name)
                .expect("a listed field");
            assert_eq!(row[at], want, "{name} of {opcode} (frame {})", i + 1);
        }
    }
    eprintln!(
        "tshark dissected all {} packets as InfiniBand over UDP 4791 with the intended \
         opcode and fields, no expert info (FLUSH and ATOMIC_WRITE as unknown opcodes)",
        rows.len()
    );
}
