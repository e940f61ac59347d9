//! The offset tracker and the in-flight budget: per assigned partition, the offsets received in
//! order and the prefix of them that is done, the messages and bytes not yet done, and when
//! those pause and resume the partitions. Bookkeeping only: storing and committing offsets
//! through the consumer is in `rebalance` (see [`Tracker::apply`]).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{mpsc, Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Instant;

use sendledger_store::Processed;
use tokio::sync::oneshot;

use crate::sink::PartitionOwner;

/// How a message's task ended.
pub(super) enum Outcome {
    /// Durable in the ledger: its offset may be stored.
    Recorded,
    /// Given up because the ingest is stopping: its offset must not be stored.
    Abandoned,
    /// The sink will never accept anything again.
    Fatal(String),
}

pub(super) struct Done {
    pub(super) partition: i32,
    pub(super) generation: u64,
    pub(super) offset: i64,
    /// The message's size as counted when it was received.
    pub(super) bytes: usize,
    pub(super) outcome: Outcome,
    pub(super) chain: (String, u64),
}

/// What the thread knows of one assigned partition.
pub(super) struct PartitionState {
    pub(super) generation: u64,
    /// The ledger's processed offsets, read at the first message after assignment.
    pub(super) processed: Option<Processed>,
    /// Offsets received, in order, with whether each is done.
    pub(super) inflight: VecDeque<(i64, bool)>,
    pub(super) unfinished: Load,
    /// Highest offset of the done prefix (stored to Kafka as the next offset to read).
    pub(super) done_through: Option<i64>,
    /// The ledger's watermark as last read or raised.
    pub(super) folded: Option<i64>,
    /// The last offset received, to notice the position jumping over deleted messages.
    pub(super) last_seen: Option<i64>,
    /// The partition is refused: its messages are ignored and no offset is stored.
    pub(super) blocked: bool,
    /// Kafka mode: the partition was taken over (its log open, its state restored); until
    /// then nothing of it is handled. Always true in local mode.
    pub(super) owned: bool,
    /// Kafka mode: a failed take-over is tried again at this time (the partition is paused).
    pub(super) retry_take_over: Option<Instant>,
    /// Kafka mode: the first offset received and ignored while the partition was not owned
    /// yet; the partition is read again from there once taken over.
    pub(super) ignored_from: Option<i64>,
    /// Kafka mode: its log stalled with its own share of the in-flight budget used up (see
    /// [`Budget::share`]).
    pub(super) over_budget: bool,
    /// Paused through the consumer, as last set (see [`Tracker::wants_pause`]).
    pub(super) paused: bool,
}

pub(super) struct Tracker {
    pub(super) parts: BTreeMap<i32, PartitionState>,
    pub(super) next_generation: u64,
    /// Unfinished messages of partitions no longer assigned.
    pub(super) orphans: Load,
    pub(super) done_rx: mpsc::Receiver<Done>,
    /// Per task identity: the last message handed to the sink, and the signal it sends when
    /// done (taken by the next message of the same identity).
    pub(super) chains: HashMap<String, (u64, Option<oneshot::Receiver<()>>)>,
    pub(super) next_chain: u64,
    /// The whole budget is used up (partitions no longer assigned count too): every partition
    /// pauses.
    pub(super) paused: bool,
    /// The group has another member: every assigned partition stays paused.
    pub(super) shared: bool,
    pub(super) fatal: Option<String>,
    /// Kafka mode: who takes partitions over and commits their offsets.
    pub(super) owner: Option<Arc<dyn PartitionOwner>>,
    /// Kafka mode: the take-overs under way, each on a thread of its own, by partition
    /// (assigned still or not): one is given up through the owner when revoked, and a
    /// partition is never taken over twice at once.
    pub(super) taking_over: BTreeMap<i32, TakeOver>,
}

/// Kafka mode: a take-over under way on its thread.
pub(super) struct TakeOver {
    pub(super) job: JoinHandle<Result<(), String>>,
    /// The partition's generation when it began: a partition revoked (or assigned anew) since
    /// is not owned by its end.
    pub(super) generation: u64,
    pub(super) started: Instant,
    /// After a failed take-over, or a lost log.
    pub(super) retried: bool,
}

/// Messages received and not yet done, and their bytes.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct Load {
    pub(super) messages: usize,
    pub(super) bytes: usize,
}

impl Load {
    pub(super) fn add(&mut self, other: Load) {
        self.messages += other.messages;
        self.bytes += other.bytes;
    }

    /// This load, at most `budget`'s messages and bytes.
    pub(super) fn capped(self, budget: Budget) -> Load {
        Load {
            messages: self.messages.min(budget.messages),
            bytes: self.bytes.min(budget.bytes),
        }
    }

    /// One message of `bytes` is done.
    pub(super) fn finish(&mut self, bytes: usize) {
        self.messages = self.messages.saturating_sub(1);
        self.bytes = self.bytes.saturating_sub(bytes);
    }
}

/// When the ingest pauses its partitions, and when it resumes them.
#[derive(Debug, Clone, Copy)]
pub(super) struct Budget {
    pub(super) messages: usize,
    pub(super) bytes: usize,
}

impl Budget {
    /// Either limit is reached: pause.
    pub(super) fn reached(&self, load: Load) -> bool {
        load.messages >= self.messages || load.bytes >= self.bytes
    }

    /// Both are at half their limit or below: resume. True with nothing unfinished, so a
    /// message larger than the byte budget never leaves the partitions paused.
    pub(super) fn relieved(&self, load: Load) -> bool {
        load.messages <= self.messages / 2 && load.bytes <= self.bytes / 2
    }

    /// One partition's share of the budget, with `partitions` assigned: an even share. Kafka
    /// mode holds a partition whose log stalled (its messages do not finish) to it, so that
    /// the others keep the rest.
    pub(super) fn share(&self, partitions: usize) -> Budget {
        let n = partitions.max(1);
        Budget {
            messages: (self.messages / n).max(1),
            bytes: (self.bytes / n).max(1),
        }
    }

    /// Whether a load that `paused` (or not) before stays paused: paused at the budget,
    /// resumed once relieved.
    pub(super) fn pauses(&self, paused: bool, load: Load) -> bool {
        match paused {
            false => self.reached(load),
            true => !self.relieved(load),
        }
    }
}

impl Tracker {
    pub(super) fn new(
        done_rx: mpsc::Receiver<Done>,
        owner: Option<Arc<dyn PartitionOwner>>,
    ) -> Tracker {
        Tracker {
            parts: BTreeMap::new(),
            next_generation: 1,
            orphans: Load::default(),
            done_rx,
            chains: HashMap::new(),
            next_chain: 0,
            paused: false,
            shared: false,
            fatal: None,
            owner,
            taking_over: BTreeMap::new(),
        }
    }

    /// Whether partition `p` must not be fetched now: the group is shared (local mode), the
    /// whole budget or the partition's share of it is used up, the partition is refused, or
    /// (kafka mode) it is not taken over yet.
    pub(super) fn wants_pause(&self, p: &PartitionState) -> bool {
        self.shared || self.paused || p.over_budget || p.blocked || !p.owned
    }

    pub(super) fn unfinished(&self) -> Load {
        let mut load = self.orphans;
        for p in self.parts.values() {
            load.add(p.unfinished);
        }
        load
    }

    /// Starts partition `partition` anew (assigned, or assigned still and taken over again).
    /// Whether it is paused through the consumer carries over.
    pub(super) fn assign(&mut self, partition: i32) {
        let generation = self.next_generation;
        self.next_generation += 1;
        let paused = self.parts.get(&partition).is_some_and(|p| p.paused);
        if let Some(old) = self.parts.insert(
            partition,
            PartitionState {
                generation,
                processed: None,
                inflight: VecDeque::new(),
                unfinished: Load::default(),
                done_through: None,
                folded: None,
                last_seen: None,
                blocked: false,
                owned: self.owner.is_none(),
                retry_take_over: None,
                ignored_from: None,
                over_budget: false,
                paused,
            },
        ) {
            self.orphans.add(old.unfinished);
        }
    }

    pub(super) fn revoke(&mut self, partition: i32) {
        if let Some(old) = self.parts.remove(&partition) {
            self.orphans.add(old.unfinished);
        }
    }
}

pub(super) fn lock(tracker: &Mutex<Tracker>) -> MutexGuard<'_, Tracker> {
    tracker.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(messages: usize, bytes: usize) -> Load {
        Load { messages, bytes }
    }

    #[test]
    fn either_budget_pauses_and_both_must_halve_to_resume() {
        let budget = Budget {
            messages: 10,
            bytes: 1000,
        };
        assert!(!budget.reached(load(9, 999)));
        assert!(budget.reached(load(10, 1)));
        assert!(budget.reached(load(2, 1000)));
        assert!(!budget.relieved(load(5, 501)));
        assert!(!budget.relieved(load(6, 100)));
        assert!(budget.relieved(load(5, 500)));
        // One message above the whole byte budget pauses, and resumes once it is done.
        let mut one = Load::default();
        one.add(load(1, 5000));
        assert!(budget.reached(one));
        one.finish(5000);
        assert_eq!(one, Load::default());
        assert!(budget.relieved(one));
    }

    /// A partition's share of the budget is the budget divided by the partitions assigned
    /// (at least one message and byte), paused and resumed as the whole budget is.
    #[test]
    fn a_partitions_share_divides_the_budget() {
        let budget = Budget {
            messages: 100,
            bytes: 10_000,
        };
        let share = budget.share(4);
        assert_eq!((share.messages, share.bytes), (25, 2_500));
        assert_eq!(budget.share(0).messages, 100);
        assert_eq!(
            (budget.share(1000).messages, budget.share(100_000).bytes),
            (1, 1)
        );
        assert_eq!(load(90, 9_000).capped(share), load(25, 2_500));
        assert_eq!(load(3, 9_000).capped(share), load(3, 2_500));
        // Paused at the share, and stays paused until down to half of it.
        assert!(!share.pauses(false, load(24, 100)));
        assert!(share.pauses(false, load(25, 100)));
        assert!(share.pauses(true, load(13, 100)));
        assert!(!share.pauses(true, load(12, 100)));
    }

    /// Bytes follow their messages: into the partition when received, to the orphans when the
    /// partition is revoked or reassigned, and out when each message is done.
    #[test]
    fn unfinished_bytes_are_released_by_the_messages_that_added_them() {
        let (_tx, done_rx) = mpsc::channel();
        let mut t = Tracker::new(done_rx, None);
        t.assign(0);
        t.assign(1);
        let received = [(0, 100_000), (0, 300), (1, 70_000)];
        for (p, bytes) in received {
            t.parts.get_mut(&p).unwrap().unfinished.add(load(1, bytes));
        }
        assert_eq!(t.unfinished(), load(3, 170_300));
        t.revoke(0);
        assert_eq!(t.orphans, load(2, 100_300));
        t.assign(1);
        assert_eq!(t.orphans, load(3, 170_300));
        assert_eq!(t.unfinished(), load(3, 170_300));
        for bytes in [100_000, 300, 70_000] {
            t.orphans.finish(bytes);
        }
        assert_eq!(t.unfinished(), Load::default());
    }
}
