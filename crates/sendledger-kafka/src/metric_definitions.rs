//! The metrics this crate records (see `sendledger_core::metric`). Recorded through these
//! constants only.

use sendledger_core::metric::{MetricDefinition as M, MetricUnit};

pub const CONSUMER_LAG_MESSAGES: &str = "sendledger_consumer_lag_messages";
pub const CONSUMER_GROUP_SHARED: &str = "sendledger_consumer_group_shared";
pub const INGEST_PAUSES_TOTAL: &str = "sendledger_ingest_pauses_total";
pub const INGEST_PAUSED: &str = "sendledger_ingest_paused";
pub const PARTITION_BLOCKED: &str = "sendledger_partition_blocked";
pub const PARTITION_TAKE_OVER_SECONDS: &str = "sendledger_partition_take_over_seconds";
pub const PARTITIONS_LOST_TOTAL: &str = "sendledger_partitions_lost_total";
pub const GROUP_REJOINS_TOTAL: &str = "sendledger_group_rejoins_total";
pub const REQUESTS_LOST_TOTAL: &str = "sendledger_requests_lost_total";
pub const REQUESTS_REFUSED_TOTAL: &str = "sendledger_requests_refused_total";
pub const REQUESTS_MISPLACED_TOTAL: &str = "sendledger_requests_misplaced_total";
pub const RESULTS_PUBLISHED_TOTAL: &str = "sendledger_results_published_total";
pub const LOG_BATCH_EVENTS: &str = "sendledger_log_batch_events";
pub const LOG_COMMIT_SECONDS: &str = "sendledger_log_commit_seconds";
pub const STANDBY_EVENTS_TOTAL: &str = "sendledger_standby_events_total";
pub const STANDBY_PARTITIONS: &str = "sendledger_standby_partitions";

pub const DEFINITIONS: &[M] = &[
    M::counter(
        REQUESTS_MISPLACED_TOTAL,
        "Kafka mode: requests rejected, never sent, because they arrived on another partition than their key's (by kafka.partitioner over the log of record's partitions), by the partition they arrived on: a producer with another partitioner, an explicit partition, or partitions added to the requests topic. A delivery counts: one delivered again after its partition moved counts again (its rejection is recorded once).",
    ),
    M::counter(
        REQUESTS_REFUSED_TOTAL,
        "Requests refused by the access rules (`access`), by tenant (`unknown` for one not configured) and rule: rejected, never sent.",
    ),
    M::counter(
        STANDBY_EVENTS_TOTAL,
        "Kafka mode with kafka.standby: events of partitions owned elsewhere applied to this instance's copy as they were committed.",
    ),
    M::gauge(
        STANDBY_PARTITIONS,
        "Kafka mode with kafka.standby: partitions whose copy this instance keeps current (those it does not own, less any left alone after a failure).",
    )
    .in_unit(MetricUnit::Count),
    M::gauge(
        CONSUMER_LAG_MESSAGES,
        "Requests-topic consumer lag per topic and partition.",
    )
    .in_unit(MetricUnit::Count),
    M::gauge(
        CONSUMER_GROUP_SHARED,
        "1 while nothing is consumed because another instance is in the consumer group.",
    ),
    M::counter(
        INGEST_PAUSES_TOTAL,
        "Times the consumer paused its partitions because the requests in flight reached kafka.max_unfinished messages or kafka.max_unfinished_bytes bytes, or paused one partition at its share of them.",
    ),
    M::gauge(
        INGEST_PAUSED,
        "1 while the consumer's partitions are paused at the in-flight budget (a backlog the service is working through).",
    ),
    M::gauge(
        PARTITION_BLOCKED,
        "1 while a requests-topic partition is refused (recreated topic, or processed by another ledger).",
    ),
    M::histogram(
        PARTITION_TAKE_OVER_SECONDS,
        "Kafka mode: time to take a partition over (open its log, fencing the previous owner; restore; resume its tasks).",
    )
    .in_unit(MetricUnit::Seconds),
    M::counter(
        GROUP_REJOINS_TOTAL,
        "Kafka mode: times this instance left the consumer group and joined it again because it held no partition while requests waited, unconsumed, in partitions no member consumed, for two session timeouts and at least 30 s (a group that did not form).",
    ),
    M::counter(
        PARTITIONS_LOST_TOTAL,
        "Partitions this instance stopped processing without giving them up, by cause: `fenced` (kafka mode: another instance opened the partition's log), `failed` (kafka mode: a transaction of its log failed; taken over again while assigned), `late_commit` (kafka mode: a transaction of a log given up committed after the partition was owned here anew; taken over again so its restore reads it), `unrecorded` (kafka mode: events committed to its log could not be written to the ledger; taken over again), `session` (the consumer group took them away: this instance's session expired).",
    ),
    M::counter(
        REQUESTS_LOST_TOTAL,
        "Requests deleted from the requests topic before they were processed, by partition.",
    ),
    M::counter(
        RESULTS_PUBLISHED_TOTAL,
        "Result records acknowledged by Kafka.",
    ),
    M::histogram(
        LOG_BATCH_EVENTS,
        "Kafka mode: events per partition transaction.",
    )
    .in_unit(MetricUnit::Count),
    M::histogram(
        LOG_COMMIT_SECONDS,
        "Kafka mode: time of each transaction that commits a partition's batch of events (with its results and requests offset).",
    )
    .in_unit(MetricUnit::Seconds),
];
