//! Kafka mode's replicator: the journal hands it each requests partition's events before the
//! ledger records them, and it writes them through the partition's [`PartitionLog`] in one
//! transaction, with the results they announce and the requests offset the partition's
//! consumer has completed. Only partitions this instance owns have a log here; events of any
//! other partition are refused as lost.
//!
//! Records written in kafka mode carry `lsn` 0: a ledger's LSNs are its own, and a task's
//! events may be recorded by several instances in turn. An event's position in the log of
//! record is its partition and offset; its id is `<task_id>:<task_seq>`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use sendledger_core::error::Chain;
use sendledger_core::result::event_id;
use sendledger_core::{Event, NewEvent, TaskId};
use sendledger_store::error::cause;
use sendledger_store::{Logged, Replication, Replicator};

use crate::partition_log::{
    Committed, LogBatch, LogError, LogRecord, PartitionLog, TransactionalLog,
};
use crate::projections::Projections;
use crate::records::{
    events_source, record_headers, results_source, Attributes, EventEncoding, RecordKind, JSON,
};

/// Kafka mode: the messages of a requests partition received since its offsets were last
/// committed for the group. A transaction commits the offset after the longest prefix of
/// them that is done (recorded by earlier transactions, or dropped as processed) or recorded
/// by the transaction itself: the offsets ride with the events that record their messages, as
/// in Kafka's consume-transform-produce transactions.
struct Frontier<G> {
    /// Offset → whether the message is done.
    messages: BTreeMap<i64, bool>,
    /// The requests consumer's group metadata, as last reported.
    group: Option<Arc<G>>,
    /// Since when done messages have waited for a transaction to commit their offsets.
    waiting_since: Option<Instant>,
}

impl<G> Default for Frontier<G> {
    fn default() -> Self {
        Frontier {
            messages: BTreeMap::new(),
            group: None,
            waiting_since: None,
        }
    }
}

impl<G> Frontier<G> {
    /// The offset a transaction recording the messages at `recorded` commits, if it commits
    /// one.
    fn next(&self, recorded: &BTreeSet<i64>) -> Option<i64> {
        self.messages
            .iter()
            .take_while(|(o, &done)| done || recorded.contains(o))
            .last()
            .map(|(o, _)| o + 1)
    }

    /// A transaction recorded the messages at `recorded` and committed `next`. The messages
    /// it recorded are done from now on, although the consumer may hear so only later.
    fn committed(&mut self, recorded: &BTreeSet<i64>, next: Option<i64>) {
        if let Some(next) = next {
            self.messages = self.messages.split_off(&next);
        }
        for offset in recorded {
            if let Some(done) = self.messages.get_mut(offset) {
                *done = true;
            }
        }
        self.waiting_since = match self.next(&BTreeSet::new()) {
            None => None,
            Some(_) => self.waiting_since.or_else(|| Some(Instant::now())),
        };
    }
}

/// A partition's log here, with its generation (see [`Replicator::generation`]).
struct OwnedLog<L> {
    generation: u64,
    log: Arc<L>,
}

struct Owned<L: TransactionalLog> {
    logs: BTreeMap<i32, OwnedLog<L>>,
    /// The generation of the last log taken on.
    last_generation: u64,
    frontiers: BTreeMap<i32, Frontier<L::Group>>,
    /// Per partition, the projections kept after its last committed transaction (as the
    /// outbox publisher keeps them): a task's next events are not folded from its history.
    projections: BTreeMap<i32, Projections>,
    /// Partitions whose log was given up after a failed transaction, not yet taken by
    /// [`LogReplicator::take_lost`], with whether another writer fenced it.
    lost: BTreeMap<i32, bool>,
    /// Logs given up or replaced while the lock was held: dropped once it is let go (see
    /// [`OwnedGuard`]).
    retired: Vec<OwnedLog<L>>,
}

/// The replicator's lock. A log given up while it is held is dropped after it is let go:
/// dropping the last handle of a partition's transactional producer purges, flushes and
/// destroys it, which waits on its brokers (seconds, with a broker gone), and every
/// partition's transactions take this lock. Dropped under it, one partition given up after a
/// broker failure held up the transactions of every other.
struct OwnedGuard<'a, L: TransactionalLog>(Option<MutexGuard<'a, Owned<L>>>);

impl<L: TransactionalLog> std::ops::Deref for OwnedGuard<'_, L> {
    type Target = Owned<L>;
    fn deref(&self) -> &Owned<L> {
        self.0.as_ref().expect("held until dropped")
    }
}

impl<L: TransactionalLog> std::ops::DerefMut for OwnedGuard<'_, L> {
    fn deref_mut(&mut self) -> &mut Owned<L> {
        self.0.as_mut().expect("held until dropped")
    }
}

impl<L: TransactionalLog> Drop for OwnedGuard<'_, L> {
    fn drop(&mut self) {
        let retired = (self.0.as_mut()).map(|g| std::mem::take(&mut g.retired));
        drop(self.0.take());
        drop(retired);
    }
}

impl<L: TransactionalLog> Default for Owned<L> {
    fn default() -> Self {
        Owned {
            logs: BTreeMap::new(),
            last_generation: 0,
            frontiers: BTreeMap::new(),
            projections: BTreeMap::new(),
            lost: BTreeMap::new(),
            retired: Vec::new(),
        }
    }
}

/// The replicator of the partitions this instance owns, writing through logs of type `L`
/// (the brokers' [`PartitionLog`], or a model of them). Cheap to share.
pub struct LogReplicator<L: TransactionalLog = PartitionLog> {
    owned: Mutex<Owned<L>>,
    /// The CloudEvents sources of the event and result records (as the outbox publisher's).
    events_source: String,
    results_source: String,
    encoding: EventEncoding,
}

impl<L: TransactionalLog> LogReplicator<L> {
    /// The replicator of consumer group `group_id`'s partitions, writing event records in JSON.
    pub fn new(group_id: &str) -> LogReplicator<L> {
        LogReplicator {
            owned: Mutex::default(),
            events_source: events_source(group_id),
            results_source: results_source(group_id),
            encoding: EventEncoding::Json,
        }
    }

    /// Writes event records in `encoding` (`kafka.events_encoding`).
    pub fn with_events_encoding(self, encoding: EventEncoding) -> LogReplicator<L> {
        LogReplicator { encoding, ..self }
    }

    fn lock(&self) -> OwnedGuard<'_, L> {
        OwnedGuard(Some(self.owned.lock().unwrap_or_else(|e| e.into_inner())))
    }

    /// Takes partition `log.partition()` on: its events are written through `log` from now on.
    /// Call it once the log is open (the previous owner fenced) and the partition restored.
    pub fn own(&self, log: L) {
        let mut owned = self.lock();
        let partition = log.partition();
        owned.last_generation += 1;
        let generation = owned.last_generation;
        let log = Arc::new(log);
        if let Some(replaced) = owned.logs.insert(partition, OwnedLog { generation, log }) {
            owned.retired.push(replaced);
        }
        owned.projections.remove(&partition);
    }

    /// The result records `events` (of requests partition `partition`, in log order) announce,
    /// exactly as the partition's owner makes them: how a log is written as its owner writes it
    /// without running the owner (the restore benchmark's log). `history` reads a task's
    /// events before `events`.
    pub fn results_of(
        &self,
        partition: i32,
        events: &[Event],
        history: &dyn Fn(TaskId) -> sendledger_store::Result<Vec<Event>>,
    ) -> Result<Vec<LogRecord>, Replication> {
        let new: Vec<NewEvent> = (events.iter())
            .map(|e| NewEvent {
                task_id: e.task_id,
                task_seq: e.task_seq,
                at: e.at,
                body: e.body.clone(),
            })
            .collect();
        Ok(self.batch(partition, &new, history)?.0.results)
    }

    /// Gives partition `partition` up: its events are refused as lost from now on.
    pub fn release(&self, partition: i32) {
        self.lock().forget(partition);
    }

    /// The partitions whose log was given up after a failed transaction since the last call,
    /// each with whether another writer fenced it (see [`crate::sink::PartitionOwner::lost`]).
    pub fn take_lost(&self) -> Vec<(i32, bool)> {
        std::mem::take(&mut self.lock().lost).into_iter().collect()
    }

    /// The partitions whose done messages have waited at least `age` for a transaction to
    /// commit their offsets: no events came to carry them (every delivery was dropped as
    /// processed, or the tasks' last events went before their messages were done). Each
    /// deserves an append with `commit_offsets`, which the journal orders with the
    /// partition's transactions.
    pub fn waiting_commits(&self, age: Duration) -> Vec<i32> {
        self.lock()
            .frontiers
            .iter()
            .filter(|(_, f)| f.waiting_since.is_some_and(|at| at.elapsed() >= age))
            .map(|(&p, _)| p)
            .collect()
    }

    /// Whether partition `partition` is owned (its log open and not fenced).
    pub fn owns(&self, partition: i32) -> bool {
        self.lock().logs.contains_key(&partition)
    }

    /// The requests consumer received message `offset` of `partition` (see
    /// [`crate::sink::PartitionOwner::received`]); `group` is its group metadata now, if it has
    /// any.
    pub fn received(&self, partition: i32, offset: i64, group: Option<L::Group>) {
        self.update(partition, group, |frontier| {
            frontier.messages.entry(offset).or_insert(false);
        });
    }

    /// Message `offset` of `partition` is done (see [`crate::sink::PartitionOwner::done`]);
    /// `group` is the consumer's group metadata now, if it has any.
    pub fn done(&self, partition: i32, offset: i64, group: Option<L::Group>) {
        self.update(partition, group, |frontier| {
            if let Some(done) = frontier.messages.get_mut(&offset) {
                *done = true;
            }
            if frontier.waiting_since.is_none() && frontier.next(&BTreeSet::new()).is_some() {
                frontier.waiting_since = Some(Instant::now());
            }
        });
    }

    /// Applies `change` to the frontier of `partition`, if it is owned.
    fn update(
        &self,
        partition: i32,
        group: Option<L::Group>,
        change: impl FnOnce(&mut Frontier<L::Group>),
    ) {
        let mut owned = self.lock();
        if !owned.logs.contains_key(&partition) {
            return;
        }
        let frontier = owned.frontiers.entry(partition).or_default();
        if let Some(group) = group {
            frontier.group = Some(Arc::new(group));
        }
        change(frontier);
    }

    /// The records of `events` and the projections of their tasks after them.
    fn batch(
        &self,
        partition: i32,
        events: &[NewEvent],
        history: &dyn Fn(TaskId) -> sendledger_store::Result<Vec<Event>>,
    ) -> Result<(LogBatch, Projections), Replication> {
        let mut projections = self
            .lock()
            .projections
            .remove(&partition)
            .unwrap_or_default();
        projections.start_batch();
        let mut batch = LogBatch::default();
        for new in events {
            let event = new.clone().with_lsn(0);
            let (projection, _) = projections.before(&event, || {
                let history = history(event.task_id).map_err(|e| {
                    Replication::Failed(cause(format!(
                        "cannot read task {}'s events to project its results: {}",
                        event.task_id,
                        Chain(&e)
                    )))
                })?;
                // Positioned as the log records them (what retention kept of a removed
                // history too): results re-announced from this history must equal the records
                // first published.
                Ok(history.into_iter().map(as_logged).collect())
            })?;
            let result = projection.apply(&event);
            let (key, trace) = (projection.key(event.task_id), projection.traceparent());
            batch.events.push(LogRecord {
                key: key.clone(),
                payload: (self.encoding.payload(&event))
                    .map_err(|e| Replication::Failed(Arc::new(e)))?,
                headers: record_headers(&Attributes {
                    id: &event_id(event.task_id, event.task_seq),
                    source: &self.events_source,
                    kind: &RecordKind::Event(event.body.name()).ce_type(),
                    content_type: self.encoding.content_type(),
                    at_ms: event.at,
                    trace,
                }),
            });
            if let Some(result) = result {
                batch.results.push(LogRecord {
                    key,
                    payload: json(&result)?,
                    headers: record_headers(&Attributes {
                        id: &result.event_id,
                        source: &self.results_source,
                        kind: &RecordKind::Result(result.status).ce_type(),
                        content_type: JSON,
                        at_ms: result.at,
                        trace,
                    }),
                });
            }
        }
        projections.end_batch();
        Ok((batch, projections))
    }
}

/// `event` with no position in this ledger, as the log records it and as the results first
/// published from it name it.
fn as_logged(mut event: Event) -> Event {
    event.lsn = 0;
    if let sendledger_core::EventBody::Pruned { retained } = &mut event.body {
        retained.result_lsn = 0;
    }
    event
}

fn json(value: &impl serde::Serialize) -> Result<Vec<u8>, Replication> {
    serde_json::to_vec(value).map_err(|e| Replication::Failed(Arc::new(crate::Error::Encode(e))))
}

impl<L: TransactionalLog> Replicator for LogReplicator<L> {
    fn generation(&self, partition: i32) -> Option<u64> {
        self.lock().logs.get(&partition).map(|l| l.generation)
    }

    fn replicate(
        &self,
        partition: i32,
        generation: u64,
        events: &[NewEvent],
        history: &dyn Fn(TaskId) -> sendledger_store::Result<Vec<Event>>,
    ) -> Result<Option<Logged>, Replication> {
        let log = match self.lock().logs.get(&partition) {
            Some(l) if l.generation == generation => l.log.clone(),
            Some(_) => {
                return Err(Replication::Lost(cause(format!(
                    "requests partition {partition} was taken over anew since these events were decided"
                ))))
            }
            None => {
                return Err(Replication::Lost(cause(format!(
                    "requests partition {partition} is not assigned to this instance"
                ))))
            }
        };
        // The messages this batch records: committed with it, their offsets may be too.
        let recorded: BTreeSet<i64> = events
            .iter()
            .filter_map(|e| e.body.source())
            .filter(|source| source.partition == partition)
            .map(|source| source.offset)
            .collect();
        let (next, group) = {
            let owned = self.lock();
            let frontier = owned.frontiers.get(&partition);
            let group = frontier.and_then(|f| f.group.clone());
            // Without the group's metadata (no message done yet) offsets wait for a later
            // transaction.
            let next = frontier
                .and_then(|f| f.next(&recorded))
                .filter(|_| group.is_some());
            (next, group)
        };
        if events.is_empty() && next.is_none() {
            // A turn for offsets that an earlier transaction already carried.
            return Ok(None);
        }
        let (mut batch, projections) = self.batch(partition, events, history)?;
        batch.next_request_offset = next;
        let outcome = log.commit(&batch, group.as_deref());
        if let Ok(committed) = &outcome {
            metrics::histogram!(crate::metric_definitions::LOG_COMMIT_SECONDS)
                .record(committed.took.as_secs_f64());
            metrics::histogram!(crate::metric_definitions::LOG_BATCH_EVENTS)
                .record(events.len() as f64);
        }
        self.finished(partition, generation, outcome, &recorded, next, projections)
    }

    fn unrecorded(&self, partition: i32) {
        let mut owned = self.lock();
        if owned.logs.contains_key(&partition) {
            owned.lose(partition, false, "unrecorded");
        }
    }
}

impl<L: TransactionalLog> LogReplicator<L> {
    /// Takes in the outcome of a transaction written through the log of generation
    /// `generation`, which was partition `partition`'s log when the transaction began. The partition may have been revoked
    /// meanwhile, and even owned again through a new log: what the transaction's outcome says
    /// about its writer concerns that writer only (a transaction of a log given up earlier,
    /// failing late, must not give up the new one).
    fn finished(
        &self,
        partition: i32,
        generation: u64,
        outcome: Result<Committed, LogError>,
        recorded: &BTreeSet<i64>,
        next: Option<i64>,
        projections: Projections,
    ) -> Result<Option<Logged>, Replication> {
        match outcome {
            Ok(committed) => {
                let mut owned = self.lock();
                if !owned.is_current(partition, generation) {
                    return Err(owned.committed_late(partition));
                }
                owned.projections.insert(partition, projections);
                if let Some(frontier) = owned.frontiers.get_mut(&partition) {
                    frontier.committed(recorded, next);
                }
                Ok((committed.events).map(|(first, last)| Logged {
                    first,
                    next: last + 1,
                }))
            }
            Err(e) => Err(self.refused(partition, generation, e)),
        }
    }

    /// What a failed transaction means for the partition: its log is given up and nothing of
    /// the batch is recorded. Fenced, the partition belongs to another instance now. Any other
    /// failure (an aborted transaction, a commit whose outcome is unknown, a failed producer)
    /// leaves tasks whose last events may or may not be in the log: the partition is taken
    /// over again (the log opened anew, which completes or aborts the open transaction,
    /// restored from the checkpoint, the tasks resumed from what was committed) rather than
    /// guessed at. A transaction of a log that is not the partition's any more (revoked while
    /// it was under way, such as the commit of an instance that was stopped past its session)
    /// says nothing about the partition now: only its own batch is refused.
    fn refused(&self, partition: i32, generation: u64, e: LogError) -> Replication {
        let fenced = e.is_fenced();
        {
            let mut owned = self.lock();
            if !owned.is_current(partition, generation) {
                drop(owned);
                tracing::info!(partition, error = %e, "a transaction of a log this instance had already given up failed; its batch is not recorded");
                return Replication::Lost(Arc::new(e));
            }
            if fenced {
                tracing::warn!(partition, error = %e, "the partition's log of record is lost: another instance took the partition over; its tasks stop here");
                owned.lose(partition, true, "fenced");
            } else {
                tracing::warn!(partition, error = %e, "the partition's log of record is lost: a transaction failed; the partition is taken over again");
                owned.lose(partition, false, "failed");
            }
        }
        Replication::Lost(Arc::new(e))
    }
}

impl<L: TransactionalLog> Owned<L> {
    /// Whether the log of generation `generation` is partition `partition`'s log now.
    fn is_current(&self, partition: i32, generation: u64) -> bool {
        self.logs
            .get(&partition)
            .is_some_and(|current| current.generation == generation)
    }

    /// A transaction of a log given up since it began committed: its events are in the log of
    /// record, but the partition's tasks were (or will be) resumed from a restore that may have
    /// read the log before them. Nothing of the batch is recorded here, so it cannot overwrite
    /// that restore's summaries or checkpoint; and a partition owned here anew is taken over
    /// again, its restore reading the log with the late commit in it, so that no task is worked
    /// from a copy that lacks committed events (a second intent at a sequence number already
    /// taken).
    fn committed_late(&mut self, partition: i32) -> Replication {
        if self.logs.contains_key(&partition) {
            tracing::warn!(partition, "a transaction of a log given up committed after the partition was taken over anew; the partition is taken over again so its restore reads it");
            self.lose(partition, false, "late_commit");
        } else {
            tracing::info!(partition, "a transaction of a log this instance had already given up committed; its events are the next owner's to restore");
        }
        Replication::Lost(cause(format!(
            "requests partition {partition} was taken over anew while these events committed; they are restored from the log"
        )))
    }

    /// Gives partition `partition`'s log up without its owner having released it, for
    /// [`LogReplicator::take_lost`] to report (`fenced`: another writer took it), counted by
    /// `cause`.
    fn lose(&mut self, partition: i32, fenced: bool, cause: &'static str) {
        self.forget(partition);
        self.lost.insert(partition, fenced);
        metrics::counter!(crate::metric_definitions::PARTITIONS_LOST_TOTAL, "cause" => cause)
            .increment(1);
    }

    /// Gives partition `partition`'s log and what goes with it up.
    fn forget(&mut self, partition: i32) {
        if let Some(gone) = self.logs.remove(&partition) {
            self.retired.push(gone);
        }
        self.frontiers.remove(&partition);
        self.projections.remove(&partition);
        self.lost.remove(&partition);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Kafka, KafkaConfig};

    /// Each log taken on is a new generation of its partition. A transaction of a log that is
    /// not its partition's any more (the partition was revoked while it was under way, then
    /// owned again through a new log) fails alone: the new log stays and nothing is reported
    /// lost. The same failure of the current log gives the
    /// partition up and reports it.
    #[test]
    fn a_late_failure_of_a_log_given_up_costs_the_partition_nothing() {
        let kafka = Kafka::connect(KafkaConfig::default()).unwrap();
        let open = || PartitionLog::open(&kafka, 0, Duration::from_secs(20)).unwrap();
        let replicator = LogReplicator::<PartitionLog>::new("group");
        replicator.own(open());
        assert_eq!(replicator.generation(0), Some(1));
        replicator.release(0);
        assert_eq!(replicator.generation(0), None);
        replicator.own(open());
        assert_eq!(replicator.generation(0), Some(2), "taken over anew");
        let fail = |generation: u64| {
            let fenced = LogError::Fenced {
                partition: 0,
                detail: "fenced by a newer writer".into(),
            };
            let outcome = Err(fenced);
            replicator.finished(
                0,
                generation,
                outcome,
                &BTreeSet::new(),
                None,
                Projections::default(),
            )
        };

        assert!(
            matches!(fail(1), Err(Replication::Lost(_))),
            "its batch is refused"
        );
        assert!(replicator.owns(0), "the new log was given up");
        assert!(replicator.take_lost().is_empty());

        assert!(matches!(fail(2), Err(Replication::Lost(_))));
        assert!(!replicator.owns(0));
        assert_eq!(replicator.take_lost(), [(0, true)]);
    }

    /// A transaction of a log given up that commits anyway (its outcome came after the
    /// partition was taken over anew) is not settled here: its batch is refused, so it writes no
    /// summary or checkpoint over the new take-over's restore, and the partition, owned anew, is
    /// given up to be taken over again (its restore then reads the late commit). Refused alone
    /// when the partition is not owned here at all.
    #[test]
    fn a_late_commit_of_a_log_given_up_is_restored_not_settled() {
        let kafka = Kafka::connect(KafkaConfig::default()).unwrap();
        let open = || PartitionLog::open(&kafka, 0, Duration::from_secs(20)).unwrap();
        let replicator = LogReplicator::<PartitionLog>::new("group");
        let commit = |generation: u64| {
            let committed = Committed {
                events: Some((40, 41)),
                took: Duration::from_millis(3),
            };
            replicator.finished(
                0,
                generation,
                Ok(committed),
                &BTreeSet::new(),
                None,
                Projections::default(),
            )
        };
        replicator.own(open());
        assert_eq!(
            commit(1).unwrap(),
            Some(Logged {
                first: 40,
                next: 42
            }),
            "the current log's commit is settled"
        );
        replicator.release(0);
        assert!(matches!(commit(1), Err(Replication::Lost(_))));
        assert!(
            replicator.take_lost().is_empty(),
            "not owned: nothing to take over"
        );

        replicator.own(open());
        assert_eq!(replicator.generation(0), Some(2));
        assert!(matches!(commit(1), Err(Replication::Lost(_))));
        assert!(!replicator.owns(0), "given up, to be taken over again");
        assert_eq!(replicator.take_lost(), [(0, false)]);
    }

    fn frontier(messages: &[(i64, bool)]) -> Frontier<()> {
        Frontier {
            messages: messages.iter().copied().collect(),
            ..Frontier::default()
        }
    }

    /// A transaction commits the offset after the messages that are done or that it records,
    /// up to the first that is neither; gaps in the offsets (transaction markers, deleted
    /// records) are no messages and do not stop it.
    #[test]
    fn a_transaction_commits_the_offsets_of_what_it_records_and_what_is_done() {
        let f = frontier(&[(4, true), (5, false), (7, false), (9, true), (10, false)]);
        assert_eq!(f.next(&BTreeSet::new()), Some(5));
        assert_eq!(f.next(&BTreeSet::from([5])), Some(6));
        assert_eq!(f.next(&BTreeSet::from([5, 7])), Some(10));
        assert_eq!(f.next(&BTreeSet::from([5, 7, 10])), Some(11));
        assert_eq!(f.next(&BTreeSet::from([7, 10])), Some(5), "5 is neither");
        assert_eq!(frontier(&[(3, false)]).next(&BTreeSet::new()), None);
        assert_eq!(frontier(&[]).next(&BTreeSet::from([3])), None);
    }

    /// What a transaction committed is forgotten; what it recorded is done although the
    /// consumer has not said so yet; done messages after it wait for the next transaction.
    #[test]
    fn committed_offsets_are_forgotten_and_what_is_left_waits() {
        let mut f = frontier(&[(4, true), (5, false), (6, true), (7, false), (8, false)]);
        f.committed(&BTreeSet::from([5, 8]), Some(6));
        assert_eq!(
            f.messages,
            BTreeMap::from([(6, true), (7, false), (8, true)])
        );
        assert!(f.waiting_since.is_some(), "6 is done and not committed");
        assert_eq!(
            f.next(&BTreeSet::from([7])),
            Some(9),
            "8 was recorded before"
        );
        f.committed(&BTreeSet::from([7]), Some(9));
        assert!(f.messages.is_empty());
        assert!(f.waiting_since.is_none());
    }
}
