//! The opening of a connection from the side that connects, sans-IO: HELLO
//! and, when asked for, MAP_REQUEST; then the peer's HELLO (or its refusal)
//! and MAP. With credentials, the peer's AUTH_CHALLENGE is answered with a
//! proof and the peer's own proof is checked (see [`crate::auth`]) before
//! MAP_REQUEST goes out. The caller moves the bytes and decides what a MAP
//! must match.

use crate::auth::{Key, NONCE_LEN, Proof, Side, Transcript};
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

/// What proves the connecting principal: its key and a fresh random nonce.
#[derive(Debug, Clone)]
pub struct Credentials {
    /// The principal's key.
    pub key: Key,
    /// 32 fresh random bytes, used once.
    pub nonce: [u8; NONCE_LEN],
}

/// An opening in progress.
#[derive(Debug, Clone)]
pub struct Opening {
    tags: OpeningTags,
    with_map: bool,
    role: Role,
    name: String,
    credentials: Option<Credentials>,
    state: State,
    /// What the peer's HELLO said it can do (none until it came).
    peer_capabilities: Capabilities,
}

#[derive(Debug, Clone)]
enum State {
    /// HELLO sent.
    Hello,
    /// The peer's HELLO came; its challenge is due (with credentials).
    Challenge { peer: String, role: Role },
    /// Our proof went out; the peer's proof is due.
    PeerProof {
        peer: String,
        role: Role,
        challenge: [u8; NONCE_LEN],
    },
    /// MAP is due.
    Map { peer: String, role: Role },
    /// Over.
    Done,
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
    /// Both sides proved they hold the principal's key.
    pub authenticated: bool,
    /// What the peer's HELLO said it can do.
    pub capabilities: Capabilities,
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
    /// The peer answered with a refusal.
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
    /// The peer does not ask for a proof although this side has
    /// credentials: it does not authenticate, so it is not trusted.
    #[error("the peer did not ask for authentication; refusing an unauthenticated peer")]
    NoChallenge,
    /// The peer asks for a proof but this side has no key: the peer
    /// authenticates and this side was started without its key.
    #[error("the peer requires authentication (it sent AUTH_CHALLENGE) and this side has no key")]
    ChallengeWithoutKey,
    /// The peer's proof is wrong: it does not hold the principal's key.
    #[error("the peer could not prove it holds this principal's key")]
    BadPeerProof,
}

impl Opening {
    /// Appends the opening's first frames to `out`: HELLO as `role` named
    /// `name`, then MAP_REQUEST if `with_map` (after authentication when
    /// `credentials` are given).
    pub fn start(
        role: Role,
        capabilities: Capabilities,
        name: &str,
        with_map: bool,
        tags: OpeningTags,
        credentials: Option<Credentials>,
        out: &mut Vec<u8>,
    ) -> Result<Opening, Error> {
        let hello = Message::Hello(hello::Repr {
            version: PROTOCOL_VERSION,
            role,
            capabilities,
            name,
        });
        hello.encode_into(tags.hello, out)?;
        if with_map && credentials.is_none() {
            Message::MapRequest.encode_into(tags.map, out)?;
        }
        Ok(Opening {
            tags,
            with_map,
            role,
            name: name.to_owned(),
            credentials,
            state: State::Hello,
            peer_capabilities: Capabilities::NONE,
        })
    }

    /// The peer's name and role once its HELLO arrived (until the opening ends).
    pub fn peer(&self) -> Option<(&str, Role)> {
        match &self.state {
            State::Challenge { peer, role }
            | State::PeerProof { peer, role, .. }
            | State::Map { peer, role } => Some((peer.as_str(), *role)),
            State::Hello | State::Done => None,
        }
    }

    fn transcript<'a>(&'a self, peer: &'a str, challenge: [u8; NONCE_LEN]) -> Transcript<'a> {
        Transcript {
            role: self.role,
            principal: &self.name,
            listener: peer,
            listener_nonce: challenge,
            connector_nonce: self
                .credentials
                .as_ref()
                .map_or([0; NONCE_LEN], |c| c.nonce),
        }
    }

    /// Where the opening goes once the peer is known (and proven): MAP, or done.
    fn after_peer(&mut self, peer: String, role: Role, authenticated: bool) -> Progress {
        if self.with_map {
            self.state = State::Map { peer, role };
            Progress::Waiting
        } else {
            self.state = State::Done;
            Progress::Opened(Opened {
                peer,
                role,
                map: None,
                authenticated,
                capabilities: self.peer_capabilities,
            })
        }
    }

    /// Takes one frame the peer sent; frames to send in answer are appended
    /// to `out`.
    pub fn handle_frame(
        &mut self,
        frame: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<Progress, OpeningError> {
        let (message, tag) = parse_frame(frame).map_err(OpeningError::Malformed)?;
        let state = std::mem::replace(&mut self.state, State::Done);
        match (message, state) {
            (Message::Hello(h), State::Hello) if tag == self.tags.hello => {
                let (peer, role) = (h.name.to_owned(), h.role);
                self.peer_capabilities = h.capabilities;
                if self.credentials.is_some() {
                    self.state = State::Challenge { peer, role };
                    Ok(Progress::Waiting)
                } else {
                    Ok(self.after_peer(peer, role, false))
                }
            }
            (Message::AuthChallenge(challenge), State::Challenge { peer, role })
                if tag == self.tags.hello =>
            {
                let Some(credentials) = &self.credentials else {
                    return Err(OpeningError::Unexpected {
                        opcode: Opcode::AuthChallenge,
                        tag,
                    });
                };
                let mac = credentials
                    .key
                    .prove(Side::Connector, &self.transcript(&peer, challenge));
                let proof = Proof {
                    nonce: credentials.nonce,
                    mac,
                };
                Message::AuthProof(proof)
                    .encode_into(self.tags.hello, out)
                    .map_err(OpeningError::Malformed)?;
                if self.with_map {
                    Message::MapRequest
                        .encode_into(self.tags.map, out)
                        .map_err(OpeningError::Malformed)?;
                }
                self.state = State::PeerProof {
                    peer,
                    role,
                    challenge,
                };
                Ok(Progress::Waiting)
            }
            (
                Message::AuthProof(proof),
                State::PeerProof {
                    peer,
                    role,
                    challenge,
                },
            ) if tag == self.tags.hello => {
                let transcript = self.transcript(&peer, challenge);
                let proven = self
                    .credentials
                    .as_ref()
                    .is_some_and(|c| c.key.verify(Side::Listener, &transcript, &proof.mac));
                if !proven {
                    return Err(OpeningError::BadPeerProof);
                }
                Ok(self.after_peer(peer, role, true))
            }
            (
                Message::Response(r),
                State::Hello | State::Challenge { .. } | State::PeerProof { .. },
            ) if tag == self.tags.hello => Err(OpeningError::Refused(r.status)),
            (Message::Map(_), State::Challenge { .. }) => Err(OpeningError::NoChallenge),
            (Message::AuthChallenge(_), _) if self.credentials.is_none() => {
                Err(OpeningError::ChallengeWithoutKey)
            }
            (Message::Map(map), State::Map { peer, role }) if tag == self.tags.map => {
                let authenticated = self.credentials.is_some();
                Ok(Progress::Opened(Opened {
                    peer,
                    role,
                    map: Some(map),
                    authenticated,
                    capabilities: self.peer_capabilities,
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

    /// A client `c1`'s opening without a key, asking for MAP if `with_map`.
    fn client_opening(with_map: bool, out: &mut Vec<u8>) -> Opening {
        Opening::start(
            Role::Client,
            Capabilities::NONE,
            "c1",
            with_map,
            OpeningTags::CLIENT,
            None,
            out,
        )
        .expect("start")
    }

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
    fn the_opening_says_what_the_peer_can_do() {
        let mut out = Vec::new();
        let mut opening = client_opening(false, &mut out);
        let hello = Message::Hello(hello::Repr {
            version: PROTOCOL_VERSION,
            role: Role::FabricDevice,
            capabilities: Capabilities::QP_EPOCH,
            name: "F",
        })
        .encode_to_vec(1)
        .expect("hello");
        let Ok(Progress::Opened(opened)) = opening.handle_frame(&hello, &mut Vec::new()) else {
            panic!("not opened");
        };
        assert!(opened.capabilities.contains(Capabilities::QP_EPOCH));
    }

    #[test]
    fn a_challenge_without_a_key_is_named() {
        let mut out = Vec::new();
        let mut opening = client_opening(true, &mut out);
        assert_eq!(
            opening.handle_frame(&hello_from("F", 1), &mut Vec::new()),
            Ok(Progress::Waiting)
        );
        let challenge = Message::AuthChallenge([5; NONCE_LEN])
            .encode_to_vec(1)
            .expect("challenge");
        assert_eq!(
            opening.handle_frame(&challenge, &mut Vec::new()),
            Err(OpeningError::ChallengeWithoutKey)
        );
    }

    #[test]
    fn hello_then_map() {
        let mut out = Vec::new();
        let mut opening = client_opening(true, &mut out);
        let (first, tag) = parse_frame(&out[..out.len() - 16]).expect("hello frame");
        assert!(matches!(first, Message::Hello(h) if h.name == "c1"));
        assert_eq!(tag, 1);
        assert_eq!(
            opening.handle_frame(&hello_from("F", 1), &mut Vec::new()),
            Ok(Progress::Waiting)
        );
        match opening.handle_frame(&map_frame(2), &mut Vec::new()) {
            Ok(Progress::Opened(o)) => {
                assert_eq!(o.peer, "F");
                assert!(!o.authenticated);
                assert_eq!(o.map.map(|m| m.digest), Some([7; 32]));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn hello_only_refusals_and_surprises() {
        let mut out = Vec::new();
        let start = |out: &mut Vec<u8>| client_opening(false, out);
        let mut opening = start(&mut out);
        assert!(matches!(
            opening.handle_frame(&hello_from("F", 1), &mut Vec::new()),
            Ok(Progress::Opened(Opened { map: None, .. }))
        ));
        let mut opening = start(&mut out);
        let refusal = error_reply(Opcode::Hello, 1, Status::UnknownClient);
        assert_eq!(
            opening.handle_frame(&refusal, &mut Vec::new()),
            Err(OpeningError::Refused(Status::UnknownClient))
        );
        let mut opening = start(&mut out);
        assert!(matches!(
            opening.handle_frame(&map_frame(2), &mut Vec::new()),
            Err(OpeningError::Unexpected { tag: 2, .. })
        ));
        assert!(matches!(
            start(&mut out).handle_frame(&[0u8; 3], &mut Vec::new()),
            Err(OpeningError::Malformed(_))
        ));
    }

    fn credentials(key: u8) -> Credentials {
        Credentials {
            key: Key::new([key; 32]),
            nonce: [9; NONCE_LEN],
        }
    }

    /// Plays the listener's side for a client `c1` holding key `[1; 32]`.
    fn listener_answers(opening: &mut Opening, listener_key: u8) -> Result<Progress, OpeningError> {
        let mut out = Vec::new();
        assert_eq!(
            opening.handle_frame(&hello_from("F", 1), &mut out),
            Ok(Progress::Waiting)
        );
        assert!(out.is_empty(), "nothing before the challenge");
        let challenge = Message::AuthChallenge([5; NONCE_LEN])
            .encode_to_vec(1)
            .expect("challenge");
        assert_eq!(
            opening.handle_frame(&challenge, &mut out),
            Ok(Progress::Waiting)
        );
        // The proof, then MAP_REQUEST.
        let (proof, tag) = parse_frame(&out[..frame_len(&out)]).expect("proof frame");
        assert_eq!(tag, 1);
        let Message::AuthProof(proof) = proof else {
            panic!("not a proof: {proof:?}");
        };
        let transcript = Transcript {
            role: Role::Client,
            principal: "c1",
            listener: "F",
            listener_nonce: [5; NONCE_LEN],
            connector_nonce: proof.nonce,
        };
        assert!(Key::new([1; 32]).verify(Side::Connector, &transcript, &proof.mac));
        let (map_request, tag) = parse_frame(&out[frame_len(&out)..]).expect("map request");
        assert_eq!((map_request, tag), (Message::MapRequest, 2));
        let answer = Proof {
            nonce: [0; NONCE_LEN],
            mac: Key::new([listener_key; 32]).prove(Side::Listener, &transcript),
        };
        let answer = Message::AuthProof(answer).encode_to_vec(1).expect("proof");
        match opening.handle_frame(&answer, &mut out)? {
            Progress::Waiting => opening.handle_frame(&map_frame(2), &mut out),
            done => Ok(done),
        }
    }

    fn frame_len(bytes: &[u8]) -> usize {
        crate::frame::HEADER_LEN
            + crate::frame::Header::parse(bytes).expect("header").body_len as usize
    }

    fn start_with(credentials: Credentials) -> Opening {
        let mut out = Vec::new();
        let opening = Opening::start(
            Role::Client,
            Capabilities::NONE,
            "c1",
            true,
            OpeningTags::CLIENT,
            Some(credentials),
            &mut out,
        )
        .expect("start");
        let (hello, _) = parse_frame(&out).expect("hello");
        assert!(matches!(hello, Message::Hello(_)));
        assert_eq!(
            out.len(),
            frame_len(&out),
            "MAP_REQUEST waits for the proofs"
        );
        opening
    }

    #[test]
    fn with_credentials_both_sides_prove_the_key_before_the_map() {
        let mut opening = start_with(credentials(1));
        match listener_answers(&mut opening, 1) {
            Ok(Progress::Opened(o)) => assert!(o.authenticated && o.map.is_some()),
            other => panic!("{other:?}"),
        }
        let mut opening = start_with(credentials(1));
        assert_eq!(
            listener_answers(&mut opening, 2),
            Err(OpeningError::BadPeerProof),
            "a listener without the key is not believed"
        );
        // A listener that skips the challenge is not trusted either.
        let mut opening = start_with(credentials(1));
        let mut out = Vec::new();
        opening
            .handle_frame(&hello_from("F", 1), &mut out)
            .expect("hello");
        assert_eq!(
            opening.handle_frame(&map_frame(2), &mut out),
            Err(OpeningError::NoChallenge)
        );
    }
}
