//! The proxy's routing parser (Host `<port>-<id>.<domain>` and the E2b-Sandbox-* headers) on
//! arbitrary header values: an error or a target whose id and port are well-formed.
#![no_main]

use libfuzzer_sys::fuzz_target;
use warren_server::proxy::target::target_of;

fuzz_target!(|data: &[u8]| {
    // Up to three header values, split at NUL: Host, E2b-Sandbox-Id, E2b-Sandbox-Port.
    let mut values = data.split(|b| *b == 0);
    let mut request = http::Request::builder().uri("/");
    for name in ["host", "e2b-sandbox-id", "e2b-sandbox-port"] {
        match values.next().map(http::HeaderValue::from_bytes) {
            Some(Ok(value)) if !value.is_empty() => request = request.header(name, value),
            _ => {}
        }
    }
    let Ok(request) = request.body(()) else {
        return;
    };
    let (parts, ()) = request.into_parts();
    if let Ok(target) = target_of(&parts) {
        // Ids become paths and keys: letters, digits and '_' only, bounded.
        assert!(!target.sandbox_id.is_empty() && target.sandbox_id.len() <= 64);
        assert!(target
            .sandbox_id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_'));
        assert!(target.port > 0);
    }
});
