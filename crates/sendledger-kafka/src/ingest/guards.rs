//! The partition guards. At its first message after an assignment a partition's processed
//! offsets are read from the ledger and checked against the topic and the group: a topic
//! recreated under the ledger, or a partition another ledger processed, is refused (blocked);
//! offsets deleted before they were processed are counted as requests lost. Each message is
//! then admitted against them: a processed offset is dropped as a duplicate, and offsets the
//! consumer's position jumped over are checked for deletion.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use rdkafka::consumer::Consumer;
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};
use sendledger_store::Processed;

use super::rebalance::advance;
use super::tracker::{lock, Load};
use super::{Worker, RETRY_INITIAL, RETRY_MAX, WATERMARK_TIMEOUT};
use crate::error::{Error, Result};
use crate::sink::{RequestSink, SinkError};

impl<S: RequestSink> Worker<S> {
    /// Checks a newly assigned partition against the ledger's processed offsets. Returns
    /// whether it must be refused (see [`Worker::refusal`]), and the offset through which it is
    /// accounted for (processed, or lost). Unprocessed offsets below the partition's start
    /// were deleted before they were processed: counted as lost.
    fn check_partition(&self, partition: i32, processed: &Processed) -> (bool, Option<i64>) {
        let was_blocked = self
            .stats
            .blocked
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&partition)
            .is_some();
        if was_blocked {
            metrics::gauge!(crate::metric_definitions::PARTITION_BLOCKED, "topic" => self.topic.clone(), "partition" => partition.to_string())
                .set(0.0);
        }
        let watermark = processed.watermark;
        let (low, high) = match self.consumer.fetch_watermarks(
            &self.topic,
            partition,
            WATERMARK_TIMEOUT,
        ) {
            Ok(w) => w,
            Err(e) => {
                tracing::warn!(partition, error = %e, "cannot read the partition's offsets; not checked against the ledger");
                return (false, watermark);
            }
        };
        if let Some(why) = self.refusal(partition, processed, high) {
            tracing::error!(topic = %self.topic, partition, ?watermark, high, "{why}");
            metrics::gauge!(crate::metric_definitions::PARTITION_BLOCKED, "topic" => self.topic.clone(), "partition" => partition.to_string())
                .set(1.0);
            self.stats
                .blocked
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(partition, why);
            // Paused with the next turn of the ingest's loop; its messages are ignored.
            return (true, watermark);
        }
        let Some(watermark) = watermark else {
            return (false, None);
        };
        // The partition's start offset is at hand: no second fetch.
        self.report_lost(partition, watermark + 1, low);
        (false, Some(watermark.max(low - 1)))
    }

    /// Whether the partition holds a record at `offset` or after it: a second opinion before a
    /// partition is refused as recreated, since some brokers report the end of a partition as
    /// the start of its last batch plus one (the separate test broker does).
    fn record_at(&self, partition: i32, offset: i64) -> bool {
        let mut tpl = TopicPartitionList::new();
        if tpl
            .add_partition_offset(&self.topic, partition, Offset::Offset(offset))
            .is_err()
            || self.probe.assign(&tpl).is_err()
        {
            return false;
        }
        let deadline = Instant::now() + WATERMARK_TIMEOUT;
        let mut found = false;
        while Instant::now() < deadline {
            match self.probe.poll(Duration::from_millis(100)) {
                Some(Ok(m)) if m.offset() >= offset => {
                    found = true;
                    break;
                }
                Some(Ok(_)) | None => {}
                Some(Err(e)) => {
                    tracing::debug!(partition, offset, error = %e, "probe read failed");
                    break;
                }
            }
        }
        let _ = self.probe.unassign();
        found
    }

    /// Why a partition ending at `high` must not be consumed with these processed offsets:
    /// - a watermark at or above its end means the processed offsets belong to another
    ///   incarnation of the topic (deleted and recreated while the ledger was kept); consuming
    ///   would drop new requests as duplicates of old ones;
    /// - the group's committed offset follows a message this ledger never processed: another
    ///   ledger processed the partition (another instance, or this one on a disk since
    ///   replaced), and a request it accepted, delivered again, would be sent again from here.
    ///   The offset this ledger commits always follows a message it recorded.
    fn refusal(&self, partition: i32, processed: &Processed, high: i64) -> Option<String> {
        let topic = &self.topic;
        let past_end = |w: &i64| *w >= high && !self.record_at(partition, *w);
        if let Some(watermark) = processed.watermark.filter(past_end) {
            return Some(format!(
                "the ledger processed offsets of {topic}/{partition} up to {watermark}, but the \
                 partition ends at {high}: the topic was recreated (or the ledger belongs to \
                 another cluster). Nothing of it is consumed. If the old topic is gone for good, \
                 stop the service and run `sendledger offsets reset --data DIR --topic {topic} \
                 --partition {partition}`"
            ));
        }
        let committed = self.committed(partition)?;
        if committed <= 0 || committed > high || processed.contains(committed - 1) {
            return None;
        }
        let last = committed - 1;
        Some(format!(
            "the consumer group committed {topic}/{partition} up to offset {last}, which this \
             ledger never processed: another ledger processed the partition (another instance in \
             the group, or this one before its data directory was replaced). Nothing of it is \
             consumed: a request that ledger accepted, delivered again, would be sent again from \
             here. Run the instance that holds that ledger. If it is lost for good, settle its \
             tasks by hand, stop this service and run `sendledger offsets reset --data DIR \
             --topic {topic} --partition {partition} --through {last}`: requests delivered \
             after offset {last} are then new to this ledger, and are sent"
        ))
    }

    /// Offsets from `from` up to `to` (exclusive) that the partition no longer holds (below its
    /// start offset) were deleted before they were processed: an error, counted per partition.
    /// Gaps above the start offset are normal (transaction markers, compaction).
    fn count_deleted(&self, partition: i32, from: i64, to: i64) {
        if to <= from {
            return;
        }
        match self
            .consumer
            .fetch_watermarks(&self.topic, partition, WATERMARK_TIMEOUT)
        {
            Ok((low, _)) => self.report_lost(partition, from, low.min(to)),
            Err(e) => {
                tracing::warn!(partition, error = %e, "cannot read the partition's start offset; a gap is not checked");
            }
        }
    }

    /// Offsets from `from` up to `end` (exclusive) were deleted before they were processed.
    fn report_lost(&self, partition: i32, from: i64, end: i64) {
        if end <= from {
            return;
        }
        let lost = (end - from) as u64;
        tracing::error!(
            topic = %self.topic,
            partition,
            first = from,
            last = end - 1,
            lost,
            "requests were deleted from the topic before they were processed (retention or the \
             broker's size limit): they are lost to sendledger; ask their producers to send them again"
        );
        self.stats.lost.fetch_add(lost, Ordering::Relaxed);
        metrics::counter!(crate::metric_definitions::REQUESTS_LOST_TOTAL, "topic" => self.topic.clone(), "partition" => partition.to_string())
            .increment(lost);
    }

    /// Reads the ledger's processed offsets of a partition, retrying while the ledger fails.
    fn load_processed(&self, partition: i32) -> Result<Option<Processed>> {
        let mut delay = RETRY_INITIAL;
        loop {
            let fut = self.sink.processed(self.topic.clone(), partition);
            match self.runtime.block_on(fut) {
                Ok(p) => return Ok(Some(p)),
                Err(SinkError::Fatal(e)) => return Err(Error::SinkFatal(e)),
                Err(e) => {
                    tracing::warn!(partition, error = %e, "cannot read processed offsets; retrying");
                    if self.stop.load(Ordering::SeqCst) {
                        return Ok(None);
                    }
                    std::thread::sleep(delay);
                    delay = (delay * 2).min(RETRY_MAX);
                }
            }
        }
    }

    /// Whether the partition is ours and consumed, loading its processed offsets (and checking
    /// them against the group's position) at its first message after an assignment. In kafka
    /// mode a partition is consumed once taken over: message `offset`, received before (the
    /// partition paused a moment late), is read again then.
    pub(super) fn ensure_loaded(&self, partition: i32, offset: i64) -> Result<bool> {
        let needs_load = {
            let mut t = lock(&self.tracker);
            let shared = t.shared;
            match t.parts.get_mut(&partition) {
                // Not (or no longer) ours: whoever owns it reads it again.
                None => return Ok(false),
                // The group is shared: nothing is consumed (no offset is stored either).
                Some(_) if shared => return Ok(false),
                Some(p) if !p.owned => {
                    p.ignored_from = Some(p.ignored_from.map_or(offset, |o| o.min(offset)));
                    return Ok(false);
                }
                Some(p) => p.processed.is_none(),
            }
        };
        if needs_load {
            let Some(processed) = self.load_processed(partition)? else {
                return Ok(false);
            };
            let (blocked, seen_through) = self.check_partition(partition, &processed);
            let mut t = lock(&self.tracker);
            if let Some(p) = t.parts.get_mut(&partition) {
                tracing::debug!(partition, watermark = ?processed.watermark, above = processed.above.len(), "processed offsets loaded");
                p.folded = processed.watermark;
                p.last_seen = seen_through;
                p.processed = Some(processed);
                p.blocked = blocked;
            }
        }
        Ok(true)
    }

    /// Takes the message into the partition's in-flight list and returns the partition's
    /// generation, or `None` when nothing more is to be done: the partition is gone or blocked,
    /// or the offset was processed before (a duplicate, passed in order). Offsets the consumer
    /// jumped over are counted as lost.
    pub(super) fn admit(&self, partition: i32, offset: i64, bytes: usize) -> Option<u64> {
        let mut t = lock(&self.tracker);
        let part = t.parts.get_mut(&partition)?;
        if part.blocked {
            return None;
        }
        let jumped = part.last_seen.filter(|last| offset > last + 1);
        part.last_seen = Some(part.last_seen.map_or(offset, |last| last.max(offset)));
        if let Some(last) = jumped {
            self.count_deleted(partition, last + 1, offset);
        }
        if part.processed.as_ref().is_some_and(|p| p.contains(offset)) {
            self.stats
                .duplicates_dropped
                .fetch_add(1, Ordering::Relaxed);
            metrics::counter!(sendledger_store::metric_definitions::DUPLICATES_DROPPED_TOTAL, "by" => "offset").increment(1);
            part.inflight.push_back((offset, true));
            if let Some(owner) = &self.owner {
                owner.received(partition, offset, None);
                owner.done(partition, offset, self.consumer.group_metadata());
            }
            advance(
                &self.consumer,
                &self.topic,
                partition,
                part,
                self.owner.is_some(),
            );
            return None;
        }
        if let Some(owner) = &self.owner {
            owner.received(partition, offset, self.consumer.group_metadata());
        }
        part.inflight.push_back((offset, false));
        part.unfinished.add(Load { messages: 1, bytes });
        Some(part.generation)
    }
}
