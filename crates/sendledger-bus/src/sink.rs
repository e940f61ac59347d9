//! The seam between the consumer and whatever records requests (the engine).

use sendledger_core::{BoxFuture, Source, TaskRequest};
use sendledger_store::Processed;

/// Why a sink did not record a message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SinkError {
    /// The message is not a valid request (schema, limits, unknown target). The consumer
    /// records it as rejected with this reason and moves on.
    #[error("invalid request: {0}")]
    Invalid(String),
    /// Nothing was recorded, for a reason that may pass (a busy or failing ledger write, a full
    /// disk, an engine draining). The consumer tries again later; the offset does not advance
    /// meanwhile.
    #[error("not recorded, will retry: {0}")]
    Retry(String),
    /// Nothing was recorded and the sink will never accept anything again (the engine stopped,
    /// or its ledger failed for good: closed, damaged, of a newer format). The consumer stops
    /// with this message instead of retrying.
    #[error("sink stopped: {0}")]
    Fatal(String),
}

/// What the consumer hands messages to. Every future must resolve only once what it records is
/// durable, including the message's processed-offset marker: the consumer stores the Kafka
/// offset right after.
pub trait RequestSink: Send + Sync + 'static {
    /// Records a delivery of a parsed request from `source`.
    fn submit(&self, request: TaskRequest, source: Source) -> BoxFuture<Result<(), SinkError>>;

    /// Records a message that is not a valid request, so that a rejected result naming
    /// `reason` is published and its offset counts as processed. Recording the same source
    /// twice must record nothing new.
    fn reject(
        &self,
        source: Source,
        reason: String,
        raw: Vec<u8>,
    ) -> BoxFuture<Result<(), SinkError>>;

    /// The processed offsets of a requests-topic partition, as durably recorded.
    fn processed(&self, topic: String, partition: i32) -> BoxFuture<Result<Processed, SinkError>>;

    /// Records that every offset up to and including `through` of each `(partition, through)`
    /// is processed, so the per-offset markers below it can be dropped. Only called with
    /// offsets the consumer saw processed in order.
    fn raise_watermarks(
        &self,
        topic: String,
        marks: Vec<(i32, i64)>,
    ) -> BoxFuture<Result<(), SinkError>>;
}
