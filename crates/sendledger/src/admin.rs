//! The admin HTTP endpoint of a running service: metrics, health, task timelines and manual
//! review. Plain HTTP/1.1 on one socket; bind it to loopback (the configuration's default)
//! or put it behind something that authenticates.
//!
//! | route | what |
//! |---|---|
//! | `GET /metrics` | Prometheus text: every `sendledger_*` metric of the process, plus gauges computed from the ledger (see [`Admin`]) |
//! | `GET /healthz` | `{"ok": true, "last_lsn", "live_tasks", "waiting", "durability", "token_configured"}` (and a `warning` with `buffered` durability); 503 when the engine has stopped |
//! | `GET /tasks/{id}?after=SEQ&limit=N` | a task's state and one page of its timeline: the shape of `sendledger inspect --json` with the events after sequence number `after` (default: from the first), at most `limit` (default 500, at most 5000), and `more` and `next_after` to read on (task id, or `tenant/operation/request_key` URL-encoded); with the task's `request`, `remote_ids_seen` and `lookup_url` (the URL its lookups ask; null without a lookup) |
//! | `GET /reviews` | the tasks in manual review, with reason and evidence (computed at most once per second, however many read it) |
//! | `GET /console`, `/console/task/{id}`, `/console/dashboard`, `/console/assets/{name}` | the review console (see [`crate::console`]): HTML pages that call the routes here; a task page answers 404 for a task not in the ledger |
//! | `POST /reviews/{id}` | resolve a review: `{"as": "succeeded", "remote_id", "by", "reason"}`, `{"as": "failed", "by", "reason"}` or `{"resend": true, "by", "reason"}` |
//!
//! Mutating calls need `Authorization: Bearer <admin.token>` (the scheme in any case); with no
//! token configured they are refused (403). Errors are JSON `{"error": "..."}`: 400 for a bad
//! body (naming the field), 401 for a missing or wrong token, 404 for an unknown task, 409 for
//! a task not in review. The GET routes need no token: listening beyond loopback logs a warning.
//!
//! In kafka mode an instance answers for the partitions it owns: `/healthz` adds `"mode":
//! "kafka"` and `owned_partitions`; `/tasks/{id}` adds `partition` and `owned_here` (a copy of
//! a task whose partition moved away carries a `warning` that it may be behind); `/reviews`
//! lists owned partitions' tasks only; a resolution of a task whose partition is owned
//! elsewhere is refused with 421, naming the partition.
//!
//! Connections are bounded: at most `admin.max_connections` open (more are closed as soon as
//! they are accepted, with a warning at most every [`REFUSED_WARNING_EVERY`]); one that sends no
//! request for `admin.idle_timeout` (new, or kept alive after an answer), or does not complete
//! a request's head and body within `admin.header_read_timeout` of its first byte, is closed.
//!
//! A resolution goes to the task's actor through [`Engine::resolve`], like every other input of
//! the task: the admin endpoint never writes the ledger itself.

use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::Duration;

use anyhow::Context;
use bytes::Bytes;
use http::{header, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use sendledger_actors::Engine;
use sendledger_bus::IngestStats;
use sendledger_core::error::Chain;
use sendledger_core::{fold, Phase, ResolveBody};
use sendledger_store::{Ledger, TaskCounts};
use serde_json::{json, Value};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::config::AdminConfig;
use crate::console;
use crate::timeline::{parse_task, remote_ids_seen, review_json, task_json};

/// How long the gauges computed from the ledger are reused between scrapes.
pub const LEDGER_GAUGES_TTL: Duration = Duration::from_secs(5);

/// How long the `GET /reviews` list is reused (a resolution through the endpoint drops it).
pub const REVIEWS_TTL: Duration = Duration::from_secs(1);

/// Events per page of `GET /tasks/{id}` unless `limit` says otherwise, and the most it may say.
pub const TIMELINE_PAGE: usize = 500;
pub const TIMELINE_PAGE_MAX: usize = 5000;

/// Largest request body accepted.
const MAX_BODY: usize = 64 * 1024;

/// Connections refused for the connection limit are reported at most this often.
pub const REFUSED_WARNING_EVERY: Duration = Duration::from_secs(10);

/// The phases reported by `sendledger_tasks{state}` (every one, zeros included).
const PHASES: [Phase; 8] = [
    Phase::Accepted,
    Phase::Sending,
    Phase::RetryWait,
    Phase::Unknown,
    Phase::ManualReview,
    Phase::Succeeded,
    Phase::Rejected,
    Phase::Failed,
];

/// Installs the process-wide recorder of the `metrics` facade, exporting Prometheus text, and
/// returns the handle [`Admin::start`] renders. Call it once per process, before the engine
/// starts (metrics recorded earlier are lost). Histograms get explicit buckets so they render
/// as Prometheus histograms.
pub fn install_recorder() -> anyhow::Result<PrometheusHandle> {
    // From an fsync (sub-millisecond) to a partition's take-over (seconds to a minute).
    const SECONDS: [f64; 16] = [
        0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 2.5,
        10.0, 30.0, 60.0,
    ];
    const COUNTS: [f64; 12] = [
        1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 4096.0,
    ];
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), &SECONDS)?
        .set_buckets_for_metric(Matcher::Suffix("_appends".into()), &COUNTS)?
        .set_buckets_for_metric(Matcher::Suffix("_events".into()), &COUNTS)?
        .install_recorder()
        .context("installing the metrics recorder (one per process)")?;
    describe();
    Ok(handle)
}

/// `# HELP` text of every metric.
fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    describe_counter!(
        "sendledger_attempts_total",
        "Attempt outcomes recorded, by class (succeeded, rejected, not_sent, unknown)."
    );
    describe_counter!(
        "sendledger_lookups_total",
        "Lookups at remotes, by outcome (none, one, several, error)."
    );
    describe_counter!(
        "sendledger_duplicates_dropped_total",
        "Deliveries dropped as duplicates: by identity (a known request) or offset (already processed)."
    );
    describe_counter!(
        "sendledger_results_published_total",
        "Result records acknowledged by Kafka."
    );
    describe_histogram!(
        "sendledger_journal_batch_appends",
        Unit::Count,
        "Appends per journal write batch (group commit)."
    );
    describe_histogram!(
        "sendledger_journal_fsync_seconds",
        Unit::Seconds,
        "Time of each journal batch write, its fsync included."
    );
    describe_gauge!(
        "sendledger_consumer_lag_messages",
        Unit::Count,
        "Requests-topic consumer lag per partition."
    );
    describe_gauge!("sendledger_tasks", "Tasks in the ledger, by state.");
    describe_gauge!(
        "sendledger_ledger_memory_bytes",
        Unit::Bytes,
        "RocksDB's memory for the ledger: the budget (storage.memory_bytes), what its cache holds, and of that the write buffers."
    );
    describe_counter!(
        "sendledger_requests_lost_total",
        "Requests deleted from the requests topic before they were processed, by partition."
    );
    describe_gauge!(
        "sendledger_partition_blocked",
        "1 while a requests-topic partition is refused (recreated topic, or processed by another ledger)."
    );
    describe_gauge!(
        "sendledger_consumer_group_shared",
        "1 while nothing is consumed because another instance is in the consumer group."
    );
    describe_counter!(
        "sendledger_ingest_pauses_total",
        "Times the consumer paused its partitions because the requests in flight reached kafka.max_unfinished messages or kafka.max_unfinished_bytes bytes."
    );
    describe_gauge!(
        "sendledger_ingest_paused",
        "1 while the consumer's partitions are paused at the in-flight budget (a backlog the service is working through)."
    );
    describe_counter!(
        "sendledger_ledger_write_failures_total",
        "Ledger batch writes that failed (a full disk, an I/O error): nothing of them was recorded, sent or acknowledged."
    );
    describe_gauge!(
        "sendledger_ledger_durability",
        "1 for the ledger's durability mode (sync, or buffered: appends not fsynced, unsafe for production)."
    );
    describe_gauge!(
        "sendledger_partitions_owned",
        "Kafka mode: requests partitions this instance owns (taken over and not lost)."
    );
    describe_histogram!(
        "sendledger_partition_take_over_seconds",
        Unit::Seconds,
        "Kafka mode: time to take a partition over (open its log, fencing the previous owner; restore; resume its tasks)."
    );
    describe_histogram!(
        "sendledger_partition_restore_seconds",
        Unit::Seconds,
        "Kafka mode: time to read a partition's log from the checkpoint and apply it (part of the take-over)."
    );
    describe_counter!(
        "sendledger_restored_events_total",
        "Kafka mode: events read from the log of record into the ledger while taking partitions over, by partition (grows step by step during a restore)."
    );
    describe_gauge!(
        "sendledger_partition_restoring",
        "Kafka mode: 1 while a partition is being restored from its log, by partition."
    );
    describe_histogram!(
        "sendledger_log_commit_seconds",
        Unit::Seconds,
        "Kafka mode: time of each transaction that commits a partition's batch of events (with its results and requests offset)."
    );
    describe_histogram!(
        "sendledger_log_batch_events",
        Unit::Count,
        "Kafka mode: events per partition transaction."
    );
    describe_counter!(
        "sendledger_partitions_lost_total",
        "Partitions this instance stopped processing without giving them up, by cause: `fenced` (kafka mode: another instance opened the partition's log), `failed` (kafka mode: a transaction of its log failed; taken over again while assigned), `session` (the consumer group took them away: this instance's session expired)."
    );
    describe_gauge!(
        "sendledger_unknowns_open",
        "Tasks whose outcome is unknown and being reconciled."
    );
    describe_gauge!(
        "sendledger_unknown_oldest_age_seconds",
        Unit::Seconds,
        "Age of the oldest open unknown outcome."
    );
}

/// A running admin endpoint.
///
/// Besides the metrics the libraries record, `GET /metrics` reports gauges computed from the
/// ledger at scrape time ([`Ledger::task_counts`]): `sendledger_tasks{state}` (every task ever recorded, by phase),
/// `sendledger_unknowns_open` (tasks in phase unknown, reconciling) and
/// `sendledger_unknown_oldest_age_seconds` (since the oldest of them became unknown; 0 when
/// none). Cost: a scan of the whole `tasks` column family (six bytes per task) plus a fold of
/// each unknown task's events, on the blocking pool; the result is reused for
/// [`LEDGER_GAUGES_TTL`], so frequent scrapes stay cheap.
pub struct Admin {
    addr: SocketAddr,
    shared: Arc<Shared>,
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

struct Shared {
    token: Option<String>,
    /// Time allowed for a request body (the head is watched by [`close_when_stalled`]).
    body_timeout: Duration,
    engine: Engine,
    metrics: PrometheusHandle,
    /// When the ledger gauges were last computed.
    gauges_at: Mutex<Option<Instant>>,
    reviews: ReviewsCache,
    /// The consumer's counters, once it runs: refused partitions and lost requests.
    ingest: Mutex<Option<Arc<IngestStats>>>,
}

impl Admin {
    /// Binds `config.listen` and serves until [`Admin::shutdown`], within the configured
    /// connection limit and timeouts. `metrics` is the handle of the installed recorder
    /// ([`install_recorder`]); `config.token` guards the mutating routes (none configured: they
    /// are refused).
    pub async fn start(
        config: &AdminConfig,
        engine: Engine,
        metrics: PrometheusHandle,
    ) -> anyhow::Result<Admin> {
        let listen = config.listen;
        let listener = TcpListener::bind(listen)
            .await
            .with_context(|| format!("binding the admin endpoint to {listen}"))?;
        let addr = listener.local_addr()?;
        let token = config.token.clone().filter(|t| !t.is_empty());
        if reads_exposed(&addr) {
            tracing::warn!(
                %addr,
                mutations_need_token = token.is_some(),
                "admin endpoint listens beyond loopback and its GET routes (metrics, task timelines with payloads, reviews) need no token: bind it to loopback or put it behind something that authenticates"
            );
        }
        let (stop, stopped) = watch::channel(false);
        let shared = Arc::new(Shared {
            token,
            body_timeout: config.header_read_timeout,
            engine,
            metrics,
            gauges_at: Mutex::new(None),
            reviews: ReviewsCache::new(REVIEWS_TTL),
            ingest: Mutex::new(None),
        });
        // The recorder buffers histogram samples until upkeep drains them: run it even when
        // nothing scrapes.
        let upkeep = {
            let (handle, mut stopped) = (shared.metrics.clone(), stopped.clone());
            tokio::spawn(async move {
                loop {
                    tokio::select! {
                        _ = tokio::time::sleep(LEDGER_GAUGES_TTL) => handle.run_upkeep(),
                        _ = stopped.wait_for(|s| *s) => return,
                    }
                }
            })
        };
        let limits = Limits {
            connections: Arc::new(Semaphore::new(config.max_connections)),
            max_connections: config.max_connections,
            idle_timeout: config.idle_timeout,
            header_read_timeout: config.header_read_timeout,
        };
        let accept = tokio::spawn(accept_loop(listener, shared.clone(), limits, stopped));
        tracing::info!(%addr, "admin endpoint listening");
        Ok(Admin {
            addr,
            shared,
            stop,
            tasks: vec![accept, upkeep],
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Shows the consumer's refused partitions and lost requests in `/healthz`.
    pub fn watch_ingest(&self, stats: Arc<IngestStats>) {
        *self.shared.ingest.lock().unwrap_or_else(|e| e.into_inner()) = Some(stats);
    }

    /// Stops accepting and closes open connections.
    pub async fn shutdown(self) {
        self.stop.send_replace(true);
        for task in self.tasks {
            let _ = task.await;
        }
    }
}

/// Whether `listen` can be reached from other machines (the GET routes need no token).
fn reads_exposed(listen: &SocketAddr) -> bool {
    !listen.ip().to_canonical().is_loopback()
}

/// What bounds the connections.
struct Limits {
    connections: Arc<Semaphore>,
    max_connections: usize,
    idle_timeout: Duration,
    header_read_timeout: Duration,
}

async fn accept_loop(
    listener: TcpListener,
    shared: Arc<Shared>,
    limits: Limits,
    mut stopped: watch::Receiver<bool>,
) {
    // Connections refused since the last warning, and when that was.
    let mut refused = 0u64;
    let mut warned_at: Option<Instant> = None;
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = stopped.wait_for(|s| *s) => return,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(e) => {
                tracing::warn!(error = %e, "admin endpoint: accept failed");
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
                    "admin endpoint: connection limit reached; new connections are closed (raise admin.max_connections if this is legitimate)"
                );
                warned_at = Some(Instant::now());
                refused = 0;
            }
            continue;
        };
        let (shared, mut stopped) = (shared.clone(), stopped.clone());
        let (idle, head) = (limits.idle_timeout, limits.header_read_timeout);
        tokio::spawn(async move {
            let _permit = permit;
            let wait = Arc::new(Mutex::new(Wait::request()));
            let service = {
                let wait = wait.clone();
                service_fn(move |req| {
                    let (shared, wait) = (shared.clone(), wait.clone());
                    async move {
                        set_wait(&wait, Wait::Serving);
                        let response = handle(&shared, req).await;
                        set_wait(&wait, Wait::request());
                        Ok::<_, Infallible>(response)
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
                    tracing::debug!(error = %e, "admin endpoint: connection ended with an error");
                },
                _ = close_when_stalled(&wait, idle, head) => {
                    tracing::debug!("admin endpoint: closing a connection that sent no complete request in time");
                }
                _ = stopped.wait_for(|s| *s) => {}
            }
        });
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

/// A connection's socket that notes when a request's first byte arrives.
struct Watched {
    stream: TcpStream,
    wait: Arc<Mutex<Wait>>,
}

impl AsyncRead for Watched {
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

impl AsyncWrite for Watched {
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

/// An error answer: its status and message.
struct Failure(StatusCode, String);

impl Failure {
    fn new(status: StatusCode, message: impl Into<String>) -> Failure {
        Failure(status, message.into())
    }
}

impl From<sendledger_actors::Error> for Failure {
    fn from(e: sendledger_actors::Error) -> Failure {
        use sendledger_actors::Error as E;
        let status = match &e {
            E::NoSuchTask(_) => StatusCode::NOT_FOUND,
            E::Invalid(inner @ sendledger_core::Error::NotInReview { .. }) => {
                return Failure(StatusCode::CONFLICT, inner.to_string())
            }
            E::Invalid(_) => StatusCode::BAD_REQUEST,
            E::ShuttingDown | E::Stopped => StatusCode::SERVICE_UNAVAILABLE,
            // Kafka mode: another instance owns the task's partition and answers for it.
            E::NotOwned { .. } => StatusCode::MISDIRECTED_REQUEST,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        Failure(status, Chain(&e).to_string())
    }
}

impl From<sendledger_store::Error> for Failure {
    fn from(e: sendledger_store::Error) -> Failure {
        Failure(StatusCode::INTERNAL_SERVER_ERROR, Chain(&e).to_string())
    }
}

type Answer = Result<Response<Full<Bytes>>, Failure>;

async fn handle(shared: &Shared, req: Request<Incoming>) -> Response<Full<Bytes>> {
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let answer = match (&method, segments.as_slice()) {
        (&Method::GET, ["metrics"]) => metrics(shared).await,
        (&Method::GET, ["healthz"]) => healthz(shared).await,
        (&Method::GET, ["tasks", id]) => task(shared, id, req.uri().query()).await,
        (&Method::GET, ["reviews"]) => reviews(shared).await,
        (&Method::POST, ["reviews", id]) => resolve(shared, id, req).await,
        (&Method::GET, ["console", rest @ ..]) => Ok(console_route(shared, rest).await),
        (_, ["console", ..]) => Err(Failure::new(
            StatusCode::METHOD_NOT_ALLOWED,
            format!("{method} is not allowed on {path}: the console's pages are read with GET"),
        )),
        (_, ["metrics" | "healthz" | "reviews"] | ["tasks" | "reviews", _]) => Err(Failure::new(
            StatusCode::METHOD_NOT_ALLOWED,
            format!("{method} is not allowed on {path}"),
        )),
        _ => Err(Failure::new(
            StatusCode::NOT_FOUND,
            format!("no route {path}; see GET /metrics, /healthz, /tasks/{{id}}, /reviews, /console, POST /reviews/{{id}}"),
        )),
    };
    answer.unwrap_or_else(|Failure(status, message)| {
        if status.is_server_error() {
            tracing::warn!(%method, %path, %status, error = %message, "admin request failed");
        }
        json_response(status, &json!({ "error": message }))
    })
}

/// A console page or asset ([`console`]); a task page only for a task in the ledger, so a
/// mistyped id gets a 404 page rather than an empty one.
async fn console_route(shared: &Shared, rest: &[&str]) -> Response<Full<Bytes>> {
    match rest {
        ["assets", name] => console::asset(name),
        ["task", segment] if !segment.is_empty() => {
            let Ok(task_id) = task_ref(segment) else {
                return console::error_page(
                    StatusCode::BAD_REQUEST,
                    "This is not a task reference: use a task id (32 hex digits) or tenant/operation/request_key URL-encoded.",
                );
            };
            match shared.engine.events(task_id).await {
                Ok(events) if events.is_empty() => console::error_page(
                    StatusCode::NOT_FOUND,
                    "No such task: the ledger holds no event of it.",
                ),
                Ok(_) => console::page(console::Page::Task),
                Err(e) => {
                    tracing::warn!(error = %Chain(&e), "console: cannot read a task");
                    console::error_page(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "The task cannot be read now; the service's log says why.",
                    )
                }
            }
        }
        _ => match console::page_of(rest) {
            Some(page) => console::page(page),
            None => console::error_page(StatusCode::NOT_FOUND, "No such console page."),
        },
    }
}

fn json_response(status: StatusCode, body: &Value) -> Response<Full<Bytes>> {
    json_bytes_response(status, Bytes::from(body.to_string()))
}

fn json_bytes_response(status: StatusCode, body: Bytes) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(body));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    resp
}

async fn metrics(shared: &Shared) -> Answer {
    if let Some(usage) = shared.engine.ledger().memory_usage() {
        for (kind, bytes) in [
            ("budget", usage.budget),
            ("cached", usage.cached),
            ("write_buffers", usage.write_buffers),
        ] {
            metrics::gauge!("sendledger_ledger_memory_bytes", "kind" => kind).set(bytes as f64);
        }
    }
    if let Some(ownership) = shared.engine.ownership() {
        metrics::gauge!("sendledger_partitions_owned").set(ownership.partitions().len() as f64);
    }
    let stale = shared
        .gauges_at
        .lock()
        .map(|at| at.is_none_or(|at| at.elapsed() >= LEDGER_GAUGES_TTL))
        .unwrap_or(true);
    if stale {
        let counts = shared.engine.ledger().read(Ledger::task_counts).await?;
        publish_counts(&counts);
        if let Ok(mut at) = shared.gauges_at.lock() {
            *at = Some(Instant::now());
        }
    }
    let mut resp = Response::new(Full::new(Bytes::from(shared.metrics.render())));
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/plain; version=0.0.4"),
    );
    Ok(resp)
}

/// Sets the gauges `GET /metrics` reports from the ledger itself.
fn publish_counts(counts: &TaskCounts) {
    for phase in PHASES {
        let n = counts.by_phase.get(&phase).copied().unwrap_or(0);
        metrics::gauge!("sendledger_tasks", "state" => phase.name()).set(n as f64);
    }
    metrics::gauge!("sendledger_unknowns_open").set(counts.unknowns_open as f64);
    let age_ms = counts
        .oldest_unknown_since
        .map_or(0, |since| sendledger_actors::now_ms().saturating_sub(since));
    metrics::gauge!("sendledger_unknown_oldest_age_seconds").set(age_ms as f64 / 1000.0);
}

async fn healthz(shared: &Shared) -> Answer {
    let (live_tasks, waiting) = shared.engine.load().await?;
    let mut body = json!({ "ok": true, "last_lsn": shared.engine.ledger().last_lsn(), "live_tasks": live_tasks, "waiting": waiting, "durability": "sync", "token_configured": shared.token.is_some() });
    let mut status = StatusCode::OK;
    if shared.engine.durability() == sendledger_store::Durability::Buffered {
        body["durability"] = json!("buffered");
        body["warning"] = json!("storage.durability is `buffered`: acknowledged events are not fsynced and can be lost on power loss or an OS crash; use `sync` in production");
    }
    if let Some(why) = shared.engine.ledger().stats().failing() {
        // Nothing is recorded, so nothing is accepted or sent: an operator must act.
        status = StatusCode::SERVICE_UNAVAILABLE;
        body["ok"] = json!(false);
        body["ledger_error"] = json!(format!("the ledger cannot write: {why}"));
    }
    let ingest = shared
        .ingest
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    if let Some(ownership) = shared.engine.ownership() {
        body["mode"] = json!("kafka");
        body["owned_partitions"] = json!(ownership.partitions());
    }
    if let Some(stats) = ingest {
        body["requests_lost"] = json!(IngestStats::get(&stats.lost));
        let blocked = stats.blocked();
        if !blocked.is_empty() {
            // A partition nobody consumes: an operator must act (see each reason).
            status = StatusCode::SERVICE_UNAVAILABLE;
            body["ok"] = json!(false);
            body["blocked_partitions"] = json!(blocked);
        }
        if let Some(why) = stats.shared_group() {
            // Nothing is consumed while another instance is in the group.
            status = StatusCode::SERVICE_UNAVAILABLE;
            body["ok"] = json!(false);
            body["shared_group"] = json!(why);
        }
    }
    Ok(json_response(status, &body))
}

/// A task named in a path segment: a task id, or `tenant/operation/request_key` URL-encoded.
fn task_ref(segment: &str) -> Result<sendledger_core::TaskId, Failure> {
    let decoded = percent_encoding::percent_decode_str(segment)
        .decode_utf8()
        .map_err(|_| Failure::new(StatusCode::BAD_REQUEST, "task reference is not UTF-8"))?;
    parse_task(&decoded).map_err(|e| Failure::new(StatusCode::BAD_REQUEST, e.to_string()))
}

/// The page of a timeline a query asks for: `after` (a sequence number) and `limit`.
fn timeline_page(query: Option<&str>) -> Result<(Option<u32>, usize), Failure> {
    let bad = |message: String| Failure::new(StatusCode::BAD_REQUEST, message);
    let (mut after, mut limit) = (None, TIMELINE_PAGE);
    for pair in query
        .unwrap_or_default()
        .split('&')
        .filter(|p| !p.is_empty())
    {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        match name {
            "after" => {
                after = Some(value.parse().map_err(|_| {
                    bad(format!(
                        "`after` is {value:?}; use the sequence number of an event (`next_after`)"
                    ))
                })?)
            }
            "limit" => {
                limit = value
                    .parse()
                    .ok()
                    .filter(|n| (1..=TIMELINE_PAGE_MAX).contains(n))
                    .ok_or_else(|| {
                        bad(format!(
                            "`limit` is {value:?}; use 1 to {TIMELINE_PAGE_MAX}"
                        ))
                    })?
            }
            _ => {
                return Err(bad(format!(
                    "unknown query parameter `{name}`; use `after` and `limit`"
                )))
            }
        }
    }
    Ok((after, limit))
}

async fn task(shared: &Shared, segment: &str, query: Option<&str>) -> Answer {
    let task_id = task_ref(segment)?;
    let (after, limit) = timeline_page(query)?;
    let events = shared.engine.events(task_id).await?;
    let ownership = shared.engine.ownership();
    if events.is_empty() {
        let message = match ownership {
            None => format!("task {task_id} is not in the ledger"),
            Some(o) => format!(
                "task {task_id} is not in this instance's ledger; in kafka mode a task is known to the instance that owns its requests partition (owned here: {:?})",
                o.partitions()
            ),
        };
        return Err(Failure::new(StatusCode::NOT_FOUND, message));
    }
    let start = after.map_or(0, |after| events.partition_point(|e| e.task_seq <= after));
    let page = &events[start..events.len().min(start + limit)];
    let more = start + page.len() < events.len();
    let state = fold(&events);
    let mut body = task_json(task_id, &state, page);
    if let (Some(o), Some(source)) = (ownership, &state.source) {
        // Kafka mode: a copy left from an earlier ownership may be behind its owner's.
        let owned = o.epoch(source.partition).is_some();
        body["partition"] = json!(source.partition);
        body["owned_here"] = json!(owned);
        if !owned {
            body["warning"] = json!(format!(
                "requests partition {} is owned by another instance: this copy is from when it was owned here and may be behind; ask the owner",
                source.partition
            ));
        }
    }
    body["remote_ids_seen"] = remote_ids_seen(&events);
    body["lookup_url"] = match state
        .request
        .as_ref()
        .and_then(|r| shared.engine.lookup_url(r))
    {
        Some(Ok(url)) => json!(url),
        Some(Err(why)) => json!(format!("cannot be built: {why}")),
        None => Value::Null,
    };
    body["more"] = json!(more);
    body["next_after"] = json!(page.last().filter(|_| more).map(|e| e.task_seq));
    Ok(json_response(StatusCode::OK, &body))
}

async fn reviews(shared: &Shared) -> Answer {
    let body = shared
        .reviews
        .get(|| async {
            let items = shared.engine.reviews().await?;
            let list: Vec<Value> = items.iter().map(review_json).collect();
            Ok(Bytes::from(Value::Array(list).to_string()))
        })
        .await?;
    Ok(json_bytes_response(StatusCode::OK, body))
}

/// The `GET /reviews` body, reused for `ttl`. The lock is async and held while the list is
/// computed, so concurrent reads wait for one computation (each would fold every task in
/// review) instead of starting their own.
struct ReviewsCache {
    ttl: Duration,
    body: tokio::sync::Mutex<Option<(Instant, Bytes)>>,
}

impl ReviewsCache {
    fn new(ttl: Duration) -> ReviewsCache {
        ReviewsCache {
            ttl,
            body: tokio::sync::Mutex::new(None),
        }
    }

    /// The cached body, or the one `compute` makes when there is none younger than the TTL.
    async fn get<F, Fut>(&self, compute: F) -> Result<Bytes, Failure>
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = Result<Bytes, Failure>>,
    {
        let mut body = self.body.lock().await;
        if let Some((at, bytes)) = &*body {
            if at.elapsed() < self.ttl {
                return Ok(bytes.clone());
            }
        }
        let bytes = compute().await?;
        *body = Some((Instant::now(), bytes.clone()));
        Ok(bytes)
    }

    /// Drops the cached body: the next read computes the list again.
    async fn clear(&self) {
        *self.body.lock().await = None;
    }
}

fn authorize(shared: &Shared, req: &Request<Incoming>) -> Result<(), Failure> {
    let Some(token) = &shared.token else {
        return Err(Failure::new(
            StatusCode::FORBIDDEN,
            "mutating calls are disabled: set `admin.token` in the configuration and send it as `Authorization: Bearer <token>`",
        ));
    };
    let given = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(bearer_token);
    match given {
        Some(given) if constant_time_eq(given.as_bytes(), token.as_bytes()) => Ok(()),
        Some(_) => Err(Failure::new(
            StatusCode::UNAUTHORIZED,
            "wrong admin token; send the configured `admin.token` as `Authorization: Bearer <token>`",
        )),
        None => Err(Failure::new(
            StatusCode::UNAUTHORIZED,
            "missing `Authorization: Bearer <token>` (the configured `admin.token`)",
        )),
    }
}

/// The token of an `Authorization: Bearer <token>` value; the scheme is case-insensitive
/// (RFC 7235).
fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim().split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim_start())
}

/// Compares without stopping at the first difference, so timing does not reveal the token.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

async fn resolve(shared: &Shared, segment: &str, req: Request<Incoming>) -> Answer {
    authorize(shared, &req)?;
    let task_id = task_ref(segment)?;
    let body = tokio::time::timeout(
        shared.body_timeout,
        Limited::new(req.into_body(), MAX_BODY).collect(),
    )
    .await
    .map_err(|_| {
        Failure::new(
            StatusCode::REQUEST_TIMEOUT,
            "the body did not arrive within admin.header_read_timeout",
        )
    })?
    .map_err(|e| {
        Failure::new(
            StatusCode::BAD_REQUEST,
            format!("cannot read the body: {e}"),
        )
    })?
    .to_bytes();
    let body: ResolveBody = serde_json::from_slice(&body)
        .map_err(|e| Failure::new(StatusCode::BAD_REQUEST, format!("bad body: {e}")))?;
    let resolution = body
        .resolution()
        .map_err(|e| Failure::new(StatusCode::BAD_REQUEST, format!("bad body: {e}")))?;
    let reply = shared.engine.resolve(task_id, resolution).await?;
    shared.reviews.clear().await;
    tracing::info!(task_id = %task_id, events = ?reply.events, phase = reply.phase.name(), "review resolved");
    Ok(json_response(
        StatusCode::OK,
        &json!({ "task_id": task_id.to_string(), "state": reply.phase.name(), "recorded": reply.events }),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Concurrent reads of the review list compute it once; a resolution's `clear` makes the
    /// next read compute it again.
    #[tokio::test]
    async fn the_review_list_is_computed_once_for_concurrent_reads() {
        let cache = ReviewsCache::new(Duration::from_secs(3600));
        let computed = std::sync::atomic::AtomicU32::new(0);
        let read = || {
            cache.get(|| async {
                let n = computed.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                tokio::task::yield_now().await;
                Ok(Bytes::from(n.to_string()))
            })
        };
        let bodies = tokio::join!(read(), read(), read(), read());
        let bodies = [bodies.0, bodies.1, bodies.2, bodies.3];
        assert!(bodies
            .iter()
            .all(|b| b.as_ref().ok() == Some(&Bytes::from("0"))));
        cache.clear().await;
        assert_eq!(read().await.ok(), Some(Bytes::from("1")));
        assert_eq!(computed.load(std::sync::atomic::Ordering::SeqCst), 2);
    }
    #[test]
    fn the_bearer_scheme_is_case_insensitive() {
        for value in [
            "Bearer tok en",
            "bearer tok en",
            "BEARER  tok en",
            " bEaReR tok en",
        ] {
            assert_eq!(bearer_token(value), Some("tok en"), "{value}");
        }
        for value in ["Basic tok", "Bearertok", "tok", ""] {
            assert_eq!(bearer_token(value), None, "{value}");
        }
    }

    #[test]
    fn reads_are_exposed_beyond_loopback_only() {
        for listen in ["127.0.0.1:9464", "[::1]:9464", "[::ffff:127.0.0.1]:9464"] {
            assert!(!reads_exposed(&listen.parse().unwrap()), "{listen}");
        }
        for listen in [
            "0.0.0.0:9464",
            "[::]:9464",
            "10.1.2.3:9464",
            "[::ffff:10.0.0.1]:1",
        ] {
            assert!(reads_exposed(&listen.parse().unwrap()), "{listen}");
        }
    }
}
