//! The ACK extended transport header (AETH), 4 bytes: a syndrome (ACK, RNR
//! NAK or NAK) and the responder's message sequence number (MSN).
//!
//! ```text
//! 0      syndrome: bit 7 zero; bits 6..5 kind (00 ACK, 01 RNR NAK, 11 NAK);
//!        bits 4..0 credit count, RNR timer or NAK code
//! 1..4   MSN (24 bits)
//! ```

use core::fmt;
use core::time::Duration;

use super::header::{be_uint, fixed_header, put_be_uint};

/// Byte ranges of the AETH.
pub mod field {
    use crate::Field;

    /// Syndrome.
    pub const SYNDROME: usize = 0;
    /// Message sequence number.
    pub const MSN: Field = 1..4;
}

/// Length of the AETH.
pub const HEADER_LEN: usize = 4;

/// The credit count that means "no end-to-end flow control" (what Linux rxe sends).
pub const UNLIMITED_CREDITS: u8 = 0x1F;

/// Why a responder refused a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NakCode {
    /// A request arrived with a PSN past the expected one: some were lost.
    PsnSequenceError,
    /// Malformed request, unsupported opcode, or a message too long.
    InvalidRequest,
    /// Bad R_Key, an address outside the region, or access not granted.
    RemoteAccessError,
    /// The responder could not complete a valid request.
    RemoteOperationalError,
    /// Invalid RD request (reliable datagram only).
    InvalidRdRequest,
    /// A reserved code.
    Unknown(u8),
}

impl From<u8> for NakCode {
    fn from(code: u8) -> Self {
        match code {
            0 => NakCode::PsnSequenceError,
            1 => NakCode::InvalidRequest,
            2 => NakCode::RemoteAccessError,
            3 => NakCode::RemoteOperationalError,
            4 => NakCode::InvalidRdRequest,
            other => NakCode::Unknown(other),
        }
    }
}

impl From<NakCode> for u8 {
    fn from(code: NakCode) -> u8 {
        match code {
            NakCode::PsnSequenceError => 0,
            NakCode::InvalidRequest => 1,
            NakCode::RemoteAccessError => 2,
            NakCode::RemoteOperationalError => 3,
            NakCode::InvalidRdRequest => 4,
            NakCode::Unknown(other) => other & 0x1F,
        }
    }
}

/// What the AETH says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Syndrome {
    /// Positive acknowledge with an end-to-end credit count.
    Ack {
        /// Credit count (5 bits); [`UNLIMITED_CREDITS`] disables flow control.
        credits: u8,
    },
    /// Receiver not ready: no receive was posted for a SEND; retry after the timer.
    RnrNak {
        /// The encoded timer (5 bits), see [`rnr_delay`].
        timer: u8,
    },
    /// Negative acknowledge.
    Nak(NakCode),
    /// A reserved syndrome value.
    Reserved(u8),
}

impl From<u8> for Syndrome {
    fn from(byte: u8) -> Self {
        let value = byte & 0x1F;
        match byte >> 5 {
            0b000 => Syndrome::Ack { credits: value },
            0b001 => Syndrome::RnrNak { timer: value },
            0b011 => Syndrome::Nak(NakCode::from(value)),
            _ => Syndrome::Reserved(byte),
        }
    }
}

impl From<Syndrome> for u8 {
    fn from(s: Syndrome) -> u8 {
        match s {
            Syndrome::Ack { credits } => credits & 0x1F,
            Syndrome::RnrNak { timer } => 0x20 | (timer & 0x1F),
            Syndrome::Nak(code) => 0x60 | u8::from(code),
            Syndrome::Reserved(byte) => byte,
        }
    }
}

/// The minimum delay an RNR NAK timer code asks for (IBTA's table of the
/// 5-bit encodings: 0 is the longest, 655.36 ms; 1..=31 grow from 0.01 ms
/// to 491.52 ms).
pub fn rnr_delay(timer: u8) -> Duration {
    const MICROS: [u64; 32] = [
        655_360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1_280, 1_920, 2_560,
        3_840, 5_120, 7_680, 10_240, 15_360, 20_480, 30_720, 40_960, 61_440, 81_920, 122_880,
        163_840, 245_760, 327_680, 491_520,
    ];
    Duration::from_micros(MICROS[usize::from(timer & 0x1F)])
}

fixed_header!("AETH");

impl<T: AsRef<[u8]>> Packet<T> {
    /// The raw syndrome byte.
    pub fn syndrome(&self) -> u8 {
        self.buffer.as_ref()[field::SYNDROME]
    }

    /// The message sequence number.
    pub fn msn(&self) -> u32 {
        be_uint(&self.buffer.as_ref()[field::MSN]) as u32
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the raw syndrome byte.
    pub fn set_syndrome(&mut self, syndrome: u8) {
        self.buffer.as_mut()[field::SYNDROME] = syndrome;
    }

    /// Sets the message sequence number (low 24 bits).
    pub fn set_msn(&mut self, msn: u32) {
        put_be_uint(&mut self.buffer.as_mut()[field::MSN], msn.into());
    }
}

/// A parsed AETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr {
    /// ACK, RNR NAK or NAK.
    pub syndrome: Syndrome,
    /// Message sequence number (24 bits).
    pub msn: u32,
}

impl Repr {
    /// Parses an AETH.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> super::Result<Repr> {
        packet.check_len()?;
        Ok(Repr {
            syndrome: Syndrome::from(packet.syndrome()),
            msn: packet.msn(),
        })
    }

    /// Length of the header.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the header.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set_syndrome(self.syndrome.into());
        packet.set_msn(self.msn);
    }
}

impl fmt::Display for Repr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.syndrome {
            Syndrome::Ack { credits } => write!(f, "AETH ACK credits={credits:#x}")?,
            Syndrome::RnrNak { timer } => write!(f, "AETH RNR-NAK timer={timer}")?,
            Syndrome::Nak(code) => write!(f, "AETH NAK {code:?}")?,
            Syndrome::Reserved(b) => write!(f, "AETH reserved syndrome {b:#04x}")?,
        }
        write!(f, " msn={}", self.msn)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn syndromes_round_trip() {
        for byte in 0..=u8::MAX {
            assert_eq!(u8::from(Syndrome::from(byte)), byte, "{byte:#x}");
        }
        assert_eq!(Syndrome::from(0x1F), Syndrome::Ack { credits: 0x1F });
        assert_eq!(Syndrome::from(0x2E), Syndrome::RnrNak { timer: 14 });
        assert_eq!(
            Syndrome::from(0x60),
            Syndrome::Nak(NakCode::PsnSequenceError)
        );
        assert_eq!(
            Syndrome::from(0x62),
            Syndrome::Nak(NakCode::RemoteAccessError)
        );
        assert_eq!(Syndrome::from(0x40), Syndrome::Reserved(0x40));
    }

    #[test]
    fn parse_and_emit() {
        let bytes = [0x61, 0x00, 0x01, 0x02];
        let repr = Repr::parse(&Packet::new_checked(&bytes[..]).unwrap()).unwrap();
        assert_eq!(
            repr,
            Repr {
                syndrome: Syndrome::Nak(NakCode::InvalidRequest),
                msn: 0x102
            }
        );
        let mut out = [0u8; 4];
        repr.emit(&mut Packet::new_unchecked(&mut out[..]));
        assert_eq!(out, bytes);
        assert_eq!(repr.to_string(), "AETH NAK InvalidRequest msn=258");
    }

    #[test]
    fn rnr_timer_table_ends() {
        assert_eq!(rnr_delay(0), Duration::from_micros(655_360));
        assert_eq!(rnr_delay(1), Duration::from_micros(10));
        assert_eq!(rnr_delay(31), Duration::from_micros(491_520));
    }
}
