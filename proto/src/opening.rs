//! The opening of a connection from the side that connects, sans-IO: HELLO
//! and, when asked for, MAP_REQUEST; then the peer's HELLO (or its refusal)
//! and MAP. The caller moves the bytes and decides what a MAP must match.

use crate::error::Error;
use crate::hello::{self, Capabilities, PROTOCOL_VERSION, Role};
use crate::map;
use crate::message::{Message, parse_frame};
use crate::opcode::Opcode;
use crate::status::Status;

/// Tags of the opening's HELLO and MAP_REQUEST.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpeningTags {
    /// HELLO's tag.
    pub hello: u64,
    /// MAP_REQUEST's tag.
    pub map: u64,
}

impl OpeningTags {
    /// The tags clients use: 1 and 2 (their own requests start at 3).
    pub const CLIENT: OpeningTags = OpeningTags { hello: 1, map: 2 };
}

/// An opening in progress.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Opening {
    tags: OpeningTags,
    with_map: bool,
    peer: Option<(String, Role)>,
}

/// What the opening established.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Opened {
    /// The peer's name from its HELLO.
    pub peer: String,
    /// The peer's role from its HELLO.
    pub role: Role,
    /// The peer's MAP, when one was asked for.
    pub map: Option<map::Repr>,
}

/// Where an opening stands after a frame from the peer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Progress {
    /// More answers are due.
    Waiting,
    /// Done.
    Opened(Opened),
}

/// Why an opening failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OpeningError {
    /// The peer answered HELLO with a refusal.
    #[error("refused: {0}")]
    Refused(Status),
    /// The peer sent something the opening does not expect.
    #[error("unexpected {opcode} with tag {tag} during the opening")]
    Unexpected {
        /// Its opcode.
        opcode: Opcode,
        /// Its tag.
        tag: u64,
    },
    /// The peer sent a frame that does not parse.
    #[error("malformed frame during the opening")]
    Malformed(#[source] Error),
}

impl Opening {
    /// Appends the opening's frames to `out`: HELLO as `role` named `name`,
    /// then MAP_REQUEST if `with_map`.
    pub fn start(
        role: Role,
        capabilities: Capabilities,
        name: &str,
        with_map: bool,
        tags: OpeningTags,
        out: &mut Vec<u8>,
    ) -> Result<Opening, Error> {
        let hello = Message::Hello(hello::Repr {
            version: PROTOCOL_VERSION,
            role,
            capabilities,
            name,
        });
        hello.encode_into(tags.hello, out)?;
        if with_map {
            Message::MapRequest.encode_into(tags.map, out)?;
        }
        Ok(Opening {
            tags,
            with_map,
            peer: None,
        })
    }

    /// The peer's name and role once its HELLO arrived (until the opening ends).
    pub fn peer(&self) -> Option<(&str, Role)> {
        self.peer
            .as_ref()
            .map(|(name, role)| (name.as_str(), *role))
    }

    /// Takes one frame the peer sent.
    pub fn handle_frame(&mut self, frame: &[u8]) -> Result<Progress, OpeningError> {
        let (message, tag) = parse_frame(frame).map_err(OpeningError::Malformed)?;
        match (message, self.peer.is_some()) {
            (Message::Hello(h), false) if tag == self.tags.hello => {
                if self.with_map {
                    self.peer = Some((h.name.to_owned(), h.role));
                    Ok(Progress::Waiting)
                } else {
                    Ok(Progress::Opened(Opened {
                        peer: h.name.to_owned(),
                        role: h.role,
                        map: None,
                    }))
                }
            }
            (Message::Response(r), false) if tag == self.tags.hello => {
                Err(OpeningError::Refused(r.status))
            }
            (Message::Map(map), true) if self.with_map && tag == self.tags.map => {
                let (peer, role) = self.peer.take().unwrap_or((String::new(), Role::Client));
                Ok(Progress::Opened(Opened {
                    peer,
                    role,
                    map: Some(map),
                }))
            }
            (other, _) => Err(OpeningError::Unexpected {
                opcode: other.opcode(),
                tag,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error_reply;

    fn hello_from(name: &str, tag: u64) -> Vec<u8> {
        Message::Hello(hello::Repr {
            version: PROTOCOL_VERSION,
            role: Role::FabricDevice,
            capabilities: Capabilities::NONE,
            name,
        })
        .encode_to_vec(tag)
        .expect("hello")
    }

    fn map_frame(tag: u64) -> Vec<u8> {
        Message::Map(map::Repr {
            digest: [7; 32],
            extent_size: 2 << 20,
            entries: Vec::new(),
        })
        .encode_to_vec(tag)
        .expect("map")
    }

    #[test]
    fn hello_then_map() {
        let mut out = Vec::new();
        let mut opening = Opening::start(
            Role::Client,
            Capabilities::NONE,
            "c1",
            true,
            OpeningTags::CLIENT,
            &mut out,
        )
        .expect("start");
        let (first, tag) = parse_frame(&out[..out.len() - 16]).expect("hello frame");
        assert!(matches!(first, Message::Hello(h) if h.name == "c1"));
        assert_eq!(tag, 1);
        assert_eq!(
            opening.handle_frame(&hello_from("F", 1)),
            Ok(Progress::Waiting)
        );
        match opening.handle_frame(&map_frame(2)) {
            Ok(Progress::Opened(o)) => {
                assert_eq!(o.peer, "F");
                assert_eq!(o.map.map(|m| m.digest), Some([7; 32]));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn hello_only_refusals_and_surprises() {
        let mut out = Vec::new();
        let start = |out: &mut Vec<u8>| {
            Opening::start(
                Role::Client,
                Capabilities::NONE,
                "c1",
                false,
                OpeningTags::CLIENT,
                out,
            )
            .expect("start")
        };
        let mut opening = start(&mut out);
        assert!(matches!(
            opening.handle_frame(&hello_from("F", 1)),
            Ok(Progress::Opened(Opened { map: None, .. }))
        ));
        let mut opening = start(&mut out);
        let refusal = error_reply(Opcode::Hello, 1, Status::UnknownClient);
        assert_eq!(
            opening.handle_frame(&refusal),
            Err(OpeningError::Refused(Status::UnknownClient))
        );
        let mut opening = start(&mut out);
        assert!(matches!(
            opening.handle_frame(&map_frame(2)),
            Err(OpeningError::Unexpected { tag: 2, .. })
        ));
        assert!(matches!(
            start(&mut out).handle_frame(&[0u8; 3]),
            Err(OpeningError::Malformed(_))
        ));
    }
}
