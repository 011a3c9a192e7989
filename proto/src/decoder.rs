//! Splitting a byte stream into frames, without I/O.
//!
//! ```
//! use proto::{FrameDecoder, Message, parse_frame, reply_to_malformed};
//!
//! # fn main() -> Result<(), proto::Error> {
//! let mut stream = Message::Ping(1).encode_to_vec(10)?;
//! stream.extend(Message::Pong(1).encode_to_vec(11)?);
//!
//! let mut decoder = FrameDecoder::new();
//! let mut replies = Vec::new();
//! // Per socket read: feed until the chunk is used up, draining frames in between.
//! let mut chunk = &stream[..];
//! while !chunk.is_empty() {
//!     let used = decoder.feed(chunk)?; // Err: close the connection
//!     chunk = &chunk[used..];
//!     while let Some(frame) = decoder.next_frame()? {
//!         match parse_frame(frame) {
//!             Ok((message, tag)) => replies.push((message.opcode(), tag)),
//!             Err(e) => {
//!                 if let Some(reply) = reply_to_malformed(frame, &e) {
//!                     // send `reply`, keep the connection
//! #                   let _ = reply;
//!                 }
//!             }
//!         }
//!     }
//! }
//! assert_eq!(replies, [(proto::Opcode::Ping, 10), (proto::Opcode::Pong, 11)]);
//! # Ok(())
//! # }
//! ```

use crate::error::{Error, Result};
use crate::frame::{self, HEADER_LEN, Header, MAX_BODY_LEN};

/// Capacity an idle decoder keeps after its buffer drains; more is released.
const RETAINED_CAPACITY: usize = 64 * 1024;

/// A sans-IO frame splitter for one connection.
///
/// Bytes go in through [`FrameDecoder::feed`]; complete frames (header and
/// body) come out of [`FrameDecoder::next_frame`], in order.
///
/// Each frame header is checked as soon as its 16 bytes are in, before any
/// of its body is taken: a wrong magic (`BadMagic`), a wrong version
/// (`BadVersion`) or a body claim above the limit (`Oversize`) fails the
/// decoder. The stream cannot be framed after that; the caller closes the
/// connection. Frames completed before the bad header are still handed out,
/// then `next_frame` returns the error; `feed` returns it at once and from
/// then on.
///
/// Memory is bounded: the decoder never holds more than one maximal frame,
/// `16 + max_body_len` bytes (at most [`frame::MAX_FRAME_LEN`]), and never
/// allocates on the strength of a claimed length. When it is full, `feed`
/// takes fewer bytes than offered and the caller drains frames first.
#[derive(Debug, Clone)]
pub struct FrameDecoder {
    /// Received bytes; `buf[start..]` is not handed out yet.
    buf: Vec<u8>,
    /// First byte not yet handed out by `next_frame`.
    start: usize,
    /// Start of the first incomplete frame; `buf[start..frontier]` are complete frames.
    frontier: usize,
    /// Checked header of the frame at `frontier`, once its 16 bytes are in.
    pending: Option<Header>,
    /// Largest body accepted.
    max_body_len: u32,
    /// The framing error, once one happened.
    failed: Option<Error>,
}

impl Default for FrameDecoder {
    fn default() -> Self {
        Self::new()
    }
}

impl FrameDecoder {
    /// A decoder accepting bodies up to [`MAX_BODY_LEN`].
    pub fn new() -> Self {
        Self::with_max_body_len(MAX_BODY_LEN)
    }

    /// A decoder accepting bodies up to `min(max_body_len, MAX_BODY_LEN)`,
    /// e.g. a small limit for control-only connections.
    pub fn with_max_body_len(max_body_len: u32) -> Self {
        FrameDecoder {
            buf: Vec::new(),
            start: 0,
            frontier: 0,
            pending: None,
            max_body_len: max_body_len.min(MAX_BODY_LEN),
            failed: None,
        }
    }

    /// The largest body this decoder accepts.
    pub fn max_body_len(&self) -> u32 {
        self.max_body_len
    }

    /// Most bytes the decoder holds at once: one maximal frame.
    pub fn capacity_limit(&self) -> usize {
        HEADER_LEN + self.max_body_len as usize
    }

    /// Bytes held and not yet handed out (complete frames and a partial one).
    pub fn buffered(&self) -> usize {
        self.buf.len() - self.start
    }

    /// The framing error, if the decoder has failed.
    pub fn error(&self) -> Option<&Error> {
        self.failed.as_ref()
    }

    /// Takes bytes from `data` and returns how many it took.
    ///
    /// Takes all of them unless the decoder is full (then drain with
    /// [`FrameDecoder::next_frame`] and feed the rest) or a frame header is
    /// bad: then it returns the framing error, as it does on every later call.
    #[must_use = "the decoder may take fewer bytes than offered"]
    pub fn feed(&mut self, mut data: &[u8]) -> Result<usize> {
        if let Some(error) = &self.failed {
            return Err(error.clone());
        }
        self.compact();
        let mut used = 0;
        loop {
            let have = self.buf.len() - self.frontier;
            let want = match self.pending {
                None => HEADER_LEN - have,
                Some(header) => header.frame_len() - have,
            };
            let room = self.capacity_limit() - self.buffered();
            let take = want.min(room).min(data.len());
            if take == 0 {
                return Ok(used);
            }
            self.append(&data[..take]);
            data = &data[take..];
            used += take;
            if take < want {
                continue;
            }
            // The piece we were waiting for is complete.
            let header = match self.pending {
                Some(header) => header,
                None => {
                    match Header::parse_with_limit(&self.buf[self.frontier..], self.max_body_len) {
                        Ok(header) => header,
                        Err(error) => {
                            self.failed = Some(error.clone());
                            return Err(error);
                        }
                    }
                }
            };
            if self.buf.len() - self.frontier == header.frame_len() {
                self.frontier += header.frame_len();
                self.pending = None;
            } else {
                self.pending = Some(header);
            }
        }
    }

    /// The next complete frame (header and body), or `None` until more bytes
    /// arrive; after a framing error, the frames completed before it and then
    /// the error.
    pub fn next_frame(&mut self) -> Result<Option<&[u8]>> {
        if self.start < self.frontier {
            let begin = self.start;
            // Headers before `frontier` were checked by `feed`.
            let len = frame::Packet::new_unchecked(&self.buf[begin..]).frame_len();
            self.start = begin + len;
            return Ok(Some(&self.buf[begin..begin + len]));
        }
        match &self.failed {
            Some(error) => Err(error.clone()),
            None => Ok(None),
        }
    }

    /// Drops handed-out bytes and releases spare capacity when little is held.
    fn compact(&mut self) {
        if self.start > 0 {
            self.buf.drain(..self.start);
            self.frontier -= self.start;
            self.start = 0;
        }
        if self.buf.len() <= RETAINED_CAPACITY && self.buf.capacity() > RETAINED_CAPACITY {
            self.buf.shrink_to(RETAINED_CAPACITY);
        }
    }

    /// Appends without letting the allocation exceed the capacity limit.
    fn append(&mut self, bytes: &[u8]) {
        let needed = self.buf.len() + bytes.len();
        if needed > self.buf.capacity() {
            let target = needed
                .max(self.buf.capacity().saturating_mul(2))
                .min(self.start + self.capacity_limit())
                .max(needed);
            self.buf.reserve_exact(target - self.buf.len());
        }
        self.buf.extend_from_slice(bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::{Message, parse_frame};
    use crate::request::{self, Target};
    use crate::response;
    use crate::status::Status;
    use crate::{PmemAddr, RegionIndex, RegionOffset};

    fn sample_stream() -> (Vec<u8>, Vec<Vec<u8>>) {
        let data: Vec<u8> = (0..=255).collect();
        let messages = [
            Message::Ping(7),
            Message::MapRequest,
            Message::Request(request::Repr::write(
                Target::Region(RegionOffset::new(RegionIndex(2), 64)),
                3,
                &data,
            )),
            Message::Response(response::Repr::ack(Status::Ok)),
            Message::Request(request::Repr::read(Target::Pmem(PmemAddr(9)), 1, 8)),
        ];
        let frames: Vec<Vec<u8>> = messages
            .iter()
            .enumerate()
            .map(|(tag, m)| m.encode_to_vec(tag as u64).unwrap())
            .collect();
        (frames.concat(), frames)
    }

    /// Feeds `chunks` in order, draining after every feed.
    fn decode(decoder: &mut FrameDecoder, chunks: &[&[u8]]) -> Result<Vec<Vec<u8>>> {
        let mut out = Vec::new();
        for chunk in chunks {
            let mut chunk = *chunk;
            loop {
                let used = decoder.feed(chunk)?;
                chunk = &chunk[used..];
                while let Some(frame) = decoder.next_frame()? {
                    out.push(frame.to_vec());
                }
                if chunk.is_empty() {
                    break;
                }
            }
        }
        Ok(out)
    }

    #[test]
    fn many_frames_in_one_chunk() {
        let (stream, frames) = sample_stream();
        let mut decoder = FrameDecoder::new();
        assert_eq!(decode(&mut decoder, &[&stream]).unwrap(), frames);
        assert_eq!(decoder.buffered(), 0);
    }

    #[test]
    fn split_at_every_byte_boundary() {
        let (stream, frames) = sample_stream();
        for at in 0..=stream.len() {
            let mut decoder = FrameDecoder::new();
            let (a, b) = stream.split_at(at);
            assert_eq!(
                decode(&mut decoder, &[a, b]).unwrap(),
                frames,
                "split at {at}"
            );
        }
    }

    #[test]
    fn one_byte_at_a_time() {
        let (stream, frames) = sample_stream();
        let chunks: Vec<&[u8]> = stream.chunks(1).collect();
        let mut decoder = FrameDecoder::new();
        assert_eq!(decode(&mut decoder, &chunks).unwrap(), frames);
        for frame in &frames {
            assert!(parse_frame(frame).is_ok());
        }
    }

    #[test]
    fn partial_frame_is_not_yielded() {
        let (stream, _) = sample_stream();
        let mut decoder = FrameDecoder::new();
        assert_eq!(decoder.feed(&stream[..23]), Ok(23));
        assert_eq!(decoder.next_frame(), Ok(None));
        assert_eq!(decoder.buffered(), 23);
        assert_eq!(decoder.feed(&stream[23..24]), Ok(1));
        assert_eq!(decoder.next_frame().unwrap().map(<[u8]>::len), Some(24));
        assert_eq!(decoder.next_frame(), Ok(None));
    }

    #[test]
    fn oversize_claim_is_rejected_before_buffering() {
        let mut header = [0u8; 16];
        Header {
            opcode: crate::Opcode::Write,
            body_len: MAX_BODY_LEN + 1,
            tag: 1,
        }
        .emit(&mut frame::Packet::new_unchecked(&mut header[..]));
        let mut stream = header.to_vec();
        stream.resize(1 << 20, 0xAB);
        let mut decoder = FrameDecoder::new();
        let error = Error::Oversize {
            claimed: u64::from(MAX_BODY_LEN) + 1,
            limit: MAX_BODY_LEN.into(),
        };
        assert_eq!(decoder.feed(&stream), Err(error.clone()));
        assert!(decoder.buffered() <= HEADER_LEN);
        assert!(decoder.buf.capacity() <= 2 * HEADER_LEN);
        assert_eq!(decoder.next_frame(), Err(error.clone()));
        assert_eq!(decoder.feed(b"more"), Err(error.clone()));
        assert_eq!(decoder.error(), Some(&error));
        assert!(error.breaks_framing());
    }

    #[test]
    fn lower_limit_applies() {
        let (_, frames) = sample_stream();
        let write = &frames[2]; // 16 + 56 + 256 bytes
        let mut decoder = FrameDecoder::with_max_body_len(100);
        assert_eq!(
            decoder.feed(write),
            Err(Error::Oversize {
                claimed: 56 + 256,
                limit: 100
            })
        );
        assert_eq!(
            FrameDecoder::with_max_body_len(u32::MAX).max_body_len(),
            MAX_BODY_LEN
        );
    }

    #[test]
    fn frames_before_a_bad_header_are_still_yielded() {
        let (stream, frames) = sample_stream();
        let mut bad = frames[0].clone();
        bad.extend_from_slice(b"GET / HTTP/1.1\r\n\r\n");
        let mut decoder = FrameDecoder::new();
        assert_eq!(decoder.feed(&bad), Err(Error::BadMagic { got: *b"GE" }));
        assert_eq!(decoder.next_frame(), Ok(Some(&frames[0][..])));
        assert_eq!(decoder.next_frame(), Err(Error::BadMagic { got: *b"GE" }));

        let mut wrong_version = stream.clone();
        wrong_version[2] = 9;
        let mut decoder = FrameDecoder::new();
        assert_eq!(
            decoder.feed(&wrong_version),
            Err(Error::BadVersion { got: 9 })
        );
        assert_eq!(decoder.next_frame(), Err(Error::BadVersion { got: 9 }));
    }

    #[test]
    fn memory_stays_bounded_when_not_drained() {
        let (_, frames) = sample_stream();
        let ping = &frames[0];
        let limit = 3 * ping.len();
        let mut decoder = FrameDecoder::with_max_body_len((limit - HEADER_LEN) as u32);
        let stream = ping.repeat(10);
        assert_eq!(decoder.feed(&stream), Ok(limit));
        assert_eq!(decoder.feed(&stream[limit..]), Ok(0));
        assert!(decoder.buf.capacity() <= limit);
        assert_eq!(decoder.next_frame(), Ok(Some(&ping[..])));
        assert_eq!(decoder.feed(&stream[limit..]), Ok(ping.len()));
    }

    #[test]
    fn big_frame_then_release() {
        let data = vec![7u8; 1 << 20];
        let frame = Message::Response(response::Repr::read_data(&data))
            .encode_to_vec(1)
            .unwrap();
        let mut decoder = FrameDecoder::new();
        let chunks: Vec<&[u8]> = frame.chunks(65536).collect();
        assert_eq!(decode(&mut decoder, &chunks).unwrap(), vec![frame.clone()]);
        assert!(decoder.buf.capacity() >= frame.len());
        assert_eq!(decoder.feed(&[]), Ok(0));
        assert!(decoder.buf.capacity() <= RETAINED_CAPACITY);
    }
}
