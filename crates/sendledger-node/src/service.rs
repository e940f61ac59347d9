//! The service: engine, Kafka ingest and outbox publisher on one ledger, started and stopped
//! in the order that keeps every guarantee.
//!
//! Start: the engine first (it resumes unfinished tasks and reconciles interrupted attempts),
//! then the publisher, then the ingest. Stop: the ingest first (no new work; offsets of
//! finished messages committed), then the engine (live tasks finish their current step), then
//! the publisher once it has published everything the ledger holds, or the grace has passed;
//! the admin endpoint last, so the drain can be watched.

use std::sync::Arc;
use std::time::{Duration, Instant};

use metrics_exporter_prometheus::PrometheusHandle;
use sendledger_actors::{Engine, Remote};
use sendledger_kafka::{Ingest, Kafka, LogReplicator, Publisher};

use crate::admin::Admin;
use crate::config::{Config, StorageMode};
use crate::error::{Error, Result};
use crate::front::FrontDoor;
use crate::retention::Retention;
use crate::wiring::{EngineSink, KafkaOwner};

/// How long topic creation on external brokers may take.
const TOPIC_TIMEOUT: Duration = Duration::from_secs(30);

pub struct Service {
    engine: Engine,
    /// The requests topic's consumer first, then one per tenant's own requests topic.
    ingests: Vec<Ingest>,
    /// Local mode's outbox (kafka mode has none).
    publisher: Option<Publisher>,
    admin: Option<Admin>,
    /// The HTTP front door, when enabled.
    front: Option<FrontDoor>,
    /// Local mode with `storage.retention`: the loop removing settled tasks' histories.
    retention: Option<Retention>,
    grace: Duration,
}

impl Service {
    /// Starts everything on `kafka` (which outlives the service: the demo restarts the service
    /// on the same embedded cluster). Missing topics are created on external brokers. Must be
    /// called within a multi-threaded tokio runtime. With `admin.enabled`, the admin endpoint
    /// serves `metrics` (the handle of [`crate::admin::install_recorder`]).
    pub async fn start(
        config: &Config,
        kafka: &Kafka,
        remote: Arc<dyn Remote>,
        metrics: Option<PrometheusHandle>,
    ) -> Result<Service> {
        let metrics = match (config.admin.enabled, metrics) {
            (true, Some(m)) => Some(m),
            (true, None) => return Err(Error::NoRecorder),
            (false, _) => None,
        };
        let kafka_mode = config.storage.mode == StorageMode::Kafka;
        kafka
            .ensure_topics(config.kafka.replication_factor, TOPIC_TIMEOUT, kafka_mode)
            .await
            .map_err(|e| Error::step("creating the topics", e))?;
        let log_of_record = if kafka_mode {
            let log = kafka
                .check_log_of_record(config.storage.allow_finite_log_retention, TOPIC_TIMEOUT)
                .await
                .map_err(|e| {
                    Error::step(
                        "checking the events topic, the log of record in kafka mode",
                        e,
                    )
                })?;
            for warning in &log.warnings {
                tracing::warn!("the log of record may lose acknowledged commits: {warning}");
            }
            Some(log)
        } else {
            None
        };
        if let Some(identities) = config.storage.identity_retention {
            check_identity_retention(kafka, identities).await?;
        }
        let engine_config = config.engine_config();
        let engine =
            tokio::task::block_in_place(|| Engine::start(engine_config, remote)).map_err(|e| {
                Error::step(
                    format!("starting the engine on {}", config.storage.data.display()),
                    e,
                )
            })?;
        // Local mode publishes from the ledger (the outbox); kafka mode writes results in the
        // transactions that record their events.
        let (publisher, replicator) = if kafka_mode {
            let replicator = LogReplicator::new(&config.kafka.group_id)
                .with_events_encoding(config.kafka.events_encoding);
            let replicator = Arc::new(replicator);
            engine
                .install_replicator(replicator.clone())
                .map_err(|e| Error::step("installing the log of record", e))?;
            (None, Some(replicator))
        } else {
            let publisher = Publisher::start(kafka, engine.ledger().clone())
                .map_err(|e| Error::step("starting the publisher", e))?;
            (Some(publisher), None)
        };
        let retention = match config.storage.retention {
            Some(retention) => Some(Retention::start(
                engine.clone(),
                retention,
                config.storage.identity_retention,
                !kafka_mode,
            )),
            None => {
                tracing::info!("storage.retention is unset: every task's history is kept (a few hundred bytes a task on disk; see docs/operating/retention.md)");
                None
            }
        };
        let admin = match metrics {
            Some(metrics) => Some(Admin::start(&config.admin, engine.clone(), metrics).await?),
            None => None,
        };
        let sink = Arc::new(EngineSink::new(engine.clone()));
        let owner: Option<Arc<dyn sendledger_kafka::PartitionOwner>> =
            match (replicator, log_of_record) {
                (Some(replicator), Some(log)) => Some(Arc::new(KafkaOwner::new(
                    kafka.clone(),
                    engine.clone(),
                    replicator,
                    log.partitions,
                    config.storage.identity_retention,
                )?)),
                _ => None,
            };
        let access = config.load_access()?.map(Arc::new);
        if let Some(access) = &access {
            tracing::info!(
                tenants = access.tenants.len(),
                "requests are checked against the access rules"
            );
        }
        if let Some(access) = &access {
            warn_of_shared_topics(access);
        }
        let main = Ingest::start_checked(kafka, sink.clone(), owner, access.clone())
            .map_err(|e| Error::step("starting the ingest", e))?;
        let mut ingests = vec![(kafka.clone(), main)];
        // Tenants' own topics (local mode only): a consumer each, in a group of its own, so
        // each is the one member of its group.
        for topic in config.access.own_topics(&config.kafka.requests_topic) {
            let group = format!("{}.{topic}", config.kafka.group_id);
            let step = |e| Error::step(format!("reading the tenant's requests topic {topic}"), e);
            let on_topic = kafka.for_requests_topic(&topic, &group).map_err(step)?;
            (on_topic.ensure_topics(config.kafka.replication_factor, TOPIC_TIMEOUT, false))
                .await
                .map_err(step)?;
            let ingest = Ingest::start_checked(&on_topic, sink.clone(), None, access.clone())
                .map_err(step)?;
            ingests.push((on_topic, ingest));
        }
        if let Some(admin) = &admin {
            for (on, ingest) in &ingests {
                admin.watch_ingest(&on.config().requests_topic, ingest.stats().clone());
            }
        }
        let front = match config.front.enabled {
            true => {
                let produce_to = kafka_mode.then_some(kafka);
                Some(FrontDoor::start(&config.front, engine.clone(), access, produce_to).await?)
            }
            false => None,
        };
        Ok(Service {
            engine,
            front,
            ingests: ingests.into_iter().map(|(_, ingest)| ingest).collect(),
            publisher,
            retention,
            admin,
            grace: config.engine.shutdown_grace,
        })
    }

    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// Local mode's outbox publisher (kafka mode has none).
    pub fn publisher(&self) -> Option<&Publisher> {
        self.publisher.as_ref()
    }

    /// Where the front door listens, when it is enabled.
    pub fn front_addr(&self) -> Option<std::net::SocketAddr> {
        self.front.as_ref().map(FrontDoor::local_addr)
    }

    /// Where the admin endpoint listens, when it is enabled.
    pub fn admin_addr(&self) -> Option<std::net::SocketAddr> {
        self.admin.as_ref().map(Admin::local_addr)
    }

    /// False once the consumer or the publisher stopped by itself (the ledger failed for
    /// good).
    pub fn is_healthy(&self) -> bool {
        self.ingests.iter().all(Ingest::is_running)
            && self.publisher.as_ref().is_none_or(Publisher::is_running)
    }

    /// Stops in order within the configured grace. Whatever is cut off is safe: unfinished
    /// messages are delivered again, interrupted attempts are reconciled at the next start,
    /// unpublished events are published then.
    pub async fn shutdown(self) -> Result<()> {
        let deadline = Instant::now() + self.grace;
        let left = || deadline.saturating_duration_since(Instant::now());
        // No new submissions; what was acknowledged is on the requests topic.
        if let Some(front) = self.front {
            front.shutdown().await;
        }
        drop(self.retention);
        let mut ingest = Ok(());
        for each in self.ingests {
            let stopped = each.shutdown(left()).await;
            ingest = ingest.and(stopped);
        }
        let ledger = self.engine.ledger().clone();
        self.engine.shutdown(left()).await;
        let publisher = match self.publisher {
            Some(publisher) => {
                if !publisher.wait_for(ledger.last_lsn(), left()).await {
                    tracing::warn!(
                        cursor = publisher.cursor(),
                        last_lsn = ledger.last_lsn(),
                        "not every event was published before the grace ran out; the rest is published at the next start"
                    );
                }
                publisher.shutdown(left().max(Duration::from_secs(1))).await
            }
            None => Ok(()),
        };
        if let Some(admin) = self.admin {
            admin.shutdown().await;
        }
        ingest.map_err(|e| Error::step("stopping the ingest", e))?;
        publisher.map_err(|e| Error::step("stopping the publisher", e))?;
        Ok(())
    }
}

/// Refuses an identity retention shorter than the requests topic keeps its messages: a
/// message redelivered from the topic (a consumer group reset, a restore) after its task was
/// forgotten would be executed again. A topic whose settings cannot be read is warned about.
async fn check_identity_retention(kafka: &Kafka, identities: Duration) -> Result<()> {
    let topic = kafka.config().requests_topic.clone();
    if kafka.config().is_embedded() {
        tracing::warn!(%topic, "the embedded cluster does not report its topics' retention: whether a redelivery may come after its identity is forgotten is not checked");
        return Ok(());
    }
    match kafka.topic_retention(&topic, TOPIC_TIMEOUT).await {
        Ok(Some(kept)) if kept <= identities => Ok(()),
        Ok(kept) => Err(crate::ConfigError::field(
            "storage.identity_retention",
            format!(
                "is {}, and the requests topic {topic} keeps messages {}: a request redelivered from it after its task was forgotten would be executed again; set retention.ms on the topic to at most {}, or a longer identity retention",
                humantime::format_duration(identities),
                kept.map_or("for good".to_string(), |k| format!("for {}", humantime::format_duration(k))),
                identities.as_millis()
            ),
        )
        .into()),
        Err(e) => {
            tracing::warn!(error = %e, %topic, "cannot read the requests topic's retention: whether a redelivery may come after its identity is forgotten is not checked");
            Ok(())
        }
    }
}

/// Warns of tenants that share a requests topic while one of them does not sign: any producer
/// of the topic can then act as that tenant.
fn warn_of_shared_topics(access: &sendledger_core::access::Access) {
    let mut by_topic: std::collections::BTreeMap<&str, Vec<&str>> = Default::default();
    for (tenant, rules) in &access.tenants {
        let topic = rules.topic.as_deref().unwrap_or_default();
        by_topic.entry(topic).or_default().push(tenant);
    }
    for (topic, tenants) in by_topic.iter().filter(|(_, t)| t.len() > 1) {
        let unsigned: Vec<&str> = (tenants.iter().copied())
            .filter(|t| access.tenants[*t].keys.is_empty())
            .collect();
        if !unsigned.is_empty() {
            tracing::warn!(%topic, tenants = ?tenants, unsigned = ?unsigned, "several tenants share this requests topic and some sign nothing: any producer of the topic can act as those; give each its own topic (access.tenants.NAME.topic) or signing keys (docs/access.md)");
        }
    }
}
