//! HELLO: the first message on a connection, in both directions.
//!
//! ```text
//! 0..2    version       u16, highest protocol version the sender speaks
//! 2       role          u8, see Role
//! 3       reserved      zero
//! 4..12   capabilities  u64 bit set, see Capabilities
//! 12..14  name_len      u16, at most 255
//! 14..    name          name_len bytes of UTF-8; nothing follows
//! ```
//!
//! The peer answers with its own HELLO carrying the same tag, or with an
//! ACKNOWLEDGE carrying `UNKNOWN_CLIENT` or `VERSION_MISMATCH`.

use core::fmt;

use crate::error::{Error, Result};
use crate::le;
use crate::view::{len_as_announced, len_at_least, wire_view};

pub use crate::limits::{MAX_NAME_LEN, PROTOCOL_VERSION};

/// Byte ranges of a HELLO body.
pub mod field {
    use crate::{Field, Rest};

    /// Highest protocol version spoken.
    pub const VERSION: Field = 0..2;
    /// Role of the sender.
    pub const ROLE: usize = 2;
    /// Reserved, zero.
    pub const RESERVED: usize = 3;
    /// Capability bits.
    pub const CAPABILITIES: Field = 4..12;
    /// Name length.
    pub const NAME_LEN: Field = 12..14;
    /// Name bytes.
    pub const NAME: Rest = 14..;
}

/// Length of the fixed part of a HELLO body.
pub const HEADER_LEN: usize = 14;

wire_view! {
    /// A read/write view of a HELLO body.
    pub struct Packet;
    error: Error;
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Checks that the fixed part is there and the name fills the rest exactly.
    pub fn check_len(&self) -> Result<()> {
        let len = self.buffer.as_ref().len();
        len_at_least(len, HEADER_LEN)?;
        len_as_announced(len, HEADER_LEN + usize::from(self.name_len()), "hello body")
    }

    /// Highest protocol version the sender speaks.
    pub fn version(&self) -> u16 {
        le::u16_at(&self.buffer.as_ref()[field::VERSION])
    }

    /// Role of the sender.
    pub fn role(&self) -> Role {
        Role::from(self.buffer.as_ref()[field::ROLE])
    }

    /// The reserved byte (zero when well formed).
    pub fn reserved(&self) -> u8 {
        self.buffer.as_ref()[field::RESERVED]
    }

    /// Capability bits.
    pub fn capabilities(&self) -> Capabilities {
        Capabilities(le::u64_at(&self.buffer.as_ref()[field::CAPABILITIES]))
    }

    /// Name length in bytes.
    pub fn name_len(&self) -> u16 {
        le::u16_at(&self.buffer.as_ref()[field::NAME_LEN])
    }
}

impl<'a, T: AsRef<[u8]> + ?Sized> Packet<&'a T> {
    /// The raw name bytes.
    pub fn name(&self) -> &'a [u8] {
        &self.buffer.as_ref()[field::NAME]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the protocol version.
    pub fn set_version(&mut self, value: u16) {
        le::put_u16(&mut self.buffer.as_mut()[field::VERSION], value);
    }

    /// Sets the role.
    pub fn set_role(&mut self, value: Role) {
        self.buffer.as_mut()[field::ROLE] = value.into();
    }

    /// Zeroes the reserved byte.
    pub fn clear_reserved(&mut self) {
        self.buffer.as_mut()[field::RESERVED] = 0;
    }

    /// Sets the capability bits.
    pub fn set_capabilities(&mut self, value: Capabilities) {
        le::put_u64(&mut self.buffer.as_mut()[field::CAPABILITIES], value.0);
    }

    /// Sets the name length.
    pub fn set_name_len(&mut self, value: u16) {
        le::put_u16(&mut self.buffer.as_mut()[field::NAME_LEN], value);
    }

    /// The name bytes, mutably.
    pub fn name_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[field::NAME]
    }
}

/// What kind of peer sent a HELLO.
///
/// `Role::from(u8)` never yields `Unknown` for a named value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// An application host's client library (1).
    Client,
    /// A fabric device (2).
    FabricDevice,
    /// A PMEM server (3).
    Server,
    /// An administrative tool (4).
    Admin,
    /// Any other value.
    Unknown(u8),
}

impl From<u8> for Role {
    fn from(value: u8) -> Self {
        match value {
            1 => Role::Client,
            2 => Role::FabricDevice,
            3 => Role::Server,
            4 => Role::Admin,
            other => Role::Unknown(other),
        }
    }
}

impl From<Role> for u8 {
    fn from(value: Role) -> Self {
        match value {
            Role::Client => 1,
            Role::FabricDevice => 2,
            Role::Server => 3,
            Role::Admin => 4,
            Role::Unknown(other) => other,
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Role::Client => f.write_str("CLIENT"),
            Role::FabricDevice => f.write_str("FABRIC_DEVICE"),
            Role::Server => f.write_str("SERVER"),
            Role::Admin => f.write_str("ADMIN"),
            Role::Unknown(v) => write!(f, "UNKNOWN({v})"),
        }
    }
}

/// Optional protocol features a peer supports; unknown bits are kept.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Capabilities(pub u64);

impl Capabilities {
    /// No optional feature.
    pub const NONE: Capabilities = Capabilities(0);
    /// Many outstanding requests per connection, answered out of order.
    pub const PIPELINING: Capabilities = Capabilities(1 << 0);
    /// Honours EXACTLY_ONCE (client, seq) on atomics.
    pub const EXACTLY_ONCE: Capabilities = Capabilities(1 << 1);
    /// Accepts region-addressed requests.
    pub const REGION_ADDRESSING: Capabilities = Capabilities(1 << 2);
    /// Moves payloads without copying (e.g. registered memory, verbs).
    pub const ZERO_COPY: Capabilities = Capabilities(1 << 3);
    /// Executes ATOMIC_WRITE and FLUSH.
    pub const PERSISTENT_ATOMICS: Capabilities = Capabilities(1 << 4);
    /// Takes the sender's map epoch at the end of QP_CONNECT (`qp`), and
    /// fences the queue pair by it.
    pub const QP_EPOCH: Capabilities = Capabilities(1 << 5);

    const NAMED: [(Capabilities, &'static str); 6] = [
        (Self::PIPELINING, "PIPELINING"),
        (Self::EXACTLY_ONCE, "EXACTLY_ONCE"),
        (Self::REGION_ADDRESSING, "REGION_ADDRESSING"),
        (Self::ZERO_COPY, "ZERO_COPY"),
        (Self::PERSISTENT_ATOMICS, "PERSISTENT_ATOMICS"),
        (Self::QP_EPOCH, "QP_EPOCH"),
    ];

    /// The raw bits.
    pub const fn bits(self) -> u64 {
        self.0
    }

    /// Whether every bit of `other` is set here.
    pub const fn contains(self, other: Capabilities) -> bool {
        self.0 & other.0 == other.0
    }

    /// The features of either set.
    pub const fn union(self, other: Capabilities) -> Capabilities {
        Capabilities(self.0 | other.0)
    }

    /// The features both sides support.
    pub const fn intersection(self, other: Capabilities) -> Capabilities {
        Capabilities(self.0 & other.0)
    }
}

impl core::ops::BitOr for Capabilities {
    type Output = Capabilities;

    fn bitor(self, rhs: Capabilities) -> Capabilities {
        Capabilities(self.0 | rhs.0)
    }
}

impl core::ops::BitOrAssign for Capabilities {
    fn bitor_assign(&mut self, rhs: Capabilities) {
        self.0 |= rhs.0;
    }
}

impl fmt::Debug for Capabilities {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut rest = self.0;
        let mut first = true;
        f.write_str("Capabilities(")?;
        for (cap, name) in Self::NAMED {
            if self.contains(cap) {
                if !first {
                    f.write_str(" | ")?;
                }
                f.write_str(name)?;
                first = false;
                rest &= !cap.0;
            }
        }
        if rest != 0 || first {
            if !first {
                f.write_str(" | ")?;
            }
            write!(f, "{rest:#x}")?;
        }
        f.write_str(")")
    }
}

/// A parsed HELLO body; the name is borrowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr<'a> {
    /// Highest protocol version the sender speaks.
    pub version: u16,
    /// Role of the sender.
    pub role: Role,
    /// Optional features the sender supports.
    pub capabilities: Capabilities,
    /// The sender's name (client or daemon id from the topology), ≤ 255 bytes.
    pub name: &'a str,
}

impl<'a> Repr<'a> {
    /// Parses a HELLO body; rejects a non-zero reserved byte
    /// (`ReservedBits`), a name over [`MAX_NAME_LEN`] bytes (`NameTooLong`) or
    /// not UTF-8 (`NameNotUtf8`).
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&'a T>) -> Result<Repr<'a>> {
        packet.check_len()?;
        if packet.reserved() != 0 {
            return Err(Error::ReservedBits {
                what: "hello reserved byte",
                value: packet.reserved().into(),
            });
        }
        let raw = packet.name();
        if raw.len() > MAX_NAME_LEN {
            return Err(Error::NameTooLong { len: raw.len() });
        }
        let name = core::str::from_utf8(raw).map_err(|e| Error::NameNotUtf8 {
            valid_up_to: e.valid_up_to(),
        })?;
        Ok(Repr {
            version: packet.version(),
            role: packet.role(),
            capabilities: packet.capabilities(),
            name,
        })
    }

    /// Checks the name length [`Repr::parse`] enforces.
    pub fn check(&self) -> Result<()> {
        if self.name.len() > MAX_NAME_LEN {
            return Err(Error::NameTooLong {
                len: self.name.len(),
            });
        }
        Ok(())
    }

    /// Length of the body this value encodes to.
    pub fn buffer_len(&self) -> usize {
        HEADER_LEN + self.name.len()
    }

    /// Writes this value into a body of exactly [`Repr::buffer_len`] bytes.
    ///
    /// A name over [`MAX_NAME_LEN`] bytes gives a body that [`Repr::parse`]
    /// rejects; call [`Repr::check`] first.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set_version(self.version);
        packet.set_role(self.role);
        packet.clear_reserved();
        packet.set_capabilities(self.capabilities);
        let name = self.name.as_bytes();
        let len = u16::try_from(name.len()).unwrap_or(u16::MAX);
        packet.set_name_len(len);
        let len = usize::from(len);
        packet.name_mut()[..len].copy_from_slice(&name[..len]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Version 1, FABRIC_DEVICE, PIPELINING | EXACTLY_ONCE, name "fd0".
    const BYTES: [u8; 17] = [
        0x01, 0x00, // version
        0x02, // role
        0x00, // reserved
        0x03, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // capabilities
        0x03, 0x00, // name_len
        b'f', b'd', b'0', // name
    ];

    fn repr() -> Repr<'static> {
        Repr {
            version: 1,
            role: Role::FabricDevice,
            capabilities: Capabilities::PIPELINING | Capabilities::EXACTLY_ONCE,
            name: "fd0",
        }
    }

    #[test]
    fn construct() {
        let mut bytes = [0xFFu8; 17];
        let mut packet = Packet::new_unchecked(&mut bytes[..]);
        packet.set_version(1);
        packet.set_role(Role::FabricDevice);
        packet.clear_reserved();
        packet.set_capabilities(Capabilities(3));
        packet.set_name_len(3);
        packet.name_mut().copy_from_slice(b"fd0");
        assert_eq!(bytes, BYTES);
    }

    #[test]
    fn deconstruct() {
        let packet = Packet::new_checked(&BYTES[..]).unwrap();
        assert_eq!(packet.version(), 1);
        assert_eq!(packet.role(), Role::FabricDevice);
        assert_eq!(packet.reserved(), 0);
        assert_eq!(packet.capabilities(), Capabilities(3));
        assert_eq!(packet.name_len(), 3);
        assert_eq!(packet.name(), b"fd0");
    }

    #[test]
    fn parse() {
        let packet = Packet::new_checked(&BYTES[..]).unwrap();
        assert_eq!(Repr::parse(&packet).unwrap(), repr());
    }

    #[test]
    fn emit() {
        let mut bytes = [0xFFu8; 17];
        assert_eq!(repr().buffer_len(), 17);
        repr().emit(&mut Packet::new_unchecked(&mut bytes[..]));
        assert_eq!(bytes, BYTES);
    }

    fn parse_bytes(bytes: &[u8]) -> Result<Repr<'_>> {
        Repr::parse(&Packet::new_checked(bytes)?)
    }

    #[test]
    fn rejects_malformed() {
        assert_eq!(
            parse_bytes(&BYTES[..13]),
            Err(Error::Truncated {
                needed: 14,
                got: 13
            })
        );
        assert_eq!(
            parse_bytes(&BYTES[..16]),
            Err(Error::LengthMismatch {
                what: "hello body",
                expected: 17,
                got: 16
            })
        );
        let mut bytes = BYTES;
        bytes[3] = 1;
        assert!(matches!(
            parse_bytes(&bytes),
            Err(Error::ReservedBits { value: 1, .. })
        ));
        let mut bytes = BYTES;
        bytes[15] = 0xC3;
        assert_eq!(
            parse_bytes(&bytes),
            Err(Error::NameNotUtf8 { valid_up_to: 1 })
        );
        let mut long = vec![0u8; HEADER_LEN + 256];
        long[12..14].copy_from_slice(&256u16.to_le_bytes());
        long[14..].fill(b'a');
        assert_eq!(parse_bytes(&long), Err(Error::NameTooLong { len: 256 }));
        let name = "a".repeat(256);
        assert_eq!(
            Repr {
                name: &name,
                ..repr()
            }
            .check(),
            Err(Error::NameTooLong { len: 256 })
        );
    }

    #[test]
    fn roles_and_capabilities() {
        for value in 0..=u8::MAX {
            assert_eq!(u8::from(Role::from(value)), value);
        }
        assert_eq!(Role::from(9), Role::Unknown(9));
        assert_eq!(Role::Server.to_string(), "SERVER");
        let caps = Capabilities::PIPELINING | Capabilities(1 << 40);
        assert!(caps.contains(Capabilities::PIPELINING));
        assert!(!caps.contains(Capabilities::ZERO_COPY));
        assert_eq!(
            format!("{caps:?}"),
            "Capabilities(PIPELINING | 0x10000000000)"
        );
        assert_eq!(format!("{:?}", Capabilities::NONE), "Capabilities(0x0)");
        assert_eq!(
            caps.intersection(Capabilities::PIPELINING | Capabilities::ZERO_COPY),
            Capabilities::PIPELINING
        );
    }
}
