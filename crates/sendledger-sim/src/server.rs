//! The HTTP server (over TCP or TLS): accept loop, per-connection faults, create, lookup and
//! stats.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::{header, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Notify};
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;
use tracing::{debug, warn};

use crate::config::{Faults, SimConfig};
use crate::error::{Error, Result};
use crate::tls;

/// A record the remote holds: one per performed create.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record {
    pub id: String,
    /// Milliseconds since the Unix epoch, by the simulator's clock.
    pub created_at: u64,
    /// The request body as received (a JSON object).
    pub body: Value,
    /// The create's W3C `traceparent` header, when it had one (as received, unchecked).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
}

/// The remote's ground truth, as counters. `duplicates` is what a dispatcher must keep at zero.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stats {
    /// Connections accepted.
    pub connections: u64,
    /// HTTP requests received (all paths).
    pub requests: u64,
    /// Create requests received.
    pub posts: u64,
    /// Records held.
    pub records: u64,
    /// Distinct identity values among the records.
    pub identities: u64,
    /// Identities with more than one record.
    pub duplicates: u64,
    /// Creates answered with an earlier record because of a repeated idempotency key.
    pub replays: u64,
    /// Lookup requests answered.
    pub lookups: u64,
    /// Connections closed by the `refuse` fault.
    pub refused: u64,
    /// Creates committed, then the connection dropped.
    pub dropped: u64,
    /// Creates committed, then never answered.
    pub hung: u64,
    /// Creates answered 5xx (with or without a record).
    pub errors: u64,
    /// Creates answered 429/503 with `Retry-After`.
    pub throttled: u64,
    /// Creates answered by the `reject` fault.
    pub rejected: u64,
    /// Creates refused for a bad body or a missing required header.
    pub invalid: u64,
    /// TLS handshakes that failed (the client did not trust the certificate, presented no
    /// acceptable certificate of its own, or does not speak TLS).
    #[serde(default)]
    pub handshakes_failed: u64,
}

#[derive(Default)]
struct Counters {
    connections: AtomicU64,
    requests: AtomicU64,
    posts: AtomicU64,
    replays: AtomicU64,
    lookups: AtomicU64,
    refused: AtomicU64,
    dropped: AtomicU64,
    hung: AtomicU64,
    errors: AtomicU64,
    throttled: AtomicU64,
    rejected: AtomicU64,
    invalid: AtomicU64,
    handshakes_failed: AtomicU64,
}

#[derive(Default)]
struct Store {
    records: Vec<Record>,
    by_identity: HashMap<String, Vec<usize>>,
    by_key: HashMap<String, usize>,
    duplicates: u64,
}

struct Shared {
    config: SimConfig,
    faults: RwLock<Faults>,
    lag_ms: AtomicU64,
    store: Mutex<Store>,
    counters: Counters,
    shutdown: watch::Receiver<bool>,
    /// The worker pool of `capacity`.
    workers: Option<tokio::sync::Semaphore>,
    /// Set when the remote speaks https.
    tls: Option<TlsAcceptor>,
    /// The `traceparent` headers of the latest lookups that had one (at most
    /// [`LOOKUP_TRACES_KEPT`]).
    lookup_traces: Mutex<std::collections::VecDeque<String>>,
}

/// Lookup trace contexts kept for [`Sim::lookup_traceparents`].
const LOOKUP_TRACES_KEPT: usize = 1000;

/// A running simulated remote. Dropping it stops it; [`Sim::shutdown`] also waits for the
/// accept loop to end.
pub struct Sim {
    shared: Arc<Shared>,
    addr: SocketAddr,
    stop: watch::Sender<bool>,
    accept: Option<JoinHandle<()>>,
}

/// Random stream names: each random choice has its own stream so that they do not interfere.
const STREAM_CONNECTION: u64 = 1;
const STREAM_FAULT: u64 = 2;
const STREAM_LATENCY: u64 = 3;

/// A uniform number in `[0, 1)` from the seed, a stream and a sequence number (splitmix64).
fn unit(seed: u64, stream: u64, n: u64) -> f64 {
    let mut z = seed
        ^ stream.wrapping_mul(0x9E37_79B9_7F4A_7C15)
        ^ n.wrapping_add(1).wrapping_mul(0xD1B5_4A32_D192_ED03);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (z >> 11) as f64 / (1u64 << 53) as f64
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// The value of a dotted body field, as text (strings as is, numbers and booleans printed).
fn field_text(body: &Value, dotted: &str) -> Option<String> {
    let mut v = body;
    for part in dotted.split('.') {
        v = v.get(part)?;
    }
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

type Resp = Response<Full<Bytes>>;

fn json_response(status: StatusCode, body: &Value) -> Resp {
    let mut resp = Response::new(Full::new(Bytes::from(body.to_string())));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    resp
}

fn error_response(status: StatusCode, message: &str) -> Resp {
    json_response(status, &json!({ "error": message }))
}

/// What the handling of a create ends in.
enum Ending {
    Respond(Resp),
    /// Close the connection without answering.
    Drop,
    /// Never answer.
    Hang,
}

impl Sim {
    /// Validates the configuration, binds the listener and starts serving on the current
    /// tokio runtime.
    pub async fn start(config: SimConfig) -> Result<Sim> {
        config.validate()?;
        let tls = config.tls.as_ref().map(tls::acceptor).transpose()?;
        let listener = TcpListener::bind(config.listen)
            .await
            .map_err(|source| Error::Bind {
                addr: config.listen,
                source,
            })?;
        let addr = listener.local_addr().map_err(|source| Error::Bind {
            addr: config.listen,
            source,
        })?;
        let (stop, shutdown) = watch::channel(false);
        let workers = config
            .capacity
            .map(|n| tokio::sync::Semaphore::new(n.max(1)));
        let shared = Arc::new(Shared {
            faults: RwLock::new(config.faults),
            lag_ms: AtomicU64::new(config.lookup_lag.as_millis() as u64),
            config,
            store: Mutex::new(Store::default()),
            counters: Counters::default(),
            shutdown,
            workers,
            tls,
            lookup_traces: Mutex::default(),
        });
        let accept = tokio::spawn(accept_loop(listener, shared.clone()));
        debug!(%addr, "simulated remote listening");
        Ok(Sim {
            shared,
            addr,
            stop,
            accept: Some(accept),
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://<addr>`, or `https://<addr>` with TLS.
    pub fn base_url(&self) -> String {
        let scheme = if self.shared.tls.is_some() {
            "https"
        } else {
            "http"
        };
        format!("{scheme}://{}", self.addr)
    }

    /// The URL that creates a record.
    pub fn create_url(&self) -> String {
        format!("{}{}", self.base_url(), self.shared.config.create_path)
    }

    /// The URL that lists records (add `?field=value`).
    pub fn lookup_url(&self) -> String {
        format!("{}{}", self.base_url(), self.shared.config.lookup_path)
    }

    /// The URL of the stats endpoint.
    pub fn stats_url(&self) -> String {
        format!("{}{}", self.base_url(), self.shared.config.stats_path)
    }

    pub fn config(&self) -> &SimConfig {
        &self.shared.config
    }

    pub fn stats(&self) -> Stats {
        self.shared.stats()
    }

    /// Every record, in creation order.
    pub fn records(&self) -> Vec<Record> {
        self.shared.lock_store().records.clone()
    }

    /// The `traceparent` headers of the latest lookups that carried one (as received,
    /// unchecked; the last 1000), oldest first.
    pub fn lookup_traceparents(&self) -> Vec<String> {
        let traces = self
            .shared
            .lookup_traces
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        traces.iter().cloned().collect()
    }

    /// The records whose identity field has this value.
    pub fn records_with_identity(&self, identity: &str) -> Vec<Record> {
        let store = self.shared.lock_store();
        store
            .by_identity
            .get(identity)
            .map(|ix| ix.iter().map(|&i| store.records[i].clone()).collect())
            .unwrap_or_default()
    }

    /// Replaces the injected faults from now on.
    pub fn set_faults(&self, faults: Faults) -> Result<()> {
        faults.validate()?;
        *self
            .shared
            .faults
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = faults;
        Ok(())
    }

    /// Replaces the lookup lag from now on (it applies to existing records too).
    pub fn set_lookup_lag(&self, lag: Duration) {
        self.shared
            .lag_ms
            .store(lag.as_millis() as u64, Ordering::Relaxed);
    }

    /// Stops accepting, closes every connection (hanging ones included) and waits for the
    /// accept loop to end.
    pub async fn shutdown(mut self) {
        self.stop.send_replace(true);
        if let Some(accept) = self.accept.take() {
            let _ = accept.await;
        }
    }
}

impl Drop for Sim {
    fn drop(&mut self) {
        self.stop.send_replace(true);
    }
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    let mut shutdown = shared.shutdown.clone();
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = shutdown.wait_for(|stop| *stop) => return,
        };
        match accepted {
            Ok((stream, _peer)) => {
                let _ = stream.set_nodelay(true);
                tokio::spawn(serve_connection(stream, shared.clone()));
            }
            Err(e) => {
                // Out of file descriptors and the like: back off instead of spinning.
                warn!(error = %e, "simulated remote: accept failed");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
}

/// Time a client has to complete the TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Serves one accepted connection: the TLS handshake when configured, the `refuse` fault,
/// then HTTP. Over TLS, `refuse` waits for the first byte of the request after the handshake
/// (what a plain connection waits for) and closes without answering.
async fn serve_connection(stream: TcpStream, shared: Arc<Shared>) {
    let n = shared.counters.connections.fetch_add(1, Ordering::Relaxed);
    let refuse = shared.faults().refuse;
    let refuse = refuse > 0.0 && unit(shared.config.seed, STREAM_CONNECTION, n) < refuse;
    let Some(acceptor) = &shared.tls else {
        if refuse {
            shared.counters.refused.fetch_add(1, Ordering::Relaxed);
            // Wait until the request has arrived (so the client has certainly written it),
            // then close without reading: unread data makes the kernel answer with a reset,
            // and the client gets no response.
            let mut probe = [0u8; 1];
            let _ = tokio::time::timeout(Duration::from_secs(5), stream.peek(&mut probe)).await;
            return;
        }
        return serve_http(stream, shared).await;
    };
    let mut shutdown = shared.shutdown.clone();
    let accepted = tokio::select! {
        accepted = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)) => accepted,
        _ = shutdown.wait_for(|stop| *stop) => return,
    };
    let mut stream = match accepted {
        Ok(Ok(stream)) => stream,
        Ok(Err(e)) => {
            shared
                .counters
                .handshakes_failed
                .fetch_add(1, Ordering::Relaxed);
            debug!(error = %e, "simulated remote: tls handshake failed");
            return;
        }
        Err(_) => {
            shared
                .counters
                .handshakes_failed
                .fetch_add(1, Ordering::Relaxed);
            debug!("simulated remote: tls handshake not complete in time");
            return;
        }
    };
    if refuse {
        shared.counters.refused.fetch_add(1, Ordering::Relaxed);
        let mut probe = [0u8; 1];
        let _ = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut probe)).await;
        return;
    }
    serve_http(stream, shared).await
}

async fn serve_http<S>(io: S, shared: Arc<Shared>)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let mut shutdown = shared.shutdown.clone();
    let kill = Arc::new(Notify::new());
    let service = {
        let shared = shared.clone();
        let kill = kill.clone();
        service_fn(move |req| {
            let shared = shared.clone();
            let kill = kill.clone();
            async move { Ok::<_, Infallible>(handle(shared, kill, req).await) }
        })
    };
    let conn = http1::Builder::new().serve_connection(TokioIo::new(io), service);
    tokio::select! {
        result = conn => {
            if let Err(e) = result {
                debug!(error = %e, "simulated remote: connection ended with an error");
            }
        }
        // Dropping the connection closes the socket without an answer (over TLS, without a
        // close_notify).
        _ = kill.notified() => {}
        _ = shutdown.wait_for(|stop| *stop) => {}
    }
}

async fn handle(shared: Arc<Shared>, kill: Arc<Notify>, req: Request<Incoming>) -> Resp {
    shared.counters.requests.fetch_add(1, Ordering::Relaxed);
    let path = req.uri().path().to_string();
    let config = &shared.config;
    if req.method() == Method::POST && path == config.create_path {
        match create(shared.clone(), req).await {
            Ending::Respond(resp) => resp,
            Ending::Drop => {
                kill.notify_one();
                std::future::pending().await
            }
            Ending::Hang => std::future::pending().await,
        }
    } else if req.method() == Method::GET && path == config.lookup_path {
        if let Some(trace) = req
            .headers()
            .get("traceparent")
            .and_then(|v| v.to_str().ok())
        {
            let mut traces = shared
                .lookup_traces
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            if traces.len() == LOOKUP_TRACES_KEPT {
                traces.pop_front();
            }
            traces.push_back(trace.to_string());
        }
        lookup(&shared, req.uri().query().unwrap_or("")).await
    } else if req.method() == Method::GET && path == config.stats_path {
        match serde_json::to_value(shared.stats()) {
            Ok(v) => json_response(StatusCode::OK, &v),
            Err(_) => error_response(StatusCode::INTERNAL_SERVER_ERROR, "stats unavailable"),
        }
    } else {
        error_response(StatusCode::NOT_FOUND, "no such route")
    }
}

async fn create(shared: Arc<Shared>, req: Request<Incoming>) -> Ending {
    let n = shared.counters.posts.fetch_add(1, Ordering::Relaxed);
    let config = &shared.config;
    let (parts, body) = req.into_parts();
    let bytes = match Limited::new(body, config.max_body_bytes).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(e) if e.downcast_ref::<LengthLimitError>().is_some() => {
            shared.counters.invalid.fetch_add(1, Ordering::Relaxed);
            return Ending::Respond(error_response(
                StatusCode::PAYLOAD_TOO_LARGE,
                "body too large",
            ));
        }
        Err(_) => {
            shared.counters.invalid.fetch_add(1, Ordering::Relaxed);
            return Ending::Respond(error_response(
                StatusCode::BAD_REQUEST,
                "body could not be read",
            ));
        }
    };
    let key = config
        .idempotency_header
        .as_ref()
        .and_then(|name| parts.headers.get(name.as_str()))
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let traceparent = parts
        .headers
        .get("traceparent")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let authorized = match &config.require_header {
        None => true,
        Some(required) => parts
            .headers
            .get(required.name.as_str())
            .is_some_and(|v| v.as_bytes() == required.value.as_bytes()),
    };
    // The rest runs in its own task: like a real server, the remote finishes its work even when
    // the client has gone away meanwhile.
    let task =
        tokio::spawn(async move { process(&shared, n, bytes, key, traceparent, authorized).await });
    match task.await {
        Ok(ending) => ending,
        Err(_) => Ending::Respond(error_response(
            StatusCode::INTERNAL_SERVER_ERROR,
            "simulator task failed",
        )),
    }
}

async fn process(
    shared: &Shared,
    n: u64,
    bytes: Bytes,
    key: Option<String>,
    traceparent: Option<String>,
    authorized: bool,
) -> Ending {
    let _worker = match &shared.workers {
        Some(pool) => pool.acquire().await.ok(),
        None => None,
    };
    let faults = shared.faults();
    let seed = shared.config.seed;
    shared.delay(&faults, n).await;
    let counters = &shared.counters;
    if !authorized {
        counters.invalid.fetch_add(1, Ordering::Relaxed);
        return Ending::Respond(error_response(
            StatusCode::UNAUTHORIZED,
            "missing or wrong credentials",
        ));
    }
    let body: Value = match serde_json::from_slice(&bytes) {
        Ok(v @ Value::Object(_)) => v,
        _ => {
            counters.invalid.fetch_add(1, Ordering::Relaxed);
            return Ending::Respond(error_response(
                StatusCode::BAD_REQUEST,
                "body is not a JSON object",
            ));
        }
    };
    let status = |s: u16| StatusCode::from_u16(s).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    // One draw picks at most one fault, by cumulative probability.
    let draw = unit(seed, STREAM_FAULT, n);
    let mut edge = 0.0;
    let mut hit = |p: f64| {
        edge += p;
        p > 0.0 && draw < edge
    };
    if hit(faults.throttle) {
        counters.throttled.fetch_add(1, Ordering::Relaxed);
        let mut resp = error_response(status(faults.throttle_status), "slow down");
        let secs = faults.retry_after.as_millis().div_ceil(1000);
        if let Ok(v) = header::HeaderValue::from_str(&secs.to_string()) {
            resp.headers_mut().insert(header::RETRY_AFTER, v);
        }
        return Ending::Respond(resp);
    }
    if hit(faults.error) {
        counters.errors.fetch_add(1, Ordering::Relaxed);
        return Ending::Respond(error_response(
            status(faults.error_status),
            "internal error",
        ));
    }
    if hit(faults.reject) {
        counters.rejected.fetch_add(1, Ordering::Relaxed);
        return Ending::Respond(error_response(
            status(faults.reject_status),
            "request rejected by the remote",
        ));
    }
    let (record, replayed) = shared.commit(body, key, traceparent);
    if hit(faults.commit_then_drop) {
        counters.dropped.fetch_add(1, Ordering::Relaxed);
        return Ending::Drop;
    }
    if hit(faults.commit_then_hang) {
        counters.hung.fetch_add(1, Ordering::Relaxed);
        return Ending::Hang;
    }
    if hit(faults.commit_then_error) {
        counters.errors.fetch_add(1, Ordering::Relaxed);
        return Ending::Respond(error_response(
            status(faults.error_status),
            "internal error",
        ));
    }
    let mut resp = json_response(
        StatusCode::CREATED,
        &json!({ "id": record.id, "created_at": record.created_at }),
    );
    if replayed {
        resp.headers_mut().insert(
            "idempotent-replayed",
            header::HeaderValue::from_static("true"),
        );
    }
    Ending::Respond(resp)
}

async fn lookup(shared: &Shared, query: &str) -> Resp {
    let n = shared.counters.lookups.fetch_add(1, Ordering::Relaxed);
    let faults = shared.faults();
    shared.delay(&faults, n).await;
    let mut conditions = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        conditions.push((decode(k), decode(v)));
    }
    let visible_before = now_ms().saturating_sub(shared.lag_ms.load(Ordering::Relaxed));
    let store = shared.lock_store();
    let matches = |r: &Record| {
        r.created_at <= visible_before
            && conditions
                .iter()
                .all(|(k, v)| field_text(&r.body, k).as_deref() == Some(v.as_str()))
    };
    let candidates: Box<dyn Iterator<Item = &Record>> = match conditions
        .iter()
        .find(|(k, _)| *k == shared.config.identity_field)
    {
        Some((_, v)) => Box::new(
            store
                .by_identity
                .get(v)
                .into_iter()
                .flatten()
                .map(|&i| &store.records[i]),
        ),
        None => Box::new(store.records.iter()),
    };
    let found: Vec<Value> = candidates
        .filter(|r| matches(r))
        .map(|r| json!({ "id": r.id, "created_at": r.created_at, "body": r.body }))
        .collect();
    drop(store);
    json_response(StatusCode::OK, &Value::Array(found))
}

fn decode(s: &str) -> String {
    percent_encoding::percent_decode_str(&s.replace('+', " "))
        .decode_utf8_lossy()
        .into_owned()
}

impl Shared {
    fn faults(&self) -> Faults {
        *self
            .faults
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn lock_store(&self) -> std::sync::MutexGuard<'_, Store> {
        self.store
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    async fn delay(&self, faults: &Faults, n: u64) {
        let jitter = faults
            .latency_jitter
            .mul_f64(unit(self.config.seed, STREAM_LATENCY, n));
        let total = faults.latency + jitter;
        if !total.is_zero() {
            tokio::time::sleep(total).await;
        }
    }

    /// Creates a record, or returns the first one created with the same idempotency key.
    fn commit(
        &self,
        body: Value,
        key: Option<String>,
        traceparent: Option<String>,
    ) -> (Record, bool) {
        let mut store = self.lock_store();
        if let Some(&i) = key.as_ref().and_then(|k| store.by_key.get(k)) {
            self.counters.replays.fetch_add(1, Ordering::Relaxed);
            return (store.records[i].clone(), true);
        }
        let index = store.records.len();
        let record = Record {
            id: format!("rec-{}", index + 1),
            created_at: now_ms(),
            body,
            traceparent,
        };
        if let Some(identity) = field_text(&record.body, &self.config.identity_field) {
            let entry = store.by_identity.entry(identity).or_default();
            entry.push(index);
            if entry.len() == 2 {
                store.duplicates += 1;
            }
        }
        if let Some(k) = key {
            store.by_key.insert(k, index);
        }
        store.records.push(record.clone());
        (record, false)
    }

    fn stats(&self) -> Stats {
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let store = self.lock_store();
        Stats {
            connections: get(&c.connections),
            requests: get(&c.requests),
            posts: get(&c.posts),
            records: store.records.len() as u64,
            identities: store.by_identity.len() as u64,
            duplicates: store.duplicates,
            replays: get(&c.replays),
            lookups: get(&c.lookups),
            refused: get(&c.refused),
            dropped: get(&c.dropped),
            hung: get(&c.hung),
            errors: get(&c.errors),
            throttled: get(&c.throttled),
            rejected: get(&c.rejected),
            invalid: get(&c.invalid),
            handshakes_failed: get(&c.handshakes_failed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_are_uniform_enough_and_reproducible() {
        let draws: Vec<f64> = (0..10_000).map(|n| unit(7, STREAM_FAULT, n)).collect();
        assert!(draws.iter().all(|d| (0.0..1.0).contains(d)));
        let below = draws.iter().filter(|&&d| d < 0.25).count();
        assert!((2_200..2_800).contains(&below), "{below}");
        assert_eq!(unit(7, STREAM_FAULT, 3), unit(7, STREAM_FAULT, 3));
        assert_ne!(unit(7, STREAM_FAULT, 3), unit(8, STREAM_FAULT, 3));
        assert_ne!(unit(7, STREAM_FAULT, 3), unit(7, STREAM_LATENCY, 3));
    }

    #[test]
    fn field_text_reads_dotted_paths() {
        let body = json!({"a": {"b": "x", "n": 5}, "t": true, "o": {}});
        assert_eq!(field_text(&body, "a.b").as_deref(), Some("x"));
        assert_eq!(field_text(&body, "a.n").as_deref(), Some("5"));
        assert_eq!(field_text(&body, "t").as_deref(), Some("true"));
        assert_eq!(field_text(&body, "o"), None);
        assert_eq!(field_text(&body, "missing"), None);
    }
}
