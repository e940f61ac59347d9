//! sendledger-kafka: the Kafka layer of sendledger.
//!
//! - [`Kafka`]: a validated [`KafkaConfig`] and where its brokers are. With
//!   `brokers = "embedded"` it starts librdkafka's in-process mock cluster ([`EmbeddedCluster`])
//!   and creates the topics, so the whole pipeline runs on one machine with no setup.
//!   [`KafkaConfig::client_config`] is the one place that builds a librdkafka `ClientConfig`.
//! - [`Ingest`]: the consumer group on the requests topic. Each message is parsed, checked and
//!   handed to a [`RequestSink`] (the engine); bad input is handed over as rejected. Offsets the
//!   ledger already holds as processed are dropped as duplicates. A Kafka offset is stored only
//!   after the sink returned (the message's effect and its processed marker are durable), in
//!   partition order, and committed periodically, on revocation and at shutdown.
//! - [`Publisher`]: the outbox. It tails the ledger by LSN from a durable cursor and produces
//!   every event to the events topic and one [`TaskResult`] per result-bearing event to the
//!   results topic (projected by the core crate) with the idempotent producer; the cursor advances only after every record up
//!   to it is acknowledged.
//! - [`broker_check`]: `sendledger check-broker`, whether the brokers keep the transactional
//!   promises kafka mode relies on.
//! - [`partition_log`]: kafka mode's log of record, one transactional producer per requests
//!   partition, and the reading of a partition's log back (restore).
//! - [`take_over`]: kafka mode's take-over of a partition between opening its log and owning
//!   it (the copy checked, the log restored, lost results published again), generic over the
//!   brokers so that the simulation runs it too.
//! - [`audit_topic`] ([`topic_audit`]): the audit of an events topic instead of a local ledger: every record read
//!   back into a ledger event ([`event_from_record`]) and checked with the same rules.
//!
//! - [`RequestProducer`]: produces request messages keyed by identity (`sendledger produce`,
//!   the demo).
//! - [`TopicReader`] and [`ResultsReader`]: read back what sendledger publishes, as its
//!   consumers do (the demo, the Kafka benchmark, the tests).
//!
//! This is the only crate that depends on `rdkafka`. It depends on `sendledger-core` (the types
//! it carries) and `sendledger-store` (the publisher reads the ledger, the ingest reads processed
//! offsets), never on the actors crate: the engine plugs in through [`RequestSink`]. Metrics go
//! through the `metrics` facade, under the names in [`metric_definitions`]; the service
//! installs the exporter. Its only `unsafe` code is
//! `mock.rs`, which owns librdkafka's mock cluster through the C API for [`EmbeddedCluster`].
//!
//! Invariants: a message's offset is never stored before its effect is durable; offsets are
//! stored in partition order; a record is never skipped by the publisher's cursor; bad input
//! never stops a partition. RocksDB is read on the blocking pool, and librdkafka calls that can
//! block (polls, synchronous commits) run on the ingest's own thread, never on an async executor
//! thread.
//!
//! [`TaskResult`]: sendledger_core::TaskResult

pub mod broker_check;
pub mod cluster;
pub mod config;
pub mod error;
pub mod ingest;
pub mod metric_definitions;
mod mock;
pub mod partition_log;
pub mod partitioner;
pub mod produce;
mod projections;
pub mod publisher;
pub mod reader;
pub mod records;
pub mod replicator;
pub mod sink;
pub mod snapshot;
pub mod standby;
pub mod take_over;
pub mod topic_audit;

pub use cluster::{EmbeddedCluster, Kafka, LogOfRecord};
pub use config::{KafkaConfig, Role};
pub use error::{Error, RecordError, Result};
pub use ingest::{Ingest, IngestStats};
pub use partition_log::{Committed, LogBatch, LogError, LogRecord, PartitionLog, TransactionalLog};
pub use partitioner::Partitioner;
pub use produce::{request_key, RequestProducer};
pub use publisher::{Publisher, PublisherStats, PUBLISHER_CURSOR};
pub use reader::{Record, ResultsReader, TopicReader};
pub use records::{
    event_from_json, event_from_payload, event_from_record, events_source, record_headers,
    results_source, Attributes, EventEncoding, EventRecord, RecordKind, EVENT_ID_HEADER,
};
pub use replicator::LogReplicator;
pub use sink::{PartitionOwner, RequestSink, SinkError};
pub use standby::Standby;
pub use topic_audit::audit_topic;

/// The librdkafka binding, re-exported so that users (and tests) of this crate can inject
/// faults into the embedded cluster without depending on `rdkafka` themselves.
pub use rdkafka;
