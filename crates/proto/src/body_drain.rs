//! Reading what is left of a request body after an error answer.
//!
//! An HTTP/1.1 server that answers before it has read the request body (a 401 from an auth
//! check, a 400 from a header check) makes hyper look for the rest of the body once, without
//! waiting, and close the connection if it is not there yet. Closing a socket that still has
//! unread data in it sends a reset, so a client that is still writing its body sees "broken
//! pipe" or "connection reset" instead of the answer meant for it. [`share`] keeps a second
//! handle on the body so the server can read the remainder (bounded in bytes and time) before
//! the answer goes out; the connection then stays open and the client reads its 401.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use http_body::{Body, Frame, SizeHint};

/// At most this much of an unread body is read after an error answer; a larger one still ends
/// with the connection closed, as before.
pub const DRAIN_LIMIT: u64 = 1 << 20;
/// And for at most this long.
pub const DRAIN_TIME: Duration = Duration::from_secs(2);

/// The body the handler reads; it shares the underlying body with a [`Remainder`].
pub struct SharedBody<B> {
    inner: Arc<Mutex<B>>,
}

/// The server's handle on whatever the handler did not read.
pub struct Remainder<B> {
    inner: Arc<Mutex<B>>,
}

/// Splits `body` into the handle given to the handler and the one kept for draining.
pub fn share<B>(body: B) -> (SharedBody<B>, Remainder<B>) {
    let inner = Arc::new(Mutex::new(body));
    (
        SharedBody {
            inner: inner.clone(),
        },
        Remainder { inner },
    )
}

/// What polling a body for its next frame gives.
type NextFrame<B> = Poll<Option<Result<Frame<<B as Body>::Data>, <B as Body>::Error>>>;

fn poll_locked<B: Body + Unpin>(inner: &Mutex<B>, cx: &mut Context<'_>) -> NextFrame<B> {
    let mut body = inner.lock().unwrap_or_else(|p| p.into_inner());
    Pin::new(&mut *body).poll_frame(cx)
}

impl<B: Body + Unpin> Body for SharedBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> NextFrame<B> {
        poll_locked(&self.inner, cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .size_hint()
    }
}

/// Runs `handle` on `request` and, when its answer is an error (4xx or 5xx) on an HTTP/1
/// connection, reads what the handler left of the request body before the answer is returned.
/// (HTTP/2 ends a half-read stream on its own, without touching the connection.)
pub async fn drain_after_error<B, R, F, Fut>(
    request: http::Request<B>,
    handle: F,
) -> http::Response<R>
where
    B: Body + Unpin,
    F: FnOnce(http::Request<SharedBody<B>>) -> Fut,
    Fut: std::future::Future<Output = http::Response<R>>,
{
    let http1 = request.version() < http::Version::HTTP_2;
    let (parts, body) = request.into_parts();
    let (body, rest) = share(body);
    let response = handle(http::Request::from_parts(parts, body)).await;
    if http1 && (response.status().is_client_error() || response.status().is_server_error()) {
        rest.drain().await;
    }
    response
}

impl<B: Body + Unpin> Remainder<B> {
    /// Reads and drops what is left of the body, up to [`DRAIN_LIMIT`] bytes and [`DRAIN_TIME`].
    /// Returns whether the body was read to its end.
    pub async fn drain(self) -> bool {
        self.drain_bounded(DRAIN_LIMIT, DRAIN_TIME).await
    }

    /// [`Remainder::drain`] with explicit bounds.
    pub async fn drain_bounded(self, limit: u64, within: Duration) -> bool {
        let reading = async {
            let mut read = 0u64;
            loop {
                let frame = std::future::poll_fn(|cx| poll_locked(&self.inner, cx)).await;
                match frame {
                    None => return true,
                    Some(Err(_)) => return false,
                    Some(Ok(frame)) => {
                        if let Some(data) = frame.data_ref() {
                            read += bytes::Buf::remaining(data) as u64;
                            if read > limit {
                                return false;
                            }
                        }
                    }
                }
            }
        };
        let done = {
            let body = self.inner.lock().unwrap_or_else(|p| p.into_inner());
            body.is_end_stream()
        };
        if done {
            return true;
        }
        tokio::time::timeout(within, reading).await.unwrap_or(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use http_body_util::BodyExt;
    use std::convert::Infallible;
    use tokio::sync::mpsc;

    /// A body whose chunks arrive when the test sends them; it ends when the sender is dropped.
    struct Fed(mpsc::UnboundedReceiver<Bytes>);

    impl Body for Fed {
        type Data = Bytes;
        type Error = Infallible;
        fn poll_frame(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
            self.0.poll_recv(cx).map(|c| c.map(|c| Ok(Frame::data(c))))
        }
    }

    fn fed() -> (mpsc::UnboundedSender<Bytes>, Fed) {
        let (tx, rx) = mpsc::unbounded_channel();
        (tx, Fed(rx))
    }

    #[tokio::test]
    async fn the_remainder_is_what_the_handler_left_and_waits_for_late_chunks() {
        let (tx, body) = fed();
        let (mut handler_body, rest) = share(body);
        tx.send(Bytes::from_static(b"first")).unwrap();
        let first = handler_body
            .frame()
            .await
            .unwrap()
            .unwrap()
            .into_data()
            .unwrap();
        assert_eq!(first, "first");
        drop(handler_body);
        let late = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            tx.send(Bytes::from_static(b"late")).unwrap();
        });
        assert!(rest.drain_bounded(1024, Duration::from_secs(5)).await);
        late.await.unwrap();
    }

    #[tokio::test]
    async fn draining_stops_at_the_byte_limit_and_the_time_limit() {
        let (tx, body) = fed();
        let (_handler_body, rest) = share(body);
        tx.send(Bytes::from(vec![0u8; 100])).unwrap();
        tx.send(Bytes::from(vec![0u8; 100])).unwrap();
        assert!(!rest.drain_bounded(150, Duration::from_secs(5)).await);

        let (_tx, body) = fed();
        let (_handler_body, rest) = share(body);
        assert!(!rest.drain_bounded(150, Duration::from_millis(20)).await);
    }

    #[tokio::test]
    async fn an_ended_body_needs_no_reading() {
        let (_handler_body, rest) = share(http_body_util::Empty::<Bytes>::new());
        assert!(rest.drain_bounded(0, Duration::ZERO).await);
    }
}
