//! Which sandbox and port a proxied request is for: the `E2b-Sandbox-Id` / `E2b-Sandbox-Port` headers, or
//! a host name `<port>-<sandboxID>.<domain>`.

use hyper::header::HOST;
use hyper::http::request::Parts;
use warren_proto::api::{SANDBOX_ID_HEADER, SANDBOX_PORT_HEADER};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub sandbox_id: String,
    pub port: u16,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TargetError {
    #[error("no sandbox named: send E2b-Sandbox-Id and E2b-Sandbox-Port headers or use host <port>-<sandboxID>.<domain>")]
    Missing,
    #[error("invalid sandbox port {0:?}")]
    BadPort(String),
    #[error("invalid sandbox id {0:?}")]
    BadId(String),
}

fn valid_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= 64 && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

fn parse_port(port: &str) -> Result<u16, TargetError> {
    match port.trim().parse::<u16>() {
        Ok(port) if port > 0 => Ok(port),
        _ => Err(TargetError::BadPort(port.to_string())),
    }
}

/// `name` of `name:port` (a host name with a trailing `:digits`); the host itself otherwise.
pub fn without_port(host: &str) -> &str {
    host.rsplit_once(':').map_or(host, |(name, port)| {
        if port.bytes().all(|b| b.is_ascii_digit()) {
            name
        } else {
            host
        }
    })
}

/// From `<port>-<id>.<anything>` (the host's first label); `None` when the host is not of that shape.
fn from_host(host: &str) -> Option<Result<Target, TargetError>> {
    let host = without_port(host);
    let (label, _domain) = host.split_once('.')?;
    let (port, id) = label.split_once('-')?;
    if port.is_empty() || !port.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some(parse_port(port).and_then(|port| {
        if valid_id(id) {
            Ok(Target {
                sandbox_id: id.to_string(),
                port,
            })
        } else {
            Err(TargetError::BadId(id.to_string()))
        }
    }))
}

pub fn target_of(parts: &Parts) -> Result<Target, TargetError> {
    let header = |name: &str| {
        parts
            .headers
            .get(name)
            .and_then(|value| value.to_str().ok())
    };
    if let Some(id) = header(SANDBOX_ID_HEADER) {
        let id = id.trim();
        if !valid_id(id) {
            return Err(TargetError::BadId(id.to_string()));
        }
        let port = header(SANDBOX_PORT_HEADER).ok_or(TargetError::Missing)?;
        return Ok(Target {
            sandbox_id: id.to_string(),
            port: parse_port(port)?,
        });
    }
    let host =
        header(HOST.as_str()).or_else(|| parts.uri.authority().map(|authority| authority.as_str()));
    match host.and_then(from_host) {
        Some(target) => target,
        None => Err(TargetError::Missing),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(build: hyper::http::request::Builder) -> Parts {
        build.body(()).unwrap().into_parts().0
    }

    #[test]
    fn headers_win() {
        let p = parts(
            hyper::Request::get("/files")
                .header(HOST, "127.0.0.1:3001")
                .header(SANDBOX_ID_HEADER, "abc123")
                .header(SANDBOX_PORT_HEADER, "49983"),
        );
        assert_eq!(
            target_of(&p),
            Ok(Target {
                sandbox_id: "abc123".into(),
                port: 49983
            })
        );
    }

    #[test]
    fn host_names_route() {
        let p = parts(hyper::Request::get("/").header(HOST, "8080-abc123.warren.localhost:3001"));
        assert_eq!(
            target_of(&p),
            Ok(Target {
                sandbox_id: "abc123".into(),
                port: 8080
            })
        );
        let h2 = parts(hyper::Request::get("http://49983-xyz.example.com/health"));
        assert_eq!(target_of(&h2).map(|t| t.port), Ok(49983));
    }

    #[test]
    fn bad_requests_are_refused() {
        assert_eq!(
            target_of(&parts(
                hyper::Request::get("/").header(HOST, "127.0.0.1:3001")
            )),
            Err(TargetError::Missing)
        );
        assert!(matches!(
            target_of(&parts(
                hyper::Request::get("/").header(HOST, "99999-abc.localhost")
            )),
            Err(TargetError::BadPort(_))
        ));
        assert!(matches!(
            target_of(&parts(
                hyper::Request::get("/")
                    .header(SANDBOX_ID_HEADER, "../etc")
                    .header(SANDBOX_PORT_HEADER, "1")
            )),
            Err(TargetError::BadId(_))
        ));
        assert!(matches!(
            target_of(&parts(
                hyper::Request::get("/")
                    .header(SANDBOX_ID_HEADER, "abc")
                    .header(SANDBOX_PORT_HEADER, "http")
            )),
            Err(TargetError::BadPort(_))
        ));
    }
}
