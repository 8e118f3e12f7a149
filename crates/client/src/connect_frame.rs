//! Connect protocol envelopes (streaming RPCs): `flags: u8 | length: u32 big-endian | payload`.
//! Flag 0x01 = compressed (never requested by this client), 0x02 = end of stream (JSON trailer).
//!
//! TEMPORARY: replaced by `warren_proto::connect` once the agent's proto crate lands.

use bytes::{Buf, BufMut, Bytes, BytesMut};

pub const FLAG_COMPRESSED: u8 = 0x01;
pub const FLAG_END_STREAM: u8 = 0x02;
const HEADER_LEN: usize = 5;
/// Refuse frames larger than this: a broken or hostile peer must not make us allocate gigabytes.
pub const MAX_FRAME_LEN: usize = 64 * 1024 * 1024;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FrameError {
    #[error("frame of {0} bytes exceeds the {MAX_FRAME_LEN}-byte limit")]
    TooLarge(usize),
    #[error("compressed frame received, but no compression was negotiated")]
    Compressed,
    #[error("stream ended inside a frame ({0} bytes left over)")]
    Truncated(usize),
}

/// One decoded envelope.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub end_stream: bool,
    pub payload: Bytes,
}

/// Wraps one message into an envelope.
pub fn encode(flags: u8, payload: &[u8]) -> Bytes {
    let mut out = BytesMut::with_capacity(HEADER_LEN + payload.len());
    out.put_u8(flags);
    // Payloads are our own small requests; a u32 length always fits.
    out.put_u32(payload.len() as u32);
    out.put_slice(payload);
    out.freeze()
}

/// Incremental decoder: feed it body chunks as they arrive, take out whole frames.
#[derive(Debug, Default)]
pub struct FrameDecoder {
    buffer: BytesMut,
}

impl FrameDecoder {
    pub fn push(&mut self, chunk: &[u8]) {
        self.buffer.extend_from_slice(chunk);
    }

    /// The next whole frame, or `None` when more bytes are needed.
    pub fn next_frame(&mut self) -> Result<Option<Frame>, FrameError> {
        if self.buffer.len() < HEADER_LEN {
            return Ok(None);
        }
        let flags = self.buffer[0];
        let len = u32::from_be_bytes([
            self.buffer[1],
            self.buffer[2],
            self.buffer[3],
            self.buffer[4],
        ]) as usize;
        if len > MAX_FRAME_LEN {
            return Err(FrameError::TooLarge(len));
        }
        if flags & FLAG_COMPRESSED != 0 {
            return Err(FrameError::Compressed);
        }
        if self.buffer.len() < HEADER_LEN + len {
            return Ok(None);
        }
        self.buffer.advance(HEADER_LEN);
        let payload = self.buffer.split_to(len).freeze();
        Ok(Some(Frame {
            end_stream: flags & FLAG_END_STREAM != 0,
            payload,
        }))
    }

    /// Call when the body ended: an error if a partial frame is left.
    pub fn finish(&self) -> Result<(), FrameError> {
        if self.buffer.is_empty() {
            Ok(())
        } else {
            Err(FrameError::Truncated(self.buffer.len()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_frames_split_at_every_byte() {
        let mut wire = encode(0, b"hello").to_vec();
        wire.extend_from_slice(&encode(FLAG_END_STREAM, b"{}"));
        let mut decoder = FrameDecoder::default();
        let mut frames = Vec::new();
        for byte in &wire {
            decoder.push(std::slice::from_ref(byte));
            while let Some(frame) = decoder.next_frame().expect("valid") {
                frames.push(frame);
            }
        }
        decoder.finish().expect("nothing left");
        assert_eq!(
            frames,
            vec![
                Frame {
                    end_stream: false,
                    payload: Bytes::from_static(b"hello")
                },
                Frame {
                    end_stream: true,
                    payload: Bytes::from_static(b"{}")
                },
            ]
        );
    }

    #[test]
    fn rejects_huge_and_compressed_frames_and_truncation() {
        let mut decoder = FrameDecoder::default();
        decoder.push(&[0, 0xff, 0xff, 0xff, 0xff]);
        assert!(matches!(decoder.next_frame(), Err(FrameError::TooLarge(_))));

        let mut decoder = FrameDecoder::default();
        decoder.push(&encode(FLAG_COMPRESSED, b"x"));
        assert_eq!(decoder.next_frame(), Err(FrameError::Compressed));

        let mut decoder = FrameDecoder::default();
        decoder.push(&encode(0, b"abc")[..6]);
        assert_eq!(decoder.next_frame(), Ok(None));
        assert_eq!(decoder.finish(), Err(FrameError::Truncated(6)));
    }
}
