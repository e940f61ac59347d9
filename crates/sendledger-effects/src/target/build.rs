//! Building and validating a target from its configuration: [`Target::from_config`] and the
//! checks of each field, in the order they appear in the configuration. Errors name the field
//! (`targets.<name>.<field>`) and never contain a header value; a lookup that does not tell
//! tasks apart is refused here.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::header::{HeaderName, HeaderValue};
use http::{Method, Uri};
use sendledger_core::decide::ReconcilePolicy;
use sendledger_core::{RetryClass, RetryPolicy};
use tokio_rustls::TlsConnector;
use tracing::warn;

use super::paging::{Paging, Style};
use super::redact::secret_fragments;
use super::{millis, Headers, Lookup, Target};
use crate::breaker::{Breaker, BreakerSettings};
use crate::classify::{Rules, MAX_RETRY_AFTER};
use crate::config::{
    HeaderValueConfig, IdempotencyConfig, LookupConfig, PagingConfig, RetryConfig,
    ServerErrorPolicy, TargetConfig,
};
use crate::conn::{Endpoint, Pool};
use crate::error::{Error, Result};
use crate::limit::Limiter;
use crate::template::{self, Template};
use crate::tls::{self, Tls};

/// Headers the client manages itself; configuring them is an error.
const MANAGED_HEADERS: [&str; 5] = [
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "upgrade",
];

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
        check_limits(&path, "", config.max_in_flight, config.rate_limit)?;
        let limiter = Arc::new(Limiter::new(config.max_in_flight, config.rate_limit));
        let retry = parse_retry(&path, config)?;
        let retry_endpoints = retry_endpoints(&path, config, &endpoint)?;
        let lookup = match &config.lookup {
            None => None,
            Some(l) => Some(lookup(
                &path,
                l,
                config,
                connector.as_ref(),
                &body_fields,
                &limiter,
            )?),
        };
        let (breaker, health) = breaker(&path, name, config, connector.as_ref())?;

        Ok(Target {
            name: name.to_string(),
            method,
            url,
            endpoint,
            retry_endpoints,
            headers,
            secrets,
            body_fields,
            rules: Rules {
                id_pointer: config.response_id_pointer.clone(),
                answer_fields: Vec::new(),
                on_5xx: config.on_5xx,
                on_409: config.on_409,
                max_retry_after: MAX_RETRY_AFTER.max(config.retry.max_backoff),
            },
            idempotency,
            propagate_trace: config.propagate_trace,
            retry,
            lookup,
            pool: Pool::default(),
            limiter,
            breaker,
            health,
            retry_failed_within: config.breaker.retry_failed_within,
            fallback: config.fallback.clone(),
        })
    }
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

/// `max_in_flight` and `rate_limit`, of the target (`prefix` empty) or of its lookups
/// (`lookup.limits.`).
fn check_limits(
    path: &Path<'_>,
    prefix: &str,
    max_in_flight: usize,
    rate_limit: Option<f64>,
) -> Result<()> {
    if max_in_flight == 0 {
        return Err(Error::config(
            path.at(&format!("{prefix}max_in_flight")),
            "must be at least 1",
        ));
    }
    if let Some(rate) = rate_limit {
        if !(rate.is_finite() && rate > 0.0) {
            return Err(Error::config(
                path.at(&format!("{prefix}rate_limit")),
                "must be a positive number of requests per second",
            ));
        }
    }
    Ok(())
}

/// A breaker's health request: its URL and where it goes.
type Health = (String, Endpoint);

/// The target's breaker and its health request, checked; none when disabled.
fn breaker(
    path: &Path<'_>,
    name: &str,
    config: &TargetConfig,
    connector: Option<&TlsConnector>,
) -> Result<(Option<Arc<Breaker>>, Option<Health>)> {
    let b = &config.breaker;
    if let Some(within) = b.retry_failed_within {
        if !b.enabled {
            return Err(Error::config(
                path.at("breaker.retry_failed_within"),
                "retries failed tasks when the breaker closes, and the breaker is off (enabled = false)",
            ));
        }
        positive(path, "breaker.retry_failed_within", within)?;
    }
    if !b.enabled {
        return Ok((None, None));
    }
    if b.minimum_calls == 0 {
        return Err(Error::config(
            path.at("breaker.minimum_calls"),
            "must be at least 1",
        ));
    }
    if b.window_calls < b.minimum_calls {
        return Err(Error::config(
            path.at("breaker.window_calls"),
            "must be at least breaker.minimum_calls (a smaller window never holds enough outcomes to open)",
        ));
    }
    if let Some(window) = b.window {
        positive(path, "breaker.window", window)?;
    }
    if !(b.failure_rate > 0.0 && b.failure_rate <= 1.0) {
        return Err(Error::config(
            path.at("breaker.failure_rate"),
            "must be a share in (0, 1], e.g. 0.5",
        ));
    }
    positive(path, "breaker.open_for", b.open_for)?;
    if b.half_open_probes == 0 {
        return Err(Error::config(
            path.at("breaker.half_open_probes"),
            "must be at least 1",
        ));
    }
    if !b.count_not_sent && !b.count_unknown {
        return Err(Error::config(
            path.at("breaker"),
            "counts no failure (count_not_sent and count_unknown are both false): set enabled = false instead",
        ));
    }
    let slow_after = match b.slow_after {
        Some(slow) => {
            positive(path, "breaker.slow_after", slow)?;
            if slow > config.request_timeout {
                return Err(Error::config(
                    path.at("breaker.slow_after"),
                    "must not exceed request_timeout (an attempt never runs longer)",
                ));
            }
            slow
        }
        None => config.request_timeout.min(Duration::from_secs(10)),
    };
    let health = match &b.health_url {
        None => None,
        Some(url) => {
            let (template, endpoint) =
                endpoint(path, "breaker.health_url", url, config, connector)?;
            if template.source().contains('{') {
                return Err(Error::config(
                    path.at("breaker.health_url"),
                    "must not have placeholders: it is asked for no task",
                ));
            }
            Some((template.source().to_string(), endpoint))
        }
    };
    let settings = BreakerSettings {
        window_calls: b.window_calls,
        window: b.window,
        minimum_calls: b.minimum_calls,
        failure_rate: b.failure_rate,
        slow_after,
        open_for: b.open_for,
        half_open_probes: b.half_open_probes,
        // A probe's answer comes within connect and request timeouts, or never.
        probe_timeout: config.connect_timeout + config.request_timeout + Duration::from_secs(1),
        count_not_sent: b.count_not_sent,
        count_unknown: b.count_unknown,
    };
    Ok((Some(Breaker::new(name, settings)), health))
}

fn parse_retry(path: &Path<'_>, config: &TargetConfig) -> Result<RetryPolicy> {
    let r = &config.retry;
    let mut policy = retry_policy(path, "retry", r)?;
    let classes = [
        (RetryClass::Connect, &r.connect),
        (RetryClass::Throttled, &r.throttled),
        (RetryClass::ServerError, &r.server_error),
    ];
    for (class, overrides) in classes {
        let Some(o) = overrides else { continue };
        let field = format!("retry.{}", class.name());
        if class == RetryClass::ServerError && config.on_5xx != ServerErrorPolicy::NotSent {
            return Err(Error::config(
                path.at(&field),
                "applies to 5xx answers declared not performed, and on_5xx is not \"not_sent\" (a 5xx is an unknown outcome, never retried)",
            ));
        }
        let merged = RetryConfig {
            max_attempts: o.max_attempts.unwrap_or(r.max_attempts),
            initial_backoff: o.initial_backoff.unwrap_or(r.initial_backoff),
            max_backoff: o.max_backoff.unwrap_or(r.max_backoff),
            multiplier: o.multiplier.unwrap_or(r.multiplier),
            jitter: o.jitter.unwrap_or(r.jitter),
            ..RetryConfig::default()
        };
        let own = retry_policy(path, &field, &merged)?;
        if own.max_attempts > policy.max_attempts {
            return Err(Error::config(
                path.at(&format!("{field}.max_attempts")),
                "must not exceed retry.max_attempts (the attempts in all)",
            ));
        }
        policy.classes.insert(class, own);
    }
    Ok(policy)
}

/// The endpoint of the attempts that retry each class with a `timeout` of its own: `connect`'s
/// in place of the connect timeout, the others' in place of the request timeout.
fn retry_endpoints(
    path: &Path<'_>,
    config: &TargetConfig,
    endpoint: &Endpoint,
) -> Result<BTreeMap<RetryClass, Endpoint>> {
    let r = &config.retry;
    let mut endpoints = BTreeMap::new();
    for (class, overrides) in [
        (RetryClass::Connect, &r.connect),
        (RetryClass::Throttled, &r.throttled),
        (RetryClass::ServerError, &r.server_error),
    ] {
        let Some(timeout) = overrides.as_ref().and_then(|o| o.timeout) else {
            continue;
        };
        positive(path, &format!("retry.{}.timeout", class.name()), timeout)?;
        let mut own = endpoint.clone();
        match class {
            RetryClass::Connect => own.connect_timeout = timeout,
            RetryClass::Throttled | RetryClass::ServerError => own.request_timeout = timeout,
        }
        endpoints.insert(class, own);
    }
    Ok(endpoints)
}

/// One retry policy's checks; `field` is where it is configured (`retry`, `retry.connect`).
fn retry_policy(path: &Path<'_>, field: &str, r: &RetryConfig) -> Result<RetryPolicy> {
    if r.max_attempts == 0 {
        return Err(Error::config(
            path.at(&format!("{field}.max_attempts")),
            "must be at least 1",
        ));
    }
    if !(r.multiplier.is_finite() && r.multiplier >= 1.0) {
        return Err(Error::config(
            path.at(&format!("{field}.multiplier")),
            "must be a number of at least 1.0",
        ));
    }
    if r.initial_backoff > r.max_backoff {
        return Err(Error::config(
            path.at(&format!("{field}.initial_backoff")),
            format!("must not exceed {field}.max_backoff"),
        ));
    }
    Ok(RetryPolicy {
        max_attempts: r.max_attempts,
        initial_backoff_ms: millis(r.initial_backoff),
        max_backoff_ms: millis(r.max_backoff),
        multiplier: r.multiplier,
        jitter: r.jitter,
        classes: Default::default(),
    })
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
    if https(&config.url)
        || config.lookup.as_ref().is_some_and(|l| https(&l.url))
        || config.breaker.health_url.as_deref().is_some_and(https)
    {
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

/// The target's lookup, checked; its lookups take their room from `limiter` (the target's)
/// unless `lookup.limits` gives them their own.
fn lookup(
    path: &Path<'_>,
    l: &LookupConfig,
    target: &TargetConfig,
    connector: Option<&TlsConnector>,
    body_fields: &[(String, Template)],
    limiter: &Arc<Limiter>,
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
    let paging = match &l.paging {
        None => None,
        Some(p) => Some(paging(path, p, l, &url)?),
    };
    positive(path, "lookup.check_interval", l.check_interval)?;
    if let Some(bound) = l.complete_after {
        positive(path, "lookup.complete_after", bound)?;
        if bound >= l.deadline {
            return Err(Error::config(
                path.at("lookup.complete_after"),
                "must be shorter than lookup.deadline (the deadline would send the task to review first)",
            ));
        }
    }
    if l.deadline < l.first_check {
        return Err(Error::config(
            path.at("lookup.deadline"),
            "must not be shorter than lookup.first_check",
        ));
    }
    let limiter = match &l.limits {
        None => limiter.clone(),
        Some(own) => {
            check_limits(path, "lookup.limits.", own.max_in_flight, own.rate_limit)?;
            Arc::new(Limiter::new(own.max_in_flight, own.rate_limit))
        }
    };
    Ok(Lookup {
        limiter,
        throttled_until: Mutex::new(None),
        url,
        endpoint,
        results_pointer: l.results_pointer.clone(),
        id_pointer: l.id_pointer.clone(),
        filters,
        created_after: l.created_after_intent.clone(),
        paging,
        policy: ReconcilePolicy {
            first_check_ms: millis(l.first_check),
            check_interval_ms: millis(l.check_interval),
            deadline_ms: millis(l.deadline),
            resend_when_absent: l.resend_when_absent,
            max_policy_resends: l.max_policy_resends,
            complete_after_ms: l.complete_after.map(millis),
        },
    })
}

/// `lookup.paging`: exactly one way to the next page, each of its settings checked, so that no
/// setting a lookup would ignore is accepted.
fn paging(path: &Path<'_>, p: &PagingConfig, l: &LookupConfig, url: &Template) -> Result<Paging> {
    let field = |name: &str| path.at(&format!("lookup.paging.{name}"));
    let styles: Vec<&str> = [
        ("next_pointer", p.next_pointer.is_some()),
        ("link", p.link),
        ("page_param", p.page_param.is_some()),
    ]
    .into_iter()
    .filter_map(|(name, set)| set.then_some(name))
    .collect();
    if styles.len() != 1 {
        return Err(Error::config(
            path.at("lookup.paging"),
            format!(
                "sets {}: set exactly one of next_pointer (a URL in the answer), link = true (the Link header) and page_param (numbered pages)",
                match styles.as_slice() {
                    [] => "no way to the next page".to_string(),
                    both => both.join(" and "),
                }
            ),
        ));
    }
    if p.max_pages == 0 {
        return Err(Error::config(field("max_pages"), "must be at least 1"));
    }
    let numbered = |name: &str, set: bool| {
        if set && p.page_param.is_none() {
            return Err(Error::config(field(name), "applies to page_param only"));
        }
        Ok(())
    };
    numbered("first_page", p.first_page.is_some())?;
    numbered("page_size", p.page_size.is_some())?;
    let style = if let Some(next) = &p.next_pointer {
        pointer(path, "lookup.paging.next_pointer", next)?;
        // A pointer that finds nothing reads as the last page: one into the records' array
        // would read every answer as the last page.
        if next.is_empty() || l.results_pointer.is_empty() {
            return Err(Error::config(
                field("next_pointer"),
                "must point beside the records in the answer (e.g. `/next` with results_pointer = \"/items\"), not at the whole answer, nor into an answer that is the records' array (results_pointer = \"\")",
            ));
        }
        Style::NextPointer(next.clone())
    } else if let Some(name) = &p.page_param {
        let unreserved = |c: char| c.is_ascii_alphanumeric() || "-._~".contains(c);
        if name.is_empty() || !name.chars().all(unreserved) {
            return Err(Error::config(
                field("page_param"),
                format!("`{name}` is not a query parameter name (ASCII letters, digits, `-`, `.`, `_`, `~`)"),
            ));
        }
        if url.query_params().iter().any(|(param, _)| param == name) {
            return Err(Error::config(
                field("page_param"),
                format!("lookup.url already has a `{name}` parameter; the lookup adds it to number the pages"),
            ));
        }
        if p.page_size == Some(0) {
            return Err(Error::config(field("page_size"), "must be at least 1"));
        }
        Style::PageParam {
            name: name.clone(),
            first: p.first_page.unwrap_or(1),
            size: p.page_size,
        }
    } else {
        Style::Link
    };
    Ok(Paging {
        style,
        max_pages: p.max_pages,
    })
}
