//! The Dockerfile parser on arbitrary text: an error naming the problem, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use warren_server::templates::build::dockerfile::parse;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = parse(text);
    }
});
