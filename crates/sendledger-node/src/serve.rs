//! One HTTP/1.1 listener's accept loop, shared by the admin endpoint and the front door: a
//! cap on open connections (more are closed as soon as they are accepted, with a warning at
//! most every [`REFUSED_WARNING_EVERY`]), and a connection that sends no request for the idle
//! timeout (new, or kept alive after an answer), or does not complete a request's head within
//! the header timeout of its first byte, is closed. With TLS, the handshake must complete
//! within the header timeout too; a client's certificate (mutual TLS) is handed to the routes
//! as a [`PeerCertificate`] extension of each request.

use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::Duration;

use axum::Router;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;
use tower::ServiceExt;

use crate::tls::PeerCertificate;

/// Connections refused for the connection limit are reported at most this often.
pub const REFUSED_WARNING_EVERY: Duration = Duration::from_secs(10);

/// What bounds the connections of one listener.
pub struct Limits {
    /// Who serves (`admin endpoint`, `front door`) and the setting that raises the cap, for
    /// log lines.
    pub what: &'static str,
    pub setting: &'static str,
    pub connections: Arc<Semaphore>,
    pub max_connections: usize,
    pub idle_timeout: Duration,
    pub header_read_timeout: Duration,
    /// TLS, when the listener speaks it.
    pub tls: Option<TlsAcceptor>,
}

/// Binds `listen`: the listener and the address it got (a port 0 is chosen by the system).
pub async fn bind(
    listen: std::net::SocketAddr,
) -> crate::error::Result<(TcpListener, std::net::SocketAddr)> {
    let bind = |source| crate::error::Error::Bind {
        addr: listen,
        source,
    };
    let listener = TcpListener::bind(listen).await.map_err(bind)?;
    let addr = listener.local_addr().map_err(bind)?;
    Ok((listener, addr))
}

impl Limits {
    /// At most `max_connections` open at once, with these timeouts.
    pub fn new(
        what: &'static str,
        setting: &'static str,
        max_connections: usize,
        idle_timeout: Duration,
        header_read_timeout: Duration,
    ) -> Limits {
        Limits {
            what,
            setting,
            connections: Arc::new(Semaphore::new(max_connections)),
            max_connections,
            idle_timeout,
            header_read_timeout,
            tls: None,
        }
    }

    /// These limits on a listener that speaks TLS with `acceptor`.
    pub fn with_tls(mut self, acceptor: Option<TlsAcceptor>) -> Limits {
        self.tls = acceptor;
        self
    }
}

/// Accepts connections on `listener` and serves `router` on each, within `limits`, until
/// `stopped` turns true (open connections are closed then).
pub async fn accept_loop(
    listener: TcpListener,
    router: Router,
    limits: Limits,
    mut stopped: watch::Receiver<bool>,
) {
    let what = limits.what;
    // Connections refused since the last warning, and when that was.
    let mut refused = 0u64;
    let mut warned_at: Option<Instant> = None;
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = stopped.wait_for(|s| *s) => return,
        };
        let stream = match accepted {
            // An answer is one write: sent at once, not held back for more (Nagle).
            Ok((stream, _)) => {
                let _ = stream.set_nodelay(true);
                stream
            }
            Err(e) => {
                tracing::warn!(error = %e, "{what}: accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(permit) = limits.connections.clone().try_acquire_owned() else {
            drop(stream);
            refused += 1;
            if warned_at.is_none_or(|at| at.elapsed() >= REFUSED_WARNING_EVERY) {
                tracing::warn!(
                    max_connections = limits.max_connections,
                    refused,
                    "{what}: connection limit reached; new connections are closed (raise {} if this is legitimate)",
                    limits.setting
                );
                warned_at = Some(Instant::now());
                refused = 0;
            }
            continue;
        };
        let (router, stopped) = (router.clone(), stopped.clone());
        let (idle, head) = (limits.idle_timeout, limits.header_read_timeout);
        let tls = limits.tls.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let Some(acceptor) = tls else {
                return serve(stream, None, router, (idle, head), stopped, what).await;
            };
            let stream = match tokio::time::timeout(head, acceptor.accept(stream)).await {
                Ok(Ok(stream)) => stream,
                Ok(Err(e)) => {
                    tracing::debug!(error = %e, "{what}: tls handshake failed");
                    return;
                }
                Err(_) => {
                    tracing::debug!("{what}: tls handshake not complete in time");
                    return;
                }
            };
            let peer = (stream.get_ref().1.peer_certificates())
                .and_then(|chain| chain.first())
                .map(|leaf| PeerCertificate(crate::credentials::sha256(leaf.as_ref())));
            serve(stream, peer, router, (idle, head), stopped, what).await
        });
    }
}

/// Serves HTTP/1.1 on one connection until it ends, stalls (`timeouts`: idle, head) or the
/// listener stops; `peer` is added to every request.
async fn serve<S>(
    stream: S,
    peer: Option<PeerCertificate>,
    router: Router,
    (idle, head): (Duration, Duration),
    mut stopped: watch::Receiver<bool>,
    what: &'static str,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let wait = Arc::new(Mutex::new(Wait::request()));
    let service = {
        let wait = wait.clone();
        service_fn(move |mut req: http::Request<hyper::body::Incoming>| {
            let (router, wait) = (router.clone(), wait.clone());
            if let Some(peer) = peer {
                req.extensions_mut().insert(peer);
            }
            async move {
                set_wait(&wait, Wait::Serving);
                let response = router.oneshot(req).await;
                set_wait(&wait, Wait::request());
                response
            }
        })
    };
    let io = TokioIo::new(Watched {
        stream,
        wait: wait.clone(),
    });
    let conn = http1::Builder::new().serve_connection(io, service);
    tokio::select! {
        result = conn => if let Err(e) = result {
            tracing::debug!(error = %e, "{what}: connection ended with an error");
        },
        _ = close_when_stalled(&wait, idle, head) => {
            tracing::debug!("{what}: closing a connection that sent no complete request in time");
        }
        _ = stopped.wait_for(|s| *s) => {}
    }
}

/// What a connection is waiting for.
#[derive(Debug, Clone, Copy)]
enum Wait {
    /// A request, since `since` (opened, or the previous answer given); `first_byte` once it
    /// has begun to arrive.
    Request {
        since: Instant,
        first_byte: Option<Instant>,
    },
    /// Its request is being answered.
    Serving,
}

impl Wait {
    /// Waiting for a request from now on.
    fn request() -> Wait {
        Wait::Request {
            since: Instant::now(),
            first_byte: None,
        }
    }
}

fn set_wait(wait: &Mutex<Wait>, to: Wait) {
    *wait.lock().unwrap_or_else(|p| p.into_inner()) = to;
}

/// Returns when the connection has waited too long for a request: `idle` for its first byte,
/// `head` from its first byte on. Never while a request is being answered.
async fn close_when_stalled(wait: &Mutex<Wait>, idle: Duration, head: Duration) {
    loop {
        let state = *wait.lock().unwrap_or_else(|p| p.into_inner());
        let deadline = match state {
            Wait::Request {
                first_byte: Some(at),
                ..
            } => at + head,
            Wait::Request { since, .. } => since + idle,
            // Looked at again later: the answer resets the wait.
            Wait::Serving => Instant::now() + idle.min(head),
        };
        if !matches!(state, Wait::Serving) && deadline <= Instant::now() {
            return;
        }
        tokio::time::sleep_until(deadline).await;
    }
}

/// A connection's stream that notes when a request's first byte arrives.
struct Watched<S> {
    stream: S,
    wait: Arc<Mutex<Wait>>,
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let result = Pin::new(&mut self.stream).poll_read(cx, buf);
        if buf.filled().len() > before {
            let mut wait = self.wait.lock().unwrap_or_else(|p| p.into_inner());
            if let Wait::Request {
                first_byte: first_byte @ None,
                ..
            } = &mut *wait
            {
                *first_byte = Some(Instant::now());
            }
        }
        result
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Watched<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}
