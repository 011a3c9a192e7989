//! Arbitrary bytes against the RoCEv2 parser and the RC queue pair.
//!
//! The bytes are used twice: as a whole IPv4 datagram (checking, parsing
//! and re-emitting must never panic, and what is accepted re-encodes to its
//! length and parses back to the same value; the queue pair gets it too),
//! and as a sequence of transport packets that this target wraps
//! in valid IPv4/UDP headers with a correct ICRC and addresses them to the
//! queue pair, so the fuzzer reaches the RC state machines instead of
//! stopping at the checksums.
#![no_main]

use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use libfuzzer_sys::fuzz_target;
use proto::roce::rc::{BufferMemory, Path, QpConfig, QueuePair};
use proto::roce::{Datagram, datagram, icrc, packet};

const LOCAL: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
const PEER: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);
const QPN: u32 = 1;

/// `transport` (BTH onwards, ICRC excluded) as a datagram from the peer to
/// the queue pair, with IPv4 checksum and ICRC filled in.
fn wrap(transport: &[u8]) -> Vec<u8> {
    let total = 20 + 8 + transport.len() + 4;
    let mut d = vec![0u8; total];
    d[0] = 0x45;
    d[2..4].copy_from_slice(&(total as u16).to_be_bytes());
    d[4..6].copy_from_slice(&7u16.to_be_bytes());
    d[6] = 0x40;
    d[8] = 64;
    d[9] = 17;
    d[12..16].copy_from_slice(&PEER.octets());
    d[16..20].copy_from_slice(&LOCAL.octets());
    let sum = d[..20]
        .chunks(2)
        .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])))
        .sum::<u32>();
    let folded = (sum & 0xFFFF) + (sum >> 16);
    let checksum = !((folded & 0xFFFF) + (folded >> 16)) as u16;
    d[10..12].copy_from_slice(&checksum.to_be_bytes());
    d[20..22].copy_from_slice(&49152u16.to_be_bytes());
    d[22..24].copy_from_slice(&4791u16.to_be_bytes());
    d[24..26].copy_from_slice(&((total - 20) as u16).to_be_bytes());
    d[28..28 + transport.len()].copy_from_slice(transport);
    if transport.len() >= 8 {
        // Address the queue pair under test.
        d[28 + 5..28 + 8].copy_from_slice(&QPN.to_be_bytes()[1..]);
    }
    let crc = icrc::ipv4(&d[..total - 4], 20).unwrap_or(0);
    d[total - 4..].copy_from_slice(&crc.to_le_bytes());
    d
}

fuzz_target!(|bytes: &[u8]| {
    if let Ok(checked) = Datagram::new_checked(bytes) {
        // Only a transport version other than 0 is refused after the checks.
        if let Ok(repr) = datagram::Repr::parse(&checked) {
            let mut again = vec![0; repr.buffer_len()];
            repr.emit(&mut again).expect("a parsed datagram emits");
            assert_eq!(again.len(), checked.total_len);
            let rechecked = Datagram::new_checked(&again).expect("what we emit checks");
            let reparsed = datagram::Repr::parse(&rechecked).expect("what we emit parses");
            assert_eq!(reparsed, repr, "emit then parse changed the datagram");
        }
    }
    let _ = packet::Packet::new_checked(bytes).map(|p| packet::Repr::parse(&p));

    let path = Path {
        local_ip: LOCAL,
        remote_ip: PEER,
        src_port: 1,
        dscp: 0,
        ttl: 64,
    };
    let Ok(mut qp) = QueuePair::new(QpConfig::new(QPN, 2, path)) else {
        return;
    };
    let _ = qp.post_recv(1, 4096);
    let mut memory = BufferMemory::new(0, 0, 4096);
    let mut now = Instant::now();
    let mut out = Vec::new();
    // The input as it is, then as transport packets with valid wrappers.
    qp.handle_datagram(now, bytes);
    // Each packet: one length byte (in 4-byte units), then that many bytes.
    let mut rest = bytes;
    while let Some((&len, tail)) = rest.split_first() {
        let take = (usize::from(len) * 4).min(tail.len());
        let (transport, next) = tail.split_at(take);
        rest = next;
        qp.handle_datagram(now, &wrap(transport));
        qp.execute_with(&mut memory);
        while qp.poll_transmit(now, &mut out) {}
        while qp.poll_completion().is_some() {}
        now += Duration::from_millis(1);
        qp.handle_timeout(now);
    }
});
