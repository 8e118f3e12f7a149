//! The Connect streaming envelope: one flags byte, a 4-byte big-endian length, then the payload.

use super::ProtocolError;

/// Flag bit: the payload is compressed (we never negotiate compression, so it is rejected).
pub const FLAG_COMPRESSED: u8 = 0b01;
/// Flag bit: this is the end-of-stream message (JSON, whatever the codec).
pub const FLAG_END_STREAM: u8 = 0b10;

const HEADER_LEN: usize = 5;

/// Wraps `payload` in an envelope with `flags`.
pub fn encode_envelope(flags: u8, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN + payload.len());
    out.push(flags);
    // Payloads come from our own encoders and stay far below 4 GiB.
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// One decoded envelope.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub flags: u8,
    pub payload: Vec<u8>,
}

impl Frame {
    pub fn is_end_stream(&self) -> bool {
        self.flags & FLAG_END_STREAM != 0
    }
}

/// Incremental decoder: feed body chunks as they arrive, take complete frames out.
#[derive(Debug)]
pub struct EnvelopeDecoder {
    buffer: Vec<u8>,
    max_message_bytes: usize,
}

impl EnvelopeDecoder {
    /// `max_message_bytes` bounds one frame so a hostile length prefix cannot make us allocate.
    pub fn new(max_message_bytes: usize) -> Self {
        Self {
            buffer: Vec::new(),
            max_message_bytes,
        }
    }

    pub fn push(&mut self, chunk: &[u8]) {
        self.buffer.extend_from_slice(chunk);
    }

    /// The next complete frame, `Ok(None)` if more bytes are needed.
    pub fn next_frame(&mut self) -> Result<Option<Frame>, ProtocolError> {
        if self.buffer.len() < HEADER_LEN {
            return Ok(None);
        }
        let flags = self.buffer[0];
        if flags & FLAG_COMPRESSED != 0 {
            return Err(ProtocolError::Envelope(
                "compressed message but no compression was negotiated".into(),
            ));
        }
        if flags & !(FLAG_COMPRESSED | FLAG_END_STREAM) != 0 {
            return Err(ProtocolError::Envelope(format!(
                "unknown envelope flags {flags:#04x}"
            )));
        }
        let len = u32::from_be_bytes([
            self.buffer[1],
            self.buffer[2],
            self.buffer[3],
            self.buffer[4],
        ]) as usize;
        if len > self.max_message_bytes {
            return Err(ProtocolError::Envelope(format!(
                "message of {len} bytes exceeds the limit of {} bytes",
                self.max_message_bytes
            )));
        }
        if self.buffer.len() < HEADER_LEN + len {
            return Ok(None);
        }
        let payload = self.buffer[HEADER_LEN..HEADER_LEN + len].to_vec();
        self.buffer.drain(..HEADER_LEN + len);
        Ok(Some(Frame { flags, payload }))
    }

    /// Bytes received that do not form a complete frame yet (non-zero at end of body = truncated).
    pub fn pending_bytes(&self) -> usize {
        self.buffer.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_split_across_chunks_are_reassembled() {
        let mut bytes = encode_envelope(0, b"hello");
        bytes.extend(encode_envelope(FLAG_END_STREAM, b"{}"));
        let mut decoder = EnvelopeDecoder::new(1024);
        let mut frames = Vec::new();
        for b in bytes.chunks(3) {
            decoder.push(b);
            while let Some(f) = decoder.next_frame().unwrap() {
                frames.push(f);
            }
        }
        assert_eq!(frames.len(), 2);
        assert_eq!(frames[0].payload, b"hello");
        assert!(!frames[0].is_end_stream());
        assert!(frames[1].is_end_stream());
        assert_eq!(decoder.pending_bytes(), 0);
    }

    #[test]
    fn oversized_and_compressed_frames_are_rejected() {
        let mut decoder = EnvelopeDecoder::new(4);
        decoder.push(&encode_envelope(0, b"too long"));
        assert!(decoder.next_frame().is_err());
        let mut decoder = EnvelopeDecoder::new(1024);
        decoder.push(&encode_envelope(FLAG_COMPRESSED, b"x"));
        assert!(decoder.next_frame().is_err());
    }
}
