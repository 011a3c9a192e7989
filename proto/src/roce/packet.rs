//! A RoCE transport packet: the UDP payload of a RoCEv2 datagram.
//!
//! ```text
//! BTH (12) | extension headers, by opcode (opcode::Layout) | payload | pad (0..3) | ICRC (4)
//! ```
//!
//! The ICRC covers the IP and UDP headers too, so it is computed and checked
//! by the datagram layer; this layer only places it.

use core::fmt;

use super::error::{Error, Result, truncated};
use super::opcode::Layout;
use super::{Opcode, aeth, atomic_ack_eth, atomic_eth, bth, feth, immdt, reth};
use crate::view::wire_view;

/// Length of the ICRC trailer.
pub const ICRC_LEN: usize = 4;

/// Bytes of a transport packet around the payload: BTH, the opcode's
/// headers and the ICRC.
pub const fn overhead(layout: &Layout) -> usize {
    bth::HEADER_LEN + layout.headers_len() + ICRC_LEN
}

wire_view! {
    /// A read/write view of a transport packet.
    pub struct Packet;
    error: Error;
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Checks that the opcode is known, that its headers and the ICRC fit,
    /// and that the pad count fits the payload.
    pub fn check_len(&self) -> Result<()> {
        let len = self.buffer.as_ref().len();
        let min = bth::HEADER_LEN + ICRC_LEN;
        if len < min {
            return Err(truncated("RoCE packet", min, len));
        }
        let layout = self.layout()?;
        let needed = overhead(&layout);
        if len < needed {
            return Err(truncated("RoCE packet", needed, len));
        }
        let payload_len = len - needed;
        let pad = self.bth().pad();
        if !layout.payload && payload_len > 0 {
            return Err(Error::UnexpectedPayload {
                opcode: self.bth().opcode().name(),
                len: payload_len,
            });
        }
        if usize::from(pad) > payload_len {
            return Err(Error::BadPadding { pad, payload_len });
        }
        Ok(())
    }

    /// The BTH.
    pub fn bth(&self) -> bth::Packet<&[u8]> {
        bth::Packet::new_unchecked(&self.buffer.as_ref()[..bth::HEADER_LEN])
    }

    /// The header layout of the packet's opcode.
    pub fn layout(&self) -> Result<Layout> {
        let opcode = self.bth().opcode();
        opcode
            .layout()
            .ok_or(Error::UnknownOpcode(u8::from(opcode)))
    }

    fn layout_unchecked(&self) -> Layout {
        self.bth().opcode().layout().unwrap_or_default()
    }

    /// The bytes of the extension header selected by `pick` (in wire order), if present.
    fn header(&self, pick: fn(&Layout) -> (bool, usize)) -> Option<&[u8]> {
        let layout = self.layout_unchecked();
        let (present, offset) = pick(&layout);
        present.then(|| &self.buffer.as_ref()[bth::HEADER_LEN + offset..])
    }

    /// The FETH, if the opcode has one.
    pub fn feth(&self) -> Option<feth::Packet<&[u8]>> {
        self.header(|l| (l.feth, 0))
            .map(feth::Packet::new_unchecked)
    }

    /// The RETH, if the opcode has one.
    pub fn reth(&self) -> Option<reth::Packet<&[u8]>> {
        self.header(|l| (l.reth, offsets(l).reth))
            .map(reth::Packet::new_unchecked)
    }

    /// The AtomicETH, if the opcode has one.
    pub fn atomic_eth(&self) -> Option<atomic_eth::Packet<&[u8]>> {
        self.header(|l| (l.atomic_eth, offsets(l).atomic_eth))
            .map(atomic_eth::Packet::new_unchecked)
    }

    /// The AETH, if the opcode has one.
    pub fn aeth(&self) -> Option<aeth::Packet<&[u8]>> {
        self.header(|l| (l.aeth, offsets(l).aeth))
            .map(aeth::Packet::new_unchecked)
    }

    /// The AtomicAckETH, if the opcode has one.
    pub fn atomic_ack_eth(&self) -> Option<atomic_ack_eth::Packet<&[u8]>> {
        self.header(|l| (l.atomic_ack_eth, offsets(l).atomic_ack_eth))
            .map(atomic_ack_eth::Packet::new_unchecked)
    }

    /// The immediate data, if the opcode has it.
    pub fn immdt(&self) -> Option<immdt::Packet<&[u8]>> {
        self.header(|l| (l.immdt, offsets(l).immdt))
            .map(immdt::Packet::new_unchecked)
    }

    /// The IETH, if the opcode has one.
    pub fn ieth(&self) -> Option<immdt::Packet<&[u8]>> {
        self.header(|l| (l.ieth, offsets(l).ieth))
            .map(immdt::Packet::new_unchecked)
    }

    fn payload_range(&self) -> core::ops::Range<usize> {
        let len = self.buffer.as_ref().len();
        let start = bth::HEADER_LEN + self.layout_unchecked().headers_len();
        start..len - ICRC_LEN - usize::from(self.bth().pad())
    }

    /// The payload, without the pad bytes.
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[self.payload_range()]
    }

    /// The pad bytes after the payload.
    pub fn pad_bytes(&self) -> &[u8] {
        let data = self.buffer.as_ref();
        &data[self.payload_range().end..data.len() - ICRC_LEN]
    }

    /// The ICRC as carried (the CRC register value; little-endian on the wire).
    pub fn icrc(&self) -> u32 {
        let data = self.buffer.as_ref();
        let mut raw = [0; ICRC_LEN];
        raw.copy_from_slice(&data[data.len() - ICRC_LEN..]);
        u32::from_le_bytes(raw)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Writes the ICRC trailer.
    pub fn set_icrc(&mut self, icrc: u32) {
        let data = self.buffer.as_mut();
        let len = data.len();
        data[len - ICRC_LEN..].copy_from_slice(&icrc.to_le_bytes());
    }
}

/// Offsets of each extension header after the BTH, for one layout.
#[derive(Debug, Default, Clone, Copy)]
struct Offsets {
    reth: usize,
    atomic_eth: usize,
    aeth: usize,
    atomic_ack_eth: usize,
    immdt: usize,
    ieth: usize,
}

fn offsets(l: &Layout) -> Offsets {
    let mut at = 0;
    let mut next = |present: bool, len: usize| {
        let here = at;
        if present {
            at += len;
        }
        here
    };
    next(l.feth, feth::HEADER_LEN);
    Offsets {
        reth: next(l.reth, reth::HEADER_LEN),
        atomic_eth: next(l.atomic_eth, atomic_eth::HEADER_LEN),
        aeth: next(l.aeth, aeth::HEADER_LEN),
        atomic_ack_eth: next(l.atomic_ack_eth, atomic_ack_eth::HEADER_LEN),
        immdt: next(l.immdt, immdt::HEADER_LEN),
        ieth: next(l.ieth, immdt::HEADER_LEN),
    }
}

/// A parsed transport packet: the BTH, the extension headers its opcode
/// carries, and the payload (borrowed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr<'a> {
    /// The base transport header.
    pub bth: bth::Repr,
    /// FLUSH extended header.
    pub feth: Option<feth::Repr>,
    /// RDMA extended header.
    pub reth: Option<reth::Repr>,
    /// Atomic extended header.
    pub atomic_eth: Option<atomic_eth::Repr>,
    /// ACK extended header.
    pub aeth: Option<aeth::Repr>,
    /// Original value of an atomic acknowledge.
    pub atomic_ack: Option<u64>,
    /// Immediate data.
    pub immdt: Option<u32>,
    /// Key to invalidate.
    pub ieth: Option<u32>,
    /// Payload without padding.
    pub payload: &'a [u8],
}

impl<'a> Repr<'a> {
    /// A packet with `bth` and nothing else set; fill in the opcode's headers.
    pub const fn new(bth: bth::Repr) -> Self {
        Repr {
            bth,
            feth: None,
            reth: None,
            atomic_eth: None,
            aeth: None,
            atomic_ack: None,
            immdt: None,
            ieth: None,
            payload: &[],
        }
    }

    /// Parses a checked packet. Pad bytes are not inspected, as IBTA asks of receivers.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&'a T>) -> Result<Repr<'a>> {
        packet.check_len()?;
        let inner: &'a [u8] = packet.buffer.as_ref();
        let view = Packet::new_unchecked(inner);
        Ok(Repr {
            bth: bth::Repr::parse(&view.bth())?,
            feth: view.feth().map(|p| feth::Repr::parse(&p)).transpose()?,
            reth: view.reth().map(|p| reth::Repr::parse(&p)).transpose()?,
            atomic_eth: view
                .atomic_eth()
                .map(|p| atomic_eth::Repr::parse(&p))
                .transpose()?,
            aeth: view.aeth().map(|p| aeth::Repr::parse(&p)).transpose()?,
            atomic_ack: view.atomic_ack_eth().map(|p| p.original()),
            immdt: view.immdt().map(|p| p.value()),
            ieth: view.ieth().map(|p| p.value()),
            payload: payload_of(inner, &view),
        })
    }

    /// Checks that exactly the headers the opcode needs are present.
    pub fn check(&self) -> Result<Layout> {
        let layout = self
            .bth
            .opcode
            .layout()
            .ok_or(Error::Inconsistent("unknown opcode"))?;
        let matches = layout.feth == self.feth.is_some()
            && layout.reth == self.reth.is_some()
            && layout.atomic_eth == self.atomic_eth.is_some()
            && layout.aeth == self.aeth.is_some()
            && layout.atomic_ack_eth == self.atomic_ack.is_some()
            && layout.immdt == self.immdt.is_some()
            && layout.ieth == self.ieth.is_some();
        if !matches {
            return Err(Error::Inconsistent("headers do not match the opcode"));
        }
        if !layout.payload && !self.payload.is_empty() {
            return Err(Error::Inconsistent("payload on an opcode without one"));
        }
        Ok(layout)
    }

    /// Bytes of padding after the payload.
    pub const fn pad(&self) -> u8 {
        ((4 - self.payload.len() % 4) % 4) as u8
    }

    /// Length of the encoded packet, ICRC included.
    pub fn buffer_len(&self) -> usize {
        let headers = self.bth.opcode.layout().unwrap_or_default().headers_len();
        bth::HEADER_LEN + headers + self.payload.len() + usize::from(self.pad()) + ICRC_LEN
    }

    /// Writes the packet into a buffer of exactly [`Repr::buffer_len`] bytes,
    /// with zero pad bytes and a zero ICRC (the datagram layer fills it).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) -> Result<()> {
        let layout = self.check()?;
        let expected = self.buffer_len();
        let buf = packet.buffer.as_mut();
        if buf.len() != expected {
            return Err(Error::Inconsistent(
                "buffer length differs from buffer_len()",
            ));
        }
        self.bth
            .emit(&mut bth::Packet::new_unchecked(&mut buf[..]), self.pad());
        let offs = offsets(&layout);
        let hdr = &mut buf[bth::HEADER_LEN..];
        if let Some(f) = &self.feth {
            f.emit(&mut feth::Packet::new_unchecked(&mut hdr[..]));
        }
        if let Some(r) = &self.reth {
            r.emit(&mut reth::Packet::new_unchecked(&mut hdr[offs.reth..]));
        }
        if let Some(a) = &self.atomic_eth {
            a.emit(&mut atomic_eth::Packet::new_unchecked(
                &mut hdr[offs.atomic_eth..],
            ));
        }
        if let Some(a) = &self.aeth {
            a.emit(&mut aeth::Packet::new_unchecked(&mut hdr[offs.aeth..]));
        }
        if let Some(v) = self.atomic_ack {
            atomic_ack_eth::Packet::new_unchecked(&mut hdr[offs.atomic_ack_eth..]).set_original(v);
        }
        if let Some(v) = self.immdt {
            immdt::Packet::new_unchecked(&mut hdr[offs.immdt..]).set_value(v);
        }
        if let Some(v) = self.ieth {
            immdt::Packet::new_unchecked(&mut hdr[offs.ieth..]).set_value(v);
        }
        let start = bth::HEADER_LEN + layout.headers_len();
        let end = start + self.payload.len();
        buf[start..end].copy_from_slice(self.payload);
        buf[end..].fill(0);
        Ok(())
    }
}

fn payload_of<'a>(inner: &'a [u8], view: &Packet<&'a [u8]>) -> &'a [u8] {
    &inner[view.payload_range()]
}

impl fmt::Display for Repr<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.bth)?;
        if let Some(h) = &self.feth {
            write!(f, " {h}")?;
        }
        if let Some(h) = &self.reth {
            write!(f, " {h}")?;
        }
        if let Some(h) = &self.atomic_eth {
            write!(f, " {h}")?;
        }
        if let Some(h) = &self.aeth {
            write!(f, " {h}")?;
        }
        if let Some(v) = self.atomic_ack {
            write!(f, " AtomicAckETH orig={v:#x}")?;
        }
        if let Some(v) = self.immdt {
            write!(f, " ImmDt={v:#x}")?;
        }
        if let Some(v) = self.ieth {
            write!(f, " IETH rkey={v:#x}")?;
        }
        if !self.payload.is_empty() {
            write!(f, " payload={}B", self.payload.len())?;
        }
        Ok(())
    }
}

/// The opcode of a buffer that holds at least a BTH; `None` when it is shorter.
pub fn peek_opcode(buffer: &[u8]) -> Option<Opcode> {
    buffer.first().map(|&b| Opcode::from(b))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::roce::Psn;

    fn bth(opcode: Opcode) -> bth::Repr {
        bth::Repr {
            opcode,
            solicited: false,
            migration: false,
            pkey: bth::DEFAULT_PKEY,
            dest_qp: 0x12,
            ack_req: true,
            psn: Psn::new(100),
        }
    }

    #[test]
    fn write_only_round_trips_with_padding() {
        let repr = Repr {
            reth: Some(reth::Repr {
                va: 0x1000,
                rkey: 7,
                dma_len: 5,
            }),
            payload: b"hello",
            ..Repr::new(bth(Opcode::WriteOnly))
        };
        assert_eq!(repr.pad(), 3);
        let mut buf = vec![0xEE; repr.buffer_len()];
        assert_eq!(buf.len(), 12 + 16 + 5 + 3 + 4);
        repr.emit(&mut Packet::new_unchecked(&mut buf[..])).unwrap();
        let packet = Packet::new_checked(&buf[..]).unwrap();
        assert_eq!(packet.bth().pad(), 3);
        assert_eq!(packet.pad_bytes(), &[0, 0, 0]);
        assert_eq!(Repr::parse(&packet), Ok(repr));
    }

    #[test]
    fn header_offsets_follow_wire_order() {
        let repr = Repr {
            aeth: Some(aeth::Repr {
                syndrome: aeth::Syndrome::Ack { credits: 0x1F },
                msn: 9,
            }),
            atomic_ack: Some(0x0102_0304_0506_0708),
            ..Repr::new(bth(Opcode::AtomicAcknowledge))
        };
        let mut buf = vec![0; repr.buffer_len()];
        repr.emit(&mut Packet::new_unchecked(&mut buf[..])).unwrap();
        assert_eq!(&buf[12..16], &[0x1F, 0, 0, 9]);
        assert_eq!(&buf[16..24], &[1, 2, 3, 4, 5, 6, 7, 8]);
        let flush = Repr {
            feth: Some(feth::Repr {
                placement: feth::PLACEMENT_PERSISTENT,
                selectivity: feth::SELECT_RANGE,
            }),
            reth: Some(reth::Repr {
                va: 0x40,
                rkey: 1,
                dma_len: 64,
            }),
            ..Repr::new(bth(Opcode::Flush))
        };
        let mut buf = vec![0; flush.buffer_len()];
        flush
            .emit(&mut Packet::new_unchecked(&mut buf[..]))
            .unwrap();
        assert_eq!(&buf[12..16], &[0, 0, 0, 2]);
        assert_eq!(&buf[16..24], &[0, 0, 0, 0, 0, 0, 0, 0x40]);
        assert_eq!(
            Repr::parse(&Packet::new_checked(&buf[..]).unwrap()),
            Ok(flush)
        );
    }

    #[test]
    fn malformed_packets_are_refused() {
        // Too short for BTH + ICRC.
        assert!(matches!(
            Packet::new_checked(&[0u8; 15][..]),
            Err(Error::Truncated { .. })
        ));
        // READ request without room for its RETH.
        let mut buf = [0u8; 20];
        buf[0] = 0x0C;
        assert!(matches!(
            Packet::new_checked(&buf[..]),
            Err(Error::Truncated { .. })
        ));
        // Unknown opcode.
        buf[0] = 0x15;
        assert_eq!(
            Packet::new_checked(&buf[..]),
            Err(Error::UnknownOpcode(0x15))
        );
        // ACK with a payload.
        let mut ack = [0u8; 24];
        ack[0] = 0x11;
        assert!(matches!(
            Packet::new_checked(&ack[..]),
            Err(Error::UnexpectedPayload { len: 4, .. })
        ));
        // SEND with pad 3 but 2 payload bytes.
        let mut send = [0u8; 18];
        send[0] = 0x04;
        send[1] = 0x30;
        assert_eq!(
            Packet::new_checked(&send[..]),
            Err(Error::BadPadding {
                pad: 3,
                payload_len: 2
            })
        );
    }

    #[test]
    fn emit_refuses_inconsistent_headers() {
        let repr = Repr::new(bth(Opcode::ReadRequest));
        let mut buf = vec![0; repr.buffer_len()];
        assert!(matches!(
            repr.emit(&mut Packet::new_unchecked(&mut buf[..])),
            Err(Error::Inconsistent(_))
        ));
    }

    #[test]
    fn display_names_every_header() {
        let repr = Repr {
            reth: Some(reth::Repr {
                va: 0x10,
                rkey: 2,
                dma_len: 8,
            }),
            ..Repr::new(bth(Opcode::ReadRequest))
        };
        assert_eq!(
            repr.to_string(),
            "BTH RDMA_READ_REQUEST qp=0x12 psn=100 ackreq pkey=0xffff RETH va=0x10 rkey=0x2 len=8"
        );
    }
}
