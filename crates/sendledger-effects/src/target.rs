//! A validated target: attempts, lookups and the policy handed to the core crate.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::header::{self, HeaderName, HeaderValue};
use http::{Method, Request, Uri};
use http_body_util::Full;
use sendledger_core::decide::{AttemptOutcome, Policy, ReconcilePolicy, Sending};
use sendledger_core::trace::TRACEPARENT;
use sendledger_core::{AcceptedRequest, NotSentCause, RetryPolicy, TraceParent, UnknownCause};
use serde_json::Value;
use tokio_rustls::TlsConnector;
use tracing::{debug, info, warn};

use crate::classify::{self, id_text, Rules, MAX_RETRY_AFTER};
use crate::config::{
    CreatedAfterConfig, HeaderValueConfig, IdempotencyConfig, LookupConfig, RetryConfig,
    TargetConfig, TimeFormat,
};
use crate::conn::{Answer, Endpoint, Failure, Pool};
use crate::error::{Error, Result};
use crate::limit::{SendLimiter, SendSlot};
use crate::template::{self, Template};
use crate::tls::{self, Tls};

const REDACTED: &str = "<redacted>";

/// Headers the client manages itself; configuring them is an error.
const MANAGED_HEADERS: [&str; 5] = [
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "upgrade",
];

/// A remote endpoint, validated and ready: [`Target::execute`] performs attempts,
/// [`Target::lookup`] asks what the remote holds, [`Target::policy`] tells the core crate how
/// to drive tasks of this target. Share it behind an `Arc`; connections are pooled inside.
pub struct Target {
    name: String,
    method: Method,
    url: Template,
    endpoint: Endpoint,
    headers: Headers,
    /// Header values and their significant parts ([`secret_fragments`]), longest first:
    /// removed from any remote-supplied text we keep.
    secrets: Vec<String>,
    body_fields: Vec<(String, Template)>,
    rules: Rules,
    /// Header, key TTL and margin.
    idempotency: Option<(HeaderName, Duration, Duration)>,
    /// Whether attempts carry the task's `traceparent` header.
    propagate_trace: bool,
    retry: RetryPolicy,
    lookup: Option<Lookup>,
    pool: Pool,
    limiter: Arc<SendLimiter>,
}

struct Lookup {
    url: Template,
    endpoint: Endpoint,
    results_pointer: String,
    id_pointer: String,
    filters: Vec<(String, String)>,
    created_after: Option<CreatedAfterConfig>,
    policy: ReconcilePolicy,
}

/// Every configured target by name.
#[derive(Debug, Default, Clone)]
pub struct Targets {
    by_name: BTreeMap<String, Arc<Target>>,
}

impl Targets {
    /// Loads and validates every target (`targets.<name>` in error messages), reading header
    /// values from the environment where configured.
    pub fn from_config(config: &BTreeMap<String, TargetConfig>) -> Result<Targets> {
        Targets::from_config_with_env(config, |name| std::env::var(name).ok())
    }

    /// As [`Targets::from_config`], with environment variables read through `env`.
    pub fn from_config_with_env(
        config: &BTreeMap<String, TargetConfig>,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Targets> {
        let mut by_name = BTreeMap::new();
        for (name, target) in config {
            by_name.insert(
                name.clone(),
                Arc::new(Target::from_config_with_env(name, target, &env)?),
            );
        }
        Ok(Targets { by_name })
    }

    pub fn get(&self, name: &str) -> Option<&Arc<Target>> {
        self.by_name.get(name)
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.by_name.keys().map(String::as_str)
    }
}

impl fmt::Debug for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let headers: Vec<(&str, &str)> = self
            .headers
            .iter()
            .map(|(n, _)| (n.as_str(), REDACTED))
            .collect();
        f.debug_struct("Target")
            .field("name", &self.name)
            .field("method", &self.method)
            .field("url", &self.url.source())
            .field("headers", &headers)
            .field("rules", &self.rules)
            .field("idempotency", &self.idempotency)
            .field("propagate_trace", &self.propagate_trace)
            .field("retry", &self.retry)
            .field("lookup", &self.lookup.as_ref().map(|l| l.url.source()))
            .finish_non_exhaustive()
    }
}

/// A field path for error messages: `targets.<name>.<field>`.
struct Path<'a>(&'a str);

impl Path<'_> {
    fn at(&self, field: &str) -> String {
        format!("targets.{}.{field}", self.0)
    }
}

impl Target {
    /// Validates one target's configuration, reading header values from the environment where
    /// configured. Errors name the field (`targets.<name>.<field>`) and never contain a header
    /// value. A lookup must tell tasks apart: its URL contains `{task_id}`, or each of
    /// `{tenant}`, `{operation}` and `{request_key}` alone in a path segment or query value,
    /// and a body field it queries by name has the same template as the query value.
    pub fn from_config(name: &str, config: &TargetConfig) -> Result<Target> {
        Target::from_config_with_env(name, config, |var| std::env::var(var).ok())
    }

    /// As [`Target::from_config`], with environment variables read through `env`. Fields are
    /// checked in the order they appear in the configuration; the first error is returned.
    pub fn from_config_with_env(
        name: &str,
        config: &TargetConfig,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Target> {
        check_name(name)?;
        let path = Path(name);
        let method = parse_method(&path, &config.method)?;
        positive(&path, "connect_timeout", config.connect_timeout)?;
        positive(&path, "request_timeout", config.request_timeout)?;
        let connector = connector(&path, config)?;
        let (url, endpoint) = endpoint(&path, "url", &config.url, config, connector.as_ref())?;
        let (headers, secrets) = parse_headers(&path, &config.headers, &env)?;
        let body_fields = parse_body_fields(&path, &config.body_fields)?;
        pointer(&path, "response_id_pointer", &config.response_id_pointer)?;
        let idempotency = match &config.idempotency {
            None => None,
            Some(i) => Some(parse_idempotency(&path, i, &headers)?),
        };
        check_send_limits(&path, config)?;
        let retry = parse_retry(&path, &config.retry)?;
        let lookup = match &config.lookup {
            None => None,
            Some(l) => Some(lookup(&path, l, config, connector.as_ref(), &body_fields)?),
        };

        Ok(Target {
            name: name.to_string(),
            method,
            url,
            endpoint,
            headers,
            secrets,
            body_fields,
            rules: Rules {
                id_pointer: config.response_id_pointer.clone(),
                on_5xx: config.on_5xx,
                on_409: config.on_409,
                max_retry_after: MAX_RETRY_AFTER.max(config.retry.max_backoff),
            },
            idempotency,
            propagate_trace: config.propagate_trace,
            retry,
            lookup,
            pool: Pool::default(),
            limiter: Arc::new(SendLimiter::new(config.max_in_flight, config.rate_limit)),
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Waits for room to send one attempt (`max_in_flight`, `rate_limit`). Take it before
    /// recording the attempt's intent and hold it until the attempt ends.
    pub async fn reserve(&self) -> SendSlot {
        self.limiter.acquire().await
    }

    /// Whether the target has a lookup (unknown outcomes can be reconciled).
    pub fn has_lookup(&self) -> bool {
        self.lookup.is_some()
    }

    /// How the core crate drives tasks of this target.
    pub fn policy(&self) -> Policy {
        Policy {
            retry: self.retry.clone(),
            reconcile: self.lookup.as_ref().map(|l| l.policy.clone()),
            idempotency_ttl_ms: self.idempotency.as_ref().map(|(_, ttl, _)| millis(*ttl)),
            idempotency_ttl_margin_ms: self
                .idempotency
                .as_ref()
                .map_or(0, |(_, _, margin)| millis(*margin)),
        }
    }

    /// Performs one attempt and classifies it by what it proves (`docs/classification.md`). Never fails:
    /// every ending is one [`AttemptOutcome`].
    ///
    /// - Nothing written to the socket (DNS, connect refused or timed out, a connection that
    ///   failed before the first byte): `NotSent{Connect}`.
    /// - Written, then no answer within `request_timeout`: `Unknown{Timeout}`; written, then the
    ///   connection failed: `Unknown{ResetAfterWrite}`.
    /// - An answer: by status (see the crate documentation).
    /// - The request cannot be built from this task (a template field missing from the
    ///   payload): `Rejected{status: 0}`: nothing was sent and resending cannot help.
    ///
    /// `idempotency_key` is sent in the configured header when the target has one. The caller
    /// must have made the attempt's intent durable before calling. Dropping the future may
    /// leave the request written or not: treat that as unknown.
    pub async fn execute(
        &self,
        request: &AcceptedRequest,
        attempt: u32,
        idempotency_key: Option<&str>,
    ) -> AttemptOutcome {
        self.execute_with(request, attempt, idempotency_key, Sending::default())
            .await
    }

    /// [`Target::execute`], sent as `sending` says: with a trace context, or within a
    /// first-byte deadline. A deadline that passes before the request's first byte was written
    /// ends the attempt `NotSent{LocalResources}`: nothing was sent, and it was this process's
    /// delay, not the remote's doing.
    pub async fn execute_with(
        &self,
        request: &AcceptedRequest,
        attempt: u32,
        idempotency_key: Option<&str>,
        sending: Sending,
    ) -> AttemptOutcome {
        let task_id = request.task_id();
        let built = match self.build_attempt(request, idempotency_key, sending.trace) {
            Ok(built) => built,
            Err(reason) => {
                warn!(target_name = %self.name, %task_id, attempt, %reason, "attempt cannot be built; rejected without sending");
                return AttemptOutcome::Rejected {
                    status: 0,
                    detail: self.scrub(format!(
                        "request cannot be built for target {}: {reason}",
                        self.name
                    )),
                };
            }
        };
        let exchange = self
            .pool
            .exchange(&self.endpoint, built, sending.first_byte_by);
        let outcome = match exchange.await {
            Ok(answer) => self.classify(answer),
            Err(Failure::NotWritten(reason)) => AttemptOutcome::NotSent {
                cause: NotSentCause::Connect(self.scrub(reason)),
                retry_after_ms: None,
            },
            Err(Failure::Local(reason)) => AttemptOutcome::NotSent {
                cause: NotSentCause::LocalResources(self.scrub(reason)),
                retry_after_ms: None,
            },
            Err(Failure::Late { by }) => {
                warn!(target_name = %self.name, %task_id, attempt, late_ms = by.as_millis() as u64, "send deadline passed before the request could be written; not sent");
                AttemptOutcome::NotSent {
                    cause: NotSentCause::LocalResources(format!(
                        "send lease expired {} before the first request byte; nothing was written",
                        humantime::format_duration(Duration::from_millis(by.as_millis() as u64))
                    )),
                    retry_after_ms: None,
                }
            }
            Err(Failure::TimedOut) => AttemptOutcome::Unknown {
                cause: UnknownCause::Timeout,
            },
            Err(Failure::Broken(reason)) => AttemptOutcome::Unknown {
                cause: UnknownCause::ResetAfterWrite(self.scrub(reason)),
            },
        };
        match &outcome {
            AttemptOutcome::Unknown { cause } => {
                info!(target_name = %self.name, %task_id, attempt, ?cause, "attempt outcome unknown; to be reconciled")
            }
            AttemptOutcome::Succeeded { remote_id, status } if remote_id.is_empty() => {
                warn!(target_name = %self.name, %task_id, attempt, status, pointer = %self.rules.id_pointer, "attempt succeeded but the answer has no remote id")
            }
            other => {
                debug!(target_name = %self.name, %task_id, attempt, outcome = ?other, "attempt classified")
            }
        }
        outcome
    }

    /// The URL a lookup of this task asks (the target's lookup template rendered for it), or
    /// why it cannot be built; `None` without a lookup. Nothing is sent.
    pub fn lookup_url(
        &self,
        request: &AcceptedRequest,
    ) -> Option<std::result::Result<String, String>> {
        let lookup = self.lookup.as_ref()?;
        let url = lookup
            .url
            .render_url(request, &request.payload_value())
            .map(|url| self.scrub(url.to_string()))
            .map_err(|reason| self.scrub(reason));
        Some(url)
    }

    /// Asks the remote which records match the task: the configured query, then the filters.
    /// `intent_at_ms` (milliseconds since the Unix epoch) is the time of the task's first
    /// intent, for the `created_after_intent` filter. Returns the matching remote ids, each
    /// once, in the remote's order. An error is no evidence either way.
    pub async fn lookup(
        &self,
        request: &AcceptedRequest,
        intent_at_ms: Option<u64>,
    ) -> Result<Vec<String>> {
        self.lookup_traced(request, intent_at_ms, None).await
    }

    /// [`Target::lookup`], sending `trace` as the `traceparent` header when the target has
    /// `propagate_trace` set (never otherwise), as attempts do.
    pub async fn lookup_traced(
        &self,
        request: &AcceptedRequest,
        intent_at_ms: Option<u64>,
        trace: Option<TraceParent>,
    ) -> Result<Vec<String>> {
        let Some(lookup) = &self.lookup else {
            return Err(Error::config(
                format!("targets.{}.lookup", self.name),
                "is not configured; add a lookup to reconcile unknown outcomes",
            ));
        };
        let payload = request.payload_value();
        let render_err = |reason: String| Error::Render {
            target: self.name.clone(),
            reason,
        };
        let url = lookup
            .url
            .render_url(request, &payload)
            .map_err(render_err)?;
        let mut req = self.request(Method::GET, &url, &lookup.endpoint, Bytes::new())?;
        req.headers_mut()
            .insert(header::ACCEPT, HeaderValue::from_static("application/json"));
        self.propagate(&mut req, trace);
        let answer = self
            .pool
            .exchange(&lookup.endpoint, req, None)
            .await
            .map_err(|failure| Error::LookupTransport {
                target: self.name.clone(),
                reason: self.scrub(match failure {
                    Failure::NotWritten(r) | Failure::Local(r) | Failure::Broken(r) => r,
                    Failure::TimedOut => "no answer within the request timeout".into(),
                    // Lookups are sent without a first-byte deadline.
                    Failure::Late { .. } => "not sent within its deadline".into(),
                }),
            })?;
        let answer_err = |reason: String| Error::LookupAnswer {
            target: self.name.clone(),
            reason: self.scrub(reason),
        };
        let body = answer.body.map_err(answer_err)?;
        if !answer.status.is_success() {
            let text = String::from_utf8_lossy(&body);
            let detail: String = text.trim().chars().take(512).collect();
            return Err(Error::LookupStatus {
                target: self.name.clone(),
                status: answer.status.as_u16(),
                detail: self.scrub(detail),
            });
        }
        let doc: Value =
            serde_json::from_slice(&body).map_err(|e| answer_err(format!("not JSON: {e}")))?;
        let ids = select(lookup, &doc, &payload, intent_at_ms).map_err(answer_err)?;
        debug!(target_name = %self.name, task_id = %request.task_id(), matches = ids.len(), "lookup performed");
        Ok(ids)
    }

    fn classify(&self, answer: Answer) -> AttemptOutcome {
        let outcome = classify::classify(
            &self.rules,
            answer.status,
            &answer.headers,
            &answer.body,
            SystemTime::now(),
        );
        match outcome {
            AttemptOutcome::Rejected { status, detail } => AttemptOutcome::Rejected {
                status,
                detail: self.scrub(detail),
            },
            other => other,
        }
    }

    /// Removes configured header values, and their parts a remote may quote, from text that
    /// may echo them.
    fn scrub(&self, mut text: String) -> String {
        for secret in &self.secrets {
            if text.contains(secret.as_str()) {
                text = text.replace(secret.as_str(), REDACTED);
            }
        }
        text
    }

    fn build_attempt(
        &self,
        request: &AcceptedRequest,
        idempotency_key: Option<&str>,
        trace: Option<TraceParent>,
    ) -> std::result::Result<Request<Full<Bytes>>, String> {
        let templates = self.body_fields.iter().map(|(_, template)| template);
        let payload = template::payload_for(request, std::iter::once(&self.url).chain(templates));
        let url = self.url.render_url(request, &payload)?;
        let body = if self.body_fields.is_empty() {
            Bytes::from(request.payload.clone())
        } else {
            let fields = self
                .body_fields
                .iter()
                .map(|(key, template)| Ok((key.as_str(), template.render_text(request, &payload)?)))
                .collect::<std::result::Result<Vec<_>, String>>()?;
            let body = request
                .payload_with_fields(fields)
                .ok_or("the payload is not a JSON object")?;
            Bytes::from(body)
        };
        let mut req = self
            .request(self.method.clone(), &url, &self.endpoint, body)
            .map_err(|e| e.to_string())?;
        if let (Some((header_name, _, _)), Some(key)) = (&self.idempotency, idempotency_key) {
            let value = HeaderValue::from_str(key)
                .map_err(|_| "the idempotency key is not a valid header value".to_string())?;
            req.headers_mut().insert(header_name.clone(), value);
        }
        self.propagate(&mut req, trace);
        Ok(req)
    }

    /// Sets `traceparent` on a request when the target propagates trace contexts.
    fn propagate(&self, req: &mut Request<Full<Bytes>>, trace: Option<TraceParent>) {
        if let (true, Some(trace)) = (self.propagate_trace, trace) {
            // A traceparent is ASCII (hex and dashes): always a valid header value.
            if let Ok(value) = HeaderValue::from_str(&trace.to_string()) {
                req.headers_mut()
                    .insert(HeaderName::from_static(TRACEPARENT), value);
            }
        }
    }

    /// A request to a rendered URL, with the configured headers.
    fn request(
        &self,
        method: Method,
        url: &str,
        endpoint: &Endpoint,
        body: Bytes,
    ) -> Result<Request<Full<Bytes>>> {
        let render_err = |reason: String| Error::Render {
            target: self.name.clone(),
            reason,
        };
        let uri: Uri = url
            .parse()
            .map_err(|e| render_err(format!("the rendered URL is invalid: {e}")))?;
        let path = uri
            .path_and_query()
            .map(|p| p.as_str())
            .unwrap_or("/")
            .parse::<Uri>()
            .map_err(|e| render_err(format!("the rendered URL is invalid: {e}")))?;
        let has_body = !body.is_empty();
        let mut req = Request::new(Full::new(body));
        *req.method_mut() = method;
        *req.uri_mut() = path;
        let headers = req.headers_mut();
        headers.insert(
            header::HOST,
            HeaderValue::from_str(&endpoint.address)
                .map_err(|_| render_err("the host is not a valid header value".into()))?,
        );
        headers.insert(
            header::USER_AGENT,
            HeaderValue::from_static(concat!("sendledger/", env!("CARGO_PKG_VERSION"))),
        );
        if has_body {
            headers.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
        }
        for (n, v) in &self.headers {
            headers.insert(n.clone(), v.clone());
        }
        Ok(req)
    }
}

/// Shortest part of a header value that is redacted on its own: shorter ones (a scheme, a
/// version) would blank out ordinary words.
const MIN_SECRET_FRAGMENT: usize = 6;

/// What to redact for one header value: the value itself, the credentials after a scheme
/// (`Bearer abc…` → `abc…`), and each of their tokens (split at whitespace, `,`, `;`, `=` and
/// `"`), parts of at least [`MIN_SECRET_FRAGMENT`] characters only: a remote may quote any of
/// them. The scheme itself (`Bearer`) is no secret.
fn secret_fragments(value: &str) -> Vec<String> {
    let value = value.trim();
    let mut out = Vec::new();
    if value.is_empty() {
        return out;
    }
    out.push(value.to_string());
    let credentials = value
        .split_once(char::is_whitespace)
        .map_or(value, |(_scheme, rest)| rest.trim());
    let tokens = credentials.split(|c: char| c.is_whitespace() || ",;=\"".contains(c));
    for part in std::iter::once(credentials).chain(tokens) {
        if part.chars().count() >= MIN_SECRET_FRAGMENT && !out.iter().any(|o| o == part) {
            out.push(part.to_string());
        }
    }
    out
}

fn check_name(name: &str) -> Result<()> {
    if name.is_empty()
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
    {
        return Err(Error::config(
            format!("targets.{name}"),
            "a target name is made of ASCII letters, digits, `-`, `_` and `.`",
        ));
    }
    Ok(())
}

fn parse_method(path: &Path<'_>, method: &str) -> Result<Method> {
    match method.to_ascii_uppercase().as_str() {
        "POST" => Ok(Method::POST),
        "PUT" => Ok(Method::PUT),
        "PATCH" => Ok(Method::PATCH),
        "DELETE" => Ok(Method::DELETE),
        "GET" => Ok(Method::GET),
        _ => Err(Error::config(
            path.at("method"),
            format!("`{method}` is not supported; use POST, PUT, PATCH, DELETE or GET"),
        )),
    }
}

/// Headers sent with every request, their values marked sensitive.
type Headers = Vec<(HeaderName, HeaderValue)>;

/// The configured headers, their values read from the environment where configured and
/// marked sensitive, and the secret fragments of those values, longest first.
fn parse_headers(
    path: &Path<'_>,
    config: &BTreeMap<String, HeaderValueConfig>,
    env: impl Fn(&str) -> Option<String>,
) -> Result<(Headers, Vec<String>)> {
    let mut headers = Vec::new();
    let mut secrets = Vec::new();
    for (header_name, value) in config {
        let field = path.at(&format!("headers.{header_name}"));
        let hn = HeaderName::from_bytes(header_name.as_bytes())
            .map_err(|_| Error::config(&field, "is not a valid header name"))?;
        if MANAGED_HEADERS.contains(&hn.as_str()) {
            return Err(Error::config(&field, "is set by the client; remove it"));
        }
        let text = match value {
            HeaderValueConfig::Literal(text) => text.clone(),
            HeaderValueConfig::Env { env: var, prefix } => match env(var) {
                Some(v) => format!("{prefix}{v}"),
                None => {
                    return Err(Error::config(
                        &field,
                        format!("environment variable `{var}` is not set; set it before starting"),
                    ))
                }
            },
        };
        let mut hv = HeaderValue::from_str(&text).map_err(|_| {
            Error::config(
                &field,
                "the value is not a valid header value (control characters or non-ASCII)",
            )
        })?;
        hv.set_sensitive(true);
        headers.push((hn, hv));
        secrets.extend(secret_fragments(&text));
    }
    // Longest first, so a value is removed whole before its parts are looked for.
    secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
    secrets.dedup();
    Ok((headers, secrets))
}

fn parse_body_fields(
    path: &Path<'_>,
    config: &BTreeMap<String, String>,
) -> Result<Vec<(String, Template)>> {
    let mut body_fields = Vec::new();
    for (key, template) in config {
        let field = path.at(&format!("body_fields.{key}"));
        let t = Template::parse(template).map_err(|reason| Error::config(&field, reason))?;
        body_fields.push((key.clone(), t));
    }
    Ok(body_fields)
}

/// The idempotency header (not one of `headers` nor managed by the client), key TTL and
/// margin.
fn parse_idempotency(
    path: &Path<'_>,
    config: &IdempotencyConfig,
    headers: &[(HeaderName, HeaderValue)],
) -> Result<(HeaderName, Duration, Duration)> {
    let field = path.at("idempotency.header");
    let hn = HeaderName::from_bytes(config.header.as_bytes())
        .map_err(|_| Error::config(&field, "is not a valid header name"))?;
    if headers.iter().any(|(n, _)| *n == hn) || MANAGED_HEADERS.contains(&hn.as_str()) {
        return Err(Error::config(
            &field,
            "is also a configured or client-managed header",
        ));
    }
    positive(path, "idempotency.ttl", config.ttl)?;
    if config.margin() >= config.ttl {
        return Err(Error::config(
            path.at("idempotency.ttl_margin"),
            "must be shorter than idempotency.ttl",
        ));
    }
    Ok((hn, config.ttl, config.margin()))
}

/// `max_in_flight` and `rate_limit`.
fn check_send_limits(path: &Path<'_>, config: &TargetConfig) -> Result<()> {
    if config.max_in_flight == 0 {
        return Err(Error::config(
            path.at("max_in_flight"),
            "must be at least 1",
        ));
    }
    if let Some(rate) = config.rate_limit {
        if !(rate.is_finite() && rate > 0.0) {
            return Err(Error::config(
                path.at("rate_limit"),
                "must be a positive number of attempts per second",
            ));
        }
    }
    Ok(())
}

fn parse_retry(path: &Path<'_>, r: &RetryConfig) -> Result<RetryPolicy> {
    if r.max_attempts == 0 {
        return Err(Error::config(
            path.at("retry.max_attempts"),
            "must be at least 1",
        ));
    }
    if !(r.multiplier.is_finite() && r.multiplier >= 1.0) {
        return Err(Error::config(
            path.at("retry.multiplier"),
            "must be a number of at least 1.0",
        ));
    }
    if r.initial_backoff > r.max_backoff {
        return Err(Error::config(
            path.at("retry.initial_backoff"),
            "must not exceed retry.max_backoff",
        ));
    }
    Ok(RetryPolicy {
        max_attempts: r.max_attempts,
        initial_backoff_ms: millis(r.initial_backoff),
        max_backoff_ms: millis(r.max_backoff),
        multiplier: r.multiplier,
    })
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn positive(path: &Path<'_>, field: &str, d: Duration) -> Result<()> {
    if d.is_zero() {
        return Err(Error::config(path.at(field), "must be longer than 0s"));
    }
    Ok(())
}

/// Checks JSON pointer syntax: empty, or `/`-separated tokens with `~0`/`~1` escapes only.
fn pointer(path: &Path<'_>, field: &str, p: &str) -> Result<()> {
    let bad_escape = p
        .match_indices('~')
        .any(|(i, _)| !matches!(p.as_bytes().get(i + 1), Some(b'0' | b'1')));
    if !(p.is_empty() || p.starts_with('/')) || bad_escape {
        return Err(Error::config(
            path.at(field),
            format!("`{p}` is not a JSON pointer (e.g. `/id` or `/data/0/id`)"),
        ));
    }
    Ok(())
}

/// The TLS settings of a target that has an https URL (attempts or lookups), built and
/// checked now; `None` for a target on http only, which must not have a `tls` section.
fn connector(path: &Path<'_>, config: &TargetConfig) -> Result<Option<TlsConnector>> {
    let https = |url: &str| url.starts_with("https://");
    if https(&config.url) || config.lookup.as_ref().is_some_and(|l| https(&l.url)) {
        return tls::connector(&path.at("tls"), config.tls.as_ref()).map(Some);
    }
    if config.tls.is_some() {
        return Err(Error::config(
            path.at("tls"),
            "applies to https:// URLs only, and neither url nor lookup.url is one",
        ));
    }
    Ok(None)
}

/// Parses a URL template (`field` of the target) and returns it with where it connects to.
/// The scheme and authority must be literal (no placeholders).
fn endpoint(
    path: &Path<'_>,
    field: &str,
    source: &str,
    target: &TargetConfig,
    connector: Option<&TlsConnector>,
) -> Result<(Template, Endpoint)> {
    let field = path.at(field);
    let field = field.as_str();
    let template = Template::parse(source).map_err(|reason| Error::config(field, reason))?;
    let sample: Uri = template
        .sample()
        .parse()
        .map_err(|e| Error::config(field, format!("`{source}` is not a URL: {e}")))?;
    let (scheme, default_port) = match sample.scheme_str() {
        Some("http") => ("http", 80),
        Some("https") => ("https", 443),
        _ => {
            return Err(Error::config(
                field,
                format!("`{source}` must be an absolute http:// URL (or https://)"),
            ))
        }
    };
    let authority = sample
        .authority()
        .ok_or_else(|| Error::config(field, format!("`{source}` has no host")))?;
    if !source.starts_with(&format!("{scheme}://{authority}")) || authority.as_str().contains('@') {
        return Err(Error::config(
            field,
            "the host and port must be written literally (no placeholders, no user info)",
        ));
    }
    if let Some(segment) = template::dot_segment(&template.sample()) {
        return Err(Error::config(
            field,
            format!(
                "has the path segment `{segment}`; write the path without `.` and `..` segments"
            ),
        ));
    }
    let tls = match (scheme, connector) {
        ("https", Some(connector)) => Some(Tls {
            connector: connector.clone(),
            server_name: tls::server_name(field, authority.host())?,
        }),
        _ => None,
    };
    let endpoint = Endpoint {
        address: format!(
            "{}:{}",
            authority.host(),
            authority.port_u16().unwrap_or(default_port)
        ),
        tls,
        connect_timeout: target.connect_timeout,
        request_timeout: target.request_timeout,
        pool_idle_timeout: target.pool_idle_timeout,
    };
    Ok((template, endpoint))
}

/// Why a lookup URL must identify its task: with a URL that two tasks render alike, one
/// task's lookup finds the other's record and confirms it with that record's id.
const LOOKUP_IDENTITY_RULE: &str = "does not tell tasks apart, so one task's lookup could confirm another task's record: \
     the lookup URL must contain `{task_id}` (e.g. `?reference={task_id}` with `body_fields.reference = \"{task_id}\"`), \
     or each of `{tenant}`, `{operation}` and `{request_key}` alone in a path segment or query value; \
     joined values are ambiguous (`{tenant}:{request_key}` reads `t:1:k` for tenant `t:1` with key `k` and for tenant `t` with key `1:k`)";

/// Checks that a lookup finds only its own task's records: the URL identifies the task
/// ([`Template::identifies_task`]; refused when it uses identity fields ambiguously, a warning
/// when it matches on payload or metadata values only, which may be unique by design), and
/// each body field the URL queries by name (`?reference=` ↔ `body_fields.reference`) is
/// stored with the template it is looked up by.
fn check_lookup_identity(
    path: &Path<'_>,
    url: &Template,
    body_fields: &[(String, Template)],
) -> Result<()> {
    if !url.identifies_task() {
        if url.uses_identity() {
            return Err(Error::config(path.at("lookup.url"), LOOKUP_IDENTITY_RULE));
        }
        warn!(
            target_name = path.0,
            lookup_url = url.source(),
            "lookup.url has neither {{task_id}} nor all three identity fields: a record of another task with the same values would confirm this task; prefer `?reference={{task_id}}` with `body_fields.reference = \"{{task_id}}\"`"
        );
    }
    for (name, value) in url.query_params() {
        if let Some((_, stored)) = body_fields.iter().find(|(key, _)| *key == name) {
            if !stored.renders_like(&value) {
                return Err(Error::config(
                    path.at(&format!("body_fields.{name}")),
                    format!(
                        "is `{}` but lookup.url queries `{name}` with `{}`: records are stored under one and looked up by the other; use the same template in both (e.g. `{{task_id}}`)",
                        stored.source(),
                        value.source()
                    ),
                ));
            }
        }
    }
    Ok(())
}

fn lookup(
    path: &Path<'_>,
    l: &LookupConfig,
    target: &TargetConfig,
    connector: Option<&TlsConnector>,
    body_fields: &[(String, Template)],
) -> Result<Lookup> {
    let (url, endpoint) = endpoint(path, "lookup.url", &l.url, target, connector)?;
    check_lookup_identity(path, &url, body_fields)?;
    pointer(path, "lookup.results_pointer", &l.results_pointer)?;
    pointer(path, "lookup.id_pointer", &l.id_pointer)?;
    let mut filters = Vec::new();
    for (record, payload) in &l.filters {
        let field = format!("lookup.filters.\"{record}\"");
        pointer(path, &field, record)?;
        pointer(path, &field, payload)?;
        filters.push((record.clone(), payload.clone()));
    }
    if let Some(c) = &l.created_after_intent {
        pointer(path, "lookup.created_after_intent.pointer", &c.pointer)?;
    }
    positive(path, "lookup.check_interval", l.check_interval)?;
    if l.deadline < l.first_check {
        return Err(Error::config(
            path.at("lookup.deadline"),
            "must not be shorter than lookup.first_check",
        ));
    }
    Ok(Lookup {
        url,
        endpoint,
        results_pointer: l.results_pointer.clone(),
        id_pointer: l.id_pointer.clone(),
        filters,
        created_after: l.created_after_intent.clone(),
        policy: ReconcilePolicy {
            first_check_ms: millis(l.first_check),
            check_interval_ms: millis(l.check_interval),
            deadline_ms: millis(l.deadline),
            resend_when_absent: l.resend_when_absent,
            max_policy_resends: l.max_policy_resends,
        },
    })
}

/// JSON equality with numbers compared by exact value: number tokens are kept as written, so
/// a remote that stores `100.00` and answers `100.0` still matches (and no two different
/// numbers ever do, however long).
fn same_value(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => {
            match (exact_decimal(&x.to_string()), exact_decimal(&y.to_string())) {
                (Some(x), Some(y)) => x == y,
                _ => x == y,
            }
        }
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(x, y)| same_value(x, y))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.get(k).is_some_and(|w| same_value(v, w)))
        }
        _ => a == b,
    }
}

/// A JSON number as (negative, significant digits without leading or trailing zeros,
/// exponent): equal for equal values. Zero is `(false, "", 0)`.
fn exact_decimal(token: &str) -> Option<(bool, String, i64)> {
    let (mantissa, exponent) = match token.find(['e', 'E']) {
        Some(i) => (&token[..i], token[i + 1..].parse::<i64>().ok()?),
        None => (token, 0),
    };
    let (negative, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => (true, m),
        None => (false, mantissa),
    };
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    if !(int.bytes().chain(frac.bytes()).all(|c| c.is_ascii_digit())) {
        return None;
    }
    let digits = format!("{int}{frac}");
    let mut exponent = exponent.checked_sub(frac.len() as i64)?;
    let digits = digits.trim_start_matches('0');
    let trimmed = digits.trim_end_matches('0');
    exponent = exponent.checked_add((digits.len() - trimmed.len()) as i64)?;
    if trimmed.is_empty() {
        return Some((false, String::new(), 0));
    }
    Some((negative, trimmed.to_string(), exponent))
}

/// The ids of the records in a lookup answer that pass the filters.
fn select(
    lookup: &Lookup,
    doc: &Value,
    payload: &Value,
    intent_at_ms: Option<u64>,
) -> std::result::Result<Vec<String>, String> {
    let records = doc
        .pointer(&lookup.results_pointer)
        .and_then(Value::as_array)
        .ok_or_else(|| format!("no array at `{}`", lookup.results_pointer))?;
    let mut wanted = Vec::with_capacity(lookup.filters.len());
    for (record_pointer, payload_pointer) in &lookup.filters {
        let value = payload.pointer(payload_pointer).ok_or_else(|| {
            format!("the payload has no value at `{payload_pointer}` for a filter")
        })?;
        wanted.push((record_pointer.as_str(), value));
    }
    let mut ids: Vec<String> = Vec::new();
    for (i, record) in records.iter().enumerate() {
        if !wanted
            .iter()
            .all(|(p, v)| record.pointer(p).is_some_and(|r| same_value(r, v)))
        {
            continue;
        }
        if let (Some(c), Some(intent)) = (&lookup.created_after, intent_at_ms) {
            let at = record
                .pointer(&c.pointer)
                .and_then(|v| timestamp_ms(v, c.format))
                .ok_or_else(|| {
                    format!(
                        "record {i} has no readable creation time at `{}`",
                        c.pointer
                    )
                })?;
            if at.saturating_add(millis(c.skew)) < intent {
                continue;
            }
        }
        let id = record
            .pointer(&lookup.id_pointer)
            .and_then(id_text)
            .ok_or_else(|| format!("record {i} has no id at `{}`", lookup.id_pointer))?;
        if !ids.contains(&id) {
            ids.push(id);
        }
    }
    Ok(ids)
}

fn timestamp_ms(v: &Value, format: TimeFormat) -> Option<u64> {
    match format {
        TimeFormat::UnixMillis => v.as_u64().or_else(|| v.as_f64().map(|f| f.max(0.0) as u64)),
        TimeFormat::UnixSeconds => v.as_f64().map(|s| (s.max(0.0) * 1000.0) as u64),
        TimeFormat::Rfc3339 => humantime::parse_rfc3339_weak(v.as_str()?)
            .ok()?
            .duration_since(UNIX_EPOCH)
            .ok()
            .map(millis),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn filters_compare_numbers_by_exact_value() {
        use super::same_value;
        let v = |s: &str| serde_json::from_str::<serde_json::Value>(s).unwrap();
        assert!(same_value(&v("100.00"), &v("100.0")));
        assert!(same_value(&v("1e2"), &v("100")));
        assert!(same_value(&v("-0"), &v("0.0")));
        assert!(same_value(&v("{\"a\": [1.50]}"), &v("{\"a\": [1.5]}")));
        assert!(!same_value(
            &v("12345678901234567890123"),
            &v("12345678901234567890124")
        ));
        assert!(!same_value(&v("100"), &v("\"100\"")));
        assert!(!same_value(&v("-1"), &v("1")));
    }

    use super::*;

    #[test]
    fn secret_fragments_cover_the_bare_credentials() {
        assert_eq!(
            secret_fragments(" Bearer s3cr3t-token "),
            ["Bearer s3cr3t-token", "s3cr3t-token"]
        );
        assert_eq!(
            secret_fragments("Basic dXNlcjpwYXNzd29yZA=="),
            [
                "Basic dXNlcjpwYXNzd29yZA==",
                "dXNlcjpwYXNzd29yZA==",
                "dXNlcjpwYXNzd29yZA"
            ]
        );
        assert_eq!(
            secret_fragments("Signature keyId=\"abcdef1\",sig=\"xyz\""),
            [
                "Signature keyId=\"abcdef1\",sig=\"xyz\"",
                "keyId=\"abcdef1\",sig=\"xyz\"",
                "abcdef1"
            ]
        );
        // Short parts are not redacted on their own; the whole value always is.
        assert_eq!(secret_fragments("ab cd"), ["ab cd"]);
        assert!(secret_fragments("  ").is_empty());
    }
}
