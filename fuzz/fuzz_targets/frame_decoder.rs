//! A byte stream from a peer, in arbitrary chunks, through the sans-IO
//! frame decoder, as a fabric device or a server reads a connection: by
//! `feed` or by `read_from` a non-blocking reader, draining frames in
//! between.
//!
//! The frames handed out must be exactly those a plain walk over the
//! stream's headers finds (same bytes, same order, none lost or invented),
//! the decoder must fail on the same bad header with the same error and
//! never hold more than its limit, and every frame handed out must keep
//! proto's promises (`frames::check_frame`: what parses re-encodes to the
//! same bytes; what does not gets a well-formed error reply or none).
#![no_main]

use std::io::{self, Read};

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use pmem_fabric_fuzz::frames::{Piece, check_frame};
use proto::decoder::{FrameDecoder, ReadError, ReadOutcome};
use proto::frame::{HEADER_LEN, Header, MAX_BODY_LEN};

#[derive(Debug, Arbitrary)]
struct Input {
    /// A decoder with this body limit (as for control connections), or
    /// the full one.
    limit: Option<u16>,
    /// The stream.
    pieces: Vec<Piece>,
    /// How it arrives: chunk lengths (cycled; 0 counts as 1) and whether
    /// each chunk is read by `read_from` (with this `max`) or fed.
    chunks: Vec<(u16, Option<u16>)>,
}

/// What a plain walk over the stream's headers finds: the whole frames,
/// then the error of the first bad header, if it arrived.
fn expected(stream: &[u8], limit: u32) -> (Vec<&[u8]>, Option<proto::Error>) {
    let mut frames = Vec::new();
    let mut rest = stream;
    while rest.len() >= HEADER_LEN {
        match Header::parse_with_limit(rest, limit) {
            Ok(header) if rest.len() >= header.frame_len() => {
                let (frame, tail) = rest.split_at(header.frame_len());
                frames.push(frame);
                rest = tail;
            }
            Ok(_) => break,
            Err(error) => return (frames, Some(error)),
        }
    }
    (frames, None)
}

/// A non-blocking reader holding one chunk: then it would block.
struct Chunk<'a>(&'a [u8]);

impl Read for Chunk<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.0.is_empty() {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        let n = buf.len().min(self.0.len());
        buf[..n].copy_from_slice(&self.0[..n]);
        self.0 = &self.0[n..];
        Ok(n)
    }
}

/// Hands out every complete frame.
fn drain(decoder: &mut FrameDecoder, got: &mut Vec<Vec<u8>>) {
    while let Ok(Some(frame)) = decoder.next_frame() {
        got.push(frame.to_vec());
    }
    assert!(decoder.buffered() <= decoder.capacity_limit());
}

fuzz_target!(|input: Input| {
    let mut stream = Vec::new();
    for piece in &input.pieces {
        piece.append_to(&mut stream);
    }
    let mut decoder = match input.limit {
        Some(limit) => FrameDecoder::with_max_body_len(limit.into()),
        None => FrameDecoder::new(),
    };
    let limit = decoder.max_body_len();
    assert!(limit <= MAX_BODY_LEN);
    let mut got = Vec::new();
    let mut rest = &stream[..];
    let mut chunks = input.chunks.iter().cycle();
    let mut failed = None;
    while !rest.is_empty() && failed.is_none() {
        let (len, read_max) = chunks.next().copied().unwrap_or((u16::MAX, None));
        let (chunk, tail) = rest.split_at(rest.len().min(usize::from(len).max(1)));
        rest = tail;
        match read_max {
            None => {
                let mut offered = chunk;
                while !offered.is_empty() {
                    match decoder.feed(offered) {
                        Ok(used) => {
                            assert!(used > 0 || !decoder.has_room(), "took nothing with room");
                            offered = &offered[used..];
                        }
                        Err(error) => {
                            failed = Some(error);
                            break;
                        }
                    }
                    drain(&mut decoder, &mut got);
                }
            }
            Some(max) => {
                let mut reader = Chunk(chunk);
                loop {
                    let outcome = decoder.read_from(&mut reader, max.into());
                    drain(&mut decoder, &mut got);
                    match outcome {
                        Ok(ReadOutcome::Data(n)) => assert!(n > 0 && n <= usize::from(max).max(1)),
                        Ok(ReadOutcome::Full) => {}
                        Ok(ReadOutcome::Eof) => {
                            panic!("a reader that would block is not at its end")
                        }
                        Err(ReadError::Io(e)) => {
                            assert_eq!(e.kind(), io::ErrorKind::WouldBlock, "{e}");
                            break;
                        }
                        Err(ReadError::Framing(error)) => {
                            failed = Some(error);
                            break;
                        }
                    }
                }
            }
        }
    }
    drain(&mut decoder, &mut got);

    let (frames, error) = expected(&stream, limit);
    assert_eq!(got.len(), frames.len(), "frames handed out");
    for (got, expected) in got.iter().zip(&frames) {
        assert_eq!(got, expected, "a frame's bytes");
    }
    assert_eq!(failed, error, "the framing error");
    assert_eq!(decoder.error(), error.as_ref());
    if let Some(error) = &error {
        assert!(error.breaks_framing(), "{error}");
        assert_eq!(decoder.next_frame(), Err(error.clone()));
    } else {
        let whole: usize = frames.iter().map(|f| f.len()).sum();
        assert_eq!(decoder.buffered(), stream.len() - whole, "bytes held");
        assert_eq!(decoder.next_frame(), Ok(None));
    }
    for frame in &got {
        check_frame(frame);
    }
});
