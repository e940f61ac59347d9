//! The consumer's context: what a rebalance does to the assigned partitions (assign, revoke,
//! the one-instance-per-group check of local mode), the lag gauge from librdkafka's
//! statistics, and what the ingest does through the consumer on the tracker's behalf: offset
//! stores and commits, and resuming partitions (with the fetchers woken).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance};
use rdkafka::error::{KafkaError, KafkaResult};
use rdkafka::statistics::Statistics;
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{ClientContext, TopicPartitionList};

use super::tracker::{lock, Done, Outcome, PartitionState, Tracker};
use super::{IngestStats, WATERMARK_TIMEOUT};
use crate::cluster::topic_partitions;
use crate::sink::PartitionOwner;

/// How long [`resume_and_wake`] waits for each answer that nobody reads.
const WAKE_TIMEOUT: Duration = Duration::from_millis(1);

/// The consumer's context: rebalance callbacks run inside `poll`, on the ingest thread.
pub(super) struct IngestContext {
    /// Kafka mode: partitions are given up through it when revoked.
    pub(super) owner: Option<Arc<dyn PartitionOwner>>,
    pub(super) tracker: Arc<Mutex<Tracker>>,
    pub(super) topic: String,
    pub(super) revoke_grace: Duration,
    pub(super) stats: Arc<IngestStats>,
    /// Set once the ingest stopped: the consumer is being closed, and an assignment that
    /// arrives now is not acted on. librdkafka does not answer a question about the
    /// assignment asked from a rebalance callback while it closes: the close hung on it.
    pub(super) closing: AtomicBool,
}

impl ClientContext for IngestContext {
    /// librdkafka's statistics, every `statistics.interval.ms`: the lag of each partition of
    /// the requests topic this consumer fetches (unknown lags, reported as -1, are skipped).
    fn stats(&self, statistics: Statistics) {
        let partitions = statistics.topics.get(&self.topic).map(|t| &t.partitions);
        for p in partitions.into_iter().flat_map(|p| p.values()) {
            if p.partition >= 0 && p.consumer_lag >= 0 {
                metrics::gauge!(crate::metric_definitions::CONSUMER_LAG_MESSAGES, "topic" => self.topic.clone(), "partition" => p.partition.to_string())
                    .set(p.consumer_lag as f64);
            }
        }
    }
}

impl ConsumerContext for IngestContext {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        let Rebalance::Revoke(tpl) = rebalance else {
            if let Rebalance::Error(e) = rebalance {
                tracing::warn!(error = %e, "rebalance error");
            }
            return;
        };
        let revoked = partitions_of(tpl, &self.topic);
        if consumer.assignment_lost() {
            // The group gave them away without asking this member: its session expired while
            // it was stopped or cut off. Whoever has them now may be processing their
            // messages already.
            for p in &revoked {
                tracing::warn!(partition = p, "partition lost to the group: this instance's session expired (it was stopped, or cut off from the group coordinator, for longer than session.timeout.ms); another instance may own it now, and its tasks stop here");
            }
            metrics::counter!(crate::metric_definitions::PARTITIONS_LOST_TOTAL, "cause" => "session")
                .increment(revoked.len() as u64);
        }
        let mut t = lock(&self.tracker);
        let deadline = Instant::now() + self.revoke_grace;
        let pending = |t: &Tracker| {
            revoked
                .iter()
                .filter_map(|p| t.parts.get(p))
                .map(|p| p.unfinished.messages)
                .sum::<usize>()
        };
        while pending(&t) > 0 && Instant::now() < deadline {
            match t.done_rx.recv_timeout(Duration::from_millis(20)) {
                Ok(done) => t.apply(consumer, &self.topic, done),
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            }
        }
        commit(consumer, CommitMode::Sync, &self.stats);
        for p in &revoked {
            // A take-over under way is given up too: it must not leave the partition owned.
            let owned =
                t.parts.get(p).is_some_and(|part| part.owned) || t.taking_over.contains_key(p);
            t.revoke(*p);
            if let (Some(owner), true) = (&self.owner, owned) {
                owner.release(*p);
            }
        }
        tracing::info!(partitions = ?revoked, "partitions revoked");
    }

    fn post_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        let Rebalance::Assign(tpl) = rebalance else {
            return;
        };
        let assigned = partitions_of(tpl, &self.topic);
        if self.closing.load(Ordering::SeqCst) {
            tracing::info!(partitions = ?assigned, "partitions assigned while the ingest stops; not consumed");
            return;
        }
        let mut t = lock(&self.tracker);
        for p in &assigned {
            t.assign(*p);
        }
        tracing::info!(partitions = ?assigned, "partitions assigned");
        if self.owner.is_none() {
            // Local mode: one instance per group.
            let sharing = self.sharing(consumer);
            let was_shared = std::mem::replace(&mut t.shared, sharing.is_some());
            metrics::gauge!(crate::metric_definitions::CONSUMER_GROUP_SHARED)
                .set(f64::from(u8::from(t.shared)));
            *self
                .stats
                .shared_group
                .lock()
                .unwrap_or_else(|e| e.into_inner()) = sharing.clone();
            match sharing {
                Some(why) => tracing::error!("{why}"),
                None if was_shared => {
                    tracing::info!("this instance holds every partition again; consuming")
                }
                None => {}
            }
        }
        // Kafka mode: each partition stays paused until it is taken over.
        sync_pauses(consumer, &self.topic, &mut t, &assigned);
    }
}

impl IngestContext {
    /// Why this instance must not consume: its assignment is not every partition of the
    /// requests topic, so another member of the group holds the rest (or is waiting for some).
    /// Each ledger knows only what its own instance processed, so a partition that moves to
    /// another instance would have its redelivered requests sent again. `None` when this
    /// instance holds every partition, or when the topic's partitions cannot be read (the
    /// processed-offsets check of each partition still refuses one another ledger processed).
    fn sharing(&self, consumer: &BaseConsumer<IngestContext>) -> Option<String> {
        let owned = match consumer.assignment() {
            Ok(all) => partitions_of(&all, &self.topic).len(),
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the assignment; the group is not checked");
                return None;
            }
        };
        let total = match topic_partitions(consumer, &self.topic, WATERMARK_TIMEOUT) {
            Ok(partitions) => partitions.len(),
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the topic's partitions; the group is not checked");
                return None;
            }
        };
        (total > 0 && owned < total).then(|| {
            format!(
                "this instance was assigned {owned} of the {total} partitions of {}: another \
                 instance is in its consumer group. Each instance's ledger knows only the requests \
                 it processed, so nothing is consumed while the group is shared (a request \
                 delivered again to another instance would be sent again). Run one instance per \
                 consumer group (give each its own `kafka.group_id` and requests topic), and \
                 stop the others",
                self.topic
            )
        })
    }
}

/// The partitions of a list that belong to `topic`.
fn partitions_of(tpl: &TopicPartitionList, topic: &str) -> Vec<i32> {
    tpl.elements_for_topic(topic)
        .iter()
        .map(|e| e.partition())
        .collect()
}

// Applying a finished message stores its partition's offset through the consumer, whose type
// names this context, and the context applies finished messages while it waits for the
// messages of revoked partitions: the two depend on each other, so they are kept together here,
// apart from the tracker's bookkeeping (tracker.rs).
impl Tracker {
    /// Applies a finished message; stores the partition's new done prefix.
    pub(super) fn apply(
        &mut self,
        consumer: &BaseConsumer<IngestContext>,
        topic: &str,
        done: Done,
    ) {
        let (key, seq) = &done.chain;
        if self.chains.get(key).is_some_and(|(s, _)| s == seq) {
            self.chains.remove(key);
        }
        if let Outcome::Fatal(e) = &done.outcome {
            self.fatal.get_or_insert_with(|| e.clone());
        }
        let part = match self.parts.get_mut(&done.partition) {
            Some(p) if p.generation == done.generation => p,
            _ => {
                self.orphans.finish(done.bytes);
                return;
            }
        };
        part.unfinished.finish(done.bytes);
        if !matches!(done.outcome, Outcome::Recorded) {
            return;
        }
        if let Ok(i) = part
            .inflight
            .binary_search_by_key(&done.offset, |(o, _)| *o)
        {
            part.inflight[i].1 = true;
        }
        if let Some(owner) = &self.owner {
            owner.done(done.partition, done.offset, consumer.group_metadata());
        }
        advance(consumer, topic, done.partition, part, self.owner.is_some());
    }
}

/// Pops the done prefix of a partition and, in local mode, stores the offset after it. (In
/// kafka mode the owner hears of each message done, and the partition's transactions commit
/// the offsets.)
pub(super) fn advance(
    consumer: &BaseConsumer<IngestContext>,
    topic: &str,
    partition: i32,
    part: &mut PartitionState,
    kafka_mode: bool,
) {
    let mut last = None;
    while let Some((offset, true)) = part.inflight.front().copied() {
        part.inflight.pop_front();
        last = Some(offset);
    }
    let Some(offset) = last else {
        return;
    };
    part.done_through = Some(offset);
    if kafka_mode {
        return;
    }
    // Stores `offset + 1`, the next offset to read.
    if let Err(e) = consumer.store_offset(topic, partition, offset) {
        tracing::debug!(partition, offset, error = %e, "offset not stored (partition no longer assigned)");
    }
}

pub(super) fn commit(
    consumer: &BaseConsumer<IngestContext>,
    mode: CommitMode,
    stats: &IngestStats,
) {
    match consumer.commit_consumer_state(mode) {
        Ok(()) => {
            stats.commits.fetch_add(1, Ordering::Relaxed);
        }
        Err(KafkaError::ConsumerCommit(RDKafkaErrorCode::NoOffset)) => {}
        Err(e) => {
            tracing::warn!(error = %e, "offset commit failed; it is retried at the next interval")
        }
    }
}

/// Pauses each assigned partition that [`Tracker::wants_pause`] and resumes each that no
/// longer does, through the consumer; the partitions of `fresh` (just assigned: the consumer
/// fetches them whatever was set before) are set either way.
pub(super) fn sync_pauses(
    consumer: &BaseConsumer<IngestContext>,
    topic: &str,
    t: &mut Tracker,
    fresh: &[i32],
) {
    let (mut pause, mut resume) = (TopicPartitionList::new(), TopicPartitionList::new());
    for (&i, p) in &t.parts {
        let wanted = t.wants_pause(p);
        if wanted != p.paused || fresh.contains(&i) {
            let list = if wanted { &mut pause } else { &mut resume };
            list.add_partition(topic, i);
        }
    }
    let mut set = |list: &TopicPartitionList, paused: bool| {
        if list.count() == 0 {
            return;
        }
        let res = match paused {
            true => consumer.pause(list),
            false => resume_and_wake(consumer, list),
        };
        match res {
            Ok(()) => {
                for e in list.elements() {
                    if let Some(p) = t.parts.get_mut(&e.partition()) {
                        p.paused = paused;
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, paused, "cannot pause or resume partitions"),
        }
    };
    set(&pause, true);
    set(&resume, false);
}

/// Resumes fetching `partitions`, and wakes the threads that fetch them.
///
/// librdkafka fetches a partition on the thread of its leader's connection. While every
/// partition of a connection is paused the thread has nothing to fetch and waits for its
/// socket or a request for up to a second, and a resume alone does not wake it (it only
/// clears the partitions' pause flag, on librdkafka's main thread). So after each pause at
/// the in-flight budget, fetching started again only up to a second later: with a backlog
/// the ingest received about `max_unfinished` messages a second, whatever the machine
/// (`sendledger-bench kafka` with a budget of 2,048: about 2,400 tasks a second, 14,000 with this wake-up,
/// on one machine).
/// A request queued for the leader's connection wakes its thread, which then sees the
/// partitions fetchable: a watermark query per partition, whose answer is not waited for
/// (queued before the wait starts; one given up is dropped by librdkafka).
pub(super) fn resume_and_wake(
    consumer: &BaseConsumer<IngestContext>,
    partitions: &TopicPartitionList,
) -> KafkaResult<()> {
    consumer.resume(partitions)?;
    for elem in partitions.elements() {
        let _ = consumer.fetch_watermarks(elem.topic(), elem.partition(), WAKE_TIMEOUT);
    }
    Ok(())
}
