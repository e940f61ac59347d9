//! A validated target: attempts, lookups and the policy handed to the core crate.
//!
//! This file holds [`Target`] and [`Targets`], what the core crate reads of a target (its name,
//! limits, breaker and [`Policy`]), the room an attempt reserves before its intent
//! ([`Target::reserve`]: the breaker's admission, a send slot, the connection) and the HTTP
//! request that attempts and lookups share (configured headers, `traceparent`). The rest is one file per concern:
//! - `build.rs`: building and validating a target from its configuration
//!   ([`Target::from_config`]); errors name the field and never contain a header value;
//! - `attempt.rs`: one attempt and its classification by what its ending proves
//!   ([`Target::execute`]; answers are read by `classify.rs`);
//! - `lookup.rs`: lookups ([`Target::lookup`]): the room each takes (the target's limits or
//!   its own, the remote's `Retry-After`) and matching their records against the task;
//! - `paging.rs`: following the pages of a lookup's answer (`lookup.paging`: a next URL in the
//!   body, the `Link` header, or a page number), never off the lookup's own origin;
//! - `redact.rs`: secret redaction, so header values never show in logs, outcomes, errors or
//!   `Debug`.

mod attempt;
mod build;
mod lookup;
mod paging;
mod redact;
mod sagas;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderName, HeaderValue};
use http::{Method, Request, Uri};
use http_body_util::Full;
use sendledger_core::decide::{Fallback, Policy, ReconcilePolicy};
use sendledger_core::trace::TRACEPARENT;
use sendledger_core::{RetryClass, RetryPolicy, TraceParent};

use crate::breaker::{Admission, Breaker, BreakerView, Ticket, Verdict};
use crate::classify::Rules;
use crate::config::{CreatedAfterConfig, TargetConfig};
use crate::conn::Failure;
use crate::conn::{Endpoint, Pool};
use crate::error::{Error, Result};
use crate::limit::{Limiter, SendSlot};
use crate::template::Template;

/// A remote endpoint, validated and ready: [`Target::execute`] performs attempts,
/// [`Target::lookup`] asks what the remote holds, [`Target::policy`] tells the core crate how
/// to drive tasks of this target. Share it behind an `Arc`; connections are pooled inside.
pub struct Target {
    name: String,
    method: Method,
    url: Template,
    endpoint: Endpoint,
    /// The endpoint of attempts that retry a class with a timeout of its own
    /// (`retry.CLASS.timeout`).
    retry_endpoints: BTreeMap<RetryClass, Endpoint>,
    headers: Headers,
    /// Header values and their significant parts
    /// ([`secret_fragments`](redact::secret_fragments)), longest first: removed from any
    /// remote-supplied text we keep.
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
    limiter: Arc<Limiter>,
    breaker: Option<Arc<Breaker>>,
    /// The breaker's health request: its URL and where it goes.
    health: Option<(String, Endpoint)>,
    /// The target's fallback (`fallback`), checked by [`Targets`] to be another configured
    /// target with none of its own.
    fallback: Option<String>,
    /// `breaker.retry_failed_within`.
    retry_failed_within: Option<Duration>,
}

/// Why a target takes no attempt now: its breaker is open (or its probes are out). Nothing
/// was reserved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Held {
    /// How long to wait, at least.
    pub wait: Duration,
    /// Waiting tasks look again after `wait` plus a random part of this, so that they do not
    /// all come back at once.
    pub spread: Duration,
}

struct Lookup {
    url: Template,
    endpoint: Endpoint,
    results_pointer: String,
    id_pointer: String,
    filters: Vec<(String, String)>,
    created_after: Option<CreatedAfterConfig>,
    /// How to read an answer in pages; `None`: the first answer is the whole answer.
    paging: Option<paging::Paging>,
    policy: ReconcilePolicy,
    /// Where lookups take their room: the target's limiter, or their own (`lookup.limits`).
    limiter: Arc<Limiter>,
    /// No lookup is sent before this: the end of the latest throttled lookup's `Retry-After`.
    throttled_until: Mutex<Option<tokio::time::Instant>>,
}

/// Every configured target by name.
#[derive(Debug, Default, Clone)]
pub struct Targets {
    by_name: BTreeMap<String, Arc<Target>>,
    /// Multi-step tasks' steps, by saga name ([`Targets::with_sagas`]).
    sagas: BTreeMap<String, Vec<sendledger_core::PlannedStep>>,
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
        for (name, target) in config {
            let Some(fallback) = &target.fallback else {
                continue;
            };
            let field = format!("targets.{name}.fallback");
            match config.get(fallback) {
                None => {
                    return Err(Error::config(
                        field,
                        format!("`{fallback}` is not a configured target"),
                    ))
                }
                _ if fallback == name => {
                    return Err(Error::config(field, "a target cannot be its own fallback"))
                }
                Some(other) if other.fallback.is_some() => {
                    return Err(Error::config(
                        field,
                        format!(
                            "`{fallback}` has a fallback of its own; a fallback is one step: \
                             remove targets.{fallback}.fallback or choose another target"
                        ),
                    ))
                }
                Some(_) => {}
            }
        }
        Ok(Targets {
            by_name,
            sagas: BTreeMap::new(),
        })
    }

    pub fn get(&self, name: &str) -> Option<&Arc<Target>> {
        self.by_name.get(name)
    }

    /// How the core crate drives tasks of target `name`: its policy, with its fallback's.
    pub fn policy(&self, name: &str) -> Option<Policy> {
        let target = self.get(name)?;
        let mut policy = target.policy();
        policy.fallback = target.fallback.as_ref().and_then(|fallback| {
            Some(Fallback {
                target: fallback.clone(),
                policy: Box::new(self.get(fallback)?.policy()),
            })
        });
        Some(policy)
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.by_name.keys().map(String::as_str)
    }
}

impl Target {
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The target's templates: its URL, body fields and lookup URL.
    fn templates(&self) -> impl Iterator<Item = &Template> {
        let lookup = self.lookup.iter().map(|l| &l.url);
        let body = self.body_fields.iter().map(|(_, t)| t);
        std::iter::once(&self.url).chain(body).chain(lookup)
    }

    /// The steps of a multi-step task whose record the target's templates read (their remote
    /// id, or fields of their answer).
    pub(crate) fn steps_read(&self) -> impl Iterator<Item = &str> {
        self.templates().flat_map(Template::steps_read)
    }

    /// The fields of steps' answers the target's templates read: (step, JSON pointer).
    pub(crate) fn answers_read(&self) -> impl Iterator<Item = (&str, &str)> {
        self.templates().flat_map(Template::answers_read)
    }

    /// Waits for room to send one attempt (`max_in_flight`, `rate_limit`), asks the target's
    /// breaker whether it may go now, then takes a pooled connection or opens one (TCP and the
    /// TLS handshake). Take it before recording the attempt's intent and send the attempt
    /// with [`Target::execute_reserved`]. `Err`: the breaker is open; record no intent, look
    /// again after the wait. `retry_of`: the class of the last attempt's "not sent", when
    /// this one retries it: a class with a `timeout` of its own connects (`connect`) or waits
    /// for the answer (the others) within it.
    pub async fn reserve(
        &self,
        retry_of: Option<RetryClass>,
    ) -> std::result::Result<SendSlot, Held> {
        // The send slot first: the breaker is asked when the attempt could go at once.
        let mut slot = self.limiter.acquire().await;
        slot.ticket = match &self.breaker {
            Some(breaker) => Some(self.admit(breaker).await?),
            None => None,
        };
        let endpoint = retry_of
            .and_then(|class| self.retry_endpoints.get(&class))
            .unwrap_or(&self.endpoint);
        slot.conn = Some(self.pool.open(endpoint).await);
        slot.endpoint = Some(endpoint.clone());
        Ok(slot)
    }

    /// The breaker's admission; in half-open with a health request, that request first.
    async fn admit(&self, breaker: &Arc<Breaker>) -> std::result::Result<Ticket, Held> {
        let held = |until: tokio::time::Instant| Held {
            wait: until.saturating_duration_since(tokio::time::Instant::now()),
            spread: breaker.settings().open_for,
        };
        let health = self.health.is_some();
        let check = match breaker.admit(health) {
            Admission::Go(ticket) => return Ok(ticket),
            Admission::Wait { until } => return Err(held(until)),
            Admission::Check(check) => check,
        };
        check.finish(self.health_check().await);
        match breaker.admit(health) {
            Admission::Go(ticket) => Ok(ticket),
            Admission::Wait { until } => Err(held(until)),
            // Another health request is due already: this task waits for it.
            Admission::Check(_) => Err(held(
                tokio::time::Instant::now() + breaker.settings().open_for,
            )),
        }
    }

    /// The breaker's health request: up when it answers 2xx.
    async fn health_check(&self) -> Verdict {
        let Some((url, endpoint)) = &self.health else {
            return Verdict::Neither;
        };
        let req = match self.request(Method::GET, url, endpoint, Bytes::new()) {
            Ok(req) => req,
            Err(e) => {
                tracing::warn!(target_name = %self.name, error = %e, "health request cannot be built");
                return Verdict::Neither;
            }
        };
        match self.pool.exchange(endpoint, req, None).await {
            Ok(answer) if answer.status.is_success() => Verdict::Success,
            Ok(answer) => {
                tracing::info!(target_name = %self.name, status = answer.status.as_u16(), "health request answered: the remote is not back");
                Verdict::Failure
            }
            Err(Failure::Local(_)) => Verdict::Neither,
            Err(failure) => {
                tracing::info!(target_name = %self.name, ?failure, "health request failed: the remote is not back");
                Verdict::Failure
            }
        }
    }

    /// The state of the target's breaker; `None` when it has none.
    pub fn breaker(&self) -> Option<BreakerView> {
        self.breaker.as_ref().map(|b| b.view())
    }

    /// How far back the target's failed tasks are retried when its breaker closes
    /// (`breaker.retry_failed_within`); `None`: they are not.
    pub fn retry_failed_within(&self) -> Option<Duration> {
        self.retry_failed_within
    }

    /// Whether the target has a lookup (unknown outcomes can be reconciled).
    pub fn has_lookup(&self) -> bool {
        self.lookup.is_some()
    }

    /// How the core crate drives tasks of this target, its fallback aside (see
    /// [`Targets::policy`]).
    pub fn policy(&self) -> Policy {
        Policy {
            retry: self.retry.clone(),
            reconcile: self.lookup.as_ref().map(|l| l.policy.clone()),
            idempotency_ttl_ms: self.idempotency.as_ref().map(|(_, ttl, _)| millis(*ttl)),
            idempotency_ttl_margin_ms: self
                .idempotency
                .as_ref()
                .map_or(0, |(_, _, margin)| millis(*margin)),
            fallback: None,
        }
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

/// Headers sent with every request, their values marked sensitive.
type Headers = Vec<(HeaderName, HeaderValue)>;

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
