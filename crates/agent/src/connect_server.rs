//! Serving Connect RPCs over axum: `POST /<package.Service>/<Method>` with unary, server-streaming
//! and client-streaming bodies, in JSON or binary proto, as the e2b SDK's connectrpc client
//! sends them. Framing, codecs and error encoding come from `warren_proto::connect`.

// Early exits carry the finished HTTP response; boxing it would only add noise.
#![allow(clippy::result_large_err)]

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use axum::body::Body;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures_util::{Stream, StreamExt};
use http_body_util::BodyExt;
use serde::de::DeserializeOwned;
use serde::Serialize;
use warren_proto::connect::{
    encode_envelope, end_stream_body, parse_content_type, parse_timeout_ms, Code, Codec,
    ConnectError, EnvelopeDecoder, RequestKind, FLAG_END_STREAM,
};

/// Largest single request message we accept (uploads go over `/files`, not RPC).
pub const MAX_MESSAGE_BYTES: usize = 16 << 20;

/// A server stream of typed messages; an `Err` item ends the stream with that error.
pub type MessageStream<M> = Pin<Box<dyn Stream<Item = Result<M, ConnectError>> + Send>>;

/// Per-call facts handlers need.
#[derive(Debug, Clone)]
pub struct CallContext {
    pub headers: HeaderMap,
    pub codec: Codec,
    /// From `Connect-Timeout-Ms`.
    pub timeout: Option<Duration>,
}

impl CallContext {
    /// Interval for keepalive messages on long streams (`Keepalive-Ping-Interval`, seconds).
    pub fn keepalive_interval(&self) -> Duration {
        self.headers
            .get("keepalive-ping-interval")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
            .filter(|s| *s > 0)
            .map(Duration::from_secs)
            .unwrap_or(Duration::from_secs(90))
    }
}

/// Reads the call's content type and timeout; `Err` is the response to send.
pub fn call_context(headers: &HeaderMap) -> Result<(CallContext, RequestKind), Response> {
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let Some(kind) = parse_content_type(content_type) else {
        let mut response = unary_error(&ConnectError::new(
            Code::Unknown,
            format!("unsupported content type '{content_type}'"),
        ));
        *response.status_mut() = StatusCode::UNSUPPORTED_MEDIA_TYPE;
        response.headers_mut().insert(
            "accept-post",
            HeaderValue::from_static(
                "application/json, application/proto, application/connect+json, application/connect+proto",
            ),
        );
        return Err(response);
    };
    if let Some(v) = headers.get("connect-protocol-version") {
        if v.as_bytes() != b"1" {
            return Err(unary_error(&ConnectError::new(
                Code::InvalidArgument,
                "connect-protocol-version must be 1",
            )));
        }
    }
    let timeout = headers
        .get("connect-timeout-ms")
        .and_then(|v| v.to_str().ok())
        .and_then(parse_timeout_ms)
        .map(Duration::from_millis);
    Ok((
        CallContext {
            headers: headers.clone(),
            codec: kind.codec,
            timeout,
        },
        kind,
    ))
}

/// A unary error response: HTTP status from the code, JSON body.
pub fn unary_error(error: &ConnectError) -> Response {
    let status =
        StatusCode::from_u16(error.code.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        error.to_unary_body(),
    )
        .into_response()
}

/// The answer to a path that names no RPC.
pub fn unknown_procedure(path: &str) -> Response {
    let mut response = unary_error(&ConnectError::new(
        Code::Unimplemented,
        format!("unknown procedure {path}"),
    ));
    *response.status_mut() = StatusCode::NOT_FOUND;
    response
}

async fn read_body(body: Body) -> Result<Bytes, ConnectError> {
    let limited = http_body_util::Limited::new(body, MAX_MESSAGE_BYTES + 5);
    limited
        .collect()
        .await
        .map(|c| c.to_bytes())
        .map_err(|e| ConnectError::new(Code::ResourceExhausted, format!("reading request: {e}")))
}

fn decode<M: prost::Message + DeserializeOwned + Default>(
    codec: Codec,
    bytes: &[u8],
) -> Result<M, ConnectError> {
    codec
        .decode(bytes)
        .map_err(|e| ConnectError::new(Code::InvalidArgument, e.to_string()))
}

/// Decodes the single enveloped message of a server-streaming request.
fn decode_single_envelope<M: prost::Message + DeserializeOwned + Default>(
    codec: Codec,
    bytes: &[u8],
) -> Result<M, ConnectError> {
    let mut decoder = EnvelopeDecoder::new(MAX_MESSAGE_BYTES);
    decoder.push(bytes);
    let frame = decoder
        .next_frame()
        .map_err(|e| ConnectError::new(Code::InvalidArgument, e.to_string()))?
        .ok_or_else(|| ConnectError::new(Code::InvalidArgument, "missing request message"))?;
    if frame.is_end_stream() {
        return Err(ConnectError::new(
            Code::InvalidArgument,
            "unexpected end-of-stream message in request",
        ));
    }
    decode(codec, &frame.payload)
}

/// Serves a unary call.
pub async fn unary<Req, Resp, F, Fut>(
    ctx: CallContext,
    kind: RequestKind,
    body: Body,
    handler: F,
) -> Response
where
    Req: prost::Message + DeserializeOwned + Default,
    Resp: prost::Message + Serialize,
    F: FnOnce(CallContext, Req) -> Fut,
    Fut: Future<Output = Result<Resp, ConnectError>>,
{
    if kind.streaming {
        return unary_error(&ConnectError::new(
            Code::InvalidArgument,
            "unary procedure called with a streaming content type",
        ));
    }
    let codec = ctx.codec;
    let result = async {
        let bytes = read_body(body).await?;
        let request: Req = decode(codec, &bytes)?;
        handler(ctx, request).await
    }
    .await;
    match result {
        Ok(response) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, codec.content_type(false))],
            codec.encode(&response),
        )
            .into_response(),
        Err(e) => unary_error(&e),
    }
}

/// Serves a server-streaming call: one request message in, a stream of messages out, always
/// HTTP 200 with errors carried in the end-of-stream message.
pub async fn server_stream<Req, Resp, F, Fut>(
    ctx: CallContext,
    kind: RequestKind,
    body: Body,
    handler: F,
) -> Response
where
    Req: prost::Message + DeserializeOwned + Default,
    Resp: prost::Message + Serialize + 'static,
    F: FnOnce(CallContext, Req) -> Fut,
    Fut: Future<Output = Result<MessageStream<Resp>, ConnectError>>,
{
    let codec = ctx.codec;
    if !kind.streaming {
        return unary_error(&ConnectError::new(
            Code::InvalidArgument,
            "streaming procedure called with a unary content type",
        ));
    }
    let opened = async {
        let bytes = read_body(body).await?;
        let request: Req = decode_single_envelope(codec, &bytes)?;
        handler(ctx, request).await
    }
    .await;
    let messages = match opened {
        Ok(stream) => stream,
        Err(e) => futures_util::stream::once(async move { Err(e) }).boxed(),
    };
    stream_response(codec, messages)
}

/// Serves a client-streaming call: the handler gets a stream of decoded request messages.
pub async fn client_stream<Req, Resp, F, Fut>(
    ctx: CallContext,
    kind: RequestKind,
    body: Body,
    handler: F,
) -> Response
where
    Req: prost::Message + DeserializeOwned + Default + Send + 'static,
    Resp: prost::Message + Serialize + 'static,
    F: FnOnce(CallContext, MessageStream<Req>) -> Fut,
    Fut: Future<Output = Result<Resp, ConnectError>>,
{
    let codec = ctx.codec;
    if !kind.streaming {
        return unary_error(&ConnectError::new(
            Code::InvalidArgument,
            "streaming procedure called with a unary content type",
        ));
    }
    let requests = request_stream::<Req>(codec, body);
    let result = handler(ctx, requests).await;
    let item = futures_util::stream::once(async move { result });
    stream_response(codec, item.boxed())
}

/// Decodes an enveloped request body into messages as bytes arrive.
fn request_stream<Req>(codec: Codec, body: Body) -> MessageStream<Req>
where
    Req: prost::Message + DeserializeOwned + Default + Send + 'static,
{
    let state = (
        body.into_data_stream(),
        EnvelopeDecoder::new(MAX_MESSAGE_BYTES),
        false,
    );
    futures_util::stream::unfold(state, move |(mut body, mut decoder, done)| async move {
        if done {
            return None;
        }
        loop {
            match decoder.next_frame() {
                Err(e) => {
                    let err = ConnectError::new(Code::InvalidArgument, e.to_string());
                    return Some((Err(err), (body, decoder, true)));
                }
                Ok(Some(frame)) if frame.is_end_stream() => return None,
                Ok(Some(frame)) => {
                    let item = decode::<Req>(codec, &frame.payload);
                    let stop = item.is_err();
                    return Some((item, (body, decoder, stop)));
                }
                Ok(None) => {}
            }
            match body.next().await {
                Some(Ok(chunk)) => decoder.push(&chunk),
                Some(Err(e)) => {
                    let err = ConnectError::new(Code::Canceled, format!("reading request: {e}"));
                    return Some((Err(err), (body, decoder, true)));
                }
                None if decoder.pending_bytes() > 0 => {
                    let err = ConnectError::new(Code::InvalidArgument, "truncated request message");
                    return Some((Err(err), (body, decoder, true)));
                }
                None => return None,
            }
        }
    })
    .boxed()
}

/// Turns typed messages into an enveloped `application/connect+*` body ending with the
/// end-of-stream message.
fn stream_response<Resp>(codec: Codec, messages: MessageStream<Resp>) -> Response
where
    Resp: prost::Message + Serialize + 'static,
{
    let body = futures_util::stream::unfold(Some(messages), move |state| async move {
        let mut messages = state?;
        match messages.next().await {
            Some(Ok(m)) => Some((
                Ok::<_, std::convert::Infallible>(Bytes::from(encode_envelope(
                    0,
                    &codec.encode(&m),
                ))),
                Some(messages),
            )),
            Some(Err(e)) => Some((
                Ok(Bytes::from(encode_envelope(
                    FLAG_END_STREAM,
                    &end_stream_body(Some(&e)),
                ))),
                None,
            )),
            None => Some((
                Ok(Bytes::from(encode_envelope(
                    FLAG_END_STREAM,
                    &end_stream_body(None),
                ))),
                None,
            )),
        }
    });
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, codec.content_type(true))],
        Body::from_stream(body),
    )
        .into_response()
}
