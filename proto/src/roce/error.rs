//! Why bytes are not a RoCEv2 packet this crate accepts.

/// A RoCEv2 packet (or one of its headers) that could not be parsed or checked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The buffer ends before the structure it should hold.
    #[error("truncated {what}: {needed} bytes needed, {got} available")]
    Truncated {
        /// Which structure.
        what: &'static str,
        /// Bytes it needs.
        needed: usize,
        /// Bytes that were there.
        got: usize,
    },
    /// The IP or UDP layer is not RoCEv2: not IPv4, not UDP, a fragment,
    /// another port, or a length field that disagrees with the bytes.
    #[error("not a RoCEv2 datagram: {0}")]
    NotRoce(&'static str),
    /// The IPv4 header checksum is wrong.
    #[error("IPv4 header checksum mismatch")]
    BadIpChecksum,
    /// The UDP checksum is present and wrong.
    #[error("UDP checksum mismatch")]
    BadUdpChecksum,
    /// The invariant CRC does not match the packet's contents.
    #[error("ICRC mismatch: packet carries {carried:#010x}, contents give {computed:#010x}")]
    BadIcrc {
        /// The ICRC in the packet.
        carried: u32,
        /// The ICRC of the packet's invariant fields.
        computed: u32,
    },
    /// The BTH transport header version is not 0.
    #[error("BTH transport version {0}, expected 0")]
    BadTransportVersion(u8),
    /// The opcode is not an RC opcode this crate knows; the BTH is still readable.
    #[error("unknown BTH opcode {0:#04x}")]
    UnknownOpcode(u8),
    /// A pad count larger than the payload, or padding on an opcode without payload.
    #[error("pad count {pad} with a {payload_len}-byte payload")]
    BadPadding {
        /// The BTH pad count.
        pad: u8,
        /// Bytes between the headers and the ICRC.
        payload_len: usize,
    },
    /// Bytes after the headers of an opcode that carries no payload.
    #[error("{opcode} carries no payload, found {len} bytes")]
    UnexpectedPayload {
        /// The opcode's name.
        opcode: &'static str,
        /// Bytes found.
        len: usize,
    },
    /// A value that cannot be encoded (for `emit`): the headers present do
    /// not match the opcode, or a field is out of range.
    #[error("cannot encode: {0}")]
    Inconsistent(&'static str),
}

/// `Result` with the RoCEv2 [`Error`].
pub type Result<T> = core::result::Result<T, Error>;

pub(crate) fn truncated(what: &'static str, needed: usize, got: usize) -> Error {
    Error::Truncated { what, needed, got }
}
