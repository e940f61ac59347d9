//! The admin HTTP endpoint of a running service: metrics, health, task timelines and manual
//! review. Plain HTTP/1.1 on one socket (loopback by default); who may call what is decided by
//! [`auth`] from the configured operators.
//!
//! The routes are an axum [`Router`] with one module per resource ([`metrics`], [`health`],
//! [`tasks`], [`reviews`], [`console`]) and one error type ([`ApiError`]); [`routes`] gives
//! them without a listener. [`Admin`] serves them on its own accept loop, which keeps the
//! connection cap and the timeouts below.
//!
//! | route | what |
//! |---|---|
//! | `GET /metrics` | Prometheus text: every `sendledger_*` metric of the process, plus gauges computed from the ledger (see [`Admin`]) |
//! | `GET /healthz` | `{"ok": true, "last_lsn", "live_tasks", "waiting", "durability", "token_configured", "reads_need_credential"}` (and a `warning` with `buffered` durability); 503 when the engine has stopped |
//! | `GET /whoami` | the operator, credential id, roles and tenants of the credential sent |
//! | `GET /tasks/{id}?after=SEQ&limit=N` | a task's state and one page of its timeline: the shape of `sendledger inspect --json` with the events after sequence number `after` (default: from the first), at most `limit` (default 500, at most 5000), and `more` and `next_after` to read on (task id, or `tenant/operation/request_key` URL-encoded); with the task's `request`, `remote_ids_seen` and `lookup_url` (the URL its lookups ask; null without a lookup) |
//! | `GET /reviews` | the tasks in manual review, with reason and evidence (computed at most once per second, however many read it) |
//! | `GET /console`, `/console/task/{id}`, `/console/dashboard`, `/console/assets/{name}` | the review console (see [`console`]): HTML pages that call the routes here; a task page answers 404 for a task not in the ledger |
//! | `GET /tasks?phase=&target=&failure=&from=&to=&after=&limit=` | tasks from the ledger's task index, by phase (comma-separated), target, failure kind (`connect`, `throttled`, `server_error`, `local_resources`, `operator`) and when they entered their phase (`from` inclusive, `to` exclusive; RFC 3339 or ms since the epoch), ordered by phase, target, then time: `{"tasks": [{"task_id", "state", "target", "since", "failure"}], "next"}`; pass `next` as `after` to read on (`limit` default 100, at most 1000) |
//! | `POST /tasks/{id}/retry` | retry a failed task whose every attempt was proven not sent: `{"by", "reason"}`; 409 with why for a task that cannot be retried |
//! | `POST /tasks/retry` | retry failed tasks in bulk: `{"by", "reason", "target", "failure", "from", "to", "after", "limit"}` (selectors as `GET /tasks`, limit default 1000, at most 10000); answers `{"selected", "retried", "refused", "refusals", "next"}`; call again with `after: next` until `next` is null |
//! | `POST /reviews/{id}` | resolve a review: `{"as": "succeeded", "remote_id", "by", "reason"}`, `{"as": "failed", "by", "reason"}` or `{"resend": true, "by", "reason"}` |
//!
//! Decisions need `Authorization: Bearer <token>` (the scheme in any case) of an operator with
//! the role for them, or the shared `admin.token`; with no credential configured they are
//! refused (403). The routes that show tasks need a credential when `admin.reads_need_credential`
//! holds, and an operator of some tenants sees and acts on theirs only (see [`auth`]). Errors
//! are JSON `{"error": "..."}`: 400 for a bad body (naming the field), 401 for a missing or
//! unknown credential, 403 for a missing role or a `by` not the operator's, 404 for an unknown
//! (or out of scope) task, 409 for a task not in review.
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

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use bytes::Bytes;
use http::{header, Method, StatusCode, Uri};
use metrics_exporter_prometheus::PrometheusHandle;
use sendledger_actors::Engine;
use sendledger_kafka::IngestStats;
use serde_json::Value;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::config::AdminConfig;
use crate::error::Result;
use crate::serve::{accept_loop, Limits};

mod auth;
mod console;
mod error;
mod health;
mod metrics;
mod retries;
mod reviews;
mod task_list;
mod tasks;

pub use error::ApiError;
pub use metrics::install_recorder;

/// How long the gauges computed from the ledger are reused between scrapes.
pub const LEDGER_GAUGES_TTL: Duration = Duration::from_secs(5);

/// How long the `GET /reviews` list is reused (a resolution through the endpoint drops it).
pub const REVIEWS_TTL: Duration = Duration::from_secs(1);

/// Events per page of `GET /tasks/{id}` unless `limit` says otherwise, and the most it may say.
pub const TIMELINE_PAGE: usize = 500;
pub const TIMELINE_PAGE_MAX: usize = 5000;

pub use crate::serve::REFUSED_WARNING_EVERY;

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
    gate: auth::Gate,
    /// Time allowed for a request body (the head is watched by [`close_when_stalled`]).
    body_timeout: Duration,
    engine: Engine,
    metrics: PrometheusHandle,
    /// When the ledger gauges were last computed.
    gauges_at: Mutex<Option<Instant>>,
    reviews: reviews::ReviewsCache,
    /// The consumers' counters, once they run (one per requests topic, by topic): refused
    /// partitions and lost requests.
    ingest: Mutex<Vec<(String, Arc<IngestStats>)>>,
}

impl Shared {
    fn new(config: &AdminConfig, engine: Engine, metrics: PrometheusHandle) -> Result<Arc<Shared>> {
        let gate = auth::Gate::new(
            config.token.clone(),
            config.load_operators()?,
            config.reads_need_credential(),
        );
        Ok(Arc::new(Shared {
            gate,
            body_timeout: config.header_read_timeout,
            engine,
            metrics,
            gauges_at: Mutex::new(None),
            reviews: reviews::ReviewsCache::new(REVIEWS_TTL),
            ingest: Mutex::new(Vec::new()),
        }))
    }
}

/// The admin API's routes alone, without a listener: what [`Admin::start`] serves, for use in
/// process (`tower::ServiceExt::oneshot`). Fails when an operator's token cannot be read.
pub fn routes(config: &AdminConfig, engine: Engine, metrics: PrometheusHandle) -> Result<Router> {
    Ok(router(Shared::new(config, engine, metrics)?))
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
    ) -> Result<Admin> {
        let (listener, addr) = crate::serve::bind(config.listen).await?;
        let shared = Shared::new(config, engine, metrics)?;
        if reads_exposed(&addr) && !shared.gate.reads_need_credential() {
            tracing::warn!(
                %addr,
                "admin endpoint listens beyond loopback and admin.reads_need_credential is false: its GET routes (metrics, task timelines with payloads, reviews) answer anyone who reaches the port; keep something in front of it that authenticates"
            );
        }
        let (stop, stopped) = watch::channel(false);
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
        let limits = Limits::new(
            "admin endpoint",
            "admin.max_connections",
            config.max_connections,
            config.idle_timeout,
            config.header_read_timeout,
        )
        .with_tls(
            config
                .tls
                .as_ref()
                .map(|t| t.acceptor("admin.tls"))
                .transpose()?,
        );
        let accept = tokio::spawn(accept_loop(
            listener,
            router(shared.clone()),
            limits,
            stopped,
        ));
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

    /// Shows the refused partitions and lost requests of the consumer of `topic` in
    /// `/healthz` (the first one watched is the requests topic's; others are tenants' own).
    pub fn watch_ingest(&self, topic: &str, stats: Arc<IngestStats>) {
        let mut ingests = self.shared.ingest.lock().unwrap_or_else(|e| e.into_inner());
        ingests.push((topic.to_string(), stats));
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

/// The routes, one module per resource, over the shared state.
fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/metrics", get(metrics::scrape))
        .route("/healthz", get(health::healthz))
        .route("/tasks", get(task_list::list))
        .route("/tasks/retry", post(retries::retry_bulk))
        .route("/tasks/{id}", get(tasks::task))
        .route("/tasks/{id}/retry", post(retries::retry_one))
        .route("/reviews", get(reviews::list))
        .route("/reviews/{id}", post(reviews::resolve))
        .route("/whoami", get(auth::whoami))
        .route("/console", get(console::route))
        .route("/console/", get(console::route))
        .route("/console/{*rest}", get(console::route))
        .method_not_allowed_fallback(method_not_allowed)
        .fallback(no_route)
        .layer(axum::middleware::from_fn(log_failures))
        .with_state(shared)
}

/// Logs a request that failed on the server's side, with its method, path and why (a client's
/// mistake is the client's to read in the answer).
async fn log_failures(request: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let (method, path) = (request.method().clone(), request.uri().path().to_owned());
    let response = next.run(request).await;
    if let Some(error::Failed(error)) = response.extensions().get() {
        tracing::warn!(%method, %path, status = %response.status(), %error, "admin request failed");
    }
    response
}

async fn method_not_allowed(method: Method, uri: Uri) -> ApiError {
    let path = uri.path();
    let message = match path.starts_with("/console") {
        true => format!("{method} is not allowed on {path}: the console's pages are read with GET"),
        false => format!("{method} is not allowed on {path}"),
    };
    ApiError::new(StatusCode::METHOD_NOT_ALLOWED, message)
}

async fn no_route(uri: Uri) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        format!(
            "no route {}; see GET /metrics, /healthz, /tasks/{{id}}, /reviews, /console, POST /reviews/{{id}}",
            uri.path()
        ),
    )
}

/// The raw (percent-encoded) last segment of a path: a task reference is one segment, which
/// may hold an encoded `/`.
fn last_segment(uri: &Uri) -> &str {
    uri.path().rsplit('/').next().unwrap_or_default()
}

/// Largest request body accepted.
const MAX_BODY: usize = 64 * 1024;

/// A JSON request body of at most [`MAX_BODY`] bytes, read within the configured time: an
/// error names what is wrong (`bad body: ...`).
async fn read_json<T: serde::de::DeserializeOwned>(
    shared: &Shared,
    body: axum::body::Body,
) -> Result<T, ApiError> {
    use http_body_util::{BodyExt, Limited};
    let bytes = tokio::time::timeout(shared.body_timeout, Limited::new(body, MAX_BODY).collect())
        .await
        .map_err(|_| {
            ApiError::new(
                StatusCode::REQUEST_TIMEOUT,
                "the body did not arrive within admin.header_read_timeout",
            )
        })?
        .map_err(|e| ApiError::bad_request(format!("cannot read the body: {e}")))?
        .to_bytes();
    serde_json::from_slice(&bytes).map_err(|e| ApiError::bad_request(format!("bad body: {e}")))
}

fn json_response(status: StatusCode, body: &Value) -> Response {
    json_bytes_response(status, Bytes::from(body.to_string()))
}

fn json_bytes_response(status: StatusCode, body: Bytes) -> Response {
    (status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

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
