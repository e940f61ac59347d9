//! The Kafka section of the configuration, and the one function that builds every librdkafka
//! `ClientConfig`.

use std::collections::BTreeMap;
use std::time::Duration;

use rdkafka::ClientConfig;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::partitioner::Partitioner;
use crate::records::EventEncoding;

/// `brokers` value that starts the in-process mock cluster.
pub const EMBEDDED: &str = "embedded";

/// Whether a configuration key or librdkafka property holds a secret: its name mentions a
/// token, password, secret, authorization, an OAuth bearer setting or an SSL key
/// (`sasl.password`, `ssl.key.password`, `ssl.key.pem`, `ssl.keystore.password`...).
pub fn is_secret(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    [
        "token",
        "password",
        "secret",
        "authorization",
        "sasl.oauthbearer",
        "ssl.key",
    ]
    .iter()
    .any(|s| name.contains(s))
}

/// Where sendledger reads requests and writes results and events. `Debug` shows the values of
/// secret properties ([`is_secret`]) as `***`.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KafkaConfig {
    /// `"embedded"` for librdkafka's in-process mock cluster, or a bootstrap list
    /// (`host:port,host:port`).
    pub brokers: String,
    /// Consumer group of the requests topic.
    pub group_id: String,
    pub requests_topic: String,
    pub results_topic: String,
    pub events_topic: String,
    /// How events are written on the events topic: `"json"` (an event record anyone can
    /// read, `schemas/event.schema.json`) or `"binary"` (the ledger's own encoding: about a
    /// third of the size, and a take-over that reads a partition's log whole reads it faster;
    /// read by sendledger only). Readers take both, so it can be changed on a running topic.
    pub events_encoding: EventEncoding,
    /// Where invalid request messages are copied (raw, with the reason in a header). None: they
    /// are only recorded in the ledger and announced as rejected results.
    pub dead_letter_topic: Option<String>,
    /// Partitions of each topic sendledger creates (in the embedded cluster, or on external
    /// brokers when a topic is missing).
    pub partitions: i32,
    /// Replication factor of topics created on external brokers; -1 uses the brokers' default.
    pub replication_factor: i32,
    /// Most request messages received and not yet durable; beyond it the consumer pauses its
    /// partitions. Kafka mode: a partition whose log stalled (its commits hang) also pauses
    /// alone at its share (this divided by the partitions assigned).
    pub max_unfinished: usize,
    /// Most bytes (key and value) of request messages received and not yet durable; beyond it
    /// the consumer pauses its partitions (a stalled one alone at its share, as
    /// `max_unfinished`). A larger message is still processed, alone.
    pub max_unfinished_bytes: usize,
    /// Largest request message accepted; larger ones are rejected before they are parsed.
    pub max_message_bytes: usize,
    /// How often stored offsets are committed and processed markers folded into watermarks.
    #[serde(with = "humantime_serde")]
    pub commit_interval: Duration,
    /// Kafka mode: an attempt's first byte is written within this time of its intent being
    /// recorded, or never (the attempt ends not sent and is tried again). It bounds how late an
    /// instance that stalled (a pause, a frozen VM) after recording an intent can still send
    /// once its partition has moved; every lookup `deadline` must exceed it plus the target's
    /// `request_timeout`, so a late request is looked for long enough to be found.
    #[serde(with = "humantime_serde")]
    pub send_lease: Duration,
    /// Kafka mode: keep this instance's copy of every partition it does not own current,
    /// applying each partition's events as its owner commits them (a standby copy), so that a
    /// take-over reads only the log's last moments whatever its history. Costs each instance
    /// the work of applying every partition's events.
    pub standby: bool,
    /// Kafka mode: where each partition's snapshots go (a topic with the requests topic's
    /// partition count), when `snapshot_interval` is set.
    pub snapshots_topic: String,
    /// Kafka mode: how often the owner of a partition writes a snapshot of it (the tasks its
    /// log records, settled ones by what retention keeps of them), so that a take-over on an
    /// empty disk reads the latest snapshot and the log after it, not the whole log, and the
    /// events topic may keep a finite retention (at least four times this). None: no
    /// snapshots.
    #[serde(with = "humantime_serde")]
    pub snapshot_interval: Option<Duration>,
    /// The partitioner of every producer of the requests topic: `"murmur2"` (Kafka's Java
    /// client's default; librdkafka's `murmur2_random`), `"consistent"` (librdkafka's default,
    /// `consistent_random`) or `"fnv1a"` (librdkafka's `fnv1a_random`). The producers
    /// sendledger creates use it. Kafka mode refuses a request whose key does not belong to the
    /// partition it arrived on under this partitioner (its task would have a second owner).
    pub partitioner: Partitioner,
    /// The consumer's static group membership (`group.instance.id`): an instance restarted
    /// with the same id gets its partitions back without waiting for its old session to
    /// expire. `sendledger run` derives one from the host name and the ledger directory when
    /// unset (stable across restarts of one instance, distinct between instances); `""` turns
    /// static membership off. The brokers fence the older of two live members with one id.
    pub instance_id: Option<String>,
    /// Passed to librdkafka as they are (security, SASL, timeouts, ...): to every client, or,
    /// under a `consumer.` or `producer.` prefix (which is removed), to the consumers or the
    /// producers only, so a consumer's `session.timeout.ms` is not handed to the producers
    /// (librdkafka warns about each property a client ignores). The properties that
    /// sendledger's guarantees rest on cannot be set here.
    pub properties: BTreeMap<String, String>,
}

impl std::fmt::Debug for KafkaConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let properties: BTreeMap<&str, &str> = self
            .properties
            .iter()
            .map(|(k, v)| (k.as_str(), if is_secret(k) { "***" } else { v.as_str() }))
            .collect();
        f.debug_struct("KafkaConfig")
            .field("brokers", &self.brokers)
            .field("group_id", &self.group_id)
            .field("requests_topic", &self.requests_topic)
            .field("results_topic", &self.results_topic)
            .field("events_topic", &self.events_topic)
            .field("events_encoding", &self.events_encoding)
            .field("dead_letter_topic", &self.dead_letter_topic)
            .field("partitions", &self.partitions)
            .field("replication_factor", &self.replication_factor)
            .field("max_unfinished", &self.max_unfinished)
            .field("max_unfinished_bytes", &self.max_unfinished_bytes)
            .field("max_message_bytes", &self.max_message_bytes)
            .field("commit_interval", &self.commit_interval)
            .field("send_lease", &self.send_lease)
            .field("standby", &self.standby)
            .field("snapshots_topic", &self.snapshots_topic)
            .field("snapshot_interval", &self.snapshot_interval)
            .field("partitioner", &self.partitioner)
            .field("instance_id", &self.instance_id)
            .field("properties", &properties)
            .finish()
    }
}

impl Default for KafkaConfig {
    fn default() -> Self {
        KafkaConfig {
            brokers: EMBEDDED.into(),
            group_id: "sendledger".into(),
            requests_topic: "sendledger.requests".into(),
            results_topic: "sendledger.results".into(),
            events_topic: "sendledger.events".into(),
            events_encoding: EventEncoding::Json,
            dead_letter_topic: None,
            partitions: 4,
            replication_factor: -1,
            max_unfinished: 10_000,
            max_unfinished_bytes: 64 * 1024 * 1024,
            max_message_bytes: 256 * 1024,
            commit_interval: Duration::from_secs(1),
            send_lease: Duration::from_secs(10),
            standby: false,
            snapshots_topic: "sendledger.snapshots".into(),
            snapshot_interval: None,
            partitioner: Partitioner::default(),
            instance_id: None,
            properties: BTreeMap::new(),
        }
    }
}

/// Which client a `ClientConfig` is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The requests-topic consumer: manual offset store and commit.
    Ingest,
    /// The idempotent producer of results, events and dead letters.
    Producer,
    /// The transactional producer of one events partition in kafka mode (the caller sets its
    /// `transactional.id`): idempotent, every record acknowledged by all in-sync replicas.
    Log,
    /// Metadata and topic administration.
    Admin,
    /// A reader of whole topics (the audit, the readers of published records): assigned
    /// partitions, nothing committed.
    Replay,
}

/// A kind of client: the consumers (of requests and of whole topics) or the producers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ClientKind {
    Consumer,
    Producer,
}

impl Role {
    fn is(self, kind: ClientKind) -> bool {
        match kind {
            ClientKind::Consumer => matches!(self, Role::Ingest | Role::Replay),
            ClientKind::Producer => matches!(self, Role::Producer | Role::Log),
        }
    }
}

/// A pass-through property's key as configured: the clients it is for when it has a
/// `consumer.` or `producer.` prefix (none of librdkafka's own names starts with either),
/// and the librdkafka name.
fn property_name(key: &str) -> (Option<ClientKind>, &str) {
    if let Some(name) = key.strip_prefix("consumer.") {
        (Some(ClientKind::Consumer), name)
    } else if let Some(name) = key.strip_prefix("producer.") {
        (Some(ClientKind::Producer), name)
    } else {
        (None, key)
    }
}

/// Properties sendledger sets itself; the configuration may not override them.
const RESERVED: &[&str] = &[
    "bootstrap.servers",
    "metadata.broker.list",
    "group.id",
    "enable.auto.commit",
    "enable.auto.offset.store",
    "enable.idempotence",
    "acks",
    "request.required.acks",
    "enable.partition.eof",
    // `latest` would skip requests that were never processed.
    "auto.offset.reset",
    // Set through `instance_id`.
    "group.instance.id",
    // Derived from the group and the partition in kafka mode (the fencing rests on it).
    "transactional.id",
    // `read_uncommitted` would apply events of aborted transactions.
    "isolation.level",
    // Set through `partitioner`: kafka mode checks each request's partition against it.
    "partitioner",
];

impl KafkaConfig {
    /// Checks every field; the error names the field and what to change.
    pub fn validate(&self) -> Result<()> {
        let bad = |field: &str, problem: String| Error::Config {
            field: field.into(),
            problem,
        };
        if self.brokers.trim().is_empty() {
            return Err(bad(
                "brokers",
                "is empty; set \"embedded\" or a bootstrap list like \"localhost:9092\"".into(),
            ));
        }
        if self.group_id.trim().is_empty() {
            return Err(bad("group_id", "is empty".into()));
        }
        let mut topics = vec![
            ("requests_topic", &self.requests_topic),
            ("results_topic", &self.results_topic),
            ("events_topic", &self.events_topic),
        ];
        if let Some(dlq) = &self.dead_letter_topic {
            topics.push(("dead_letter_topic", dlq));
        }
        if self.snapshot_interval.is_some() {
            topics.push(("snapshots_topic", &self.snapshots_topic));
        }
        if self
            .snapshot_interval
            .is_some_and(|i| i < Duration::from_secs(1))
        {
            return Err(bad(
                "snapshot_interval",
                "is under 1s; a snapshot reads the previous one and the log after it: use minutes"
                    .into(),
            ));
        }
        for (field, topic) in &topics {
            check_topic(topic).map_err(|p| bad(field, p))?;
        }
        for (i, (a, ta)) in topics.iter().enumerate() {
            if let Some((b, _)) = topics[i + 1..].iter().find(|(_, tb)| tb == ta) {
                return Err(bad(b, format!("names the same topic as `{a}` ({ta:?})")));
            }
        }
        if !(1..=10_000).contains(&self.partitions) {
            return Err(bad(
                "partitions",
                format!("is {}; use 1 to 10000", self.partitions),
            ));
        }
        if !(self.replication_factor == -1 || (1..=32).contains(&self.replication_factor)) {
            return Err(bad(
                "replication_factor",
                format!(
                    "is {}; use -1 (the brokers' default) or 1 to 32",
                    self.replication_factor
                ),
            ));
        }
        if self.max_unfinished == 0 {
            return Err(bad("max_unfinished", "must be at least 1".into()));
        }
        if self.max_unfinished_bytes < 1024 {
            return Err(bad(
                "max_unfinished_bytes",
                format!("is {}; use at least 1024", self.max_unfinished_bytes),
            ));
        }
        if self.max_message_bytes < 1024 {
            return Err(bad(
                "max_message_bytes",
                format!("is {}; use at least 1024", self.max_message_bytes),
            ));
        }
        if self.commit_interval.is_zero() {
            return Err(bad("commit_interval", "must be longer than zero".into()));
        }
        if self.send_lease.is_zero() {
            return Err(bad("send_lease", "must be longer than zero".into()));
        }
        if let Some(id) = &self.instance_id {
            if id.len() > 249
                || !id
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
            {
                return Err(bad(
                    "instance_id",
                    "must be at most 249 ASCII letters, digits, `.`, `_` or `-`".into(),
                ));
            }
        }
        for key in self.properties.keys() {
            if RESERVED.contains(&property_name(key).1) {
                return Err(bad(
                    &format!("properties.{key}"),
                    "is set by sendledger (its delivery guarantees rest on it); remove it".into(),
                ));
            }
        }
        Ok(())
    }

    pub fn is_embedded(&self) -> bool {
        self.brokers == EMBEDDED
    }

    /// The one place a librdkafka configuration is built: the pass-through properties first,
    /// then what sendledger's guarantees need, which nothing overrides.
    pub fn client_config(&self, role: Role, bootstrap_servers: &str) -> ClientConfig {
        let mut c = ClientConfig::new();
        // Defaults the properties may change.
        c.set("client.id", "sendledger");
        match role {
            Role::Ingest => {
                // Without a committed offset, start from the oldest message: one skipped
                // request would be a lost task.
                c.set("auto.offset.reset", "earliest");
                // Statistics carry the consumer lag exported as a metric.
                c.set("statistics.interval.ms", "5000");
                // Cooperative incremental rebalancing: a member joining or leaving moves only
                // the partitions that change owner; the others are never revoked, so they
                // never pause and are never taken over again (eager assignment revoked every
                // partition of every member at each change).
                c.set("partition.assignment.strategy", "cooperative-sticky");
                if self.is_embedded() {
                    // The cluster lives in this process: no network to be lenient about, and a
                    // restarted consumer should not wait out the default 45 s session of the
                    // member it replaces.
                    c.set("session.timeout.ms", "6000");
                    c.set("heartbeat.interval.ms", "500");
                } else {
                    // A member that died holds its partitions until its session expires (a
                    // static member only when it does not come back). librdkafka's 45 s makes
                    // every crash a minute without consumption; 10 s still rides out a short
                    // network hiccup (heartbeats have their own thread).
                    c.set("session.timeout.ms", "10000");
                    c.set("heartbeat.interval.ms", "1000");
                }
            }
            Role::Producer => {
                // A broker outage delays delivery; it never fails a message (which would
                // leave a gap in a partition and let later results overtake it).
                c.set("message.timeout.ms", "0");
                c.set("linger.ms", "5");
            }
            Role::Log | Role::Admin | Role::Replay => {}
        }
        if role.is(ClientKind::Consumer) {
            // How much librdkafka fetches ahead of the application, per consumer. Its 64 MiB
            // came on top of the requests in flight (`max_unfinished`, `max_unfinished_bytes`)
            // in a service behind its input, and per partition in a take-over (each restored
            // partition has a consumer of its own). 16 MiB still holds tens of thousands of
            // records, more than the in-flight limit lets through at once.
            c.set("queued.max.messages.kbytes", "16384");
            // Once a partition's fetched records pass that limit, librdkafka fetches it again
            // only after `fetch.queue.backoff.ms` (1 s by default), however soon the queue
            // drains. A backlog larger than the limit then reached the ingest in bursts: every
            // time the in-flight budget paused and resumed the partitions, the fetcher sat out
            // most of that second with the queue empty and the engine idle (a 150,000-task
            // backlog went through at about 11,500 tasks/s against 13,500 with 20 ms).
            c.set("fetch.queue.backoff.ms", "20");
        }
        if self.is_embedded() && role.is(ClientKind::Consumer) {
            // A broker answers a fetch as soon as records arrive; librdkafka's mock cluster
            // answers one that found nothing only when its wait is over (500 ms by default),
            // however soon records arrive, so a request or a result waited up to that long
            // on each topic it crossed. Asking the in-process cluster again every 10 ms
            // costs little.
            c.set("fetch.wait.max.ms", "10");
        }
        for (k, v) in &self.properties {
            let (only, name) = property_name(k);
            if only.is_none_or(|kind| role.is(kind)) {
                c.set(name, v);
            }
        }
        c.set("bootstrap.servers", bootstrap_servers);
        match role {
            Role::Ingest => {
                c.set("group.id", &self.group_id);
                if let Some(id) = self.instance_id.as_deref().filter(|id| !id.is_empty()) {
                    c.set("group.instance.id", id);
                }
                c.set("enable.auto.commit", "false");
                c.set("enable.auto.offset.store", "false");
                c.set("enable.partition.eof", "false");
            }
            Role::Producer | Role::Log => {
                c.set("enable.idempotence", "true");
                c.set("acks", "all");
                // Requests produced here (`sendledger produce`, the front door, the demo) land
                // where kafka mode's ingest expects their key (results too, for consumers that
                // partition by identity the same way).
                c.set("partitioner", self.partitioner.librdkafka_name());
            }
            Role::Replay => {
                c.set("group.id", format!("{}.replay", self.group_id));
                c.set("enable.auto.commit", "false");
                c.set("enable.auto.offset.store", "false");
                c.set("enable.partition.eof", "false");
            }
            Role::Admin => {}
        }
        c
    }

    /// The values of the secret properties ([`is_secret`]), to keep out of any text shown.
    pub fn secret_values(&self) -> Vec<String> {
        self.properties
            .iter()
            .filter(|(k, _)| is_secret(k))
            .map(|(_, v)| v.clone())
            .collect()
    }

    /// The topics sendledger uses, with the dead-letter topic when configured.
    pub fn topics(&self) -> Vec<&str> {
        let mut t = vec![
            self.requests_topic.as_str(),
            self.results_topic.as_str(),
            self.events_topic.as_str(),
        ];
        if let Some(d) = &self.dead_letter_topic {
            t.push(d);
        }
        if self.snapshot_interval.is_some() {
            t.push(&self.snapshots_topic);
        }
        t
    }
}

/// Whether `topic` is a valid Kafka topic name; what is wrong with it otherwise.
pub fn check_topic(topic: &str) -> std::result::Result<(), String> {
    if topic.is_empty() || topic.len() > 249 {
        return Err(format!(
            "is {} characters; a topic name has 1 to 249",
            topic.len()
        ));
    }
    if topic == "." || topic == ".." {
        return Err(format!("{topic:?} is not a valid topic name"));
    }
    if let Some(c) = topic
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || "._-".contains(*c)))
    {
        return Err(format!(
            "contains {c:?}; topic names use ASCII letters, digits, '.', '_' and '-'"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The secrets of SASL and TLS never show in `Debug`; the rest does.
    #[test]
    fn debug_hides_sasl_and_ssl_secrets() {
        let mut c = KafkaConfig::default();
        for (k, v) in [
            ("security.protocol", "sasl_ssl"),
            ("sasl.mechanism", "SCRAM-SHA-512"),
            ("sasl.username", "visible-user"),
            ("sasl.password", "s3cret-1"),
            ("ssl.key.password", "s3cret-2"),
            ("ssl.key.pem", "s3cret-3"),
            ("ssl.keystore.password", "s3cret-4"),
            ("sasl.oauthbearer.client.secret", "s3cret-5"),
            ("ssl.ca.location", "/etc/ca.pem"),
        ] {
            c.properties.insert(k.into(), v.into());
        }
        let debug = format!("{c:?}");
        assert!(!debug.contains("s3cret"), "{debug}");
        assert_eq!(debug.matches("\"***\"").count(), 5, "{debug}");
        for shown in ["visible-user", "sasl_ssl", "SCRAM-SHA-512", "/etc/ca.pem"] {
            assert!(debug.contains(shown), "{debug}");
        }
    }

    #[test]
    fn defaults_are_valid_and_errors_name_the_field() {
        KafkaConfig::default().validate().unwrap();
        let c = KafkaConfig {
            results_topic: "bad topic".into(),
            ..KafkaConfig::default()
        };
        let err = c.validate().unwrap_err().to_string();
        assert!(err.contains("`results_topic`"), "{err}");
        let mut c = KafkaConfig::default();
        c.events_topic = c.requests_topic.clone();
        let err = c.validate().unwrap_err().to_string();
        assert!(err.contains("`events_topic` names the same topic"), "{err}");
        let mut c = KafkaConfig::default();
        c.properties
            .insert("enable.auto.commit".into(), "true".into());
        let err = c.validate().unwrap_err().to_string();
        assert!(err.contains("`properties.enable.auto.commit`"), "{err}");
        let mut c = KafkaConfig::default();
        c.properties
            .insert("auto.offset.reset".into(), "latest".into());
        let err = c.validate().unwrap_err().to_string();
        assert!(err.contains("`properties.auto.offset.reset`"), "{err}");
        let mut c = KafkaConfig::default();
        c.properties.insert("producer.acks".into(), "1".into());
        let err = c.validate().unwrap_err().to_string();
        assert!(err.contains("`properties.producer.acks`"), "{err}");
        let c = KafkaConfig {
            max_unfinished_bytes: 1000,
            ..KafkaConfig::default()
        };
        let err = c.validate().unwrap_err().to_string();
        assert!(err.contains("`max_unfinished_bytes`"), "{err}");
    }

    #[test]
    fn guarantees_override_pass_through_properties() {
        let mut c = KafkaConfig::default();
        c.properties
            .insert("security.protocol".into(), "sasl_plaintext".into());
        c.properties
            .insert("message.timeout.ms".into(), "30000".into());
        let p = c.client_config(Role::Producer, "h:1");
        assert_eq!(p.get("security.protocol"), Some("sasl_plaintext"));
        assert_eq!(p.get("message.timeout.ms"), Some("30000"));
        assert_eq!(p.get("enable.idempotence"), Some("true"));
        assert_eq!(p.get("acks"), Some("all"));
        let i = c.client_config(Role::Ingest, "h:1");
        assert_eq!(i.get("enable.auto.offset.store"), Some("false"));
        assert_eq!(i.get("enable.auto.commit"), Some("false"));
        assert_eq!(i.get("group.id"), Some("sendledger"));
        assert_eq!(
            i.get("partition.assignment.strategy"),
            Some("cooperative-sticky")
        );
        assert_eq!(i.get("group.instance.id"), None);
        let with_id = KafkaConfig {
            brokers: "k:9092".into(),
            instance_id: Some("node-1".into()),
            ..c.clone()
        };
        let i = with_id.client_config(Role::Ingest, "h:1");
        assert_eq!(i.get("group.instance.id"), Some("node-1"));
        assert_eq!(i.get("session.timeout.ms"), Some("10000"));
        let p = with_id.client_config(Role::Producer, "h:1");
        assert_eq!(p.get("group.instance.id"), None);
        assert_eq!(i.get("bootstrap.servers"), Some("h:1"));
    }

    /// A property under `consumer.` reaches the consumers only and one under `producer.` the
    /// producers only, without the prefix; one without a prefix reaches every client.
    #[test]
    fn prefixed_properties_reach_their_kind_of_client_only() {
        let mut c = KafkaConfig::default();
        c.properties
            .insert("consumer.session.timeout.ms".into(), "7000".into());
        c.properties
            .insert("producer.linger.ms".into(), "20".into());
        c.properties
            .insert("security.protocol".into(), "ssl".into());
        let all = [
            Role::Ingest,
            Role::Replay,
            Role::Producer,
            Role::Log,
            Role::Admin,
        ];
        for role in all {
            let client = c.client_config(role, "h:1");
            let consumer = matches!(role, Role::Ingest | Role::Replay);
            let producer = matches!(role, Role::Producer | Role::Log);
            assert_eq!(
                client.get("session.timeout.ms") == Some("7000"),
                consumer,
                "{role:?}"
            );
            assert_eq!(client.get("linger.ms") == Some("20"), producer, "{role:?}");
            assert_eq!(client.get("security.protocol"), Some("ssl"), "{role:?}");
            assert_eq!(client.get("consumer.session.timeout.ms"), None, "{role:?}");
            assert_eq!(client.get("producer.linger.ms"), None, "{role:?}");
        }
    }

    #[test]
    fn parses_from_toml_like_json_and_refuses_unknown_fields() {
        let c: KafkaConfig = serde_json::from_value(serde_json::json!({
            "brokers": "localhost:9092",
            "commit_interval": "250ms",
            "properties": { "sasl.mechanism": "PLAIN" }
        }))
        .unwrap();
        assert_eq!(c.commit_interval, Duration::from_millis(250));
        assert!(
            serde_json::from_value::<KafkaConfig>(serde_json::json!({ "broker": "x" })).is_err()
        );
    }
}
