//! Errors of the Kafka layer.

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid kafka configuration: `{field}` {problem}")]
    Config { field: String, problem: String },
    #[error("kafka")]
    Kafka(#[from] rdkafka::error::KafkaError),
    #[error("the brokers at {brokers} refused this client: {reason}; check the security settings in kafka.properties (security.protocol, sasl.mechanism, sasl.username, sasl.password, ssl.ca.location) against what the brokers accept")]
    Refused { brokers: String, reason: String },
    #[error("no answer from the brokers at {brokers} within {within}; the last error: {reason}")]
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
    #[error("cannot encode a record: {0}")]
    Encode(String),
    #[error("event record {event_id} cannot be read back: {detail}")]
    BadRecord { event_id: String, detail: String },
    #[error("replaying topic {topic}: {detail}")]
    Replay { topic: String, detail: String },
    #[error("the brokers stopped this consumer for good: {0}; if another live instance uses the same kafka.instance_id, give each its own (or leave it unset to derive one), then restart")]
    ConsumerFatal(String),
    #[error("must be called within a tokio runtime")]
    NoRuntime,
    #[error("{what} thread stopped unexpectedly")]
    Thread { what: &'static str },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
