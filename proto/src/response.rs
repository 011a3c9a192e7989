//! Response bodies: READ_RESPONSE, ACKNOWLEDGE, ATOMIC_ACKNOWLEDGE.
//!
//! ```text
//! 0..2   status   u16, see Status
//! 2..8   reserved zero
//! 8..16  value    u64: old value for COMPARE_SWAP / FETCH_ADD, else 0
//! 16..   payload  READ_RESPONSE data; none for the acknowledgements
//! ```

use core::fmt;

use crate::error::{Error, Result};
use crate::le;
use crate::limits::MAX_DATA_LEN;
use crate::opcode::Opcode;
use crate::status::Status;
use crate::view::wire_view;

/// Byte ranges of a response body.
pub mod field {
    use crate::{Field, Rest};

    /// Status.
    pub const STATUS: Field = 0..2;
    /// Reserved, zero.
    pub const RESERVED: Field = 2..8;
    /// Old value of an atomic.
    pub const VALUE: Field = 8..16;
    /// Read data.
    pub const PAYLOAD: Rest = 16..;
}

/// Length of the fixed part of a response body.
pub const HEADER_LEN: usize = 16;

wire_view! {
    /// A read/write view of a response body.
    pub struct Packet;
    error: Error;
    at_least: HEADER_LEN;
    payload: field::PAYLOAD;
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// The status.
    pub fn status(&self) -> Status {
        Status::from(le::u16_at(&self.buffer.as_ref()[field::STATUS]))
    }

    /// The reserved bytes 2..8 as a number (zero when well formed).
    pub fn reserved(&self) -> u64 {
        let mut raw = [0; 8];
        raw[..6].copy_from_slice(&self.buffer.as_ref()[field::RESERVED]);
        u64::from_le_bytes(raw)
    }

    /// The value (old value of an atomic).
    pub fn value(&self) -> u64 {
        le::u64_at(&self.buffer.as_ref()[field::VALUE])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the status.
    pub fn set_status(&mut self, value: Status) {
        le::put_u16(&mut self.buffer.as_mut()[field::STATUS], value.into());
    }

    /// Zeroes the reserved bytes.
    pub fn clear_reserved(&mut self) {
        self.buffer.as_mut()[field::RESERVED].fill(0);
    }

    /// Sets the value.
    pub fn set_value(&mut self, value: u64) {
        le::put_u64(&mut self.buffer.as_mut()[field::VALUE], value);
    }
}

/// The three response opcodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ResponseKind {
    /// Data of a READ.
    ReadResponse,
    /// Status only.
    Acknowledge,
    /// Status and the old value of COMPARE_SWAP / FETCH_ADD.
    AtomicAcknowledge,
}

impl ResponseKind {
    /// Every kind.
    pub const ALL: [ResponseKind; 3] = [
        ResponseKind::ReadResponse,
        ResponseKind::Acknowledge,
        ResponseKind::AtomicAcknowledge,
    ];

    /// The kind with this opcode, if it is a response opcode.
    pub fn from_opcode(opcode: Opcode) -> Option<ResponseKind> {
        Some(match opcode {
            Opcode::ReadResponse => ResponseKind::ReadResponse,
            Opcode::Acknowledge => ResponseKind::Acknowledge,
            Opcode::AtomicAcknowledge => ResponseKind::AtomicAcknowledge,
            _ => return None,
        })
    }

    /// The kind that answers a frame with `opcode` (see [`Opcode::response_opcode`]).
    pub fn answering(opcode: Opcode) -> ResponseKind {
        match opcode.response_opcode() {
            Opcode::ReadResponse => ResponseKind::ReadResponse,
            Opcode::AtomicAcknowledge => ResponseKind::AtomicAcknowledge,
            _ => ResponseKind::Acknowledge,
        }
    }

    /// The frame opcode.
    pub fn opcode(self) -> Opcode {
        match self {
            ResponseKind::ReadResponse => Opcode::ReadResponse,
            ResponseKind::Acknowledge => Opcode::Acknowledge,
            ResponseKind::AtomicAcknowledge => Opcode::AtomicAcknowledge,
        }
    }
}

impl fmt::Display for ResponseKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.opcode().fmt(f)
    }
}

/// A parsed response body; the payload is borrowed, never copied.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr<'a> {
    /// Which response (the frame's opcode).
    pub kind: ResponseKind,
    /// Outcome.
    pub status: Status,
    /// Old value of COMPARE_SWAP / FETCH_ADD, else 0.
    pub value: u64,
    /// READ data; empty for the acknowledgements.
    pub payload: &'a [u8],
}

impl<'a> Repr<'a> {
    /// A successful READ_RESPONSE carrying `data`.
    pub fn read_data(data: &'a [u8]) -> Self {
        Repr {
            kind: ResponseKind::ReadResponse,
            status: Status::Ok,
            value: 0,
            payload: data,
        }
    }

    /// An ACKNOWLEDGE with `status`.
    pub fn ack(status: Status) -> Self {
        Repr {
            kind: ResponseKind::Acknowledge,
            status,
            value: 0,
            payload: &[],
        }
    }

    /// A successful ATOMIC_ACKNOWLEDGE carrying the `old` value.
    pub fn atomic_ack(old: u64) -> Self {
        Repr {
            kind: ResponseKind::AtomicAcknowledge,
            status: Status::Ok,
            value: old,
            payload: &[],
        }
    }

    /// The response of the right kind for a frame with `opcode` failing with
    /// `status`: no value, no data.
    pub fn error(opcode: Opcode, status: Status) -> Self {
        Repr {
            kind: ResponseKind::answering(opcode),
            status,
            value: 0,
            payload: &[],
        }
    }

    /// Parses a response body of `kind`.
    ///
    /// Rejects non-zero reserved bytes (`ReservedBits`), a payload on an
    /// acknowledgement (`LengthMismatch`) and READ data above
    /// [`MAX_DATA_LEN`] (`DataTooLong`).
    pub fn parse<T: AsRef<[u8]> + ?Sized>(
        packet: &Packet<&'a T>,
        kind: ResponseKind,
    ) -> Result<Repr<'a>> {
        packet.check_len()?;
        if packet.reserved() != 0 {
            return Err(Error::ReservedBits {
                what: "response reserved bytes",
                value: packet.reserved(),
            });
        }
        let repr = Repr {
            kind,
            status: packet.status(),
            value: packet.value(),
            payload: packet.payload(),
        };
        repr.check()?;
        Ok(repr)
    }

    /// Checks the payload rules [`Repr::parse`] enforces.
    pub fn check(&self) -> Result<()> {
        if self.kind != ResponseKind::ReadResponse && !self.payload.is_empty() {
            return Err(Error::LengthMismatch {
                what: "payload of an acknowledgement",
                expected: 0,
                got: self.payload.len(),
            });
        }
        if self.payload.len() > MAX_DATA_LEN as usize {
            return Err(Error::DataTooLong {
                len: self.payload.len() as u64,
            });
        }
        Ok(())
    }

    /// Length of the body this value encodes to.
    pub fn buffer_len(&self) -> usize {
        HEADER_LEN + self.payload.len()
    }

    /// Writes this value into a body of at least [`Repr::buffer_len`] bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set_status(self.status);
        packet.clear_reserved();
        packet.set_value(self.value);
        packet.payload_mut()[..self.payload.len()].copy_from_slice(self.payload);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // READ_RESPONSE, OK, carrying "data".
    const READ: [u8; 20] = [
        0x00, 0x00, // status
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // reserved
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // value
        b'd', b'a', b't', b'a', // payload
    ];

    // ATOMIC_ACKNOWLEDGE, ACCESS_DENIED, value 0x1122334455667788.
    const ATOMIC: [u8; 16] = [
        0x01, 0x00, // status
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // reserved
        0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11, // value
    ];

    fn atomic_repr() -> Repr<'static> {
        Repr {
            kind: ResponseKind::AtomicAcknowledge,
            status: Status::AccessDenied,
            value: 0x1122_3344_5566_7788,
            payload: &[],
        }
    }

    #[test]
    fn construct() {
        let mut bytes = [0xFFu8; 20];
        let mut packet = Packet::new_unchecked(&mut bytes[..]);
        packet.set_status(Status::Ok);
        packet.clear_reserved();
        packet.set_value(0);
        packet.payload_mut().copy_from_slice(b"data");
        assert_eq!(bytes, READ);

        let mut bytes = [0xFFu8; 16];
        let mut packet = Packet::new_unchecked(&mut bytes[..]);
        packet.set_status(Status::AccessDenied);
        packet.clear_reserved();
        packet.set_value(0x1122_3344_5566_7788);
        assert_eq!(bytes, ATOMIC);
    }

    #[test]
    fn deconstruct() {
        let packet = Packet::new_checked(&READ[..]).unwrap();
        assert_eq!(packet.status(), Status::Ok);
        assert_eq!(packet.reserved(), 0);
        assert_eq!(packet.value(), 0);
        assert_eq!(packet.payload(), b"data");
        let packet = Packet::new_checked(&ATOMIC[..]).unwrap();
        assert_eq!(packet.status(), Status::AccessDenied);
        assert_eq!(packet.value(), 0x1122_3344_5566_7788);
        assert!(packet.payload().is_empty());
    }

    #[test]
    fn parse() {
        let packet = Packet::new_checked(&READ[..]).unwrap();
        assert_eq!(
            Repr::parse(&packet, ResponseKind::ReadResponse).unwrap(),
            Repr::read_data(b"data")
        );
        let packet = Packet::new_checked(&ATOMIC[..]).unwrap();
        assert_eq!(
            Repr::parse(&packet, ResponseKind::AtomicAcknowledge).unwrap(),
            atomic_repr()
        );
    }

    #[test]
    fn emit() {
        let repr = Repr::read_data(b"data");
        let mut bytes = [0xFFu8; 20];
        assert_eq!(repr.buffer_len(), 20);
        repr.emit(&mut Packet::new_unchecked(&mut bytes[..]));
        assert_eq!(bytes, READ);
        let mut bytes = [0xFFu8; 16];
        atomic_repr().emit(&mut Packet::new_unchecked(&mut bytes[..]));
        assert_eq!(bytes, ATOMIC);
    }

    fn parse_bytes(bytes: &[u8], kind: ResponseKind) -> Result<Repr<'_>> {
        Repr::parse(&Packet::new_checked(bytes)?, kind)
    }

    #[test]
    fn rejects_malformed() {
        assert_eq!(
            parse_bytes(&ATOMIC[..15], ResponseKind::AtomicAcknowledge),
            Err(Error::Truncated {
                needed: 16,
                got: 15
            })
        );
        let mut bytes = ATOMIC;
        bytes[7] = 0x80;
        assert_eq!(
            parse_bytes(&bytes, ResponseKind::AtomicAcknowledge),
            Err(Error::ReservedBits {
                what: "response reserved bytes",
                value: 0x80 << 40
            })
        );
        assert_eq!(
            parse_bytes(&READ, ResponseKind::Acknowledge),
            Err(Error::LengthMismatch {
                what: "payload of an acknowledgement",
                expected: 0,
                got: 4
            })
        );
    }

    #[test]
    fn unknown_status_is_kept() {
        let mut bytes = ATOMIC;
        bytes[0..2].copy_from_slice(&500u16.to_le_bytes());
        let repr = parse_bytes(&bytes, ResponseKind::Acknowledge).unwrap();
        assert_eq!(repr.status, Status::Unknown(500));
        let mut out = [0u8; 16];
        repr.emit(&mut Packet::new_unchecked(&mut out[..]));
        assert_eq!(out, bytes);
    }

    #[test]
    fn kinds() {
        for kind in ResponseKind::ALL {
            assert!(kind.opcode().is_response());
            assert_eq!(ResponseKind::from_opcode(kind.opcode()), Some(kind));
        }
        assert_eq!(
            ResponseKind::answering(Opcode::Read),
            ResponseKind::ReadResponse
        );
        assert_eq!(
            ResponseKind::answering(Opcode::FetchAdd),
            ResponseKind::AtomicAcknowledge
        );
        assert_eq!(
            ResponseKind::answering(Opcode::Unknown(0x55)),
            ResponseKind::Acknowledge
        );
        assert_eq!(
            Repr::error(Opcode::CompareSwap, Status::Busy),
            Repr {
                kind: ResponseKind::AtomicAcknowledge,
                status: Status::Busy,
                value: 0,
                payload: &[]
            }
        );
    }
}
