//! Where the brokers are: a bootstrap list, or the embedded in-process mock cluster.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, ResourceSpecifier, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::error::KafkaError;
use rdkafka::metadata::Metadata;
use rdkafka::producer::{BaseProducer, Producer};
use rdkafka::types::{RDKafkaApiKey, RDKafkaErrorCode, RDKafkaRespErr};
use rdkafka::{ClientConfig, ClientContext};

use crate::config::{KafkaConfig, Role};
use crate::error::{Error, Result};
use crate::mock::MockCluster;

/// How long one metadata request may take before [`Kafka::metadata`] looks at what librdkafka
/// reported meanwhile.
const METADATA_STEP: Duration = Duration::from_millis(250);

/// What librdkafka reports for a client while it waits for the brokers: the first refusal
/// (authentication or TLS failed: waiting longer does not cure it) and the last error.
#[derive(Default)]
struct Watch {
    refused: Mutex<Option<String>>,
    last: Mutex<Option<String>>,
}

impl ClientContext for Watch {
    fn error(&self, error: KafkaError, reason: &str) {
        let text = format!("{error}: {reason}");
        // rust-rdkafka hands a producer's error event over twice in a row: logged once.
        if lock(&self.last).as_deref() != Some(text.as_str()) {
            tracing::error!(%error, reason, "kafka client error");
        }
        if matches!(
            error.rdkafka_error_code(),
            Some(
                RDKafkaErrorCode::Authentication
                    | RDKafkaErrorCode::SaslAuthenticationFailed
                    | RDKafkaErrorCode::SSL
            )
        ) {
            lock(&self.refused).get_or_insert_with(|| text.clone());
        }
        *lock(&self.last) = Some(text);
    }
}

impl rdkafka::producer::ProducerContext for Watch {
    type DeliveryOpaque = ();

    /// The probe produces nothing.
    fn delivery(&self, _: &rdkafka::message::DeliveryResult<'_>, _: ()) {}
}

/// The partitions of `topic`, as the brokers' metadata lists them (none for a topic they do not
/// know).
pub(crate) fn topic_partitions<C: rdkafka::consumer::ConsumerContext>(
    consumer: &rdkafka::consumer::BaseConsumer<C>,
    topic: &str,
    timeout: Duration,
) -> rdkafka::error::KafkaResult<Vec<i32>> {
    use rdkafka::consumer::Consumer;
    let metadata = consumer.fetch_metadata(Some(topic), timeout)?;
    Ok((metadata.topics().iter())
        .filter(|t| t.name() == topic)
        .flat_map(|t| t.partitions().iter().map(|p| p.id()))
        .collect())
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// `text` with every secret value in it replaced by `***` (librdkafka does not quote them; this
/// keeps it so whatever it says).
fn scrub(mut text: String, secrets: &[String]) -> String {
    for secret in secrets.iter().filter(|s| !s.is_empty()) {
        text = text.replace(secret.as_str(), "***");
    }
    text
}

/// How long the embedded cluster lets a consumer group's first member wait for others before
/// it assigns the partitions (a broker's `group.initial.rebalance.delay.ms`). librdkafka's
/// mock waits 3 s, as brokers do by default, to gather members that start together; an
/// embedded cluster serves one instance per consumer group (several instances need real
/// brokers), so nobody else is coming and the wait was most of the time to a first result. A
/// member that joins later still triggers an ordinary rebalance.
const EMBEDDED_INITIAL_REBALANCE_DELAY_MS: i32 = 0;

/// librdkafka's in-process Kafka-protocol cluster (experimental in librdkafka; meant for the
/// demo, tests and trying sendledger without setup). It lives until the last clone of this
/// handle is dropped.
#[derive(Clone)]
pub struct EmbeddedCluster {
    inner: Arc<EmbeddedInner>,
}

struct EmbeddedInner {
    cluster: MockCluster,
    bootstrap: String,
    brokers: i32,
}

impl EmbeddedCluster {
    /// Starts a cluster of `brokers` brokers and creates `topics` (name, partitions).
    pub fn start(brokers: i32, topics: &[(String, i32)]) -> Result<EmbeddedCluster> {
        let cluster = MockCluster::new(brokers).map_err(|e| Error::Embedded(e.to_string()))?;
        cluster.initial_rebalance_delay(EMBEDDED_INITIAL_REBALANCE_DELAY_MS);
        for (name, partitions) in topics {
            cluster
                .create_topic(name, *partitions)
                .map_err(|e| Error::Embedded(format!("creating topic {name}: {e}")))?;
        }
        let bootstrap = cluster.bootstrap_servers();
        tracing::info!(bootstrap = %bootstrap, brokers, "embedded kafka cluster started");
        Ok(EmbeddedCluster {
            inner: Arc::new(EmbeddedInner {
                cluster,
                bootstrap,
                brokers,
            }),
        })
    }

    pub fn bootstrap_servers(&self) -> &str {
        &self.inner.bootstrap
    }

    /// Broker ids are 1 to this.
    pub fn brokers(&self) -> i32 {
        self.inner.brokers
    }

    /// Takes broker `id` down: its connections close and it refuses new ones.
    pub fn broker_down(&self, id: i32) -> Result<()> {
        Ok(self.inner.cluster.set_broker_up(id, false)?)
    }

    pub fn broker_up(&self, id: i32) -> Result<()> {
        Ok(self.inner.cluster.set_broker_up(id, true)?)
    }

    /// The next requests of kind `api` fail with `errors`, one each, in order.
    pub fn request_errors(&self, api: RDKafkaApiKey, errors: &[RDKafkaRespErr]) {
        self.inner.cluster.push_request_errors(api, errors);
    }

    pub fn clear_request_errors(&self, api: RDKafkaApiKey) {
        self.inner.cluster.clear_request_errors(api);
    }
}

/// The embedded cluster (librdkafka's mock cluster) keeps at most this many messages per
/// partition, and deletes the oldest beyond it...
pub const EMBEDDED_MAX_MESSAGES_PER_PARTITION: u64 = 100_000;
/// ...or beyond this many bytes per partition.
pub const EMBEDDED_MAX_BYTES_PER_PARTITION: u64 = 5 * 1024 * 1024;

/// A validated Kafka configuration and the brokers it talks to. Cheap to clone; holds the
/// embedded cluster alive when there is one.
#[derive(Clone)]
pub struct Kafka {
    config: Arc<KafkaConfig>,
    bootstrap: String,
    embedded: Option<EmbeddedCluster>,
}

impl Kafka {
    /// Refuses a backlog of `messages` (of `bytes` in all) produced at once to the requests
    /// topic of an embedded cluster when a partition could exceed what the cluster keeps:
    /// the oldest requests would be deleted before they were processed. Counts a partition
    /// as holding up to a third more than its share (keys do not hash evenly).
    pub fn check_embedded_backlog(&self, messages: u64, bytes: u64) -> Result<()> {
        if self.embedded.is_none() {
            return Ok(());
        }
        let partitions = self.config.partitions.max(1) as u64;
        let worst = |total: u64| total.div_ceil(partitions).saturating_mul(4) / 3;
        if worst(messages) > EMBEDDED_MAX_MESSAGES_PER_PARTITION
            || worst(bytes) > EMBEDDED_MAX_BYTES_PER_PARTITION
        {
            return Err(Error::Config {
                field: "partitions".into(),
                problem: format!(
                    "{messages} messages ({bytes} bytes) over {partitions} partitions may exceed \
                     what the embedded cluster keeps per partition ({EMBEDDED_MAX_MESSAGES_PER_PARTITION} \
                     messages or {EMBEDDED_MAX_BYTES_PER_PARTITION} bytes; older ones are deleted \
                     before they are processed): send fewer at once, use more partitions, or a real broker"
                ),
            });
        }
        Ok(())
    }

    /// Validates the configuration; with `brokers = "embedded"` starts the in-process cluster
    /// with every topic created. Blocking (starting the embedded cluster takes a moment).
    pub fn connect(config: KafkaConfig) -> Result<Kafka> {
        config.validate()?;
        let (bootstrap, embedded) = if config.is_embedded() {
            let topics: Vec<(String, i32)> = config
                .topics()
                .into_iter()
                .map(|t| (t.to_string(), config.partitions))
                .collect();
            let cluster = EmbeddedCluster::start(1, &topics)?;
            (cluster.bootstrap_servers().to_string(), Some(cluster))
        } else {
            (config.brokers.clone(), None)
        };
        Ok(Kafka {
            config: Arc::new(config),
            bootstrap,
            embedded,
        })
    }

    pub fn config(&self) -> &KafkaConfig {
        &self.config
    }

    /// The same cluster, reading requests from `topic` in consumer group `group` (a tenant's
    /// own requests topic: [`crate::Ingest`] reads one topic). On an embedded cluster the
    /// topic is created.
    pub fn for_requests_topic(&self, topic: &str, group: &str) -> Result<Kafka> {
        let mut config = (*self.config).clone();
        config.requests_topic = topic.to_string();
        config.group_id = group.to_string();
        config.validate()?;
        if let Some(embedded) = &self.embedded {
            // Creating a topic the cluster has is refused; any other failure shows later.
            let _ = embedded
                .inner
                .cluster
                .create_topic(topic, config.partitions);
        }
        Ok(Kafka {
            config: Arc::new(config),
            bootstrap: self.bootstrap.clone(),
            embedded: self.embedded.clone(),
        })
    }

    pub fn bootstrap_servers(&self) -> &str {
        &self.bootstrap
    }

    pub fn embedded(&self) -> Option<&EmbeddedCluster> {
        self.embedded.as_ref()
    }

    /// The librdkafka configuration of a client in `role` (see [`KafkaConfig::client_config`]).
    pub fn client_config(&self, role: Role) -> ClientConfig {
        self.config.client_config(role, &self.bootstrap)
    }

    /// The brokers' metadata, within `timeout` (blocking). librdkafka's own errors are watched
    /// meanwhile: when the brokers refuse this client (authentication failed, or the TLS
    /// handshake), the wait ends at once with [`Error::Refused`] and librdkafka's reason, since
    /// waiting longer does not help; when nothing answers in time, the error carries the last
    /// reason librdkafka gave.
    pub fn metadata(&self, timeout: Duration) -> Result<Metadata> {
        let secrets = self.config.secret_values();
        let probe: BaseProducer<Watch> = self
            .client_config(Role::Admin)
            .create_with_context(Watch::default())?;
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let fetched = probe.client().fetch_metadata(None, left.min(METADATA_STEP));
            // Serves what librdkafka reported meanwhile: errors (to `Watch`) and its logs.
            probe.poll(Duration::from_millis(20));
            let e = match fetched {
                Ok(metadata) => return Ok(metadata),
                Err(e) => e,
            };
            let watch = probe.context();
            if let Some(reason) = lock(&watch.refused).clone() {
                return Err(Error::Refused {
                    brokers: self.bootstrap.clone(),
                    reason: scrub(reason, &secrets),
                });
            }
            if Instant::now() >= deadline {
                return Err(match lock(&watch.last).clone() {
                    Some(reason) => Error::NoAnswer {
                        brokers: self.bootstrap.clone(),
                        within: humantime::format_duration(timeout).to_string(),
                        reason: scrub(reason, &secrets),
                    },
                    None => e.into(),
                });
            }
        }
    }

    /// Creates the topics that do not exist yet, with `partitions` partitions (for external
    /// brokers; the embedded cluster creates them at start). Existing topics are left alone,
    /// and when all exist nothing is asked of the brokers' admin API. With `log_of_record`
    /// (kafka mode) the events topic is created with [`LOG_TOPIC_SETTINGS`].
    pub async fn ensure_topics(
        &self,
        replication: i32,
        timeout: Duration,
        log_of_record: bool,
    ) -> Result<()> {
        if self.embedded.is_some() {
            return Ok(());
        }
        let kafka = self.clone();
        let existing: Vec<String> = tokio::task::spawn_blocking(move || {
            kafka
                .metadata(timeout)
                .map(|m| m.topics().iter().map(|t| t.name().to_string()).collect())
        })
        .await
        .map_err(|_| Error::Thread {
            what: "kafka metadata",
        })??;
        let topics: Vec<NewTopic<'_>> = self
            .config
            .topics()
            .into_iter()
            .filter(|t| !existing.iter().any(|e| e == t))
            .map(|t| {
                let topic = NewTopic::new(
                    t,
                    self.config.partitions,
                    TopicReplication::Fixed(replication),
                );
                // The snapshots topic keeps every record too: the latest snapshot stays
                // however long it is the latest (sendledger deletes the older ones).
                let kept = [&self.config.events_topic, &self.config.snapshots_topic];
                if log_of_record && kept.contains(&&t.to_string()) {
                    LOG_TOPIC_SETTINGS
                        .iter()
                        .fold(topic, |topic, (k, v)| topic.set(k, v))
                } else {
                    topic
                }
            })
            .collect();
        if topics.is_empty() {
            return Ok(());
        }
        self.create_topics(&topics, timeout, "brokers").await
    }

    /// Creates `topics`; one that exists already is left alone. A refusal is a configuration
    /// error of `field`.
    pub(crate) async fn create_topics(
        &self,
        topics: &[NewTopic<'_>],
        timeout: Duration,
        field: &str,
    ) -> Result<()> {
        let admin: AdminClient<DefaultClientContext> = self.client_config(Role::Admin).create()?;
        let opts = AdminOptions::new().operation_timeout(Some(timeout));
        for result in admin.create_topics(topics, &opts).await? {
            match result {
                Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
                Err((topic, code)) => {
                    return Err(Error::Config {
                        field: field.into(),
                        problem: format!("cannot create topic {topic}: {code}; create it yourself or grant the permission"),
                    })
                }
            }
        }
        Ok(())
    }
    /// Checks that the events topic can be kafka mode's log of record: it exists, has as many
    /// partitions as the requests topic (a task's events go to the partition of its request),
    /// and keeps every event (no finite retention, no compaction) unless
    /// `allow_finite_retention` accepts the loss: a partition whose oldest events were deleted
    /// restores without them (their tasks, identities and processed offsets are forgotten, so
    /// a redelivery of such a request is sent again). Each refusal names the setting to change.
    ///
    /// Returns the topic's partition count and warnings about its durability, each naming the
    /// setting: where a commit the brokers acknowledged could still be lost (a replication
    /// factor under 3, `min.insync.replicas` under 2, `unclean.leader.election.enable =
    /// true`), the proof that a request was sent can be lost with it.
    pub async fn check_log_of_record(
        &self,
        allow_finite_retention: bool,
        timeout: Duration,
    ) -> Result<LogOfRecord> {
        let config = &self.config;
        let kafka = self.clone();
        let topics = [config.requests_topic.clone(), config.events_topic.clone()];
        // Per topic: its partition count and the fewest replicas of a partition.
        let found: Vec<Option<(usize, usize)>> = tokio::task::spawn_blocking(move || {
            let m = kafka.metadata(timeout)?;
            Ok::<_, Error>(
                topics
                    .iter()
                    .map(|name| {
                        m.topics()
                            .iter()
                            .find(|t| t.name() == name && t.error().is_none())
                            .map(|t| {
                                let replicas = t.partitions().iter().map(|p| p.replicas().len());
                                (t.partitions().len(), replicas.min().unwrap_or(0))
                            })
                    })
                    .collect(),
            )
        })
        .await
        .map_err(|_| Error::Thread {
            what: "kafka metadata",
        })??;
        let bad = |problem: String| Error::Config {
            field: "events_topic".into(),
            problem,
        };
        let (requests, (events, replicas)) = match (found[0], found[1]) {
            (Some((r, _)), Some(e)) => (r, e),
            (None, _) => {
                return Err(Error::Config {
                    field: "requests_topic".into(),
                    problem: format!("{} does not exist on the brokers", config.requests_topic),
                })
            }
            (_, None) => {
                return Err(bad(format!(
                    "{} does not exist; in kafka mode it is the log of record: let sendledger create it, or create it with the requests topic's partition count and retention.ms = -1, retention.bytes = -1, cleanup.policy = delete",
                    config.events_topic
                )))
            }
        };
        if requests != events {
            return Err(bad(format!(
                "{} has {events} partitions and the requests topic {} has {requests}; in kafka mode a task's events go to the partition of its request, so both need the same count: give the events topic {requests} partitions (a new, empty topic; events are never moved between partitions)",
                config.events_topic, config.requests_topic
            )));
        }
        let admin: AdminClient<DefaultClientContext> = self.client_config(Role::Admin).create()?;
        let opts = AdminOptions::new().request_timeout(Some(timeout));
        let described = admin
            .describe_configs(&[ResourceSpecifier::Topic(&config.events_topic)], &opts)
            .await?;
        let resource = match described.into_iter().next() {
            Some(Ok(r)) => r,
            Some(Err(code)) if allow_finite_retention => {
                return Ok(LogOfRecord {
                    partitions: events as i32,
                    warnings: vec![format!(
                        "cannot read the configuration of {}: {code}; whether an acknowledged commit can be lost is not checked (grant DESCRIBE_CONFIGS)",
                        config.events_topic
                    )],
                })
            }
            Some(Err(code)) => {
                return Err(bad(format!(
                    "cannot read the configuration of {}: {code}; kafka mode must see that it keeps every event (grant DESCRIBE_CONFIGS, or allow finite retention)",
                    config.events_topic
                )))
            }
            None => return Err(bad(format!("no configuration returned for {}", config.events_topic))),
        };
        let value = |name: &str| resource.get(name).and_then(|e| e.value.clone());
        let mut problems = Vec::new();
        for key in ["retention.ms", "retention.bytes"] {
            if let Some(v) = value(key).filter(|v| v != "-1") {
                // With snapshots, a take-over reads the log from the latest one on: a time
                // retention of four snapshot intervals keeps what it needs.
                let covered = match (key, config.snapshot_interval) {
                    ("retention.ms", Some(interval)) => v
                        .parse::<u128>()
                        .is_ok_and(|ms| ms >= 4 * interval.as_millis()),
                    _ => false,
                };
                if !covered {
                    problems.push(format!("{key} = {v}"));
                }
            }
        }
        if let Some(v) = value("cleanup.policy").filter(|v| v.contains("compact")) {
            problems.push(format!("cleanup.policy = {v}"));
        }
        if !problems.is_empty() && !allow_finite_retention {
            return Err(bad(format!(
                "{} would lose events ({}); in kafka mode it is the log of record and a partition is restored from all of it (or, with kafka.snapshot_interval, from its latest snapshot on): set retention.ms = -1 (or, with snapshots, at least four snapshot intervals), retention.bytes = -1, cleanup.policy = delete on the topic, or allow finite retention to accept that a restored partition forgets the tasks whose events were deleted (a redelivery of their requests is then sent again)",
                config.events_topic,
                problems.join(", ")
            )));
        }
        let topic = &config.events_topic;
        let mut warnings = Vec::new();
        if replicas < 3 {
            warnings.push(format!(
                "{topic} has replication factor {replicas}: a commit is lost with the broker that holds it, and with it the proof that a request was sent; use 3"
            ));
        }
        if let Some(v) =
            value("min.insync.replicas").filter(|v| v.parse::<u32>().is_ok_and(|n| n < 2))
        {
            warnings.push(format!(
                "{topic} has min.insync.replicas = {v}: a commit acknowledged by one replica is lost if that broker fails before another copies it; set 2 (with replication factor 3)"
            ));
        }
        if let Some(v) = value("unclean.leader.election.enable").filter(|v| v == "true") {
            warnings.push(format!(
                "{topic} has unclean.leader.election.enable = {v}: a replica that missed acknowledged commits may become leader and drop them; set false"
            ));
        }
        Ok(LogOfRecord {
            partitions: events as i32,
            warnings,
        })
    }
}

/// What [`Kafka::check_log_of_record`] found of an events topic fit to be the log of record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogOfRecord {
    /// Its partition count (the requests topic's): a request's key belongs to one of them.
    pub partitions: i32,
    /// Where an acknowledged commit could still be lost, each naming the setting to change.
    pub warnings: Vec<String>,
}

impl Kafka {
    /// How long `topic` keeps its messages (`retention.ms`); `None` for good (-1).
    pub async fn topic_retention(
        &self,
        topic: &str,
        timeout: Duration,
    ) -> Result<Option<Duration>> {
        let admin: AdminClient<DefaultClientContext> = self.client_config(Role::Admin).create()?;
        let opts = AdminOptions::new().request_timeout(Some(timeout));
        let described = admin
            .describe_configs(&[ResourceSpecifier::Topic(topic)], &opts)
            .await?;
        let bad = |problem: String| Error::Config {
            field: "requests_topic".into(),
            problem,
        };
        let resource = match described.into_iter().next() {
            Some(Ok(r)) => r,
            Some(Err(code)) => {
                return Err(bad(format!(
                    "cannot read the configuration of {topic}: {code}"
                )))
            }
            None => return Err(bad(format!("no configuration returned for {topic}"))),
        };
        match resource
            .get("retention.ms")
            .and_then(|e| e.value.as_deref())
        {
            Some(ms) => match ms.parse::<i64>() {
                Ok(ms) if ms < 0 => Ok(None),
                Ok(ms) => Ok(Some(Duration::from_millis(ms as u64))),
                Err(_) => Err(bad(format!(
                    "{topic} has retention.ms = {ms}, not a number"
                ))),
            },
            None => Err(bad(format!("{topic} reports no retention.ms"))),
        }
    }
}

/// The settings of the events topic when it is the log of record (kafka mode): every event is
/// kept.
pub const LOG_TOPIC_SETTINGS: [(&str, &str); 3] = [
    ("retention.ms", "-1"),
    ("retention.bytes", "-1"),
    ("cleanup.policy", "delete"),
];

#[cfg(test)]
mod tests {
    use super::*;
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::message::Message;
    use rdkafka::producer::{FutureProducer, FutureRecord};
    use rdkafka::util::Timeout;

    #[test]
    fn a_backlog_the_embedded_cluster_would_truncate_is_refused() {
        let kafka = Kafka::connect(KafkaConfig::default()).unwrap();
        assert!(kafka.check_embedded_backlog(200_000, 12_000_000).is_ok());
        let err = kafka
            .check_embedded_backlog(1_000_000, 200_000_000)
            .unwrap_err()
            .to_string();
        assert!(err.contains("100000 messages"), "{err}");
        assert!(
            kafka.check_embedded_backlog(10_000, 30_000_000).is_err(),
            "bytes count too"
        );
    }

    /// The embedded cluster has the topics, and the producer and consumer configurations that
    /// sendledger builds are accepted by librdkafka and work against it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn embedded_cluster_round_trip() {
        let kafka = tokio::task::block_in_place(|| Kafka::connect(KafkaConfig::default())).unwrap();
        let producer: FutureProducer = kafka.client_config(Role::Producer).create().unwrap();
        let topic = kafka.config().requests_topic.clone();
        producer
            .send(
                FutureRecord::to(&topic)
                    .key("k")
                    .payload("hello")
                    .partition(1),
                Timeout::Never,
            )
            .await
            .unwrap();
        let consumer: BaseConsumer = kafka.client_config(Role::Ingest).create().unwrap();
        consumer.subscribe(&[&topic]).unwrap();
        let got = tokio::task::spawn_blocking(move || {
            let deadline = std::time::Instant::now() + Duration::from_secs(30);
            while std::time::Instant::now() < deadline {
                if let Some(Ok(m)) = consumer.poll(Duration::from_millis(100)) {
                    return Some((m.partition(), m.payload().map(<[u8]>::to_vec)));
                }
            }
            None
        })
        .await
        .unwrap();
        assert_eq!(got, Some((1, Some(b"hello".to_vec()))));
        let cluster = kafka.embedded().unwrap();
        cluster.broker_down(1).unwrap();
        cluster.broker_up(1).unwrap();
    }
}
