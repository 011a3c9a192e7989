//! Property tests of the RoCEv2 wire format: no input makes any parser or
//! the queue pair panic; anything emitted checks, parses back to the same
//! value, and carries an ICRC that verifies.

use std::net::Ipv4Addr;
use std::time::Instant;

use proptest::prelude::*;
use proto::roce::datagram::{self, IpFields};
use proto::roce::rc::{Path, QpConfig, QueuePair};
use proto::roce::{
    Datagram, Opcode, Psn, aeth, atomic_ack_eth, atomic_eth, bth, feth, immdt, packet, reth,
};

/// A datagram of a random RC opcode with random header fields and, where
/// the opcode carries one, a random payload.
fn arbitrary_datagram() -> impl Strategy<Value = Vec<u8>> {
    let known: Vec<u8> = (0..=u8::MAX)
        .filter(|b| Opcode::from(*b).layout().is_some())
        .collect();
    (
        proptest::sample::select(known),
        any::<[u64; 4]>(),
        any::<u32>(),
        proptest::collection::vec(any::<u8>(), 0..2048),
        any::<(bool, bool, u16, u8)>(),
    )
        .prop_map(|(byte, words, small, mut payload, (se, ack, ident, syn))| {
            let opcode = Opcode::from(byte);
            let layout = opcode.layout().unwrap_or_default();
            if !layout.payload {
                payload.clear();
            }
            if opcode == Opcode::AtomicWrite {
                payload.resize(8, 0);
            }
            let transport = packet::Repr {
                feth: layout.feth.then_some(feth::Repr {
                    placement: (small & 0xF) as u8,
                    selectivity: ((small >> 4) & 0x3) as u8,
                }),
                reth: layout.reth.then_some(reth::Repr {
                    va: words[0],
                    rkey: small,
                    dma_len: words[1] as u32,
                }),
                atomic_eth: layout.atomic_eth.then_some(atomic_eth::Repr {
                    va: words[0],
                    rkey: small,
                    swap_add: words[2],
                    compare: words[3],
                }),
                aeth: layout.aeth.then_some(aeth::Repr {
                    syndrome: aeth::Syndrome::from(syn & 0x7F),
                    msn: small & 0xFF_FFFF,
                }),
                atomic_ack: layout.atomic_ack_eth.then_some(words[2]),
                immdt: layout.immdt.then_some(small),
                ieth: layout.ieth.then_some(small.rotate_left(7)),
                payload: &payload,
                ..packet::Repr::new(bth::Repr {
                    opcode,
                    solicited: se,
                    migration: false,
                    pkey: (words[3] >> 48) as u16,
                    dest_qp: small & 0xFF_FFFF,
                    ack_req: ack,
                    psn: Psn::new(words[1] as u32),
                })
            };
            let repr = datagram::Repr {
                ip: IpFields {
                    src: Ipv4Addr::from(words[0] as u32),
                    dst: Ipv4Addr::from(words[1] as u32),
                    dscp: (syn >> 2) & 0x3F,
                    ecn: syn & 0x3,
                    ident,
                    dont_frag: se,
                    ttl: syn.max(1),
                },
                src_port: ident,
                udp_checksum: ack,
                transport,
            };
            let mut bytes = vec![0; repr.buffer_len()];
            repr.emit(&mut bytes).expect("emit");
            bytes
        })
}

proptest! {
    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..1600)) {
        if let Ok(d) = Datagram::new_checked(&bytes) {
            let _ = datagram::Repr::parse(&d);
        }
        if let Ok(p) = packet::Packet::new_checked(&bytes[..]) {
            let _ = packet::Repr::parse(&p);
            let _ = (p.reth(), p.aeth(), p.atomic_eth(), p.feth(), p.immdt(), p.payload());
        }
        let _ = bth::Packet::new_checked(&bytes[..]).map(|p| bth::Repr::parse(&p));
        let _ = reth::Packet::new_checked(&bytes[..]).map(|p| reth::Repr::parse(&p));
        let _ = aeth::Packet::new_checked(&bytes[..]).map(|p| aeth::Repr::parse(&p));
        let _ = atomic_eth::Packet::new_checked(&bytes[..]).map(|p| atomic_eth::Repr::parse(&p));
        let _ = atomic_ack_eth::Packet::new_checked(&bytes[..]).map(|p| p.original());
        let _ = feth::Packet::new_checked(&bytes[..]).map(|p| feth::Repr::parse(&p));
        let _ = immdt::Packet::new_checked(&bytes[..]).map(|p| p.value());
    }

    #[test]
    fn a_queue_pair_survives_any_datagram(bytes in proptest::collection::vec(any::<u8>(), 0..1600)) {
        let path = Path {
            local_ip: Ipv4Addr::new(10, 0, 0, 1),
            remote_ip: Ipv4Addr::new(10, 0, 0, 2),
            src_port: 1,
            dscp: 0,
            ttl: 64,
        };
        let mut qp = QueuePair::new(QpConfig::new(1, 2, path)).expect("qp");
        let now = Instant::now();
        qp.handle_datagram(now, &bytes);
        let mut out = Vec::new();
        while qp.poll_transmit(now, &mut out) {}
        while qp.poll_completion().is_some() {}
    }

    #[test]
    fn emitted_datagrams_verify_and_parse_back(bytes in arbitrary_datagram()) {
        let checked = Datagram::new_checked(&bytes).expect("our own datagram checks");
        let repr = datagram::Repr::parse(&checked).expect("parses");
        let mut again = vec![0; repr.buffer_len()];
        repr.emit(&mut again).expect("emit");
        prop_assert_eq!(again, bytes);
    }

    #[test]
    fn a_valid_datagram_with_any_byte_changed_is_refused_or_means_the_same(
        bytes in arbitrary_datagram(),
        at in any::<prop::sample::Index>(),
        flip in 1u8..=255,
    ) {
        let mut bad = bytes.clone();
        let i = at.index(bad.len());
        bad[i] ^= flip;
        // Only the BTH's reserved byte (offset 28 + 4) is outside every
        // checksum, and the UDP checksum field (26..28) may turn into "no
        // checksum" (zero) or, rarely, into the right one; any other change
        // must be caught.
        if i != 32 && !(26..28).contains(&i) {
            prop_assert!(Datagram::new_checked(&bad).is_err(), "byte {} changed unnoticed", i);
        }
    }
}
