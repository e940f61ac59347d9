//! HTTP/1.1 exchanges, over TCP or TLS, that know whether any byte of the request may have
//! left this process.
//!
//! Every connection's byte stream is wrapped in [`Tracked`], which counts the bytes of HTTP
//! (the request) accepted for writing. An exchange that fails is classified by that count,
//! read only after the connection's task has been stopped, so no byte can be written after
//! the count was taken: zero bytes means the request certainly did not leave this process.
//!
//! Over http, `Tracked` wraps the [`TcpStream`] and counts the bytes the kernel accepted.
//! Over https, it wraps the TLS stream **after** the handshake completed, and counts the
//! plaintext bytes handed to rustls. Why that is sound:
//! - the handshake writes bytes of its own (ClientHello, key exchange, client certificate,
//!   Finished), none of which carries the request. Counting them would make every handshake
//!   failure (an unknown CA, a wrong host name, an expired certificate, a remote that does not
//!   speak TLS) an unknown outcome, when no request could exist at the remote. They are not
//!   counted, because the wrapper is only put in place once the handshake is over;
//! - a completed handshake proves nothing about the request either way: it is what happens
//!   next that counts;
//! - plaintext that rustls accepted may already be encrypted and on the wire (rustls writes
//!   records to the socket as it can), so any accepted byte counts as written. This may count
//!   bytes still buffered in rustls when the connection failed; that errs towards unknown,
//!   which is safe. The other way round cannot happen: the remote can only receive request
//!   bytes as application data records, which are made from plaintext rustls accepted;
//! - a write to the TLS stream can fail after part of it reached the socket: tokio-rustls
//!   hands the plaintext to rustls, writes the records to the socket, and when a later socket
//!   write in the same call fails (the remote reset the connection meanwhile) it returns the
//!   error and not the count. So the socket under TLS is counted too ([`Wire`]), and a failed
//!   write during which the socket accepted bytes counts as written;
//! - early data (TLS 1.3 0-RTT, which would send request bytes during the handshake) is never
//!   enabled.
//!
//! An exchange may carry a **first-byte deadline** (kafka mode's send lease): `Tracked` refuses
//! the request's first write once it has passed, so the request either starts leaving before
//! the deadline or never does. The check sits at the last point this process controls, right
//! before the bytes are handed to the kernel (or to rustls), so a stall anywhere before it —
//! a paused process, a slow connect, a long wait for the pool — cannot send late.

use std::collections::HashMap;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Request, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::resolve::Resolver;
use crate::tls::Tls;

/// Largest response body read; the rest of a larger one is treated as unreadable.
pub(crate) const MAX_RESPONSE_BYTES: usize = 1024 * 1024;

/// Idle connections kept per remote address.
const MAX_IDLE_PER_ADDRESS: usize = 256;

/// A byte stream (TCP, or TLS after its handshake) that counts the bytes written to it.
struct Tracked<S> {
    stream: S,
    written: Arc<AtomicU64>,
    first_byte: Arc<FirstByte>,
    /// Under TLS: the bytes the socket beneath accepted ([`Wire`]'s count).
    wire: Option<Arc<AtomicU64>>,
}

/// The socket under a TLS stream, counting the bytes the kernel accepted (handshake, records,
/// alerts). [`Tracked`] compares the count before and after each write it passes to TLS.
struct Wire<S> {
    stream: S,
    sent: Arc<AtomicU64>,
}

impl<S: AsyncRead + Unpin> AsyncRead for Wire<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Wire<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let result = Pin::new(&mut self.stream).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = result {
            self.sent.fetch_add(n as u64, Ordering::SeqCst);
        }
        result
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let result = Pin::new(&mut self.stream).poll_write_vectored(cx, bufs);
        if let Poll::Ready(Ok(n)) = result {
            self.sent.fetch_add(n as u64, Ordering::SeqCst);
        }
        result
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

/// The first-byte deadline of the exchange under way on a connection, if it has one.
#[derive(Default)]
struct FirstByte(Mutex<Deadline>);

#[derive(Default, Clone, Copy, PartialEq, Eq)]
enum Deadline {
    /// No deadline, or the first byte already left in time.
    #[default]
    None,
    /// The request's first byte must be written before this instant.
    Before(std::time::Instant),
    /// It was not: the write was refused and nothing of the request was written.
    Missed,
}

impl FirstByte {
    fn set(&self, deadline: Deadline) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = deadline;
    }

    fn get(&self) -> Deadline {
        *self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl<S> Tracked<S> {
    /// Refuses a write once the first-byte deadline has passed (and every write after that).
    fn check(&self) -> Option<io::Error> {
        let mut deadline = self.first_byte.0.lock().unwrap_or_else(|p| p.into_inner());
        match *deadline {
            Deadline::None => None,
            Deadline::Before(at) if std::time::Instant::now() < at => None,
            Deadline::Before(_) | Deadline::Missed => {
                *deadline = Deadline::Missed;
                Some(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "first-byte deadline passed",
                ))
            }
        }
    }

    /// The socket's count under TLS, taken before a write.
    fn wire_sent(&self) -> u64 {
        self.wire.as_ref().map_or(0, |w| w.load(Ordering::SeqCst))
    }

    /// Counts a write's result. A failed write counts too when the socket beneath TLS accepted
    /// bytes during it (`wire_before` is the socket's count before the write): records made
    /// from its plaintext may have left before the failure.
    fn count(&self, result: &Poll<io::Result<usize>>, wire_before: u64) {
        let n = match result {
            Poll::Ready(Ok(n)) => *n as u64,
            Poll::Ready(Err(_)) => self.wire_sent().saturating_sub(wire_before),
            Poll::Pending => 0,
        };
        if n > 0 {
            self.written.fetch_add(n, Ordering::SeqCst);
            // Started in time: the rest of the request may follow.
            self.first_byte.set(Deadline::None);
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Tracked<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Tracked<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if let Some(refused) = self.check() {
            return Poll::Ready(Err(refused));
        }
        let wire_before = self.wire_sent();
        let result = Pin::new(&mut self.stream).poll_write(cx, buf);
        self.count(&result, wire_before);
        result
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        if let Some(refused) = self.check() {
            return Poll::Ready(Err(refused));
        }
        let wire_before = self.wire_sent();
        let result = Pin::new(&mut self.stream).poll_write_vectored(cx, bufs);
        self.count(&result, wire_before);
        result
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

/// A connection's task, stopped when dropped.
struct TaskGuard(Option<JoinHandle<()>>);

impl Drop for TaskGuard {
    fn drop(&mut self) {
        if let Some(task) = &self.0 {
            task.abort();
        }
    }
}

/// One HTTP/1.1 client connection. Dropping it stops its task and closes the socket.
struct Conn {
    sender: SendRequest<Full<Bytes>>,
    written: Arc<AtomicU64>,
    first_byte: Arc<FirstByte>,
    task: TaskGuard,
    idle_since: Instant,
}

impl Conn {
    /// Stops the connection and waits until its task is gone: after this no byte of it can be
    /// written any more. Returns the bytes written in all.
    async fn stop(mut self) -> u64 {
        if let Some(task) = self.task.0.take() {
            task.abort();
            let _ = task.await;
        }
        self.written.load(Ordering::SeqCst)
    }

    /// Open as far as this process knows: the connection's task still runs. It may not be
    /// ready for the next request yet (right after an answer, until its task has been polled
    /// again); the exchange waits for that (`ready`), and a connection that closed meanwhile
    /// fails it with nothing written.
    fn is_usable(&self) -> bool {
        !self.sender.is_closed() && self.task.0.as_ref().is_some_and(|t| !t.is_finished())
    }
}

/// The answer to an exchange.
pub(crate) struct Answer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    /// The body, or why it could not be read (the status still counts).
    pub body: Result<Bytes, String>,
}

/// Why an exchange got no answer, by what it proves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Failure {
    /// No byte of the request was written: it certainly did not reach the remote.
    NotWritten(String),
    /// Nothing was written because this process ran out of file descriptors.
    Local(String),
    /// Nothing was written because the first-byte deadline passed first, `by` this much when
    /// it was noticed.
    Late { by: Duration },
    /// The request was (at least partly) written and no answer came in time.
    TimedOut,
    /// The request was (at least partly) written and the connection failed.
    Broken(String),
}

/// Where and how to connect.
#[derive(Debug, Clone)]
pub(crate) struct Endpoint {
    /// `host:port`, as written in the URL (looked up on each new connection, see
    /// [`Resolver`]).
    pub address: String,
    /// Set for https: the handshake's settings and the name the certificate must be valid for.
    pub tls: Option<Tls>,
    pub connect_timeout: Duration,
    pub request_timeout: Duration,
    pub pool_idle_timeout: Duration,
}

impl Endpoint {
    /// Connections to the same address are kept apart by scheme.
    fn pool_key(&self) -> (bool, &str) {
        (self.tls.is_some(), &self.address)
    }
}

/// Idle connections by scheme and address.
#[derive(Default)]
pub(crate) struct Pool {
    idle: Mutex<HashMap<(bool, String), Vec<Conn>>>,
    resolver: Resolver,
}

/// A connection opened (or taken from the pool) before an attempt's intent is recorded, for
/// that attempt's exchange; or why it could not be opened (nothing was written).
pub(crate) struct Opened(Result<Conn, Failure>);

impl Pool {
    /// Takes a pooled connection to the endpoint or opens one (TCP, and for https the TLS
    /// handshake) before the attempt's intent is recorded, so that between the durable intent
    /// and the first byte there is only the write: a crash in between leaves an intent whose
    /// request never left, and less of it to reconcile.
    pub(crate) async fn open(&self, endpoint: &Endpoint) -> Opened {
        match self.take(endpoint) {
            Some(conn) => Opened(Ok(conn)),
            None => Opened(connect(endpoint, &self.resolver).await),
        }
    }

    fn take(&self, endpoint: &Endpoint) -> Option<Conn> {
        if endpoint.pool_idle_timeout.is_zero() {
            return None;
        }
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        let (tls, address) = endpoint.pool_key();
        let conns = idle.get_mut(&(tls, address.to_string()))?;
        while let Some(conn) = conns.pop() {
            if conn.idle_since.elapsed() < endpoint.pool_idle_timeout && conn.is_usable() {
                return Some(conn);
            }
            // Stale or closed: dropped (its task stops).
        }
        None
    }

    fn put(&self, endpoint: &Endpoint, mut conn: Conn) {
        if endpoint.pool_idle_timeout.is_zero() || !conn.is_usable() {
            return;
        }
        conn.idle_since = Instant::now();
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        let (tls, address) = endpoint.pool_key();
        let conns = idle.entry((tls, address.to_string())).or_default();
        if conns.len() < MAX_IDLE_PER_ADDRESS {
            conns.push(conn);
        }
    }

    /// Performs one exchange: a pooled or new connection, the request, the whole answer.
    /// With `first_byte_by`, no byte of the request is written after that instant: the
    /// exchange fails with [`Failure::Late`] instead.
    pub(crate) async fn exchange(
        &self,
        endpoint: &Endpoint,
        request: Request<Full<Bytes>>,
        first_byte_by: Option<std::time::Instant>,
    ) -> Result<Answer, Failure> {
        self.exchange_on(endpoint, None, request, first_byte_by)
            .await
    }

    /// [`Pool::exchange`] on the connection `opened` for it, when it is still open (else a
    /// pooled or new one). When it could not be opened, the exchange fails the same way
    /// without trying again: nothing was written.
    pub(crate) async fn exchange_on(
        &self,
        endpoint: &Endpoint,
        opened: Option<Opened>,
        request: Request<Full<Bytes>>,
        first_byte_by: Option<std::time::Instant>,
    ) -> Result<Answer, Failure> {
        let late = |at: std::time::Instant| Failure::Late {
            by: std::time::Instant::now().saturating_duration_since(at),
        };
        if let Some(at) = first_byte_by.filter(|at| *at <= std::time::Instant::now()) {
            return Err(late(at));
        }
        let opened = match opened {
            Some(Opened(Ok(conn))) if conn.is_usable() => Some(conn),
            Some(Opened(Err(failure))) => return Err(failure),
            _ => None,
        };
        let mut conn = match opened.or_else(|| self.take(endpoint)) {
            Some(conn) => conn,
            None => connect(endpoint, &self.resolver).await?,
        };
        conn.first_byte
            .set(first_byte_by.map_or(Deadline::None, Deadline::Before));
        let first_byte = conn.first_byte.clone();
        let before = conn.written.load(Ordering::SeqCst);
        let deadline = Instant::now() + endpoint.request_timeout;
        let sent = tokio::time::timeout_at(deadline, async {
            conn.sender.ready().await?;
            conn.sender.send_request(request).await
        })
        .await;
        let response = match sent {
            Ok(Ok(response)) => response,
            Ok(Err(e)) => {
                let written = conn.stop().await > before;
                return Err(match (written, first_byte.get(), first_byte_by) {
                    (false, Deadline::Missed, Some(at)) => late(at),
                    (false, ..) => Failure::NotWritten(describe_hyper(&e)),
                    (true, ..) => Failure::Broken(describe_hyper(&e)),
                });
            }
            Err(_elapsed) => {
                let written = conn.stop().await > before;
                return Err(if written {
                    Failure::TimedOut
                } else {
                    Failure::NotWritten(format!(
                        "no request byte could be written within {}",
                        humantime::format_duration(endpoint.request_timeout)
                    ))
                });
            }
        };
        let (parts, body) = response.into_parts();
        let body =
            tokio::time::timeout_at(deadline, Limited::new(body, MAX_RESPONSE_BYTES).collect())
                .await;
        let body = match body {
            Ok(Ok(collected)) => {
                self.put(endpoint, conn);
                Ok(collected.to_bytes())
            }
            Ok(Err(e)) => {
                drop(conn);
                Err(format!("response body unreadable: {e}"))
            }
            Err(_elapsed) => {
                drop(conn);
                Err("response body not received within the request timeout".to_string())
            }
        };
        Ok(Answer {
            status: parts.status,
            headers: parts.headers,
            body,
        })
    }
}

/// Opens a connection: TCP, then for https the TLS handshake, both within `connect_timeout`.
/// Nothing of the request has been written when this fails, so every failure is
/// [`Failure::NotWritten`] (or [`Failure::Local`]).
async fn connect(endpoint: &Endpoint, resolver: &Resolver) -> Result<Conn, Failure> {
    let address = &endpoint.address;
    let within = humantime::format_duration(endpoint.connect_timeout);
    let deadline = Instant::now() + endpoint.connect_timeout;
    let addrs = match tokio::time::timeout_at(deadline, resolver.lookup(address)).await {
        Ok(Ok(addrs)) => addrs,
        Ok(Err(e)) => return Err(connect_error(address, &e)),
        Err(_) => {
            return Err(Failure::NotWritten(format!(
                "connect to {address}: the name lookup did not answer within {within}"
            )))
        }
    };
    let stream = match tokio::time::timeout_at(deadline, TcpStream::connect(&addrs[..])).await {
        Ok(Ok(stream)) => stream,
        Ok(Err(e)) => return Err(connect_error(address, &e)),
        Err(_) => {
            return Err(Failure::NotWritten(format!(
                "connect to {address}: no connection within {within}"
            )))
        }
    };
    let _ = stream.set_nodelay(true);
    let Some(tls) = &endpoint.tls else {
        return start(address, stream, None).await;
    };
    // The handshake's own bytes are not counted: `Tracked` wraps the stream once it is over.
    // `Wire` counts beneath TLS from the start, but only its changes during a write matter.
    let sent = Arc::new(AtomicU64::new(0));
    let wire = Wire {
        stream,
        sent: sent.clone(),
    };
    let handshake = tls.connector.connect(tls.server_name.clone(), wire);
    match tokio::time::timeout_at(deadline, handshake).await {
        Ok(Ok(stream)) => start(address, stream, Some(sent)).await,
        Ok(Err(e)) => Err(Failure::NotWritten(format!(
            "tls handshake with {address}: {}",
            describe_tls(&e)
        ))),
        Err(_) => Err(Failure::NotWritten(format!(
            "tls handshake with {address}: not complete within {within}"
        ))),
    }
}

/// Starts HTTP/1.1 on a connected stream, counting what is written to it from now on (`wire`:
/// the count of the socket beneath, when `stream` is TLS).
async fn start<S>(address: &str, stream: S, wire: Option<Arc<AtomicU64>>) -> Result<Conn, Failure>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let written = Arc::new(AtomicU64::new(0));
    let first_byte = Arc::new(FirstByte::default());
    let io = TokioIo::new(Tracked {
        stream,
        written: written.clone(),
        first_byte: first_byte.clone(),
        wire,
    });
    let (sender, connection) = http1::handshake(io)
        .await
        .map_err(|e| Failure::NotWritten(format!("http handshake with {address}: {e}")))?;
    let task = tokio::spawn(async move {
        // Errors surface through the sender; nothing more to do here.
        let _ = connection.await;
    });
    Ok(Conn {
        sender,
        written,
        first_byte,
        task: TaskGuard(Some(task)),
        idle_since: Instant::now(),
    })
}

/// A failed handshake in words: the TLS error itself (an unknown issuer, a name the
/// certificate is not valid for, an expired certificate, an alert from the remote) rather
/// than the I/O error that carries it.
fn describe_tls(e: &io::Error) -> String {
    match e.get_ref() {
        Some(inner) if e.kind() == io::ErrorKind::InvalidData => inner.to_string(),
        _ => e.to_string(),
    }
}

/// Why a connection could not be opened. Running out of file descriptors (`EMFILE`, `ENFILE`)
/// is this process's problem, not the remote's: a [`Failure::Local`], told apart from a remote
/// that refuses.
fn connect_error(address: &str, e: &io::Error) -> Failure {
    match e.raw_os_error() {
        Some(libc::EMFILE | libc::ENFILE) => Failure::Local(format!(
            "connect to {address}: local resource exhaustion (out of file descriptors; raise the open-files limit): {e}"
        )),
        _ => Failure::NotWritten(format!("connect to {address}: {e}")),
    }
}

/// A hyper error with its causes, in one line (hyper errors never contain header values).
fn describe_hyper(e: &hyper::Error) -> String {
    let mut out = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    use rustls::pki_types::{PrivatePkcs8KeyDer, ServerName};
    use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

    /// How [`Breaking`] treats writes.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    enum Break {
        Intact,
        /// The next write goes through; every one after it fails with a reset.
        AfterOneWrite,
        /// Every write fails with a reset.
        Broken,
    }

    /// The client's end of an in-memory socket that can be broken: a remote that resets the
    /// connection while a write is under way.
    struct Breaking {
        inner: DuplexStream,
        state: Arc<Mutex<Break>>,
    }

    impl AsyncRead for Breaking {
        fn poll_read(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            Pin::new(&mut self.inner).poll_read(cx, buf)
        }
    }

    impl AsyncWrite for Breaking {
        fn poll_write(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            let state = *self.state.lock().unwrap();
            match state {
                Break::Intact => Pin::new(&mut self.inner).poll_write(cx, buf),
                Break::AfterOneWrite => {
                    let result = Pin::new(&mut self.inner).poll_write(cx, buf);
                    if let Poll::Ready(Ok(_)) = result {
                        *self.state.lock().unwrap() = Break::Broken;
                    }
                    result
                }
                Break::Broken => Poll::Ready(Err(io::ErrorKind::ConnectionReset.into())),
            }
        }

        fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Pin::new(&mut self.inner).poll_flush(cx)
        }

        fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Pin::new(&mut self.inner).poll_shutdown(cx)
        }
    }

    /// A TLS connection over a [`Breaking`] socket, broken as `mode` once the handshake is
    /// over; 20,000 bytes (two TLS records) are written through [`Tracked`]. Returns whether
    /// the write failed, the count `Tracked` kept, and the plaintext bytes the remote received.
    async fn write_through_breaking_tls(mode: Break) -> (bool, u64, usize) {
        let certified = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let server = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(
                vec![certified.cert.der().clone()],
                PrivatePkcs8KeyDer::from(certified.key_pair.serialize_der()).into(),
            )
            .unwrap();
        let mut roots = rustls::RootCertStore::empty();
        roots.add(certified.cert.der().clone()).unwrap();
        let client = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();

        let (client_io, server_io) = tokio::io::duplex(1 << 20);
        let (accepted, handshake_over) = tokio::sync::oneshot::channel();
        let remote = tokio::spawn(async move {
            let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(server));
            let mut tls = acceptor.accept(server_io).await.unwrap();
            accepted.send(()).unwrap();
            let mut received = 0;
            let mut buf = [0u8; 4096];
            while let Ok(n @ 1..) = tls.read(&mut buf).await {
                received += n;
            }
            received
        });
        let state = Arc::new(Mutex::new(Break::Intact));
        let sent = Arc::new(AtomicU64::new(0));
        let wire = Wire {
            stream: Breaking {
                inner: client_io,
                state: state.clone(),
            },
            sent: sent.clone(),
        };
        let tls = tokio_rustls::TlsConnector::from(Arc::new(client))
            .connect(ServerName::try_from("localhost").unwrap(), wire)
            .await
            .unwrap();
        handshake_over.await.unwrap();
        *state.lock().unwrap() = mode;
        let written = Arc::new(AtomicU64::new(0));
        let mut tracked = Tracked {
            stream: tls,
            written: written.clone(),
            first_byte: Arc::new(FirstByte::default()),
            wire: Some(sent),
        };
        let failed = tracked.write(&[b'x'; 20_000]).await.is_err();
        drop(tracked);
        let received = remote.await.unwrap();
        (failed, written.load(Ordering::SeqCst), received)
    }

    /// The remote resets the connection after the first of two TLS records of a write reached
    /// it: the write fails, and its first 16,384 bytes are at the remote. They count as written
    /// (the exchange is unknown, not "not sent").
    #[tokio::test]
    async fn a_tls_write_that_fails_after_a_record_left_counts_as_written() {
        let (failed, written, received) = write_through_breaking_tls(Break::AfterOneWrite).await;
        assert!(failed);
        assert_eq!(received, 16_384, "the first record reached the remote");
        assert!(written > 0, "bytes at the remote, none counted");
    }

    /// A write whose first socket write already fails leaves nothing at the remote and counts
    /// nothing (still "not sent").
    #[tokio::test]
    async fn a_tls_write_that_fails_before_any_record_left_counts_nothing() {
        let (failed, written, received) = write_through_breaking_tls(Break::Broken).await;
        assert!(failed);
        assert_eq!(received, 0);
        assert_eq!(written, 0);
    }

    #[test]
    fn descriptor_exhaustion_is_named_local() {
        for errno in [libc::EMFILE, libc::ENFILE] {
            let Failure::Local(reason) =
                connect_error("r:80", &io::Error::from_raw_os_error(errno))
            else {
                panic!("errno {errno} is not local")
            };
            assert!(
                reason.starts_with("connect to r:80: local resource exhaustion"),
                "{reason}"
            );
        }
        let refused = connect_error("r:80", &io::Error::from(io::ErrorKind::ConnectionRefused));
        assert!(matches!(refused, Failure::NotWritten(r) if !r.contains("local")));
    }
}
