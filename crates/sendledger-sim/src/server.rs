//! The HTTP server (over TCP or TLS): [`Sim`], per-connection faults, create and stats; lookups
//! are answered by [`crate::lookup`], the port is held by [`crate::listener`].

use std::collections::VecDeque;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{header, HeaderMap, Method, Request, StatusCode};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Notify, Semaphore};
use tokio_rustls::TlsAcceptor;
use tracing::debug;

use crate::config::{validate_page_size, Faults, SimConfig};
use crate::error::{Error, Result};
use crate::listener::{Listener, Serve};
use crate::lookup::{self, Paging};
use crate::response::{error_response, json_response, Resp};
use crate::stats::{bump, Counters, InFlight, Stats};
use crate::store::{now_ms, Record, Store};
use crate::tls;

struct Shared {
    config: SimConfig,
    /// The address listened on (the same across outages).
    addr: SocketAddr,
    faults: RwLock<Faults>,
    lag_ms: AtomicU64,
    /// Matches per lookup page; 0: lookups are not paged.
    page_size: AtomicUsize,
    store: Mutex<Store>,
    counters: Counters,
    /// The worker pool of `capacity`.
    workers: Option<Semaphore>,
    /// Set when the remote speaks https.
    tls: Option<TlsAcceptor>,
    /// The `traceparent` headers of the latest lookups that had one (at most
    /// [`LOOKUP_TRACES_KEPT`]).
    lookup_traces: Mutex<VecDeque<String>>,
    /// The latest lookups received (at most [`LOOKUPS_KEPT`]).
    lookups: Mutex<VecDeque<LookupReceived>>,
}

/// Lookup trace contexts kept for [`Sim::lookup_traceparents`].
const LOOKUP_TRACES_KEPT: usize = 1000;
/// Lookups kept for [`Sim::lookups_received`].
const LOOKUPS_KEPT: usize = 1000;

/// A lookup request as the remote received it: when it arrived, and the status it was
/// answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LookupReceived {
    pub at: Instant,
    pub status: u16,
}

/// A running simulated remote. Dropping it stops it; [`Sim::shutdown`] also waits for the
/// accept loop to end.
pub struct Sim {
    shared: Arc<Shared>,
    stop: watch::Sender<bool>,
    listener: Listener,
}

/// Random stream names: each random choice has its own stream so that they do not interfere.
const STREAM_CONNECTION: u64 = 1;
const STREAM_FAULT: u64 = 2;
const STREAM_LATENCY: u64 = 3;
const STREAM_LOOKUP_FAULT: u64 = 4;

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

/// A per-request fault of [`Faults`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    Throttle,
    Error,
    Reject,
    CommitThenDrop,
    CommitThenHang,
    CommitThenError,
    Drop,
    Hang,
}

/// The fault a create's `draw` (uniform in `[0, 1)`) picks, by cumulative probability: at most
/// one. `drop` and `hang` come last, so that a seed draws the other faults exactly as before
/// they existed.
fn choose(faults: &Faults, draw: f64) -> Option<Fault> {
    let mut edge = 0.0;
    [
        (Fault::Throttle, faults.throttle),
        (Fault::Error, faults.error),
        (Fault::Reject, faults.reject),
        (Fault::CommitThenDrop, faults.commit_then_drop),
        (Fault::CommitThenHang, faults.commit_then_hang),
        (Fault::CommitThenError, faults.commit_then_error),
        (Fault::Drop, faults.drop),
        (Fault::Hang, faults.hang),
    ]
    .into_iter()
    .find(|&(_, p)| {
        edge += p;
        p > 0.0 && draw < edge
    })
    .map(|(fault, _)| fault)
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
        let bind_error = |source| Error::Bind {
            addr: config.listen,
            source,
        };
        let listener = TcpListener::bind(config.listen).await.map_err(bind_error)?;
        let addr = listener.local_addr().map_err(bind_error)?;
        let (stop, stopped) = watch::channel(false);
        let shared = Arc::new(Shared {
            addr,
            faults: RwLock::new(config.faults),
            lag_ms: AtomicU64::new(config.lookup_lag.as_millis() as u64),
            page_size: AtomicUsize::new(config.lookup_page_size.unwrap_or(0)),
            workers: config.capacity.map(|n| Semaphore::new(n.max(1))),
            config,
            store: Mutex::new(Store::default()),
            counters: Counters::default(),
            tls,
            lookup_traces: Mutex::default(),
            lookups: Mutex::default(),
        });
        let serve: Serve = {
            let shared = shared.clone();
            Arc::new(move |stream| Box::pin(serve_connection(stream, shared.clone())))
        };
        let listener = Listener::start(listener, addr, stopped, serve);
        debug!(%addr, "simulated remote listening");
        Ok(Sim {
            shared,
            stop,
            listener,
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.shared.addr
    }

    /// `http://<addr>`, or `https://<addr>` with TLS.
    pub fn base_url(&self) -> String {
        format!("{}://{}", self.shared.scheme(), self.shared.addr)
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

    /// The latest lookup requests received (the last 1000), oldest first, with the status
    /// each was answered.
    pub fn lookups_received(&self) -> Vec<LookupReceived> {
        let lookups = self
            .shared
            .lookups
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        lookups.iter().copied().collect()
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

    /// Replaces the lookup page size from now on (`None`: lookups answer every match at once);
    /// pages lead on as the configuration's `lookup_paging` says. An error names
    /// `lookup_page_size` when the size is 0.
    pub fn set_lookup_page_size(&self, size: Option<usize>) -> Result<()> {
        validate_page_size(size)?;
        self.shared
            .page_size
            .store(size.unwrap_or(0), Ordering::Relaxed);
        Ok(())
    }

    /// Takes the remote down (`true`) or brings it back (`false`), for every request, lookups
    /// included. While offline nothing listens on its port: connecting is refused outright,
    /// and the connections it had (idle keep-alive ones in a client's pool included) are
    /// closed without an answer. Going offline returns once all of them are closed; coming
    /// back, once the same port listens again. Records and counters outlive the outage; a
    /// create already being worked on still finishes, so its record may exist although its
    /// connection closed unanswered (as when a real server crashes).
    ///
    /// Coming back fails with [`Error::Bind`] if the port cannot be bound again (another
    /// process took it meanwhile); the remote then stays offline.
    pub async fn set_offline(&self, offline: bool) -> Result<()> {
        self.listener.set_offline(offline).await
    }

    /// Stops accepting, closes every connection (hanging ones included) and waits for the
    /// accept loop to end.
    pub async fn shutdown(self) {
        self.stop.send_replace(true);
        self.listener.stopped().await;
    }
}

impl Drop for Sim {
    fn drop(&mut self) {
        self.stop.send_replace(true);
    }
}

/// Time a client has to complete the TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Serves one accepted connection: the TLS handshake when configured, the `refuse` fault,
/// then HTTP. Over TLS, `refuse` waits for the first byte of the request after the handshake
/// (what a plain connection waits for) and closes without answering.
async fn serve_connection(stream: TcpStream, shared: Arc<Shared>) {
    let n = bump(&shared.counters.connections);
    let refuse = shared.faults().refuse;
    let refuse = refuse > 0.0 && unit(shared.config.seed, STREAM_CONNECTION, n) < refuse;
    let Some(acceptor) = &shared.tls else {
        if refuse {
            bump(&shared.counters.refused);
            // Wait until the request has arrived (so the client has certainly written it),
            // then close without reading: unread data makes the kernel answer with a reset,
            // and the client gets no response.
            let mut probe = [0u8; 1];
            let _ = tokio::time::timeout(Duration::from_secs(5), stream.peek(&mut probe)).await;
            return;
        }
        return serve_http(stream, shared).await;
    };
    let mut stream = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
        Ok(Ok(stream)) => stream,
        Ok(Err(e)) => {
            bump(&shared.counters.handshakes_failed);
            debug!(error = %e, "simulated remote: tls handshake failed");
            return;
        }
        Err(_) => {
            bump(&shared.counters.handshakes_failed);
            debug!("simulated remote: tls handshake not complete in time");
            return;
        }
    };
    if refuse {
        bump(&shared.counters.refused);
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
    let kill = Arc::new(Notify::new());
    let service = {
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
    }
}

async fn handle(shared: Arc<Shared>, kill: Arc<Notify>, req: Request<Incoming>) -> Resp {
    bump(&shared.counters.requests);
    let path = req.uri().path().to_string();
    let config = &shared.config;
    let is_create = req.method() == Method::POST && path == config.create_path;
    let is_lookup = req.method() == Method::GET && path == config.lookup_path;
    let _in_flight = (is_create || is_lookup).then(|| InFlight::start(&shared.counters));
    if is_create {
        match create(shared.clone(), req).await {
            Ending::Respond(resp) => resp,
            Ending::Drop => {
                kill.notify_one();
                std::future::pending().await
            }
            Ending::Hang => std::future::pending().await,
        }
    } else if is_lookup {
        shared.lookup(&req).await
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
    let n = bump(&shared.counters.posts);
    let config = &shared.config;
    let (parts, body) = req.into_parts();
    let bytes = match Limited::new(body, config.max_body_bytes).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(e) if e.downcast_ref::<LengthLimitError>().is_some() => {
            bump(&shared.counters.invalid);
            return Ending::Respond(error_response(
                StatusCode::PAYLOAD_TOO_LARGE,
                "body too large",
            ));
        }
        Err(_) => {
            bump(&shared.counters.invalid);
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
    shared.delay(&faults, n).await;
    let counters = &shared.counters;
    if !authorized {
        bump(&counters.invalid);
        return Ending::Respond(error_response(
            StatusCode::UNAUTHORIZED,
            "missing or wrong credentials",
        ));
    }
    let body: Value = match serde_json::from_slice(&bytes) {
        Ok(v @ Value::Object(_)) => v,
        _ => {
            bump(&counters.invalid);
            return Ending::Respond(error_response(
                StatusCode::BAD_REQUEST,
                "body is not a JSON object",
            ));
        }
    };
    let status = |s: u16| StatusCode::from_u16(s).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let internal_error = || {
        bump(&counters.errors);
        Ending::Respond(error_response(
            status(faults.error_status),
            "internal error",
        ))
    };
    let fault = choose(&faults, unit(shared.config.seed, STREAM_FAULT, n));
    // The faults that create nothing.
    match fault {
        Some(Fault::Throttle) => {
            bump(&counters.throttled);
            return Ending::Respond(throttled(&faults));
        }
        Some(Fault::Error) => return internal_error(),
        Some(Fault::Reject) => {
            bump(&counters.rejected);
            return Ending::Respond(error_response(
                status(faults.reject_status),
                "request rejected by the remote",
            ));
        }
        Some(Fault::Drop) => {
            bump(&counters.dropped_uncommitted);
            return Ending::Drop;
        }
        Some(Fault::Hang) => {
            bump(&counters.hung_uncommitted);
            return Ending::Hang;
        }
        _ => {}
    }
    let (record, replayed) = shared.commit(body, key, traceparent);
    match fault {
        Some(Fault::CommitThenDrop) => {
            bump(&counters.dropped);
            Ending::Drop
        }
        Some(Fault::CommitThenHang) => {
            bump(&counters.hung);
            Ending::Hang
        }
        Some(Fault::CommitThenError) => internal_error(),
        _ => {
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
    }
}

/// The answer of `throttle` and `lookup_throttle`: `throttle_status` with `Retry-After`.
fn throttled(faults: &Faults) -> Resp {
    let status =
        StatusCode::from_u16(faults.throttle_status).unwrap_or(StatusCode::TOO_MANY_REQUESTS);
    let mut resp = error_response(status, "slow down");
    let secs = faults.retry_after.as_millis().div_ceil(1000);
    if let Ok(v) = header::HeaderValue::from_str(&secs.to_string()) {
        resp.headers_mut().insert(header::RETRY_AFTER, v);
    }
    resp
}

impl Shared {
    fn faults(&self) -> Faults {
        *self
            .faults
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn lock_store(&self) -> MutexGuard<'_, Store> {
        self.store
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn scheme(&self) -> &'static str {
        if self.tls.is_some() {
            "https"
        } else {
            "http"
        }
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
        let committed =
            self.lock_store()
                .commit(&self.config.identity_field, body, key, traceparent);
        if committed.1 {
            bump(&self.counters.replays);
        }
        committed
    }

    /// Answers a lookup after the configured latency (throttled by the `lookup_throttle`
    /// fault), keeping its trace context and when it arrived.
    async fn lookup(&self, req: &Request<Incoming>) -> Resp {
        let at = Instant::now();
        if let Some(trace) = req
            .headers()
            .get("traceparent")
            .and_then(|v| v.to_str().ok())
        {
            let mut traces = self.lookup_traces.lock().unwrap_or_else(|e| e.into_inner());
            if traces.len() == LOOKUP_TRACES_KEPT {
                traces.pop_front();
            }
            traces.push_back(trace.to_string());
        }
        let n = bump(&self.counters.lookups);
        let faults = self.faults();
        self.delay(&faults, n).await;
        let throttle = faults.lookup_throttle > 0.0
            && unit(self.config.seed, STREAM_LOOKUP_FAULT, n) < faults.lookup_throttle;
        let resp = if throttle {
            bump(&self.counters.lookups_throttled);
            throttled(&faults)
        } else {
            self.lookup_answer(req)
        };
        let mut lookups = self.lookups.lock().unwrap_or_else(|e| e.into_inner());
        if lookups.len() == LOOKUPS_KEPT {
            lookups.pop_front();
        }
        lookups.push_back(LookupReceived {
            at,
            status: resp.status().as_u16(),
        });
        resp
    }

    /// The records a lookup asks for, or a page of them.
    fn lookup_answer(&self, req: &Request<Incoming>) -> Resp {
        let paging = match self.page_size.load(Ordering::Relaxed) {
            0 => None,
            size => Some(Paging {
                size,
                style: self.config.lookup_paging,
            }),
        };
        let here = self.lookup_here(req.headers());
        let visible_before = now_ms().saturating_sub(self.lag_ms.load(Ordering::Relaxed));
        lookup::answer(
            &self.lock_store(),
            &self.config.identity_field,
            visible_before,
            req.uri().query().unwrap_or(""),
            paging,
            &here,
        )
    }

    /// The absolute URL of the lookup path as the client reached it: its `Host` when that is
    /// a valid authority (a remote in a container is reached by its service name), else the
    /// listening address.
    fn lookup_here(&self, headers: &HeaderMap) -> String {
        let authority = headers
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .and_then(|h| h.parse::<http::uri::Authority>().ok())
            .map_or_else(|| self.addr.to_string(), |a| a.to_string());
        format!("{}://{authority}{}", self.scheme(), self.config.lookup_path)
    }

    fn stats(&self) -> Stats {
        self.counters.snapshot(&self.lock_store())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{self, Client};

    async fn sim(faults: Faults) -> Sim {
        Sim::start(SimConfig {
            seed: 11,
            faults,
            ..SimConfig::default()
        })
        .await
        .unwrap()
    }

    #[test]
    fn each_fault_has_its_share_of_the_draw_and_drop_and_hang_come_last() {
        let before = Faults {
            throttle: 0.1,
            error: 0.1,
            commit_then_drop: 0.1,
            ..Faults::default()
        };
        let after = Faults {
            drop: 0.2,
            hang: 0.2,
            ..before
        };
        let picks = |faults: &Faults| -> Vec<Option<Fault>> {
            [0.05, 0.15, 0.25, 0.35, 0.55, 0.75]
                .into_iter()
                .map(|draw| choose(faults, draw))
                .collect()
        };
        assert_eq!(
            picks(&before),
            [
                Some(Fault::Throttle),
                Some(Fault::Error),
                Some(Fault::CommitThenDrop),
                None,
                None,
                None
            ]
        );
        assert_eq!(
            picks(&after),
            [
                Some(Fault::Throttle),
                Some(Fault::Error),
                Some(Fault::CommitThenDrop),
                Some(Fault::Drop),
                Some(Fault::Hang),
                None
            ]
        );
        assert_eq!(choose(&Faults::default(), 0.0), None);
    }

    #[tokio::test]
    async fn drop_reads_the_request_creates_nothing_and_closes_without_an_answer() {
        let sim = sim(Faults::default()).await;
        let path = sim.config().create_path.clone();
        let created = testing::post(sim.addr(), &path, &json!({"request_key": "a"})).await;
        assert_eq!(created.unwrap().status, 201);
        // Switched on at run time: every create is read whole, then dropped.
        sim.set_faults(Faults {
            drop: 1.0,
            ..Faults::default()
        })
        .unwrap();
        let err = testing::post(sim.addr(), &path, &json!({"request_key": "b"}))
            .await
            .unwrap_err();
        assert!(err.is_incomplete_message(), "{err:?}");
        let stats = sim.stats();
        assert_eq!(
            (
                stats.posts,
                stats.records,
                stats.dropped_uncommitted,
                stats.dropped
            ),
            (2, 1, 1, 0)
        );
        assert!(sim.records_with_identity("b").is_empty());
        // Off again: creates are created and answered.
        sim.set_faults(Faults::default()).unwrap();
        let created = testing::post(sim.addr(), &path, &json!({"request_key": "b"})).await;
        assert_eq!(created.unwrap().status, 201);
        assert_eq!(sim.records_with_identity("b").len(), 1);
    }

    #[tokio::test]
    async fn hang_reads_the_request_creates_nothing_and_never_answers() {
        let sim = sim(Faults {
            hang: 1.0,
            ..Faults::default()
        })
        .await;
        let path = sim.config().create_path.clone();
        let mut client = Client::connect(sim.addr()).await.unwrap();
        let answer = tokio::time::timeout(
            Duration::from_millis(300),
            client.post(&path, &json!({"request_key": "a"})),
        )
        .await;
        assert!(answer.is_err(), "answered: {answer:?}");
        let stats = sim.stats();
        assert_eq!(
            (
                stats.posts,
                stats.records,
                stats.hung_uncommitted,
                stats.hung
            ),
            (1, 0, 1, 0)
        );
        // The connection stays open: the remote never closed it.
        assert!(!client.is_closed());
    }

    #[tokio::test]
    async fn error_503_creates_nothing_and_sends_no_retry_after() {
        let sim = sim(Faults {
            error: 1.0,
            error_status: 503,
            ..Faults::default()
        })
        .await;
        let path = sim.config().create_path.clone();
        let answer = testing::post(sim.addr(), &path, &json!({"request_key": "a"}))
            .await
            .unwrap();
        assert_eq!(answer.status, 503);
        assert!(answer.headers.get(header::RETRY_AFTER).is_none());
        let stats = sim.stats();
        assert_eq!((stats.posts, stats.records, stats.errors), (1, 0, 1));
    }

    #[tokio::test]
    async fn lookup_throttle_answers_retry_after_and_reads_no_record() {
        let sim = sim(Faults {
            lookup_throttle: 1.0,
            retry_after: Duration::from_millis(1500),
            ..Faults::default()
        })
        .await;
        let path = sim.config().create_path.clone();
        // Creates are not throttled by it.
        let created = testing::post(sim.addr(), &path, &json!({"request_key": "a"})).await;
        assert_eq!(created.unwrap().status, 201);
        let before = Instant::now();
        let answer = testing::get(sim.addr(), "/records?request_key=a").await;
        assert_eq!(answer.status, 429);
        assert_eq!(answer.headers[header::RETRY_AFTER], "2");
        sim.set_faults(Faults {
            lookup_throttle: 1.0,
            throttle_status: 503,
            ..Faults::default()
        })
        .unwrap();
        let answer = testing::get(sim.addr(), "/records?request_key=a").await;
        assert_eq!(answer.status, 503);
        assert_eq!(answer.headers[header::RETRY_AFTER], "1");
        sim.set_faults(Faults::default()).unwrap();
        let answer = testing::get(sim.addr(), "/records?request_key=a").await;
        assert_eq!(
            (answer.status, answer.body.as_array().map(Vec::len)),
            (200, Some(1))
        );
        let stats = sim.stats();
        assert_eq!(
            (stats.lookups, stats.lookups_throttled, stats.throttled),
            (3, 2, 0)
        );
        let received = sim.lookups_received();
        let statuses: Vec<u16> = received.iter().map(|l| l.status).collect();
        assert_eq!(statuses, [429, 503, 200]);
        assert!(received[0].at >= before);
        assert!(received.windows(2).all(|w| w[0].at <= w[1].at));
    }

    #[tokio::test]
    async fn peak_in_flight_counts_creates_and_lookups_worked_on_at_once() {
        let sim = sim(Faults {
            latency: Duration::from_millis(200),
            ..Faults::default()
        })
        .await;
        let (addr, path) = (sim.addr(), sim.config().create_path.clone());
        // One at a time: a peak of one.
        testing::post(addr, &path, &json!({"request_key": "a"}))
            .await
            .unwrap();
        testing::get(addr, "/records?request_key=a").await;
        assert_eq!(sim.stats().peak_in_flight, 1);
        // Two creates and a lookup at once (the stats request is not counted).
        let (b, c) = (json!({"request_key": "b"}), json!({"request_key": "c"}));
        let (a, b, c) = tokio::join!(
            testing::post(addr, &path, &b),
            testing::post(addr, &path, &c),
            testing::get(addr, "/records?request_key=a"),
        );
        assert_eq!(
            (a.unwrap().status, b.unwrap().status, c.status),
            (201, 201, 200)
        );
        testing::get(addr, "/_sim/stats").await;
        assert_eq!(sim.stats().peak_in_flight, 3);
    }

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
}
