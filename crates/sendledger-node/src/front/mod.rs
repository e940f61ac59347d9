//! The HTTP front door: callers submit a task with an `Idempotency-Key` and may wait for its
//! result; a retry with the same key gets the stored result, never a second side effect
//! (`docs/front-door.md`).
//!
//! | route | what |
//! |---|---|
//! | `POST /v1/tasks` | a task request as JSON (the fields of a requests-topic message; `request_key` from the `Idempotency-Key` header or the body); `Prefer: wait=N` waits up to N seconds (at most `front.max_wait`) for the result |
//! | `GET /v1/tasks/{id}` | the task's latest result; `Retry-After` while it is not terminal |
//!
//! A request is made durable before any 2xx or 202. In local mode it is submitted to the
//! engine, whose answer comes once the task's acceptance is in the ledger (its source
//! [`Source::front_door`], not a Kafka message). In kafka mode it is produced to the requests
//! topic and acknowledged, and its partition's owner executes it ([`kafka`]). Otherwise it is
//! answered 503 with `Retry-After`. The same identity and payload-hash check as for Kafka
//! messages applies: a request that came both ways is one task. Errors are RFC 9457 problem
//! documents (`application/problem+json`).
//!
//! Waiting requests hold no thread: each is a future woken by the engine when it records the
//! task's events (`Engine::watch`), at most `front.max_waiting` at once (503 beyond). A
//! client that disconnects drops its wait.
//!
//! With `[front.callers]`, every request needs a caller's credential (a bearer token, or a
//! client certificate on a listener with mutual TLS), and a caller submits and reads tasks of
//! its tenants only. With `[access]`, a request is checked against its tenant's targets and
//! operations (the rules that do not depend on a topic or a signature: the caller's credential
//! stands for those); a refused one is answered 403 and nothing is recorded.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Extension;
use axum::Router;
use http::{header, HeaderMap, HeaderValue, StatusCode, Uri};
use sendledger_actors::Engine;
use sendledger_core::access::{sign, Access, SIGNATURE_HEADER};
use sendledger_core::trace::{TraceParent, TRACEPARENT};
use sendledger_core::{Source, TaskId, TaskRequest};
use sendledger_kafka::Kafka;
use serde_json::Value;
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinHandle;

use crate::callers::Callers;
use crate::config::FrontConfig;
use crate::credentials::bearer_token;
use crate::error::Result;
use crate::metric_definitions::{FRONT_CONFLICTS_TOTAL, FRONT_REPLAYS_TOTAL, FRONT_REQUESTS_TOTAL};
use crate::operators::Scope;
use crate::serve::{accept_loop, Limits};
use crate::tls::PeerCertificate;

mod kafka;
mod problem;
mod wait;

use kafka::KafkaDoor;
use problem::Problem;
use wait::{progress, wait_for, Progress, Waiting};

/// The header that carries a request's key (draft-ietf-httpapi-idempotency-key-header).
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";

/// The header that marks an answer given from a stored result, not a new execution.
pub const REPLAYED: &str = "idempotency-replayed";

/// What a client that is told to come back later waits, in seconds.
const RETRY_AFTER: &str = "1";

/// A running front door.
pub struct FrontDoor {
    addr: SocketAddr,
    stop: watch::Sender<bool>,
    accept: JoinHandle<()>,
}

struct Shared {
    engine: Engine,
    /// Kafka mode: where requests go.
    kafka: Option<KafkaDoor>,
    callers: Callers,
    access: Option<Arc<Access>>,
    waiting: Semaphore,
    max_wait: Duration,
    max_body: usize,
    body_timeout: Duration,
    /// The number of the next submission's source ([`Source::front_door`]).
    submissions: std::sync::atomic::AtomicI64,
}

impl Shared {
    /// The tenants whose tasks the request's caller may submit and read: every tenant when no
    /// caller is configured; otherwise the caller's, from its bearer token or its client
    /// certificate (401 without either, or with one no caller holds).
    fn scope(
        &self,
        headers: &HeaderMap,
        peer: Option<PeerCertificate>,
    ) -> std::result::Result<Scope, Problem> {
        if self.callers.is_empty() {
            return Ok(Scope::All);
        }
        let unauthorized = |detail: &str| {
            Problem::new(
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "No valid credential",
            )
            .detail(detail)
            .challenge()
        };
        let caller = match headers.get(header::AUTHORIZATION) {
            Some(value) => {
                let token = (value.to_str().ok()).and_then(bearer_token).ok_or_else(|| {
                    unauthorized("the Authorization header is not `Bearer <token>`")
                })?;
                (self.callers.by_token(token)).ok_or_else(|| {
                    unauthorized("the token is no configured caller's (revoked, or mistyped)")
                })?
            }
            None => match peer {
                Some(PeerCertificate(fingerprint)) => {
                    self.callers.by_certificate(&fingerprint).ok_or_else(|| {
                        unauthorized("the client certificate is no configured caller's")
                    })?
                }
                None => return Err(unauthorized(
                    "send a caller's token as `Authorization: Bearer <token>`, or its client certificate",
                )),
            },
        };
        Ok(caller.scope.clone())
    }
}

impl FrontDoor {
    /// Binds `config.listen` and serves until [`FrontDoor::shutdown`]; requests are checked
    /// against `access`, then submitted to `engine`, or in kafka mode produced on `kafka`'s
    /// requests topic (`engine` then answers from its copies of the partitions: owned here,
    /// or standby). Callers' tokens are read from the environment.
    pub async fn start(
        config: &FrontConfig,
        engine: Engine,
        access: Option<Arc<Access>>,
        kafka: Option<&Kafka>,
    ) -> Result<FrontDoor> {
        let kafka = kafka.map(KafkaDoor::new).transpose()?;
        let tenants = (access.as_ref()).map(|a| a.tenants.keys().cloned().collect());
        let callers = config.load_callers(tenants.as_ref(), |name| std::env::var(name).ok())?;
        let tls = (config.tls.as_ref())
            .map(|t| t.acceptor("front.tls"))
            .transpose()?;
        let (listener, addr) = crate::serve::bind(config.listen).await?;
        // Numbers that differ from any of an earlier run's (sources are kept in the ledger):
        // microseconds since the epoch at start, counting up.
        let since_epoch = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
        let first = since_epoch.map_or(0, |d| d.as_micros() as i64);
        let shared = Arc::new(Shared {
            engine,
            kafka,
            callers,
            access,
            waiting: Semaphore::new(config.max_waiting),
            max_wait: config.max_wait,
            max_body: config.max_body_bytes,
            body_timeout: config.header_read_timeout,
            submissions: std::sync::atomic::AtomicI64::new(first),
        });
        let limits = Limits::new(
            "front door",
            "front.max_connections",
            config.max_connections,
            config.idle_timeout,
            config.header_read_timeout,
        )
        .with_tls(tls);
        let (stop, stopped) = watch::channel(false);
        let accept = tokio::spawn(accept_loop(listener, router(shared), limits, stopped));
        tracing::info!(%addr, "front door listening");
        Ok(FrontDoor { addr, stop, accept })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops accepting and closes open connections (a waiting caller's request stays durable:
    /// it asks again with `GET /v1/tasks/{id}`).
    pub async fn shutdown(self) {
        self.stop.send_replace(true);
        let _ = self.accept.await;
    }
}

fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/v1/tasks", post(submit))
        .route("/v1/tasks/{id}", get(task))
        .fallback(|uri: Uri| async move {
            Problem::new(StatusCode::NOT_FOUND, "no-route", "No such route").detail(format!(
                "no route {}; use POST /v1/tasks or GET /v1/tasks/{{id}}",
                uri.path()
            ))
        })
        .layer(axum::middleware::from_fn(count))
        .with_state(shared)
}

/// Counts every answer by route and status.
async fn count(request: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let route = match (request.method().as_str(), request.uri().path()) {
        ("POST", "/v1/tasks") => "submit",
        ("GET", p) if p.starts_with("/v1/tasks/") => "task",
        _ => "other",
    };
    let response = next.run(request).await;
    let status = response.status().as_u16().to_string();
    metrics::counter!(FRONT_REQUESTS_TOTAL, "route" => route, "status" => status).increment(1);
    response
}

/// `POST /v1/tasks`.
async fn submit(
    State(shared): State<Arc<Shared>>,
    peer: Option<Extension<PeerCertificate>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    match submitted(&shared, peer.map(|p| p.0), &headers, body).await {
        Ok(response) => response,
        Err(problem) => problem.into_response(),
    }
}

async fn submitted(
    shared: &Shared,
    peer: Option<PeerCertificate>,
    headers: &HeaderMap,
    body: Body,
) -> std::result::Result<Response, Problem> {
    let scope = shared.scope(headers, peer)?;
    let bytes = read_body(shared, body).await?;
    let (mut request, message) = parse_request(headers, &bytes)?;
    if !scope.allows(Some(&request.tenant)) {
        return Err(Problem::new(
            StatusCode::FORBIDDEN,
            "tenant-not-allowed",
            "The caller may not act for this tenant",
        )
        .detail(format!(
            "the credential's caller submits for other tenants than {:?}",
            request.tenant
        )));
    }
    let trace = (headers.get(TRACEPARENT))
        .and_then(|v| v.to_str().ok())
        .and_then(TraceParent::parse);
    if let (Some(trace), None) = (trace, &shared.kafka) {
        // The trace context travels in the request's metadata, as the ingest keeps a message's
        // (in kafka mode, as the message's header: the ingest of its owner keeps it).
        request.set_traceparent(trace);
    }
    let accepted = (shared.engine.check(&request)).map_err(|e| {
        Problem::new(
            StatusCode::BAD_REQUEST,
            "invalid-request",
            "The task request is not valid",
        )
        .detail(e.to_string())
    })?;
    // Kafka mode: the message is signed with its tenant's key when the tenant signs, and
    // checked as its owner will check it.
    let signature = match (&shared.kafka, &shared.access) {
        (Some(kafka), Some(access)) => (access.tenants.get(&request.tenant))
            .and_then(|rules| rules.keys.first())
            .map(|key| sign(&key.secret, kafka.topic(), &message)),
        _ => None,
    };
    if let Some(access) = &shared.access {
        let checked = match &shared.kafka {
            Some(kafka) => access.check(
                &request,
                kafka.topic(),
                &message,
                signature.as_deref().map(str::as_bytes),
            ),
            None => access.check_request(&request),
        };
        checked.map_err(|refusal| {
            Problem::new(
                StatusCode::FORBIDDEN,
                "access-refused",
                "The access rules refuse this request",
            )
            .detail(refusal.to_string())
        })?;
    }
    let task_id = accepted.task_id();
    // Taken before submitting: a wait refused for `front.max_waiting` records nothing, and the
    // watch sees every change of the task after its submission.
    let wait = prefer_wait(headers).map(|w| w.min(shared.max_wait));
    let waiting = Waiting::begin(
        shared,
        task_id,
        wait.unwrap_or_default(),
        shared.kafka.is_some(),
    )?;
    let decided = match &shared.kafka {
        None => {
            let number = shared.submissions.fetch_add(1, Ordering::Relaxed);
            let reply = (shared.engine.deliver(accepted, Source::front_door(number)))
                .await
                .map_err(|e| match e {
                    // Refused by the task (a version below the latest one accepted, say).
                    sendledger_actors::Error::Invalid(refused) => Problem::new(
                        StatusCode::BAD_REQUEST,
                        "rejected",
                        "The request is refused",
                    )
                    .detail(refused.to_string()),
                    e => unavailable(sendledger_core::error::Chain(&e)),
                })?;
            // What the task's writer recorded says whether the key was new, known with this
            // payload (a duplicate delivery: the stored result answers), or known with another.
            let verdict = if reply.events.contains(&"RequestConflict") {
                Verdict::Conflict
            } else if reply.events.contains(&"TaskAccepted") {
                Verdict::New
            } else {
                Verdict::Replay
            };
            Some((verdict, reply.phase.is_terminal()))
        }
        Some(kafka) => {
            let mut message_headers = Vec::new();
            if let Some(signature) = &signature {
                message_headers.push((SIGNATURE_HEADER, signature.as_str()));
            }
            let trace = trace.map(|t| t.to_string());
            if let Some(trace) = &trace {
                message_headers.push((TRACEPARENT, trace.as_str()));
            }
            let key = request.identity().to_string();
            let source = kafka.produce(&key, &message, &message_headers).await?;
            let wait_for_owner = kafka::VERDICT_WITHIN.min(shared.max_wait);
            let until = tokio::time::Instant::now() + wait.unwrap_or_default().max(wait_for_owner);
            kafka::verdict(shared, task_id, &source, &waiting, until).await?
        }
    };
    let Some((verdict, ended)) = decided else {
        // Acknowledged on the requests topic; its owner has not recorded it yet.
        let submitted = Progress {
            state: "submitted",
            terminal: false,
            result: None,
            tenant: None,
        };
        return Ok(submitted.answer(task_id, StatusCode::CREATED, StatusCode::ACCEPTED));
    };
    if verdict == Verdict::Conflict {
        return Err(conflict(task_id));
    }
    let replay = verdict == Verdict::Replay;
    let progress = wait_for(shared, task_id, waiting, ended).await?;
    if replay {
        metrics::counter!(FRONT_REPLAYS_TOTAL).increment(1);
        if !progress.terminal && wait.is_none() {
            return Err(Problem::new(
                StatusCode::CONFLICT,
                "in-flight",
                "A request with this key is still being processed",
            )
            .detail(format!("task {task_id} is {}; ask with `Prefer: wait=N` to wait for it, or GET the Location", progress.state))
            .location(task_id)
            );
        }
    }
    let created = if replay {
        StatusCode::OK
    } else {
        StatusCode::CREATED
    };
    let mut response = progress.answer(task_id, created, StatusCode::ACCEPTED);
    if replay {
        response
            .headers_mut()
            .insert(REPLAYED, HeaderValue::from_static("true"));
    }
    Ok(response)
}

/// What the task's writer made of a submitted request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    /// It created the task.
    New,
    /// Its key was known with this payload: a duplicate delivery, answered from its task.
    Replay,
    /// Its key was known with another payload.
    Conflict,
}

/// `GET /v1/tasks/{id}`: the latest result; `Retry-After` while the task is not terminal. A
/// task of a tenant the caller may not read is answered as one the ledger does not hold.
async fn task(
    State(shared): State<Arc<Shared>>,
    peer: Option<Extension<PeerCertificate>>,
    headers: HeaderMap,
    uri: Uri,
) -> Response {
    let scope = match shared.scope(&headers, peer.map(|p| p.0)) {
        Ok(scope) => scope,
        Err(problem) => return problem.into_response(),
    };
    let segment = uri.path().rsplit('/').next().unwrap_or_default();
    let decoded = percent_encoding::percent_decode_str(segment).decode_utf8_lossy();
    let Ok(task_id) = crate::timeline::parse_task(&decoded) else {
        return Problem::new(
            StatusCode::BAD_REQUEST,
            "bad-task-reference",
            "Not a task reference",
        )
        .detail("use a task id (32 hex digits) or tenant/operation/request_key URL-encoded")
        .into_response();
    };
    let not_found = || {
        Problem::new(StatusCode::NOT_FOUND, "no-such-task", "No such task")
            .detail(format!("task {task_id} is not in the ledger (yet)"))
            .into_response()
    };
    match progress(&shared, task_id).await {
        Ok(Some(progress)) if scope.allows(progress.tenant.as_deref()) => {
            progress.answer(task_id, StatusCode::OK, StatusCode::OK)
        }
        Ok(Some(_) | None) => not_found(),
        Err(problem) => problem.into_response(),
    }
}

/// The body, within `front.max_body_bytes` and the header timeout.
async fn read_body(shared: &Shared, body: Body) -> std::result::Result<bytes::Bytes, Problem> {
    use http_body_util::{BodyExt, Limited};
    let read = tokio::time::timeout(
        shared.body_timeout,
        Limited::new(body, shared.max_body).collect(),
    );
    match read.await {
        Ok(Ok(collected)) => Ok(collected.to_bytes()),
        Ok(Err(e)) => Err(Problem::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "body-too-large",
            "The body is too large",
        )
        .detail(format!("{e}; front.max_body_bytes is {}", shared.max_body))),
        Err(_) => Err(Problem::new(
            StatusCode::REQUEST_TIMEOUT,
            "body-timeout",
            "The body did not arrive in time",
        )),
    }
}

/// The task request of a body, its `request_key` from the `Idempotency-Key` header or the
/// body (both given: they must agree). Returns it with its JSON as a requests-topic message
/// carries it: the body as sent, the header's key written in when the body has none. The
/// request is parsed once, from those bytes, as a message is: its payload's numbers as
/// written, a key twice in an object refused.
fn parse_request(
    headers: &HeaderMap,
    bytes: &[u8],
) -> std::result::Result<(TaskRequest, Vec<u8>), Problem> {
    let bad = |kind: &'static str, title: &'static str, detail: String| {
        Problem::new(StatusCode::BAD_REQUEST, kind, title).detail(detail)
    };
    /// The one field read before the request is: its key.
    #[derive(serde::Deserialize)]
    struct Keyed {
        request_key: Option<Value>,
    }
    let keyed: Keyed = serde_json::from_slice(bytes).map_err(|e| match e.classify() {
        serde_json::error::Category::Data => bad(
            "invalid-request",
            "The task request is not valid",
            "the body must be a JSON object".into(),
        ),
        _ => bad("invalid-json", "The body is not JSON", e.to_string()),
    })?;
    let header_key = match headers.get(IDEMPOTENCY_KEY) {
        None => None,
        Some(value) => Some(idempotency_key(value).ok_or_else(|| {
            bad("invalid-idempotency-key", "The Idempotency-Key header is not valid", "send a non-empty string, e.g. `Idempotency-Key: \"8e03978e-40d5-43e8-bc93-6894a57f9324\"`".into())
        })?),
    };
    let message = match (header_key, keyed.request_key) {
        (Some(h), Some(Value::String(b))) if h != b => {
            return Err(bad("idempotency-key-mismatch", "Two different keys", format!("the Idempotency-Key header says {h:?} and the body's request_key {b:?}: send one, or the same in both")));
        }
        (Some(_), Some(Value::String(_))) | (None, Some(Value::String(_))) => bytes.to_vec(),
        (_, Some(other)) => {
            return Err(bad(
                "invalid-request",
                "The task request is not valid",
                format!("the body's request_key is {other}, not a string"),
            ));
        }
        (Some(h), None) => with_key(bytes, &h),
        (None, None) => {
            return Err(bad("missing-idempotency-key", "No idempotency key", "send an Idempotency-Key header (or a request_key in the body): it is what makes a retry safe".into()));
        }
    };
    let request = TaskRequest::from_json(&message).map_err(|e| {
        bad(
            "invalid-request",
            "The task request is not valid",
            e.to_string(),
        )
    })?;
    Ok((request, message))
}

/// `object`, the JSON text of an object without a `request_key`, with `"request_key": key`
/// written first in it.
fn with_key(object: &[u8], key: &str) -> Vec<u8> {
    let open = object.iter().position(|&b| b == b'{').map_or(0, |i| i + 1);
    let rest = &object[open..];
    let empty = rest.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'}');
    let key = serde_json::to_string(key).unwrap_or_default();
    let mut out = Vec::with_capacity(object.len() + key.len() + 16);
    out.extend_from_slice(b"{\"request_key\":");
    out.extend_from_slice(key.as_bytes());
    if !empty {
        out.push(b',');
    }
    out.extend_from_slice(rest);
    out
}

/// An `Idempotency-Key` value: a structured-field string (`"..."`, as the draft defines it)
/// or, leniently, a bare token.
fn idempotency_key(value: &HeaderValue) -> Option<String> {
    let text = value.to_str().ok()?.trim();
    let key = match text.strip_prefix('"').and_then(|t| t.strip_suffix('"')) {
        Some(inner) => inner.replace("\\\"", "\"").replace("\\\\", "\\"),
        None => text.to_string(),
    };
    (!key.is_empty()).then_some(key)
}

/// `Prefer: wait=N` (RFC 7240), in seconds; `None` when the request has no such preference.
fn prefer_wait(headers: &HeaderMap) -> Option<Duration> {
    headers
        .get_all("prefer")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .find_map(|pref| {
            let (name, value) = pref.split_once('=')?;
            (name.trim().eq_ignore_ascii_case("wait"))
                .then(|| value.trim().trim_matches('"').parse::<u64>().ok())
                .flatten()
        })
        .map(Duration::from_secs)
}

fn conflict(task_id: TaskId) -> Problem {
    metrics::counter!(FRONT_CONFLICTS_TOTAL).increment(1);
    Problem::new(
        StatusCode::UNPROCESSABLE_ENTITY,
        "idempotency-key-reused",
        "This key was used with another request",
    )
    .detail(format!("task {task_id} was submitted with this key and another payload; a new request needs a new key"))
    .location(task_id)
}

fn unavailable(e: impl std::fmt::Display) -> Problem {
    tracing::warn!(error = %e, "front door: a request could not be made durable or read");
    Problem::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "unavailable",
        "The request cannot be taken now",
    )
    .detail(format!(
        "{e}; nothing was executed: send it again with the same key"
    ))
    .retry_after()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_body_is_kept_as_sent_with_the_headers_key_written_in() {
        assert_eq!(
            with_key(b" {\"a\": 1}", "k\"1"),
            b"{\"request_key\":\"k\\\"1\",\"a\": 1}".to_vec()
        );
        assert_eq!(with_key(b"{ }", "k"), b"{\"request_key\":\"k\" }".to_vec());
        let mut headers = HeaderMap::new();
        headers.insert(IDEMPOTENCY_KEY, HeaderValue::from_static("\"k-1\""));
        let body = br#"{"tenant":"t","operation":"o","target":"x","payload":{"amount":12.50,"n":12345678901234567890123}}"#;
        let (request, message) = parse_request(&headers, body).unwrap();
        assert_eq!(request.request_key, "k-1");
        let text = String::from_utf8(message).unwrap();
        assert!(
            text.contains(r#""amount":12.50,"n":12345678901234567890123"#),
            "{text}"
        );
        // As for a message: a key twice in the payload is refused, not taken last-wins.
        let twice = br#"{"tenant":"t","operation":"o","target":"x","payload":{"a":1,"a":2}}"#;
        let problem = parse_request(&headers, twice).unwrap_err();
        assert!(
            format!("{problem:?}").contains("duplicate key"),
            "{problem:?}"
        );
    }

    #[test]
    fn keys_and_waits_are_read_as_their_specifications_write_them() {
        let key = |v: &str| idempotency_key(&HeaderValue::from_str(v).unwrap());
        assert_eq!(key("\"abc-1\"").as_deref(), Some("abc-1"));
        assert_eq!(key("abc-1").as_deref(), Some("abc-1"));
        assert_eq!(key("\"a\\\"b\"").as_deref(), Some("a\"b"));
        assert_eq!(key("\"\""), None);
        let wait = |v: &str| {
            let mut h = HeaderMap::new();
            h.insert("prefer", HeaderValue::from_str(v).unwrap());
            prefer_wait(&h)
        };
        assert_eq!(wait("wait=5"), Some(Duration::from_secs(5)));
        assert_eq!(
            wait("respond-async, wait=10"),
            Some(Duration::from_secs(10))
        );
        assert_eq!(wait("return=minimal"), None);
        assert_eq!(wait("wait=soon"), None);
    }
}
