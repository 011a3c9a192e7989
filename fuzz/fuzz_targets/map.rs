//! MAP bodies (the address map a server or fabric device sends after
//! MAP_REQUEST) from arbitrary bytes, alone and as whole frames.
//!
//! A body that parses has as many entries as it says, re-emits to the very
//! same bytes, and answers key look-ups for any region; a MAP value built
//! from arbitrary fields emits to a body that parses back to it.
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use pmem_fabric_fuzz::frames::{check_frame, framed};
use proto::map::{self, MapEntry};
use proto::{AccessKey, Opcode, PmemAddr, RegionIndex};

#[derive(Debug, Arbitrary)]
enum Input {
    /// Any body.
    Body { tag: u64, body: Vec<u8> },
    /// A value built from fields.
    Built {
        digest: [u8; 32],
        extent_size: u64,
        entries: Vec<(u64, u64, u32, u16, u16, u64)>,
    },
}

fn check_body(body: &[u8]) {
    let Ok(packet) = map::Packet::new_checked(body) else {
        return;
    };
    let count = packet.entry_count() as usize;
    assert!(packet.entry(count).is_none(), "an entry past the count");
    let Ok(repr) = map::Repr::parse(&packet) else {
        return;
    };
    assert_eq!(repr.entries.len(), count);
    assert_eq!(repr.buffer_len(), body.len());
    let mut again = vec![0; repr.buffer_len()];
    repr.emit(&mut map::Packet::new_unchecked(&mut again[..]));
    assert_eq!(again, body, "a parsed MAP re-emits to other bytes");
    for entry in &repr.entries {
        let key = repr.key(entry.region);
        assert!(
            repr.entries
                .iter()
                .any(|e| e.region == entry.region && e.key == key)
        );
    }
    assert_eq!(
        repr.key(RegionIndex(u32::MAX)),
        repr.entries
            .iter()
            .find(|e| e.region == RegionIndex(u32::MAX))
            .map_or(AccessKey::NONE, |e| e.key)
    );
}

fuzz_target!(|input: Input| {
    match input {
        Input::Body { tag, body } => {
            check_body(&body);
            let mut frame = Vec::new();
            framed(Opcode::Map, tag, &body, &mut frame);
            check_frame(&frame);
        }
        Input::Built {
            digest,
            extent_size,
            entries,
        } => {
            let repr = map::Repr {
                digest,
                extent_size,
                entries: entries
                    .into_iter()
                    .map(|(start, len, region, server, socket, key)| MapEntry {
                        start: PmemAddr(start),
                        len,
                        region: RegionIndex(region),
                        server,
                        socket,
                        key: AccessKey(key),
                    })
                    .collect(),
            };
            let mut body = vec![0; repr.buffer_len()];
            repr.emit(&mut map::Packet::new_unchecked(&mut body[..]));
            let packet = map::Packet::new_checked(&body[..]).expect("an emitted MAP checks");
            assert_eq!(map::Repr::parse(&packet), Ok(repr.clone()));
            check_body(&body);
        }
    }
});
