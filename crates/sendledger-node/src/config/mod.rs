//! The service's configuration: one TOML file (see `schemas/sendledger.example.toml`) with one
//! section per subsystem, overridable from the environment.
//!
//! Environment overrides: `SENDLEDGER__<SECTION>__<FIELD>=value` sets `<section>.<field>`
//! (names are lower-cased; `__` separates levels), e.g. `SENDLEDGER__KAFKA__BROKERS=kafka:9092`
//! or `SENDLEDGER__ADMIN__TOKEN=...`. Under `kafka.properties` a `_` (or `__`) becomes a `.`, so
//! `SENDLEDGER__KAFKA__PROPERTIES__SASL_PASSWORD` (or `..._SASL__PASSWORD`) sets the librdkafka
//! property `sasl.password`.
//! A value is read as a TOML literal when it is one (`4`, `true`, `["a"]`), else as a string.
//!
//! Every error names the field (`kafka.brokers: ...`) and, for an override, the variable. The
//! overrides are applied by [`env`].

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use sendledger_actors::EngineConfig;
use sendledger_core::Limits;
use sendledger_effects::{SagaConfig, TargetConfig, Targets};
use sendledger_kafka::config::is_secret;
use sendledger_kafka::KafkaConfig;
use sendledger_store::{Durability, Memory};
use serde::{Deserialize, Serialize};

use crate::error::ConfigError;

mod access;
mod env;
mod front;

pub use access::{AccessConfig, TenantAccessConfig};
pub use env::ENV_PREFIX;
pub use front::FrontConfig;

/// What `Debug`, `Serialize` and error messages show instead of a secret value.
const REDACTED: &str = "***";

/// `Debug` and `Serialize` show secrets as `***`: `admin.token`, and `kafka.properties` values
/// whose key [`is_secret`]; target header values redact themselves. No output of a
/// configuration carries a secret.
#[derive(Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub storage: StorageConfig,
    pub engine: EngineSection,
    pub kafka: KafkaConfig,
    pub admin: AdminConfig,
    /// The HTTP front door: tasks submitted with an `Idempotency-Key`.
    pub front: FrontConfig,
    pub telemetry: TelemetryConfig,
    /// The remotes requests may name, by name.
    pub targets: BTreeMap<String, TargetConfig>,
    /// Multi-step tasks requests may name instead of a target, by name: each step a call at
    /// one of the targets, undone in reverse order when a later step fails.
    pub sagas: BTreeMap<String, SagaConfig>,
    /// Which tenants requests may be for, and what each may ask for.
    pub access: AccessConfig,
}

impl Config {
    /// The Kafka section with secret property values replaced by `***`.
    fn kafka_redacted(&self) -> KafkaConfig {
        let properties = self.kafka.properties.iter().map(|(k, v)| {
            let v = if is_secret(k) { REDACTED } else { v.as_str() };
            (k.clone(), v.to_string())
        });
        KafkaConfig {
            properties: properties.collect(),
            ..self.kafka.clone()
        }
    }
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Config")
            .field("storage", &self.storage)
            .field("engine", &self.engine)
            .field("kafka", &self.kafka_redacted())
            .field("admin", &self.admin)
            .field("front", &self.front)
            .field("telemetry", &self.telemetry)
            .field("targets", &self.targets)
            .field("sagas", &self.sagas)
            .field("access", &self.access)
            .finish()
    }
}

impl Serialize for Config {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct Shown<'a> {
            storage: &'a StorageConfig,
            engine: &'a EngineSection,
            kafka: KafkaConfig,
            admin: &'a AdminConfig,
            front: &'a FrontConfig,
            telemetry: &'a TelemetryConfig,
            targets: &'a BTreeMap<String, TargetConfig>,
            sagas: &'a BTreeMap<String, SagaConfig>,
            access: &'a AccessConfig,
        }
        Shown {
            storage: &self.storage,
            engine: &self.engine,
            kafka: self.kafka_redacted(),
            admin: &self.admin,
            front: &self.front,
            telemetry: &self.telemetry,
            targets: &self.targets,
            sagas: &self.sagas,
            access: &self.access,
        }
        .serialize(serializer)
    }
}

/// Serializes a secret that may be unset as `***` when it is set.
fn redact_option<S: serde::Serializer>(
    secret: &Option<String>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    match secret {
        Some(_) => serializer.serialize_some(REDACTED),
        None => serializer.serialize_none(),
    }
}

/// Where the ledger lives and how durable an acknowledged write is.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StorageConfig {
    /// Ledger directory (created `0700` if missing).
    pub data: PathBuf,
    /// `sync` (fsync before acknowledging; the only safe choice in production) or `buffered`.
    pub durability: Durability,
    /// RocksDB's memory for the ledger, in bytes: one block cache shared by every column
    /// family, with the write buffers charged to it (flushed past half). At least 4 MiB.
    pub memory_bytes: usize,
    /// `local`: the ledger on this disk is the record, one instance per consumer group.
    /// `kafka`: the events topic is the record (one transactional writer per partition), the
    /// ledger holds the state of the partitions this instance owns, and several instances
    /// share one consumer group.
    pub mode: StorageMode,
    /// Kafka mode: accept an events topic that deletes or compacts events, with the
    /// consequence that a partition restored on another disk forgets the tasks whose events
    /// were deleted (a redelivery of their requests is sent again).
    pub allow_finite_log_retention: bool,
    /// How long after a task settled (succeeded, rejected, failed or compensated) its history
    /// is removed from the ledger, keeping its identity, payload hash and result so that a
    /// redelivery is still answered and never executed (`docs/operating/retention.md`).
    /// Unset: every history is kept. In kafka mode it bounds this instance's copy of each
    /// partition (owned here or not); the events topic is bounded by its own retention with
    /// `kafka.snapshot_interval`.
    #[serde(with = "humantime_serde")]
    pub retention: Option<Duration>,
    /// How long after a task settled what retention kept of it is forgotten too: a delivery
    /// of its request after that is a new task, executed again. At least `retention`, and
    /// refused at start when the requests topic keeps messages longer (a redelivery from the
    /// topic could then run again). Unset: identities are kept for good. In kafka mode (with
    /// `kafka.snapshot_interval`): the snapshots leave out the tasks settled longer ago than
    /// this too, so a take-over from a snapshot forgets them.
    #[serde(with = "humantime_serde")]
    pub identity_retention: Option<Duration>,
    /// A directory where retention archives every history it removes, and every identity it
    /// forgets, before removing it: a file per day that `sendledger audit --archive` and
    /// `inspect --archive` read (`docs/operating/retention.md`, "The archive"). Needs
    /// `retention`. Unset: what retention removes is kept nowhere (the ledger keeps only the
    /// checkpoints that vouch for it).
    pub archive: Option<PathBuf>,
}

/// Where the record of what was done lives (see [`StorageConfig::mode`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StorageMode {
    #[default]
    Local,
    Kafka,
}

impl Default for StorageConfig {
    fn default() -> Self {
        StorageConfig {
            data: PathBuf::from("sendledger-data"),
            durability: Durability::Sync,
            memory_bytes: Memory::default().bytes,
            mode: StorageMode::Local,
            allow_finite_log_retention: false,
            retention: None,
            identity_retention: None,
            archive: None,
        }
    }
}

/// The task engine.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EngineSection {
    /// Threads running task actors and their HTTP attempts (default: half the cores, at
    /// least 1).
    pub workers: usize,
    /// Most task actors alive at once; further messages wait (and the consumer pauses).
    pub max_live_tasks: usize,
    /// Most lookups in flight at once.
    pub lookup_concurrency: usize,
    /// How often due retries and checks are looked for.
    #[serde(with = "humantime_serde")]
    pub timer_tick: Duration,
    /// Largest request payload (canonical JSON bytes); larger requests are rejected.
    pub max_payload_bytes: usize,
    /// Largest request metadata (JSON bytes).
    pub max_metadata_bytes: usize,
    /// How long a stopping service lets tasks finish their current step and the publisher
    /// flush. Whatever is cut off is safe: it is reconciled at the next start.
    #[serde(with = "humantime_serde")]
    pub shutdown_grace: Duration,
}

impl Default for EngineSection {
    fn default() -> Self {
        let engine = EngineConfig::new("");
        EngineSection {
            workers: engine.workers,
            max_live_tasks: engine.max_live_tasks,
            lookup_concurrency: engine.lookup_concurrency,
            timer_tick: engine.timer_tick,
            max_payload_bytes: engine.limits.max_payload_bytes,
            max_metadata_bytes: engine.limits.max_metadata_bytes,
            shutdown_grace: Duration::from_secs(10),
        }
    }
}

/// Traces (`sendledger run` only): each step of a task is a span, exported over OTLP/HTTP
/// (protobuf) with `service.name = sendledger`, joined to the trace of the request message's
/// `traceparent` header. Off unless an endpoint is set here or by the standard variables.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TelemetryConfig {
    /// The collector's OTLP/HTTP base URL (e.g. `http://otel-collector:4318`; `/v1/traces` is
    /// appended). Unset: `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` (the traces URL itself) or
    /// `OTEL_EXPORTER_OTLP_ENDPOINT` (a base URL) when set, else no export.
    pub otlp_endpoint: Option<String>,
}

impl TelemetryConfig {
    /// The traces URL to export to, if any (this setting, else the standard variables).
    pub fn traces_url(&self) -> Option<String> {
        crate::telemetry::traces_url(self.otlp_endpoint.as_deref(), |name| {
            std::env::var(name).ok()
        })
    }
}

/// The admin HTTP endpoint: metrics, health, task timelines, manual review.
#[derive(Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AdminConfig {
    /// Listen address; loopback by default. `enabled = false` turns the endpoint off.
    pub listen: SocketAddr,
    pub enabled: bool,
    /// Bearer token required by mutating calls (review resolutions). Unset: they are refused.
    /// Prefer `SENDLEDGER__ADMIN__TOKEN` to writing it in the file.
    #[serde(serialize_with = "redact_option")]
    pub token: Option<String>,
    /// How long a connection may wait before sending a request: a new one, or one kept alive
    /// after an answer. Then it is closed.
    #[serde(with = "humantime_serde")]
    pub idle_timeout: Duration,
    /// How long the rest of a request head (and a request body) may take once its first byte
    /// arrived. Then the connection is closed.
    #[serde(with = "humantime_serde")]
    pub header_read_timeout: Duration,
    /// Connections open at once; further ones are closed as soon as they are accepted.
    pub max_connections: usize,
    /// Whether the GET routes that show tasks (`/tasks`, `/reviews`, `/metrics`) need a
    /// credential. Unset: they do when `listen` is not loopback.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reads_need_credential: Option<bool>,
    /// `[admin.operators.NAME]`: named operators, their roles, tenants and tokens
    /// (`docs/access.md`). Replaces `token`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub operators: BTreeMap<String, crate::operators::OperatorConfig>,
    /// TLS on the listener (and mutual TLS with `client_ca_file`); unset: plain HTTP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<crate::tls::ListenerTlsConfig>,
}

impl AdminConfig {
    /// Whether reads need a credential: as configured, or when `listen` is not loopback.
    pub fn reads_need_credential(&self) -> bool {
        (self.reads_need_credential).unwrap_or(!self.listen.ip().to_canonical().is_loopback())
    }

    /// The named operators, their tokens read from the environment.
    pub fn load_operators(&self) -> Result<crate::operators::Operators, ConfigError> {
        crate::operators::load(&self.operators, |name| std::env::var(name).ok())
    }

    /// The operators of the configuration file at `path` (its `[admin.operators]` alone,
    /// without environment overrides), tokens read from the environment: what `sendledger
    /// audit --operators` checks decisions against.
    pub fn operators_of_file(path: &Path) -> Result<crate::operators::Operators, ConfigError> {
        let within = |source| ConfigError::File {
            path: path.to_path_buf(),
            source: Box::new(source),
        };
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let doc: toml::Table =
            toml::from_str(&text).map_err(|e| within(syntax_error(&text, &e)))?;
        let operators = match doc.get("admin").and_then(|a| a.get("operators")) {
            None => BTreeMap::new(),
            Some(table) => (table.clone().try_into()).map_err(|e: toml::de::Error| {
                within(ConfigError::field(
                    "admin.operators",
                    e.message().trim_end(),
                ))
            })?,
        };
        crate::operators::load(&operators, |name| std::env::var(name).ok()).map_err(within)
    }
}

impl fmt::Debug for AdminConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdminConfig")
            .field("listen", &self.listen)
            .field("enabled", &self.enabled)
            .field("token", &self.token.as_ref().map(|_| REDACTED))
            .field("reads_need_credential", &self.reads_need_credential)
            .field("operators", &self.operators)
            .finish()
    }
}

impl Default for AdminConfig {
    fn default() -> Self {
        AdminConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 9464)),
            enabled: true,
            token: None,
            idle_timeout: Duration::from_secs(30),
            header_read_timeout: Duration::from_secs(5),
            max_connections: 64,
            reads_need_credential: None,
            operators: BTreeMap::new(),
            tls: None,
        }
    }
}

impl Config {
    /// Reads the file, applies the environment overrides, and validates everything.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Config::parse(&text, &std::env::vars().collect()).map_err(|e| ConfigError::File {
            path: path.to_path_buf(),
            source: Box::new(e),
        })
    }

    /// Parses `text` with the overrides found in `env` (the process environment, or a
    /// stand-in for it), and validates.
    pub fn parse(text: &str, env: &BTreeMap<String, String>) -> Result<Config, ConfigError> {
        let doc: toml::Table = toml::from_str(text).map_err(|e| syntax_error(text, &e))?;
        let config = env::deserialize_with_overrides(doc, env)?;
        config.validate(env)?;
        Ok(config)
    }

    /// Checks what serde cannot: ranges, and the targets (which also reads header values
    /// from the environment).
    pub fn validate(&self, env: &BTreeMap<String, String>) -> Result<(), ConfigError> {
        let e = &self.engine;
        for (field, value) in [
            ("engine.workers", e.workers),
            ("engine.max_live_tasks", e.max_live_tasks),
            ("engine.lookup_concurrency", e.lookup_concurrency),
            ("engine.max_payload_bytes", e.max_payload_bytes),
            ("engine.max_metadata_bytes", e.max_metadata_bytes),
            ("admin.max_connections", self.admin.max_connections),
        ] {
            if value == 0 {
                return Err(ConfigError::field(field, "must be at least 1"));
            }
        }
        if e.workers > 256 {
            return Err(ConfigError::field(
                "engine.workers",
                format!("is {}; use 1 to 256", e.workers),
            ));
        }
        if e.timer_tick.is_zero() || e.timer_tick > Duration::from_secs(10) {
            return Err(ConfigError::field(
                "engine.timer_tick",
                "use a duration between 1ms and 10s",
            ));
        }
        for (field, value) in [
            ("admin.idle_timeout", self.admin.idle_timeout),
            ("admin.header_read_timeout", self.admin.header_read_timeout),
        ] {
            if value.is_zero() {
                return Err(ConfigError::field(field, "must be longer than 0s"));
            }
        }
        if self.storage.memory_bytes < Memory::MIN_BYTES {
            return Err(ConfigError::field(
                "storage.memory_bytes",
                format!(
                    "is {}; use at least {} (4 MiB)",
                    self.storage.memory_bytes,
                    Memory::MIN_BYTES
                ),
            ));
        }
        if self.storage.data.as_os_str().is_empty() {
            return Err(ConfigError::field(
                "storage.data",
                "is empty; name the ledger directory",
            ));
        }
        if let Err(e) = self.kafka.validate() {
            match e {
                sendledger_kafka::Error::Config { field, problem } => {
                    return Err(ConfigError::field(format!("kafka.{field}"), problem))
                }
                e => return Err(e.into()),
            }
        }
        if let Some(retention) = self.storage.retention {
            if retention < Duration::from_secs(1) {
                return Err(ConfigError::field(
                    "storage.retention",
                    "use at least 1s (a settled task's history is kept at least this long)",
                ));
            }
            // A failed task the breaker would retry must still have its payload.
            for (name, target) in &self.targets {
                if let Some(within) = target
                    .breaker
                    .retry_failed_within
                    .filter(|w| *w > retention)
                {
                    return Err(ConfigError::field("storage.retention", format!("is {}, shorter than targets.{name}.breaker.retry_failed_within ({}): a failed task is retried when the breaker closes, and a removed one cannot be (its payload is not kept); keep histories at least as long", humantime::format_duration(retention), humantime::format_duration(within))));
                }
            }
        }
        let snapshots =
            self.storage.mode == StorageMode::Kafka && self.kafka.snapshot_interval.is_some();
        match (self.storage.retention, self.storage.identity_retention) {
            // Kafka mode: the snapshots forget what they kept of a task settled that long ago.
            (None, Some(_)) if snapshots => {}
            (None, Some(_)) => return Err(ConfigError::field("storage.identity_retention", "forgets what storage.retention keeps of a removed task, and storage.retention is unset: set it too, or remove this")),
            (Some(retention), Some(identities)) if identities < retention => return Err(ConfigError::field("storage.identity_retention", format!("is {}, shorter than storage.retention ({}): an identity is kept at least as long as the history it stands for", humantime::format_duration(identities), humantime::format_duration(retention)))),
            _ => {}
        }
        if self.storage.archive.is_some() && self.storage.retention.is_none() {
            return Err(ConfigError::field("storage.archive", "keeps what storage.retention removes, and storage.retention is unset: set it too, or remove this"));
        }
        if self.storage.mode == StorageMode::Kafka && self.kafka.is_embedded() {
            return Err(ConfigError::field("storage.mode", "\"kafka\" needs brokers that fence transactional ids and keep transactional offsets; the embedded cluster does neither: set kafka.brokers, or use mode \"local\""));
        }
        if self.storage.mode == StorageMode::Kafka {
            self.check_send_lease()?;
        } else if self.kafka.standby {
            return Err(ConfigError::field(
                "kafka.standby",
                "keeps copies of partitions owned by other instances, which only kafka mode has: set storage.mode = \"kafka\", or remove it",
            ));
        } else if self.kafka.snapshot_interval.is_some() {
            return Err(ConfigError::field(
                "kafka.snapshot_interval",
                "writes snapshots of the partitions' logs of record, which only kafka mode has: set storage.mode = \"kafka\", or remove it",
            ));
        }
        if self.targets.is_empty() {
            return Err(ConfigError::field(
                "targets",
                "none configured; add a [targets.NAME] section (see schemas/sendledger.example.toml)",
            ));
        }
        Targets::from_config_with_env(&self.targets, |name| env.get(name).cloned())?
            .with_sagas(&self.sagas)?;
        let topic = &self.kafka.requests_topic;
        (self.access).load(&self.targets, &self.sagas, topic, |name| {
            env.get(name).cloned()
        })?;
        let own_topics = self.access.own_topics(topic);
        if let Some(clash) = (own_topics.iter()).find(|t| self.kafka.topics().contains(&t.as_str()))
        {
            return Err(ConfigError::field(
                "access.tenants",
                format!("name {clash:?} as a tenant's requests topic, which is also the results, events or dead-letter topic: give the tenant a topic of its own"),
            ));
        }
        if self.storage.mode == StorageMode::Kafka && !own_topics.is_empty() {
            return Err(ConfigError::field(
                "access.tenants",
                format!("name requests topics of their own ({}), which kafka mode cannot read: its partitions follow the one requests topic's; bind tenants with signing keys instead, or use mode \"local\"", own_topics.into_iter().collect::<Vec<_>>().join(", ")),
            ));
        }
        let tenants: Option<std::collections::BTreeSet<String>> = (!self.access.tenants.is_empty())
            .then(|| self.access.tenants.keys().cloned().collect());
        let kafka_mode = self.storage.mode == StorageMode::Kafka;
        let standby = self.kafka.standby;
        (self.front).validate(kafka_mode, standby, tenants.as_ref(), |name| {
            env.get(name).cloned()
        })?;
        if let Some(tls) = &self.admin.tls {
            tls.acceptor("admin.tls")?;
        }
        let reads = crate::operators::Reads {
            need_credential: self.admin.reads_need_credential(),
            configured: self.admin.reads_need_credential.is_some(),
        };
        let (operators, token) = (&self.admin.operators, self.admin.token.as_deref());
        crate::operators::check(operators, token, reads, |name| env.get(name).cloned())?;
        Ok(())
    }

    /// Kafka mode: a request sent as late as the send lease allows must still be looked for.
    /// A stalled instance can write an attempt's first byte up to `kafka.send_lease` after its
    /// intent, and the remote may take `request_timeout` more to act on it; the instance that
    /// took the task over must not give up on finding that record before then.
    fn check_send_lease(&self) -> Result<(), ConfigError> {
        let lease = self.kafka.send_lease;
        for (name, target) in &self.targets {
            let Some(lookup) = &target.lookup else {
                continue;
            };
            let late = lease + target.request_timeout;
            if lookup.deadline <= late {
                return Err(ConfigError::field(
                    format!("targets.{name}.lookup.deadline"),
                    format!(
                        "is {}, not longer than kafka.send_lease ({}) + targets.{name}.request_timeout ({}); in kafka mode a request may reach the remote that late after its intent, so raise the deadline above {} or shorten the lease or the timeout",
                        humantime::format_duration(lookup.deadline),
                        humantime::format_duration(lease),
                        humantime::format_duration(target.request_timeout),
                        humantime::format_duration(late),
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The targets, loaded and validated (header values read from the environment).
    pub fn load_targets(&self) -> Result<Targets, ConfigError> {
        Ok(Targets::from_config(&self.targets)?.with_sagas(&self.sagas)?)
    }

    /// The access rules (signing keys read from the environment); `None` when `[access]`
    /// lists no tenant.
    pub fn load_access(&self) -> Result<Option<sendledger_core::access::Access>, ConfigError> {
        let topic = &self.kafka.requests_topic;
        (self.access).load(&self.targets, &self.sagas, topic, |name| {
            std::env::var(name).ok()
        })
    }

    /// The Kafka configuration `run` uses: `kafka.instance_id`, when unset, derived from the
    /// host name and the ledger directory, so one instance keeps its static group membership
    /// across restarts and two instances never share one. The embedded cluster has one member.
    pub fn kafka_config(&self) -> KafkaConfig {
        let mut kafka = self.kafka.clone();
        if kafka.instance_id.is_none() && !kafka.is_embedded() {
            kafka.instance_id = Some(derived_instance_id(&host_name(), &self.storage.data));
        }
        kafka
    }

    /// The engine's configuration.
    pub fn engine_config(&self) -> EngineConfig {
        let mut c = EngineConfig::new(&self.storage.data);
        c.durability = self.storage.durability;
        c.archive = self.storage.archive.clone();
        c.memory = Memory {
            bytes: self.storage.memory_bytes,
        };
        c.workers = self.engine.workers;
        c.max_live_tasks = self.engine.max_live_tasks;
        c.lookup_concurrency = self.engine.lookup_concurrency;
        c.timer_tick = self.engine.timer_tick;
        c.replicated = self.storage.mode == StorageMode::Kafka;
        c.send_lease = c.replicated.then_some(self.kafka.send_lease);
        c.limits = Limits {
            max_payload_bytes: self.engine.max_payload_bytes,
            max_metadata_bytes: self.engine.max_metadata_bytes,
            ..Limits::default()
        };
        c
    }
}

/// A TOML syntax error as its position and message only: toml's own text quotes the source
/// line, which may hold a secret (`token = "…`).
fn syntax_error(text: &str, e: &toml::de::Error) -> ConfigError {
    let message = e.message().trim_end().replace('\n', "; ");
    match e.span().and_then(|span| text.get(..span.start)) {
        Some(before) => {
            let line = before.matches('\n').count() + 1;
            let column = before.chars().rev().take_while(|&c| c != '\n').count() + 1;
            ConfigError::Syntax {
                line,
                column,
                message,
            }
        }
        None => ConfigError::SyntaxUnplaced { message },
    }
}

/// `sendledger-` and 16 hex digits of a hash of the host and the ledger directory.
fn derived_instance_id(host: &str, data: &Path) -> String {
    use sha2::{Digest, Sha256};
    let data = std::fs::canonicalize(data).unwrap_or_else(|_| data.to_path_buf());
    let mut h = Sha256::new();
    h.update(host.as_bytes());
    h.update([0]);
    h.update(data.as_os_str().as_encoded_bytes());
    let digest = h.finalize();
    let hex: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
    format!("sendledger-{hex}")
}

fn host_name() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length; gethostname writes at most that many bytes.
    #[allow(unsafe_code)]
    let ok = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) } == 0;
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    if ok {
        String::from_utf8_lossy(&buf[..end]).into_owned()
    } else {
        String::new()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_derived_instance_id_is_stable_per_host_and_ledger() {
        use super::derived_instance_id;
        let dir = tempfile::tempdir().unwrap();
        let a = derived_instance_id("node-a", dir.path());
        assert_eq!(
            a,
            derived_instance_id("node-a", dir.path()),
            "stable across restarts"
        );
        assert!(a.starts_with("sendledger-") && a.len() == 27, "{a}");
        assert_ne!(a, derived_instance_id("node-b", dir.path()), "another host");
        assert_ne!(
            a,
            derived_instance_id("node-a", &dir.path().join("x")),
            "another ledger"
        );
        let mut config = super::Config::default();
        assert_eq!(
            config.kafka_config().instance_id,
            None,
            "embedded: one member"
        );
        config.kafka.brokers = "k:9092".into();
        config.storage.data = dir.path().to_path_buf();
        assert!(config
            .kafka_config()
            .instance_id
            .unwrap()
            .starts_with("sendledger-"));
        config.kafka.instance_id = Some(String::new());
        assert_eq!(
            config.kafka_config().instance_id.as_deref(),
            Some(""),
            "off"
        );
    }

    use super::*;

    const MINIMAL: &str = r#"
        [targets.payments]
        url = "http://127.0.0.1:8600/records"
    "#;

    fn parse(text: &str, env: &[(&str, &str)]) -> Result<Config, ConfigError> {
        Config::parse(
            text,
            &env.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        )
    }

    #[test]
    fn the_example_in_schemas_is_valid() {
        let text = include_str!("../../../../schemas/sendledger.example.toml");
        let config = parse(text, &[("PAYMENTS_TOKEN", "x")]).unwrap();
        assert!(config.targets.contains_key("payments"));
    }

    #[test]
    fn defaults_fill_everything_but_the_targets() {
        let c = parse(MINIMAL, &[]).unwrap();
        assert_eq!(c.kafka.brokers, "embedded");
        assert_eq!(c.admin.listen.to_string(), "127.0.0.1:9464");
        assert_eq!(c.admin.max_connections, 64);
        assert_eq!(c.admin.idle_timeout, Duration::from_secs(30));
        assert_eq!(c.admin.header_read_timeout, Duration::from_secs(5));
        assert_eq!(c.storage.durability, Durability::Sync);
        let err = parse("", &[]).unwrap_err().to_string();
        assert!(err.starts_with("targets: none configured"), "{err}");
    }

    #[test]
    fn the_events_encoding_is_json_unless_set_to_binary() {
        use sendledger_kafka::EventEncoding;
        assert_eq!(
            parse(MINIMAL, &[]).unwrap().kafka.events_encoding,
            EventEncoding::Json
        );
        let binary = format!("{MINIMAL}\n[kafka]\nevents_encoding = \"binary\"\n");
        let c = parse(&binary, &[]).unwrap();
        assert_eq!(c.kafka.events_encoding, EventEncoding::Binary);
        let bad = format!("{MINIMAL}\n[kafka]\nevents_encoding = \"avro\"\n");
        let err = parse(&bad, &[]).unwrap_err().to_string();
        assert!(
            err.contains("events_encoding") && err.contains("avro"),
            "{err}"
        );
    }

    #[test]
    fn environment_overrides_the_file() {
        let c = parse(
            MINIMAL,
            &[
                ("SENDLEDGER__KAFKA__BROKERS", "k1:9092,k2:9092"),
                ("SENDLEDGER__KAFKA__PARTITIONS", "12"),
                ("SENDLEDGER__KAFKA__PROPERTIES__SASL_PASSWORD", "s3cret"),
                ("SENDLEDGER__ADMIN__TOKEN", "12345"),
                ("SENDLEDGER__ENGINE__TIMER_TICK", "50ms"),
                ("UNRELATED", "x"),
            ],
        )
        .unwrap();
        assert_eq!(c.kafka.brokers, "k1:9092,k2:9092");
        assert_eq!(c.kafka.partitions, 12);
        assert_eq!(c.kafka.properties["sasl.password"], "s3cret");
        assert_eq!(c.admin.token.as_deref(), Some("12345"));
        // Below kafka.properties, `__` separates the parts of a property name as `_` does.
        let split = parse(
            MINIMAL,
            &[
                ("SENDLEDGER__KAFKA__PROPERTIES__SASL__PASSWORD", "12345"),
                ("SENDLEDGER__KAFKA__PROPERTIES__SSL__KEY_PASSWORD", "k3y"),
                (
                    "SENDLEDGER__KAFKA__PROPERTIES__CONSUMER__SESSION_TIMEOUT_MS",
                    "6000",
                ),
            ],
        )
        .unwrap();
        assert_eq!(split.kafka.properties["sasl.password"], "12345");
        assert_eq!(split.kafka.properties["ssl.key.password"], "k3y");
        assert_eq!(
            split.kafka.properties["consumer.session.timeout.ms"],
            "6000"
        );
        assert_eq!(c.engine.timer_tick, Duration::from_millis(50));
    }

    #[test]
    fn errors_name_the_field_and_the_variable() {
        let err = parse(&format!("{MINIMAL}\n[kafka]\nbroker = \"x\""), &[])
            .unwrap_err()
            .to_string();
        assert!(err.contains("kafka") && err.contains("broker"), "{err}");
        let err = parse(MINIMAL, &[("SENDLEDGER__ENGINE__WORKERS", "many")])
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("engine.workers (set by SENDLEDGER__ENGINE__WORKERS)"),
            "{err}"
        );
        let err = parse(MINIMAL, &[("SENDLEDGER__ENGINE__WORKERS", "0")])
            .unwrap_err()
            .to_string();
        assert_eq!(err, "engine.workers: must be at least 1");
        let err = parse(MINIMAL, &[("SENDLEDGER__ADMIN__MAX_CONNECTIONS", "0")])
            .unwrap_err()
            .to_string();
        assert_eq!(err, "admin.max_connections: must be at least 1");
        let err = parse(MINIMAL, &[("SENDLEDGER__STORAGE__MEMORY_BYTES", "1000")])
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "storage.memory_bytes: is 1000; use at least 4194304 (4 MiB)"
        );
        let err = parse(MINIMAL, &[("SENDLEDGER__ADMIN__IDLE_TIMEOUT", "0s")])
            .unwrap_err()
            .to_string();
        assert_eq!(err, "admin.idle_timeout: must be longer than 0s");
        let err = parse(MINIMAL, &[("SENDLEDGER__KAFKA__PARTITIONS", "0")])
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("kafka.partitions"), "{err}");
        let err = parse(
            r#"[targets.payments]
               url = "ftp://x/records""#,
            &[],
        )
        .unwrap_err()
        .to_string();
        assert!(err.starts_with("targets.payments.url"), "{err}");
    }

    #[test]
    fn retention_is_at_least_a_second_and_identities_outlive_histories() {
        let with = |storage: &str| {
            parse(&format!("[storage]\n{storage}\n{MINIMAL}"), &[]).map_err(|e| e.to_string())
        };
        let ok = with("retention = \"30d\"\nidentity_retention = \"365d\"").unwrap();
        assert_eq!(ok.storage.retention, Some(Duration::from_secs(30 * 86_400)));
        let refused = [
            (
                "retention = \"500ms\"",
                "storage.retention: use at least 1s",
            ),
            (
                "archive = \"archive\"",
                "storage.archive: keeps what storage.retention removes",
            ),
            (
                "identity_retention = \"30d\"",
                "storage.identity_retention: forgets what storage.retention keeps",
            ),
            (
                "retention = \"30d\"\nidentity_retention = \"1d\"",
                "storage.identity_retention: is 1day, shorter than storage.retention (30days)",
            ),
        ];
        let breaker = format!("[storage]\nretention = \"1h\"\n{MINIMAL}[targets.payments.breaker]\nretry_failed_within = \"2h\"\n");
        let err = parse(&breaker, &[]).unwrap_err().to_string();
        assert!(
            err.starts_with("storage.retention: is 1h, shorter than targets.payments.breaker.retry_failed_within (2h)"),
            "{err}"
        );
        for (storage, expected) in refused {
            let err = with(storage).unwrap_err();
            assert!(err.starts_with(expected), "{storage}: {err}");
        }
    }

    #[test]
    fn standby_copies_are_for_kafka_mode_only() {
        let text = r#"
            [storage]
            mode = "kafka"
            [kafka]
            brokers = "k:9092"
            standby = true
            [targets.payments]
            url = "http://127.0.0.1:8600/records"
        "#;
        assert!(parse(text, &[]).unwrap().kafka.standby);
        let err = parse(&text.replace("\"kafka\"", "\"local\""), &[])
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("kafka.standby: "), "{err}");
    }

    #[test]
    fn snapshots_are_for_kafka_mode_only() {
        let text = r#"
            [storage]
            mode = "kafka"
            [kafka]
            brokers = "k:9092"
            snapshot_interval = "10m"
            [targets.payments]
            url = "http://127.0.0.1:8600/records"
        "#;
        let config = parse(text, &[]).unwrap();
        assert_eq!(
            config.kafka.snapshot_interval,
            Some(Duration::from_secs(600))
        );
        assert!(config.kafka.topics().contains(&"sendledger.snapshots"));
        // Their identity retention, with or without the copy's retention.
        let forgetting = text.replace("[kafka]", "identity_retention = \"400d\"\n[kafka]");
        let config = parse(&forgetting, &[]).unwrap();
        let year = Duration::from_secs(400 * 86_400);
        assert_eq!(config.storage.identity_retention, Some(year));
        let pruning = forgetting.replace("[kafka]", "retention = \"30d\"\n[kafka]");
        let config = parse(&pruning, &[]).unwrap();
        let month = Duration::from_secs(30 * 86_400);
        assert_eq!(config.storage.retention, Some(month));
        let err = parse(&forgetting.replace("snapshot_interval = \"10m\"", ""), &[])
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("storage.identity_retention: "), "{err}");
        let err = parse(&text.replace("\"kafka\"", "\"local\""), &[])
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("kafka.snapshot_interval: "), "{err}");
        let err = parse(&text.replace("\"10m\"", "\"10ms\""), &[])
            .unwrap_err()
            .to_string();
        assert!(err.contains("snapshot_interval"), "{err}");
    }

    #[test]
    fn tenants_topics_of_their_own_are_for_local_mode_and_not_the_other_topics() {
        let text = format!(
            "{MINIMAL}\n[access.tenants.acme]\ntargets = [\"payments\"]\ntopic = \"acme.requests\""
        );
        let c = parse(&text, &[]).unwrap();
        let own = c.access.own_topics(&c.kafka.requests_topic);
        assert_eq!(own.into_iter().collect::<Vec<_>>(), ["acme.requests"]);
        let kafka_mode =
            text.clone() + "\n[storage]\nmode = \"kafka\"\n[kafka]\nbrokers = \"k:9092\"";
        let err = parse(&kafka_mode, &[]).unwrap_err().to_string();
        assert!(
            err.starts_with("access.tenants: ") && err.contains("kafka mode"),
            "{err}"
        );
        let clash = text.replace("acme.requests", "sendledger.results");
        let err = parse(&clash, &[]).unwrap_err().to_string();
        assert!(err.contains("also the results"), "{err}");
    }

    #[test]
    fn kafka_mode_refuses_a_lookup_deadline_within_the_send_lease() {
        let text = r#"
            [storage]
            mode = "kafka"
            [kafka]
            brokers = "k:9092"
            send_lease = "10s"
            [targets.payments]
            url = "http://127.0.0.1:8600/records"
            request_timeout = "20s"
            [targets.payments.lookup]
            url = "http://127.0.0.1:8600/records?reference={task_id}"
            deadline = "30s"
        "#;
        let err = parse(text, &[]).unwrap_err().to_string();
        assert!(
            err.starts_with("targets.payments.lookup.deadline: is 30s, not longer than kafka.send_lease (10s) + targets.payments.request_timeout (20s)"),
            "{err}"
        );
        let c = parse(&text.replace("\"30s\"", "\"31s\""), &[]).unwrap();
        assert_eq!(c.engine_config().send_lease, Some(Duration::from_secs(10)));
        // Local mode has one writer and no lease to allow for.
        let local = parse(&text.replace("\"kafka\"", "\"local\""), &[]).unwrap();
        assert_eq!(local.engine_config().send_lease, None);
        let err = parse(&text.replace("\"10s\"", "\"0s\""), &[])
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("kafka.send_lease"), "{err}");
    }

    #[test]
    fn syntax_errors_give_the_position_not_the_line() {
        for text in [
            "[admin]\ntoken = \"s3cret-value\n",
            "[admin]\ntoken = s3cret-value\n",
            "[kafka.properties]\n\"sasl.password\" = \"s3cret-value\" x\n",
        ] {
            let err = parse(text, &[]).unwrap_err().to_string();
            assert!(!err.contains("s3cret"), "{err}");
            assert!(err.starts_with("line 2, column "), "{err}");
        }
        let err = parse(&format!("{MINIMAL}\n[admin]\ntoken = 12345"), &[])
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("admin.token: ") && !err.contains("12345"),
            "{err}"
        );
    }

    #[test]
    fn debug_hides_secrets() {
        let c = parse(
            &format!(
                r#"{MINIMAL}
                [admin]
                token = "admin-s3cret"
                [kafka.properties]
                "sasl.password" = "sasl-s3cret"
                "ssl.key.pem" = "key-s3cret"
                "sasl.oauthbearer.client.secret" = "oauth-s3cret"
                "client.id" = "visible-id"
                [targets.payments.headers]
                authorization = "Bearer header-s3cret"
                "#
            ),
            &[],
        )
        .unwrap();
        let debug = format!("{c:?}");
        assert!(!debug.contains("s3cret"), "{debug}");
        assert!(debug.contains(r#"token: Some("***")"#), "{debug}");
        assert!(debug.contains(r#""sasl.password": "***""#), "{debug}");
        assert!(debug.contains("visible-id"), "{debug}");
        assert_eq!(c.admin.token.as_deref(), Some("admin-s3cret"));
        for shown in [
            toml::to_string(&c).unwrap(),
            serde_json::to_string(&c).unwrap(),
        ] {
            assert!(!shown.contains("s3cret"), "{shown}");
            assert!(shown.contains("visible-id"), "{shown}");
            assert_eq!(shown.matches("***").count(), 5, "{shown}");
        }
    }
}
