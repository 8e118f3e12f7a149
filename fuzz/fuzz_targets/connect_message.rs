//! The agent's request decoders (JSON and binary proto) on arbitrary bytes: an error, never a panic;
//! a message that decodes re-encodes and decodes to the same message.
#![no_main]

use libfuzzer_sys::fuzz_target;
use warren_proto::connect::{parse_content_type, parse_timeout_ms, Codec};
use warren_proto::envd::filesystem::ListDirRequest;
use warren_proto::envd::process::StartRequest;

fuzz_target!(|data: &[u8]| {
    for codec in [Codec::Json, Codec::Proto] {
        if let Ok(start) = codec.decode::<StartRequest>(data) {
            let again: StartRequest = codec
                .decode(&codec.encode(&start))
                .expect("a decoded message re-decodes");
            assert_eq!(start, again);
        }
        let _ = codec.decode::<ListDirRequest>(data);
    }
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = parse_content_type(text);
        if let Some(ms) = parse_timeout_ms(text) {
            assert!(ms <= 9_999_999_999);
        }
    }
});
