//! Target configuration as written by an operator (serde), before validation.
//!
//! Validation and the resolution of environment variables happen in
//! [`crate::Target::from_config`], which names the offending field in every error.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// One remote endpoint: how to send an attempt and how to look up what the remote holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TargetConfig {
    /// Where attempts go (`http://host:port/path` or `https://host:port/path`); may contain
    /// `{field}` placeholders.
    pub url: String,
    /// HTTP method of an attempt.
    #[serde(default = "default_method")]
    pub method: String,
    /// Headers sent with every attempt and lookup. Values are secret: never logged, never in
    /// events, redacted in `Debug`.
    #[serde(default)]
    pub headers: BTreeMap<String, HeaderValueConfig>,
    /// Extra top-level fields merged into the JSON body (templates, e.g. `"{task_id}"`).
    /// The body is the request payload otherwise.
    #[serde(default)]
    pub body_fields: BTreeMap<String, String>,
    /// Time allowed to resolve the host, open the TCP connection and, for https, complete the
    /// TLS handshake.
    #[serde(default = "default_connect_timeout", with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// Time allowed from writing the request to reading the whole response.
    #[serde(default = "default_request_timeout", with = "humantime_serde")]
    pub request_timeout: Duration,
    /// How long an idle connection may be reused. `0s` opens a new connection per request.
    /// Keep it below the remote's keep-alive timeout: a request written on a connection the
    /// remote is closing is an unknown outcome.
    #[serde(default = "default_pool_idle", with = "humantime_serde")]
    pub pool_idle_timeout: Duration,
    /// JSON pointer to the remote id in a 2xx response body.
    #[serde(default = "default_id_pointer")]
    pub response_id_pointer: String,
    /// What a 5xx proves.
    #[serde(default)]
    pub on_5xx: ServerErrorPolicy,
    /// What a 409 proves.
    #[serde(default)]
    pub on_409: ConflictPolicy,
    /// Set when the remote honours an idempotency key header.
    #[serde(default)]
    pub idempotency: Option<IdempotencyConfig>,
    #[serde(default)]
    pub retry: RetryConfig,
    /// Most requests in flight at this target at once, attempts and lookups together (unless
    /// `lookup.limits` gives lookups their own); tasks beyond it wait for a slot before they
    /// record their intent. Keep it within what the remote serves before its answers slow
    /// past `request_timeout` (each such timeout is an unknown outcome to reconcile).
    #[serde(default = "default_max_in_flight")]
    pub max_in_flight: usize,
    /// Most requests per second at this target, attempts and lookup pages together (unless
    /// `lookup.limits` gives lookups their own), as a token bucket with one second of burst;
    /// unlimited when unset.
    #[serde(default)]
    pub rate_limit: Option<f64>,
    /// How to ask the remote what it holds. Without it, unknown outcomes go to manual review.
    #[serde(default)]
    pub lookup: Option<LookupConfig>,
    /// The target's circuit breaker: when the remote fails, tasks wait before their intent
    /// instead of sending into the outage. On by default.
    #[serde(default)]
    pub breaker: BreakerConfig,
    /// How https URLs (of attempts and lookups) verify the remote and present this client.
    /// Without it, the remote's certificate must chain to a public root (webpki roots).
    #[serde(default)]
    pub tls: Option<TlsConfig>,
    /// Send a W3C `traceparent` header with each attempt and lookup of a task that has a
    /// trace context (naming their span when traces are exported, else the request's own context),
    /// so that the remote's spans join the task's trace. Off by default: it tells the remote
    /// which trace a request belongs to.
    #[serde(default)]
    pub propagate_trace: bool,
    /// Another configured target (with no fallback of its own) where a task's attempts go when
    /// this one cannot take them and nothing of the task can exist here: every attempt of the
    /// task proven not sent, and this target's attempts exhausted or its breaker open. The
    /// fallback's own retry, lookup and breaker apply there, and a task that moved stays there
    /// (a retried task starts here again). Never after an unknown outcome.
    #[serde(default)]
    pub fallback: Option<String>,
}

/// TLS settings of a target. Certificate verification is always on; there is no way to turn
/// it off. The server name verified is the host of the URL (a DNS name or an IP address).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    /// PEM file of the CA certificates the remote's certificate must chain to (a private CA).
    /// When set, only these are trusted; otherwise the public webpki roots are.
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    /// PEM file of the client certificate (and its chain) presented for mutual TLS; needs
    /// `client_key`.
    #[serde(default)]
    pub client_cert: Option<PathBuf>,
    /// PEM file of the private key of `client_cert` (PKCS#8, PKCS#1 or SEC1). Its contents are
    /// never logged; only the path is shown.
    #[serde(default)]
    pub client_key: Option<PathBuf>,
}

/// A header value: literal text, or read from an environment variable when the target is
/// loaded (`{ env = "NAME", prefix = "Bearer " }`). `Debug` and `Serialize` show neither the
/// text nor the prefix (`***`), only the variable's name.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum HeaderValueConfig {
    Literal(String),
    Env {
        env: String,
        #[serde(default)]
        prefix: String,
    },
}

impl Serialize for HeaderValueConfig {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct Env<'a> {
            env: &'a str,
            prefix: &'a str,
        }
        match self {
            HeaderValueConfig::Literal(_) => serializer.serialize_str(REDACTED),
            HeaderValueConfig::Env { env, .. } => Env {
                env,
                prefix: REDACTED,
            }
            .serialize(serializer),
        }
    }
}

/// What `Debug` and `Serialize` show instead of a header value.
const REDACTED: &str = "***";

impl fmt::Debug for HeaderValueConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HeaderValueConfig::Literal(_) => f.write_str("Literal(<redacted>)"),
            HeaderValueConfig::Env { env, .. } => f
                .debug_struct("Env")
                .field("env", env)
                .field("prefix", &"<redacted>")
                .finish(),
        }
    }
}

/// What a 5xx answer proves about an attempt.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ServerErrorPolicy {
    /// It may have been performed: reconcile (the safe default).
    #[default]
    Unknown,
    /// The remote guarantees a 5xx performed nothing: retry with backoff.
    NotSent,
}

/// What a 409 answer proves about an attempt.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ConflictPolicy {
    /// A client error like any other 4xx: rejected, terminal.
    #[default]
    Reject,
    /// "Already exists": the outcome is unknown until a lookup finds the record.
    Reconcile,
    /// "Already exists" and the remote guarantees it is this task's record: succeeded, with
    /// the id at `response_id_pointer` when the answer has one. No retry, no lookup.
    Succeeded,
}

/// The remote's idempotency key support.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IdempotencyConfig {
    /// Header carrying the key, e.g. `Idempotency-Key`.
    pub header: String,
    /// How long the remote remembers a key.
    #[serde(with = "humantime_serde")]
    pub ttl: Duration,
    /// A key is reused only while it has at least this long left to live (default: a tenth
    /// of `ttl`, at most one minute), so no resend arrives after the remote forgot the key.
    #[serde(default, with = "humantime_serde")]
    pub ttl_margin: Option<Duration>,
}

impl IdempotencyConfig {
    /// `ttl_margin`, or its default.
    pub fn margin(&self) -> Duration {
        self.ttl_margin
            .unwrap_or_else(|| (self.ttl / 10).min(Duration::from_secs(60)))
    }
}

/// Retries of attempts that certainly did not reach the remote: the default for every reason,
/// and optionally a policy per class of reason.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetryConfig {
    /// Attempts in all, the first included.
    pub max_attempts: u32,
    #[serde(with = "humantime_serde")]
    pub initial_backoff: Duration,
    /// Longest backoff; a remote's `Retry-After` is honoured up to 1 hour, or up to this when
    /// it is longer.
    #[serde(with = "humantime_serde")]
    pub max_backoff: Duration,
    /// Growth of the backoff per attempt (1.0: a fixed interval).
    pub multiplier: f64,
    /// Full jitter: each delay is uniform between 0 and the backoff. Off: the backoff itself.
    pub jitter: bool,
    /// Attempts not sent because the connection failed (DNS, refused, connect timeout, TLS
    /// handshake): their own attempts and backoff; unset keys take the values above.
    pub connect: Option<RetryClassConfig>,
    /// Attempts answered 429, or 503 with `Retry-After` (still a floor).
    pub throttled: Option<RetryClassConfig>,
    /// Attempts answered a 5xx that the target declares not performed (`on_5xx = "not_sent"`).
    pub server_error: Option<RetryClassConfig>,
}

impl Default for RetryConfig {
    fn default() -> Self {
        RetryConfig {
            max_attempts: 8,
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(30),
            multiplier: 2.0,
            jitter: true,
            connect: None,
            throttled: None,
            server_error: None,
        }
    }
}

/// The retry policy of one class of "not sent": counted within the class (and within
/// `retry.max_attempts` in all), its backoff growing with the class's own count.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetryClassConfig {
    pub max_attempts: Option<u32>,
    #[serde(with = "humantime_serde")]
    pub initial_backoff: Option<Duration>,
    #[serde(with = "humantime_serde")]
    pub max_backoff: Option<Duration>,
    pub multiplier: Option<f64>,
    pub jitter: Option<bool>,
    /// The timeout of the attempts that retry this class: for `connect`, their connect timeout
    /// (TCP and the TLS handshake, in place of `connect_timeout`); for `throttled` and
    /// `server_error`, their request timeout (in place of `request_timeout`).
    #[serde(with = "humantime_serde")]
    pub timeout: Option<Duration>,
}

/// How to find the remote's records of a task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LookupConfig {
    /// `GET` URL with `{field}` placeholders (percent-encoded when rendered), e.g.
    /// `http://remote/records?reference={task_id}`. It must tell tasks apart: `{task_id}`, or
    /// each of `{tenant}`, `{operation}` and `{request_key}` alone in a path segment or query
    /// value (checked when the target is loaded).
    pub url: String,
    /// JSON pointer to the array of records in the answer (`""`: the answer is the array).
    #[serde(default)]
    pub results_pointer: String,
    /// JSON pointer to the id within one record.
    #[serde(default = "default_id_pointer")]
    pub id_pointer: String,
    /// Keep only records whose value at the key (a JSON pointer into the record) equals the
    /// request payload's value at the value (a JSON pointer into the payload).
    #[serde(default)]
    pub filters: BTreeMap<String, String>,
    /// Keep only records created after the first intent of the task.
    #[serde(default)]
    pub created_after_intent: Option<CreatedAfterConfig>,
    /// Delay between an unknown outcome and the first lookup.
    #[serde(default = "default_first_check", with = "humantime_serde")]
    pub first_check: Duration,
    /// Delay between lookups that found nothing.
    #[serde(default = "default_check_interval", with = "humantime_serde")]
    pub check_interval: Duration,
    /// Observation window of each attempt whose outcome became unknown, counted from that
    /// outcome: after it, no record means manual review, or a resend when
    /// `resend_when_absent`.
    #[serde(default = "default_deadline", with = "humantime_serde")]
    pub deadline: Duration,
    /// Authorize a resend (recorded as an event) when the deadline passes with no record.
    /// Off by default: absence of evidence is not evidence of absence.
    #[serde(default)]
    pub resend_when_absent: bool,
    /// With `resend_when_absent` or `complete_after`: at most this many resends per task are
    /// authorized by the policy; after that, manual review.
    #[serde(default = "default_max_policy_resends")]
    pub max_policy_resends: u32,
    /// The remote's promise that a record an attempt created is visible to a lookup this long
    /// after the attempt's outcome became unknown (its processing time plus its lookup's lag).
    /// A lookup asked past it that finds nothing proves the attempt was not performed: a
    /// resend is authorized (within `max_policy_resends`) instead of manual review. Unset: no
    /// such promise, absence proves nothing.
    #[serde(default, with = "humantime_serde")]
    pub complete_after: Option<Duration>,
    /// How to read an answer the remote gives in pages (`[targets.NAME.lookup.paging]`).
    /// Unset: the first answer holds every record. Set, the lookup reads every page and
    /// matches the records of all of them; a lookup that cannot read every page is an error,
    /// never a result.
    #[serde(default)]
    pub paging: Option<PagingConfig>,
    /// Limits of lookups of their own (`[targets.NAME.lookup.limits]`). Unset: each lookup
    /// takes a slot of the target's `max_in_flight` for as long as it runs, and each of its
    /// pages a turn of the target's `rate_limit`, shared with the attempts.
    #[serde(default)]
    pub limits: Option<LookupLimitsConfig>,
}

/// A limiter for lookups alone, instead of the target's: at most `max_in_flight` lookups at
/// once, and at most `rate_limit` lookup requests (pages) per second. A lookup waits for room
/// at most the target's `request_timeout`, then fails unsent (no evidence either way).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LookupLimitsConfig {
    /// Most lookups in flight at once (default 256, as a target's).
    #[serde(default = "default_max_in_flight")]
    pub max_in_flight: usize,
    /// Most lookup requests per second (a token bucket with one second of burst); unlimited
    /// when unset.
    #[serde(default)]
    pub rate_limit: Option<f64>,
}

/// How a lookup follows the pages of the remote's answer: exactly one of `next_pointer`,
/// `link = true` and `page_param`. A record on a page not read could be the task's own or a
/// duplicate of it, so a lookup whose pages cannot all be read (a page that fails, a next URL
/// that cannot be used, more than `max_pages` pages) fails: no evidence either way.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PagingConfig {
    /// JSON pointer to the next page's URL in each answer (e.g. `/next` with
    /// `results_pointer = "/items"`): an absolute URL or a reference resolved against the
    /// page's URL. `null`, absent or `""` on the last page.
    #[serde(default)]
    pub next_pointer: Option<String>,
    /// Follow the `rel="next"` target of the answer's `Link` header (RFC 8288); no such link
    /// on the last page.
    #[serde(default)]
    pub link: bool,
    /// A query parameter numbering the pages (e.g. `page`), added to the lookup URL: pages
    /// `first_page`, `first_page + 1`... are read until one holds no record (or, with
    /// `page_size`, fewer records than that).
    #[serde(default)]
    pub page_param: Option<String>,
    /// With `page_param`: the number of the first page (default 1).
    #[serde(default)]
    pub first_page: Option<u64>,
    /// With `page_param`: the most records the remote puts on a page, so that a shorter page
    /// is known to be the last without asking for the next (empty) one. Unset: an empty page
    /// ends the answer.
    #[serde(default)]
    pub page_size: Option<usize>,
    /// The most pages (requests) one lookup reads; an answer that goes on past them is an
    /// error. With `page_param`, the empty page that ends the answer counts.
    #[serde(default = "default_max_pages")]
    pub max_pages: u32,
}

/// A target's circuit breaker (`docs/operating/configuration.md`, "Circuit breaker").
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BreakerConfig {
    /// Off: attempts go out whatever the remote's recent failures.
    pub enabled: bool,
    /// The window: the latest this many attempt outcomes.
    pub window_calls: usize,
    /// When set, the window also forgets outcomes older than this.
    #[serde(with = "humantime_serde")]
    pub window: Option<Duration>,
    /// The breaker opens only when the window holds at least this many outcomes.
    pub minimum_calls: usize,
    /// ... and at least this share of them (0 < rate ≤ 1) are failures.
    pub failure_rate: f64,
    /// Attempts still running after this long count as failing: when, of those admitted between
    /// twice this and this long ago, `minimum_calls` and `failure_rate` still run, the breaker
    /// opens, before their requests time out. Default: `request_timeout`, at most 10 s. At most
    /// `request_timeout`.
    #[serde(with = "humantime_serde")]
    pub slow_after: Option<Duration>,
    /// How long the breaker stays open before it probes. Waiting tasks look again after it,
    /// spread over as long again.
    #[serde(with = "humantime_serde")]
    pub open_for: Duration,
    /// Probes in half-open: as many successes close the breaker, one failure opens it again.
    pub half_open_probes: u32,
    /// Whether attempts proven not sent by the remote's doing (refused, connect timeout, TLS
    /// handshake, 429, 503, a 5xx configured `not_sent`) count as failures.
    pub count_not_sent: bool,
    /// Whether unknown outcomes (timeout, reset after write, 5xx) count as failures.
    pub count_unknown: bool,
    /// A `GET` URL (no placeholders) that answers 2xx while the remote is up: in half-open it
    /// is the probe, so no task's attempt is risked. Without it, the probes are real attempts
    /// (a probe whose outcome is unknown is reconciled like any other).
    pub health_url: Option<String>,
    /// When the breaker closes again, retry the target's tasks that failed within this long
    /// before, where every attempt of the task was proven not sent by the remote's doing
    /// (refused, connect timeout, TLS handshake, 429, 503, a 5xx configured `not_sent`): each
    /// records `TaskRetried` by `policy:breaker_closed`, as an operator's bulk retry would.
    /// Off when unset.
    #[serde(with = "humantime_serde")]
    pub retry_failed_within: Option<Duration>,
}

impl Default for BreakerConfig {
    fn default() -> Self {
        BreakerConfig {
            enabled: true,
            window_calls: 50,
            window: None,
            minimum_calls: 20,
            failure_rate: 0.5,
            slow_after: None,
            open_for: Duration::from_secs(5),
            half_open_probes: 1,
            count_not_sent: true,
            count_unknown: true,
            health_url: None,
            retry_failed_within: None,
        }
    }
}

fn default_max_in_flight() -> usize {
    256
}

fn default_max_policy_resends() -> u32 {
    sendledger_core::decide::DEFAULT_MAX_POLICY_RESENDS
}

/// Where a record's creation time is and how to read it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreatedAfterConfig {
    /// JSON pointer to the creation time within one record.
    pub pointer: String,
    /// How the time is written.
    #[serde(default)]
    pub format: TimeFormat,
    /// Clock difference tolerated between this process and the remote.
    #[serde(default = "default_skew", with = "humantime_serde")]
    pub skew: Duration,
}

/// How a remote writes a timestamp.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TimeFormat {
    /// A number: milliseconds since the Unix epoch.
    #[default]
    UnixMillis,
    /// A number: seconds since the Unix epoch.
    UnixSeconds,
    /// An RFC 3339 string.
    Rfc3339,
}

fn default_method() -> String {
    "POST".into()
}
fn default_connect_timeout() -> Duration {
    Duration::from_secs(5)
}
fn default_request_timeout() -> Duration {
    Duration::from_secs(30)
}
fn default_pool_idle() -> Duration {
    Duration::from_secs(2)
}
fn default_id_pointer() -> String {
    "/id".into()
}
fn default_first_check() -> Duration {
    Duration::from_secs(1)
}
fn default_check_interval() -> Duration {
    Duration::from_secs(5)
}
fn default_deadline() -> Duration {
    Duration::from_secs(300)
}
fn default_max_pages() -> u32 {
    10
}
fn default_skew() -> Duration {
    Duration::from_secs(30)
}

#[cfg(test)]
mod tests {
    use super::{LookupLimitsConfig, TlsConfig};

    /// The lines of the example configuration's commented section `header`, uncommented.
    fn commented_section(header: &str) -> String {
        let example = include_str!("../../../schemas/sendledger.example.toml");
        example
            .lines()
            .skip_while(|l| *l != format!("# {header}"))
            .skip(1)
            .take_while(|l| l.starts_with("# ") && !l.starts_with("# ["))
            .map(|l| format!("{}\n", &l[2..]))
            .collect()
    }

    /// The example configuration's commented `[targets.payments.tls]` section, uncommented, is
    /// a valid `TlsConfig` (the section stays commented there: its files do not exist).
    #[test]
    fn the_commented_example_tls_section_parses() {
        let section = commented_section("[targets.payments.tls]");
        let tls: TlsConfig = toml::from_str(&section).expect("the example tls section parses");
        assert!(tls.ca_file.is_some() && tls.client_cert.is_some() && tls.client_key.is_some());
    }

    /// So is its `[targets.payments.lookup.limits]` section, a `LookupLimitsConfig`.
    #[test]
    fn the_commented_example_lookup_limits_parse() {
        let section = commented_section("[targets.payments.lookup.limits]");
        let limits: LookupLimitsConfig =
            toml::from_str(&section).expect("the example lookup.limits section parses");
        assert_eq!((limits.max_in_flight, limits.rate_limit), (8, Some(5.0)));
    }
}

/// A multi-step task (`[sagas.NAME]`): a request whose `target` names the saga runs its
/// steps in order, each a call at a configured target, the next once the one before is
/// confirmed. When a step ends rejected or failed, the steps before it that succeeded are
/// undone, last first, by their `compensate` targets (`docs/sagas.md`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SagaConfig {
    pub steps: Vec<SagaStepConfig>,
}

/// One step of a saga.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SagaStepConfig {
    /// The step's name: letters, digits, `_` and `-`; templates read its remote id as
    /// `{steps.NAME.remote_id}`.
    pub name: String,
    /// The target that performs the step. Its templates may read the steps before it.
    pub target: String,
    /// The target that undoes the step (with its own lookup to prove whether it did). Its
    /// templates may read this step and the steps before it. None: the step is not undone.
    #[serde(default)]
    pub compensate: Option<String>,
}
