//! Kafka mode: the take-over of assigned partitions through the `PartitionOwner` (their
//! logs opened and their state restored before their first message is handled), retried while
//! it fails, and the take-back of a partition whose log was lost while it is assigned here.

use std::time::{Duration, Instant};

use rdkafka::consumer::Consumer;
use rdkafka::{Offset, TopicPartitionList};

use super::rebalance::resume_and_wake;
use super::tracker::lock;
use super::{Worker, WATERMARK_TIMEOUT};
use crate::error::Result;
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
    /// Kafka mode: takes over every assigned partition not taken over yet (or whose failed
    /// take-over is due again). A partition whose take-over fails is paused, reported as
    /// blocked, and tried again after [`TAKE_OVER_RETRY`]; once taken over it is consumed
    /// from its committed offset.
    pub(super) fn take_over_assigned(&self) -> Result<()> {
        let Some(owner) = &self.owner else {
            return Ok(());
        };
        let due: Vec<(i32, bool)> = {
            let t = lock(&self.tracker);
            let now = Instant::now();
            t.parts
                .iter()
                .filter(|(_, p)| !p.owned && p.retry_take_over.is_none_or(|at| at <= now))
                .map(|(&i, p)| (i, p.retry_take_over.is_some()))
                .collect()
        };
        // Each take-over opens a log and reads it back: several run at once.
        for batch in due.chunks(PARALLEL_TAKE_OVERS) {
            let outcomes: Vec<_> = std::thread::scope(|scope| {
                let running: Vec<_> = batch
                    .iter()
                    .map(|&(partition, retried)| {
                        let started = Instant::now();
                        let job = scope.spawn(move || owner.take_over(partition));
                        (partition, retried, started, job)
                    })
                    .collect();
                running
                    .into_iter()
                    .map(|(partition, retried, started, job)| {
                        let outcome = job
                            .join()
                            .unwrap_or_else(|_| Err("the take-over panicked".into()));
                        (partition, retried, started, outcome)
                    })
                    .collect()
            });
            for (partition, retried, started, outcome) in outcomes {
                self.taken_over(partition, retried, started, outcome);
            }
        }
        Ok(())
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
            owner.release(partition);
            if let Err(e) = self.pause_partition(partition) {
                tracing::warn!(partition, error = %e, "cannot pause the partition");
            }
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

    /// Kafka mode: takes partition `partition` over, if it is assigned and not owned yet, and
    /// no earlier failure postponed it. Returns whether it is owned afterwards.
    pub(super) fn take_over(&self, partition: i32) -> Result<bool> {
        let Some(owner) = &self.owner else {
            return Ok(true);
        };
        let (needed, retry) = {
            let t = lock(&self.tracker);
            match t.parts.get(&partition) {
                None => return Ok(false),
                Some(p) => (!p.owned, p.retry_take_over),
            }
        };
        if !needed {
            return Ok(true);
        }
        if retry.is_some_and(|at| at > Instant::now()) {
            return Ok(false);
        }
        let started = Instant::now();
        let outcome = owner.take_over(partition);
        Ok(self.taken_over(partition, retry.is_some(), started, outcome))
    }

    /// Records how the take-over of `partition` (begun at `started`; `retried` after a failed
    /// one or a lost log) went; returns whether the partition is owned now.
    fn taken_over(
        &self,
        partition: i32,
        retried: bool,
        started: Instant,
        outcome: std::result::Result<(), String>,
    ) -> bool {
        match outcome {
            Ok(()) => {
                tracing::info!(partition, took = ?started.elapsed(), "partition taken over");
                metrics::histogram!(crate::metric_definitions::PARTITION_TAKE_OVER_SECONDS)
                    .record(started.elapsed().as_secs_f64());
                if retried {
                    self.unblock(partition);
                    self.rewind(partition);
                }
                let mut t = lock(&self.tracker);
                if let Some(p) = t.parts.get_mut(&partition) {
                    p.owned = true;
                    p.retry_take_over = None;
                }
                true
            }
            Err(why) => {
                tracing::error!(partition, error = %why, retry_in = ?TAKE_OVER_RETRY, "cannot take the partition over; it stays paused");
                if let Err(e) = self.pause_partition(partition) {
                    tracing::warn!(partition, error = %e, "cannot pause the partition");
                }
                self.stats
                    .blocked
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(partition, format!("cannot take the partition over: {why}"));
                let mut t = lock(&self.tracker);
                if let Some(p) = t.parts.get_mut(&partition) {
                    p.retry_take_over = Some(Instant::now() + TAKE_OVER_RETRY);
                }
                false
            }
        }
    }

    /// After a failed take-over the partition's position may be past messages that were
    /// fetched and ignored meanwhile: it is read again from the group's committed offset
    /// (nothing committed: from its beginning), then resumed.
    fn rewind(&self, partition: i32) {
        let from = self
            .committed(partition)
            .map_or(Offset::Beginning, Offset::Offset);
        if let Err(e) = self
            .consumer
            .seek(&self.topic, partition, from, WATERMARK_TIMEOUT)
        {
            tracing::warn!(partition, error = %e, "cannot rewind the partition after its take-over");
        }
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition(&self.topic, partition);
        if let Err(e) = resume_and_wake(&self.consumer, &tpl) {
            tracing::warn!(partition, error = %e, "cannot resume the partition");
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
