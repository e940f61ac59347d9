//! The simulation's model of the brokers: the events topic's partitions with transactions,
//! the results topic, and the requests group's committed offsets. What it models is what
//! kafka mode's promise rests on: a transactional id's epoch fences every older writer, a
//! fenced writer's open transaction is aborted (or, like the test broker, committed with the
//! records that reached it), `read_committed` readers stop at the first open transaction and
//! skip aborted records, a transaction's offsets are refused from an older group generation,
//! and a commit may time out with its outcome unknown to its writer.
//!
//! A commit parks its writer (a journal thread of some instance) until the scheduler decides
//! its outcome, so every interleaving of commits with everything else is the seed's choice.

use std::collections::BTreeMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use sendledger_core::Event;
use sendledger_kafka::records::event_from_payload;
use sendledger_kafka::{Committed, LogBatch, LogError, LogRecord, TransactionalLog};

/// Whether a record's transaction is open, committed or aborted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Status {
    Open,
    Committed,
    Aborted,
}

/// One offset of an events partition: an event record or a transaction marker.
#[derive(Debug, Clone)]
enum Rec {
    Event(Box<Event>, Status),
    Marker,
}

/// A partition's open transaction.
struct Open {
    epoch: u64,
    /// Offsets of its event records.
    events: Vec<i64>,
    results: Vec<LogRecord>,
    /// The requests offset it commits, with the group generation it was sent in.
    offset: Option<(i64, u64)>,
}

/// How the scheduler ends a parked commit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    Commit,
    Abort,
    /// The writer hears nothing in time (its commit fails); the brokers committed it or not.
    TimedOut {
        committed: bool,
    },
}

struct Parked {
    instance: usize,
    partition: i32,
    epoch: u64,
    /// Offsets of its first and last event record.
    events: Option<(i64, i64)>,
    outcome: Option<Result<Committed, LogError>>,
}

#[derive(Default)]
struct State {
    /// The test broker's way: a fenced writer's open transaction is committed, not aborted.
    commits_fenced: bool,
    partitions: BTreeMap<i32, Vec<Rec>>,
    /// Committed result records, in order.
    results: Vec<LogRecord>,
    epochs: BTreeMap<i32, u64>,
    open: BTreeMap<i32, Open>,
    /// The requests group's committed offsets (the next offset to consume).
    offsets: BTreeMap<i32, i64>,
    group_generation: u64,
    parked: BTreeMap<u64, Parked>,
    next_park: u64,
    /// Open transactions (partition, epoch) a newer writer's init committed.
    committed_at_fencing: std::collections::BTreeSet<(i32, u64)>,
    /// Committed events the brokers lost.
    lost: Vec<Event>,
}

/// The brokers, shared by every instance's logs and the scheduler.
pub struct Broker {
    state: Mutex<State>,
    changed: Condvar,
}

impl Broker {
    pub fn new(commits_fenced: bool) -> Arc<Broker> {
        Arc::new(Broker {
            state: Mutex::new(State {
                commits_fenced,
                ..State::default()
            }),
            changed: Condvar::new(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Opens partition `partition`'s log anew (`init_transactions`): fences every older
    /// writer and ends its open transaction. The log commits at once until
    /// [`SimLog::park`] is called (a take-over's own writes happen within its step).
    pub fn init(self: &Arc<Broker>, instance: usize, partition: i32) -> SimLog {
        let mut s = self.lock();
        let epoch = {
            let e = s.epochs.entry(partition).or_default();
            *e += 1;
            *e
        };
        if let Some(open) = s.open.remove(&partition) {
            let fenced_commit = s.commits_fenced;
            if fenced_commit {
                s.committed_at_fencing.insert((partition, open.epoch));
            }
            // The test broker commits what reached it: the events (written and acknowledged
            // first), not the results written after them.
            s.end(partition, open, fenced_commit, false);
        }
        drop(s);
        self.changed.notify_all();
        SimLog {
            broker: self.clone(),
            instance,
            partition,
            epoch,
            parks: Default::default(),
        }
    }

    /// A new generation of the requests group (a rebalance).
    pub fn rebalance(&self) -> u64 {
        let mut s = self.lock();
        s.group_generation += 1;
        s.group_generation
    }

    /// The group's committed offset of requests partition `partition`.
    pub fn committed_offset(&self, partition: i32) -> i64 {
        self.lock().offsets.get(&partition).copied().unwrap_or(0)
    }

    /// The parked commits, in the order they parked.
    pub fn parked(&self) -> Vec<u64> {
        let s = self.lock();
        (s.parked.iter())
            .filter(|(_, p)| p.outcome.is_none())
            .map(|(&id, _)| id)
            .collect()
    }

    /// Whether a commit of instance `instance` on partition `partition` is parked.
    pub fn parked_on(&self, instance: usize, partition: i32) -> bool {
        let s = self.lock();
        (s.parked.values())
            .any(|p| p.instance == instance && p.partition == partition && p.outcome.is_none())
    }

    /// The parked commits of instance `instance`.
    pub fn parked_of(&self, instance: usize) -> Vec<u64> {
        let s = self.lock();
        (s.parked.iter())
            .filter(|(_, p)| p.instance == instance && p.outcome.is_none())
            .map(|(&id, _)| id)
            .collect()
    }

    /// Ends parked commit `id` as `ending` says (fenced if its epoch is not current).
    pub fn end(&self, id: u64, ending: Ending) {
        let mut s = self.lock();
        let Some(parked) = s.parked.get(&id) else {
            return;
        };
        let (partition, epoch, events) = (parked.partition, parked.epoch, parked.events);
        let outcome = if s.epochs.get(&partition) != Some(&epoch) {
            // The test broker, having committed the fenced writer's transaction, may answer
            // its commit as a success.
            match ending {
                Ending::Commit if s.committed_at_fencing.contains(&(partition, epoch)) => {
                    Ok(Committed {
                        events,
                        took: Duration::ZERO,
                    })
                }
                _ => Err(fenced(partition)),
            }
        } else {
            let open = s.open.remove(&partition).expect("a parked commit is open");
            let stale_group = open.offset.is_some_and(|(_, g)| g != s.group_generation);
            match ending {
                _ if stale_group => {
                    s.end(partition, open, false, false);
                    Err(LogError::Aborted {
                        partition,
                        detail: "the consumer's group generation is stale".into(),
                    })
                }
                Ending::Commit => {
                    s.end(partition, open, true, true);
                    Ok(Committed {
                        events,
                        took: Duration::ZERO,
                    })
                }
                Ending::Abort => {
                    s.end(partition, open, false, false);
                    Err(LogError::Aborted {
                        partition,
                        detail: "aborted by the scheduler".into(),
                    })
                }
                Ending::TimedOut { committed } => {
                    if committed {
                        s.end(partition, open, true, true);
                    } else {
                        // Still open: the next writer's init ends it.
                        s.open.insert(partition, open);
                    }
                    Err(LogError::Failed {
                        partition,
                        detail: "the commit timed out; its outcome is unknown".into(),
                    })
                }
            }
        };
        if let Some(p) = s.parked.get_mut(&id) {
            p.outcome = Some(outcome);
        }
        drop(s);
        self.changed.notify_all();
    }

    /// The committed events of `partition` from offset `from`, each with its offset, up to
    /// the first open transaction (`read_committed`), and the offset reading stopped at.
    pub fn read_committed(&self, partition: i32, from: i64) -> (Vec<(i64, Event)>, i64) {
        let s = self.lock();
        let records = s.partitions.get(&partition).map_or(&[][..], |r| &r[..]);
        let mut out = Vec::new();
        let mut end = from.max(0);
        for (offset, rec) in records.iter().enumerate().skip(from.max(0) as usize) {
            match rec {
                Rec::Event(_, Status::Open) => break,
                Rec::Event(e, Status::Committed) => out.push((offset as i64, (**e).clone())),
                Rec::Event(_, Status::Aborted) | Rec::Marker => {}
            }
            end = offset as i64 + 1;
        }
        (out, end)
    }

    /// An unclean leader election: partition `partition` loses its last committed transaction
    /// (acknowledged to its writer), and its writers are fenced (their producer state went
    /// with the old leader). Nothing happens while a transaction is open on it.
    pub fn lose_tail(&self, partition: i32) -> bool {
        let mut s = self.lock();
        if s.open.contains_key(&partition) {
            return false;
        }
        let records = s.partitions.entry(partition).or_default();
        let Some(last) = records
            .iter()
            .rposition(|r| matches!(r, Rec::Event(_, Status::Committed)))
        else {
            return false;
        };
        let start = records[..last]
            .iter()
            .rposition(|r| !matches!(r, Rec::Event(_, Status::Committed)))
            .map_or(0, |i| i + 1);
        let lost: Vec<Event> = (records.drain(start..).filter_map(|r| match r {
            Rec::Event(e, _) => Some(*e),
            Rec::Marker => None,
        }))
        .collect();
        s.lost.extend(lost);
        *s.epochs.entry(partition).or_default() += 1;
        true
    }

    /// Whether the brokers lost `event` (see [`Broker::lose_tail`]).
    pub fn lost(&self, event: &Event) -> bool {
        let s = self.lock();
        (s.lost.iter()).any(|l| {
            l.task_id == event.task_id && l.task_seq == event.task_seq && l.body == event.body
        })
    }

    /// The tasks the brokers lost events of.
    pub fn lost_tasks(&self) -> std::collections::BTreeSet<sendledger_core::TaskId> {
        self.lock().lost.iter().map(|e| e.task_id).collect()
    }

    /// The end of partition `partition` (its high watermark): the offset after its last record.
    pub fn end_offset(&self, partition: i32) -> i64 {
        self.lock().partitions.get(&partition).map_or(0, Vec::len) as i64
    }

    /// Every committed event of every partition, by partition, in log order.
    pub fn log(&self) -> BTreeMap<i32, Vec<Event>> {
        let partitions: Vec<i32> = self.lock().partitions.keys().copied().collect();
        (partitions.into_iter())
            .map(|p| {
                let (events, _) = self.read_committed(p, 0);
                (p, events.into_iter().map(|(_, e)| e).collect())
            })
            .collect()
    }

    /// The committed result records.
    pub fn results(&self) -> Vec<LogRecord> {
        self.lock().results.clone()
    }
}

fn fenced(partition: i32) -> LogError {
    LogError::Fenced {
        partition,
        detail: "a newer writer initialized the transactional id".into(),
    }
}

impl State {
    /// Ends `open` on `partition`: committed (with its results when `with_results`, and its
    /// requests offset) or aborted.
    fn end(&mut self, partition: i32, open: Open, commit: bool, with_results: bool) {
        let status = if commit {
            Status::Committed
        } else {
            Status::Aborted
        };
        let records = self.partitions.entry(partition).or_default();
        for offset in &open.events {
            if let Rec::Event(_, s) = &mut records[*offset as usize] {
                *s = status;
            }
        }
        records.push(Rec::Marker);
        if commit && with_results {
            self.results.extend(open.results);
            if let Some((offset, _)) = open.offset {
                self.offsets.insert(partition, offset);
            }
        }
    }
}

/// A writer of one events partition, of one epoch.
pub struct SimLog {
    broker: Arc<Broker>,
    instance: usize,
    partition: i32,
    epoch: u64,
    /// Whether commits park until the scheduler ends them.
    parks: std::sync::atomic::AtomicBool,
}

impl SimLog {
    /// From now on, commits wait for the scheduler.
    pub fn park(&self) {
        self.parks.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

impl TransactionalLog for SimLog {
    /// The requests group's generation.
    type Group = u64;

    fn partition(&self) -> i32 {
        self.partition
    }

    fn commit(&self, batch: &LogBatch, group: Option<&u64>) -> Result<Committed, LogError> {
        let partition = self.partition;
        if batch.next_request_offset.is_some() && group.is_none() {
            return Err(LogError::NoGroup { partition });
        }
        let mut s = self.broker.lock();
        if s.epochs.get(&partition) != Some(&self.epoch) {
            return Err(fenced(partition));
        }
        if s.open.contains_key(&partition) {
            // The last commit of this writer timed out and stayed open: a real producer is
            // unusable after that, and the replicator gives the log up; refuse like it.
            return Err(LogError::Failed {
                partition,
                detail: "a transaction of this writer is still open".into(),
            });
        }
        let records = s.partitions.entry(partition).or_default();
        let mut events = Vec::new();
        for record in &batch.events {
            let event = event_from_payload(&record.payload).map_err(|e| LogError::Failed {
                partition,
                detail: format!("a record the brokers cannot read back: {e}"),
            })?;
            events.push(records.len() as i64);
            records.push(Rec::Event(Box::new(event), Status::Open));
        }
        let offset = (batch.next_request_offset).zip(group.copied());
        let span = events.first().copied().zip(events.last().copied());
        s.open.insert(
            partition,
            Open {
                epoch: self.epoch,
                events,
                results: batch.results.clone(),
                offset,
            },
        );
        let id = s.next_park;
        s.next_park += 1;
        s.parked.insert(
            id,
            Parked {
                instance: self.instance,
                partition,
                epoch: self.epoch,
                events: span,
                outcome: None,
            },
        );
        if !self.parks.load(std::sync::atomic::Ordering::SeqCst) {
            drop(s);
            self.broker.end(id, Ending::Commit);
            s = self.broker.lock();
        } else {
            self.broker.changed.notify_all();
        }
        loop {
            if let Some(outcome) = s.parked.get_mut(&id).and_then(|p| p.outcome.take()) {
                s.parked.remove(&id);
                return outcome;
            }
            s = (self.broker.changed.wait(s)).unwrap_or_else(|e| e.into_inner());
        }
    }
}

impl std::fmt::Debug for Open {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "open transaction of epoch {}", self.epoch)
    }
}
