//! The Connect envelope decoder on arbitrary bodies: never panics, never allocates past its limit,
//! and gives the same frames whether the body arrives at once or in chunks (the first byte picks
//! the chunk size).
#![no_main]

use libfuzzer_sys::fuzz_target;
use warren_proto::connect::{encode_envelope, EnvelopeDecoder};

const LIMIT: usize = 1 << 16;

fuzz_target!(|data: &[u8]| {
    let Some((&chunk, body)) = data.split_first() else {
        return;
    };
    let mut whole = EnvelopeDecoder::new(LIMIT);
    whole.push(body);
    let mut frames = Vec::new();
    loop {
        match whole.next_frame() {
            Ok(Some(frame)) => {
                assert!(frame.payload.len() <= LIMIT);
                frames.push(frame);
            }
            Ok(None) => break,
            Err(_) => return,
        }
    }
    let mut pieces = EnvelopeDecoder::new(LIMIT);
    let mut again = Vec::new();
    for piece in body.chunks(usize::from(chunk).max(1)) {
        pieces.push(piece);
        while let Ok(Some(frame)) = pieces.next_frame() {
            again.push(frame);
        }
    }
    assert_eq!(frames, again);
    assert_eq!(whole.pending_bytes(), pieces.pending_bytes());
    // What was decoded re-encodes to the bytes it came from.
    let encoded: Vec<u8> = frames
        .iter()
        .flat_map(|f| encode_envelope(f.flags, &f.payload))
        .collect();
    assert_eq!(&body[..encoded.len()], &encoded[..]);
});
