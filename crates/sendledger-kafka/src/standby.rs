//! Kafka mode's standby copies (`kafka.standby`): an instance keeps its ledger's copy of every
//! partition it does not own current, applying what the partition's owner commits as it is
//! committed, as Kafka Streams' standby replicas do. A take-over of such a partition then
//! reads only the log's last moments instead of all it holds since the copy's checkpoint.
//!
//! One thread reads the events partitions followed with a `read_committed` consumer from each
//! copy's checkpoint on, and applies what it read in restore steps through a [`Copy`] (the
//! engine), each recorded with where it ends in the log: a standby step is a restore step, so
//! a take-over's copy check, tail re-read and truncation treat a standby's copy like any
//! other. A partition stops being followed when a take-over of it begins
//! ([`Standby::unfollow`] waits for the step being applied), and is followed again when it is
//! given up ([`Standby::follow`]). A standby never decides or sends anything: the engine
//! refuses to restore a partition it owns.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::Message as _;
use rdkafka::{Offset, TopicPartitionList};
use sendledger_core::error::Chain;
use sendledger_core::Event;

use crate::partition_log::{committed_reader_config, record_event};
use crate::take_over::{
    begin_from_snapshot, copy_checkpoint, Brokers, Copy, LastTransaction, Restore, QUIESCE,
    RESTORE_STEP,
};
use crate::Kafka;

/// How long read events wait before they are applied, at most: the standby's lag behind the
/// log, and so what a take-over may still have to read.
const APPLY_EVERY: Duration = Duration::from_millis(200);

/// How long a partition whose events could not be applied (or read) is left alone before it is
/// followed again.
const RETRY_AFTER: Duration = Duration::from_secs(10);

/// The standby of an instance: which partitions it follows, and the thread following them.
pub struct Standby {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

struct Shared {
    /// The partitions to follow, each with the number of its latest [`Standby::follow`].
    followed: Mutex<Followed>,
    /// Held by the thread while it applies a step (checking first that its partition is still
    /// followed), so that [`Standby::unfollow`] returns only once no step of the partition is
    /// being applied. [`Standby::follow`] does not wait for it.
    applying: Mutex<()>,
    stop: AtomicBool,
}

#[derive(Default)]
struct Followed {
    partitions: BTreeMap<i32, u64>,
    follows: u64,
}

impl Followed {
    fn follow(&mut self, partition: i32) {
        self.follows += 1;
        self.partitions.insert(partition, self.follows);
    }
}

impl Shared {
    fn followed(&self) -> MutexGuard<'_, Followed> {
        self.followed.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn applying(&self) -> MutexGuard<'_, ()> {
        self.applying.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A partition as the thread follows it.
struct Following {
    /// The [`Standby::follow`] it follows for.
    follow: u64,
    /// The offset of the next record to read.
    next: i64,
    /// Events read and not applied yet.
    read: Vec<Event>,
    tail: LastTransaction,
}

impl Standby {
    /// Starts following events partitions `0..partitions` of `kafka`'s events topic into
    /// `copy`, none of which may be owned here yet.
    pub fn start<C: Copy + Send + 'static>(
        kafka: &Kafka,
        copy: C,
        partitions: i32,
    ) -> crate::Result<Standby> {
        let mut client = committed_reader_config(kafka);
        // A log truncated below the position read (an unclean leader election) is reported,
        // not read past: the copy may hold events the log lost.
        client.set("auto.offset.reset", "error");
        let consumer: BaseConsumer = client.create()?;
        let kafka = kafka.clone();
        let shared = Arc::new(Shared {
            followed: Mutex::default(),
            applying: Mutex::default(),
            stop: AtomicBool::new(false),
        });
        {
            let mut followed = shared.followed();
            for partition in 0..partitions {
                followed.follow(partition);
            }
        }
        let thread = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("sendledger-standby".into())
                .spawn(move || run(&kafka, &consumer, &copy, &shared))
                .map_err(|_| crate::Error::Thread {
                    what: "kafka mode's standby",
                })?
        };
        Ok(Standby {
            shared,
            thread: Some(thread),
        })
    }

    /// Stops following `partition` (its take-over begins): returns once no step of it is
    /// being applied, and none will be until it is followed again.
    pub fn unfollow(&self, partition: i32) {
        self.shared.followed().partitions.remove(&partition);
        drop(self.shared.applying());
    }

    /// Follows `partition` (given up here) from its copy's checkpoint on.
    pub fn follow(&self, partition: i32) {
        self.shared.followed().follow(partition);
    }
}

impl Drop for Standby {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn run(kafka: &Kafka, consumer: &BaseConsumer, copy: &impl Copy, shared: &Shared) {
    let topic = kafka.config().events_topic.as_str();
    let mut following: BTreeMap<i32, Following> = BTreeMap::new();
    // Partitions left alone after a failure, until when, for which follow.
    let mut resting: BTreeMap<i32, (u64, Instant)> = BTreeMap::new();
    let mut assigned: Vec<(i32, u64)> = Vec::new();
    let mut applied_at = Instant::now();
    let applied = metrics::counter!(crate::metric_definitions::STANDBY_EVENTS_TOTAL);
    while !shared.stop.load(Ordering::SeqCst) {
        let wanted: Vec<(i32, u64)> = (shared.followed().partitions.iter())
            .map(|(&p, &f)| (p, f))
            .filter(|(p, f)| {
                (resting.get(p))
                    .is_none_or(|(rested, until)| rested != f || *until <= Instant::now())
            })
            .collect();
        if wanted != assigned {
            following.retain(|p, f| wanted.contains(&(*p, f.follow)));
            for &(partition, follow) in &wanted {
                if following.contains_key(&partition) {
                    continue;
                }
                if shared.stop.load(Ordering::SeqCst) {
                    return;
                }
                resting.remove(&partition);
                match start_following(kafka, copy, partition, QUIESCE) {
                    // Apart from its log: left as it is for its take-over to truncate.
                    Ok(None) => {
                        let never = Instant::now() + Duration::from_secs(365 * 24 * 3600);
                        resting.insert(partition, (follow, never));
                    }
                    Ok(Some(next)) => {
                        let f = Following {
                            follow,
                            next,
                            read: Vec::new(),
                            tail: LastTransaction::default(),
                        };
                        following.insert(partition, f);
                    }
                    Err(e) => {
                        tracing::warn!(partition, error = %e, "the standby cannot follow the partition for now");
                        resting.insert(partition, (follow, Instant::now() + RETRY_AFTER));
                    }
                }
            }
            let mut tpl = TopicPartitionList::new();
            for (&partition, f) in &following {
                let _ = tpl.add_partition_offset(topic, partition, Offset::Offset(f.next));
            }
            if let Err(e) = consumer.assign(&tpl) {
                tracing::warn!(error = %e, "the standby cannot read the events topic");
            }
            assigned = (following.iter()).map(|(&p, f)| (p, f.follow)).collect();
            metrics::gauge!(crate::metric_definitions::STANDBY_PARTITIONS)
                .set(following.len() as f64);
        }
        match consumer.poll(Duration::from_millis(50)) {
            Some(Ok(record)) => {
                let partition = record.partition();
                if let Some(f) = following.get_mut(&partition) {
                    // Records fetched for an earlier assignment are passed over.
                    if record.offset() >= f.next {
                        match record_event(&record) {
                            Ok(event) => {
                                let at = record.timestamp().to_millis().unwrap_or(0);
                                f.tail.read(record.offset(), at, &event);
                                f.next = record.offset() + 1;
                                f.read.push(event);
                            }
                            Err(e) => {
                                tracing::error!(partition, offset = record.offset(), error = %e, "the standby cannot decode a record of the partition's log; it leaves the partition alone for a while (its take-over will meet the same record)");
                                resting.insert(partition, (f.follow, Instant::now() + RETRY_AFTER));
                                following.remove(&partition);
                            }
                        }
                    }
                }
            }
            Some(Err(KafkaError::MessageConsumption(
                code @ (RDKafkaErrorCode::OffsetOutOfRange | RDKafkaErrorCode::LogTruncation),
            ))) => {
                // librdkafka does not say which partition: each is checked against its log
                // again before it is followed further.
                tracing::warn!(error = %code, "an events partition the standby follows was truncated below its position (the brokers lost committed events): every partition's copy is checked against its log again");
                following.clear();
                assigned.clear();
            }
            Some(Err(e)) => tracing::debug!(error = %e, "the standby's read of the events topic"),
            None => {}
        }
        let full = following.values().any(|f| f.read.len() >= RESTORE_STEP);
        if full || applied_at.elapsed() >= APPLY_EVERY {
            applied_at = Instant::now();
            let mut failed = Vec::new();
            for (&partition, f) in following.iter_mut().filter(|(_, f)| !f.read.is_empty()) {
                let _applying = shared.applying();
                // Unfollowed since it was read: a take-over has it now.
                if shared.followed().partitions.get(&partition) != Some(&f.follow) {
                    f.read.clear();
                    continue;
                }
                let events = std::mem::take(&mut f.read);
                match copy.restore(partition, events, f.tail.logged()) {
                    Ok(n) => applied.increment(n as u64),
                    Err(e) => {
                        tracing::warn!(partition, error = %e, "the standby could not apply the partition's events; it follows it again later");
                        failed.push((partition, f.follow));
                    }
                }
            }
            for (partition, follow) in failed {
                following.remove(&partition);
                resting.insert(partition, (follow, Instant::now() + RETRY_AFTER));
            }
        }
    }
}

/// Where a standby starts reading `partition` of `brokers`: its copy's checkpoint, once what
/// this instance committed of it while it owned it is written, and once the copy is found to
/// be what the log holds (as a take-over checks it); for a copy that holds nothing of the
/// partition, the end of its latest snapshot, applied first (as a take-over begins from it),
/// or the log's start. `None` when the copy is apart from its log: it is left as it is, for
/// its take-over to truncate.
fn start_following<B: Brokers>(
    brokers: &B,
    copy: &impl Copy,
    partition: i32,
    quiesce: Duration,
) -> Result<Option<i64>, String> {
    let ledger = copy.ledger();
    let chain = |e: sendledger_store::Error| Chain(&e).to_string();
    ledger.quiesce_blocking(partition, quiesce).map_err(chain)?;
    match copy_checkpoint(brokers, ledger, partition)? {
        (_, Some(why)) => {
            tracing::warn!(partition, why = %why, "the standby does not follow the partition: its copy is not what its log holds, and its take-over truncates it");
            Ok(None)
        }
        (Some(checkpoint), None) => Ok(Some(checkpoint.max(0))),
        (None, None) => {
            let mut restore = Restore::default();
            let begun = begin_from_snapshot(brokers, copy, partition, &mut restore, None)?;
            let start = brokers.log_start(partition)?;
            Ok(Some(begun.map_or(start, |m| m.tail_first.max(start))))
        }
    }
}

/// A standby's catching up on `partition` in one step, as the simulation takes it (the
/// service's standby reads continuously): the log read from where the standby starts reading
/// to its end and applied as one restore step, after waiting up to `quiesce` for a
/// transaction of the partition's last generation here. Returns the events applied.
pub fn catch_up<B: Brokers>(
    brokers: &B,
    copy: &impl Copy,
    partition: i32,
    quiesce: Duration,
) -> Result<usize, String> {
    let Some(from) = start_following(brokers, copy, partition, quiesce)? else {
        return Ok(0);
    };
    let (mut events, mut tail) = (Vec::new(), LastTransaction::default());
    brokers.read(partition, from, &mut |offset, timestamp, event| {
        tail.read(offset, timestamp, &event);
        events.push(event);
        Ok(())
    })?;
    if events.is_empty() {
        return Ok(0);
    }
    copy.restore(partition, events, tail.logged())
}
