//! RoCEv2 packets checked against tools nobody here wrote: scapy (its own
//! ICRC code, `scapy.contrib.roce`) both ways, and Wireshark's dissector
//! (tshark). `scripts/test.sh` installs both; a missing one fails the test
//! with what to install.

use std::io::Write;
use std::net::Ipv4Addr;
use std::path::Path;
use std::process::{Command, Stdio};

use pcap_file::DataLink;
use pcap_file::pcap::{PcapHeader, PcapPacket, PcapWriter};
use proto::roce::datagram::{self, IpFields};
use proto::roce::{Datagram, Opcode, Psn, aeth, atomic_eth, bth, feth, packet, reth};

fn script() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/roce_scapy.py")
}

fn run(mut command: Command, input: Option<&str>, install: &str) -> String {
    let program = format!("{:?}", command.get_program());
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{program}: {e}; install {install}"));
    if let Some(input) = input {
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(input.as_bytes())
            .expect("write stdin");
    }
    let out = child.wait_with_output().expect("wait");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{program} failed ({}); is {install} installed?\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// One datagram of every RC opcode, with plausible headers and a payload
/// (odd-sized, so padded) where the opcode carries one.
fn every_opcode() -> Vec<(Opcode, Vec<u8>)> {
    let mut out = Vec::new();
    for byte in 0..=u8::MAX {
        let opcode = Opcode::from(byte);
        let Some(layout) = opcode.layout() else {
            continue;
        };
        let payload: &[u8] = match (layout.payload, opcode) {
            (false, _) => &[],
            (true, Opcode::AtomicWrite) => b"8 bytes!",
            (true, _) => b"odd payload",
        };
        let transport = packet::Repr {
            feth: layout.feth.then_some(feth::Repr {
                placement: feth::PLACEMENT_PERSISTENT,
                selectivity: feth::SELECT_RANGE,
            }),
            reth: layout.reth.then_some(reth::Repr {
                va: 0x5555_0000_1000,
                rkey: 0x2BE,
                dma_len: payload.len().max(8) as u32,
            }),
            atomic_eth: layout.atomic_eth.then_some(atomic_eth::Repr {
                va: 0x5555_0000_2000,
                rkey: 0x2BE,
                swap_add: 9,
                compare: 7,
            }),
            aeth: layout.aeth.then_some(aeth::Repr {
                syndrome: aeth::Syndrome::Ack {
                    credits: aeth::UNLIMITED_CREDITS,
                },
                msn: 3,
            }),
            atomic_ack: layout.atomic_ack_eth.then_some(0x0102_0304_0506_0708),
            immdt: layout.immdt.then_some(0xBEEF),
            ieth: layout.ieth.then_some(0x1234),
            payload,
            ..packet::Repr::new(bth::Repr {
                opcode,
                solicited: false,
                migration: false,
                pkey: bth::DEFAULT_PKEY,
                dest_qp: 0x11,
                ack_req: opcode.is_request(),
                psn: Psn::new(u32::from(byte) * 7),
            })
        };
        let repr = datagram::Repr {
            ip: IpFields {
                src: Ipv4Addr::new(10, 77, 0, 2),
                dst: Ipv4Addr::new(10, 77, 0, 1),
                dscp: 0,
                ecn: 0,
                ident: 100 + u16::from(byte),
                dont_frag: true,
                ttl: 64,
            },
            src_port: 49441,
            udp_checksum: false,
            transport,
        };
        let mut bytes = vec![0; repr.buffer_len()];
        repr.emit(&mut bytes).expect("emit");
        out.push((opcode, bytes));
    }
    out
}

#[test]
fn packets_scapy_builds_parse_and_verify() {
    let mut cmd = Command::new("python3");
    cmd.arg(script()).arg("build");
    let listing = run(cmd, None, "scapy (python3 -m pip install scapy)");
    let mut seen = 0;
    for line in listing.lines() {
        let (name, hex) = line.split_once(' ').expect("NAME HEX");
        let bytes: Vec<u8> = (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex"))
            .collect();
        let checked = Datagram::new_checked(&bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
        let repr = datagram::Repr::parse(&checked).unwrap_or_else(|e| panic!("{name}: {e}"));
        let t = repr.transport;
        let expected = match name {
            "read_request" => Opcode::ReadRequest,
            "write_only" => Opcode::WriteOnly,
            "send_only" => Opcode::SendOnly,
            "compare_swap" => Opcode::CompareSwap,
            "fetch_add" => Opcode::FetchAdd,
            "ack" | "nak_sequence" => Opcode::Acknowledge,
            "atomic_ack" => Opcode::AtomicAcknowledge,
            "read_response_only" => Opcode::ReadResponseOnly,
            other => panic!("unknown packet {other}"),
        };
        assert_eq!(t.bth.opcode, expected, "{name}");
        match name {
            "write_only" => assert_eq!(t.payload, b"hello"),
            "send_only" => assert_eq!(t.payload, b"odd-length"),
            "compare_swap" => {
                let a = t.atomic_eth.expect("AtomicETH");
                assert_eq!((a.swap_add, a.compare), (9, 7));
            }
            "nak_sequence" => assert_eq!(
                t.aeth.map(|a| a.syndrome),
                Some(aeth::Syndrome::Nak(aeth::NakCode::PsnSequenceError))
            ),
            "atomic_ack" => assert_eq!(t.atomic_ack, Some(0x0102_0304_0506_0708)),
            "read_response_only" => assert_eq!(t.payload, (0..64).collect::<Vec<u8>>()),
            _ => {}
        }
        // And we emit the same bytes scapy did.
        let mut again = vec![0; repr.buffer_len()];
        repr.emit(&mut again).expect("emit");
        assert_eq!(again, bytes, "{name}");
        seen += 1;
    }
    assert_eq!(seen, 9, "{listing}");
}

#[test]
fn scapy_computes_the_icrc_we_carry_for_every_opcode() {
    let packets = every_opcode();
    let input: String = packets
        .iter()
        .map(|(op, bytes)| {
            let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
            format!("{} {hex}\n", op.name())
        })
        .collect();
    let mut cmd = Command::new("python3");
    cmd.arg(script()).arg("check");
    let out = run(cmd, Some(&input), "scapy (python3 -m pip install scapy)");
    assert_eq!(out.trim(), format!("ok {}", packets.len()));
    assert_eq!(packets.len(), 25, "every RC opcode");
}

#[test]
fn tshark_dissects_our_packets_as_infiniband_with_the_intended_opcodes() {
    let packets = every_opcode();
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("ours.pcap");
    let file = std::fs::File::create(&path).expect("create pcap");
    let header = PcapHeader {
        datalink: DataLink::ETHERNET,
        ..PcapHeader::default()
    };
    let mut writer = PcapWriter::with_header(file, header).expect("pcap header");
    for (i, (_, bytes)) in packets.iter().enumerate() {
        let mut frame = vec![
            0x52, 0x54, 0x00, 0x77, 0x00, 0x01, 0x52, 0x54, 0x00, 0x77, 0x00, 0x02,
        ];
        frame.extend_from_slice(&[0x08, 0x00]);
        frame.extend_from_slice(bytes);
        let ts = std::time::Duration::from_millis(i as u64);
        writer
            .write_packet(&PcapPacket::new(ts, frame.len() as u32, &frame))
            .expect("write packet");
    }
    drop(writer);
    let mut cmd = Command::new("tshark");
    // SEND payloads go to heuristic upper-layer dissectors (RPC over RDMA,
    // SMB Direct, …), which read our test text as their own and call it
    // malformed; the InfiniBand layer is what is checked here.
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
        cmd.args(["--disable-protocol", upper]);
    }
    cmd.arg("-r").arg(&path).args([
        "-T",
        "fields",
        "-E",
        "separator=;",
        "-e",
        "frame.number",
        "-e",
        "infiniband.bth.opcode",
        "-e",
        "_ws.malformed",
        "-e",
        "_ws.expert.severity",
    ]);
    let out = run(cmd, None, "tshark (Debian package tshark)");
    let rows: Vec<Vec<&str>> = out.lines().map(|l| l.split(';').collect()).collect();
    assert_eq!(rows.len(), packets.len(), "{out}");
    for (row, (opcode, _)) in rows.iter().zip(&packets) {
        assert_eq!(
            row.get(1).copied(),
            Some(u8::from(*opcode).to_string().as_str()),
            "{opcode}: {row:?}"
        );
        assert_eq!(
            row.get(2).copied(),
            Some(""),
            "{opcode} is malformed for tshark: {row:?}"
        );
        assert_eq!(
            row.get(3).copied(),
            Some(""),
            "{opcode} has expert info: {row:?}"
        );
    }
}
