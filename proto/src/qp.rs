//! QP_CONNECT and QP_ACCEPT: setting up a RoCEv2 queue pair over the
//! control connection a client already has with its fabric device.
//!
//! The client (authenticated on that connection with HELLO) sends
//! QP_CONNECT with its queue pair's end; the device creates its own queue
//! pair, bound to that client, and answers QP_ACCEPT with its end and the
//! R_Keys to use for each region (RDMA carries 32-bit R_Keys; each stands
//! for a region's 64-bit key on this queue pair only).
//!
//! QP_CONNECT body ([`Connect`]): the client's [`Endpoint`], 16 bytes,
//! optionally followed by 16 bytes naming the queue pair's exactly-once
//! lane ([`AtomicSeq`]):
//!
//! ```text
//! 0..4    qpn       u32, 24 bits used
//! 4..8    psn       u32, first PSN this end sends, 24 bits used
//! 8..12   ipv4      the end's RoCEv2 address (GID ::ffff:a.b.c.d), network order
//! 12..14  mtu       u16, path MTU (256, 512, 1024, 2048 or 4096)
//! 14..16  reserved  zero
//! 16      lane      u8, 1..=255: the exactly-once lane of this queue pair
//! 17..24  reserved  zero
//! 24..32  first     u64, sequence number of the queue pair's first atomic
//! ```
//!
//! Either form may end with 8 more bytes, the sender's map epoch (so the
//! body is 16, 24, 32 or 40 bytes long):
//!
//! ```text
//! last 8  epoch     u64, the map epoch the client runs (0: it follows none)
//! ```
//!
//! A device that knows a newer epoch refuses the queue pair with STALE_MAP
//! and its own epoch in the response's value, as it refuses a request of a
//! connection at an older epoch (`fence`); without the epoch, the epoch
//! the control connection said is the one judged. A device takes the epoch
//! here only if its HELLO says [`crate::hello::Capabilities::QP_EPOCH`]:
//! an older device refuses a 24- or 40-byte body as malformed, so a client
//! sends it only to a device that says it takes it.
//!
//! An RDMA atomic carries no sequence number of its own. With a lane, the
//! device numbers the COMPARE_SWAP and FETCH_ADD requests of the queue pair
//! in the order they arrive (`first`, `first + 1`, …; a retransmission is
//! not a new request) and forwards each to its server as exactly-once with
//! that number on that lane. The client counts its posts the same way, so
//! when the queue pair dies with an atomic in doubt it knows the atomic's
//! identity and can ask again on another path without it running twice.
//!
//! QP_ACCEPT body: the device's [`Endpoint`] (16 bytes), then `count` u32
//! and `count` entries of 8 bytes: region index u32, R_Key u32; optionally
//! followed by a u64 of [`caps`] (absent: none; never 0, which is left out,
//! so a body has one encoding).
//!
//! A fabric device also sends QP_CONNECT to a PMEM server on verbs (on its
//! link's control connection): the server answers QP_ACCEPT with the
//! R_Keys of the memory regions its RNIC registered for each region, and
//! with the [`caps`] of its queue pair.

use crate::error::{Error, Result};
use crate::le;

/// Byte ranges of the bodies.
pub mod field {
    use crate::Field;

    /// QP number.
    pub const QPN: Field = 0..4;
    /// First PSN.
    pub const PSN: Field = 4..8;
    /// IPv4 address.
    pub const IPV4: Field = 8..12;
    /// Path MTU.
    pub const MTU: Field = 12..14;
    /// Reserved.
    pub const RESERVED: Field = 14..16;
    /// Number of R_Key entries (QP_ACCEPT).
    pub const COUNT: Field = 16..20;
    /// Exactly-once lane (QP_CONNECT).
    pub const LANE: usize = 16;
    /// Reserved after the lane (QP_CONNECT).
    pub const LANE_RESERVED: Field = 17..24;
    /// First atomic's sequence number (QP_CONNECT).
    pub const FIRST: Field = 24..32;
}

/// Length of the optional map epoch at the end of a QP_CONNECT body.
pub const CONNECT_EPOCH_LEN: usize = 8;

/// Length of an [`Endpoint`] (the whole QP_CONNECT body).
pub const ENDPOINT_LEN: usize = 16;
/// Length of a QP_CONNECT body with an exactly-once lane.
pub const CONNECT_WITH_LANE_LEN: usize = 32;
/// Length of one R_Key entry.
pub const RKEY_ENTRY_LEN: usize = 8;
/// Length of the optional capabilities word after the R_Key table.
pub const CAPS_LEN: usize = 8;

/// What the queue pair behind a QP_ACCEPT can do beyond READ, WRITE and
/// the atomics (bits of the capabilities word).
pub mod caps {
    /// FLUSH with the persistence placement type makes the bytes it names
    /// durable (IBTA 1.5 memory placement extensions). Without it, the
    /// requester makes a WRITE durable with a READ after it (the appliance
    /// persistency method: valid where the RNIC writes straight into the
    /// persistence domain).
    pub const FLUSH_PERSISTENT: u64 = 1;
    /// ATOMIC_WRITE (IBTA 1.5) is executed.
    pub const ATOMIC_WRITE: u64 = 2;
    /// The responder is Linux rxe, which checks a FLUSH's ICRC over its
    /// headers twice (`roce::icrc::ipv4_rxe_flush`) and drops the
    /// standard one.
    pub const RXE_FLUSH_ICRC: u64 = 4;
    /// Every bit this version knows.
    pub const KNOWN: u64 = FLUSH_PERSISTENT | ATOMIC_WRITE | RXE_FLUSH_ICRC;
}
pub use crate::limits::MAX_RKEYS;

/// One end of a queue pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Endpoint {
    /// QP number (24 bits).
    pub qpn: u32,
    /// First PSN this end sends (24 bits).
    pub psn: u32,
    /// RoCEv2 address.
    pub ip: core::net::Ipv4Addr,
    /// Path MTU.
    pub mtu: u16,
}

impl Endpoint {
    /// Parses an endpoint from the first 16 bytes of `body`.
    pub fn parse(body: &[u8]) -> Result<Endpoint> {
        if body.len() < ENDPOINT_LEN {
            return Err(Error::Truncated {
                needed: ENDPOINT_LEN,
                got: body.len(),
            });
        }
        let qpn = le::u32_at(&body[field::QPN]);
        let psn = le::u32_at(&body[field::PSN]);
        for (what, value) in [("qp qpn", qpn), ("qp psn", psn)] {
            if value >> 24 != 0 {
                return Err(Error::ReservedBits {
                    what,
                    value: u64::from(value),
                });
            }
        }
        let reserved = le::u16_at(&body[field::RESERVED]);
        if reserved != 0 {
            return Err(Error::ReservedBits {
                what: "qp reserved",
                value: u64::from(reserved),
            });
        }
        let mut ip = [0; 4];
        ip.copy_from_slice(&body[field::IPV4]);
        Ok(Endpoint {
            qpn,
            psn,
            ip: ip.into(),
            mtu: le::u16_at(&body[field::MTU]),
        })
    }

    /// Writes the endpoint into the first 16 bytes of `body`.
    pub fn emit(&self, body: &mut [u8]) {
        le::put_u32(&mut body[field::QPN], self.qpn & 0xFF_FFFF);
        le::put_u32(&mut body[field::PSN], self.psn & 0xFF_FFFF);
        body[field::IPV4].copy_from_slice(&self.ip.octets());
        le::put_u16(&mut body[field::MTU], self.mtu);
        le::put_u16(&mut body[field::RESERVED], 0);
    }
}

/// Where the atomics of a queue pair are numbered for exactly-once
/// execution: the `lane` of the client's exactly-once identity (see
/// `request::ExactlyOnce`) and the number of the queue pair's first atomic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AtomicSeq {
    /// The lane, 1..=255 (lane 0 belongs to requests that carry their own
    /// number).
    pub lane: u8,
    /// Sequence number of the first atomic; later ones count up from it.
    pub first: u64,
}

/// A QP_CONNECT: the client's end and, optionally, how its atomics are
/// numbered and the map epoch it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Connect {
    /// The client's end.
    pub endpoint: Endpoint,
    /// `None`: the queue pair's atomics are not exactly-once.
    pub atomics: Option<AtomicSeq>,
    /// The map epoch the client runs; `None`: not said (the control
    /// connection's is judged).
    pub epoch: Option<u64>,
}

impl Connect {
    /// Parses a QP_CONNECT body: an endpoint, with or without a lane, with
    /// or without an epoch.
    pub fn parse(body: &[u8]) -> Result<Connect> {
        let endpoint = Endpoint::parse(body)?;
        let (lane, epoch) = match body.len() {
            ENDPOINT_LEN => (false, false),
            len if len == ENDPOINT_LEN + CONNECT_EPOCH_LEN => (false, true),
            CONNECT_WITH_LANE_LEN => (true, false),
            len if len == CONNECT_WITH_LANE_LEN + CONNECT_EPOCH_LEN => (true, true),
            got => {
                let expected = [
                    ENDPOINT_LEN,
                    ENDPOINT_LEN + CONNECT_EPOCH_LEN,
                    CONNECT_WITH_LANE_LEN,
                    CONNECT_WITH_LANE_LEN + CONNECT_EPOCH_LEN,
                ]
                .into_iter()
                .rfind(|&len| len < got)
                .unwrap_or(ENDPOINT_LEN);
                return Err(Error::LengthMismatch {
                    what: "qp connect body",
                    expected,
                    got,
                });
            }
        };
        let atomics = match lane {
            false => None,
            true => {
                let lane = body[field::LANE];
                if lane == 0 {
                    return Err(Error::ReservedBits {
                        what: "qp lane 0",
                        value: 0,
                    });
                }
                let reserved = &body[field::LANE_RESERVED];
                if reserved.iter().any(|&b| b != 0) {
                    return Err(Error::ReservedBits {
                        what: "qp lane reserved",
                        value: reserved.iter().fold(0, |v, &b| v << 8 | u64::from(b)),
                    });
                }
                Some(AtomicSeq {
                    lane,
                    first: le::u64_at(&body[field::FIRST]),
                })
            }
        };
        let epoch = epoch.then(|| le::u64_at(&body[body.len() - CONNECT_EPOCH_LEN..]));
        Ok(Connect {
            endpoint,
            atomics,
            epoch,
        })
    }

    /// Length of the body.
    pub fn buffer_len(&self) -> usize {
        let base = match self.atomics {
            None => ENDPOINT_LEN,
            Some(_) => CONNECT_WITH_LANE_LEN,
        };
        base + self.epoch.map_or(0, |_| CONNECT_EPOCH_LEN)
    }

    /// Writes the body into a buffer of [`Connect::buffer_len`] bytes.
    pub fn emit(&self, body: &mut [u8]) {
        self.endpoint.emit(body);
        if let Some(atomics) = self.atomics {
            body[field::LANE] = atomics.lane;
            body[field::LANE_RESERVED].fill(0);
            le::put_u64(&mut body[field::FIRST], atomics.first);
        }
        if let Some(epoch) = self.epoch {
            let at = self.buffer_len() - CONNECT_EPOCH_LEN;
            le::put_u64(&mut body[at..at + CONNECT_EPOCH_LEN], epoch);
        }
    }
}

/// A QP_ACCEPT: the device's end and the R_Key table, borrowed from the frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Accept<'a> {
    /// The device's end.
    pub endpoint: Endpoint,
    /// `count` entries of (region index, R_Key), little-endian u32 pairs.
    rkeys: &'a [u8],
    /// Bits of [`caps`].
    caps: u64,
}

impl<'a> Accept<'a> {
    /// An accept over an encoded R_Key table (see [`encode_rkeys`]).
    pub fn new(endpoint: Endpoint, rkeys: &'a [u8]) -> Result<Self> {
        check_table(rkeys)?;
        Ok(Accept {
            endpoint,
            rkeys,
            caps: 0,
        })
    }

    /// The same accept with capabilities `caps` (bits of [`caps`]).
    pub fn with_caps(self, caps: u64) -> Self {
        Accept { caps, ..self }
    }

    /// Its capabilities (bits of [`caps`]; 0 when the frame has none).
    pub fn caps(&self) -> u64 {
        self.caps
    }

    /// Parses a QP_ACCEPT body.
    pub fn parse(body: &'a [u8]) -> Result<Accept<'a>> {
        let endpoint = Endpoint::parse(body)?;
        let header = field::COUNT.end;
        if body.len() < header {
            return Err(Error::Truncated {
                needed: header,
                got: body.len(),
            });
        }
        let count = le::u32_at(&body[field::COUNT]) as usize;
        let rest = &body[header..];
        let table_len = count.min(MAX_RKEYS) * RKEY_ENTRY_LEN;
        if count > MAX_RKEYS || (rest.len() != table_len && rest.len() != table_len + CAPS_LEN) {
            return Err(Error::LengthMismatch {
                what: "qp accept r_key table",
                expected: table_len,
                got: rest.len(),
            });
        }
        let (table, tail) = rest.split_at(table_len);
        let caps = if tail.is_empty() { 0 } else { le::u64_at(tail) };
        if !tail.is_empty() && caps == 0 {
            return Err(Error::LengthMismatch {
                what: "qp accept body (a caps word of 0 is left out)",
                expected: header + table_len,
                got: body.len(),
            });
        }
        if caps & !caps::KNOWN != 0 {
            return Err(Error::ReservedBits {
                what: "qp accept caps",
                value: caps,
            });
        }
        Ok(Accept {
            endpoint,
            rkeys: table,
            caps,
        })
    }

    /// The (region index, R_Key) entries.
    pub fn rkeys(&self) -> impl Iterator<Item = (u32, u32)> + 'a {
        self.rkeys
            .chunks_exact(RKEY_ENTRY_LEN)
            .map(|e| (le::u32_at(&e[..4]), le::u32_at(&e[4..])))
    }

    /// Length of the body.
    pub fn buffer_len(&self) -> usize {
        let caps = if self.caps == 0 { 0 } else { CAPS_LEN };
        field::COUNT.end + self.rkeys.len() + caps
    }

    /// Writes the body into a buffer of [`Accept::buffer_len`] bytes.
    pub fn emit(&self, body: &mut [u8]) {
        self.endpoint.emit(body);
        let count = (self.rkeys.len() / RKEY_ENTRY_LEN) as u32;
        le::put_u32(&mut body[field::COUNT], count);
        let table_end = field::COUNT.end + self.rkeys.len();
        body[field::COUNT.end..table_end].copy_from_slice(self.rkeys);
        if self.caps != 0 {
            le::put_u64(&mut body[table_end..table_end + CAPS_LEN], self.caps);
        }
    }
}

fn check_table(rkeys: &[u8]) -> Result<()> {
    if !rkeys.len().is_multiple_of(RKEY_ENTRY_LEN) || rkeys.len() / RKEY_ENTRY_LEN > MAX_RKEYS {
        return Err(Error::LengthMismatch {
            what: "qp accept r_key table",
            expected: rkeys.len() - rkeys.len() % RKEY_ENTRY_LEN,
            got: rkeys.len(),
        });
    }
    Ok(())
}

/// Encodes (region index, R_Key) pairs as a QP_ACCEPT table.
pub fn encode_rkeys(pairs: &[(u32, u32)]) -> Vec<u8> {
    let mut out = vec![0; pairs.len() * RKEY_ENTRY_LEN];
    for (entry, (region, rkey)) in out.chunks_exact_mut(RKEY_ENTRY_LEN).zip(pairs) {
        le::put_u32(&mut entry[..4], *region);
        le::put_u32(&mut entry[4..], *rkey);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const END: Endpoint = Endpoint {
        qpn: 0x11,
        psn: 0xABCDEF,
        ip: core::net::Ipv4Addr::new(10, 66, 0, 2),
        mtu: 1024,
    };

    #[test]
    fn endpoint_round_trips_and_refuses_wide_fields() {
        let mut body = [0u8; 16];
        END.emit(&mut body);
        assert_eq!(
            body,
            [
                0x11, 0, 0, 0, 0xEF, 0xCD, 0xAB, 0, 10, 66, 0, 2, 0x00, 0x04, 0, 0
            ]
        );
        assert_eq!(
            Connect::parse(&body),
            Ok(Connect {
                endpoint: END,
                atomics: None,
                epoch: None,
            })
        );
        body[3] = 1;
        assert!(matches!(
            Endpoint::parse(&body),
            Err(Error::ReservedBits { what: "qp qpn", .. })
        ));
        assert!(matches!(
            Endpoint::parse(&body[..15]),
            Err(Error::Truncated { .. })
        ));
        assert!(matches!(
            Connect::parse(&[0u8; 17]),
            Err(Error::LengthMismatch { .. })
        ));
    }

    #[test]
    fn connect_with_a_lane_round_trips_and_refuses_lane_zero() {
        let connect = Connect {
            endpoint: END,
            atomics: Some(AtomicSeq {
                lane: 3,
                first: 0x0102_0304_0506_0708,
            }),
            epoch: None,
        };
        let mut body = vec![0u8; connect.buffer_len()];
        connect.emit(&mut body);
        assert_eq!(body.len(), 32);
        assert_eq!(body[16], 3);
        assert_eq!(body[24..32], [8, 7, 6, 5, 4, 3, 2, 1]);
        assert_eq!(Connect::parse(&body), Ok(connect));
        let mut zero = body.clone();
        zero[16] = 0;
        assert!(matches!(
            Connect::parse(&zero),
            Err(Error::ReservedBits {
                what: "qp lane 0",
                ..
            })
        ));
        let mut dirty = body.clone();
        dirty[20] = 1;
        assert!(matches!(
            Connect::parse(&dirty),
            Err(Error::ReservedBits { .. })
        ));
        assert!(matches!(
            Connect::parse(&body[..28]),
            Err(Error::LengthMismatch { .. })
        ));
    }

    #[test]
    fn connect_says_its_epoch_last_with_or_without_a_lane() {
        let lane = Some(AtomicSeq { lane: 2, first: 9 });
        for (atomics, len) in [(None, 24), (lane, 40)] {
            let connect = Connect {
                endpoint: END,
                atomics,
                epoch: Some(0x1122_3344_5566_7788),
            };
            let mut body = vec![0u8; connect.buffer_len()];
            connect.emit(&mut body);
            assert_eq!(body.len(), len);
            assert_eq!(
                body[len - 8..],
                [0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11]
            );
            assert_eq!(Connect::parse(&body), Ok(connect));
            // The same without the epoch is the older form, byte for byte.
            let older = Connect {
                epoch: None,
                ..connect
            };
            let mut old_body = vec![0u8; older.buffer_len()];
            older.emit(&mut old_body);
            assert_eq!(old_body, body[..len - 8]);
        }
        // Lengths between the forms are refused, naming the shorter one.
        for (got, expected) in [(20, 16), (28, 24), (36, 32), (48, 40)] {
            assert_eq!(
                Connect::parse(&vec![0u8; got]),
                Err(Error::LengthMismatch {
                    what: "qp connect body",
                    expected,
                    got
                })
            );
        }
        // A 40-byte body's lane is checked as a 32-byte one's.
        let mut zero_lane = vec![0u8; 40];
        END.emit(&mut zero_lane);
        assert!(matches!(
            Connect::parse(&zero_lane),
            Err(Error::ReservedBits {
                what: "qp lane 0",
                ..
            })
        ));
    }

    #[test]
    fn accept_round_trips_its_rkey_table() {
        let table = encode_rkeys(&[(0, 0x100), (3, 0xDEAD)]);
        let accept = Accept::new(END, &table).unwrap();
        let mut body = vec![0; accept.buffer_len()];
        accept.emit(&mut body);
        let parsed = Accept::parse(&body).unwrap();
        assert_eq!(parsed, accept);
        assert_eq!(
            parsed.rkeys().collect::<Vec<_>>(),
            [(0, 0x100), (3, 0xDEAD)]
        );
        body.pop();
        assert!(Accept::parse(&body).is_err());
        body.push(0);
        // With capabilities: they round-trip; unknown bits are refused.
        let with = accept.with_caps(caps::FLUSH_PERSISTENT | caps::ATOMIC_WRITE);
        let mut capped = vec![0; with.buffer_len()];
        with.emit(&mut capped);
        assert_eq!(capped.len(), body.len() + CAPS_LEN);
        assert_eq!(Accept::parse(&capped).unwrap().caps(), 3);
        assert_eq!(Accept::parse(&body).unwrap().caps(), 0);
        let mut empty_caps = body.clone();
        empty_caps.extend_from_slice(&[0; CAPS_LEN]);
        assert!(
            matches!(
                Accept::parse(&empty_caps),
                Err(Error::LengthMismatch { .. })
            ),
            "a caps word of 0 has another encoding: none"
        );
        let last = capped.len() - 1;
        capped[last] = 0x80;
        assert!(matches!(
            Accept::parse(&capped),
            Err(Error::ReservedBits { .. })
        ));
        let mut lying = body.clone();
        lying.truncate(20);
        le::put_u32(&mut lying[16..20], u32::MAX);
        assert!(Accept::parse(&lying).is_err());
    }
}
