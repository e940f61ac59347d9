//! Kafka mode's replicator: the journal hands it each requests partition's events before the
//! ledger records them, and it writes them through the partition's [`PartitionLog`] in one
//! transaction, with the results they announce and the requests offset the partition's
//! consumer has completed. Only partitions this instance owns have a log here; events of any
//! other partition are refused as lost.
//!
//! Records written in kafka mode carry `lsn` 0: a ledger's LSNs are its own, and a task's
//! events may be recorded by several instances in turn. An event's position in the log of
//! record is its partition and offset; its id is `<task_id>:<task_seq>`.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};

use rdkafka::consumer::ConsumerGroupMetadata;
use sendledger_core::result::Projection;
use sendledger_core::{Event, NewEvent, TaskId};
use sendledger_store::{Replication, Replicator};

use crate::log::{LogBatch, LogError, LogRecord, PartitionLog};
use crate::records::{event_record, events_source, record_headers, results_source, RecordKind};

/// The requests offset a partition's next transaction commits for the group.
struct PendingCommit {
    next: i64,
    group: Arc<ConsumerGroupMetadata>,
}

#[derive(Default)]
struct Owned {
    logs: BTreeMap<i32, Arc<PartitionLog>>,
    commits: BTreeMap<i32, PendingCommit>,
    /// Per partition, the projections of the tasks of its latest batch (as the outbox
    /// publisher keeps them): a task with events in consecutive batches is not folded again.
    projections: BTreeMap<i32, HashMap<TaskId, Projection>>,
    /// Partitions whose log was given up after a failed transaction, not yet taken by
    /// [`LogReplicator::take_lost`], with whether another writer fenced it.
    lost: BTreeMap<i32, bool>,
}

/// The replicator of the partitions this instance owns. Cheap to share.
pub struct LogReplicator {
    owned: Mutex<Owned>,
    /// The CloudEvents sources of the event and result records (as the outbox publisher's).
    events_source: String,
    results_source: String,
}

impl LogReplicator {
    /// The replicator of consumer group `group_id`'s partitions.
    pub fn new(group_id: &str) -> LogReplicator {
        LogReplicator {
            owned: Mutex::default(),
            events_source: events_source(group_id),
            results_source: results_source(group_id),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Owned> {
        self.owned.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes partition `log.partition()` on: its events are written through `log` from now on.
    /// Call it once the log is open (the previous owner fenced) and the partition restored.
    pub fn own(&self, log: PartitionLog) {
        let mut owned = self.lock();
        let partition = log.partition();
        owned.logs.insert(partition, Arc::new(log));
        owned.projections.remove(&partition);
    }

    /// Gives partition `partition` up: its events are refused as lost from now on.
    pub fn release(&self, partition: i32) {
        let mut owned = self.lock();
        owned.logs.remove(&partition);
        owned.commits.remove(&partition);
        owned.projections.remove(&partition);
        owned.lost.remove(&partition);
    }

    /// The partitions whose log was given up after a failed transaction since the last call,
    /// each with whether another writer fenced it (see [`crate::sink::PartitionOwner::lost`]).
    pub fn take_lost(&self) -> Vec<(i32, bool)> {
        std::mem::take(&mut self.lock().lost).into_iter().collect()
    }

    /// Whether partition `partition` is owned (its log open and not fenced).
    pub fn owns(&self, partition: i32) -> bool {
        self.lock().logs.contains_key(&partition)
    }

    /// The requests consumer completed every message of `partition` before offset `next`:
    /// the partition's next transaction commits it for the group (`group`: the consumer's
    /// group metadata now).
    pub fn commit_requests(&self, partition: i32, next: i64, group: ConsumerGroupMetadata) {
        let mut owned = self.lock();
        if owned.logs.contains_key(&partition) {
            owned.commits.insert(
                partition,
                PendingCommit {
                    next,
                    group: Arc::new(group),
                },
            );
        }
    }

    /// The records of `events` and the projections of their tasks after them.
    fn batch(
        &self,
        partition: i32,
        events: &[NewEvent],
        history: &dyn Fn(TaskId) -> sendledger_store::Result<Vec<Event>>,
    ) -> Result<(LogBatch, HashMap<TaskId, Projection>), Replication> {
        let mut previous = self
            .lock()
            .projections
            .remove(&partition)
            .unwrap_or_default();
        let mut projections: HashMap<TaskId, Projection> = HashMap::new();
        let mut batch = LogBatch::default();
        for new in events {
            let event = new.clone().with_lsn(0);
            let projection = match projections.entry(event.task_id) {
                std::collections::hash_map::Entry::Occupied(slot) => slot.into_mut(),
                std::collections::hash_map::Entry::Vacant(slot) => {
                    slot.insert(match previous.remove(&event.task_id) {
                        Some(p) if p.next_seq() == event.task_seq => p,
                        _ => {
                            let history = history(event.task_id).map_err(|e| {
                                Replication::Failed(format!(
                                    "cannot read task {}'s events to project its results: {e}",
                                    event.task_id
                                ))
                            })?;
                            // Positioned as the log records them: results re-announced
                            // from this history must equal the records first published.
                            let unpositioned: Vec<Event> = history
                                .into_iter()
                                .take_while(|h| h.task_seq < event.task_seq)
                                .map(|h| Event { lsn: 0, ..h })
                                .collect();
                            Projection::of(&unpositioned)
                        }
                    })
                }
            };
            let result = projection.apply(&event);
            let (key, trace) = (projection.key(event.task_id), projection.traceparent());
            let record = event_record(&event);
            batch.events.push(LogRecord {
                key: key.clone(),
                payload: json(&record)?,
                headers: record_headers(
                    &record.event_id,
                    &self.events_source,
                    &RecordKind::Event(&record.kind).ce_type(),
                    record.at,
                    trace,
                ),
            });
            if let Some(result) = result {
                batch.results.push(LogRecord {
                    key,
                    payload: json(&result)?,
                    headers: record_headers(
                        &result.event_id,
                        &self.results_source,
                        &RecordKind::Result(result.status).ce_type(),
                        result.at,
                        trace,
                    ),
                });
            }
        }
        Ok((batch, projections))
    }
}

fn json(value: &impl serde::Serialize) -> Result<Vec<u8>, Replication> {
    serde_json::to_vec(value)
        .map_err(|e| Replication::Failed(format!("cannot encode a record: {e}")))
}

impl Replicator for LogReplicator {
    fn replicate(
        &self,
        partition: i32,
        events: &[NewEvent],
        history: &dyn Fn(TaskId) -> sendledger_store::Result<Vec<Event>>,
    ) -> Result<i64, Replication> {
        let Some(log) = self.lock().logs.get(&partition).cloned() else {
            return Err(Replication::Lost(format!(
                "requests partition {partition} is not assigned to this instance"
            )));
        };
        let (mut batch, projections) = self.batch(partition, events, history)?;
        let commit = self.lock().commits.remove(&partition);
        batch.next_request_offset = commit.as_ref().map(|c| c.next);
        let group = commit.as_ref().map(|c| c.group.as_ref());
        match log.commit(&batch, group) {
            Ok(committed) => {
                let mut owned = self.lock();
                if owned.logs.contains_key(&partition) {
                    owned.projections.insert(partition, projections);
                }
                metrics::histogram!("sendledger_log_commit_seconds")
                    .record(committed.took.as_secs_f64());
                metrics::histogram!("sendledger_log_batch_events").record(events.len() as f64);
                let (_, last) = committed.events.unwrap_or((-1, -1));
                Ok(last + 1)
            }
            Err(e) => {
                if let Some(commit) = commit {
                    // Not committed: the next transaction carries it (unless a later one came).
                    self.lock().commits.entry(partition).or_insert(commit);
                }
                Err(self.refused(partition, e))
            }
        }
    }
}

impl LogReplicator {
    /// What a failed transaction means for the partition: its log is given up and nothing of
    /// the batch is recorded. Fenced, the partition belongs to another instance now. Any other
    /// failure (an aborted transaction, a commit whose outcome is unknown, a failed producer)
    /// leaves tasks whose last events may or may not be in the log: the partition is taken
    /// over again (the log opened anew, which completes or aborts the open transaction,
    /// restored from the checkpoint, the tasks resumed from what was committed) rather than
    /// guessed at.
    fn refused(&self, partition: i32, e: LogError) -> Replication {
        let fenced = e.is_fenced();
        if fenced {
            tracing::warn!(partition, error = %e, "the partition's log of record is lost: another instance took the partition over; its tasks stop here");
            metrics::counter!("sendledger_partitions_fenced_total").increment(1);
        } else {
            tracing::warn!(partition, error = %e, "the partition's log of record is lost: a transaction failed; the partition is taken over again");
        }
        self.release(partition);
        self.lock().lost.insert(partition, fenced);
        Replication::Lost(e.to_string())
    }
}
