//! Kafka mode: the take-over of assigned partitions through the `PartitionOwner` (their
//! logs opened and their state restored before their first message is handled), retried while
//! it fails, and the take-back of a partition whose log was lost while it is assigned here.
//!
//! A take-over runs on a thread of its own (opening a log may wait up to the transaction
//! timeout, and a restore reads the partition's history): the ingest's thread goes on polling,
//! handling the other partitions' messages and serving rebalances meanwhile, and looks at each
//! turn of its loop for the take-overs that ended. The partition stays paused until then.

use std::time::{Duration, Instant};

use rdkafka::consumer::Consumer;
use rdkafka::Offset;

use super::tracker::{lock, TakeOver};
use super::{Worker, WATERMARK_TIMEOUT};
use crate::sink::RequestSink;

/// Kafka mode: how long a partition whose take-over failed, or whose log failed, waits before
/// the next take-over.
const TAKE_OVER_RETRY: Duration = Duration::from_secs(5);
/// Kafka mode: how many session timeouts a partition whose log was fenced, but that is still
/// assigned here, waits before it is taken over again. A fencing comes with a rebalance that
/// moves the partition (this member's session expired, or another member was given the
/// partition), which this consumer learns of within a session; only a partition the group
/// still assigns here afterwards is taken back (whoever fenced it did so outside the group).
pub(super) const FENCED_RETAKE_SESSIONS: u32 = 2;
/// Kafka mode: take-overs (each opening a partition's log and reading it back) run at once.
const PARALLEL_TAKE_OVERS: usize = 8;

impl<S: RequestSink> Worker<S> {
    /// Kafka mode: settles the take-overs that ended, then starts one for every assigned
    /// partition not taken over yet (or whose failed take-over is due again), up to
    /// [`PARALLEL_TAKE_OVERS`] at once. A partition whose take-over fails stays paused, is
    /// reported as blocked, and is tried again after [`TAKE_OVER_RETRY`]; once taken over it
    /// is consumed from its committed offset.
    pub(super) fn take_over_assigned(&self) {
        let Some(owner) = &self.owner else {
            return;
        };
        self.settle_take_overs();
        let mut t = lock(&self.tracker);
        let room = PARALLEL_TAKE_OVERS.saturating_sub(t.taking_over.len());
        let now = Instant::now();
        let due: Vec<(i32, u64, bool)> = (t.parts.iter())
            .filter(|(i, p)| !p.owned && !t.taking_over.contains_key(i))
            .filter(|(_, p)| p.retry_take_over.is_none_or(|at| at <= now))
            .map(|(&i, p)| (i, p.generation, p.retry_take_over.is_some()))
            .take(room)
            .collect();
        let mut unstarted = Vec::new();
        for (partition, generation, retried) in due {
            let owner = owner.clone();
            let job = std::thread::Builder::new()
                .name(format!("sendledger-take-over-{partition}"))
                .spawn(move || owner.take_over(partition));
            match job {
                Ok(job) => {
                    let started = Instant::now();
                    let take_over = TakeOver {
                        job,
                        generation,
                        started,
                        retried,
                    };
                    t.taking_over.insert(partition, take_over);
                }
                Err(e) => unstarted.push((partition, generation, retried, e)),
            }
        }
        drop(t);
        for (partition, generation, retried, e) in unstarted {
            let why = format!("cannot start its thread: {e}");
            self.taken_over(partition, generation, retried, Instant::now(), Err(why));
        }
    }

    /// Settles the take-overs that ended.
    fn settle_take_overs(&self) {
        let ended: Vec<(i32, TakeOver)> = {
            let mut t = lock(&self.tracker);
            let ended: Vec<i32> = (t.taking_over.iter())
                .filter(|(_, r)| r.job.is_finished())
                .map(|(&p, _)| p)
                .collect();
            (ended.into_iter())
                .filter_map(|p| Some((p, t.taking_over.remove(&p)?)))
                .collect()
        };
        for (partition, r) in ended {
            let outcome = (r.job.join()).unwrap_or_else(|_| Err("the take-over panicked".into()));
            self.taken_over(partition, r.generation, r.retried, r.started, outcome);
        }
    }

    /// Waits for the take-overs under way to end (the ingest stops), and settles them. The
    /// consumer is polled meanwhile, so the member goes on answering the group: a rebalance
    /// under way is not held up by a member that stopped polling, and a partition revoked
    /// meanwhile is released (which ends its take-over). A message received now is not
    /// handled: its offset is not stored, and it is delivered again to whoever consumes next.
    pub(super) fn finish_take_overs(&self) {
        while !lock(&self.tracker).taking_over.is_empty() {
            let _ = self.consumer.poll(Duration::from_millis(20));
            self.settle_take_overs();
        }
    }

    /// Kafka mode: a partition whose log was given up (see [`PartitionOwner::lost`]) while it is
    /// assigned here stops like a revoked one (its unfinished messages are abandoned, its tasks
    /// stop) and is paused, then taken over again once due: after [`TAKE_OVER_RETRY`], or
    /// [`FENCED_RETAKE_SESSIONS`] session timeouts when another writer fenced it. Its messages are read again from the
    /// group's committed offset.
    ///
    /// [`PartitionOwner::lost`]: crate::sink::PartitionOwner::lost
    pub(super) fn retake_lost(&self) {
        let Some(owner) = &self.owner else {
            return;
        };
        for (partition, fenced) in owner.lost() {
            let retry_in = if fenced {
                self.fenced_retake
            } else {
                TAKE_OVER_RETRY
            };
            {
                let mut t = lock(&self.tracker);
                if !t.parts.get(&partition).is_some_and(|p| p.owned) {
                    continue;
                }
                t.assign(partition);
                if let Some(p) = t.parts.get_mut(&partition) {
                    p.retry_take_over = Some(Instant::now() + retry_in);
                }
            }
            // Paused with the next turn of the loop, until taken over again.
            owner.release(partition);
            let why = match fenced {
                true => "its log was fenced by another writer while the partition is assigned here",
                false => "a transaction of its log failed",
            };
            tracing::warn!(partition, retry_in = ?retry_in, "{why}; the partition is taken over again");
            self.stats
                .blocked
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(
                    partition,
                    format!("{why}; taken over again in {retry_in:?}"),
                );
        }
    }

    /// Records how the take-over of `partition` (begun at `started` in the partition's
    /// `generation`; `retried` after a failed one or a lost log) went. A partition revoked
    /// meanwhile was given up through the owner then: nothing more is done.
    fn taken_over(
        &self,
        partition: i32,
        generation: u64,
        retried: bool,
        started: Instant,
        outcome: std::result::Result<(), String>,
    ) {
        let current = lock(&self.tracker)
            .parts
            .get(&partition)
            .is_some_and(|p| p.generation == generation);
        if !current {
            tracing::info!(partition, outcome = ?outcome, "the partition was revoked during its take-over");
            return;
        }
        match outcome {
            Ok(()) => {
                tracing::info!(partition, took = ?started.elapsed(), "partition taken over");
                metrics::histogram!(crate::metric_definitions::PARTITION_TAKE_OVER_SECONDS)
                    .record(started.elapsed().as_secs_f64());
                if retried {
                    self.unblock(partition);
                }
                let mut t = lock(&self.tracker);
                let Some(p) = t.parts.get_mut(&partition) else {
                    return;
                };
                p.owned = true;
                p.retry_take_over = None;
                // Resumed with the next turn of the loop, from where its messages were left:
                // after a failed take-over or a lost log, from the group's committed offset
                // (its messages in flight then were abandoned); else from the first message
                // received before it was paused, if any.
                let from = match (retried, p.ignored_from.take()) {
                    (true, _) => None,
                    (false, Some(offset)) => Some(Offset::Offset(offset)),
                    (false, None) => return,
                };
                drop(t);
                let from = from.unwrap_or_else(|| {
                    self.committed(partition)
                        .map_or(Offset::Beginning, Offset::Offset)
                });
                if let Err(e) = self
                    .consumer
                    .seek(&self.topic, partition, from, WATERMARK_TIMEOUT)
                {
                    tracing::warn!(partition, error = %e, "cannot rewind the partition after its take-over");
                }
            }
            Err(why) => {
                tracing::error!(partition, error = %why, retry_in = ?TAKE_OVER_RETRY, "cannot take the partition over; it stays paused");
                self.stats
                    .blocked
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(partition, format!("cannot take the partition over: {why}"));
                let mut t = lock(&self.tracker);
                if let Some(p) = t.parts.get_mut(&partition) {
                    p.retry_take_over = Some(Instant::now() + TAKE_OVER_RETRY);
                }
            }
        }
    }

    fn unblock(&self, partition: i32) {
        self.stats
            .blocked
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&partition);
    }
}
