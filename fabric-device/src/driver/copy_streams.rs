//! One ordered stream per copy of a replicated region.
//!
//! A link to a server on verbs has two ways to its server: the RDMA queue
//! pair (the server's RNIC executes the request) and the TCP connection
//! (the server's CPU does). Each keeps its own order, but nothing orders
//! one against the other, and every copy must apply a region's requests in
//! the owner's order. So the owner's requests to a copy take the queue pair
//! when it can carry them, the TCP connection otherwise (atomics decided by
//! the server, the READ of their word, words with their exactly-once
//! record, other keys, the resync's requests), and a request that would
//! change from one to the other waits until the link has nothing in flight
//! on the first; every later request of the link waits behind it. On a link
//! without a queue pair everything takes the TCP connection at once, as
//! before.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use crate::forward::{FORWARD_HEAD_LEN, Offload};
use crate::ids::LinkId;
use crate::rdma::uplink::Posting;

/// What carries a link's requests; the driver's links and queue pairs, or
/// a stand-in in tests.
pub(super) trait Carriers {
    /// Whether the link has a queue pair (up or being set up).
    fn has_queue_pair(&self, link: LinkId) -> bool;
    /// Whether the link's queue pair has room for these work requests now.
    fn room(&self, link: LinkId, work: &Offload) -> Posting;
    /// Posts them on the queue pair if it can take them now.
    fn post(&mut self, link: LinkId, work: &Offload, payload: &[u8]) -> Posting;
    /// Requests on the queue pair not completed yet.
    fn posted_in_flight(&self, link: LinkId) -> usize;
    /// Whether the request tagged `tag` still waits for its answer.
    fn awaits_answer(&self, link: LinkId, tag: u64) -> bool;
    /// Writes it on the link's TCP connection.
    fn send_tcp(&mut self, link: LinkId, head: &[u8], payload: &[u8]) -> Result<(), String>;
}

/// A request for a copy, as the core wrote it.
#[derive(Debug, Clone)]
pub(super) struct CopyRequest {
    /// Frame and request header (or a whole frame, `payload` empty).
    pub head: CopyHead,
    /// The write data.
    pub payload: Arc<[u8]>,
    /// The work requests that carry it on the queue pair, as the core
    /// chose them; `None`: only the server's CPU may execute it.
    pub rdma: Option<Offload>,
}

/// The bytes of a request for a copy before its payload.
#[derive(Debug, Clone)]
pub(super) enum CopyHead {
    /// An application's request rewritten for the copy: kept in place,
    /// so that sending one allocates nothing.
    Request([u8; FORWARD_HEAD_LEN]),
    /// A whole frame the owner made (a resync's).
    Frame(Vec<u8>),
}

impl std::ops::Deref for CopyHead {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            CopyHead::Request(head) => head,
            CopyHead::Frame(frame) => frame,
        }
    }
}

/// Where a request went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Went {
    /// On the queue pair.
    Rdma,
    /// On the TCP connection.
    Tcp,
    /// It waits for the other way to drain (or for room on the queue pair).
    Waits,
}

#[derive(Debug, Default)]
struct Stream {
    /// Tags of requests sent on the TCP connection while the link has a
    /// queue pair, until answered.
    on_tcp: Vec<u64>,
    /// Requests waiting their turn, in order.
    waiting: VecDeque<CopyRequest>,
}

/// The ordered streams of every link.
#[derive(Debug, Default)]
pub(super) struct CopyStreams {
    links: HashMap<LinkId, Stream>,
}

impl CopyStreams {
    /// Sends `request` on `link` behind everything sent before it there;
    /// `Err` when the TCP connection failed (the link must close).
    pub(super) fn send(
        &mut self,
        link: LinkId,
        request: CopyRequest,
        io: &mut impl Carriers,
    ) -> Result<Went, String> {
        if !io.has_queue_pair(link) && !self.links.contains_key(&link) {
            // No server on verbs here: the TCP connection, as ever.
            io.send_tcp(link, &request.head, &request.payload)?;
            return Ok(Went::Tcp);
        }
        let stream = self.links.entry(link).or_default();
        if stream.waiting.is_empty() {
            let went = go(stream, link, &request, io)?;
            if went != Went::Waits {
                return Ok(went);
            }
        }
        stream.waiting.push_back(request);
        Ok(Went::Waits)
    }

    /// Sends what waits and may go now, in order; the links whose TCP
    /// connection failed, with why.
    pub(super) fn release(&mut self, io: &mut impl Carriers) -> Vec<(LinkId, String)> {
        let mut failed = Vec::new();
        for (&link, stream) in &mut self.links {
            while let Some(next) = stream.waiting.front() {
                let next = next.clone();
                match go(stream, link, &next, io) {
                    Ok(Went::Waits) => break,
                    Ok(_) => {
                        stream.waiting.pop_front();
                    }
                    Err(why) => {
                        failed.push((link, why));
                        break;
                    }
                }
            }
        }
        self.links.retain(|&link, s| {
            !s.waiting.is_empty() || !s.on_tcp.is_empty() || io.has_queue_pair(link)
        });
        failed
    }

    /// Forgets `link`'s stream (it went down: the core fails what it had).
    pub(super) fn forget(&mut self, link: LinkId) {
        self.links.remove(&link);
    }

    /// Requests waiting their turn, on every link.
    #[cfg(test)]
    fn waiting(&self) -> usize {
        self.links.values().map(|s| s.waiting.len()).sum()
    }
}

/// Sends `request` the way it must take, if the other way has nothing in
/// flight on `link`.
fn go(
    stream: &mut Stream,
    link: LinkId,
    request: &CopyRequest,
    io: &mut impl Carriers,
) -> Result<Went, String> {
    stream.on_tcp.retain(|&tag| io.awaits_answer(link, tag));
    let carry = match &request.rdma {
        None => Posting::NotCarried,
        // Nothing on the TCP connection to wait for: posted if it can be.
        Some(work) if stream.on_tcp.is_empty() => match io.post(link, work, &request.payload) {
            Posting::Posted => return Ok(Went::Rdma),
            other => other,
        },
        Some(work) => io.room(link, work),
    };
    match carry {
        Posting::Posted | Posting::Full => Ok(Went::Waits),
        Posting::NotCarried if io.posted_in_flight(link) > 0 => Ok(Went::Waits),
        Posting::NotCarried => {
            io.send_tcp(link, &request.head, &request.payload)?;
            if let Ok(header) = proto::frame::Header::parse(&request.head) {
                stream.on_tcp.push(header.tag);
            }
            Ok(Went::Tcp)
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    const LINK: LinkId = LinkId(3);

    /// A link with a queue pair that has room for `room` requests, and
    /// records what went where.
    #[derive(Default)]
    struct Fake {
        queue_pair: bool,
        room: usize,
        posted: Vec<u64>,
        completed: HashSet<u64>,
        on_tcp: Vec<u64>,
        answered: HashSet<u64>,
    }

    impl Carriers for Fake {
        fn has_queue_pair(&self, _: LinkId) -> bool {
            self.queue_pair
        }
        fn room(&self, _: LinkId, _: &Offload) -> Posting {
            if !self.queue_pair {
                Posting::NotCarried
            } else if self.posted_in_flight(LINK) >= self.room {
                Posting::Full
            } else {
                Posting::Posted
            }
        }
        fn post(&mut self, link: LinkId, work: &Offload, _: &[u8]) -> Posting {
            let posting = self.room(link, work);
            if posting == Posting::Posted {
                self.posted.push(work.tag);
            }
            posting
        }
        fn posted_in_flight(&self, _: LinkId) -> usize {
            self.posted
                .iter()
                .filter(|t| !self.completed.contains(t))
                .count()
        }
        fn awaits_answer(&self, _: LinkId, tag: u64) -> bool {
            !self.answered.contains(&tag)
        }
        fn send_tcp(&mut self, _: LinkId, head: &[u8], _: &[u8]) -> Result<(), String> {
            self.on_tcp.push(tag(head));
            Ok(())
        }
    }

    fn tag(head: &[u8]) -> u64 {
        proto::frame::Header::parse(head).expect("a frame").tag
    }

    /// A READ tagged `tag`, which RDMA may carry when its tag is even and
    /// it is not for the server's CPU (odd tags stand for what the core
    /// leaves to the server: an exactly-once word, another key).
    fn request(tag: u64, cpu: bool) -> CopyRequest {
        let req = proto::request::Repr::read(
            proto::request::Target::Region(proto::RegionOffset {
                region: proto::RegionIndex(0),
                offset: 0,
            }),
            proto::AccessKey(1),
            8,
        );
        CopyRequest {
            head: CopyHead::Frame(
                proto::Message::Request(req)
                    .encode_to_vec(tag)
                    .expect("encode"),
            ),
            payload: Arc::from(&[][..]),
            rdma: (!cpu && tag.is_multiple_of(2)).then_some(Offload {
                tag,
                first: crate::forward::Step::Read {
                    remote: proto::roce::rc::RemoteAddr { va: 0, rkey: 1 },
                    len: 8,
                },
                then: None,
            }),
        }
    }

    #[test]
    fn without_a_queue_pair_everything_takes_tcp_at_once() {
        let mut streams = CopyStreams::default();
        let mut io = Fake::default();
        for tag in 0..4 {
            let went = streams.send(LINK, request(tag, false), &mut io);
            assert_eq!(went, Ok(Went::Tcp));
        }
        assert_eq!(io.on_tcp, [0, 1, 2, 3]);
        assert_eq!(streams.waiting(), 0);
        assert!(
            streams.links.is_empty(),
            "nothing tracked for TCP-only links"
        );
    }

    #[test]
    fn a_request_for_the_cpu_waits_until_the_queue_pair_drained_and_so_do_later_ones() {
        let mut streams = CopyStreams::default();
        let mut io = Fake {
            queue_pair: true,
            room: 8,
            ..Fake::default()
        };
        assert_eq!(
            streams.send(LINK, request(2, false), &mut io),
            Ok(Went::Rdma)
        );
        assert_eq!(
            streams.send(LINK, request(4, false), &mut io),
            Ok(Went::Rdma)
        );
        // An atomic for the server's CPU: the writes before it are still on
        // the queue pair, so it waits, and the RDMA request behind it too.
        assert_eq!(
            streams.send(LINK, request(6, true), &mut io),
            Ok(Went::Waits)
        );
        assert_eq!(
            streams.send(LINK, request(8, false), &mut io),
            Ok(Went::Waits)
        );
        assert!(io.on_tcp.is_empty());
        assert!(streams.release(&mut io).is_empty());
        assert_eq!(streams.waiting(), 2, "the queue pair has not completed");
        io.completed.insert(2);
        streams.release(&mut io);
        assert!(io.on_tcp.is_empty(), "one write is still in flight");
        io.completed.insert(4);
        streams.release(&mut io);
        assert_eq!(io.on_tcp, [6], "the atomic, after both writes");
        assert_eq!(io.posted, [2, 4], "the later write waits for the atomic");
        io.answered.insert(6);
        streams.release(&mut io);
        assert_eq!(io.posted, [2, 4, 8]);
        assert_eq!(streams.waiting(), 0);
    }

    #[test]
    fn a_request_rdma_does_not_carry_goes_on_tcp_in_turn() {
        let mut streams = CopyStreams::default();
        let mut io = Fake {
            queue_pair: true,
            room: 8,
            ..Fake::default()
        };
        // Odd tags stand for what the queue pair does not carry (an
        // exactly-once word, another key).
        assert_eq!(
            streams.send(LINK, request(1, false), &mut io),
            Ok(Went::Tcp)
        );
        assert_eq!(
            streams.send(LINK, request(3, false), &mut io),
            Ok(Went::Tcp)
        );
        assert_eq!(
            streams.send(LINK, request(4, false), &mut io),
            Ok(Went::Waits)
        );
        io.answered.insert(1);
        streams.release(&mut io);
        assert!(io.posted.is_empty(), "3 is not answered yet");
        io.answered.insert(3);
        streams.release(&mut io);
        assert_eq!(io.posted, [4]);
    }

    #[test]
    fn a_full_send_queue_makes_the_request_wait_not_switch_to_tcp() {
        let mut streams = CopyStreams::default();
        let mut io = Fake {
            queue_pair: true,
            room: 1,
            ..Fake::default()
        };
        assert_eq!(
            streams.send(LINK, request(2, false), &mut io),
            Ok(Went::Rdma)
        );
        assert_eq!(
            streams.send(LINK, request(4, false), &mut io),
            Ok(Went::Waits)
        );
        assert!(io.on_tcp.is_empty());
        io.completed.insert(2);
        streams.release(&mut io);
        assert_eq!(io.posted, [2, 4]);
    }

    #[test]
    fn a_link_that_went_down_forgets_what_waited() {
        let mut streams = CopyStreams::default();
        let mut io = Fake {
            queue_pair: true,
            room: 8,
            ..Fake::default()
        };
        streams.send(LINK, request(2, false), &mut io).unwrap();
        streams.send(LINK, request(5, false), &mut io).unwrap();
        assert_eq!(streams.waiting(), 1);
        streams.forget(LINK);
        assert_eq!(streams.waiting(), 0);
        io.completed.insert(2);
        streams.release(&mut io);
        assert!(
            io.on_tcp.is_empty(),
            "nothing of the old connection is sent"
        );
    }
}
