//! Splitting a byte stream into frames, without I/O of its own.
//!
//! Bytes reach a [`FrameDecoder`] in one of two ways, and complete frames
//! come out of [`FrameDecoder::next_frame`] either way:
//!
//! - [`FrameDecoder::read_from`] reads straight from an [`std::io::Read`]
//!   (a non-blocking socket) into the decoder's own buffer: one `read` per
//!   call and no intermediate copy. This is the way for daemons.
//! - [`FrameDecoder::feed`] copies bytes the caller already holds.
//!
//! # From a non-blocking socket
//!
//! Call `read_from` until the socket would block, handing out the frames
//! that arrived after every call (also after the end of the stream or a bad
//! header: the frames completed before it are still handed out).
//!
//! ```
//! use std::io::{self, Read};
//!
//! use proto::decoder::{FrameDecoder, ReadError, ReadOutcome};
//! use proto::{Message, Opcode, parse_frame};
//!
//! /// What to do with a connection after it was readable.
//! #[derive(Debug, PartialEq)]
//! enum Next {
//!     /// Wait until the socket is readable again.
//!     Wait,
//!     /// Close the connection.
//!     Close,
//! }
//!
//! fn on_readable(
//!     decoder: &mut FrameDecoder,
//!     sock: &mut impl Read,
//!     received: &mut Vec<(Opcode, u64)>,
//! ) -> Next {
//!     loop {
//!         let outcome = decoder.read_from(sock, 256 * 1024);
//!         // Hand out the frames that are complete; after a bad header these
//!         // are the frames before it, then `next_frame` returns the error.
//!         while let Ok(Some(frame)) = decoder.next_frame() {
//!             match parse_frame(frame) {
//!                 Ok((message, tag)) => received.push((message.opcode(), tag)),
//!                 Err(_) => { /* answer with reply_to_malformed, keep going */ }
//!             }
//!         }
//!         match outcome {
//!             // Full: the frames were just drained, so there is room again.
//!             Ok(ReadOutcome::Data(_) | ReadOutcome::Full) => continue,
//!             Ok(ReadOutcome::Eof) => return Next::Close,
//!             Err(ReadError::Io(e)) if e.kind() == io::ErrorKind::WouldBlock => return Next::Wait,
//!             Err(ReadError::Io(_) | ReadError::Framing(_)) => return Next::Close,
//!         }
//!     }
//! }
//!
//! # fn main() -> Result<(), proto::Error> {
//! let mut stream = Message::Ping(1).encode_to_vec(10)?;
//! stream.extend(Message::Pong(1).encode_to_vec(11)?);
//! // A byte slice stands in for the socket here; it ends the stream when used up.
//! let mut sock = &stream[..];
//! let mut decoder = FrameDecoder::new();
//! let mut received = Vec::new();
//! assert_eq!(on_readable(&mut decoder, &mut sock, &mut received), Next::Close);
//! assert_eq!(received, [(Opcode::Ping, 10), (Opcode::Pong, 11)]);
//! # Ok(())
//! # }
//! ```
//!
//! # From bytes in hand
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
//! // Feed until the chunk is used up, draining frames in between.
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
//!
//! # Memory
//!
//! The buffer (its allocation included) never exceeds
//! [`FrameDecoder::capacity_limit`]: the decoder moves the bytes it has not
//! handed out to the front before it would grow, so no handed-out prefix is
//! ever carried past the limit. It grows only as bytes actually arrive
//! (doubling, up to the limit), never because a header claims a long body.
//!
//! `read_from` reads into the buffer's spare, already initialised bytes; it
//! zero-fills only the part a growth adds, so steady-state reads do not
//! memset. A read asks for at most `max` bytes, at most the room left and at
//! most what the buffer has spare: the buffer starts at
//! `min(max, RETAINED_CAPACITY)` (64 KiB) and grows only when more than half
//! of it holds bytes not handed out (a large frame arriving, or frames not
//! drained yet), so reading small frames keeps it at 64 KiB whatever `max`
//! is. Bytes not handed out are moved to the front only when the spare room
//! behind them is shorter than the read wants; when frames are drained
//! before each read, that is just the partial frame at the end.
//!
//! A decoder that grew gives the memory above 64 KiB back when it is idle:
//! at a `feed` while at most 64 KiB is held (as `feed` always did), or when
//! `read_from` finds the reader empty (`WouldBlock`) after the last 8 frames
//! were all at most 32 KiB long and at most 32 KiB was held since it last
//! found the reader empty. That is hysteresis on purpose: a 64 KiB buffer
//! grows only when more than 32 KiB is held, and a connection whose frames
//! (or backlog) need the larger buffer keeps it rather than releasing it and
//! zero-filling it again for every frame.

use std::io::{self, Read};

use crate::error::{Error, Result};
use crate::frame::{self, HEADER_LEN, Header, MAX_BODY_LEN};

/// Capacity an idle decoder keeps after its buffer drains; more is released.
/// Also the most `read_from` reads small frames into.
const RETAINED_CAPACITY: usize = 64 * 1024;
/// Frames in a row of at most half [`RETAINED_CAPACITY`] after which
/// `read_from` releases memory when it finds the reader empty.
const SMALL_FRAMES_BEFORE_RELEASE: u32 = 8;

/// What one [`FrameDecoder::read_from`] call did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadOutcome {
    /// This many bytes were read (> 0).
    Data(usize),
    /// The reader reported end of stream (read returned 0 while the decoder had room).
    Eof,
    /// The decoder is full (one maximal frame's worth is buffered and not
    /// handed out): drain frames with [`FrameDecoder::next_frame`] first. No
    /// read was attempted.
    Full,
}

/// Why [`FrameDecoder::read_from`] failed.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The reader failed (including [`io::ErrorKind::WouldBlock`] for a
    /// non-blocking socket with nothing to read — callers match on it).
    #[error("read failed")]
    Io(#[source] io::Error),
    /// A frame header that arrived is bad; the stream cannot be framed any
    /// more (same error [`FrameDecoder::feed`] would return; later calls
    /// return it too).
    #[error("cannot frame the stream")]
    Framing(#[source] Error),
}

/// A frame splitter for one connection.
///
/// Bytes go in through [`FrameDecoder::read_from`] (straight from a reader)
/// or [`FrameDecoder::feed`] (from a slice); complete frames (header and
/// body) come out of [`FrameDecoder::next_frame`], in order.
///
/// Each frame header is checked as soon as its 16 bytes are in, before any
/// of its body is taken (by `feed`) or read (by a later `read_from`): a wrong
/// magic (`BadMagic`), a wrong version (`BadVersion`) or a body claim above
/// the limit (`Oversize`) fails the decoder. The stream cannot be framed
/// after that; the caller closes the connection. Frames completed before the
/// bad header are still handed out, then `next_frame` returns the error;
/// `feed` and `read_from` return it at once and from then on. Bytes that
/// arrived behind the bad header are dropped.
///
/// Memory is bounded: the decoder never holds more than one maximal frame,
/// `16 + max_body_len` bytes (at most [`frame::MAX_FRAME_LEN`]), its buffer
/// never exceeds that either, and it never allocates on the strength of a
/// claimed length (see the [module docs](self#memory)). When it is full,
/// `feed` takes fewer bytes than offered, `read_from` returns
/// [`ReadOutcome::Full`], and the caller drains frames first.
#[derive(Debug, Clone)]
pub struct FrameDecoder {
    /// The buffer. `buf[start..end]` holds bytes not handed out yet;
    /// `buf[end..]` is initialised spare room that `read_from` reads into.
    /// Neither its length nor its allocation exceeds `capacity_limit()`.
    buf: Vec<u8>,
    /// First byte not yet handed out by `next_frame`.
    start: usize,
    /// Start of the first incomplete frame; `buf[start..frontier]` are complete frames.
    frontier: usize,
    /// End of the received bytes; `buf[frontier..end]` is the incomplete frame.
    end: usize,
    /// Checked header of the frame at `frontier`, once its 16 bytes are in.
    pending: Option<Header>,
    /// Largest body accepted.
    max_body_len: u32,
    /// The framing error, once one happened.
    failed: Option<Error>,
    /// Most bytes held since `read_from` last found the reader empty.
    peak: usize,
    /// Frames completed in a row that were at most half [`RETAINED_CAPACITY`] long.
    small_frames: u32,
    /// Length of the area [`FrameDecoder::read_area`] last returned, until
    /// its read is committed.
    reserved: usize,
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
            end: 0,
            pending: None,
            max_body_len: max_body_len.min(MAX_BODY_LEN),
            failed: None,
            peak: 0,
            small_frames: 0,
            reserved: 0,
        }
    }

    /// The largest body this decoder accepts.
    pub fn max_body_len(&self) -> u32 {
        self.max_body_len
    }

    /// Most bytes the decoder holds at once: one maximal frame. Its buffer
    /// never exceeds this either.
    pub fn capacity_limit(&self) -> usize {
        HEADER_LEN + self.max_body_len as usize
    }

    /// Bytes held and not yet handed out (complete frames and a partial one).
    pub fn buffered(&self) -> usize {
        self.end - self.start
    }

    /// Bytes of a frame not complete yet (0 when everything held is whole
    /// frames): a caller can tell a peer that is mid-way through sending a
    /// frame from one that has finished a batch.
    pub fn partial(&self) -> usize {
        self.end - self.frontier
    }

    /// The whole length (header included) of the frame being received,
    /// once its header is in and checked; `None` between frames. A caller
    /// can admit a large frame against a memory budget before reading its
    /// body.
    pub fn frame_in_progress(&self) -> Option<usize> {
        self.pending.map(|header| header.frame_len())
    }

    /// Accepts bodies up to `max_body_len` (at most [`MAX_BODY_LEN`]) from
    /// the next header on, e.g. once a connection's peer is known; never
    /// lowers the limit.
    pub fn raise_max_body_len(&mut self, max_body_len: u32) {
        self.max_body_len = self.max_body_len.max(max_body_len.min(MAX_BODY_LEN));
    }

    /// Whether [`FrameDecoder::read_from`] has room to read (false = drain
    /// frames first). Says nothing about a framing error; see
    /// [`FrameDecoder::error`].
    pub fn has_room(&self) -> bool {
        self.buffered() < self.capacity_limit()
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
        if self.buffered() <= RETAINED_CAPACITY {
            self.release();
        }
        let mut used = 0;
        loop {
            // Take no more than the piece being waited for (the rest of a
            // header or of a frame), so a header is checked before anything
            // behind it is taken.
            let want = self.piece_missing();
            let room = self.capacity_limit() - self.buffered();
            let take = want.min(room).min(data.len());
            if take == 0 {
                return Ok(used);
            }
            self.append(&data[..take]);
            data = &data[take..];
            used += take;
            self.check_arrived()?;
        }
    }

    /// Reads once from `reader` straight into the decoder's buffer (at most
    /// `max` bytes and at most the free room), then checks the headers that
    /// arrived.
    ///
    /// One `read` call, repeated only if it is `Interrupted`; the caller
    /// loops until the reader returns `WouldBlock` (see the
    /// [module docs](self)). A `max` of 0 is taken as 1 (a read into an empty
    /// buffer cannot tell the end of the stream). A read may ask for fewer
    /// than `max` bytes; see the [module docs](self#memory).
    ///
    /// Returns [`ReadOutcome::Full`] without reading when the decoder holds
    /// a maximal frame's worth. After a framing error, returns
    /// [`ReadError::Framing`] without reading; the frames completed before the
    /// bad header are still handed out by `next_frame`. A reader claiming to
    /// have read more than it was given is an [`io::ErrorKind::InvalidData`]
    /// error.
    pub fn read_from<R: Read + ?Sized>(
        &mut self,
        reader: &mut R,
        max: usize,
    ) -> std::result::Result<ReadOutcome, ReadError> {
        let area = match self.read_area(max) {
            Ok(Some(area)) => area,
            Ok(None) => return Ok(ReadOutcome::Full),
            Err(error) => return Err(ReadError::Framing(error)),
        };
        let read = loop {
            match reader.read(area) {
                Ok(read) => break read,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    self.reserved = 0;
                    if e.kind() == io::ErrorKind::WouldBlock {
                        self.found_reader_empty();
                    }
                    return Err(ReadError::Io(e));
                }
            }
        };
        if read == 0 {
            self.reserved = 0;
            return Ok(ReadOutcome::Eof);
        }
        self.commit_read(read)?;
        Ok(ReadOutcome::Data(read))
    }

    /// Makes room for a read of at most `max` bytes (at least 1, at most
    /// the free room, as for [`read_from`](Self::read_from)) and returns
    /// it, for a read that completes later (an io_uring receive into the
    /// decoder's own buffer). `Ok(None)` when the decoder is full; the
    /// framing error after one.
    ///
    /// Hand what the read wrote to [`commit_read`](Self::commit_read).
    /// Until then the area must stay where it is: call nothing that takes
    /// bytes in (`feed`, `read_from`, `read_area`) and do not drop the
    /// decoder (see [`into_buffer`](Self::into_buffer)); handing frames
    /// out with `next_frame` is fine.
    pub fn read_area(&mut self, max: usize) -> Result<Option<&mut [u8]>> {
        if let Some(error) = &self.failed {
            return Err(error.clone());
        }
        let room = self.capacity_limit() - self.buffered();
        if room == 0 {
            return Ok(None);
        }
        let len = self.prepare_read(max.clamp(1, room));
        self.reserved = len;
        Ok(Some(&mut self.buf[self.end..self.end + len]))
    }

    /// Takes the `read` bytes a read wrote at the start of the area
    /// [`read_area`](Self::read_area) returned, then checks the headers
    /// that arrived. More bytes than the area held is an
    /// [`io::ErrorKind::InvalidData`] error and takes none.
    pub fn commit_read(&mut self, read: usize) -> std::result::Result<(), ReadError> {
        let reserved = std::mem::take(&mut self.reserved);
        if read > reserved {
            return Err(ReadError::Io(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("reader claims {read} bytes read into a buffer of {reserved}"),
            )));
        }
        self.end += read;
        self.peak = self.peak.max(self.buffered());
        self.check_arrived().map_err(ReadError::Framing)
    }

    /// The decoder's buffer, for a caller that drops the decoder while a
    /// read into its [`read_area`](Self::read_area) may still complete:
    /// it keeps the buffer until then.
    pub fn into_buffer(self) -> Vec<u8> {
        self.buf
    }

    /// The next complete frame (header and body), or `None` until more bytes
    /// arrive; after a framing error, the frames completed before it and then
    /// the error.
    pub fn next_frame(&mut self) -> Result<Option<&[u8]>> {
        if self.start < self.frontier {
            let begin = self.start;
            // Headers before `frontier` were checked by `check_arrived`.
            let len = frame::Packet::new_unchecked(&self.buf[begin..]).frame_len();
            self.start = begin + len;
            return Ok(Some(&self.buf[begin..begin + len]));
        }
        match &self.failed {
            Some(error) => Err(error.clone()),
            None => Ok(None),
        }
    }

    /// Bytes still missing from the piece being waited for: the header of the
    /// frame at `frontier`, or the rest of that frame once its header is in.
    /// Never 0, since `check_arrived` completes every piece that is whole.
    fn piece_missing(&self) -> usize {
        let have = self.end - self.frontier;
        match self.pending {
            None => HEADER_LEN - have,
            Some(header) => header.frame_len() - have,
        }
    }

    /// Checks every header that is complete in `buf[frontier..end]` and moves
    /// `frontier` past every frame that is complete; shared by `feed` and
    /// `read_from`. On a bad header the decoder fails, and the bytes behind
    /// the header, which cannot be framed, are dropped.
    fn check_arrived(&mut self) -> Result<()> {
        loop {
            let have = self.end - self.frontier;
            let header = match self.pending {
                Some(header) => header,
                None if have < HEADER_LEN => return Ok(()),
                None => match Header::parse_with_limit(
                    &self.buf[self.frontier..self.end],
                    self.max_body_len,
                ) {
                    Ok(header) => header,
                    Err(error) => {
                        self.end = self.frontier + HEADER_LEN;
                        self.failed = Some(error.clone());
                        return Err(error);
                    }
                },
            };
            if have < header.frame_len() {
                self.pending = Some(header);
                return Ok(());
            }
            self.frontier += header.frame_len();
            self.pending = None;
            if header.frame_len() <= RETAINED_CAPACITY / 2 {
                self.small_frames = self.small_frames.saturating_add(1);
            } else {
                self.small_frames = 0;
            }
        }
    }

    /// Moves the bytes not handed out to the front of the buffer.
    fn move_to_front(&mut self) {
        if self.start > 0 {
            self.buf.copy_within(self.start..self.end, 0);
            self.frontier -= self.start;
            self.end -= self.start;
            self.start = 0;
        }
    }

    /// Releases capacity above [`RETAINED_CAPACITY`]; the caller checked
    /// that at most that much is held.
    fn release(&mut self) {
        if self.buf.capacity() > RETAINED_CAPACITY {
            self.move_to_front();
            self.buf.truncate(RETAINED_CAPACITY);
            self.buf.shrink_to(RETAINED_CAPACITY);
        }
    }

    /// Tells the decoder the reader is known to be empty without a read
    /// that would block: a caller that saw [`read_from`](Self::read_from)
    /// return fewer bytes than it asked for (a TCP socket's receive queue
    /// was drained) calls this instead of reading once more for
    /// `WouldBlock`. Memory is released as after a `WouldBlock`.
    pub fn reader_drained(&mut self) {
        self.found_reader_empty();
    }

    /// `read_from` found the reader empty: releases memory if recent frames
    /// and what was held since the last time were small.
    fn found_reader_empty(&mut self) {
        if self.small_frames >= SMALL_FRAMES_BEFORE_RELEASE
            && self.peak.max(self.buffered()) <= RETAINED_CAPACITY / 2
        {
            self.release();
        }
        self.peak = self.buffered();
    }

    /// Appends (for `feed`) without letting the allocation exceed the
    /// capacity limit, and without zero-filling first: bytes that do not fit
    /// the initialised part are pushed. The caller checked that
    /// `buffered() + bytes.len() <= capacity_limit()`.
    fn append(&mut self, bytes: &[u8]) {
        if self.buf.capacity() - self.end < bytes.len() {
            self.move_to_front();
            let needed = self.end + bytes.len();
            if needed > self.buf.capacity() {
                let target = needed
                    .max(self.buf.capacity().saturating_mul(2))
                    .min(self.capacity_limit())
                    .max(needed);
                self.buf.reserve_exact(target - self.buf.len());
            }
        }
        let end = self.end + bytes.len();
        let initialised = self.buf.len().min(end);
        let (inside, outside) = bytes.split_at(initialised - self.end);
        self.buf[self.end..initialised].copy_from_slice(inside);
        self.buf.extend_from_slice(outside);
        self.end = end;
    }

    /// Makes room behind `end` for a read of up to `want` bytes (`1 <= want <=
    /// capacity_limit() - buffered()`) and returns how many to read: at least
    /// 1, at most `want`.
    ///
    /// Moves the bytes not handed out to the front only when the spare room
    /// behind them is shorter than `want`. Then grows the buffer, doubling and
    /// zero-filling the new part, only while it is smaller than
    /// `min(want, RETAINED_CAPACITY)` or more than half of it is held bytes;
    /// otherwise the read takes what is spare.
    fn prepare_read(&mut self, want: usize) -> usize {
        if self.start == self.end {
            // Nothing held: start over at the front, nothing to move.
            self.start = 0;
            self.frontier = 0;
            self.end = 0;
        }
        if self.buf.len() - self.end < want {
            self.move_to_front();
            let spare = self.buf.len() - self.end;
            let base = want.min(RETAINED_CAPACITY);
            if spare < want && (self.buf.len() < base || 2 * spare < self.buf.len()) {
                // `end + want <= capacity_limit()` here, so the buffer is
                // below the limit and the target above its length.
                let target = self
                    .buf
                    .len()
                    .saturating_mul(2)
                    .max(base)
                    .min(self.capacity_limit());
                self.buf.reserve_exact(target - self.buf.len());
                self.buf.resize(target, 0);
            }
        }
        (self.buf.len() - self.end).min(want)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::{Message, parse_frame};
    use crate::request::{self, Target};
    use crate::response;
    use crate::status::Status;
    use crate::{AccessKey, PmemAddr, RegionIndex, RegionOffset};

    fn sample_stream() -> (Vec<u8>, Vec<Vec<u8>>) {
        let data: Vec<u8> = (0..=255).collect();
        let messages = [
            Message::Ping(7),
            Message::MapRequest,
            Message::Request(request::Repr::write(
                Target::Region(RegionOffset::new(RegionIndex(2), 64)),
                AccessKey(3),
                &data,
            )),
            Message::Response(response::Repr::ack(Status::Ok)),
            Message::Request(request::Repr::read(
                Target::Pmem(PmemAddr(9)),
                AccessKey(1),
                8,
            )),
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

    /// A reader handing out `data` in pieces of `sizes` bytes (cycling),
    /// optionally returning `WouldBlock` before every piece; then end of stream.
    struct Pieces<'a> {
        data: &'a [u8],
        sizes: Vec<usize>,
        next: usize,
        would_block: bool,
        blocked: bool,
        /// `read` calls made.
        reads: usize,
        /// Bytes handed out.
        given: usize,
    }

    impl<'a> Pieces<'a> {
        fn new(data: &'a [u8], sizes: &[usize], would_block: bool) -> Self {
            Pieces {
                data,
                sizes: sizes.to_vec(),
                next: 0,
                would_block,
                blocked: false,
                reads: 0,
                given: 0,
            }
        }
    }

    impl io::Read for Pieces<'_> {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            self.reads += 1;
            if self.would_block && !self.blocked && !self.data.is_empty() {
                self.blocked = true;
                return Err(io::ErrorKind::WouldBlock.into());
            }
            self.blocked = false;
            let n = self.sizes[self.next % self.sizes.len()]
                .min(buf.len())
                .min(self.data.len());
            self.next += 1;
            buf[..n].copy_from_slice(&self.data[..n]);
            self.data = &self.data[n..];
            self.given += n;
            Ok(n)
        }
    }

    /// Checks the memory bounds.
    fn assert_bounded(decoder: &FrameDecoder) {
        let limit = decoder.capacity_limit();
        assert!(decoder.buffered() <= limit);
        assert!(
            decoder.buf.len() <= limit,
            "{} > {limit}",
            decoder.buf.len()
        );
        assert!(decoder.buf.capacity() <= limit);
        assert!(decoder.start <= decoder.frontier && decoder.frontier <= decoder.end);
        assert!(decoder.end <= decoder.buf.len());
    }

    /// Reads `reader` to its end (retrying on `WouldBlock`), draining after
    /// every call; returns the frames and the framing error, if any.
    fn read_all(
        decoder: &mut FrameDecoder,
        reader: &mut impl io::Read,
        max: usize,
    ) -> (Vec<Vec<u8>>, Option<Error>) {
        let mut frames = Vec::new();
        loop {
            let outcome = decoder.read_from(reader, max);
            assert_bounded(decoder);
            let drained = loop {
                match decoder.next_frame() {
                    Ok(Some(frame)) => frames.push(frame.to_vec()),
                    Ok(None) => break None,
                    Err(e) => break Some(e),
                }
            };
            match outcome {
                Ok(ReadOutcome::Data(n)) => {
                    assert!(n > 0 && n <= max.max(1));
                    assert_eq!(drained, None);
                }
                Ok(ReadOutcome::Full) => panic!("full although drained"),
                Ok(ReadOutcome::Eof) => return (frames, drained),
                Err(ReadError::Io(e)) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(ReadError::Io(e)) => panic!("{e}"),
                Err(ReadError::Framing(e)) => {
                    assert_eq!(drained.as_ref(), Some(&e));
                    return (frames, Some(e));
                }
            }
        }
    }

    /// The sample frames a few times over, with a 256 KiB READ_RESPONSE in between.
    fn long_stream() -> (Vec<u8>, Vec<Vec<u8>>) {
        let (_, mut frames) = sample_stream();
        let data = vec![3u8; 256 * 1024];
        frames.push(
            Message::Response(response::Repr::read_data(&data))
                .encode_to_vec(99)
                .unwrap(),
        );
        let (_, more) = sample_stream();
        frames.extend(more.iter().cloned());
        frames.extend(more);
        (frames.concat(), frames)
    }

    #[test]
    fn read_from_odd_pieces() {
        let (stream, frames) = long_stream();
        let piece_sets: [&[usize]; 6] = [
            &[1],
            &[7],
            &[100],
            &[65536],
            &[1, 7, 100, 65536, 3],
            &[usize::MAX],
        ];
        for sizes in piece_sets {
            for would_block in [false, true] {
                for max in [7, 4096, 256 * 1024] {
                    let mut decoder = FrameDecoder::new();
                    let mut reader = Pieces::new(&stream, sizes, would_block);
                    let (got, error) = read_all(&mut decoder, &mut reader, max);
                    assert_eq!(error, None);
                    assert!(got == frames, "{sizes:?} {would_block} {max}");
                    assert_eq!(decoder.buffered(), 0);
                    assert_eq!(reader.given, stream.len());
                }
            }
        }
    }

    #[test]
    fn read_from_bad_header_mid_stream() {
        let (_, frames) = sample_stream();
        let mut stream = frames[..3].concat();
        stream.extend_from_slice(b"GET / HTTP/1.1\r\n\r\n");
        stream.extend(frames[3..].concat());
        let bad = Error::BadMagic { got: *b"GE" };
        for sizes in [&[1][..], &[7], &[100], &[65536]] {
            for would_block in [false, true] {
                let mut decoder = FrameDecoder::new();
                let mut reader = Pieces::new(&stream, sizes, would_block);
                let (got, error) = read_all(&mut decoder, &mut reader, 256 * 1024);
                assert_eq!(got, frames[..3]);
                assert_eq!(error.as_ref(), Some(&bad));
                // Bytes behind the bad header are dropped; nothing more is read.
                assert!(decoder.buffered() <= HEADER_LEN);
                let reads = reader.reads;
                assert!(matches!(
                    decoder.read_from(&mut reader, 256 * 1024),
                    Err(ReadError::Framing(e)) if e == bad
                ));
                assert_eq!(reader.reads, reads);
                assert_eq!(decoder.next_frame(), Err(bad.clone()));
                assert_eq!(decoder.feed(b"PF"), Err(bad.clone()));
                assert_eq!(decoder.error(), Some(&bad));
            }
        }
    }

    #[test]
    fn read_from_frames_before_bad_header_in_the_same_read() {
        let (_, frames) = sample_stream();
        let mut stream = frames.concat();
        let at = stream.len();
        stream.extend_from_slice(&frames[0]);
        stream[at + 2] = 9; // wrong version
        let mut decoder = FrameDecoder::new();
        let mut reader = &stream[..];
        assert!(matches!(
            decoder.read_from(&mut reader, 1 << 20),
            Err(ReadError::Framing(Error::BadVersion { got: 9 }))
        ));
        for frame in &frames {
            assert_eq!(decoder.next_frame(), Ok(Some(&frame[..])));
        }
        assert_eq!(decoder.next_frame(), Err(Error::BadVersion { got: 9 }));
    }

    fn header(body_len: u32) -> [u8; HEADER_LEN] {
        let mut header = [0u8; HEADER_LEN];
        Header {
            opcode: crate::Opcode::Write,
            body_len,
            tag: 1,
        }
        .emit(&mut frame::Packet::new_unchecked(&mut header[..]));
        header
    }

    #[test]
    fn read_from_rejects_oversize_claim_without_reading_the_body() {
        let mut stream = header(MAX_BODY_LEN + 1).to_vec();
        stream.resize(1 << 20, 0xAB);
        let oversize = Error::Oversize {
            claimed: u64::from(MAX_BODY_LEN) + 1,
            limit: MAX_BODY_LEN.into(),
        };
        // A reader handing out the header alone: exactly one read, of 16 bytes.
        let mut decoder = FrameDecoder::new();
        let mut reader = Pieces::new(&stream, &[HEADER_LEN], false);
        assert!(matches!(
            decoder.read_from(&mut reader, 256 * 1024),
            Err(ReadError::Framing(e)) if e == oversize
        ));
        assert_eq!((reader.reads, reader.given), (1, HEADER_LEN));
        for _ in 0..3 {
            assert!(matches!(
                decoder.read_from(&mut reader, 256 * 1024),
                Err(ReadError::Framing(_))
            ));
        }
        assert_eq!(reader.reads, 1);
        assert_eq!(decoder.buffered(), HEADER_LEN);
        assert!(decoder.buf.capacity() <= RETAINED_CAPACITY);
        assert_eq!(decoder.next_frame(), Err(oversize.clone()));

        // A reader handing out as much as asked: the first read is all there is.
        let mut decoder = FrameDecoder::new();
        let mut reader = Pieces::new(&stream, &[usize::MAX], false);
        let (frames, error) = read_all(&mut decoder, &mut reader, 256 * 1024);
        assert_eq!((frames.len(), error), (0, Some(oversize)));
        assert_eq!(reader.reads, 1);
        assert!(reader.given <= RETAINED_CAPACITY);
        assert_eq!(decoder.buffered(), HEADER_LEN);
        assert!(decoder.buf.capacity() <= RETAINED_CAPACITY);

        // A small limit bounds the buffer from the first read on.
        let mut decoder = FrameDecoder::with_max_body_len(100);
        let mut stream = header(101).to_vec();
        stream.resize(4096, 0);
        let mut reader = Pieces::new(&stream, &[usize::MAX], false);
        let (_, error) = read_all(&mut decoder, &mut reader, 256 * 1024);
        assert_eq!(
            error,
            Some(Error::Oversize {
                claimed: 101,
                limit: 100
            })
        );
        assert!(reader.given <= decoder.capacity_limit());
        assert!(decoder.buf.capacity() <= decoder.capacity_limit());
    }

    #[test]
    fn read_from_does_not_allocate_for_a_claim() {
        // A good header claiming a maximal body, and only a little of it.
        let mut stream = header(MAX_BODY_LEN).to_vec();
        stream.resize(HEADER_LEN + 1000, 0);
        let mut decoder = FrameDecoder::new();
        let mut reader = Pieces::new(&stream, &[usize::MAX], false);
        assert_eq!(
            decoder.read_from(&mut reader, 256 * 1024).unwrap(),
            ReadOutcome::Data(stream.len())
        );
        assert!(matches!(
            decoder.read_from(&mut reader, 256 * 1024),
            Ok(ReadOutcome::Eof)
        ));
        assert!(decoder.buf.capacity() <= RETAINED_CAPACITY);
        assert_eq!(decoder.buffered(), stream.len());
        assert_eq!(decoder.next_frame(), Ok(None));
    }

    #[test]
    fn read_from_full_when_a_maximal_frame_is_unhanded() {
        // A small limit: two maximal frames on the wire.
        let (_, frames) = sample_stream();
        let write = &frames[2];
        let mut decoder = FrameDecoder::with_max_body_len((write.len() - HEADER_LEN) as u32);
        let stream = write.repeat(2);
        let mut reader = Pieces::new(&stream, &[usize::MAX], false);
        assert_eq!(
            decoder.read_from(&mut reader, 1 << 20).unwrap(),
            ReadOutcome::Data(write.len())
        );
        assert!(!decoder.has_room());
        assert_eq!(
            decoder.read_from(&mut reader, 1 << 20).unwrap(),
            ReadOutcome::Full
        );
        assert_eq!(reader.reads, 1);
        assert_eq!(decoder.next_frame(), Ok(Some(&write[..])));
        assert!(decoder.has_room());
        assert_eq!(
            decoder.read_from(&mut reader, 1 << 20).unwrap(),
            ReadOutcome::Data(write.len())
        );
        assert_eq!(decoder.next_frame(), Ok(Some(&write[..])));
        assert_eq!(
            decoder.read_from(&mut reader, 1 << 20).unwrap(),
            ReadOutcome::Eof
        );
        assert_bounded(&decoder);

        // The real limit: a frame of MAX_FRAME_LEN, then more.
        let mut stream = header(MAX_BODY_LEN).to_vec();
        stream.resize(frame::MAX_FRAME_LEN, 0x5A);
        stream.extend_from_slice(&frames[0]);
        let mut decoder = FrameDecoder::new();
        let mut reader = Pieces::new(&stream, &[65536], false);
        let mut reads = 0;
        while decoder.read_from(&mut reader, 256 * 1024).unwrap() != ReadOutcome::Full {
            reads += 1;
            assert_bounded(&decoder);
        }
        assert_eq!(reads, reader.reads);
        assert_eq!(decoder.buffered(), frame::MAX_FRAME_LEN);
        assert_eq!(decoder.buf.len(), frame::MAX_FRAME_LEN);
        assert_eq!(
            decoder.read_from(&mut reader, 256 * 1024).unwrap(),
            ReadOutcome::Full
        );
        assert_eq!(reads, reader.reads);
        assert_eq!(
            decoder.next_frame().unwrap().map(<[u8]>::len),
            Some(frame::MAX_FRAME_LEN)
        );
        let (rest, error) = read_all(&mut decoder, &mut reader, 256 * 1024);
        assert_eq!((rest, error), (vec![frames[0].clone()], None));
    }

    #[test]
    fn read_from_eof() {
        let mut decoder = FrameDecoder::new();
        let mut empty: &[u8] = &[];
        assert!(matches!(
            decoder.read_from(&mut empty, 1024),
            Ok(ReadOutcome::Eof)
        ));
        let (stream, frames) = sample_stream();
        let cut = frames[0].len() + 5;
        let mut reader = &stream[..cut];
        assert!(matches!(
            decoder.read_from(&mut reader, 1024),
            Ok(ReadOutcome::Data(n)) if n == cut
        ));
        assert!(matches!(
            decoder.read_from(&mut reader, 1024),
            Ok(ReadOutcome::Eof)
        ));
        assert_eq!(decoder.next_frame(), Ok(Some(&frames[0][..])));
        assert_eq!(decoder.next_frame(), Ok(None));
        assert_eq!(decoder.buffered(), 5);
    }

    #[test]
    fn read_from_retries_interrupted_and_rejects_lying_readers() {
        struct Interrupting(bool);
        impl io::Read for Interrupting {
            fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
                if std::mem::replace(&mut self.0, false) {
                    return Err(io::ErrorKind::Interrupted.into());
                }
                buf[0] = b'P';
                Ok(1)
            }
        }
        let mut decoder = FrameDecoder::new();
        assert!(matches!(
            decoder.read_from(&mut Interrupting(true), 10),
            Ok(ReadOutcome::Data(1))
        ));
        // A `max` of 0 reads one byte.
        assert!(matches!(
            decoder.read_from(&mut Interrupting(false), 0),
            Ok(ReadOutcome::Data(1))
        ));
        assert_eq!(decoder.buffered(), 2);

        struct Lying;
        impl io::Read for Lying {
            fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
                Ok(buf.len() + 1)
            }
        }
        assert!(matches!(
            decoder.read_from(&mut Lying, 10),
            Err(ReadError::Io(e)) if e.kind() == io::ErrorKind::InvalidData
        ));
        assert_eq!(decoder.buffered(), 2);
    }

    #[test]
    fn steady_state_reads_do_not_grow_or_zero_the_buffer() {
        let (_, frames) = sample_stream();
        let stream = frames.concat().repeat(3000); // ~1.3 MB of small frames
        for sizes in [&[65536][..], &[usize::MAX], &[100_000, 1, 30_000]] {
            let mut decoder = FrameDecoder::new();
            let mut reader = Pieces::new(&stream, sizes, true);
            let mut len = None;
            let mut count = 0;
            loop {
                let outcome = decoder.read_from(&mut reader, 256 * 1024);
                while let Some(frame) = decoder.next_frame().unwrap() {
                    assert_eq!(frame, &frames[count % frames.len()][..]);
                    count += 1;
                }
                match outcome {
                    Ok(ReadOutcome::Data(_)) => {}
                    Ok(ReadOutcome::Eof) => break,
                    Err(ReadError::Io(e)) if e.kind() == io::ErrorKind::WouldBlock => {}
                    other => panic!("{other:?}"),
                }
                // The buffer is sized once and then neither grows nor is zeroed again.
                assert_eq!(*len.get_or_insert(decoder.buf.len()), decoder.buf.len());
                assert!(decoder.buf.capacity() <= RETAINED_CAPACITY);
                // Only the partial frame is kept, at the front after a move.
                assert!(decoder.buffered() < 400);
            }
            assert_eq!(count, 3000 * frames.len());
            assert_eq!(len, Some(RETAINED_CAPACITY));
        }

        // A small `max` keeps the buffer that small.
        let mut decoder = FrameDecoder::new();
        let mut reader = Pieces::new(&stream, &[usize::MAX], false);
        let (got, _) = read_all(&mut decoder, &mut reader, 4096);
        assert_eq!(got.len(), 3000 * frames.len());
        assert_eq!(decoder.buf.len(), 4096);
    }

    #[test]
    fn large_frames_grow_by_doubling_then_release_when_idle() {
        let data = vec![7u8; 1 << 20];
        let frame = Message::Response(response::Repr::read_data(&data))
            .encode_to_vec(1)
            .unwrap();
        let stream = frame.repeat(4);
        let mut decoder = FrameDecoder::new();
        let mut reader = Pieces::new(&stream, &[usize::MAX], false);
        let mut sizes = Vec::new();
        let mut count = 0;
        while let ReadOutcome::Data(_) = decoder.read_from(&mut reader, 256 * 1024).unwrap() {
            if sizes.last() != Some(&decoder.buf.len()) {
                sizes.push(decoder.buf.len());
            }
            while let Some(got) = decoder.next_frame().unwrap() {
                assert_eq!(got, &frame[..]);
                count += 1;
            }
        }
        assert_eq!(count, 4);
        // 64 KiB, doubled until the frame fits, and never more than twice it.
        assert_eq!(sizes[0], RETAINED_CAPACITY);
        assert!(sizes.windows(2).all(|w| w[1] == 2 * w[0]), "{sizes:?}");
        assert!(*sizes.last().unwrap() <= 2 * frame.len());

        // Idle (the reader found empty, a partial frame held): memory above
        // 64 KiB is released once enough small frames came after the big ones.
        struct Idle;
        impl io::Read for Idle {
            fn read(&mut self, _: &mut [u8]) -> io::Result<usize> {
                Err(io::ErrorKind::WouldBlock.into())
            }
        }
        let would_block = |decoder: &mut FrameDecoder| {
            matches!(
                decoder.read_from(&mut Idle, 256 * 1024),
                Err(ReadError::Io(e)) if e.kind() == io::ErrorKind::WouldBlock
            )
        };
        assert!(would_block(&mut decoder));
        assert!(decoder.buf.capacity() > RETAINED_CAPACITY);
        let (stream, frames) = sample_stream();
        let ping = &frames[0];
        // The last read also brings 10 bytes of the next frame, which stay.
        let cut = ping.len() + 10;
        for sent in 1..=SMALL_FRAMES_BEFORE_RELEASE {
            let last = sent == SMALL_FRAMES_BEFORE_RELEASE;
            let mut input = if last { &stream[..cut] } else { &ping[..] };
            assert!(decoder.read_from(&mut input, 256 * 1024).is_ok());
            assert_eq!(decoder.next_frame(), Ok(Some(&ping[..])));
            assert!(would_block(&mut decoder));
            assert_eq!(decoder.buf.capacity() > RETAINED_CAPACITY, !last);
        }
        assert_eq!(decoder.buffered(), 10);
        let mut reader = Pieces::new(&stream[cut..], &[usize::MAX], false);
        let (got, error) = read_all(&mut decoder, &mut reader, 256 * 1024);
        assert_eq!((&got[..], error), (&frames[1..], None));
        assert!(decoder.buf.capacity() <= RETAINED_CAPACITY);
    }

    #[test]
    fn partial_counts_the_bytes_of_an_incomplete_frame() {
        let (stream, frames) = sample_stream();
        let mut decoder = FrameDecoder::new();
        assert_eq!(decoder.partial(), 0);
        let cut = frames[0].len() + 5;
        assert_eq!(decoder.feed(&stream[..cut]), Ok(cut));
        assert_eq!(decoder.partial(), 5);
        assert_eq!(decoder.buffered(), cut);
        assert_eq!(decoder.next_frame(), Ok(Some(&frames[0][..])));
        assert_eq!(decoder.partial(), 5);
        let rest = frames[1].len() - 5;
        assert_eq!(decoder.feed(&stream[cut..cut + rest]), Ok(rest));
        assert_eq!(decoder.partial(), 0);
    }

    #[test]
    fn a_frame_in_progress_is_known_from_its_header_on() {
        let mut decoder = FrameDecoder::new();
        assert_eq!(decoder.frame_in_progress(), None);
        assert_eq!(decoder.feed(&header(1000)[..10]), Ok(10));
        assert_eq!(decoder.frame_in_progress(), None, "header not whole yet");
        assert_eq!(decoder.feed(&header(1000)[10..]), Ok(HEADER_LEN - 10));
        assert_eq!(decoder.frame_in_progress(), Some(HEADER_LEN + 1000));
        assert_eq!(decoder.feed(&[0; 1000]), Ok(1000));
        assert_eq!(decoder.frame_in_progress(), None, "complete");
    }

    #[test]
    fn a_raised_limit_applies_from_the_next_header() {
        let mut decoder = FrameDecoder::with_max_body_len(100);
        decoder.raise_max_body_len(50);
        assert_eq!(decoder.max_body_len(), 100, "never lowered");
        decoder.raise_max_body_len(u32::MAX);
        assert_eq!(decoder.max_body_len(), MAX_BODY_LEN);
        assert_eq!(decoder.feed(&header(4096)), Ok(HEADER_LEN));
        assert_eq!(decoder.frame_in_progress(), Some(HEADER_LEN + 4096));
    }

    #[test]
    fn reader_drained_releases_like_would_block() {
        let data = vec![7u8; 1 << 20];
        let big = Message::Response(response::Repr::read_data(&data))
            .encode_to_vec(1)
            .unwrap();
        let mut decoder = FrameDecoder::new();
        let mut reader = Pieces::new(&big, &[usize::MAX], false);
        let (got, _) = read_all(&mut decoder, &mut reader, 256 * 1024);
        assert_eq!(got.len(), 1);
        decoder.reader_drained();
        assert!(decoder.buf.capacity() > RETAINED_CAPACITY);
        let (_, frames) = sample_stream();
        let ping = &frames[0];
        for _ in 0..SMALL_FRAMES_BEFORE_RELEASE {
            let mut input = &ping[..];
            assert!(decoder.read_from(&mut input, 256 * 1024).is_ok());
            assert_eq!(decoder.next_frame(), Ok(Some(&ping[..])));
            // A short read: the caller knows the socket is empty.
            decoder.reader_drained();
        }
        assert!(decoder.buf.capacity() <= RETAINED_CAPACITY);
    }

    #[test]
    fn frames_that_need_a_larger_buffer_keep_it() {
        // 40 KiB frames, the reader empty after each: the buffer grows once
        // and is neither released nor zero-filled again.
        let data = vec![1u8; 40 * 1024];
        let frame = Message::Request(request::Repr::write(
            Target::Pmem(PmemAddr(0)),
            AccessKey(1),
            &data,
        ))
        .encode_to_vec(5)
        .unwrap();
        let stream = frame.repeat(50);
        for sizes in [&[usize::MAX][..], &[frame.len()], &[1000, 7]] {
            let mut decoder = FrameDecoder::new();
            let mut reader = Pieces::new(&stream, sizes, true);
            let mut lens = vec![];
            let mut count = 0;
            loop {
                let outcome = decoder.read_from(&mut reader, 256 * 1024);
                while let Some(got) = decoder.next_frame().unwrap() {
                    assert_eq!(got, &frame[..]);
                    count += 1;
                }
                if lens.last() != Some(&decoder.buf.len()) {
                    lens.push(decoder.buf.len());
                }
                match outcome {
                    Ok(ReadOutcome::Eof) => break,
                    Ok(ReadOutcome::Data(_)) => {}
                    Err(ReadError::Io(e)) if e.kind() == io::ErrorKind::WouldBlock => {}
                    other => panic!("{other:?}"),
                }
            }
            assert_eq!(count, 50);
            // 64 KiB, and 128 KiB once a partial frame fills more than half of it.
            let grew = sizes == [1000, 7];
            let want: &[usize] = if grew {
                &[RETAINED_CAPACITY, 2 * RETAINED_CAPACITY]
            } else {
                &[RETAINED_CAPACITY]
            };
            assert_eq!(lens, want, "{sizes:?}");
        }
    }

    #[test]
    fn reading_without_draining_stays_bounded() {
        // Read until the reader blocks, then drain, like an event loop.
        let (stream, frames) = long_stream();
        let stream = stream.repeat(4);
        let limit = 300 * 1024;
        let mut decoder = FrameDecoder::with_max_body_len((limit - HEADER_LEN) as u32);
        let mut reader = Pieces::new(&stream, &[100_000, 777], true);
        let mut got = Vec::new();
        loop {
            let outcome = decoder.read_from(&mut reader, 256 * 1024);
            assert_bounded(&decoder);
            match outcome {
                Ok(ReadOutcome::Data(_)) => continue,
                Ok(ReadOutcome::Eof) => break,
                Ok(ReadOutcome::Full) => assert!(!decoder.has_room()),
                Err(ReadError::Io(e)) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => panic!("{e}"),
            }
            while let Some(frame) = decoder.next_frame().unwrap() {
                got.push(frame.to_vec());
            }
        }
        while let Some(frame) = decoder.next_frame().unwrap() {
            got.push(frame.to_vec());
        }
        let want: Vec<Vec<u8>> = (0..4).flat_map(|_| frames.iter().cloned()).collect();
        assert!(got == want);
    }

    #[test]
    fn compaction_moves_only_the_partial_frame() {
        let (stream, frames) = sample_stream();
        let mut decoder = FrameDecoder::with_max_body_len(1024);
        let cut = frames[0].len() + frames[1].len() + 10;
        let mut reader = Pieces::new(&stream, &[cut, usize::MAX], false);
        assert!(matches!(
            decoder.read_from(&mut reader, 1 << 20),
            Ok(ReadOutcome::Data(n)) if n == cut
        ));
        assert_eq!(decoder.buf.len(), decoder.capacity_limit());
        decoder.next_frame().unwrap();
        decoder.next_frame().unwrap();
        // Enough spare room behind the partial frame: nothing moves.
        assert!(matches!(
            decoder.read_from(&mut reader, 100),
            Ok(ReadOutcome::Data(100))
        ));
        assert_eq!(decoder.start, cut - 10);
        // Not enough: the 110 bytes of the partial frame move to the front.
        let _ = decoder.read_from(&mut reader, 1 << 20);
        assert_eq!(decoder.start, 0);
        assert!(decoder.buf.len() <= decoder.capacity_limit());
        let (rest, error) = read_all(&mut decoder, &mut reader, 1 << 20);
        assert_eq!((&rest[..], error), (&frames[2..], None));
    }

    /// Bytes fed, read by `read_from`, and written into a `read_area`
    /// and committed later (as an io_uring receive does), in turn.
    #[test]
    fn feed_read_from_and_read_area_mix() {
        let (stream, frames) = long_stream();
        let mut decoder = FrameDecoder::new();
        let mut got = Vec::new();
        let mut rest = &stream[..];
        let mut turn = 0usize;
        while !rest.is_empty() {
            let n = [1, 13, 4000, 70_000][turn % 4].min(rest.len());
            match turn % 3 {
                0 => {
                    let used = decoder.feed(&rest[..n]).unwrap();
                    rest = &rest[used..];
                }
                1 => {
                    let mut piece = &rest[..n];
                    match decoder.read_from(&mut piece, 256 * 1024).unwrap() {
                        ReadOutcome::Data(read) => rest = &rest[read..],
                        other => panic!("{other:?}"),
                    }
                }
                _ => {
                    let area = decoder.read_area(n).unwrap().expect("room");
                    let read = area.len().min(n);
                    area[..read].copy_from_slice(&rest[..read]);
                    decoder.commit_read(read).unwrap();
                    rest = &rest[read..];
                }
            }
            assert_bounded(&decoder);
            while let Some(frame) = decoder.next_frame().unwrap() {
                got.push(frame.to_vec());
            }
            turn += 1;
        }
        assert!(got == frames);
    }

    #[test]
    fn a_commit_beyond_the_area_takes_nothing_and_a_bad_header_fails_the_next_area() {
        let mut decoder = FrameDecoder::new();
        let len = decoder.read_area(16).expect("room").expect("area").len();
        let e = decoder.commit_read(len + 1).expect_err("too long");
        assert!(matches!(e, ReadError::Io(ref e) if e.kind() == io::ErrorKind::InvalidData));
        assert_eq!(decoder.buffered(), 0);
        let area = decoder.read_area(16).expect("room").expect("area");
        area.fill(0xee);
        let n = area.len();
        assert!(matches!(decoder.commit_read(n), Err(ReadError::Framing(_))));
        assert!(decoder.read_area(16).is_err(), "failed for good");
    }
}
