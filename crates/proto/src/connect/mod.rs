//! The Connect protocol (connectrpc.com/docs/protocol) as the e2b SDKs speak it, transport-free:
//! codecs (JSON and binary proto), the 5-byte envelope of streaming bodies, the end-of-stream
//! message, error codes with their HTTP statuses and the error JSON body. The agent wires these
//! into its HTTP server; nothing here does I/O.

mod envelope;

pub use envelope::{encode_envelope, EnvelopeDecoder, Frame, FLAG_COMPRESSED, FLAG_END_STREAM};

use serde::de::DeserializeOwned;
use serde::Serialize;

/// Errors of this module: a body that is not a valid message of the expected type.
#[derive(Debug, thiserror::Error)]
pub enum ProtocolError {
    #[error("invalid JSON message: {0}")]
    Json(#[from] serde_json::Error),
    #[error("invalid protobuf message: {0}")]
    Proto(#[from] prost::DecodeError),
    #[error("invalid envelope: {0}")]
    Envelope(String),
}

/// Connect error codes (the same set as gRPC), spelled as on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    Canceled,
    Unknown,
    InvalidArgument,
    DeadlineExceeded,
    NotFound,
    AlreadyExists,
    PermissionDenied,
    ResourceExhausted,
    FailedPrecondition,
    Aborted,
    OutOfRange,
    Unimplemented,
    Internal,
    Unavailable,
    DataLoss,
    Unauthenticated,
}

impl Code {
    /// The wire name, e.g. `not_found`.
    pub fn as_str(self) -> &'static str {
        match self {
            Code::Canceled => "canceled",
            Code::Unknown => "unknown",
            Code::InvalidArgument => "invalid_argument",
            Code::DeadlineExceeded => "deadline_exceeded",
            Code::NotFound => "not_found",
            Code::AlreadyExists => "already_exists",
            Code::PermissionDenied => "permission_denied",
            Code::ResourceExhausted => "resource_exhausted",
            Code::FailedPrecondition => "failed_precondition",
            Code::Aborted => "aborted",
            Code::OutOfRange => "out_of_range",
            Code::Unimplemented => "unimplemented",
            Code::Internal => "internal",
            Code::Unavailable => "unavailable",
            Code::DataLoss => "data_loss",
            Code::Unauthenticated => "unauthenticated",
        }
    }

    /// The HTTP status a unary error with this code is sent with (Connect's mapping).
    pub fn http_status(self) -> u16 {
        match self {
            Code::Canceled => 499,
            Code::Unknown => 500,
            Code::InvalidArgument => 400,
            Code::DeadlineExceeded => 504,
            Code::NotFound => 404,
            Code::AlreadyExists => 409,
            Code::PermissionDenied => 403,
            Code::ResourceExhausted => 429,
            Code::FailedPrecondition => 400,
            Code::Aborted => 409,
            Code::OutOfRange => 400,
            Code::Unimplemented => 501,
            Code::Internal => 500,
            Code::Unavailable => 503,
            Code::DataLoss => 500,
            Code::Unauthenticated => 401,
        }
    }
}

/// An RPC failure as sent to the client.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}: {message}", code.as_str())]
pub struct ConnectError {
    pub code: Code,
    pub message: String,
}

impl ConnectError {
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }

    /// The JSON error object: `{"code":"not_found","message":"..."}`. This is the whole body of
    /// a unary error response and the `error` member of an end-of-stream message.
    pub fn to_json_value(&self) -> serde_json::Value {
        serde_json::json!({ "code": self.code.as_str(), "message": self.message })
    }

    /// The body of a unary error response.
    pub fn to_unary_body(&self) -> Vec<u8> {
        self.to_json_value().to_string().into_bytes()
    }
}

/// The end-of-stream message body: `{}` on success, `{"error":{...}}` on failure.
pub fn end_stream_body(error: Option<&ConnectError>) -> Vec<u8> {
    match error {
        None => b"{}".to_vec(),
        Some(e) => serde_json::json!({ "error": e.to_json_value() })
            .to_string()
            .into_bytes(),
    }
}

/// The two message codecs Connect clients use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Codec {
    Json,
    Proto,
}

impl Codec {
    pub fn name(self) -> &'static str {
        match self {
            Codec::Json => "json",
            Codec::Proto => "proto",
        }
    }

    /// Content type of a response for this codec; streaming responses use `application/connect+*`.
    pub fn content_type(self, streaming: bool) -> &'static str {
        match (self, streaming) {
            (Codec::Json, false) => "application/json",
            (Codec::Proto, false) => "application/proto",
            (Codec::Json, true) => "application/connect+json",
            (Codec::Proto, true) => "application/connect+proto",
        }
    }

    pub fn encode<M: prost::Message + Serialize>(self, message: &M) -> Vec<u8> {
        match self {
            Codec::Proto => message.encode_to_vec(),
            // Serializing generated messages into a Vec cannot fail: no maps with non-string
            // keys, no I/O errors.
            Codec::Json => serde_json::to_vec(message).unwrap_or_else(|_| b"{}".to_vec()),
        }
    }

    pub fn decode<M: prost::Message + DeserializeOwned + Default>(
        self,
        bytes: &[u8],
    ) -> Result<M, ProtocolError> {
        match self {
            Codec::Proto => Ok(M::decode(bytes)?),
            // An empty unary JSON body means the empty message, as connect-go accepts.
            Codec::Json if bytes.iter().all(u8::is_ascii_whitespace) => Ok(M::default()),
            Codec::Json => Ok(serde_json::from_slice(bytes)?),
        }
    }
}

/// What a request's `Content-Type` says about the call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestKind {
    pub codec: Codec,
    /// `application/connect+*`: the body is enveloped (client- or server-streaming call).
    pub streaming: bool,
}

/// Parses a request content type (`application/json`, `application/proto`,
/// `application/connect+json`, `application/connect+proto`, optional `; charset=...`).
pub fn parse_content_type(value: &str) -> Option<RequestKind> {
    let essence = value.split(';').next()?.trim().to_ascii_lowercase();
    let (streaming, codec) = match essence.strip_prefix("application/connect+") {
        Some(rest) => (true, rest.to_string()),
        None => (false, essence.strip_prefix("application/")?.to_string()),
    };
    let codec = match codec.as_str() {
        "json" => Codec::Json,
        "proto" | "protobuf" => Codec::Proto,
        _ => return None,
    };
    Some(RequestKind { codec, streaming })
}

/// Parses `Connect-Timeout-Ms` (at most 10 digits per the spec); `None` when absent or invalid.
pub fn parse_timeout_ms(value: &str) -> Option<u64> {
    let value = value.trim();
    if value.is_empty() || value.len() > 10 || !value.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    value.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::envd::process::{ListRequest, ProcessSelector, SendSignalRequest};

    #[test]
    fn content_types_are_recognised() {
        assert_eq!(
            parse_content_type("application/json; charset=utf-8"),
            Some(RequestKind {
                codec: Codec::Json,
                streaming: false
            })
        );
        assert_eq!(
            parse_content_type("application/connect+proto"),
            Some(RequestKind {
                codec: Codec::Proto,
                streaming: true
            })
        );
        assert_eq!(parse_content_type("text/plain"), None);
        assert_eq!(parse_content_type("application/xml"), None);
    }

    #[test]
    fn both_codecs_round_trip() {
        let msg = SendSignalRequest {
            process: Some(ProcessSelector {
                selector: Some(crate::envd::process::process_selector::Selector::Pid(42)),
            }),
            signal: 9,
        };
        for codec in [Codec::Json, Codec::Proto] {
            let bytes = codec.encode(&msg);
            let back: SendSignalRequest = codec.decode(&bytes).unwrap();
            assert_eq!(back, msg);
        }
        let json = String::from_utf8(Codec::Json.encode(&msg)).unwrap();
        assert_eq!(json, r#"{"process":{"pid":42},"signal":"SIGNAL_SIGKILL"}"#);
    }

    #[test]
    fn malformed_bodies_are_errors_not_panics() {
        assert!(Codec::Json
            .decode::<SendSignalRequest>(b"{not json")
            .is_err());
        assert!(Codec::Json
            .decode::<SendSignalRequest>(br#"{"signal":"SIGNAL_NOPE"}"#)
            .is_err());
        assert!(Codec::Proto
            .decode::<SendSignalRequest>(&[0xff, 0xff, 0xff])
            .is_err());
        let empty: ListRequest = Codec::Json.decode(b"").unwrap();
        assert_eq!(empty, ListRequest {});
    }

    #[test]
    fn errors_serialise_as_connect_json() {
        let e = ConnectError::new(Code::NotFound, "process with pid 7 not found");
        assert_eq!(
            String::from_utf8(e.to_unary_body()).unwrap(),
            r#"{"code":"not_found","message":"process with pid 7 not found"}"#
        );
        assert_eq!(Code::NotFound.http_status(), 404);
        assert_eq!(end_stream_body(None), b"{}");
        let end: serde_json::Value = serde_json::from_slice(&end_stream_body(Some(&e))).unwrap();
        assert_eq!(end["error"]["code"], "not_found");
    }

    #[test]
    fn timeouts_parse_strictly() {
        assert_eq!(parse_timeout_ms("1500"), Some(1500));
        assert_eq!(parse_timeout_ms(""), None);
        assert_eq!(parse_timeout_ms("-1"), None);
        assert_eq!(parse_timeout_ms("12345678901"), None);
    }
}
