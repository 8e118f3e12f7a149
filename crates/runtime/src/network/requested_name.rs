//! The host name a connection asks for, read from its first bytes without answering it: the
//! `server_name` extension of a TLS ClientHello (port 443), or the `Host` header of an HTTP/1 request
//! (port 80). Both parsers read bytes a sandbox sent, so they are bounded, never panic on any input,
//! and tell "need more bytes" apart from "this is not what it should be".
//!
//! The SNI parser is written here rather than taken from a TLS library: it reads one extension of
//! one message, and a TLS stack would want to answer the handshake, which the egress proxy must not
//! do (it passes the ClientHello on to the real server untouched).

use super::egress::is_host_name;

/// Most bytes read while looking for the name; a ClientHello or a request head beyond this is
/// refused.
pub const MAX_HEAD: usize = 16 * 1024;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Requested {
    /// The name the client asked for, lower-case, without a trailing dot or port.
    Name(String),
    /// Not enough bytes yet.
    Incomplete,
    /// Not a ClientHello / HTTP request, or one without a usable name; the reason.
    Refused(&'static str),
}

/// Big-endian reader over a byte slice that fails instead of panicking.
struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.bytes.len() < n {
            return None;
        }
        let (head, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Some(head)
    }

    fn u8(&mut self) -> Option<usize> {
        self.take(1).map(|b| usize::from(b[0]))
    }

    fn u16(&mut self) -> Option<usize> {
        self.take(2)
            .map(|b| usize::from(u16::from_be_bytes([b[0], b[1]])))
    }

    fn u24(&mut self) -> Option<usize> {
        self.take(3)
            .map(|b| (usize::from(b[0]) << 16) | (usize::from(b[1]) << 8) | usize::from(b[2]))
    }

    /// A vector with a length prefix of `width` bytes.
    fn vector(&mut self, width: usize) -> Option<&'a [u8]> {
        let len = match width {
            1 => self.u8()?,
            2 => self.u16()?,
            _ => self.u24()?,
        };
        self.take(len)
    }
}

/// The server name of the TLS ClientHello at the start of `bytes` (which may span several handshake
/// records).
pub fn tls_server_name(bytes: &[u8]) -> Requested {
    // Reassemble the handshake message from consecutive handshake records.
    let mut handshake = Vec::new();
    let mut records = Reader { bytes };
    let message = loop {
        let Some(header) = records.take(5) else {
            return Requested::Incomplete;
        };
        if header[0] != 0x16 {
            return Requested::Refused("not a TLS handshake");
        }
        if header[1] != 0x03 {
            return Requested::Refused("not a TLS record");
        }
        let len = usize::from(u16::from_be_bytes([header[3], header[4]]));
        if len == 0 || len > 16 * 1024 + 256 {
            return Requested::Refused("bad TLS record length");
        }
        let Some(payload) = records.take(len) else {
            return Requested::Incomplete;
        };
        handshake.extend_from_slice(payload);
        if handshake.len() >= 4 {
            if handshake[0] != 0x01 {
                return Requested::Refused("the first handshake message is not a ClientHello");
            }
            let body = (usize::from(handshake[1]) << 16)
                | (usize::from(handshake[2]) << 8)
                | usize::from(handshake[3]);
            if body + 4 > MAX_HEAD {
                return Requested::Refused("ClientHello too large");
            }
            if handshake.len() >= body + 4 {
                break &handshake[4..body + 4];
            }
        }
    };
    match client_hello_server_name(message) {
        Some(Some(name)) => checked_name(&name),
        Some(None) => Requested::Refused("the ClientHello names no server (SNI)"),
        None => Requested::Refused("malformed ClientHello"),
    }
}

/// `Some(None)`: well formed without SNI; `None`: malformed.
fn client_hello_server_name(message: &[u8]) -> Option<Option<String>> {
    let mut hello = Reader { bytes: message };
    hello.take(2)?; // legacy_version
    hello.take(32)?; // random
    hello.vector(1)?; // legacy_session_id
    hello.vector(2)?; // cipher_suites
    hello.vector(1)?; // legacy_compression_methods
    if hello.bytes.is_empty() {
        return Some(None);
    }
    let mut extensions = Reader {
        bytes: hello.vector(2)?,
    };
    while !extensions.bytes.is_empty() {
        let kind = extensions.u16()?;
        let data = extensions.vector(2)?;
        if kind != 0 {
            continue;
        }
        let mut list = Reader {
            bytes: Reader { bytes: data }.vector(2)?,
        };
        while !list.bytes.is_empty() {
            let name_type = list.u8()?;
            let name = list.vector(2)?;
            if name_type == 0 {
                return Some(Some(String::from_utf8(name.to_vec()).ok()?));
            }
        }
        return Some(None);
    }
    Some(None)
}

/// The `Host` of the HTTP/1 request at the start of `bytes`.
pub fn http_host(bytes: &[u8]) -> Requested {
    let mut headers = [httparse::EMPTY_HEADER; 100];
    let mut request = httparse::Request::new(&mut headers);
    match request.parse(bytes) {
        Ok(httparse::Status::Partial) => {
            if bytes.len() >= MAX_HEAD {
                Requested::Refused("HTTP request head too large")
            } else {
                Requested::Incomplete
            }
        }
        Err(_) => Requested::Refused("not an HTTP/1 request"),
        Ok(httparse::Status::Complete(_)) => {
            let mut hosts = request
                .headers
                .iter()
                .filter(|h| h.name.eq_ignore_ascii_case("host"));
            let (Some(host), None) = (hosts.next(), hosts.next()) else {
                return Requested::Refused("the request needs exactly one Host header");
            };
            let Ok(value) = std::str::from_utf8(host.value) else {
                return Requested::Refused("the Host header is not text");
            };
            let value = value.trim();
            // `name:port`; an IPv6 literal (`[::1]`) is never a host name.
            let name = match value.rsplit_once(':') {
                Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
                _ => value,
            };
            checked_name(name)
        }
    }
}

fn checked_name(name: &str) -> Requested {
    let name = name.trim_end_matches('.').to_ascii_lowercase();
    if name.parse::<std::net::Ipv4Addr>().is_ok() {
        return Requested::Refused("the request names an address, not a host name");
    }
    if !is_host_name(&name) {
        return Requested::Refused("the requested name is not a valid host name");
    }
    Requested::Name(name)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A ClientHello record carrying `name` as SNI (when given) among other extensions.
    pub(crate) fn client_hello(name: Option<&str>) -> Vec<u8> {
        let mut extensions = Vec::new();
        // supported_versions, an extension before SNI the parser must skip.
        extensions.extend_from_slice(&[0x00, 0x2b, 0x00, 0x03, 0x02, 0x03, 0x04]);
        if let Some(name) = name {
            let mut entry = vec![0u8];
            entry.extend_from_slice(&(name.len() as u16).to_be_bytes());
            entry.extend_from_slice(name.as_bytes());
            let mut list = (entry.len() as u16).to_be_bytes().to_vec();
            list.extend_from_slice(&entry);
            extensions.extend_from_slice(&[0x00, 0x00]);
            extensions.extend_from_slice(&(list.len() as u16).to_be_bytes());
            extensions.extend_from_slice(&list);
        }
        let mut body = vec![0x03, 0x03];
        body.extend_from_slice(&[7u8; 32]);
        body.extend_from_slice(&[0]); // session id
        body.extend_from_slice(&[0x00, 0x02, 0x13, 0x01]); // one cipher suite
        body.extend_from_slice(&[0x01, 0x00]); // null compression
        body.extend_from_slice(&(extensions.len() as u16).to_be_bytes());
        body.extend_from_slice(&extensions);
        let mut handshake = vec![0x01];
        handshake.extend_from_slice(&(body.len() as u32).to_be_bytes()[1..]);
        handshake.extend_from_slice(&body);
        let mut record = vec![0x16, 0x03, 0x01];
        record.extend_from_slice(&(handshake.len() as u16).to_be_bytes());
        record.extend_from_slice(&handshake);
        record
    }

    #[test]
    fn sni_is_read_from_a_client_hello() {
        let hello = client_hello(Some("API.example.com"));
        assert_eq!(
            tls_server_name(&hello),
            Requested::Name("api.example.com".into())
        );
        for cut in 0..hello.len() {
            assert_eq!(
                tls_server_name(&hello[..cut]),
                Requested::Incomplete,
                "{cut}"
            );
        }
        assert!(matches!(
            tls_server_name(&client_hello(None)),
            Requested::Refused(_)
        ));
        assert!(matches!(
            tls_server_name(&client_hello(Some("198.51.100.7"))),
            Requested::Refused(_)
        ));
        assert!(matches!(
            tls_server_name(&client_hello(Some("bad name"))),
            Requested::Refused(_)
        ));
        assert!(matches!(
            tls_server_name(b"GET / HTTP/1.1\r\n"),
            Requested::Refused(_)
        ));
    }

    #[test]
    fn a_client_hello_split_over_two_records_is_reassembled() {
        let hello = client_hello(Some("a.example.com"));
        let handshake = &hello[5..];
        let (first, second) = handshake.split_at(10);
        let mut split = Vec::new();
        for part in [first, second] {
            split.extend_from_slice(&[0x16, 0x03, 0x01]);
            split.extend_from_slice(&(part.len() as u16).to_be_bytes());
            split.extend_from_slice(part);
        }
        assert_eq!(
            tls_server_name(&split),
            Requested::Name("a.example.com".into())
        );
    }

    #[test]
    fn no_input_makes_the_sni_parser_panic() {
        // Every truncation and single-byte corruption of a real-shaped ClientHello.
        let hello = client_hello(Some("a.example.com"));
        for i in 0..hello.len() {
            for value in [0x00, 0x01, 0x7f, 0xff] {
                let mut bad = hello.clone();
                bad[i] = value;
                let _ = tls_server_name(&bad);
                let _ = tls_server_name(&bad[..i]);
            }
        }
    }

    #[test]
    fn host_is_read_from_an_http_request() {
        let request = b"GET /x HTTP/1.1\r\nUser-Agent: t\r\nHost: Api.Example.com:80\r\n\r\n";
        assert_eq!(
            http_host(request),
            Requested::Name("api.example.com".into())
        );
        assert_eq!(http_host(&request[..20]), Requested::Incomplete);
        assert!(matches!(
            http_host(b"GET / HTTP/1.1\r\n\r\n"),
            Requested::Refused(_)
        ));
        assert!(matches!(
            http_host(b"GET / HTTP/1.1\r\nHost: a.test\r\nHost: b.test\r\n\r\n"),
            Requested::Refused(_)
        ));
        assert!(matches!(
            http_host(b"GET / HTTP/1.1\r\nHost: 198.51.100.7\r\n\r\n"),
            Requested::Refused(_)
        ));
        assert!(matches!(
            http_host(b"GET / HTTP/1.1\r\nHost: [::1]:80\r\n\r\n"),
            Requested::Refused(_)
        ));
        assert!(matches!(
            http_host(b"\x16\x03\x01\x00"),
            Requested::Refused(_)
        ));
        let endless = vec![b'a'; MAX_HEAD];
        let mut head = b"GET / HTTP/1.1\r\nX: ".to_vec();
        head.extend_from_slice(&endless);
        assert!(matches!(http_host(&head), Requested::Refused(_)));
    }
}
