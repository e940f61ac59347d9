//! The metrics the service itself records (the admin endpoint's scrape-time gauges, kafka
//! mode's restores), and [`describe`], which gives the recorder the help text of every metric
//! of every crate. Recorded through these constants only.

use sendledger_core::metric::{MetricDefinition as M, MetricKind, MetricUnit};

pub const LEDGER_MEMORY_BYTES: &str = "sendledger_ledger_memory_bytes";
pub const PARTITIONS_OWNED: &str = "sendledger_partitions_owned";
pub const TASKS: &str = "sendledger_tasks";
pub const UNKNOWNS_OPEN: &str = "sendledger_unknowns_open";
pub const UNKNOWN_OLDEST_AGE_SECONDS: &str = "sendledger_unknown_oldest_age_seconds";
pub const PARTITION_RESTORE_SECONDS: &str = "sendledger_partition_restore_seconds";
pub const PARTITION_RESTORING: &str = "sendledger_partition_restoring";
pub const RESTORED_EVENTS_TOTAL: &str = "sendledger_restored_events_total";
pub const COPIES_TRUNCATED_TOTAL: &str = "sendledger_copies_truncated_total";
pub const SNAPSHOTS_WRITTEN_TOTAL: &str = "sendledger_snapshots_written_total";
pub const SNAPSHOTS_FAILED_TOTAL: &str = "sendledger_snapshots_failed_total";
pub const SNAPSHOT_TASKS: &str = "sendledger_snapshot_tasks";
pub const FRONT_REQUESTS_TOTAL: &str = "sendledger_front_requests_total";
pub const FRONT_REPLAYS_TOTAL: &str = "sendledger_front_replays_total";
pub const FRONT_CONFLICTS_TOTAL: &str = "sendledger_front_conflicts_total";
pub const FRONT_WAITS_TOTAL: &str = "sendledger_front_waits_total";
pub const FRONT_WAITING: &str = "sendledger_front_waiting";

pub const DEFINITIONS: &[M] = &[
    M::gauge(
        LEDGER_MEMORY_BYTES,
        "RocksDB's memory for the ledger: the budget (storage.memory_bytes), what its cache holds, and of that the write buffers.",
    )
    .in_unit(MetricUnit::Bytes),
    M::gauge(
        PARTITIONS_OWNED,
        "Kafka mode: requests partitions this instance owns (taken over and not lost).",
    ),
    M::gauge(TASKS, "Tasks in the ledger, by state."),
    M::gauge(
        UNKNOWNS_OPEN,
        "Tasks whose outcome is unknown and being reconciled.",
    ),
    M::gauge(
        UNKNOWN_OLDEST_AGE_SECONDS,
        "Age of the oldest open unknown outcome.",
    )
    .in_unit(MetricUnit::Seconds),
    M::histogram(
        PARTITION_RESTORE_SECONDS,
        "Kafka mode: time to read a partition's log from the checkpoint and apply it (part of the take-over).",
    )
    .in_unit(MetricUnit::Seconds),
    M::gauge(
        PARTITION_RESTORING,
        "Kafka mode: 1 while a partition is being restored from its log, by partition.",
    ),
    M::counter(
        RESTORED_EVENTS_TOTAL,
        "Kafka mode: events read from the log of record into the ledger while taking partitions over, by partition (grows step by step during a restore).",
    ),
    M::counter(
        SNAPSHOTS_WRITTEN_TOTAL,
        "Kafka mode: snapshots of partitions owned here written to the snapshots topic, by partition.",
    ),
    M::counter(
        SNAPSHOTS_FAILED_TOTAL,
        "Kafka mode: snapshots that could not be written, by partition (the reason is logged; the next interval tries again).",
    ),
    M::gauge(
        SNAPSHOT_TASKS,
        "Kafka mode: tasks in the latest snapshot written here, by partition and kind (kept: settled, by what retention keeps; events: the others).",
    ),
    M::counter(
        FRONT_REQUESTS_TOTAL,
        "Front door: answers, by route (submit, task) and HTTP status.",
    ),
    M::counter(
        FRONT_REPLAYS_TOTAL,
        "Front door: submissions whose key was known, answered from its task (never executed again).",
    ),
    M::counter(
        FRONT_CONFLICTS_TOTAL,
        "Front door: submissions whose key was used with another payload (422).",
    ),
    M::counter(
        FRONT_WAITS_TOTAL,
        "Front door: requests that waited for their task (Prefer: wait), by how the wait ended: ended (the task is terminal), timeout (the wait passed), refused (front.max_waiting reached).",
    ),
    M::gauge(
        FRONT_WAITING,
        "Front door: requests waiting for their task now (at most front.max_waiting).",
    ),
    M::counter(
        COPIES_TRUNCATED_TOTAL,
        "Kafka mode: take-overs that found the ledger's copy of a partition ahead of its log or apart from it (the brokers lost committed events), by partition; the copy is truncated to the log.",
    ),
];

/// Every metric of the service, crate by crate.
pub fn all() -> impl Iterator<Item = &'static M> {
    sendledger_store::metric_definitions::DEFINITIONS
        .iter()
        .chain(sendledger_actors::metric_definitions::DEFINITIONS)
        .chain(sendledger_effects::metric_definitions::DEFINITIONS)
        .chain(sendledger_kafka::metric_definitions::DEFINITIONS)
        .chain(DEFINITIONS)
}

/// Gives the installed recorder the `# HELP` text (and unit) of every metric.
pub fn describe() {
    for m in all() {
        let help = m.help;
        match (m.kind, m.unit.map(unit)) {
            (MetricKind::Counter, Some(u)) => metrics::describe_counter!(m.name, u, help),
            (MetricKind::Counter, None) => metrics::describe_counter!(m.name, help),
            (MetricKind::Gauge, Some(u)) => metrics::describe_gauge!(m.name, u, help),
            (MetricKind::Gauge, None) => metrics::describe_gauge!(m.name, help),
            (MetricKind::Histogram, Some(u)) => metrics::describe_histogram!(m.name, u, help),
            (MetricKind::Histogram, None) => metrics::describe_histogram!(m.name, help),
        }
    }
}

fn unit(u: MetricUnit) -> metrics::Unit {
    match u {
        MetricUnit::Seconds => metrics::Unit::Seconds,
        MetricUnit::Bytes => metrics::Unit::Bytes,
        MetricUnit::Count => metrics::Unit::Count,
    }
}
