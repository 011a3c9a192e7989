//! The base transport header (BTH), 12 bytes, big-endian, first in every packet.
//!
//! ```text
//! 0      opcode
//! 1      SE(7) M(6) PadCnt(5..4) TVer(3..0)
//! 2..4   P_Key
//! 4      reserved (FECN/BECN on InfiniBand; masked out of the ICRC)
//! 5..8   destination QP (24 bits)
//! 8      AckReq(7), reserved(6..0)
//! 9..12  PSN (24 bits)
//! ```

use core::fmt;

use super::header::{be_uint, fixed_header, put_be_uint};
use super::{Opcode, Psn};

/// Byte ranges of the BTH.
pub mod field {
    use crate::Field;

    /// Opcode.
    pub const OPCODE: usize = 0;
    /// Solicited event, migration, pad count, transport version.
    pub const FLAGS: usize = 1;
    /// Partition key.
    pub const PKEY: Field = 2..4;
    /// Reserved byte (masked out of the ICRC).
    pub const RESV8A: usize = 4;
    /// Destination queue pair number.
    pub const DEST_QP: Field = 5..8;
    /// Acknowledge request bit and reserved bits.
    pub const ACK_REQ: usize = 8;
    /// Packet sequence number.
    pub const PSN: Field = 9..12;
}

/// Length of the BTH.
pub const HEADER_LEN: usize = 12;

/// The default partition key (full membership), as Linux RDMA stacks use.
pub const DEFAULT_PKEY: u16 = 0xFFFF;

fixed_header!("BTH");

impl<T: AsRef<[u8]>> Packet<T> {
    /// The opcode.
    pub fn opcode(&self) -> Opcode {
        Opcode::from(self.buffer.as_ref()[field::OPCODE])
    }

    /// The solicited event bit.
    pub fn solicited(&self) -> bool {
        self.buffer.as_ref()[field::FLAGS] & 0x80 != 0
    }

    /// The migration state bit.
    pub fn migration(&self) -> bool {
        self.buffer.as_ref()[field::FLAGS] & 0x40 != 0
    }

    /// Bytes of padding after the payload (0..=3).
    pub fn pad(&self) -> u8 {
        (self.buffer.as_ref()[field::FLAGS] >> 4) & 0x3
    }

    /// The transport header version (0).
    pub fn transport_version(&self) -> u8 {
        self.buffer.as_ref()[field::FLAGS] & 0x0F
    }

    /// The partition key.
    pub fn pkey(&self) -> u16 {
        be_uint(&self.buffer.as_ref()[field::PKEY]) as u16
    }

    /// The reserved byte after the partition key.
    pub fn resv8a(&self) -> u8 {
        self.buffer.as_ref()[field::RESV8A]
    }

    /// The destination QP number (24 bits).
    pub fn dest_qp(&self) -> u32 {
        be_uint(&self.buffer.as_ref()[field::DEST_QP]) as u32
    }

    /// Whether the requester asks for an acknowledge of this packet.
    pub fn ack_req(&self) -> bool {
        self.buffer.as_ref()[field::ACK_REQ] & 0x80 != 0
    }

    /// The reserved bits next to the acknowledge request bit.
    pub fn resv7(&self) -> u8 {
        self.buffer.as_ref()[field::ACK_REQ] & 0x7F
    }

    /// The packet sequence number.
    pub fn psn(&self) -> Psn {
        Psn::new(be_uint(&self.buffer.as_ref()[field::PSN]) as u32)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the opcode.
    pub fn set_opcode(&mut self, opcode: Opcode) {
        self.buffer.as_mut()[field::OPCODE] = opcode.into();
    }

    /// Sets solicited event, migration, pad count and transport version.
    pub fn set_flags(&mut self, solicited: bool, migration: bool, pad: u8, tver: u8) {
        self.buffer.as_mut()[field::FLAGS] = (u8::from(solicited) << 7)
            | (u8::from(migration) << 6)
            | ((pad & 0x3) << 4)
            | (tver & 0x0F);
    }

    /// Sets the partition key.
    pub fn set_pkey(&mut self, pkey: u16) {
        put_be_uint(&mut self.buffer.as_mut()[field::PKEY], pkey.into());
    }

    /// Sets the reserved byte after the partition key.
    pub fn set_resv8a(&mut self, value: u8) {
        self.buffer.as_mut()[field::RESV8A] = value;
    }

    /// Sets the destination QP number (low 24 bits of `qpn`).
    pub fn set_dest_qp(&mut self, qpn: u32) {
        put_be_uint(&mut self.buffer.as_mut()[field::DEST_QP], qpn.into());
    }

    /// Sets the acknowledge request bit; the reserved bits become zero.
    pub fn set_ack_req(&mut self, ack_req: bool) {
        self.buffer.as_mut()[field::ACK_REQ] = u8::from(ack_req) << 7;
    }

    /// Sets the packet sequence number.
    pub fn set_psn(&mut self, psn: Psn) {
        put_be_uint(&mut self.buffer.as_mut()[field::PSN], psn.get().into());
    }
}

/// A parsed BTH. The pad count is not kept: it follows from the payload
/// length, and the transport packet's `Repr::emit` writes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr {
    /// The opcode.
    pub opcode: Opcode,
    /// Solicited event.
    pub solicited: bool,
    /// Migration state.
    pub migration: bool,
    /// Partition key.
    pub pkey: u16,
    /// Destination QP number (24 bits).
    pub dest_qp: u32,
    /// Acknowledge request.
    pub ack_req: bool,
    /// Packet sequence number.
    pub psn: Psn,
}

impl Repr {
    /// Parses a BTH. Reserved bits are ignored, as receivers must.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> super::Result<Repr> {
        packet.check_len()?;
        if packet.transport_version() != 0 {
            return Err(super::Error::BadTransportVersion(
                packet.transport_version(),
            ));
        }
        Ok(Repr {
            opcode: packet.opcode(),
            solicited: packet.solicited(),
            migration: packet.migration(),
            pkey: packet.pkey(),
            dest_qp: packet.dest_qp(),
            ack_req: packet.ack_req(),
            psn: packet.psn(),
        })
    }

    /// Length of the header.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the header with pad count `pad`; reserved fields become zero.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>, pad: u8) {
        packet.set_opcode(self.opcode);
        packet.set_flags(self.solicited, self.migration, pad, 0);
        packet.set_pkey(self.pkey);
        packet.set_resv8a(0);
        packet.set_dest_qp(self.dest_qp);
        packet.set_ack_req(self.ack_req);
        packet.set_psn(self.psn);
    }
}

impl fmt::Display for Repr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "BTH {} qp={:#x} psn={}{}{} pkey={:#06x}",
            self.opcode,
            self.dest_qp,
            self.psn,
            if self.ack_req { " ackreq" } else { "" },
            if self.solicited { " se" } else { "" },
            self.pkey
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // RDMA READ request to QP 0x11, PSN 0xabcdef, ack requested, pad 0.
    const BYTES: [u8; 12] = [
        0x0C, 0x00, 0xFF, 0xFF, 0x00, 0x00, 0x00, 0x11, 0x80, 0xAB, 0xCD, 0xEF,
    ];
    const REPR: Repr = Repr {
        opcode: Opcode::ReadRequest,
        solicited: false,
        migration: false,
        pkey: 0xFFFF,
        dest_qp: 0x11,
        ack_req: true,
        psn: Psn::new(0xAB_CDEF),
    };

    #[test]
    fn deconstruct() {
        let p = Packet::new_checked(&BYTES[..]).unwrap();
        assert_eq!(p.opcode(), Opcode::ReadRequest);
        assert_eq!(p.pkey(), 0xFFFF);
        assert_eq!(p.dest_qp(), 0x11);
        assert!(p.ack_req());
        assert_eq!(p.psn(), Psn::new(0xAB_CDEF));
        assert_eq!(p.pad(), 0);
    }

    #[test]
    fn parse_and_emit() {
        let p = Packet::new_checked(&BYTES[..]).unwrap();
        assert_eq!(Repr::parse(&p), Ok(REPR));
        let mut out = [0xAAu8; 12];
        REPR.emit(&mut Packet::new_unchecked(&mut out[..]), 0);
        assert_eq!(out, BYTES);
    }

    #[test]
    fn flags_and_reserved() {
        let mut b = BYTES;
        b[1] = 0xF0; // SE, M, pad 3, tver 0
        b[4] = 0xC0;
        b[8] = 0x7F;
        let p = Packet::new_checked(&b[..]).unwrap();
        assert!(p.solicited() && p.migration());
        assert_eq!(p.pad(), 3);
        assert_eq!(p.resv8a(), 0xC0);
        assert!(!p.ack_req());
        assert_eq!(p.resv7(), 0x7F);
        b[1] = 0x01;
        let p = Packet::new_checked(&b[..]).unwrap();
        assert_eq!(
            Repr::parse(&p),
            Err(super::super::Error::BadTransportVersion(1))
        );
    }

    #[test]
    fn short_buffer_is_refused() {
        assert!(Packet::new_checked(&BYTES[..11]).is_err());
    }

    #[test]
    fn display() {
        assert_eq!(
            REPR.to_string(),
            "BTH RDMA_READ_REQUEST qp=0x11 psn=11259375 ackreq pkey=0xffff"
        );
    }
}
