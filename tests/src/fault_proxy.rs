//! A fault proxy in front of a real HTTP server (json-server in the outage tests), over real
//! sockets, switched at run time between passing everything through and four kinds of outage:
//! connections refused (it stops listening and closes the connections it holds), each POST read
//! and its connection closed unanswered, each POST answered 503, each POST read and never
//! answered. In the three POST kinds nothing of a POST reaches the server and everything else
//! (the lookups' GETs) passes.
//!
//! HTTP/1.1 only, as the engine speaks it: the client's connections are kept alive across
//! requests; each request it passes goes to the server on a connection of its own, and the
//! request and the answer are forwarded byte for byte (bodies framed by `Content-Length` or
//! chunked; an answer framed by neither is read to its end and the client's connection closed
//! after it).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// What the proxy does with what reaches it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Everything is forwarded.
    Pass,
    /// Nothing listens: connections are refused, and those open are closed.
    Refused,
    /// Each POST is read and its connection closed, unanswered; not forwarded.
    DropPosts,
    /// Each POST is answered `503 Service Unavailable` (no `Retry-After`); not forwarded.
    Answer503,
    /// Each POST is read and never answered (the connection is held until the client closes
    /// it); not forwarded.
    HangPosts,
}

/// What reached the proxy since it started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// POSTs read from clients, whatever became of them.
    pub posts: u64,
    /// POSTs forwarded to the server.
    pub posts_forwarded: u64,
    /// Other requests (GETs) read from clients.
    pub others: u64,
}

struct Inner {
    upstream: SocketAddr,
    mode: watch::Sender<Mode>,
    /// Set when the proxy is dropped: everything ends.
    stop: watch::Sender<bool>,
    /// Connections from clients still open.
    open: watch::Sender<usize>,
    posts: AtomicU64,
    posts_forwarded: AtomicU64,
    others: AtomicU64,
}

pub struct FaultProxy {
    addr: SocketAddr,
    inner: Arc<Inner>,
    accept: tokio::sync::Mutex<Option<JoinHandle<()>>>,
}

impl FaultProxy {
    /// A proxy on a free port of 127.0.0.1 forwarding to `upstream`, passing everything.
    pub async fn start(upstream: SocketAddr) -> std::io::Result<FaultProxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let inner = Arc::new(Inner {
            upstream,
            mode: watch::Sender::new(Mode::Pass),
            stop: watch::Sender::new(false),
            open: watch::Sender::new(0),
            posts: AtomicU64::new(0),
            posts_forwarded: AtomicU64::new(0),
            others: AtomicU64::new(0),
        });
        let accept = tokio::spawn(accept_loop(listener, inner.clone()));
        Ok(FaultProxy {
            addr,
            inner,
            accept: tokio::sync::Mutex::new(Some(accept)),
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT`, the proxy as a base URL.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn counts(&self) -> Counts {
        Counts {
            posts: self.inner.posts.load(Ordering::SeqCst),
            posts_forwarded: self.inner.posts_forwarded.load(Ordering::SeqCst),
            others: self.inner.others.load(Ordering::SeqCst),
        }
    }

    pub fn mode(&self) -> Mode {
        *self.inner.mode.borrow()
    }

    /// Switches the mode. Into `Refused`: returns once nothing listens and every connection is
    /// closed. Out of it: returns once the proxy listens again on the same address.
    pub async fn set_mode(&self, mode: Mode) -> std::io::Result<()> {
        let mut accept = self.accept.lock().await;
        self.inner.mode.send_replace(mode);
        if mode == Mode::Refused {
            if let Some(loop_) = accept.take() {
                let _ = loop_.await;
            }
            let mut open = self.inner.open.subscribe();
            let _ = open.wait_for(|n| *n == 0).await;
        } else if accept.is_none() {
            let listener = TcpListener::bind(self.addr).await?;
            *accept = Some(tokio::spawn(accept_loop(listener, self.inner.clone())));
        }
        Ok(())
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.inner.stop.send_replace(true);
    }
}

/// Whether connections must end now: the proxy stopped, or went `Refused`.
fn closing(inner: &Inner) -> bool {
    *inner.stop.borrow() || *inner.mode.borrow() == Mode::Refused
}

/// Resolves when connections must end.
async fn until_closing(inner: &Inner) {
    let mut mode = inner.mode.subscribe();
    let mut stop = inner.stop.subscribe();
    loop {
        if closing(inner) {
            return;
        }
        tokio::select! {
            changed = mode.changed() => if changed.is_err() { return },
            changed = stop.changed() => if changed.is_err() { return },
        }
    }
}

/// Accepts until the proxy stops or goes `Refused`; returning drops (closes) the listener.
async fn accept_loop(listener: TcpListener, inner: Arc<Inner>) {
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = until_closing(&inner) => return,
        };
        let Ok((stream, _)) = accepted else { continue };
        let _ = stream.set_nodelay(true);
        inner.open.send_modify(|n| *n += 1);
        let conn_inner = inner.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = serve(stream, &conn_inner) => {}
                _ = until_closing(&conn_inner) => {}
            }
            conn_inner.open.send_modify(|n| *n -= 1);
        });
    }
}

/// One client connection: its requests, one after the other.
async fn serve(mut client: TcpStream, inner: &Inner) {
    let mut reader = Reader::default();
    loop {
        let request = match reader.request(&mut client).await {
            Ok(Some(request)) => request,
            Ok(None) | Err(_) => return,
        };
        if request.method != "POST" {
            inner.others.fetch_add(1, Ordering::SeqCst);
        } else {
            inner.posts.fetch_add(1, Ordering::SeqCst);
            // Copied out: the watch's guard must not be held across an await.
            let mode = *inner.mode.borrow();
            match mode {
                Mode::DropPosts | Mode::Refused => return,
                Mode::Answer503 => {
                    let answer = b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\n\r\n";
                    if client.write_all(answer).await.is_err() || request.close {
                        return;
                    }
                    continue;
                }
                Mode::HangPosts => {
                    // Held, unanswered, until the client gives up and closes it.
                    let mut sink = [0u8; 1024];
                    while matches!(client.read(&mut sink).await, Ok(n) if n > 0) {}
                    return;
                }
                Mode::Pass => {
                    inner.posts_forwarded.fetch_add(1, Ordering::SeqCst);
                }
            }
        }
        match forward(inner.upstream, &request).await {
            Ok(answer) => {
                if client.write_all(&answer.raw).await.is_err() || request.close || answer.close {
                    return;
                }
            }
            // The server is gone or broke off its answer: so does the proxy.
            Err(_) => return,
        }
    }
}

/// Sends one request to the server on a connection of its own and reads its answer.
async fn forward(upstream: SocketAddr, request: &Message) -> std::io::Result<Message> {
    let mut server = TcpStream::connect(upstream).await?;
    server.set_nodelay(true)?;
    server.write_all(&request.raw).await?;
    let mut reader = Reader::default();
    reader
        .response(&mut server, request.method == "HEAD")
        .await?
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "no answer"))
}

/// A request or an answer, as read: its bytes exactly, and what the proxy needs of its head.
struct Message {
    raw: Vec<u8>,
    /// The request's method (empty for an answer).
    method: String,
    /// The connection ends after this message (`Connection: close`, or an answer read to its
    /// end).
    close: bool,
}

/// How a message's body is delimited.
enum Framing {
    Length(usize),
    Chunked,
    UntilClose,
}

/// Reads HTTP/1.1 messages from a stream, keeping what it read past the end of one for the next.
#[derive(Default)]
struct Reader {
    buf: Vec<u8>,
}

impl Reader {
    /// Reads more bytes; false at the end of the stream.
    async fn fill(&mut self, stream: &mut (impl AsyncRead + Unpin)) -> std::io::Result<bool> {
        let mut chunk = [0u8; 16 * 1024];
        let n = stream.read(&mut chunk).await?;
        self.buf.extend_from_slice(&chunk[..n]);
        Ok(n > 0)
    }

    /// Takes `n` bytes off the front, reading as needed.
    async fn take(
        &mut self,
        stream: &mut (impl AsyncRead + Unpin),
        n: usize,
    ) -> std::io::Result<Vec<u8>> {
        while self.buf.len() < n {
            if !self.fill(stream).await? {
                return Err(eof());
            }
        }
        Ok(self.buf.drain(..n).collect())
    }

    /// Takes bytes up to and including the first occurrence of `end`; `None` when the stream
    /// ended before any byte.
    async fn take_through(
        &mut self,
        stream: &mut (impl AsyncRead + Unpin),
        end: &[u8],
    ) -> std::io::Result<Option<Vec<u8>>> {
        loop {
            if let Some(at) = self.buf.windows(end.len()).position(|w| w == end) {
                return Ok(Some(self.buf.drain(..at + end.len()).collect()));
            }
            if self.buf.len() > 1 << 20 {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    "a head or chunk line over 1 MiB",
                ));
            }
            if !self.fill(stream).await? {
                return if self.buf.is_empty() {
                    Ok(None)
                } else {
                    Err(eof())
                };
            }
        }
    }

    /// The next request; `None` when the client closed its connection between requests.
    async fn request(
        &mut self,
        stream: &mut (impl AsyncRead + Unpin),
    ) -> std::io::Result<Option<Message>> {
        let Some(head) = self.take_through(stream, b"\r\n\r\n").await? else {
            return Ok(None);
        };
        let parsed = Head::parse(&head)?;
        let method = parsed
            .first
            .split(' ')
            .next()
            .unwrap_or_default()
            .to_string();
        let framing = if parsed.chunked {
            Framing::Chunked
        } else {
            Framing::Length(parsed.content_length.unwrap_or(0))
        };
        let mut raw = head;
        self.body(stream, framing, &mut raw).await?;
        Ok(Some(Message {
            raw,
            method,
            close: parsed.close,
        }))
    }

    /// The answer to a request (`head_request`: to a HEAD, which has no body).
    async fn response(
        &mut self,
        stream: &mut (impl AsyncRead + Unpin),
        head_request: bool,
    ) -> std::io::Result<Option<Message>> {
        let Some(head) = self.take_through(stream, b"\r\n\r\n").await? else {
            return Ok(None);
        };
        let parsed = Head::parse(&head)?;
        let status: u16 = parsed
            .first
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| invalid("no status in the answer"))?;
        let framing =
            if head_request || (100..200).contains(&status) || status == 204 || status == 304 {
                Framing::Length(0)
            } else if parsed.chunked {
                Framing::Chunked
            } else if let Some(n) = parsed.content_length {
                Framing::Length(n)
            } else {
                Framing::UntilClose
            };
        let close = parsed.close || matches!(framing, Framing::UntilClose);
        let mut raw = head;
        self.body(stream, framing, &mut raw).await?;
        Ok(Some(Message {
            raw,
            method: String::new(),
            close,
        }))
    }

    /// Appends the body, exactly as framed, to `raw`.
    async fn body(
        &mut self,
        stream: &mut (impl AsyncRead + Unpin),
        framing: Framing,
        raw: &mut Vec<u8>,
    ) -> std::io::Result<()> {
        match framing {
            Framing::Length(n) => raw.extend(self.take(stream, n).await?),
            Framing::UntilClose => {
                while self.fill(stream).await? {}
                raw.append(&mut self.buf);
            }
            Framing::Chunked => loop {
                let line = self.take_through(stream, b"\r\n").await?.ok_or_else(eof)?;
                let size_text = std::str::from_utf8(&line)
                    .map_err(|_| invalid("chunk size"))?
                    .trim_end()
                    .split(';')
                    .next()
                    .unwrap_or_default()
                    .trim();
                let size =
                    usize::from_str_radix(size_text, 16).map_err(|_| invalid("chunk size"))?;
                raw.extend(line);
                if size == 0 {
                    // Trailers, up to the empty line.
                    loop {
                        let trailer = self.take_through(stream, b"\r\n").await?.ok_or_else(eof)?;
                        let last = trailer == b"\r\n";
                        raw.extend(trailer);
                        if last {
                            return Ok(());
                        }
                    }
                }
                raw.extend(self.take(stream, size + 2).await?);
            },
        }
        Ok(())
    }
}

/// What the proxy reads of a head: the first line and the headers that frame the body or end
/// the connection.
struct Head {
    first: String,
    content_length: Option<usize>,
    chunked: bool,
    close: bool,
}

impl Head {
    fn parse(head: &[u8]) -> std::io::Result<Head> {
        let text = std::str::from_utf8(head).map_err(|_| invalid("a head that is not UTF-8"))?;
        let mut lines = text.split("\r\n");
        let first = lines.next().unwrap_or_default().to_string();
        let mut parsed = Head {
            first,
            content_length: None,
            chunked: false,
            close: false,
        };
        for line in lines {
            let Some((name, value)) = line.split_once(':') else {
                continue;
            };
            let value = value.trim();
            match name.trim().to_ascii_lowercase().as_str() {
                "content-length" => {
                    parsed.content_length =
                        Some(value.parse().map_err(|_| invalid("content-length"))?)
                }
                "transfer-encoding" => {
                    parsed.chunked = value.to_ascii_lowercase().contains("chunked")
                }
                "connection" => {
                    parsed.close = value
                        .split(',')
                        .any(|t| t.trim().eq_ignore_ascii_case("close"))
                }
                _ => {}
            }
        }
        // HTTP/1.0 closes unless told otherwise; the proxy closes it either way.
        if parsed.first.contains("HTTP/1.0") {
            parsed.close = true;
        }
        Ok(parsed)
    }
}

fn eof() -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::UnexpectedEof,
        "the stream ended mid-message",
    )
}

fn invalid(what: &str) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_string())
}
