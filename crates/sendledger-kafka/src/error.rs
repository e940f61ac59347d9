//! Errors of the Kafka layer.

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid kafka configuration: `{field}` {problem}")]
    Config { field: String, problem: String },
    #[error("kafka")]
    Kafka(#[from] rdkafka::error::KafkaError),
    #[error("the brokers at {brokers} (kafka.brokers) refused this client: {reason}; check the security settings in kafka.properties (security.protocol, sasl.mechanism, sasl.username, sasl.password, ssl.ca.location) against what the brokers accept, and that kafka.brokers names Kafka brokers")]
    Refused { brokers: String, reason: String },
    #[error("no answer from the brokers at {brokers} (kafka.brokers) within {within}; the last error: {reason}; check that kafka.brokers names running Kafka brokers this host can reach")]
    NoAnswer {
        brokers: String,
        within: String,
        reason: String,
    },
    #[error("cannot start the embedded kafka cluster: {0}")]
    Embedded(String),
    #[error("ledger")]
    Ledger(#[from] sendledger_store::Error),
    #[error("the request sink failed and will not accept more messages: {0}; restart after fixing its cause")]
    SinkFatal(String),
    #[error("cannot encode a record")]
    Encode(#[source] serde_json::Error),
    /// An event's body does not serialize as the tagged object every record is written from.
    #[error("cannot encode a record: {name} is not written as a tagged object")]
    NotTagged { name: &'static str },
    /// An events-topic record that is not an event (`event_id` empty when the record's own
    /// could not be read).
    #[error("event record {event_id} cannot be read back")]
    BadRecord {
        event_id: String,
        source: RecordError,
    },
    #[error("replaying topic {topic}: {detail}")]
    Replay { topic: String, detail: String },
    #[error("the brokers stopped this consumer for good: {0}; if another live instance uses the same kafka.instance_id, give each its own (or leave it unset to derive one), then restart")]
    ConsumerFatal(String),
    #[error("must be called within a tokio runtime")]
    NoRuntime,
    #[error("{what} thread stopped unexpectedly")]
    Thread { what: &'static str },
}

/// What is wrong with an events-topic record.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    /// Not the JSON of an event record, or a body that is not its type's.
    #[error("not an event record")]
    Json(#[from] serde_json::Error),
    /// Not an event in the ledger's encoding (`kafka.events_encoding = "binary"`), or one of a
    /// format this build does not read.
    #[error("not a binary event record")]
    Binary(#[source] sendledger_store::Error),
    #[error("task_id {task_id:?} is not a task id: {problem}")]
    TaskId { task_id: String, problem: String },
    #[error("event_id is not task_id:task_seq ({task_id}:{task_seq})")]
    EventId { task_id: String, task_seq: u32 },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
