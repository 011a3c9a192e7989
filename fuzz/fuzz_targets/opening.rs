//! The opening handshake (HELLO, AUTH_CHALLENGE, AUTH_PROOF, MAP_REQUEST /
//! MAP) from both sides:
//!
//! - `Connector`: `proto::opening::Opening` (what clients, devices and
//!   `pmemctl` run) against a forged listener whose answers are arbitrary:
//!   well-formed messages with arbitrary fields and tags, the correct
//!   listener proof, or any bytes. It must never panic, only write frames
//!   that parse, never send MAP_REQUEST before its proof when it has
//!   credentials, and never report the listener authenticated unless the
//!   correct listener proof arrived.
//! - `Both`: that connector against pmem-server's gate (the real listener,
//!   `Executor::handle_frame` on a server with `--secrets`), each reading
//!   through a frame decoder, with a wire between them that drops, flips,
//!   truncates, injects or replaces frames. Neither side may panic; the
//!   server's session is proven only for a connector holding a key the
//!   server knows, and only as that principal; the connector reports
//!   success only when the server proved it too; an untouched wire opens
//!   every known principal and refuses the others.
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use pmem_fabric_fuzz::frames::{Piece, sent_frames};
use pmem_fabric_fuzz::handshake::{self, Tamper, Who};
use pmem_fabric_fuzz::scratch::{self, Setup};
use pmem_server::Session;
use proto::auth::{Key, NONCE_LEN, Proof, Side, Transcript};
use proto::hello::{self, Capabilities, Role};
use proto::map::{self, MapEntry};
use proto::opening::{Credentials, Opening, OpeningError, OpeningTags, Progress};
use proto::{AccessKey, Message, Opcode, PmemAddr, RegionIndex, Status, error_reply, parse_frame};

#[derive(Debug, Arbitrary)]
enum Input {
    Connector(Forged),
    Both {
        who: Who,
        with_map: bool,
        nonce: [u8; NONCE_LEN],
        wire: Vec<Tamper>,
    },
}

#[derive(Debug, Arbitrary)]
struct Forged {
    /// Role byte of the connector.
    role: u8,
    with_map: bool,
    /// The connector's key, if it has credentials.
    key: Option<[u8; 32]>,
    replies: Vec<Reply>,
}

/// The tag of a forged answer.
#[derive(Debug, Clone, Copy, Arbitrary)]
enum Tag {
    /// HELLO's (1).
    Hello,
    /// MAP_REQUEST's (2).
    Map,
    Other(u64),
}

impl Tag {
    fn value(self) -> u64 {
        match self {
            Tag::Hello => OpeningTags::CLIENT.hello,
            Tag::Map => OpeningTags::CLIENT.map,
            Tag::Other(tag) => tag,
        }
    }
}

#[derive(Debug, Arbitrary)]
enum Reply {
    Hello {
        tag: Tag,
        version: u16,
        role: u8,
        capabilities: u64,
        name: String,
    },
    Challenge {
        tag: Tag,
        nonce: [u8; NONCE_LEN],
    },
    /// The listener's proof that verifies for the conversation so far.
    CorrectProof {
        tag: Tag,
    },
    Proof {
        tag: Tag,
        nonce: [u8; NONCE_LEN],
        mac: [u8; 32],
    },
    Map {
        tag: Tag,
        digest: [u8; 32],
        extent_size: u64,
        entries: Vec<(u64, u64, u32, u16, u16, u64)>,
    },
    Refusal {
        tag: Tag,
        status: u16,
    },
    Other(Piece),
}

/// What the forged listener knows of the conversation.
struct Listener {
    /// The last challenge it sent.
    challenge: [u8; NONCE_LEN],
}

impl Reply {
    /// The frame; `None` when the forged message cannot be framed.
    fn frame(&self, opening: &Opening, me: &Me, listener: &mut Listener) -> Option<Vec<u8>> {
        let message = match self {
            Reply::Hello {
                tag,
                version,
                role,
                capabilities,
                name,
            } => (
                Message::Hello(hello::Repr {
                    version: *version,
                    role: Role::from(*role),
                    capabilities: Capabilities(*capabilities),
                    name,
                }),
                *tag,
            ),
            Reply::Challenge { tag, nonce } => {
                listener.challenge = *nonce;
                (Message::AuthChallenge(*nonce), *tag)
            }
            Reply::CorrectProof { tag } => {
                let (peer, _) = opening.peer()?;
                let key = me.key.as_ref()?;
                let transcript = Transcript {
                    role: me.role,
                    principal: ME,
                    listener: peer,
                    listener_nonce: listener.challenge,
                    connector_nonce: me.nonce,
                };
                let proof = Proof {
                    nonce: [0; NONCE_LEN],
                    mac: key.prove(Side::Listener, &transcript),
                };
                (Message::AuthProof(proof), *tag)
            }
            Reply::Proof { tag, nonce, mac } => (
                Message::AuthProof(Proof {
                    nonce: *nonce,
                    mac: *mac,
                }),
                *tag,
            ),
            Reply::Map {
                tag,
                digest,
                extent_size,
                entries,
            } => {
                let entries = entries
                    .iter()
                    .map(|&(start, len, region, server, socket, key)| MapEntry {
                        start: PmemAddr(start),
                        len,
                        region: RegionIndex(region),
                        server,
                        socket,
                        key: AccessKey(key),
                    })
                    .collect();
                (
                    Message::Map(map::Repr {
                        digest: *digest,
                        extent_size: *extent_size,
                        entries,
                    }),
                    *tag,
                )
            }
            Reply::Refusal { tag, status } => {
                return Some(
                    error_reply(Opcode::Hello, tag.value(), Status::from(*status)).to_vec(),
                );
            }
            Reply::Other(piece) => return Some(piece.to_bytes()),
        };
        message.0.encode_to_vec(message.1.value()).ok()
    }
}

/// The connector's name.
const ME: &str = "me";

/// The connector of a `Forged` input.
struct Me {
    role: Role,
    key: Option<Key>,
    nonce: [u8; NONCE_LEN],
}

fn connector_against_a_forged_listener(input: &Forged) {
    let me = Me {
        role: Role::from(input.role),
        key: input.key.map(Key::new),
        nonce: [3; NONCE_LEN],
    };
    let mut sent = Vec::new();
    let credentials = me.key.clone().map(|key| Credentials {
        key,
        nonce: me.nonce,
    });
    let Ok(mut opening) = Opening::start(
        me.role,
        Capabilities::NONE,
        ME,
        input.with_map,
        OpeningTags::CLIENT,
        credentials,
        &mut sent,
    ) else {
        return;
    };
    let mut listener = Listener {
        challenge: [0; NONCE_LEN],
    };
    // Whether the listener's correct proof was among the answers so far.
    let mut correct_proof_sent = false;
    for reply in &input.replies {
        let Some(frame) = reply.frame(&opening, &me, &mut listener) else {
            continue;
        };
        correct_proof_sent |= matches!(reply, Reply::CorrectProof { .. });
        let progress = opening.handle_frame(&frame, &mut sent);
        check_sent(&sent, me.key.is_some());
        match progress {
            Ok(Progress::Waiting) => {}
            Ok(Progress::Opened(opened)) => {
                assert_eq!(opened.authenticated, me.key.is_some());
                assert!(
                    me.key.is_none() || correct_proof_sent,
                    "authenticated without the listener's proof"
                );
                assert_eq!(opened.map.is_some(), input.with_map);
                return;
            }
            Err(_) => return,
        }
    }
}

/// What the connector wrote: frames that parse; with credentials no
/// MAP_REQUEST before its proof, without no proof at all.
fn check_sent(sent: &[u8], with_credentials: bool) {
    let mut proved = false;
    for frame in sent_frames(sent) {
        let (message, _) = parse_frame(frame).expect("sent_frames parsed it");
        match message {
            Message::AuthProof(_) => {
                assert!(with_credentials, "a proof without credentials");
                proved = true;
            }
            Message::MapRequest => {
                assert!(!with_credentials || proved, "MAP_REQUEST before the proof");
            }
            Message::Hello(_) => {}
            other => panic!("the connector sent {other:?}"),
        }
    }
}

fn both_sides(who: Who, with_map: bool, nonce: [u8; NONCE_LEN], wire: &[Tamper]) {
    let exec = scratch::scratch(Setup::Gated).exec();
    let untouched = wire.iter().all(|t| matches!(t, Tamper::Deliver));
    let outcome = handshake::play(exec, who, with_map, nonce, &mut wire.iter().cloned());
    if outcome.session.admits() {
        assert!(who.holds_a_known_key(), "{who:?} proven");
        let as_whom = matches!(
            (who, &outcome.session),
            (Who::Device, Session::ProvenDevice { .. })
                | (Who::Client, Session::ProvenClient { number: 0 })
                | (Who::Operator, Session::ProvenOperator)
        );
        assert!(as_whom, "{who:?} proven as {:?}", outcome.session);
    }
    if let Some(Ok(opened)) = &outcome.connector {
        assert!(opened.authenticated, "{opened:?}");
        assert!(
            outcome.session.admits(),
            "the connector opened, the server did not prove it: {:?}",
            outcome.session
        );
    }
    if untouched {
        match who {
            Who::Device | Who::Client | Who::Operator => {
                let opened = match outcome.connector {
                    Some(Ok(opened)) => opened,
                    other => panic!("{who:?} did not open: {other:?}"),
                };
                assert_eq!(opened.map.is_some(), with_map);
                assert!(outcome.session.admits());
            }
            Who::WrongKey | Who::Stranger => {
                let status = if who == Who::WrongKey {
                    Status::AccessDenied
                } else {
                    Status::UnknownClient
                };
                assert_eq!(
                    outcome.connector,
                    Some(Err(OpeningError::Refused(status))),
                    "{who:?}"
                );
                assert!(outcome.closed);
                assert!(!outcome.session.admits());
            }
        }
    }
}

fuzz_target!(|input: Input| {
    match input {
        Input::Connector(forged) => connector_against_a_forged_listener(&forged),
        Input::Both {
            who,
            with_map,
            nonce,
            wire,
        } => both_sides(who, with_map, nonce, &wire),
    }
});
