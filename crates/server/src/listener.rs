//! One accept loop for the API and the proxy: plain TCP or TLS (see `tls`), HTTP/1.1 with upgrades
//! and HTTP/2 on each connection, and a graceful stop that lets in-flight requests finish.

use std::convert::Infallible;
use std::time::Duration;

use axum::body::Body;
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;

/// How long a client may take over its TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Accept on `listener` until `shutdown` turns true, serving each connection with `service`; then
/// wait up to `drain` for open connections to finish (`None`: leave them be).
pub async fn serve<S, F>(
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    service: S,
    mut shutdown: watch::Receiver<bool>,
    drain: Option<Duration>,
    what: &'static str,
) where
    S: Fn(Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: std::future::Future<Output = Response<Body>> + Send + 'static,
{
    let graceful = GracefulShutdown::new();
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = shutdown.wait_for(|stop| *stop) => break,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(error) => {
                tracing::warn!(%error, what, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let service = service.clone();
        let hyper_service = hyper::service::service_fn(move |request| {
            let response = service(request);
            async move { Ok::<_, Infallible>(response.await) }
        });
        let watcher = drain.map(|_| graceful.watcher());
        let tls = tls.clone();
        tokio::spawn(async move {
            let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            let result =
                match tls {
                    None => {
                        let connection = builder
                            .serve_connection_with_upgrades(TokioIo::new(stream), hyper_service)
                            .into_owned();
                        match watcher {
                            Some(watcher) => watcher.watch(connection).await,
                            None => connection.await,
                        }
                    }
                    Some(acceptor) => {
                        let stream =
                            match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream))
                                .await
                            {
                                Ok(Ok(stream)) => stream,
                                Ok(Err(error)) => {
                                    tracing::debug!(%peer, %error, what, "TLS handshake failed");
                                    return;
                                }
                                Err(_) => {
                                    tracing::debug!(%peer, what, "TLS handshake timed out");
                                    return;
                                }
                            };
                        let connection = builder
                            .serve_connection_with_upgrades(TokioIo::new(stream), hyper_service)
                            .into_owned();
                        match watcher {
                            Some(watcher) => watcher.watch(connection).await,
                            None => connection.await,
                        }
                    }
                };
            if let Err(error) = result {
                tracing::debug!(%peer, %error, what, "connection ended with an error");
            }
        });
    }
    drop(listener);
    let Some(drain) = drain else { return };
    if tokio::time::timeout(drain, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!(what, "connections still open after the drain timeout");
    }
}
