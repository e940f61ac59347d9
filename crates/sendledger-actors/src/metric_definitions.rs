//! The metrics this crate records (see `sendledger_core::metric`). Recorded through these
//! constants only.

use sendledger_core::metric::MetricDefinition as M;

pub const ATTEMPTS_TOTAL: &str = "sendledger_attempts_total";
pub const LOOKUPS_TOTAL: &str = "sendledger_lookups_total";
pub const LEDGER_DURABILITY: &str = "sendledger_ledger_durability";
pub const DIVERGENT_HISTORIES_TOTAL: &str = "sendledger_divergent_histories_total";
pub const TASKS_PRUNED_TOTAL: &str = "sendledger_tasks_pruned_total";
pub const IDENTITIES_FORGOTTEN_TOTAL: &str = "sendledger_identities_forgotten_total";

pub const DEFINITIONS: &[M] = &[
    M::counter(
        ATTEMPTS_TOTAL,
        "Attempt outcomes recorded, by class (succeeded, rejected, not_sent, unknown).",
    ),
    M::counter(
        LOOKUPS_TOTAL,
        "Lookups at remotes, by outcome (none, one, several, error).",
    ),
    M::counter(
        DIVERGENT_HISTORIES_TOTAL,
        "Kafka mode: tasks whose log held two different histories (two owners each wrote one), found by a partition's restore; each goes to review.",
    ),
    M::counter(
        TASKS_PRUNED_TOTAL,
        "Settled tasks whose history retention removed (storage.retention), keeping their identity, payload hash and result.",
    ),
    M::counter(
        IDENTITIES_FORGOTTEN_TOTAL,
        "Removed tasks forgotten past storage.identity_retention: a later delivery of their request is a new task.",
    ),
    M::gauge(
        LEDGER_DURABILITY,
        "1 for the ledger's durability mode (sync, or buffered: appends not fsynced, unsafe for production).",
    ),
];
