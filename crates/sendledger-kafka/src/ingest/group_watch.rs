//! Kafka mode: a member that holds no partition while requests wait in partitions nobody
//! consumes rejoins the group.
//!
//! A group can fail to form after a failure: members keep rejoining and the coordinator never
//! completes the rebalance (seen with the test broker after a member's session expired), or a
//! rebalance leaves partitions to nobody. Each member then waits for an assignment that never
//! comes, while requests pile up. A member cannot see the other members' assignments through
//! every broker, but it can see what matters: a partition whose committed offset stays behind
//! its end, without moving, is consumed by nobody (the test broker answers no group
//! description). A member that holds no partition itself and has seen that for
//! [`GroupWatch::new`]'s patience leaves the group and joins it again (a fresh join starts a
//! new rebalance); `/healthz` says why meanwhile. The patience is long enough that a partition
//! whose owner is still restoring it rarely looks abandoned; when one does, the rejoin costs
//! a rebalance, and its restore goes on from its checkpoint.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaResult;
use rdkafka::{Offset, TopicPartitionList};

use super::tracker::{lock, Tracker};
use super::{IngestStats, WATERMARK_TIMEOUT};
use crate::cluster::{topic_partitions, Kafka};
use crate::config::Role;
use crate::error::{Error, Result};

/// The shortest wait before a member holding nothing rejoins.
const MIN_PATIENCE: Duration = Duration::from_secs(30);

/// How often a member holding no partition looks at the group's progress.
const CHECK_EVERY: Duration = Duration::from_secs(2);

/// What a member holding no partition has seen of the group's progress.
#[derive(Debug)]
pub(super) struct GroupWatch {
    /// How long a partition may wait without progress, and this member hold nothing, before
    /// it rejoins.
    patience: Duration,
    /// Since when this member has held no partition (`None` while it holds some).
    empty_since: Option<Instant>,
    /// Per partition, its committed offset as last seen and since when it has not moved.
    committed: BTreeMap<i32, (i64, Instant)>,
    last_check: Option<Instant>,
}

/// What the watch concludes from one look.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Verdict {
    /// Nothing to do.
    Fine,
    /// Partitions with requests waiting and no progress; not long enough yet.
    Stalled(Vec<i32>),
    /// Rejoin the group: these partitions have waited, without progress, for the patience.
    Rejoin(Vec<i32>),
}

impl GroupWatch {
    /// The patience is two session timeouts, and at least [`MIN_PATIENCE`].
    pub(super) fn new(session: Duration) -> GroupWatch {
        GroupWatch {
            patience: (session * 2).max(MIN_PATIENCE),
            empty_since: None,
            committed: BTreeMap::new(),
            last_check: None,
        }
    }

    /// Whether a look is due at `now` for a member holding `owned` partitions. A member that
    /// holds some forgets what it saw.
    fn due(&mut self, owned: usize, now: Instant) -> bool {
        if owned > 0 {
            self.empty_since = None;
            self.committed.clear();
            self.last_check = None;
            return false;
        }
        self.empty_since.get_or_insert(now);
        if self.last_check.is_some_and(|at| now < at + CHECK_EVERY) {
            return false;
        }
        self.last_check = Some(now);
        true
    }

    /// Takes in, per partition, the group's committed offset and the partition's end, seen at
    /// `now` by a member holding none.
    pub(super) fn look(&mut self, partitions: &[(i32, i64, i64)], now: Instant) -> Verdict {
        let empty_since = *self.empty_since.get_or_insert(now);
        let mut stalled = Vec::new();
        let mut long = Vec::new();
        for &(partition, committed, end) in partitions {
            let since = match self.committed.get(&partition) {
                Some(&(seen, since)) if seen == committed => since,
                _ => {
                    self.committed.insert(partition, (committed, now));
                    now
                }
            };
            if committed >= end {
                continue;
            }
            stalled.push(partition);
            if now.duration_since(since) >= self.patience {
                long.push(partition);
            }
        }
        if !long.is_empty() && now.duration_since(empty_since) >= self.patience {
            // The next rejoin only after as long again.
            self.empty_since = Some(now);
            self.committed.clear();
            return Verdict::Rejoin(long);
        }
        match stalled.is_empty() {
            true => Verdict::Fine,
            false => Verdict::Stalled(stalled),
        }
    }
}

/// Kafka mode: watches the group's progress on a thread of its own (its reads of offsets and
/// ends may each wait for the brokers, which must never hold up the consumer's thread) while
/// this member holds no partition, and asks the ingest to rejoin (`rejoin`) when requests
/// have waited, unconsumed, for the watch's patience. Ends once `stop` is set.
pub(super) fn spawn(
    kafka: &Kafka,
    tracker: Arc<Mutex<Tracker>>,
    stats: Arc<IngestStats>,
    stop: Arc<AtomicBool>,
    rejoin: Arc<AtomicBool>,
    session: Duration,
) -> Result<()> {
    // In the group (its committed offsets are the group's), never subscribed.
    let reader: BaseConsumer = kafka.client_config(Role::Ingest).create()?;
    let topic = kafka.config().requests_topic.clone();
    let set = move |why: Option<String>| {
        *stats.unconsumed.lock().unwrap_or_else(|e| e.into_inner()) = why;
    };
    std::thread::Builder::new()
        .name("sendledger-group-watch".into())
        .spawn(move || {
            let mut watch = GroupWatch::new(session);
            while !stop.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(100));
                let owned = lock(&tracker).parts.len();
                let now = Instant::now();
                if !watch.due(owned, now) {
                    if owned > 0 {
                        set(None);
                    }
                    continue;
                }
                let progress = match group_progress(&reader, &topic) {
                    Ok(p) => p,
                    Err(e) => {
                        tracing::debug!(error = %e, "cannot read the group's progress");
                        continue;
                    }
                };
                match watch.look(&progress, now) {
                    Verdict::Fine => set(None),
                    Verdict::Stalled(partitions) => set(Some(format!(
                        "this instance holds no partition, and requests wait in partitions {partitions:?} that no member consumes"
                    ))),
                    Verdict::Rejoin(partitions) => {
                        tracing::warn!(?partitions, patience = ?watch.patience, "this instance has held no partition while requests waited, unconsumed: the group did not form; leaving and joining it again");
                        metrics::counter!(crate::metric_definitions::GROUP_REJOINS_TOTAL)
                            .increment(1);
                        set(Some(format!(
                            "this instance holds no partition, and requests wait in partitions {partitions:?} that no member consumed for its patience: it joined the group again"
                        )));
                        rejoin.store(true, Ordering::SeqCst);
                    }
                }
            }
        })
        .map(drop)
        .map_err(|_| Error::Thread {
            what: "group watch",
        })
}

/// Per partition of the requests topic: the group's committed offset (its start when the group
/// committed none) and its end.
fn group_progress(reader: &BaseConsumer, topic: &str) -> KafkaResult<Vec<(i32, i64, i64)>> {
    let partitions = topic_partitions(reader, topic, WATERMARK_TIMEOUT)?;
    let mut tpl = TopicPartitionList::new();
    for &p in &partitions {
        tpl.add_partition(topic, p);
    }
    let committed = reader.committed_offsets(tpl, WATERMARK_TIMEOUT)?;
    let mut out = Vec::with_capacity(partitions.len());
    for p in partitions {
        let (start, end) = reader.fetch_watermarks(topic, p, WATERMARK_TIMEOUT)?;
        let committed = match committed.find_partition(topic, p).map(|e| e.offset()) {
            Some(Offset::Offset(o)) => o,
            _ => start,
        };
        out.push((p, committed, end));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A member holding nothing rejoins only once a partition with waiting requests has not
    /// moved for the patience, and it has held nothing as long; a moving or caught-up
    /// partition, or an assignment, resets the watch.
    #[test]
    fn a_member_holding_nothing_rejoins_only_when_waiting_requests_stall() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        assert_eq!(
            GroupWatch::new(Duration::from_secs(6)).patience,
            MIN_PATIENCE
        );
        let mut w = GroupWatch::new(Duration::from_secs(16));
        assert_eq!(w.patience, Duration::from_secs(32));
        w.patience = Duration::from_secs(12);
        assert!(w.due(0, at(0)));
        assert_eq!(
            w.look(&[(0, 5, 5), (1, 3, 9)], at(0)),
            Verdict::Stalled(vec![1])
        );
        assert!(!w.due(0, at(1)), "looks every {CHECK_EVERY:?}");
        // Partition 1 moves: its wait starts again.
        assert_eq!(
            w.look(&[(0, 5, 5), (1, 4, 9)], at(8)),
            Verdict::Stalled(vec![1])
        );
        assert_eq!(
            w.look(&[(0, 5, 5), (1, 4, 9)], at(19)),
            Verdict::Stalled(vec![1])
        );
        assert_eq!(
            w.look(&[(0, 5, 5), (1, 4, 9)], at(20)),
            Verdict::Rejoin(vec![1])
        );
        // After a rejoin, as long again.
        assert_eq!(
            w.look(&[(0, 5, 5), (1, 4, 9)], at(25)),
            Verdict::Stalled(vec![1])
        );
        assert_eq!(
            w.look(&[(0, 5, 5), (1, 4, 9)], at(32)),
            Verdict::Stalled(vec![1])
        );
        assert_eq!(
            w.look(&[(0, 5, 5), (1, 4, 9)], at(37)),
            Verdict::Rejoin(vec![1])
        );
        // Caught up: nothing to do.
        assert_eq!(w.look(&[(0, 5, 5), (1, 9, 9)], at(60)), Verdict::Fine);
        // A member that holds a partition forgets what it saw.
        assert!(!w.due(1, at(61)));
        assert!(w.due(0, at(62)));
        assert_eq!(w.look(&[(1, 9, 12)], at(62)), Verdict::Stalled(vec![1]));
        assert_eq!(w.look(&[(1, 9, 12)], at(70)), Verdict::Stalled(vec![1]));
        assert_eq!(w.look(&[(1, 9, 12)], at(74)), Verdict::Rejoin(vec![1]));
    }
}
