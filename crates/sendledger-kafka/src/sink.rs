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
    /// Kafka mode: the message's partition is not owned here (any more): nothing was recorded,
    /// and the instance that owns the partition reads the message again. The consumer moves on
    /// without storing its offset.
    #[error("not owned here: {0}")]
    NotOwned(String),
}

/// Kafka mode: what the consumer tells about the partitions the group gives it and takes
/// away. A take-over runs on a thread of its own and may block (it reads the partition's log);
/// the partition stays paused meanwhile. The other calls come from the consumer's thread.
pub trait PartitionOwner: Send + Sync + 'static {
    /// Takes partition `partition` over: opens its log of record (fencing the previous owner),
    /// restores what the ledger lacks and resumes its tasks. An error leaves the partition
    /// paused and unowned, with the reason logged and shown in health. Never called twice at
    /// once for one partition.
    fn take_over(&self, partition: i32) -> Result<(), String>;

    /// The partition count of the log of record, which the requests topic had when the
    /// instance started: a request's key belongs to one of these partitions (by
    /// `kafka.partitioner`), and one that arrived on another partition is refused.
    fn log_partitions(&self) -> i32;

    /// Gives partition `partition` up: its tasks stop acting here. May come while its
    /// take-over is under way: that take-over must then leave the partition unowned (and end
    /// with an error).
    fn release(&self, partition: i32);

    /// Message `offset` of `partition` was received and is handled: its offset may be
    /// committed for the group only with or after what records it (`group`: the consumer's
    /// group metadata now, if it has any).
    fn received(
        &self,
        partition: i32,
        offset: i64,
        group: Option<rdkafka::consumer::ConsumerGroupMetadata>,
    );

    /// Message `offset` of `partition` is done: recorded, or dropped as processed. Its offset
    /// (with those before it) is committed for the group by the partition's next transaction
    /// (`group`: the consumer's group metadata now, if it has any).
    fn done(
        &self,
        partition: i32,
        offset: i64,
        group: Option<rdkafka::consumer::ConsumerGroupMetadata>,
    );

    /// Whether partition `partition`'s log has a transaction under way for long (its commits
    /// hang): its messages do not finish meanwhile, and it pauses at its share of the in-flight
    /// budget so that the others keep the rest.
    fn stalled(&self, partition: i32) -> bool;

    /// Partitions whose log was given up since the last call, though the consumer may still
    /// hold them, each with whether another writer fenced it. The consumer takes such a
    /// partition over again while it is assigned here: soon after a failed transaction, and
    /// after a fencing only when no rebalance moved the partition in the meantime.
    fn lost(&self) -> Vec<(i32, bool)>;
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
