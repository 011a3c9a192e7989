//! The status every response carries.

use core::fmt;

/// Outcome of a request (response body bytes 0..2).
///
/// Unknown values are kept in [`Status::Unknown`] so a relay passes them on
/// unchanged. `Status::from(u16)` never yields `Unknown` for a named value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Status {
    /// Success (0).
    Ok,
    /// The key does not match the region or allocation (1).
    AccessDenied,
    /// The range lies (partly) outside the region (2).
    OutOfBounds,
    /// No region is mapped at the address (3).
    Unmapped,
    /// The server owning the address cannot be reached (4).
    ServerUnavailable,
    /// The request is malformed or inconsistent (5).
    BadRequest,
    /// The opcode or a requested feature is not supported (6).
    Unsupported,
    /// The request did not complete in time (7).
    Timeout,
    /// The peer is overloaded; retry later (8).
    Busy,
    /// The peer does not admit this client (9).
    UnknownClient,
    /// No common protocol version (10).
    VersionMismatch,
    /// The server failed to read, write or persist the data (11).
    IoError,
    /// The exactly-once identity (client, lane, sequence number) already
    /// names a different request: another operation, target or operand
    /// (12). Nothing ran; the recorded result is not given out.
    ExactlyOnceConflict,
    /// The sender and the receiver run different epochs of the cluster map
    /// (13): the connection said an older epoch than the receiver's, or a
    /// newer one and the request needs a part of the map the receiver does
    /// not have yet. The response's value carries the receiver's epoch.
    /// Nothing ran; the sender brings its map up to date (or waits for the
    /// receiver to) and sends the request again.
    StaleMap,
    /// This device does not order the region's requests; send them to its
    /// owner device (14). Nothing ran.
    NotOwner,
    /// Any other value.
    Unknown(u16),
}

impl Status {
    /// Every named status, in numeric order.
    pub const ALL: [Status; 15] = [
        Status::Ok,
        Status::AccessDenied,
        Status::OutOfBounds,
        Status::Unmapped,
        Status::ServerUnavailable,
        Status::BadRequest,
        Status::Unsupported,
        Status::Timeout,
        Status::Busy,
        Status::UnknownClient,
        Status::VersionMismatch,
        Status::IoError,
        Status::ExactlyOnceConflict,
        Status::StaleMap,
        Status::NotOwner,
    ];

    /// Whether this is [`Status::Ok`].
    pub fn is_ok(self) -> bool {
        self == Status::Ok
    }

    /// The name used in logs and metrics, e.g. `"ACCESS_DENIED"`; `"UNKNOWN"`
    /// for unknown values (whose `Display` adds the number: `UNKNOWN(99)`).
    pub fn name(self) -> &'static str {
        match self {
            Status::Ok => "OK",
            Status::AccessDenied => "ACCESS_DENIED",
            Status::OutOfBounds => "OUT_OF_BOUNDS",
            Status::Unmapped => "UNMAPPED",
            Status::ServerUnavailable => "SERVER_UNAVAILABLE",
            Status::BadRequest => "BAD_REQUEST",
            Status::Unsupported => "UNSUPPORTED",
            Status::Timeout => "TIMEOUT",
            Status::Busy => "BUSY",
            Status::UnknownClient => "UNKNOWN_CLIENT",
            Status::VersionMismatch => "VERSION_MISMATCH",
            Status::IoError => "IO_ERROR",
            Status::ExactlyOnceConflict => "EXACTLY_ONCE_CONFLICT",
            Status::StaleMap => "STALE_MAP",
            Status::NotOwner => "NOT_OWNER",
            Status::Unknown(_) => "UNKNOWN",
        }
    }
}

impl From<u16> for Status {
    fn from(value: u16) -> Self {
        match value {
            0 => Status::Ok,
            1 => Status::AccessDenied,
            2 => Status::OutOfBounds,
            3 => Status::Unmapped,
            4 => Status::ServerUnavailable,
            5 => Status::BadRequest,
            6 => Status::Unsupported,
            7 => Status::Timeout,
            8 => Status::Busy,
            9 => Status::UnknownClient,
            10 => Status::VersionMismatch,
            11 => Status::IoError,
            12 => Status::ExactlyOnceConflict,
            13 => Status::StaleMap,
            14 => Status::NotOwner,
            other => Status::Unknown(other),
        }
    }
}

impl From<Status> for u16 {
    fn from(value: Status) -> Self {
        match value {
            Status::Ok => 0,
            Status::AccessDenied => 1,
            Status::OutOfBounds => 2,
            Status::Unmapped => 3,
            Status::ServerUnavailable => 4,
            Status::BadRequest => 5,
            Status::Unsupported => 6,
            Status::Timeout => 7,
            Status::Busy => 8,
            Status::UnknownClient => 9,
            Status::VersionMismatch => 10,
            Status::IoError => 11,
            Status::ExactlyOnceConflict => 12,
            Status::StaleMap => 13,
            Status::NotOwner => 14,
            Status::Unknown(other) => other,
        }
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Status::Unknown(v) => write!(f, "UNKNOWN({v})"),
            known => f.write_str(known.name()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbering_is_dense_from_zero() {
        for (i, status) in Status::ALL.into_iter().enumerate() {
            assert_eq!(usize::from(u16::from(status)), i, "{status}");
        }
    }

    #[test]
    fn every_value_round_trips() {
        for value in 0..=u16::MAX {
            let status = Status::from(value);
            assert_eq!(u16::from(status), value);
            assert_eq!(matches!(status, Status::Unknown(_)), value > 14);
        }
    }

    #[test]
    fn display() {
        assert_eq!(Status::Ok.to_string(), "OK");
        assert_eq!(Status::AccessDenied.to_string(), "ACCESS_DENIED");
        assert_eq!(Status::ServerUnavailable.to_string(), "SERVER_UNAVAILABLE");
        assert_eq!(Status::Unknown(99).to_string(), "UNKNOWN(99)");
        assert!(Status::Ok.is_ok());
        assert!(!Status::Busy.is_ok());
    }
}
